//! Partial views of the xDS resources: only the fields a simulated proxy follows
//! (names it must subscribe to next, endpoint ports). Decoding into these skips every
//! other field, so thousands of simulated proxies cost the load tool little CPU. Field
//! numbers are those of the Envoy v3 protos.

use prost::Message;

use super::marker::{marker_change, route_marker_change};

/// `envoy.service.discovery.v3.DiscoveryResponse`, with each resource's bytes kept
/// as they arrived (`Bytes` fields decode without copying from tonic's buffer).
#[derive(Clone, PartialEq, Message)]
pub struct SotwResponseLite {
    #[prost(string, tag = "1")]
    pub version_info: String,
    #[prost(message, repeated, tag = "2")]
    pub resources: Vec<ResourceAny>,
    #[prost(string, tag = "4")]
    pub type_url: String,
    #[prost(string, tag = "5")]
    pub nonce: String,
}

/// `envoy.service.discovery.v3.DeltaDiscoveryResponse`.
#[derive(Clone, PartialEq, Message)]
pub struct DeltaResponseLite {
    #[prost(string, tag = "1")]
    pub system_version_info: String,
    #[prost(message, repeated, tag = "2")]
    pub resources: Vec<DeltaResourceLite>,
    #[prost(string, tag = "4")]
    pub type_url: String,
    #[prost(string, tag = "5")]
    pub nonce: String,
    #[prost(string, repeated, tag = "6")]
    pub removed_resources: Vec<String>,
}

/// `envoy.service.discovery.v3.Resource`.
#[derive(Clone, PartialEq, Message)]
pub struct DeltaResourceLite {
    #[prost(string, tag = "1")]
    pub version: String,
    #[prost(message, optional, tag = "2")]
    pub resource: Option<ResourceAny>,
    #[prost(string, tag = "3")]
    pub name: String,
}

/// A top-level `google.protobuf.Any` of a response (the type URL is the response's).
#[derive(Clone, PartialEq, Message)]
pub struct ResourceAny {
    #[prost(bytes = "bytes", tag = "2")]
    pub value: bytes::Bytes,
}

/// `envoy.config.cluster.v3.Cluster`.
#[derive(Clone, PartialEq, Message)]
pub struct ClusterLite {
    #[prost(string, tag = "1")]
    pub name: String,
    /// `type` (in the `cluster_discovery_type` oneof): `EDS` is 3.
    #[prost(int32, tag = "2")]
    pub discovery_type: i32,
    #[prost(message, optional, tag = "3")]
    pub eds_cluster_config: Option<EdsClusterConfigLite>,
}

/// `Cluster.EdsClusterConfig`.
#[derive(Clone, PartialEq, Message)]
pub struct EdsClusterConfigLite {
    #[prost(string, tag = "2")]
    pub service_name: String,
}

/// The value of `Cluster.DiscoveryType.EDS`.
pub const EDS: i32 = 3;

impl ClusterLite {
    /// The EDS name to subscribe to, for an EDS cluster.
    pub fn eds_name(&self) -> Option<&str> {
        if self.discovery_type != EDS {
            return None;
        }
        Some(
            self.eds_cluster_config
                .as_ref()
                .map(|c| c.service_name.as_str())
                .filter(|n| !n.is_empty())
                .unwrap_or(&self.name),
        )
    }
}

/// `envoy.config.listener.v3.Listener`.
#[derive(Clone, PartialEq, Message)]
pub struct ListenerLite {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, repeated, tag = "3")]
    pub filter_chains: Vec<FilterChainLite>,
    #[prost(message, optional, tag = "19")]
    pub api_listener: Option<ApiListenerLite>,
    #[prost(message, optional, tag = "25")]
    pub default_filter_chain: Option<FilterChainLite>,
}

/// `envoy.config.listener.v3.FilterChain`.
#[derive(Clone, PartialEq, Message)]
pub struct FilterChainLite {
    #[prost(message, repeated, tag = "3")]
    pub filters: Vec<FilterLite>,
}

/// `envoy.config.listener.v3.Filter`.
#[derive(Clone, PartialEq, Message)]
pub struct FilterLite {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "4")]
    pub typed_config: Option<AnyLite>,
}

/// `envoy.config.listener.v3.ApiListener`.
#[derive(Clone, PartialEq, Message)]
pub struct ApiListenerLite {
    #[prost(message, optional, tag = "1")]
    pub api_listener: Option<AnyLite>,
}

/// `google.protobuf.Any`.
#[derive(Clone, PartialEq, Message)]
pub struct AnyLite {
    #[prost(string, tag = "1")]
    pub type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

/// `HttpConnectionManager`: only `rds` (tag 3).
#[derive(Clone, PartialEq, Message)]
pub struct HcmLite {
    #[prost(message, optional, tag = "3")]
    pub rds: Option<RdsLite>,
}

/// `HttpConnectionManager.Rds`.
#[derive(Clone, PartialEq, Message)]
pub struct RdsLite {
    #[prost(string, tag = "2")]
    pub route_config_name: String,
}

const HCM_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";

impl ListenerLite {
    /// Every RDS name the listener's HTTP connection managers use, deduplicated.
    pub fn route_names(&self) -> Result<Vec<String>, prost::DecodeError> {
        let mut names = Vec::new();
        let chains = self
            .filter_chains
            .iter()
            .chain(self.default_filter_chain.as_ref());
        let anys = chains
            .flat_map(|c| c.filters.iter())
            .filter_map(|f| f.typed_config.as_ref())
            .chain(
                self.api_listener
                    .as_ref()
                    .and_then(|a| a.api_listener.as_ref()),
            );
        for any in anys {
            if any.type_url != HCM_TYPE {
                continue;
            }
            let hcm = HcmLite::decode(any.value.as_slice())?;
            if let Some(rds) = hcm.rds
                && !rds.route_config_name.is_empty()
                && !names.contains(&rds.route_config_name)
            {
                names.push(rds.route_config_name);
            }
        }
        Ok(names)
    }
}

/// `envoy.config.route.v3.RouteConfiguration`, name only (sidecars follow no name
/// out of routes).
#[derive(Clone, PartialEq, Message)]
pub struct RouteNameLite {
    #[prost(string, tag = "1")]
    pub name: String,
}

/// `envoy.config.route.v3.RouteConfiguration`, with the clusters its routes use
/// (proxyless clients subscribe to them over CDS).
#[derive(Clone, PartialEq, Message)]
pub struct RouteConfigurationLite {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, repeated, tag = "2")]
    pub virtual_hosts: Vec<VirtualHostLite>,
}

/// `VirtualHost`.
#[derive(Clone, PartialEq, Message)]
pub struct VirtualHostLite {
    #[prost(message, repeated, tag = "3")]
    pub routes: Vec<RouteLite>,
}

/// `Route`: the `route` action (tag 2) and the name (tag 14).
#[derive(Clone, PartialEq, Message)]
pub struct RouteLite {
    #[prost(message, optional, tag = "2")]
    pub route: Option<RouteActionLite>,
    #[prost(string, tag = "14")]
    pub name: String,
}

/// `RouteAction`: `cluster` (1) and `weighted_clusters` (3).
#[derive(Clone, PartialEq, Message)]
pub struct RouteActionLite {
    #[prost(string, tag = "1")]
    pub cluster: String,
    #[prost(message, optional, tag = "3")]
    pub weighted_clusters: Option<WeightedClusterLite>,
}

/// `WeightedCluster`.
#[derive(Clone, PartialEq, Message)]
pub struct WeightedClusterLite {
    #[prost(message, repeated, tag = "1")]
    pub clusters: Vec<ClusterWeightLite>,
}

/// `WeightedCluster.ClusterWeight`.
#[derive(Clone, PartialEq, Message)]
pub struct ClusterWeightLite {
    #[prost(string, tag = "1")]
    pub name: String,
}

impl RouteConfigurationLite {
    /// The newest config change a route is named after (`load-change-<i>`).
    pub fn newest_marker(&self) -> Option<u32> {
        self.virtual_hosts
            .iter()
            .flat_map(|v| v.routes.iter())
            .filter_map(|r| route_marker_change(&r.name))
            .max()
    }

    /// Every cluster the routes send to, deduplicated.
    pub fn cluster_names(&self) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        for action in self
            .virtual_hosts
            .iter()
            .flat_map(|v| v.routes.iter())
            .filter_map(|r| r.route.as_ref())
        {
            let weighted = action
                .weighted_clusters
                .iter()
                .flat_map(|w| w.clusters.iter().map(|c| &c.name));
            for name in std::iter::once(&action.cluster).chain(weighted) {
                if !name.is_empty() && !names.contains(name) {
                    names.push(name.clone());
                }
            }
        }
        names
    }
}

/// The length-delimited fields of an encoded message, as `(tag, value)`, every other
/// field skipped; nothing is allocated.
fn delimited_fields(
    mut buf: &[u8],
) -> impl Iterator<Item = Result<(u32, &[u8]), prost::DecodeError>> {
    use prost::encoding::{DecodeContext, WireType, decode_key, decode_varint, skip_field};
    std::iter::from_fn(move || {
        while !buf.is_empty() {
            let step = (|| {
                let (tag, wire_type) = decode_key(&mut buf)?;
                if wire_type != WireType::LengthDelimited {
                    skip_field(wire_type, tag, &mut buf, DecodeContext::default())?;
                    return Ok(None);
                }
                let mut at_len = buf;
                // Checks the length against what is left.
                skip_field(wire_type, tag, &mut buf, DecodeContext::default())?;
                let len = decode_varint(&mut at_len)? as usize;
                Ok(Some((tag, &at_len[..len])))
            })();
            match step {
                Ok(None) => continue,
                Ok(Some(field)) => return Some(Ok(field)),
                Err(e) => {
                    buf = &[];
                    return Some(Err(e));
                }
            }
        }
        None
    })
}

/// The name of an encoded `RouteConfiguration` and the newest config change its routes
/// are named after, read by walking `virtual_hosts` (2) -> `routes` (3) -> `name` (14)
/// without decoding messages: a sidecar's table for a port names every service of the
/// mesh (~650 KB for 1,000), and each of 2,000 simulated sidecars reads it on every
/// config change.
pub fn route_name_and_marker(bytes: &[u8]) -> Result<(String, Option<u32>), prost::DecodeError> {
    // Decoding only the name skips the virtual hosts by their lengths.
    let name = RouteNameLite::decode(bytes)?.name;
    let mut newest = None;
    for field in delimited_fields(bytes) {
        let (2, host) = field? else { continue };
        for field in delimited_fields(host) {
            let (3, route) = field? else { continue };
            for field in delimited_fields(route) {
                let (14, route_name) = field? else { continue };
                let marker = std::str::from_utf8(route_name)
                    .ok()
                    .and_then(route_marker_change);
                newest = newest.max(marker);
            }
        }
    }
    Ok((name, newest))
}

/// `envoy.config.endpoint.v3.ClusterLoadAssignment`.
#[derive(Clone, PartialEq, Message)]
pub struct ClaLite {
    #[prost(string, tag = "1")]
    pub cluster_name: String,
    #[prost(message, repeated, tag = "2")]
    pub endpoints: Vec<LocalityLbEndpointsLite>,
}

/// `LocalityLbEndpoints`.
#[derive(Clone, PartialEq, Message)]
pub struct LocalityLbEndpointsLite {
    #[prost(message, repeated, tag = "2")]
    pub lb_endpoints: Vec<LbEndpointLite>,
}

/// `LbEndpoint`.
#[derive(Clone, PartialEq, Message)]
pub struct LbEndpointLite {
    #[prost(message, optional, tag = "1")]
    pub endpoint: Option<EndpointLite>,
}

/// `Endpoint`.
#[derive(Clone, PartialEq, Message)]
pub struct EndpointLite {
    #[prost(message, optional, tag = "1")]
    pub address: Option<AddressLite>,
}

/// `envoy.config.core.v3.Address`.
#[derive(Clone, PartialEq, Message)]
pub struct AddressLite {
    #[prost(message, optional, tag = "1")]
    pub socket_address: Option<SocketAddressLite>,
}

/// `SocketAddress`.
#[derive(Clone, PartialEq, Message)]
pub struct SocketAddressLite {
    #[prost(string, tag = "2")]
    pub address: String,
    #[prost(uint32, tag = "3")]
    pub port_value: u32,
}

impl ClaLite {
    /// How many endpoints the assignment lists.
    pub fn endpoint_count(&self) -> usize {
        self.endpoints.iter().map(|l| l.lb_endpoints.len()).sum()
    }

    /// The changes whose marker ports the endpoints carry.
    pub fn markers(&self) -> impl Iterator<Item = u32> + '_ {
        self.endpoints
            .iter()
            .flat_map(|l| l.lb_endpoints.iter())
            .filter_map(|e| {
                e.endpoint
                    .as_ref()?
                    .address
                    .as_ref()?
                    .socket_address
                    .as_ref()
            })
            .filter_map(|s| marker_change(s.port_value))
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::cluster::v3::{Cluster, cluster};
    use envoy_types::pb::envoy::config::core::v3::{
        Address, SocketAddress, address, socket_address,
    };
    use envoy_types::pb::envoy::config::endpoint::v3::{
        ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint,
    };
    use envoy_types::pb::envoy::config::listener::v3::{
        ApiListener, Filter, FilterChain, Listener, filter,
    };
    use envoy_types::pb::envoy::config::route::v3::{
        Route, RouteAction, RouteConfiguration, VirtualHost, route, route_action,
    };
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
        HttpConnectionManager, Rds, http_connection_manager,
    };
    use envoy_types::pb::google::protobuf::Any;

    use super::*;

    fn hcm_any(route: &str) -> Any {
        Any {
            type_url: HCM_TYPE.into(),
            value: HttpConnectionManager {
                route_specifier: Some(http_connection_manager::RouteSpecifier::Rds(Rds {
                    route_config_name: route.into(),
                    ..Default::default()
                })),
                ..Default::default()
            }
            .encode_to_vec(),
        }
    }

    #[test]
    fn decodes_what_the_full_types_encode() {
        let cluster = Cluster {
            name: "outbound|80||a".into(),
            cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(
                cluster::DiscoveryType::Eds as i32,
            )),
            eds_cluster_config: Some(cluster::EdsClusterConfig {
                service_name: "outbound|80||a".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let lite = ClusterLite::decode(cluster.encode_to_vec().as_slice()).unwrap();
        assert_eq!(lite.eds_name(), Some("outbound|80||a"));
        let passthrough = Cluster {
            name: "PassthroughCluster".into(),
            cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(
                cluster::DiscoveryType::OriginalDst as i32,
            )),
            ..Default::default()
        };
        let lite = ClusterLite::decode(passthrough.encode_to_vec().as_slice()).unwrap();
        assert_eq!(lite.eds_name(), None);

        let listener = Listener {
            name: "0.0.0.0_80".into(),
            filter_chains: vec![FilterChain {
                filters: vec![Filter {
                    name: "envoy.filters.network.http_connection_manager".into(),
                    config_type: Some(filter::ConfigType::TypedConfig(hcm_any("80"))),
                }],
                ..Default::default()
            }],
            default_filter_chain: Some(FilterChain {
                filters: vec![Filter {
                    name: "x".into(),
                    config_type: Some(filter::ConfigType::TypedConfig(hcm_any("80"))),
                }],
                ..Default::default()
            }),
            api_listener: Some(ApiListener {
                api_listener: Some(hcm_any("outbound|80||a")),
            }),
            ..Default::default()
        };
        let lite = ListenerLite::decode(listener.encode_to_vec().as_slice()).unwrap();
        assert_eq!(lite.route_names().unwrap(), vec!["80", "outbound|80||a"]);

        let routes = RouteConfiguration {
            name: "outbound|80||a".into(),
            virtual_hosts: vec![VirtualHost {
                routes: vec![Route {
                    name: "load-change-4".into(),
                    action: Some(route::Action::Route(RouteAction {
                        cluster_specifier: Some(route_action::ClusterSpecifier::Cluster(
                            "outbound|80||a".into(),
                        )),
                        ..Default::default()
                    })),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        let bytes = routes.encode_to_vec();
        let lite = RouteConfigurationLite::decode(bytes.as_slice()).unwrap();
        assert_eq!(lite.cluster_names(), vec!["outbound|80||a"]);
        assert_eq!(lite.newest_marker(), Some(4));
        assert_eq!(
            RouteNameLite::decode(bytes.as_slice()).unwrap().name,
            "outbound|80||a"
        );
        // The walk without messages finds the newest marker across virtual hosts.
        let host = |route_names: &[&str]| VirtualHost {
            name: "h".into(),
            domains: vec!["a".into(), "a:80".into()],
            routes: route_names
                .iter()
                .map(|n| Route {
                    name: (*n).into(),
                    ..routes.virtual_hosts[0].routes[0].clone()
                })
                .collect(),
            ..Default::default()
        };
        let table = RouteConfiguration {
            name: "8080".into(),
            virtual_hosts: vec![
                host(&["default"]),
                host(&["load-change-9", "load-change-4"]),
                host(&[]),
            ],
            validate_clusters: Some(envoy_types::pb::google::protobuf::BoolValue { value: false }),
            ..Default::default()
        };
        let bytes = table.encode_to_vec();
        assert_eq!(
            route_name_and_marker(&bytes).unwrap(),
            ("8080".to_string(), Some(9))
        );
        assert_eq!(
            route_name_and_marker(&RouteConfiguration::default().encode_to_vec()).unwrap(),
            (String::new(), None)
        );
        assert!(route_name_and_marker(&bytes[..bytes.len() - 3]).is_err());

        let endpoint = |port: u32| LbEndpoint {
            host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
                address: Some(Address {
                    address: Some(address::Address::SocketAddress(SocketAddress {
                        address: "10.0.0.1".into(),
                        port_specifier: Some(socket_address::PortSpecifier::PortValue(port)),
                        ..Default::default()
                    })),
                }),
                ..Default::default()
            })),
            ..Default::default()
        };
        let cla = ClusterLoadAssignment {
            cluster_name: "outbound|80||a".into(),
            endpoints: vec![LocalityLbEndpoints {
                lb_endpoints: vec![endpoint(9080), endpoint(20005)],
                ..Default::default()
            }],
            ..Default::default()
        };
        let lite = ClaLite::decode(cla.encode_to_vec().as_slice()).unwrap();
        assert_eq!(lite.cluster_name, "outbound|80||a");
        assert_eq!(lite.markers().collect::<Vec<_>>(), vec![5]);
    }
}
