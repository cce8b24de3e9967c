//! EDS: one `ClusterLoadAssignment` per outbound cluster, endpoints from every shard of
//! the service, grouped by locality.

use std::collections::BTreeMap;

use envoy_types::pb::envoy::config::core::v3::{
    Address, HealthStatus as EnvoyHealth, Locality as EnvoyLocality, Metadata, SocketAddress,
    address, socket_address,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint as EnvoyEndpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint,
};
use envoy_types::pb::google::protobuf::{Struct, UInt32Value, Value, value};
use meshfed_registry::{Endpoint, EndpointShards, HealthStatus, Locality, Port};

/// Options that change which endpoints are sent.
#[derive(Clone, Copy, Debug, Default)]
pub struct EdsOptions {
    /// Send unhealthy (and draining) endpoints marked as such instead of dropping them
    /// (Istio's `PILOT_SEND_UNHEALTHY_ENDPOINTS`).
    pub send_unhealthy: bool,
}

/// The load assignment for `cluster_name` of `service` port `port`.
pub fn load_assignment(
    cluster_name: &str,
    port: &Port,
    shards: Option<&EndpointShards>,
    options: EdsOptions,
) -> ClusterLoadAssignment {
    let mut by_locality: BTreeMap<&Locality, Vec<LbEndpoint>> = BTreeMap::new();
    let mut weights: BTreeMap<&Locality, u32> = BTreeMap::new();
    for (_, ep) in shards.into_iter().flat_map(|s| s.iter()) {
        let Some(&target) = ep.ports.get(&port.name) else {
            continue;
        };
        let Some(health) = health_for(ep, options) else {
            continue;
        };
        let weight = ep.effective_weight();
        by_locality
            .entry(&ep.locality)
            .or_default()
            .push(lb_endpoint(ep, target, health, weight));
        let w = weights.entry(&ep.locality).or_default();
        *w = w.saturating_add(weight);
    }
    ClusterLoadAssignment {
        cluster_name: cluster_name.to_string(),
        endpoints: by_locality
            .into_iter()
            .map(|(locality, lb_endpoints)| LocalityLbEndpoints {
                locality: (!locality.is_empty()).then(|| EnvoyLocality {
                    region: locality.region.clone(),
                    zone: locality.zone.clone(),
                    sub_zone: locality.subzone.clone(),
                }),
                lb_endpoints,
                // gRPC clients ignore a locality without a weight; Envoy accepts it.
                load_balancing_weight: Some(UInt32Value {
                    value: weights[locality].max(1),
                }),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

/// Envoy health for an endpoint, or `None` when it must not be sent.
fn health_for(ep: &Endpoint, options: EdsOptions) -> Option<EnvoyHealth> {
    match ep.health {
        HealthStatus::Healthy => Some(EnvoyHealth::Healthy),
        HealthStatus::Unhealthy if options.send_unhealthy => Some(EnvoyHealth::Unhealthy),
        HealthStatus::Draining if options.send_unhealthy => Some(EnvoyHealth::Draining),
        HealthStatus::Unhealthy | HealthStatus::Draining | HealthStatus::Terminating => None,
    }
}

fn lb_endpoint(ep: &Endpoint, port: u16, health: EnvoyHealth, weight: u32) -> LbEndpoint {
    LbEndpoint {
        host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(EnvoyEndpoint {
            address: Some(socket(ep.address.to_string(), port)),
            ..Default::default()
        })),
        health_status: health as i32,
        load_balancing_weight: Some(UInt32Value { value: weight }),
        metadata: Some(tls_mode_metadata(ep.tls_mode.as_str())),
    }
}

/// A TCP socket address.
pub fn socket(address: String, port: u16) -> Address {
    Address {
        address: Some(address::Address::SocketAddress(SocketAddress {
            address,
            port_specifier: Some(socket_address::PortSpecifier::PortValue(u32::from(port))),
            ..Default::default()
        })),
    }
}

/// `envoy.transport_socket_match: {tlsMode: ...}`: how Istio tells the client whether
/// the endpoint takes Istio mTLS.
fn tls_mode_metadata(mode: &str) -> Metadata {
    let fields = [(
        "tlsMode".to_string(),
        Value {
            kind: Some(value::Kind::StringValue(mode.to_string())),
        },
    )];
    Metadata {
        filter_metadata: [(
            "envoy.transport_socket_match".to_string(),
            Struct {
                fields: fields.into(),
            },
        )]
        .into(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use meshfed_registry::{Protocol, ProviderId, ShardKey};

    use super::*;

    fn shards(eps: Vec<Endpoint>, other: Vec<Endpoint>) -> EndpointShards {
        let mut s = EndpointShards::default();
        s.shards
            .insert(ShardKey::new(ProviderId::Kubernetes, "c1"), eps.into());
        s.shards
            .insert(ShardKey::new(ProviderId::Kubernetes, "c2"), other.into());
        s
    }

    fn ep(ip: &str, locality: &str, weight: u32) -> Endpoint {
        let mut e = Endpoint::new(ip.parse().unwrap()).with_port("http", 8080);
        e.locality = Locality::parse(locality);
        e.weight = weight;
        e
    }

    #[test]
    fn groups_by_locality_sums_weights_and_merges_shards() {
        let port = Port::new("http", 80, Protocol::Http).unwrap();
        let mut unhealthy = ep("10.0.0.9", "r1/z1", 1);
        unhealthy.health = HealthStatus::Unhealthy;
        let mut other_port = Endpoint::new("10.0.0.8".parse().unwrap()).with_port("grpc", 9090);
        other_port.locality = Locality::parse("r1/z1");
        let s = shards(
            vec![
                ep("10.0.0.1", "r1/z1", 2),
                ep("10.0.0.2", "r1/z2", 0),
                unhealthy.clone(),
                other_port,
            ],
            vec![ep("10.1.0.1", "r1/z1", 3)],
        );
        let cla = load_assignment(
            "outbound|80||a.ns.svc.cluster.local",
            &port,
            Some(&s),
            EdsOptions::default(),
        );
        assert_eq!(cla.endpoints.len(), 2);
        let z1 = &cla.endpoints[0];
        assert_eq!(z1.locality.as_ref().unwrap().zone, "z1");
        assert_eq!(
            z1.lb_endpoints.len(),
            2,
            "both shards, without the unhealthy one or the other port's"
        );
        assert_eq!(z1.load_balancing_weight.unwrap().value, 5);
        assert_eq!(
            cla.endpoints[1].load_balancing_weight.unwrap().value,
            1,
            "weight 0 counts as 1"
        );

        let cla = load_assignment(
            "x",
            &port,
            Some(&s),
            EdsOptions {
                send_unhealthy: true,
            },
        );
        let unhealthy_sent = cla.endpoints[0]
            .lb_endpoints
            .iter()
            .filter(|e| e.health_status == EnvoyHealth::Unhealthy as i32);
        assert_eq!(unhealthy_sent.count(), 1);
        assert!(
            load_assignment("x", &port, None, EdsOptions::default())
                .endpoints
                .is_empty()
        );
    }
}
