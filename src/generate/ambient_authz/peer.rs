//! PeerAuthentications for ztunnel (Istio's `convertPeerAuthentication`,
//! `convertedSelectorPeerAuthentications` and the static STRICT policy of ambient
//! `authorization.go` and `policies.go`).
//!
//! ztunnel has no mTLS mode: STRICT is a DENY policy matching connections without a
//! peer identity (`notPrincipals: [presence]`). Mesh- and namespace-wide modes become
//! one shared policy, `<root>/istio_converted_static_strict`, that a workload lists
//! when its effective mode is STRICT; a workload PeerAuthentication with port-level
//! modes that differ from the effective one becomes a policy of its own,
//! `<ns>/converted_peer_authentication_<name>`, with the port exceptions (merged with
//! the inherited STRICT mode where there is one, since any matching DENY denies).

use std::collections::BTreeMap;

use meshfed_api::security::v1beta1::PeerAuthentication;
use meshfed_api::security::v1beta1::peer_authentication::{MutualTls, mutual_tls::Mode};
use meshfed_api::security::{
    self as l4, Authorization, Group, Match, Rules, StringMatch, string_match::MatchType,
};

use crate::push::config_index::Config;

/// The name of the shared STRICT policy (`_` cannot appear in a Kubernetes name).
pub const STATIC_STRICT_POLICY_NAME: &str = "istio_converted_static_strict";

/// The prefix of a converted PeerAuthentication's name.
pub const CONVERTED_PEER_AUTHENTICATION_PREFIX: &str = "converted_peer_authentication_";

type Pa = Config<PeerAuthentication>;

fn mode(m: Option<&MutualTls>) -> Mode {
    m.map_or(Mode::Unset, |m| m.mode())
}

fn strict(m: Option<&MutualTls>) -> bool {
    mode(m) == Mode::Strict
}

fn unset(m: Option<&MutualTls>) -> bool {
    mode(m) == Mode::Unset
}

fn no_peer_identity() -> Match {
    Match {
        not_principals: vec![StringMatch {
            match_type: Some(MatchType::Presence(pbjson_types::Empty {})),
        }],
        ..Default::default()
    }
}

/// The shared STRICT policy, sent whenever any PeerAuthentication exists.
pub fn static_strict_policy(root_namespace: &str) -> Authorization {
    Authorization {
        name: STATIC_STRICT_POLICY_NAME.to_string(),
        namespace: root_namespace.to_string(),
        scope: l4::Scope::WorkloadSelector as i32,
        action: l4::Action::Deny as i32,
        groups: vec![Group {
            rules: vec![Rules {
                matches: vec![no_peer_identity()],
            }],
        }],
    }
}

/// The name of `pa`'s converted policy.
pub fn converted_name(pa_name: &str) -> String {
    format!("{CONVERTED_PEER_AUTHENTICATION_PREFIX}{pa_name}")
}

/// The oldest of `policies` (the first of equally old ones).
pub fn oldest<'a>(policies: impl IntoIterator<Item = &'a Pa>) -> Option<&'a Pa> {
    let mut found: Option<&Pa> = None;
    for p in policies {
        if found.is_none_or(|f| p.creation_time < f.creation_time) {
            found = Some(p);
        }
    }
    found
}

/// The namespace-wide policy of `namespace` a workload PeerAuthentication inherits
/// from: the oldest without a selector.
pub fn namespace_policy<'a>(all: &'a [std::sync::Arc<Pa>], namespace: &str) -> Option<&'a Pa> {
    oldest(
        all.iter()
            .map(|p| &**p)
            .filter(|p| p.namespace == namespace && p.spec.selector.is_none()),
    )
}

/// `pa` as a layer-4 policy, given the namespace-wide (`ns`) and mesh-wide (`root`)
/// policies it inherits from. Only a workload policy (a selector, outside the root
/// namespace) with port-level modes that change what the inherited or own mode says
/// becomes one; the rest is covered by the static STRICT policy.
pub fn convert_peer_authentication(
    root_namespace: &str,
    pa: &Pa,
    ns: Option<&Pa>,
    root: Option<&Pa>,
) -> Option<Authorization> {
    let spec = &pa.spec;
    if pa.namespace == root_namespace || spec.selector.is_none() || spec.port_level_mtls.is_empty()
    {
        return None;
    }
    let own = spec.mtls.as_ref();
    let m = mode(own);
    let ns_mtls = ns.and_then(|p| p.spec.mtls.as_ref());
    let root_mtls = root.and_then(|p| p.spec.mtls.as_ref());
    let mut rules = Vec::new();
    let mut groups = Vec::new();
    if m == Mode::Strict {
        rules.push(Rules {
            matches: vec![no_peer_identity()],
        });
    }
    let mut found_non_strict_port = false;
    // Ports in ascending order.
    for (port, port_mtls) in &spec.port_level_mtls {
        match port_mtls.mode() {
            Mode::Strict => {
                // Enforced by the own or inherited STRICT mode already. (Istio's test
                // reads `own STRICT || (own UNSET && ns STRICT) || (ns unset && root
                // STRICT)`, the last term without the own mode.)
                if strict(own)
                    || (unset(own) && ns.is_some() && strict(ns_mtls))
                    || ((ns.is_none() || unset(ns_mtls)) && root.is_some() && strict(root_mtls))
                {
                    continue;
                }
                groups.push(Group {
                    rules: vec![Rules {
                        matches: vec![Match {
                            destination_ports: vec![*port],
                            ..no_peer_identity()
                        }],
                    }],
                });
            }
            Mode::Permissive | Mode::Disable => {
                if matches!(m, Mode::Permissive | Mode::Disable) {
                    continue;
                }
                if m == Mode::Unset
                    && ((ns.is_some() && !strict(ns_mtls))
                        || (ns.is_none() && root.is_some() && !strict(root_mtls))
                        || (ns.is_none() && root.is_none()))
                {
                    continue;
                }
                found_non_strict_port = true;
                // Deny unless the connection is for this port (no identity needed).
                rules.push(Rules {
                    matches: vec![Match {
                        not_destination_ports: vec![*port],
                        ..Default::default()
                    }],
                });
            }
            Mode::Unset => {}
        }
    }
    if m == Mode::Strict && !found_non_strict_port {
        return None;
    }
    if rules.is_empty() && groups.is_empty() {
        return None;
    }
    let merge_strict = (root.is_some()
        && strict(root_mtls)
        && (ns.is_none() || unset(ns_mtls) || strict(ns_mtls)))
        || (ns.is_some() && strict(ns_mtls));
    if merge_strict && found_non_strict_port {
        rules.push(Rules {
            matches: vec![no_peer_identity()],
        });
    }
    if !rules.is_empty() {
        groups.push(Group { rules });
    }
    Some(Authorization {
        name: converted_name(&pa.name),
        namespace: pa.namespace.clone(),
        scope: l4::Scope::WorkloadSelector as i32,
        action: l4::Action::Deny as i32,
        groups,
    })
}

/// The PeerAuthentications that apply to a workload of `namespace` with `labels`:
/// the root namespace's without a selector, its namespace's without a selector, and
/// its namespace's whose selector its labels satisfy.
pub fn applicable<'a>(
    all: &'a [std::sync::Arc<Pa>],
    root_namespace: &str,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> impl Iterator<Item = &'a Pa> {
    all.iter().map(|p| &**p).filter(move |p| {
        if p.namespace == root_namespace && p.spec.selector.is_none() {
            return true;
        }
        if p.namespace != namespace {
            return false;
        }
        p.spec
            .selector
            .as_ref()
            .is_none_or(|s| s.match_labels.iter().all(|(k, v)| labels.get(k) == Some(v)))
    })
}

/// The names (`<ns>/<name>`, sorted) of the PeerAuthentication-derived policies a
/// workload lists, from the policies that apply to it ([`applicable`]): the static
/// STRICT policy when its effective mode is STRICT, and its workload policy's
/// converted form when that policy's port-level modes differ from the effective one.
pub fn workload_keys<'a>(
    root_namespace: &str,
    applicable: impl IntoIterator<Item = &'a Pa>,
) -> Vec<String> {
    let mut mesh: Option<&Pa> = None;
    let mut namespace: Option<&Pa> = None;
    let mut workload: Option<&Pa> = None;
    let older = |p: &Pa, cur: Option<&Pa>| cur.is_none_or(|c| p.creation_time < c.creation_time);
    for p in applicable {
        let no_labels = p
            .spec
            .selector
            .as_ref()
            .is_none_or(|s| s.match_labels.is_empty());
        if no_labels {
            if p.namespace == root_namespace {
                if older(p, mesh) {
                    mesh = Some(p);
                }
            } else if older(p, namespace) {
                namespace = Some(p);
            }
        } else if p.namespace != root_namespace && older(p, workload) {
            workload = Some(p);
        }
    }
    let mut effective_strict = mesh.is_some_and(|p| strict(p.spec.mtls.as_ref()));
    if let Some(ns) = namespace
        && !unset(ns.spec.mtls.as_ref())
    {
        effective_strict = strict(ns.spec.mtls.as_ref());
    }
    let mut port_policy: Option<String> = None;
    if let Some(w) = workload {
        let own = w.spec.mtls.as_ref();
        match mode(own) {
            Mode::Strict => effective_strict = true,
            Mode::Permissive | Mode::Disable => effective_strict = false,
            Mode::Unset => {}
        }
        let key = || format!("{}/{}", w.namespace, converted_name(&w.name));
        let ports = || w.spec.port_level_mtls.values().map(|m| m.mode());
        if !w.spec.port_level_mtls.is_empty() {
            match mode(own) {
                Mode::Strict => {
                    if ports().any(|m| matches!(m, Mode::Permissive | Mode::Disable)) {
                        port_policy = Some(key());
                        effective_strict = false;
                    }
                }
                Mode::Permissive | Mode::Disable => {
                    if ports().any(|m| m == Mode::Strict) {
                        port_policy = Some(key());
                    }
                }
                Mode::Unset => {
                    if effective_strict {
                        if ports().any(|m| m == Mode::Permissive) {
                            port_policy = Some(key());
                            effective_strict = false;
                        }
                    } else if ports().any(|m| m == Mode::Strict) {
                        port_policy = Some(key());
                    }
                }
            }
        }
    }
    let mut keys = Vec::new();
    if effective_strict {
        keys.push(format!("{root_namespace}/{STATIC_STRICT_POLICY_NAME}"));
    }
    keys.extend(port_policy);
    keys.sort();
    keys.dedup();
    keys
}
