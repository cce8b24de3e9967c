//! One AuthorizationPolicy rule as an RBAC policy (Istio's `security/authz/model`):
//! one permission per `to` (or one when there is none) and one principal per `from`
//! (likewise), each the AND of its fields; the values of a field are OR'd and its
//! `not` values become NOT(OR). The `when` conditions are joined to every `from` (the
//! source attributes) or every `to` (the others).

// Istio matches dynamic metadata with the `metadata` matchers Envoy marks deprecated
// (in favour of `sourced_metadata`); the proxies read both.
#![allow(deprecated)]

use envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig;
use envoy_types::pb::envoy::config::rbac::v3::{
    Permission, Policy, Principal, permission, principal,
};
use envoy_types::pb::envoy::extensions::path::r#match::uri_template::v3::UriTemplateMatchConfig;
use envoy_types::pb::google::protobuf::Any;
use meshfed_api::security::v1beta1::{Rule, Source};
use prost::{Message, Name};

use super::matcher as m;
use super::trust_domain::TrustDomains;

/// The filter whose dynamic metadata carries the verified JWT payload.
pub const JWT_FILTER: &str = "envoy.filters.http.jwt_authn";
const SPIFFE: &str = "spiffe://";
const ENVOY_FILTER_KEY: &str = "experimental.envoy.filters.";

/// Whether the policy being translated allows or denies/audits: decides what an
/// unusable condition does on TCP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    /// An unusable condition drops the whole rule (a narrower allow).
    Allow,
    /// An unusable condition is dropped alone (a wider deny or audit).
    DenyOrAudit,
}

/// What a rule is translated for.
#[derive(Clone, Copy, Debug)]
pub struct Target<'a> {
    pub tcp: bool,
    pub effect: Effect,
    /// The policy's namespace (default of `serviceAccounts` entries).
    pub namespace: &'a str,
    pub trust_domains: &'a TrustDomains,
    /// Current proxies: JWT claims (a string or a list) and envoy filter metadata
    /// matched with one matcher per field; otherwise one list matcher per value, as
    /// Istio does for older proxies.
    pub extended_jwt: bool,
}

#[derive(Clone, Debug, PartialEq)]
enum Attr {
    SrcIp,
    RemoteIp,
    SrcNamespace,
    SrcPrincipal,
    SrcServiceAccount,
    RequestPrincipal,
    Audiences,
    Presenter,
    Claims(Vec<String>),
    Header(String),
    Host,
    Method,
    Path,
    Port,
    DestIp,
    Sni,
    EnvoyFilter { filter: String, key: String },
}

impl Attr {
    fn http_only(&self) -> bool {
        matches!(
            self,
            Attr::RequestPrincipal
                | Attr::Audiences
                | Attr::Presenter
                | Attr::Claims(_)
                | Attr::Header(_)
                | Attr::Host
                | Attr::Method
                | Attr::Path
        )
    }

    /// Matched with one matcher for all the values of the field (newer proxies).
    fn aggregated(&self) -> bool {
        matches!(
            self,
            Attr::Audiences | Attr::Presenter | Attr::Claims(_) | Attr::EnvoyFilter { .. }
        )
    }

    fn is_source(&self) -> bool {
        matches!(
            self,
            Attr::SrcIp
                | Attr::RemoteIp
                | Attr::SrcNamespace
                | Attr::SrcPrincipal
                | Attr::SrcServiceAccount
                | Attr::RequestPrincipal
                | Attr::Audiences
                | Attr::Presenter
                | Attr::Claims(_)
                | Attr::Header(_)
        )
    }
}

#[derive(Clone, Debug)]
struct Field {
    attr: Attr,
    key: String,
    values: Vec<String>,
    not_values: Vec<String>,
}

/// The bracketed segments of `prefix[a][b]...` (`None` unless the rest is only
/// non-empty bracketed segments).
fn bracketed(rest: &str) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut s = rest;
    while !s.is_empty() {
        let inner = s.strip_prefix('[')?;
        let end = inner.find(']')?;
        if end == 0 {
            return None;
        }
        out.push(inner[..end].to_string());
        s = &inner[end + 1..];
    }
    (!out.is_empty()).then_some(out)
}

/// The attribute of a `when` key.
fn when_attr(key: &str) -> Result<Attr, String> {
    Ok(match key {
        "source.ip" => Attr::SrcIp,
        "remote.ip" => Attr::RemoteIp,
        "source.namespace" => Attr::SrcNamespace,
        "source.principal" => Attr::SrcPrincipal,
        "source.serviceAccount" => Attr::SrcServiceAccount,
        "request.auth.principal" => Attr::RequestPrincipal,
        "request.auth.audiences" => Attr::Audiences,
        "request.auth.presenter" => Attr::Presenter,
        "destination.ip" => Attr::DestIp,
        "destination.port" => Attr::Port,
        "connection.sni" => Attr::Sni,
        _ => {
            if let Some(rest) = key.strip_prefix("request.headers") {
                match bracketed(rest).as_deref() {
                    Some([name]) => Attr::Header(name.clone()),
                    _ => return Err(format!("invalid header key {key:?}")),
                }
            } else if let Some(rest) = key.strip_prefix("request.auth.claims") {
                Attr::Claims(bracketed(rest).ok_or_else(|| format!("invalid claim key {key:?}"))?)
            } else if let Some(rest) = key.strip_prefix(ENVOY_FILTER_KEY) {
                let open = rest
                    .find('[')
                    .ok_or_else(|| format!("invalid envoy filter key {key:?}"))?;
                match bracketed(&rest[open..]).as_deref() {
                    Some([k]) if open > 0 => Attr::EnvoyFilter {
                        filter: format!("envoy.filters.{}", &rest[..open]),
                        key: k.clone(),
                    },
                    _ => return Err(format!("invalid envoy filter key {key:?}")),
                }
            } else {
                return Err(format!("unknown attribute {key:?}"));
            }
        }
    })
}

fn push(list: &mut Vec<Field>, attr: Attr, key: &str, values: &[String], not_values: &[String]) {
    if values.is_empty() && not_values.is_empty() {
        return;
    }
    list.push(Field {
        attr,
        key: key.to_string(),
        values: values.to_vec(),
        not_values: not_values.to_vec(),
    });
}

fn source_fields(s: &Source) -> Vec<Field> {
    let mut out = Vec::new();
    push(
        &mut out,
        Attr::SrcPrincipal,
        "principals",
        &s.principals,
        &s.not_principals,
    );
    push(
        &mut out,
        Attr::RequestPrincipal,
        "requestPrincipals",
        &s.request_principals,
        &s.not_request_principals,
    );
    push(
        &mut out,
        Attr::SrcNamespace,
        "namespaces",
        &s.namespaces,
        &s.not_namespaces,
    );
    push(
        &mut out,
        Attr::SrcServiceAccount,
        "serviceAccounts",
        &s.service_accounts,
        &s.not_service_accounts,
    );
    push(
        &mut out,
        Attr::RemoteIp,
        "remoteIpBlocks",
        &s.remote_ip_blocks,
        &s.not_remote_ip_blocks,
    );
    push(
        &mut out,
        Attr::SrcIp,
        "ipBlocks",
        &s.ip_blocks,
        &s.not_ip_blocks,
    );
    out
}

/// Translates one rule. `Err` means the rule yields no policy (an invalid field, or
/// on TCP an HTTP-only field of an ALLOW policy).
pub fn rule_policy(rule: &Rule, t: &Target<'_>) -> Result<Policy, String> {
    let mut base_principal = Vec::new();
    let mut base_permission = Vec::new();
    for c in &rule.when {
        let attr = when_attr(&c.key)?;
        let list = if attr.is_source() {
            &mut base_principal
        } else {
            &mut base_permission
        };
        list.push(Field {
            attr,
            key: c.key.clone(),
            values: c.values.clone(),
            not_values: c.not_values.clone(),
        });
    }

    let mut principal_lists = Vec::new();
    for from in &rule.from {
        let mut fields = from.source.as_ref().map(source_fields).unwrap_or_default();
        fields.extend(base_principal.iter().cloned());
        principal_lists.push(fields);
    }
    if rule.from.is_empty() {
        principal_lists.push(base_principal);
    }
    let mut permission_lists = Vec::new();
    for to in &rule.to {
        let mut fields = Vec::new();
        if let Some(o) = &to.operation {
            push(&mut fields, Attr::Host, "hosts", &o.hosts, &o.not_hosts);
            push(
                &mut fields,
                Attr::Method,
                "methods",
                &o.methods,
                &o.not_methods,
            );
            push(&mut fields, Attr::Path, "paths", &o.paths, &o.not_paths);
            push(&mut fields, Attr::Port, "ports", &o.ports, &o.not_ports);
        }
        fields.extend(base_permission.iter().cloned());
        permission_lists.push(fields);
    }
    if rule.to.is_empty() {
        permission_lists.push(base_permission);
    }

    let mut permissions = Vec::new();
    for fields in &permission_lists {
        let mut and = Vec::new();
        for f in fields {
            if let Some((yes, no)) = aggregated(f, t, permission_all)? {
                and.extend(yes);
                and.extend(no.map(perm_not));
                continue;
            }
            let (or, not) = values_of(f, t, |v| permission_of(&f.attr, v))?;
            if !or.is_empty() {
                and.push(perm(permission::Rule::OrRules(permission::Set {
                    rules: or,
                })));
            }
            if !not.is_empty() {
                and.push(perm_not(perm(permission::Rule::OrRules(permission::Set {
                    rules: not,
                }))));
            }
        }
        if and.is_empty() {
            and.push(perm(permission::Rule::Any(true)));
        }
        permissions.push(perm(permission::Rule::AndRules(permission::Set {
            rules: and,
        })));
    }
    let mut principals = Vec::new();
    for fields in &principal_lists {
        let mut and = Vec::new();
        for f in fields {
            let f = expand_principals(f, t.trust_domains);
            if let Some((yes, no)) = aggregated(&f, t, principal_all)? {
                and.extend(yes);
                and.extend(no.map(prin_not));
                continue;
            }
            let (or, not) = values_of(&f, t, |v| principal_of(&f.attr, v, t))?;
            if !or.is_empty() {
                and.push(prin(principal::Identifier::OrIds(principal::Set {
                    ids: or,
                })));
            }
            if !not.is_empty() {
                and.push(prin_not(prin(principal::Identifier::OrIds(
                    principal::Set { ids: not },
                ))));
            }
        }
        if and.is_empty() {
            and.push(prin(principal::Identifier::Any(true)));
        }
        principals.push(prin(principal::Identifier::AndIds(principal::Set {
            ids: and,
        })));
    }
    Ok(Policy {
        permissions,
        principals,
        ..Default::default()
    })
}

/// Principals (and `source.principal` values) in the local trust domain, an alias
/// or `cluster.local` stand for all of them.
fn expand_principals(f: &Field, td: &TrustDomains) -> Field {
    if f.attr != Attr::SrcPrincipal {
        return f.clone();
    }
    Field {
        values: td.expand(&f.values),
        not_values: td.expand(&f.not_values),
        ..f.clone()
    }
}

/// The matchers of a field's values and not-values. A value that cannot be used
/// (HTTP-only on TCP, or invalid) fails the rule for ALLOW and is skipped otherwise.
fn values_of<T>(
    f: &Field,
    t: &Target<'_>,
    mut one: impl FnMut(&str) -> Result<T, String>,
) -> Result<(Vec<T>, Vec<T>), String> {
    let mut each = |values: &[String]| -> Result<Vec<T>, String> {
        let mut out = Vec::new();
        for v in values {
            let r = if t.tcp && f.attr.http_only() {
                Err(format!("{} is HTTP only", f.key))
            } else {
                one(v)
            };
            match r {
                Ok(x) => out.push(x),
                Err(e) if t.effect == Effect::Allow => return Err(e),
                Err(_) => {}
            }
        }
        Ok(out)
    };
    Ok((each(&f.values)?, each(&f.not_values)?))
}

/// For a field matched as a whole (see [`Attr::aggregated`]): the matcher of its
/// values and of its not-values; `None` when the field is matched value by value.
#[allow(clippy::type_complexity)]
fn aggregated<T>(
    f: &Field,
    t: &Target<'_>,
    all: fn(&Attr, &[String]) -> T,
) -> Result<Option<(Option<T>, Option<T>)>, String> {
    if !(t.extended_jwt && f.attr.aggregated()) {
        return Ok(None);
    }
    if t.tcp && f.attr.http_only() {
        return match t.effect {
            Effect::Allow => Err(format!("{} is HTTP only", f.key)),
            Effect::DenyOrAudit => Ok(Some((None, None))),
        };
    }
    let of = |values: &[String]| (!values.is_empty()).then(|| all(&f.attr, values));
    Ok(Some((of(&f.values), of(&f.not_values))))
}

fn permission_all(attr: &Attr, values: &[String]) -> Permission {
    match attr {
        Attr::EnvoyFilter { filter, key } => perm(permission::Rule::Metadata(m::metadata_any_of(
            filter,
            &[key],
            values,
        ))),
        other => unreachable!("{other:?} is not matched as a whole on the destination"),
    }
}

fn principal_all(attr: &Attr, values: &[String]) -> Principal {
    let path: Vec<&str> = match attr {
        Attr::Audiences => vec!["payload", "aud"],
        Attr::Presenter => vec!["payload", "azp"],
        Attr::Claims(keys) => std::iter::once("payload")
            .chain(keys.iter().map(String::as_str))
            .collect(),
        other => unreachable!("{other:?} is not matched as a whole on the source"),
    };
    prin(principal::Identifier::Metadata(m::claim_any_of(
        JWT_FILTER, &path, values,
    )))
}

fn perm(rule: permission::Rule) -> Permission {
    Permission { rule: Some(rule) }
}

fn perm_not(p: Permission) -> Permission {
    perm(permission::Rule::NotRule(Box::new(p)))
}

fn prin(id: principal::Identifier) -> Principal {
    Principal {
        identifier: Some(id),
    }
}

fn prin_not(p: Principal) -> Principal {
    prin(principal::Identifier::NotId(Box::new(p)))
}

fn authenticated(s: envoy_types::pb::envoy::r#type::matcher::v3::StringMatcher) -> Principal {
    prin(principal::Identifier::Authenticated(
        principal::Authenticated {
            principal_name: Some(s),
        },
    ))
}

fn jwt(path: &[&str], s: envoy_types::pb::envoy::r#type::matcher::v3::StringMatcher) -> Principal {
    prin(principal::Identifier::Metadata(m::metadata(
        JWT_FILTER, path, s,
    )))
}

fn parse_port(v: &str) -> Result<u32, String> {
    v.trim()
        .parse::<u16>()
        .map(u32::from)
        .map_err(|_| format!("invalid port {v:?}"))
}

fn permission_of(attr: &Attr, v: &str) -> Result<Permission, String> {
    Ok(match attr {
        Attr::Host => perm(permission::Rule::Header(m::host(v))),
        Attr::Method => perm(permission::Rule::Header(m::header(":method", v))),
        Attr::Path if m::is_uri_template(v) => {
            let config = UriTemplateMatchConfig {
                path_template: m::uri_template(v),
            };
            perm(permission::Rule::UriTemplate(TypedExtensionConfig {
                name: "uri-template".into(),
                typed_config: Some(Any {
                    type_url: UriTemplateMatchConfig::type_url(),
                    value: config.encode_to_vec(),
                }),
            }))
        }
        Attr::Path => perm(permission::Rule::UrlPath(m::path(v))),
        Attr::Port => perm(permission::Rule::DestinationPort(parse_port(v)?)),
        Attr::DestIp => perm(permission::Rule::DestinationIp(m::cidr(v)?)),
        Attr::Sni => perm(permission::Rule::RequestedServerName(m::string(v))),
        Attr::EnvoyFilter { filter, key } => {
            let matcher = match v.strip_prefix('[').and_then(|x| x.strip_suffix(']')) {
                Some(inner) => m::metadata_list(filter, &[key], m::string(inner)),
                None => m::metadata(filter, &[key], m::string(v)),
            };
            perm(permission::Rule::Metadata(matcher))
        }
        other => return Err(format!("{other:?} is not a destination attribute")),
    })
}

fn principal_of(attr: &Attr, v: &str, t: &Target<'_>) -> Result<Principal, String> {
    Ok(match attr {
        Attr::SrcPrincipal => authenticated(m::string_with_prefix(v, SPIFFE)),
        Attr::SrcNamespace => authenticated(m::regex(&format!(
            ".*/ns/{}/.*",
            m::quote_meta(v).replace("\\*", ".*")
        ))),
        Attr::SrcServiceAccount => {
            let (ns, sa) = v.split_once('/').unwrap_or((t.namespace, v));
            if ns.is_empty() || sa.is_empty() || sa.contains('/') {
                return Err(format!("invalid service account {v:?}"));
            }
            authenticated(m::regex(&format!(
                "spiffe://.+/ns/{}/(.+/|)sa/{}(/.+)?",
                m::quote_meta(ns),
                m::quote_meta(sa)
            )))
        }
        Attr::SrcIp => prin(principal::Identifier::DirectRemoteIp(m::cidr(v)?)),
        Attr::RemoteIp => prin(principal::Identifier::RemoteIp(m::cidr(v)?)),
        Attr::RequestPrincipal => request_principal(v),
        Attr::Audiences => prin(principal::Identifier::Metadata(m::metadata_list(
            JWT_FILTER,
            &["payload", "aud"],
            m::string(v),
        ))),
        Attr::Presenter => prin(principal::Identifier::Metadata(m::metadata_list(
            JWT_FILTER,
            &["payload", "azp"],
            m::string(v),
        ))),
        Attr::Claims(path) => {
            let mut full = vec!["payload"];
            full.extend(path.iter().map(String::as_str));
            prin(principal::Identifier::Metadata(m::metadata_list(
                JWT_FILTER,
                &full,
                m::string(v),
            )))
        }
        Attr::Header(name) => prin(principal::Identifier::Header(m::header(name, v))),
        other => return Err(format!("{other:?} is not a source attribute")),
    })
}

/// `iss/sub` (split at the last `/`): the token's issuer AND subject. A value without
/// `/` is an issuer with an empty subject; `*` is any issuer and subject, `*x` any
/// issuer with a subject ending in `x`, `x*` an issuer starting with `x` (or, with a
/// `/`, that issuer and a subject starting with the rest).
fn request_principal(v: &str) -> Principal {
    let any = || m::regex(".+");
    let (iss, sub) = if v == "*" {
        (any(), any())
    } else if let Some(rest) = v.strip_prefix('*') {
        (any(), m::suffix(rest, false))
    } else if let Some(start) = v.strip_suffix('*') {
        match start.rsplit_once('/') {
            Some((iss, "")) => (m::exact(iss, false), any()),
            Some((iss, sub)) => (m::exact(iss, false), m::prefix(sub, false)),
            None => (m::prefix(start, false), any()),
        }
    } else {
        let (iss, sub) = v.rsplit_once('/').unwrap_or((v, ""));
        (m::exact(iss, false), m::exact(sub, false))
    };
    prin(principal::Identifier::AndIds(principal::Set {
        ids: vec![jwt(&["payload", "iss"], iss), jwt(&["payload", "sub"], sub)],
    }))
}
