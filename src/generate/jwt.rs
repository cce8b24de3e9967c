//! RequestAuthentication → the `envoy.filters.http.jwt_authn` HTTP filter, as Istio's
//! `policyApplier.JwtFilter` / `convertToEnvoyJwtConfig`
//! (`pilot/pkg/security/authn/policy_applier.go`) builds it, and the JWT-claim keys of
//! VirtualService header matches (`pkg/jwt/routing.go`).
//!
//! - [`select`]: the RequestAuthentications of the workload's namespace and of the root
//!   namespace whose selector matches its labels (as AuthorizationPolicies are
//!   selected); policies with `targetRef(s)` are for Gateway API gateways and ignored.
//! - [`jwt_authentication`]: every `jwtRules` entry of the selected policies, sorted by
//!   issuer, one provider `origins-<i>` each; one rule for prefix `/` that accepts a
//!   request without token and refuses one with an invalid token (401 from Envoy).
//! - Keys: an inline `jwks`, else the document the control plane fetched from
//!   `jwksUri` (or found through OIDC discovery) as [`JwksTable`] holds it (see
//!   [`crate::jwks`]); a rule whose keys are not (yet) fetched gets [`fake_jwks`], a
//!   public key no token verifies with, so tokens of that issuer are refused.

use std::collections::BTreeMap;
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::{DataSource, HttpUri, data_source, http_uri};
use envoy_types::pb::envoy::config::route::v3::{RouteMatch, route_match};
use envoy_types::pb::envoy::extensions::filters::http::jwt_authn::v3::{
    JwtAuthentication, JwtClaimToHeader, JwtHeader, JwtProvider, JwtRequirement,
    JwtRequirementAndList, JwtRequirementOrList, RemoteJwks, RequirementRule, jwt_provider,
    jwt_requirement, requirement_rule,
};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpFilter, http_filter,
};
use envoy_types::pb::google::protobuf::{Any, Empty};
use meshfed_api::security::v1beta1::{JwtRule, RequestAuthentication};
use prost::{Message, Name};

use crate::push::config_index::{Config, ConfigIndex};
use crate::push::snapshot::Snapshot;

/// Name of the JWT authentication HTTP filter (and of its dynamic metadata namespace).
pub const JWT_FILTER: &str = "envoy.filters.http.jwt_authn";
/// The metadata key a verified token's payload is written under
/// (`filters.EnvoyJwtFilterPayload`).
pub const PAYLOAD_IN_METADATA: &str = "payload";
/// Claims always split at spaces in the metadata (`buildSpaceDelimitedClaims`).
const SPACE_DELIMITED_CLAIMS: [&str; 2] = ["permission", "scope"];
/// The JWKS fetch timeout of a rule without `timeout`.
pub const DEFAULT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

type Ra = Arc<Config<RequestAuthentication>>;

pub use crate::push::jwks_table::{JwksFetchMode, JwksKey, JwksTable};

/// The outbound cluster of a service `host`:`port` of the registry, if it has one
/// (Istio's `LookupCluster`), for the remote JWKS modes.
pub type ClusterLookup<'a> = &'a dyn Fn(&str, u32) -> Option<String>;

/// Host and port of a `jwksUri` (Istio's `ParseJwksURI`): the port given, else 443
/// for `https` and 80 for `http`.
pub fn parse_jwks_uri(uri: &str) -> Result<(String, u32), String> {
    let url = reqwest::Url::parse(uri).map_err(|e| format!("jwksUri {uri:?}: {e}"))?;
    let host = url
        .host_str()
        .ok_or_else(|| format!("jwksUri {uri:?} has no host"))?;
    let port = match (url.port(), url.scheme()) {
        (Some(p), _) => u32::from(p),
        (None, "https") => 443,
        (None, "http") => 80,
        (None, other) => return Err(format!("jwksUri {uri:?}: scheme {other} is not http(s)")),
    };
    Ok((host.to_string(), port))
}

/// The JWKS served in place of keys that could not be fetched (Istio's
/// `CreateFakeJwks`): one RSA public key (no private part) whose modulus encodes
/// `Error-IstiodFailedToFetchJwksUri-<uri>`, so no token verifies and the failure is
/// readable in a config dump.
pub fn fake_jwks(jwks_uri: &str) -> String {
    let n = base64_url(format!("Error-IstiodFailedToFetchJwksUri-{jwks_uri}").as_bytes());
    format!(r#"{{"keys":[ {{"e":"AQAB","kid":"abc","kty":"RSA","n":"{n}"}}]}}"#)
}

/// Unpadded base64url (RFC 4648 §5), as Go's `base64.RawURLEncoding`.
fn base64_url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..=chunk.len() {
            out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
        }
    }
    out
}

/// The RequestAuthentications applying to an ordinary (sidecar) workload of
/// `namespace` with `labels`, oldest first (then namespace, then name).
pub fn select(
    policies: &[Ra],
    root_namespace: &str,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> Vec<Ra> {
    let mut chosen: Vec<Ra> = policies
        .iter()
        .filter(|p| {
            let targeted = p.spec.target_ref.is_some() || !p.spec.target_refs.is_empty();
            crate::generate::authz::applies_to_workload(
                &p.namespace,
                p.spec.selector.as_ref(),
                targeted,
                root_namespace,
                namespace,
                labels,
            )
        })
        .cloned()
        .collect();
    chosen.sort_by(|a, b| {
        (a.creation_time, &a.namespace, &a.name).cmp(&(b.creation_time, &b.namespace, &b.name))
    });
    chosen
}

/// [`select`] over a snapshot's RequestAuthentications, with the root namespace of
/// its mesh config.
pub fn select_in(
    index: &ConfigIndex,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> Vec<Ra> {
    select(
        index.request_authentications(),
        &index.root_namespace,
        namespace,
        labels,
    )
}

/// Every JWT rule of `policies`, in policy order then sorted (stably) by issuer.
pub fn rules(policies: &[Ra]) -> Vec<&JwtRule> {
    let mut out: Vec<&JwtRule> = policies.iter().flat_map(|p| &p.spec.jwt_rules).collect();
    out.sort_by(|a, b| a.issuer.cmp(&b.issuer));
    out
}

/// The `jwt_authn` filter of a workload of `namespace` with `labels`, from the
/// snapshot's RequestAuthentications and fetched keys; `None` when no rule applies.
/// `is_sidecar`: sidecars keep the route chosen before the filter ran; other proxies
/// (gateways) clear the route cache so claim-based routes see the verified payload.
pub fn jwt_filter(
    snapshot: &Snapshot,
    namespace: &str,
    labels: &BTreeMap<String, String>,
    is_sidecar: bool,
) -> Option<HttpFilter> {
    let index = snapshot.config();
    let selected = select_in(index, namespace, labels);
    let services = snapshot.services();
    let lookup = |host: &str, port: u32| {
        crate::generate::authz::ext_authz::lookup_cluster(host, port, &|h| {
            services.namespaces_of(h)
        })
        .ok()
        .map(|(_, cluster)| cluster)
    };
    let config = jwt_authentication_in(&rules(&selected), index.jwks(), &lookup, !is_sidecar)?;
    Some(http_filter(&config))
}

/// The HTTP filter carrying `config`.
pub fn http_filter(config: &JwtAuthentication) -> HttpFilter {
    HttpFilter {
        name: JWT_FILTER.into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(Any {
            type_url: JwtAuthentication::type_url(),
            value: config.encode_to_vec(),
        })),
        ..Default::default()
    }
}

/// Istio's `convertToEnvoyJwtConfig`: one provider `origins-<i>` per rule (in the
/// order given), and one requirement for every path: with one provider "that
/// provider or no token"; with several, "any provider alone, or all of them each
/// satisfied or missing" (the first alternatives let providers that read the same
/// header pass). `None` without rules.
pub fn jwt_authentication(
    rules: &[&JwtRule],
    keys: &JwksTable,
    clear_route_cache: bool,
) -> Option<JwtAuthentication> {
    jwt_authentication_in(rules, keys, &|_, _| None, clear_route_cache)
}

/// [`jwt_authentication`] with the registry's clusters for the remote JWKS modes.
pub fn jwt_authentication_in(
    rules: &[&JwtRule],
    keys: &JwksTable,
    lookup: ClusterLookup<'_>,
    clear_route_cache: bool,
) -> Option<JwtAuthentication> {
    if rules.is_empty() {
        return None;
    }
    let mut providers = std::collections::HashMap::new();
    let mut each_or_missing = Vec::new();
    let mut any_provider = Vec::new();
    for (i, rule) in rules.iter().enumerate() {
        let name = format!("origins-{i}");
        providers.insert(
            name.clone(),
            provider(rule, keys, lookup, clear_route_cache),
        );
        each_or_missing.push(requires_any(vec![
            provider_name(&name),
            JwtRequirement {
                requires_type: Some(jwt_requirement::RequiresType::AllowMissing(Empty {})),
            },
        ]));
        any_provider.push(provider_name(&name));
    }
    let requires = if each_or_missing.len() == 1 {
        each_or_missing.remove(0)
    } else {
        any_provider.push(JwtRequirement {
            requires_type: Some(jwt_requirement::RequiresType::RequiresAll(
                JwtRequirementAndList {
                    requirements: each_or_missing,
                },
            )),
        });
        requires_any(any_provider)
    };
    Some(JwtAuthentication {
        rules: vec![RequirementRule {
            r#match: Some(RouteMatch {
                path_specifier: Some(route_match::PathSpecifier::Prefix("/".into())),
                ..Default::default()
            }),
            requirement_type: Some(requirement_rule::RequirementType::Requires(requires)),
        }],
        providers,
        bypass_cors_preflight: true,
        ..Default::default()
    })
}

fn provider_name(name: &str) -> JwtRequirement {
    JwtRequirement {
        requires_type: Some(jwt_requirement::RequiresType::ProviderName(name.into())),
    }
}

fn requires_any(requirements: Vec<JwtRequirement>) -> JwtRequirement {
    JwtRequirement {
        requires_type: Some(jwt_requirement::RequiresType::RequiresAny(
            JwtRequirementOrList { requirements },
        )),
    }
}

/// One rule as a provider: every JWTRule field mapped as Istio maps it.
fn provider(
    rule: &JwtRule,
    keys: &JwksTable,
    lookup: ClusterLookup<'_>,
    clear_route_cache: bool,
) -> JwtProvider {
    JwtProvider {
        issuer: rule.issuer.clone(),
        audiences: rule.audiences.clone(),
        forward: rule.forward_original_token,
        forward_payload_header: rule.output_payload_to_header.clone(),
        payload_in_metadata: PAYLOAD_IN_METADATA.into(),
        normalize_payload_in_metadata: Some(jwt_provider::NormalizePayload {
            space_delimited_claims: SPACE_DELIMITED_CLAIMS.map(String::from).into(),
        }),
        clear_route_cache,
        claim_to_headers: rule
            .output_claim_to_headers
            .iter()
            .map(|c| JwtClaimToHeader {
                header_name: c.header.clone(),
                claim_name: c.claim.clone(),
                ..Default::default()
            })
            .collect(),
        from_headers: rule
            .from_headers
            .iter()
            .map(|h| JwtHeader {
                name: h.name.clone(),
                value_prefix: h.prefix.clone(),
            })
            .collect(),
        from_params: rule.from_params.clone(),
        from_cookies: rule.from_cookies.clone(),
        jwks_source_specifier: Some(jwks_source(rule, keys, lookup)),
        ..Default::default()
    }
}

/// Where the provider gets its keys (Istio's `convertToEnvoyJwtConfig`): in the remote
/// modes, a rule with `jwksUri` whose host is a service of the registry is fetched by
/// Envoy through its outbound cluster (cached 5 minutes); when it is not, `hybrid`
/// falls back to the control plane's fetch and `envoy` still names the cluster
/// `outbound|<port>||<host>` Istio would (the fetch fails until a ServiceEntry defines
/// it). Everything else is inline.
fn jwks_source(
    rule: &JwtRule,
    keys: &JwksTable,
    lookup: ClusterLookup<'_>,
) -> jwt_provider::JwksSourceSpecifier {
    let local = || {
        jwt_provider::JwksSourceSpecifier::LocalJwks(DataSource {
            specifier: Some(data_source::Specifier::InlineString(local_jwks(rule, keys))),
            ..Default::default()
        })
    };
    if keys.mode() == JwksFetchMode::Istiod || rule.jwks_uri.is_empty() {
        return local();
    }
    let (host, port) = parse_jwks_uri(&rule.jwks_uri).unwrap_or_else(|e| {
        tracing::warn!(issuer = %rule.issuer, "{e}");
        (String::new(), 0)
    });
    let cluster = match lookup(&host, port) {
        Some(cluster) => cluster,
        None if keys.mode() == JwksFetchMode::Hybrid => return local(),
        None => {
            tracing::warn!(
                issuer = %rule.issuer, uri = %rule.jwks_uri,
                "the JWKS host is no service of the registry: define it (a ServiceEntry) or \
                 set PILOT_JWT_ENABLE_REMOTE_JWKS to hybrid or istiod; until then Envoy \
                 cannot fetch the keys and refuses every token of this issuer"
            );
            format!("outbound|{port}||{host}")
        }
    };
    let timeout = rule
        .timeout
        .and_then(|d| std::time::Duration::try_from(d).ok())
        .filter(|d| !d.is_zero())
        .unwrap_or(DEFAULT_TIMEOUT);
    jwt_provider::JwksSourceSpecifier::RemoteJwks(RemoteJwks {
        http_uri: Some(HttpUri {
            uri: rule.jwks_uri.clone(),
            timeout: Some(envoy_types::pb::google::protobuf::Duration {
                seconds: i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
                nanos: i32::try_from(timeout.subsec_nanos()).unwrap_or(0),
            }),
            http_upstream_type: Some(http_uri::HttpUpstreamType::Cluster(cluster)),
        }),
        cache_duration: Some(envoy_types::pb::google::protobuf::Duration {
            seconds: 300,
            nanos: 0,
        }),
        ..Default::default()
    })
}

/// The rule's inline `jwks`, else the fetched document, else the fake JWKS.
fn local_jwks(rule: &JwtRule, keys: &JwksTable) -> String {
    match JwksKey::of(rule) {
        None => rule.jwks.clone(),
        Some(key) => keys
            .get(&key)
            .map_or_else(|| fake_jwks(&rule.jwks_uri), str::to_string),
    }
}

#[cfg(test)]
mod tests;
