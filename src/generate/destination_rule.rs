//! Which part of a DestinationRule applies: a subset by name, a port's policy, the
//! subset's policy merged over the rule's, the locality setting in force, and the route
//! hash policies of a consistent-hash load balancer (istiod's
//! `networking/util` MergeSubsetTrafficPolicy and `route.go`).
//!
//! Pure functions of the rule: the caller picks the DestinationRule (and so decides
//! what goes into the cache key).

use std::collections::BTreeMap;

use envoy_types::pb::envoy::config::route::v3::route_action::{HashPolicy, hash_policy};
use meshfed_api::mesh::v1alpha1::MeshConfig;
use meshfed_api::networking::v1alpha3::load_balancer_settings::LbPolicy;
use meshfed_api::networking::v1alpha3::load_balancer_settings::consistent_hash_lb::HashKey;
use meshfed_api::networking::v1alpha3::{
    DestinationRule, LoadBalancerSettings, LocalityLoadBalancerSetting, Subset, TrafficPolicy,
};

use super::proto::pb_duration;

// ---------------------------------------------------------------------------------
// Which policy applies

/// The subset of `rule` named `name`.
pub fn subset<'a>(rule: &'a DestinationRule, name: &str) -> Option<&'a Subset> {
    rule.subsets.iter().find(|s| s.name == name)
}

/// The policy for one port: the matching `portLevelSettings` entry replaces the
/// top-level settings entirely (omitted fields take their defaults, they are not
/// inherited), as Istio's GetPortLevelTrafficPolicy. The bool says whether a port-level
/// entry matched. Port-level settings of the result are dropped.
pub fn port_level_policy(policy: &TrafficPolicy, port: u16) -> (TrafficPolicy, bool) {
    let port_level = policy
        .port_level_settings
        .iter()
        .find(|p| p.port.is_some_and(|s| s.number == u32::from(port)));
    match port_level {
        Some(p) => (
            TrafficPolicy {
                load_balancer: p.load_balancer.clone(),
                connection_pool: p.connection_pool,
                outlier_detection: p.outlier_detection,
                tls: p.tls.clone(),
                ..Default::default()
            },
            true,
        ),
        None => (
            TrafficPolicy {
                port_level_settings: Vec::new(),
                ..policy.clone()
            },
            false,
        ),
    }
}

/// Merges a subset's policy over the rule's, for `port` (Istio's
/// MergeSubsetTrafficPolicy): both are first resolved for the port; each of the
/// subset's connection pool, outlier detection, load balancer and TLS replaces the
/// rule's when set, and all four do when the subset has port-level settings for the
/// port.
pub fn merge_subset_policy(
    top: Option<&TrafficPolicy>,
    subset: Option<&TrafficPolicy>,
    port: u16,
) -> Option<TrafficPolicy> {
    let original = top.map(|p| port_level_policy(p, port).0);
    let Some(subset) = subset else {
        return original;
    };
    let (subset, port_level) = port_level_policy(subset, port);
    let Some(mut merged) = original else {
        return Some(subset);
    };
    if subset.connection_pool.is_some() || port_level {
        merged.connection_pool = subset.connection_pool;
    }
    if subset.outlier_detection.is_some() || port_level {
        merged.outlier_detection = subset.outlier_detection;
    }
    if subset.load_balancer.is_some() || port_level {
        merged.load_balancer = subset.load_balancer;
    }
    if subset.tls.is_some() || port_level {
        merged.tls = subset.tls;
    }
    if subset.tunnel.is_some() {
        merged.tunnel = subset.tunnel;
    }
    if subset.proxy_protocol.is_some() {
        merged.proxy_protocol = subset.proxy_protocol;
    }
    Some(merged)
}

/// The policy a rule gives traffic to `port`, for the whole service (`subset` empty)
/// or one subset. `None` when the rule sets no policy or has no such subset.
pub fn destination_policy(
    rule: &DestinationRule,
    port: u16,
    subset_name: &str,
) -> Option<TrafficPolicy> {
    if subset_name.is_empty() {
        return rule
            .traffic_policy
            .as_ref()
            .map(|p| port_level_policy(p, port).0);
    }
    let s = subset(rule, subset_name)?;
    merge_subset_policy(
        rule.traffic_policy.as_ref(),
        s.traffic_policy.as_ref(),
        port,
    )
}

/// Whether an endpoint with `labels` belongs to a subset selecting `selector`.
pub fn labels_match(
    selector: &BTreeMap<String, String>,
    labels: &BTreeMap<String, String>,
) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// The locality setting in force: the rule's (unless it says `enabled: false`), else the
/// mesh's (unless disabled). The mesh default is Istio's `{enabled: true}`.
/// The locality setting in force for a service whose rule has `lb`: the rule's own
/// when it sets one; else the one the service's traffic distribution stands for, with
/// `true` (failover applies even without outlier detection: istiod's
/// `GetLocalityLbSetting`); else the mesh's ([`locality_lb_setting`]).
pub fn locality_lb_setting_for(
    mesh: &MeshConfig,
    lb: Option<&LoadBalancerSettings>,
    distribution: meshfed_registry::TrafficDistribution,
) -> (Option<LocalityLoadBalancerSetting>, bool) {
    if lb.and_then(|lb| lb.locality_lb_setting.as_ref()).is_none()
        && let Some(setting) = super::locality_lb::traffic_distribution_setting(distribution)
    {
        return (Some(setting), true);
    }
    (locality_lb_setting(mesh, lb), false)
}

pub fn locality_lb_setting(
    mesh: &MeshConfig,
    lb: Option<&LoadBalancerSettings>,
) -> Option<LocalityLoadBalancerSetting> {
    if let Some(rule) = lb.and_then(|lb| lb.locality_lb_setting.as_ref()) {
        return (rule.enabled != Some(false.into())).then(|| rule.clone());
    }
    match &mesh.locality_lb_setting {
        Some(m) if m.enabled == Some(false.into()) => None,
        Some(m) => Some(m.clone()),
        None => Some(LocalityLoadBalancerSetting {
            enabled: Some(true.into()),
            ..Default::default()
        }),
    }
}

// ---------------------------------------------------------------------------------
// Hash policies (for routes)

/// The route hash policies of a consistent-hash load balancer (Istio puts them on the
/// routes to the destination; the cluster only gets RING_HASH or MAGLEV). Pass the
/// policy that applies to the route's destination, e.g. from [`destination_policy`].
pub fn hash_policy(policy: Option<&TrafficPolicy>) -> Vec<HashPolicy> {
    let Some(LbPolicy::ConsistentHash(hash)) = policy
        .and_then(|p| p.load_balancer.as_ref())
        .and_then(|lb| lb.lb_policy.as_ref())
    else {
        return Vec::new();
    };
    use hash_policy::PolicySpecifier;
    let specifier = match &hash.hash_key {
        Some(HashKey::HttpHeaderName(header)) => PolicySpecifier::Header(hash_policy::Header {
            header_name: header.clone(),
            ..Default::default()
        }),
        Some(HashKey::HttpCookie(cookie)) => PolicySpecifier::Cookie(hash_policy::Cookie {
            name: cookie.name.clone(),
            ttl: cookie.ttl.map(pb_duration),
            path: cookie.path.clone(),
            ..Default::default()
        }),
        Some(HashKey::UseSourceIp(source_ip)) => {
            PolicySpecifier::ConnectionProperties(hash_policy::ConnectionProperties {
                source_ip: *source_ip,
            })
        }
        Some(HashKey::HttpQueryParameterName(name)) => {
            PolicySpecifier::QueryParameter(hash_policy::QueryParameter { name: name.clone() })
        }
        None => return Vec::new(),
    };
    vec![HashPolicy {
        policy_specifier: Some(specifier),
        ..Default::default()
    }]
}
