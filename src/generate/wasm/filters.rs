//! The references to WasmPlugins' extension configs in a proxy's listeners: an HTTP
//! filter in each connection manager for HTTP plugins, a network filter in each
//! filter chain for NETWORK plugins, each named by the plugin's ECDS resource name and
//! found over ADS (`config_discovery`, initial fetch timeout 0: the proxy waits for
//! them, since a plugin may be an authentication or authorization filter).
//!
//! Positions, as Istio's `buildHTTPConnectionManager` and network filter builders
//! place them by phase:
//! - HTTP: `istio.metadata_exchange`, the CUSTOM authorization filters (RBAC shadow and
//!   `ext_authz`), **AUTHN**, `jwt_authn`, **AUTHZ**, the RBAC filters, **STATS**,
//!   **UNSPECIFIED_PHASE**, then the rest (`grpc_web`, `grpc_stats`, ..., router).
//! - network: `istio.metadata_exchange`, **AUTHN**, **AUTHZ**, the network RBAC and
//!   `ext_authz` filters, **STATS**, `istio.stats`, **UNSPECIFIED_PHASE**, then the
//!   connection manager or TCP proxy.
//!
//! A plugin's `match` is tested per filter chain: class from the listener (inbound
//! chains of `virtualInbound` and inbound listeners are SERVER; outbound listeners and
//! gateways CLIENT), port from the chain's destination port (inbound) or the
//! listener's port. The catch-all chains of `virtualOutbound` get no plugin (Istio
//! builds them without).

use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::{
    AggregatedConfigSource, ApiVersion, ConfigSource, ExtensionConfigSource, config_source,
};
use envoy_types::pb::envoy::config::listener::v3::{Filter, FilterChain, Listener, filter};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, http_filter,
};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use meshfed_api::extensions::v1alpha1::PluginPhase;
use prost::Message;

use super::{ListenerClass, ListenerInfo, Plugin, of_phase};
use crate::generate::proto::pack;

/// Type URLs an HTTP Wasm reference accepts (Istio's: the Wasm filter, and RBAC, which
/// the agent sends in its place to deny when a module cannot be fetched).
const HTTP_TYPES: [&str; 2] = [
    "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
    "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC",
];
/// Type URLs a network Wasm reference accepts.
const NETWORK_TYPES: [&str; 2] = [
    "type.googleapis.com/envoy.extensions.filters.network.wasm.v3.Wasm",
    "type.googleapis.com/envoy.extensions.filters.network.rbac.v3.RBAC",
];

const HCM: &str = "envoy.filters.network.http_connection_manager";
const TCP_PROXY: &str = "envoy.filters.network.tcp_proxy";
const MX: &str = "istio.metadata_exchange";
const HTTP_EXT_AUTHZ: &str = "envoy.filters.http.ext_authz";
const HTTP_JWT: &str = "envoy.filters.http.jwt_authn";
const HTTP_RBAC: &str = "envoy.filters.http.rbac";
const NET_RBAC: &str = "envoy.filters.network.rbac";
const NET_EXT_AUTHZ: &str = "envoy.filters.network.ext_authz";

fn ads() -> ExtensionConfigSource {
    ExtensionConfigSource {
        config_source: Some(ConfigSource {
            config_source_specifier: Some(config_source::ConfigSourceSpecifier::Ads(
                AggregatedConfigSource::default(),
            )),
            resource_api_version: ApiVersion::V3 as i32,
            initial_fetch_timeout: Some(PbDuration::default()),
            ..Default::default()
        }),
        type_urls: Vec::new(),
        ..Default::default()
    }
}

/// The HTTP filter that references `plugin` (Istio's `toEnvoyHTTPFilter`).
pub fn http_filter(plugin: &Plugin) -> HttpFilter {
    let mut source = ads();
    source.type_urls = HTTP_TYPES.iter().map(|s| s.to_string()).collect();
    HttpFilter {
        name: plugin.resource_name(),
        config_type: Some(http_filter::ConfigType::ConfigDiscovery(source)),
        ..Default::default()
    }
}

/// The network filter that references `plugin` (Istio's `toEnvoyNetworkFilter`).
pub fn network_filter(plugin: &Plugin) -> Filter {
    let mut source = ads();
    source.type_urls = NETWORK_TYPES.iter().map(|s| s.to_string()).collect();
    Filter {
        name: plugin.resource_name(),
        config_type: Some(filter::ConfigType::ConfigDiscovery(source)),
    }
}

fn http_of_phase(
    plugins: &[Arc<Plugin>],
    phase: PluginPhase,
    info: ListenerInfo,
) -> Vec<HttpFilter> {
    of_phase(plugins, phase, false, info)
        .map(|p| http_filter(p))
        .collect()
}

/// Puts the HTTP plugins that take `info` into `filters` at their phases' places.
pub fn insert_http(filters: &mut Vec<HttpFilter>, plugins: &[Arc<Plugin>], info: ListenerInfo) {
    let first_rest = filters
        .iter()
        .position(|f| !matches!(f.name.as_str(), MX | HTTP_EXT_AUTHZ | HTTP_JWT | HTTP_RBAC))
        .unwrap_or(filters.len());
    // The CUSTOM group ends with its ext_authz; metadata exchange comes before it.
    let authn_at = filters[..first_rest]
        .iter()
        .rposition(|f| f.name == HTTP_EXT_AUTHZ)
        .map(|i| i + 1)
        .unwrap_or_else(|| usize::from(filters.first().is_some_and(|f| f.name == MX)));
    let mut authz_at = authn_at;
    while authz_at < first_rest && filters[authz_at].name == HTTP_JWT {
        authz_at += 1;
    }
    let authn = http_of_phase(plugins, PluginPhase::Authn, info);
    let authz = http_of_phase(plugins, PluginPhase::Authz, info);
    let mut tail = http_of_phase(plugins, PluginPhase::Stats, info);
    tail.extend(http_of_phase(plugins, PluginPhase::UnspecifiedPhase, info));
    // Back to front, so earlier positions stay valid.
    filters.splice(first_rest..first_rest, tail);
    filters.splice(authz_at..authz_at, authz);
    filters.splice(authn_at..authn_at, authn);
}

fn network_of_phase(
    plugins: &[Arc<Plugin>],
    phase: PluginPhase,
    info: ListenerInfo,
) -> Vec<Filter> {
    of_phase(plugins, phase, true, info)
        .map(|p| network_filter(p))
        .collect()
}

/// Puts the network plugins that take `info` into a chain's `filters` at their
/// phases' places (see the module doc). Chains without a connection manager or TCP
/// proxy are left alone.
pub fn insert_network(filters: &mut Vec<Filter>, plugins: &[Arc<Plugin>], info: ListenerInfo) {
    let Some(terminal) = filters
        .iter()
        .rposition(|f| f.name == HCM || f.name == TCP_PROXY)
    else {
        return;
    };
    let front = usize::from(filters.first().is_some_and(|f| f.name == MX));
    let authz_end = filters[..terminal]
        .iter()
        .rposition(|f| f.name == NET_RBAC || f.name == NET_EXT_AUTHZ)
        .map_or(front, |i| i + 1);
    let mut head = network_of_phase(plugins, PluginPhase::Authn, info);
    head.extend(network_of_phase(plugins, PluginPhase::Authz, info));
    let stats = network_of_phase(plugins, PluginPhase::Stats, info);
    let last = network_of_phase(plugins, PluginPhase::UnspecifiedPhase, info);
    filters.splice(terminal..terminal, last);
    filters.splice(authz_end..authz_end, stats);
    // `istio.stats` follows the RBAC filters: STATS plugins sit between them.
    filters.splice(front..front, head);
}

/// Adds the references of `plugins` (those selecting the proxy, in order) to every
/// filter chain of `listeners`. Returns whether anything was added.
pub fn apply_to_listeners(
    listeners: &mut [Listener],
    plugins: &[Arc<Plugin>],
    router: bool,
) -> bool {
    if plugins.is_empty() {
        return false;
    }
    let mut changed = false;
    for l in listeners.iter_mut() {
        if l.name == "virtualOutbound" {
            continue;
        }
        let inbound = !router
            && (l.name == "virtualInbound"
                || l.traffic_direction
                    == envoy_types::pb::envoy::config::core::v3::TrafficDirection::Inbound as i32);
        let class = if router {
            ListenerClass::Gateway
        } else if inbound {
            ListenerClass::SidecarInbound
        } else {
            ListenerClass::SidecarOutbound
        };
        let listener_port = listener_port(l);
        let mut chains: Vec<&mut FilterChain> = l.filter_chains.iter_mut().collect();
        if let Some(d) = l.default_filter_chain.as_mut() {
            chains.push(d);
        }
        for chain in chains {
            if chain.name.ends_with("blackhole") {
                continue;
            }
            let port = if inbound {
                chain
                    .filter_chain_match
                    .as_ref()
                    .and_then(|m| m.destination_port)
                    .map_or(0, |p| p.value)
            } else {
                listener_port
            };
            let info = ListenerInfo { class, port };
            let before = chain.filters.len();
            insert_network(&mut chain.filters, plugins, info);
            changed |= chain.filters.len() != before;
            for f in chain.filters.iter_mut().filter(|f| f.name == HCM) {
                let Some(filter::ConfigType::TypedConfig(any)) = &f.config_type else {
                    continue;
                };
                let Ok(mut hcm) = HttpConnectionManager::decode(any.value.as_slice()) else {
                    continue;
                };
                let n = hcm.http_filters.len();
                insert_http(&mut hcm.http_filters, plugins, info);
                if hcm.http_filters.len() != n {
                    changed = true;
                    f.config_type = Some(filter::ConfigType::TypedConfig(pack(&hcm)));
                }
            }
        }
    }
    changed
}

fn listener_port(l: &Listener) -> u32 {
    use envoy_types::pb::envoy::config::core::v3::{address, socket_address};
    l.address
        .as_ref()
        .and_then(|a| match &a.address {
            Some(address::Address::SocketAddress(s)) => match s.port_specifier {
                Some(socket_address::PortSpecifier::PortValue(p)) => Some(p),
                _ => None,
            },
            _ => None,
        })
        .unwrap_or(0)
}
