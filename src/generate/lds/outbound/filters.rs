//! The network filters of outbound and gateway chains: TCP proxies of routes and
//! clusters, the outbound HTTP connection manager (built by [`super::super::hcm`]),
//! the loop guard.

use envoy_types::pb::envoy::config::listener::v3::{Filter, FilterChain, FilterChainMatch, filter};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    Rds, http_connection_manager,
};
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::{TcpProxy, tcp_proxy};
use envoy_types::pb::google::protobuf::{Duration as PbDuration, UInt32Value};
use meshfed_api::networking::v1alpha3::{RouteDestination, VirtualService};
use meshfed_registry::Protocol;

use super::super::hcm::{HcmClass, HcmParts, HcmSettings};
use super::super::{ads_config, pack};
use crate::push::config_index::Config;
use crate::push::snapshot::Snapshot;

/// The TCP proxy of a `tcp`/`tls` route: one cluster, or weighted clusters with the
/// stat prefix `<vs>.<namespace>`. A destination without port takes its service's
/// only port (the service as seen from `namespace`), else `default_port`.
pub(in crate::generate::lds) fn routes_tcp_proxy(
    snapshot: &Snapshot,
    vs: &Config<VirtualService>,
    routes: &[RouteDestination],
    namespace: &str,
    default_port: u16,
) -> Filter {
    let cluster = |r: &RouteDestination| {
        let Some(d) = r.destination.as_ref() else {
            return crate::xds::names::BLACK_HOLE.to_string();
        };
        let port = match d.port.map(|p| p.number).filter(|n| *n != 0) {
            Some(n) => u16::try_from(n).unwrap_or(default_port),
            None => match snapshot.services().resolve(&d.host, namespace) {
                Some(s) if s.ports.len() == 1 => s.ports[0].port.get(),
                _ => default_port,
            },
        };
        crate::xds::names::outbound_name(port, &d.subset, &d.host)
    };
    if routes.len() == 1 {
        return tcp_proxy_filter(&cluster(&routes[0]));
    }
    weighted_tcp_proxy(
        &format!("{}.{}", vs.name, vs.namespace),
        routes
            .iter()
            .filter(|r| r.weight > 0)
            .map(|r| (cluster(r), u32::try_from(r.weight).unwrap_or(0)))
            .collect(),
    )
}

/// A TCP proxy splitting connections over weighted clusters.
pub(in crate::generate::lds) fn weighted_tcp_proxy(
    stat_prefix: &str,
    clusters: Vec<(String, u32)>,
) -> Filter {
    let proxy = TcpProxy {
        stat_prefix: stat_prefix.to_string(),
        cluster_specifier: Some(tcp_proxy::ClusterSpecifier::WeightedClusters(
            tcp_proxy::WeightedCluster {
                clusters: clusters
                    .into_iter()
                    .map(
                        |(name, weight)| tcp_proxy::weighted_cluster::ClusterWeight {
                            name,
                            weight,
                            ..Default::default()
                        },
                    )
                    .collect(),
            },
        )),
        ..Default::default()
    };
    Filter {
        name: "envoy.filters.network.tcp_proxy".into(),
        config_type: Some(filter::ConfigType::TypedConfig(pack(&proxy))),
    }
}

/// The connection manager of an outbound HTTP chain: RDS table `route` over ADS (the
/// port's shared `<port>`, or a sniffed VIP's own `<host>:<port>`), for a port of
/// `protocol`.
pub(super) fn outbound_hcm(
    snapshot: &Snapshot,
    proxy: &crate::model::ClientView,
    bind: &str,
    port: u16,
    protocol: Protocol,
    route: &str,
) -> Filter {
    HcmSettings::new(snapshot, proxy).filter(
        HcmClass::SidecarOutbound,
        HcmParts {
            stat_prefix: format!("outbound_{bind}_{port};"),
            routes: rds_routes(route),
            authz: &[],
            protocol,
        },
    )
}

/// Routes from RDS table `route` over ADS, with no initial fetch timeout (the
/// connection manager waits for its routes), as Istio's outbound and gateway connection
/// managers ask for them.
pub(in crate::generate::lds) fn rds_routes(route: &str) -> http_connection_manager::RouteSpecifier {
    http_connection_manager::RouteSpecifier::Rds(Rds {
        config_source: Some(envoy_types::pb::envoy::config::core::v3::ConfigSource {
            initial_fetch_timeout: Some(PbDuration::default()),
            ..ads_config()
        }),
        route_config_name: route.to_string(),
    })
}

/// The chain of a capture listener for connections addressed to its own port, which
/// would loop: they go to the black hole.
pub(in crate::generate::lds) fn loop_guard(name: &str, port: u16) -> FilterChain {
    FilterChain {
        name: name.into(),
        filter_chain_match: Some(FilterChainMatch {
            destination_port: Some(UInt32Value {
                value: u32::from(port),
            }),
            ..Default::default()
        }),
        filters: vec![tcp_proxy_filter(crate::xds::names::BLACK_HOLE)],
        ..Default::default()
    }
}

/// A TCP proxy to one cluster, the cluster name as stat prefix.
pub(in crate::generate::lds) fn tcp_proxy_filter(cluster: &str) -> Filter {
    let proxy = TcpProxy {
        stat_prefix: cluster.to_string(),
        cluster_specifier: Some(tcp_proxy::ClusterSpecifier::Cluster(cluster.to_string())),
        ..Default::default()
    };
    Filter {
        name: "envoy.filters.network.tcp_proxy".into(),
        config_type: Some(filter::ConfigType::TypedConfig(pack(&proxy))),
    }
}
