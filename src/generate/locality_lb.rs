//! Locality load balancing of a load assignment for one client, as Istio applies it
//! (`ApplyLocalityLoadBalancer`): `distribute` weights, `failover` between regions, and
//! `failoverPriority` over Istio's topology labels.

use std::collections::{BTreeMap, BTreeSet};

use envoy_types::pb::envoy::config::core::v3::Locality as EnvoyLocality;
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, LbEndpoint, LocalityLbEndpoints,
};
use envoy_types::pb::google::protobuf::UInt32Value;
use meshfed_api::networking::v1alpha3::LocalityLoadBalancerSetting;
use meshfed_api::networking::v1alpha3::locality_load_balancer_setting::{Distribute, Failover};
use meshfed_registry::Locality;

/// Locality load balancing for one client (Istio's ApplyLocalityLoadBalancer inputs).
#[derive(Clone, Copy, Debug)]
pub struct LocalityLb<'a> {
    /// The setting in force (see `destination_rule::locality_lb_setting`).
    pub setting: &'a LocalityLoadBalancerSetting,
    /// The client's locality.
    pub proxy_locality: &'a Locality,
    /// The client's labels (failoverPriority compares them with the endpoints').
    pub proxy_labels: &'a BTreeMap<String, String>,
    /// Outlier detection is configured: failover only works then, so it is only
    /// applied then.
    pub failover: bool,
}

/// Istio's topology labels, which failoverPriority may name.
pub const LABEL_REGION: &str = "topology.kubernetes.io/region";
/// Zone label.
pub const LABEL_ZONE: &str = "topology.kubernetes.io/zone";
/// Subzone label.
pub const LABEL_SUBZONE: &str = "topology.istio.io/subzone";
/// Network label.
pub const LABEL_NETWORK: &str = "topology.istio.io/network";
/// Cluster label.
pub const LABEL_CLUSTER: &str = "topology.istio.io/cluster";
/// The label Istio gives an endpoint (and a proxy) for its node.
pub const LABEL_HOSTNAME: &str = "kubernetes.io/hostname";

/// The topology labels a service's traffic distribution orders endpoints by, most
/// significant first (none for `Any`).
pub fn traffic_distribution_labels(
    distribution: meshfed_registry::TrafficDistribution,
) -> &'static [&'static str] {
    use meshfed_registry::TrafficDistribution as T;
    match distribution {
        T::Any => &[],
        T::PreferSameZone => &[LABEL_NETWORK, LABEL_REGION, LABEL_ZONE],
        T::PreferSameNode => &[
            LABEL_NETWORK,
            LABEL_REGION,
            LABEL_ZONE,
            LABEL_SUBZONE,
            LABEL_HOSTNAME,
        ],
    }
}

/// The locality setting a service's traffic distribution stands for (none for
/// `Any`): failover by its labels.
pub fn traffic_distribution_setting(
    distribution: meshfed_registry::TrafficDistribution,
) -> Option<LocalityLoadBalancerSetting> {
    let labels = traffic_distribution_labels(distribution);
    (!labels.is_empty()).then(|| LocalityLoadBalancerSetting {
        enabled: Some(true.into()),
        failover_priority: labels.iter().map(|l| l.to_string()).collect(),
        ..Default::default()
    })
}

/// Labels with Istio's topology labels added where missing (AugmentLabels): cluster,
/// region, zone, subzone, network.
pub fn augment_labels(
    labels: &BTreeMap<String, String>,
    cluster: &str,
    locality: &Locality,
    network: &str,
) -> BTreeMap<String, String> {
    let mut out = labels.clone();
    for (key, value) in [
        (LABEL_CLUSTER, cluster),
        (LABEL_REGION, locality.region.as_str()),
        (LABEL_ZONE, locality.zone.as_str()),
        (LABEL_SUBZONE, locality.subzone.as_str()),
        (LABEL_NETWORK, network),
    ] {
        if !value.is_empty() {
            out.entry(key.to_string())
                .or_insert_with(|| value.to_string());
        }
    }
    out
}

/// Applies a locality setting to a load assignment for one client (Istio's
/// ApplyLocalityLoadBalancer): `distribute` reweights (and empties) locality groups;
/// otherwise, when failover is on, groups get priorities by failoverPriority labels
/// (which needs `endpoint_labels`, the labels of each group's endpoints in order) and
/// by region/zone/subzone proximity and the `failover` rules.
pub fn apply_locality_lb(
    cla: &mut ClusterLoadAssignment,
    endpoint_labels: Option<&[Vec<BTreeMap<String, String>>]>,
    lb: &LocalityLb<'_>,
) {
    let s = lb.setting;
    if !s.distribute.is_empty() {
        apply_locality_weights(cla, lb.proxy_locality, &s.distribute);
    } else if lb.failover {
        if !s.failover_priority.is_empty() {
            if let Some(labels) = endpoint_labels {
                apply_failover_priorities(cla, labels, lb.proxy_labels, &s.failover_priority);
            }
            if !s.failover.is_empty() {
                apply_locality_failover(cla, lb.proxy_locality, &s.failover);
            }
        } else {
            apply_locality_failover(cla, lb.proxy_locality, &s.failover);
        }
    }
}

fn split_locality(rule: &str) -> (&str, &str, &str) {
    let mut parts = rule.split('/');
    let region = parts.next().unwrap_or("");
    let zone = parts.next().unwrap_or("");
    let subzone = parts.next().unwrap_or("");
    (region, zone, subzone)
}

/// Istio's LocalityMatch: `*` matches anything, a missing zone/subzone too.
fn locality_match(region: &str, zone: &str, subzone: &str, rule: &str) -> bool {
    let (r, z, s) = split_locality(rule);
    (r == "*" || r == region)
        && (z == "*" || z.is_empty() || z == zone)
        && (s == "*" || s.is_empty() || s == subzone)
}

fn parts(l: Option<&EnvoyLocality>) -> (&str, &str, &str) {
    l.map(|l| (l.region.as_str(), l.zone.as_str(), l.sub_zone.as_str()))
        .unwrap_or(("", "", ""))
}

/// `distribute`: the first rule whose `from` matches the client reweights every
/// locality group matched by one of its `to` entries (a `to` matching several groups
/// shares its weight in proportion to theirs, rounded up) and empties the others.
fn apply_locality_weights(
    cla: &mut ClusterLoadAssignment,
    proxy: &Locality,
    distribute: &[Distribute],
) {
    let Some(rule) = distribute
        .iter()
        .find(|d| locality_match(&proxy.region, &proxy.zone, &proxy.subzone, &d.from))
    else {
        return;
    };
    let mut unmatched: BTreeSet<usize> = (0..cla.endpoints.len()).collect();
    for (to, weight) in &rule.to {
        let mut matched: Vec<(usize, u32)> = Vec::new();
        let mut total = 0u64;
        for (i, group) in cla.endpoints.iter().enumerate() {
            if !unmatched.contains(&i) {
                continue;
            }
            let (r, z, s) = parts(group.locality.as_ref());
            if locality_match(r, z, s, to) {
                let original = group.load_balancing_weight.map_or(1, |w| w.value);
                matched.push((i, original));
                total += u64::from(original);
            }
        }
        for (i, original) in matched {
            unmatched.remove(&i);
            let share = (u64::from(original) * u64::from(*weight)) as f64 / total as f64;
            if share > 0.0 {
                cla.endpoints[i].load_balancing_weight = Some(UInt32Value {
                    value: share.ceil() as u32,
                });
            }
        }
    }
    for i in unmatched {
        cla.endpoints[i].lb_endpoints.clear();
    }
}

/// Proximity priorities: 0 same subzone, 1 same zone, 2 same region, 3 elsewhere, 4 a
/// region other than the `failover` target of the client's region. Combined with
/// priorities already set (times 5), then renumbered 0..N without gaps.
fn apply_locality_failover(
    cla: &mut ClusterLoadAssignment,
    proxy: &Locality,
    failover: &[Failover],
) {
    for group in &mut cla.endpoints {
        let (r, z, s) = parts(group.locality.as_ref());
        let mut priority = if proxy.region != r {
            3
        } else if proxy.zone != z {
            2
        } else if proxy.subzone != s {
            1
        } else {
            0
        };
        if priority == 3
            && let Some(rule) = failover.iter().find(|f| f.from == proxy.region)
            && r != rule.to
        {
            priority = 4;
        }
        group.priority = group.priority * 5 + priority;
    }
    compact_priorities(&mut cla.endpoints);
}

/// failoverPriority: within each locality group, an endpoint's priority is 0 when it
/// agrees with the client on every listed label, else `n - i` where label `i` is the
/// first that differs (`key=value` entries compare with the given value instead of the
/// client's). Groups split by priority; priorities renumbered without gaps.
fn apply_failover_priorities(
    cla: &mut ClusterLoadAssignment,
    labels: &[Vec<BTreeMap<String, String>>],
    proxy_labels: &BTreeMap<String, String>,
    failover_priority: &[String],
) {
    if proxy_labels.is_empty() || labels.is_empty() {
        return;
    }
    let lowest = failover_priority.len() as u32;
    let rules: Vec<(&str, Option<&str>)> = failover_priority
        .iter()
        .map(|l| match l.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (l.as_str(), None),
        })
        .collect();
    let mut out = Vec::new();
    for (group, group_labels) in cla.endpoints.drain(..).zip(labels) {
        let mut by_priority: BTreeMap<u32, Vec<LbEndpoint>> = BTreeMap::new();
        for (ep, ep_labels) in group.lb_endpoints.iter().zip(group_labels) {
            let mut priority = 0;
            for (j, (key, value)) in rules.iter().enumerate() {
                let wanted = value.or_else(|| proxy_labels.get(*key).map(String::as_str));
                if wanted != ep_labels.get(*key).map(String::as_str) {
                    priority = lowest - j as u32;
                    break;
                }
            }
            by_priority.entry(priority).or_default().push(ep.clone());
        }
        for (priority, lb_endpoints) in by_priority {
            let weight = lb_endpoints
                .iter()
                .map(|e| e.load_balancing_weight.map_or(0, |w| w.value))
                .fold(0u32, u32::saturating_add);
            out.push(LocalityLbEndpoints {
                locality: group.locality.clone(),
                lb_endpoints,
                priority,
                load_balancing_weight: Some(UInt32Value { value: weight }),
                ..Default::default()
            });
        }
    }
    cla.endpoints = out;
    compact_priorities(&mut cla.endpoints);
}

/// Priorities must run 0..N without gaps.
fn compact_priorities(groups: &mut [LocalityLbEndpoints]) {
    let used: BTreeSet<u32> = groups.iter().map(|g| g.priority).collect();
    let rank: BTreeMap<u32, u32> = used.into_iter().zip(0..).collect();
    for g in groups {
        g.priority = rank[&g.priority];
    }
}
