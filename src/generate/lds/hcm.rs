//! The HTTP connection managers of sidecars and gateways, assembled in one place the
//! way Istio's `buildHTTPConnectionManager` (`networking/core/listener_builder.go`)
//! assembles them from the per-class options of `buildSidecarInboundHTTPOpts`
//! (`listener_inbound.go`), `buildSidecarOutboundHTTPListenerOpts` (`listener.go`) and
//! `buildGatewayConnectionManager` (`gateway.go`).
//!
//! Every class gets: codec `AUTO`; MeshConfig `pathNormalization` (`normalize_path`,
//! `merge_slashes`, `path_with_escaped_slashes_action`); websocket upgrades;
//! `stream_idle_timeout: 0s` (no idle reset of quiet streams); 100-continue proxied;
//! the proxy's metadata `IDLE_TIMEOUT` (connection idle timeout) and `HTTP10`
//! (HTTP/1.0 accepted);
//! and the HTTP filters in Istio's order: the authorization filters the caller built
//! (CUSTOM ext_authz, `jwt_authn`, RBAC), `grpc_web` on gRPC-Web ports,
//! `grpc_stats`, `istio.alpn` (not inbound), `fault`, `cors`, then the router.
//!
//! Per class:
//! - sidecar inbound: `use_remote_address: false`, `server_name: istio-envoy`,
//!   `forward_client_cert_details: APPEND_FORWARD` with the subject, URI and DNS SANs
//!   of the client certificate, empty HTTP/2 options on HTTP/2 and gRPC ports;
//! - sidecar outbound: `use_remote_address: false`, Envoy's own server name;
//! - gateway: `use_remote_address: true`, `server_name: istio-envoy`, the proxy's
//!   `gatewayTopology` (`xff_num_trusted_hops`, `forward_client_cert_details`, default
//!   `SANITIZE_SET`) with every detail of the client certificate, empty HTTP/1 options,
//!   meshNetworks' `fromCidr` ranges as internal addresses.
//!
//! Telemetry (access logs, tracing, `request_id_extension`, `istio.metadata_exchange`
//! and `istio.stats`) plugs in here: [`HcmSettings::build`] is the one place a
//! connection manager is assembled, and [`http_filters`] the one place its filter list
//! is.

use std::sync::LazyLock;

use envoy_types::pb::envoy::config::core::v3::{
    CidrRange, Http1ProtocolOptions, Http2ProtocolOptions, HttpProtocolOptions,
};
use envoy_types::pb::envoy::config::listener::v3::{Filter, filter};
use envoy_types::pb::envoy::extensions::filters::http::cors::v3::Cors;
use envoy_types::pb::envoy::extensions::filters::http::fault::v3::HttpFault;
use envoy_types::pb::envoy::extensions::filters::http::grpc_stats::v3::{
    FilterConfig as GrpcStatsConfig, filter_config::PerMethodStatSpecifier,
};
use envoy_types::pb::envoy::extensions::filters::http::grpc_web::v3::GrpcWeb;
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, http_connection_manager, http_filter,
};
use envoy_types::pb::google::protobuf::{BoolValue, Duration as PbDuration, UInt32Value};
use meshfed_api::mesh::v1alpha1::MeshNetworks;
use meshfed_api::mesh::v1alpha1::mesh_config::proxy_path_normalization::NormalizationType;
use meshfed_registry::Protocol;

use super::pack;
use crate::model::{ClientView, GatewayTopology};
use crate::push::snapshot::Snapshot;

use http_connection_manager::{
    CodecType, ForwardClientCertDetails, InternalAddressConfig, PathWithEscapedSlashesAction,
    SetCurrentClientCertDetails, UpgradeConfig,
};

/// Name of the network filter.
pub const HCM_FILTER: &str = "envoy.filters.network.http_connection_manager";
/// The router, last of every connection manager.
pub const ROUTER_FILTER: &str = "envoy.filters.http.router";
/// Fault injection (VirtualService `fault`, per route).
pub const FAULT_FILTER: &str = "envoy.filters.http.fault";
/// CORS (VirtualService `corsPolicy`, per route).
pub const CORS_FILTER: &str = "envoy.filters.http.cors";
/// Istio's upstream ALPN override.
pub const ALPN_FILTER: &str = "istio.alpn";
/// gRPC statistics.
pub const GRPC_STATS_FILTER: &str = "envoy.filters.http.grpc_stats";
/// gRPC-Web translation.
pub const GRPC_WEB_FILTER: &str = "envoy.filters.http.grpc_web";
/// The `Server` header of inbound and gateway responses.
pub const ISTIO_SERVER_NAME: &str = "istio-envoy";

/// MeshConfig `pathNormalization` as the connection manager's `normalize_path`,
/// `merge_slashes` and `path_with_escaped_slashes_action` (Istio's
/// `buildHTTPConnectionManager`).
pub fn path_normalization(
    normalization: NormalizationType,
) -> (bool, bool, PathWithEscapedSlashesAction) {
    match normalization {
        NormalizationType::None => (false, false, PathWithEscapedSlashesAction::KeepUnchanged),
        NormalizationType::Default | NormalizationType::Base => {
            (true, false, PathWithEscapedSlashesAction::KeepUnchanged)
        }
        NormalizationType::MergeSlashes => {
            (true, true, PathWithEscapedSlashesAction::KeepUnchanged)
        }
        NormalizationType::DecodeAndMergeSlashes => {
            (true, true, PathWithEscapedSlashesAction::UnescapeAndForward)
        }
    }
}

/// Which connection manager: Istio's listener classes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HcmClass {
    /// A chain of `virtualInbound` or of a bound inbound listener.
    SidecarInbound,
    /// An outbound listener of a sidecar.
    SidecarOutbound,
    /// A gateway server.
    Gateway,
}

/// What the connection managers of one proxy share: the mesh's path normalization and,
/// for gateways, the proxy's `gatewayTopology` and meshNetworks' internal ranges.
/// Everything it holds comes from the snapshot's mesh config and networks (a change to
/// either touches every listener) or the listener input's [`crate::model::ClientView`].
#[derive(Clone, Debug)]
pub struct HcmSettings {
    normalization: NormalizationType,
    topology: GatewayTopology,
    /// The proxy accepts HTTP/1.0 (metadata `HTTP10`).
    http10: bool,
    /// The proxy's connection idle timeout (metadata `IDLE_TIMEOUT`).
    idle_timeout: Option<PbDuration>,
    /// meshNetworks' `fromCidr` ranges: the addresses a connection manager that uses
    /// the remote address (a gateway's) treats as internal.
    internal_addresses: Option<InternalAddressConfig>,
}

/// What differs between the connection managers of one proxy.
pub struct HcmParts<'a> {
    pub stat_prefix: String,
    pub routes: http_connection_manager::RouteSpecifier,
    /// The authorization filters (CUSTOM, `jwt_authn`, RBAC), in order.
    pub authz: &'a [HttpFilter],
    /// The protocol of the port (HTTP/2 options, gRPC-Web).
    pub protocol: Protocol,
}

impl HcmSettings {
    /// The settings of `proxy` under the snapshot's mesh config.
    pub fn new(snapshot: &Snapshot, proxy: &ClientView) -> HcmSettings {
        let normalization = snapshot
            .mesh()
            .config
            .path_normalization
            .as_ref()
            .map_or(NormalizationType::Default, |p| p.normalization());
        HcmSettings {
            normalization,
            topology: proxy.gateway_topology,
            http10: proxy.http10,
            idle_timeout: proxy.idle_timeout.map(|d| PbDuration {
                seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
                nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
            }),
            internal_addresses: internal_addresses(&snapshot.mesh().networks),
        }
    }

    /// The proxy's idle timeout (metadata `IDLE_TIMEOUT`), which its inbound TCP
    /// proxies share with its connection managers.
    pub fn idle_timeout(&self) -> Option<PbDuration> {
        self.idle_timeout
    }

    /// The connection manager of `class` as a network filter.
    pub fn filter(&self, class: HcmClass, parts: HcmParts<'_>) -> Filter {
        Filter {
            name: HCM_FILTER.into(),
            config_type: Some(filter::ConfigType::TypedConfig(pack(
                &self.build(class, parts),
            ))),
        }
    }

    /// The connection manager of `class`.
    pub fn build(&self, class: HcmClass, parts: HcmParts<'_>) -> HttpConnectionManager {
        let (normalize, merge_slashes, escaped_slashes) = path_normalization(self.normalization);
        let mut hcm = HttpConnectionManager {
            codec_type: CodecType::Auto as i32,
            stat_prefix: parts.stat_prefix,
            route_specifier: Some(parts.routes),
            http_filters: http_filters(class, parts.authz, parts.protocol),
            normalize_path: Some(BoolValue { value: normalize }),
            merge_slashes,
            path_with_escaped_slashes_action: escaped_slashes as i32,
            use_remote_address: Some(BoolValue {
                value: class == HcmClass::Gateway,
            }),
            upgrade_configs: vec![UpgradeConfig {
                upgrade_type: "websocket".into(),
                ..Default::default()
            }],
            stream_idle_timeout: Some(PbDuration::default()),
            common_http_protocol_options: self.idle_timeout.map(|t| HttpProtocolOptions {
                idle_timeout: Some(t),
                ..Default::default()
            }),
            http_protocol_options: self.http10.then(|| Http1ProtocolOptions {
                accept_http_10: true,
                ..Default::default()
            }),
            proxy_100_continue: true,
            ..Default::default()
        };
        match class {
            HcmClass::SidecarInbound => {
                hcm.server_name = ISTIO_SERVER_NAME.into();
                hcm.forward_client_cert_details = ForwardClientCertDetails::AppendForward as i32;
                hcm.set_current_client_cert_details = Some(SetCurrentClientCertDetails {
                    subject: Some(BoolValue { value: true }),
                    uri: true,
                    dns: true,
                    ..Default::default()
                });
                if parts.protocol.is_http2() {
                    hcm.http2_protocol_options = Some(Http2ProtocolOptions::default());
                }
            }
            HcmClass::SidecarOutbound => {}
            HcmClass::Gateway => {
                hcm.server_name = ISTIO_SERVER_NAME.into();
                hcm.xff_num_trusted_hops = self.topology.num_trusted_proxies;
                hcm.forward_client_cert_details =
                    gateway_forward_client_cert(self.topology.forward_client_cert_details) as i32;
                hcm.set_current_client_cert_details = Some(SetCurrentClientCertDetails {
                    subject: Some(BoolValue { value: true }),
                    cert: true,
                    uri: true,
                    dns: true,
                    ..Default::default()
                });
                hcm.http_protocol_options = Some(Http1ProtocolOptions {
                    accept_http_10: self.http10,
                    ..Default::default()
                });
                // Envoy treats no address as internal unless told: without this the
                // internal headers (x-envoy-*) of mesh clients would be stripped.
                hcm.internal_address_config = self.internal_addresses.clone();
            }
        }
        hcm
    }
}

/// Istio's `MeshNetworksToEnvoyInternalAddressConfig`: every `fromCidr` of meshNetworks
/// (a bare address is a host range), sorted by address (IPv4 first) then length; `None`
/// without any.
fn internal_addresses(networks: &MeshNetworks) -> Option<InternalAddressConfig> {
    use meshfed_api::mesh::v1alpha1::network::network_endpoints::Ne;
    let mut prefixes: Vec<(std::net::IpAddr, u8)> = networks
        .networks
        .values()
        .flat_map(|n| &n.endpoints)
        .filter_map(|e| match &e.ne {
            Some(Ne::FromCidr(cidr)) => crate::mesh::parse_cidr(cidr).or_else(|| {
                let ip: std::net::IpAddr = cidr.parse().ok()?;
                Some((ip, if ip.is_ipv4() { 32 } else { 128 }))
            }),
            _ => None,
        })
        .collect();
    if prefixes.is_empty() {
        return None;
    }
    prefixes.sort_by_key(|(ip, bits)| (ip.is_ipv6(), *ip, *bits));
    prefixes.dedup();
    Some(InternalAddressConfig {
        cidr_ranges: prefixes
            .into_iter()
            .map(|(ip, bits)| CidrRange {
                address_prefix: ip.to_string(),
                prefix_len: Some(UInt32Value {
                    value: u32::from(bits),
                }),
            })
            .collect(),
        ..Default::default()
    })
}

/// Istio's `MeshConfigToEnvoyForwardClientCertDetails` for a gateway: `UNDEFINED` (0)
/// and anything unknown is the gateway default, `SANITIZE_SET`.
fn gateway_forward_client_cert(mesh: u8) -> ForwardClientCertDetails {
    match mesh {
        1 => ForwardClientCertDetails::Sanitize,
        2 => ForwardClientCertDetails::ForwardOnly,
        3 => ForwardClientCertDetails::AppendForward,
        5 => ForwardClientCertDetails::AlwaysForwardOnly,
        _ => ForwardClientCertDetails::SanitizeSet,
    }
}

/// The HTTP filters of a connection manager of `class`, in Istio's order. Telemetry's
/// filters go here: `istio.metadata_exchange` first, `istio.stats` after `cors`.
pub fn http_filters(class: HcmClass, authz: &[HttpFilter], protocol: Protocol) -> Vec<HttpFilter> {
    let mut out = Vec::with_capacity(authz.len() + 6);
    out.extend(authz.iter().cloned());
    if protocol == Protocol::GrpcWeb {
        out.push(STATIC.grpc_web.clone());
    }
    out.push(STATIC.grpc_stats.clone());
    if class != HcmClass::SidecarInbound {
        out.push(STATIC.alpn.clone());
    }
    out.push(STATIC.fault.clone());
    out.push(STATIC.cors.clone());
    out.push(STATIC.router.clone());
    out
}

/// The filters whose config never changes, packed once.
struct StaticFilters {
    grpc_web: HttpFilter,
    grpc_stats: HttpFilter,
    alpn: HttpFilter,
    fault: HttpFilter,
    cors: HttpFilter,
    router: HttpFilter,
}

static STATIC: LazyLock<StaticFilters> = LazyLock::new(|| {
    let typed = |name: &str, any| HttpFilter {
        name: name.into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(any)),
        ..Default::default()
    };
    StaticFilters {
        grpc_web: typed(GRPC_WEB_FILTER, pack(&GrpcWeb::default())),
        grpc_stats: typed(
            GRPC_STATS_FILTER,
            pack(&GrpcStatsConfig {
                emit_filter_state: true,
                per_method_stat_specifier: Some(PerMethodStatSpecifier::StatsForAllMethods(
                    BoolValue { value: false },
                )),
                ..Default::default()
            }),
        ),
        alpn: typed(ALPN_FILTER, pack(&alpn::FilterConfig::istio())),
        fault: typed(FAULT_FILTER, pack(&HttpFault::default())),
        cors: typed(CORS_FILTER, pack(&Cors::default())),
        router: typed(ROUTER_FILTER, pack(&Router::default())),
    }
});

/// Istio's ALPN override filter config (`istio.envoy.config.filter.http.alpn.v2alpha1`),
/// which Envoy's Istio build reads: for each upstream HTTP version, the ALPNs an mTLS
/// upstream connection offers, so that the server sidecar's chains see HTTP
/// (`istio-http/1.1`, `istio-h2`) instead of opaque mTLS (`istio`).
pub mod alpn {
    /// `FilterConfig`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct FilterConfig {
        /// Per upstream protocol.
        #[prost(message, repeated, tag = "1")]
        pub alpn_override: Vec<AlpnOverride>,
    }

    /// `FilterConfig.AlpnOverride`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct AlpnOverride {
        /// `FilterConfig.Protocol`: `HTTP10` 0, `HTTP11` 1, `HTTP2` 2.
        #[prost(int32, tag = "1")]
        pub upstream_protocol: i32,
        /// The ALPNs offered.
        #[prost(string, repeated, tag = "2")]
        pub alpn_override: Vec<String>,
    }

    impl prost::Name for FilterConfig {
        const NAME: &'static str = "FilterConfig";
        const PACKAGE: &'static str = "istio.envoy.config.filter.http.alpn.v2alpha1";
        fn full_name() -> String {
            format!("{}.{}", Self::PACKAGE, Self::NAME)
        }
        fn type_url() -> String {
            format!("type.googleapis.com/{}", Self::full_name())
        }
    }

    impl FilterConfig {
        /// Istio's overrides: `istio-<proto>`, then `istio` (for older servers), then
        /// the plain ALPN (for upstreams outside the mesh).
        pub fn istio() -> FilterConfig {
            let o = |p: i32, alpns: [&str; 3]| AlpnOverride {
                upstream_protocol: p,
                alpn_override: alpns.iter().map(|s| s.to_string()).collect(),
            };
            FilterConfig {
                alpn_override: vec![
                    o(0, ["istio-http/1.0", "istio", "http/1.0"]),
                    o(1, ["istio-http/1.1", "istio", "http/1.1"]),
                    o(2, ["istio-h2", "istio", "h2"]),
                ],
            }
        }
    }
}

#[cfg(test)]
#[path = "hcm_tests.rs"]
mod tests;
