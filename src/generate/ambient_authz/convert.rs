//! An AuthorizationPolicy as ztunnel's layer-4 `istio.security.Authorization`
//! (Istio's `convertAuthorizationPolicy` and `handleRule`, ambient `authorization.go`).
//!
//! What ztunnel cannot see (HTTP attributes: hosts, methods, paths, request
//! principals, remote IPs, `when` keys other than the five layer-4 ones) is reported in
//! a [`Finding`], Istio's `UnsupportedValue` condition, and handled as Istio does: an
//! ALLOW rule using any of them is omitted (it never matches), a DENY rule keeps its
//! layer-4 parts (it matches more). CUSTOM and AUDIT policies are not converted.

use std::collections::BTreeSet;
use std::net::IpAddr;

use meshfed_api::security::v1beta1::{self as sec, authorization_policy::Action as ApAction};
use meshfed_api::security::{
    self as l4, Address, Authorization, Group, Match, Rules, ServiceAccountMatch, StringMatch,
    string_match::MatchType,
};

use crate::push::config_index::Config;

/// Istio's condition reason for what ztunnel cannot enforce as written.
pub const UNSUPPORTED_VALUE: &str = "UnsupportedValue";

const HTTP_RULE_HINT: &str = "In ambient mode you must use a waypoint proxy to enforce HTTP rules.";
const DENY_BOILERPLATE: &str = "DENY policy with HTTP attributes is enforced without the HTTP rules. \
     This will be more restrictive than requested.";
const ALLOW_BOILERPLATE: &str = "Within an ALLOW policy, rules matching HTTP attributes are omitted. \
     This will be more restrictive than requested.";

/// The `when` keys ztunnel evaluates.
const L4_WHEN_KEYS: [&str; 5] = [
    "source.ip",
    "source.namespace",
    "source.principal",
    "destination.ip",
    "destination.port",
];

/// A policy ztunnel enforces differently from what it says, or not at all: Istio's
/// status condition (reason and message) for the `ztunnel` ancestor.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Finding {
    /// `<namespace>/<name>` of the AuthorizationPolicy.
    pub policy: String,
    /// Istio's reason (`UnsupportedValue`).
    pub reason: &'static str,
    /// Istio's message.
    pub message: String,
}

/// The layer-4 form of `policy` (none when ztunnel gets nothing: it attaches by
/// `targetRef(s)`, which is for waypoints and gateways, or its action is CUSTOM or
/// AUDIT) and what ztunnel cannot enforce of it.
pub fn convert_authorization_policy(
    root_namespace: &str,
    policy: &Config<sec::AuthorizationPolicy>,
) -> (Option<Authorization>, Option<Finding>) {
    let spec = &policy.spec;
    if spec.target_ref.is_some() || !spec.target_refs.is_empty() {
        return (None, None);
    }
    let finding = |message: String| Finding {
        policy: format!("{}/{}", policy.namespace, policy.name),
        reason: UNSUPPORTED_VALUE,
        message,
    };
    let scope = if spec.selector.is_some() {
        l4::Scope::WorkloadSelector
    } else if policy.namespace == root_namespace {
        l4::Scope::Global
    } else {
        l4::Scope::Namespace
    };
    let (action, boilerplate) = match ApAction::try_from(spec.action) {
        Ok(ApAction::Allow) => (l4::Action::Allow, ALLOW_BOILERPLATE),
        Ok(ApAction::Deny) => (l4::Action::Deny, DENY_BOILERPLATE),
        Ok(other) => {
            let message = format!(
                "ztunnel does not support the {} action",
                other.as_str_name()
            );
            return (None, Some(finding(message)));
        }
        Err(_) => {
            let message = format!("ztunnel does not support the {} action", spec.action);
            return (None, Some(finding(message)));
        }
    };
    let mut out = Authorization {
        name: policy.name.clone(),
        namespace: policy.namespace.clone(),
        scope: scope as i32,
        action: action as i32,
        groups: Vec::new(),
    };
    let mut http_attributes = BTreeSet::new();
    for rule in &spec.rules {
        if let Some(rules) = handle_rule(action, rule, &policy.namespace, &mut http_attributes) {
            out.groups.push(Group { rules });
        }
    }
    let finding = (!http_attributes.is_empty()).then(|| {
        let found = http_attributes.into_iter().collect::<Vec<_>>().join(", ");
        finding(format!(
            "ztunnel does not support HTTP attributes (found: {found}). {HTTP_RULE_HINT} {boilerplate}"
        ))
    });
    (Some(out), finding)
}

/// The HTTP-only fields an operation sets, by their policy names.
fn http_operations(op: &sec::Operation) -> impl Iterator<Item = &'static str> {
    [
        ("hosts", !op.hosts.is_empty()),
        ("notHosts", !op.not_hosts.is_empty()),
        ("methods", !op.methods.is_empty()),
        ("notMethods", !op.not_methods.is_empty()),
        ("paths", !op.paths.is_empty()),
        ("notPaths", !op.not_paths.is_empty()),
    ]
    .into_iter()
    .filter_map(|(name, set)| set.then_some(name))
}

/// The HTTP-only fields a source sets.
fn http_sources(s: &sec::Source) -> impl Iterator<Item = &'static str> {
    [
        ("remoteIpBlocks", !s.remote_ip_blocks.is_empty()),
        ("notRemoteIpBlocks", !s.not_remote_ip_blocks.is_empty()),
        ("requestPrincipals", !s.request_principals.is_empty()),
        ("notRequestPrincipals", !s.not_request_principals.is_empty()),
    ]
    .into_iter()
    .filter_map(|(name, set)| set.then_some(name))
}

/// One rule's group: its `to` entries as one OR-ed rule, its `from` entries as another,
/// then one rule per `when` condition. `None` for an ALLOW rule that uses HTTP
/// attributes (it never matches at layer 4); the attributes go into `http_found`.
fn handle_rule(
    action: l4::Action,
    rule: &sec::Rule,
    rule_namespace: &str,
    http_found: &mut BTreeSet<String>,
) -> Option<Vec<Rules>> {
    let mut l7 = false;
    let default_op = sec::Operation::default();
    let to_matches: Vec<Match> = rule
        .to
        .iter()
        .map(|to| {
            let op = to.operation.as_ref().unwrap_or(&default_op);
            for name in http_operations(op) {
                l7 = true;
                http_found.insert(name.to_string());
            }
            Match {
                destination_ports: ports(&op.ports),
                not_destination_ports: ports(&op.not_ports),
                ..Default::default()
            }
        })
        .collect();
    let default_source = sec::Source::default();
    let from_matches: Vec<Match> = rule
        .from
        .iter()
        .map(|from| {
            let s = from.source.as_ref().unwrap_or(&default_source);
            for name in http_sources(s) {
                l7 = true;
                http_found.insert(name.to_string());
            }
            Match {
                source_ips: addresses(&s.ip_blocks),
                not_source_ips: addresses(&s.not_ip_blocks),
                namespaces: string_matches(&s.namespaces),
                not_namespaces: string_matches(&s.not_namespaces),
                service_accounts: service_accounts(&s.service_accounts, rule_namespace),
                not_service_accounts: service_accounts(&s.not_service_accounts, rule_namespace),
                principals: string_matches(&s.principals),
                not_principals: string_matches(&s.not_principals),
                ..Default::default()
            }
        })
        .collect();
    let mut rules = Vec::new();
    if !to_matches.is_empty() {
        rules.push(Rules {
            matches: to_matches,
        });
    }
    if !from_matches.is_empty() {
        rules.push(Rules {
            matches: from_matches,
        });
    }
    for when in &rule.when {
        if !L4_WHEN_KEYS.contains(&when.key.as_str()) {
            l7 = true;
            http_found.insert(when.key.clone());
        }
        rules.push(Rules {
            matches: vec![when_match(when)],
        });
    }
    if action == l4::Action::Allow && l7 {
        return None;
    }
    Some(rules)
}

/// A `when` condition as one match: its key picks the field, `values` the positive
/// side and `notValues` the negative one. Any other key gives an empty match.
fn when_match(when: &sec::Condition) -> Match {
    let (v, nv) = (&when.values, &when.not_values);
    let mut m = Match::default();
    match when.key.as_str() {
        "source.namespace" => {
            m.namespaces = string_matches(v);
            m.not_namespaces = string_matches(nv);
        }
        "source.principal" => {
            m.principals = string_matches(v);
            m.not_principals = string_matches(nv);
        }
        "source.ip" => {
            m.source_ips = addresses(v);
            m.not_source_ips = addresses(nv);
        }
        "destination.port" => {
            m.destination_ports = ports(v);
            m.not_destination_ports = ports(nv);
        }
        "destination.ip" => {
            m.destination_ips = addresses(v);
            m.not_destination_ips = addresses(nv);
        }
        _ => {}
    }
    m
}

/// `*` is presence, `*x` a suffix, `x*` a prefix, anything else exact.
pub fn string_matches(values: &[String]) -> Vec<StringMatch> {
    values
        .iter()
        .map(|v| {
            let t = if v == "*" {
                MatchType::Presence(pbjson_types::Empty {})
            } else if let Some(suffix) = v.strip_prefix('*') {
                MatchType::Suffix(suffix.to_string())
            } else if let Some(prefix) = v.strip_suffix('*') {
                MatchType::Prefix(prefix.to_string())
            } else {
                MatchType::Exact(v.clone())
            };
            StringMatch {
                match_type: Some(t),
            }
        })
        .collect()
}

/// `ns/sa`, or `sa` of the policy's namespace.
fn service_accounts(values: &[String], rule_namespace: &str) -> Vec<ServiceAccountMatch> {
    values
        .iter()
        .map(|v| match v.split_once('/') {
            Some((ns, sa)) => ServiceAccountMatch {
                namespace: ns.to_string(),
                service_account: sa.to_string(),
            },
            None => ServiceAccountMatch {
                namespace: rule_namespace.to_string(),
                service_account: v.clone(),
            },
        })
        .collect()
}

/// Decimal ports up to 65535; anything else (a port name, a range) is skipped, as
/// Istio skips it.
fn ports(values: &[String]) -> Vec<u32> {
    values
        .iter()
        .filter_map(|p| p.parse::<u32>().ok().filter(|p| *p <= 65535))
        .collect()
}

/// Addresses and CIDR blocks (the address as written, not masked); unparsable ones
/// are skipped, as Istio skips them.
fn addresses(values: &[String]) -> Vec<Address> {
    values
        .iter()
        .filter_map(|v| {
            let (addr, bits) = match v.split_once('/') {
                Some((addr, bits)) => {
                    let addr: IpAddr = addr.parse().ok()?;
                    // Go's prefix syntax: decimal, no sign, no leading zero.
                    if bits.is_empty()
                        || !bits.bytes().all(|b| b.is_ascii_digit())
                        || (bits.len() > 1 && bits.starts_with('0'))
                    {
                        return None;
                    }
                    let bits: u32 = bits.parse().ok()?;
                    (addr, bits)
                }
                None => {
                    let addr: IpAddr = v.parse().ok()?;
                    (addr, if addr.is_ipv4() { 32 } else { 128 })
                }
            };
            let (bytes, max) = match addr {
                IpAddr::V4(a) => (a.octets().to_vec(), 32),
                IpAddr::V6(a) => (a.octets().to_vec(), 128),
            };
            (bits <= max).then_some(Address {
                address: bytes,
                length: bits,
            })
        })
        .collect()
}
