//! Telemetry of listeners: what Istio puts in connection managers, TCP proxies and
//! listeners for metrics, access logs and traces (`pilot/pkg/model/telemetry.go`,
//! `telemetry_logging.go`, `pilot/pkg/networking/core/accesslog.go`, `tracing.go`,
//! and where `listener_builder.go` places the filters).
//!
//! [`ProxyTelemetry::new`] reads the snapshot's mesh config, Telemetry objects and
//! services (for providers' clusters) and the proxy facts a listener's cache key
//! already holds ([`ClientView`]: namespace, labels, node type, cluster), once per
//! listener set; the listener generators then take, per direction:
//! - [`HttpTelemetry`]: the connection manager's `access_log`, `tracing`,
//!   `request_id_extension`, the `istio.metadata_exchange` HTTP filter (first) and
//!   the `istio.stats` filter (before the router) — [`HttpTelemetry::apply`];
//! - [`TcpTelemetry`]: the TCP proxy's `access_log`, the `istio.stats` network filter
//!   (before the TCP proxy) and, inbound, the `istio.metadata_exchange` network
//!   filter (first);
//! - the listener-level access log ([`ProxyTelemetry::listener_access_log`]).
//!
//! Upstream clusters get [`upstream_metadata_exchange`].

pub mod access_log;
pub mod merge;
pub mod tracing;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::Arc;

use envoy_types::pb::envoy::config::accesslog::v3::AccessLog;
use envoy_types::pb::envoy::config::cluster::v3::Filter as ClusterFilter;
use envoy_types::pb::envoy::config::listener::v3::{Filter, Listener, filter};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, RequestIdExtension, http_connection_manager, http_filter,
};
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::TcpProxy;
use envoy_types::pb::google::protobuf::{Any, ListValue, Struct, Value, value};
use meshfed_api::mesh::v1alpha1::MeshConfig;
use meshfed_api::mesh::v1alpha1::mesh_config::extension_provider::Provider;
use meshfed_api::telemetry::v1alpha1 as tel;
use prost::{Message, Name};

use crate::model::ClientView;
use crate::push::config_index::Config;
use crate::push::snapshot::Snapshot;
pub use merge::ListenerClass;
use merge::{MetricsConfig, Providers};

/// The name of Istio's stats filter (HTTP and network).
pub const STATS_FILTER: &str = "istio.stats";
/// The name of Istio's metadata exchange filters (HTTP, network, upstream).
pub const MX_FILTER: &str = "istio.metadata_exchange";

// === Messages Envoy-types does not carry ===

/// `udpa.type.v1.TypedStruct`: an extension's config as a `Struct` with its type.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TypedStruct {
    /// The config's type URL.
    #[prost(string, tag = "1")]
    pub type_url: String,
    /// The config.
    #[prost(message, optional, tag = "2")]
    pub value: Option<Struct>,
}

impl Name for TypedStruct {
    const NAME: &'static str = "TypedStruct";
    const PACKAGE: &'static str = "udpa.type.v1";
    fn full_name() -> String {
        "udpa.type.v1.TypedStruct".into()
    }
    fn type_url() -> String {
        "type.googleapis.com/udpa.type.v1.TypedStruct".into()
    }
}

/// Istio proxy's `stats.PluginConfig` (the `istio.stats` filter).
#[derive(Clone, PartialEq, prost::Message)]
pub struct StatsPluginConfig {
    /// Do not use the Host header when the destination service is unknown.
    #[prost(bool, tag = "6")]
    pub disable_host_header_fallback: bool,
    /// How often TCP metrics are reported.
    #[prost(message, optional, tag = "7")]
    pub tcp_reporting_duration: Option<envoy_types::pb::google::protobuf::Duration>,
    /// Metric overrides.
    #[prost(message, repeated, tag = "8")]
    pub metrics: Vec<StatsMetricConfig>,
}

/// Istio proxy's `stats.MetricConfig`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StatsMetricConfig {
    /// Tags to add or replace (name -> CEL expression).
    #[prost(btree_map = "string, string", tag = "1")]
    pub dimensions: BTreeMap<String, String>,
    /// The metric.
    #[prost(string, tag = "2")]
    pub name: String,
    /// Tags to remove.
    #[prost(string, repeated, tag = "3")]
    pub tags_to_remove: Vec<String>,
    /// Do not produce the metric.
    #[prost(bool, tag = "5")]
    pub drop: bool,
}

impl Name for StatsPluginConfig {
    const NAME: &'static str = "PluginConfig";
    const PACKAGE: &'static str = "stats";
    fn full_name() -> String {
        "stats.PluginConfig".into()
    }
    fn type_url() -> String {
        "type.googleapis.com/stats.PluginConfig".into()
    }
}

fn any<M: Message + Name>(m: &M) -> Any {
    crate::generate::proto::pack(m)
}

// === Metadata exchange ===

fn list(items: &[&str]) -> Value {
    Value {
        kind: Some(value::Kind::ListValue(ListValue {
            values: items
                .iter()
                .map(|k| Value {
                    kind: Some(value::Kind::StructValue(access_log::stable_struct([(
                        k.to_string(),
                        Value {
                            kind: Some(value::Kind::StructValue(Struct::default())),
                        },
                    )]))),
                })
                .collect(),
        })),
    }
}

fn typed_struct(type_url: &str, fields: Vec<(&str, Value)>) -> Any {
    any(&TypedStruct {
        type_url: type_url.into(),
        value: Some(access_log::stable_struct(
            fields.into_iter().map(|(k, v)| (k.to_string(), v)),
        )),
    })
}

/// The `istio.metadata_exchange` HTTP filter of `class` (Istio's
/// `SidecarInboundMetadataFilter` / `SidecarOutboundMetadataFilter`): peer metadata
/// from Istio headers or workload discovery, propagated to the other side.
pub fn http_metadata_exchange(class: ListenerClass) -> HttpFilter {
    const PEER: &str = "type.googleapis.com/io.istio.http.peer_metadata.Config";
    let discovery = list(&["istio_headers", "workload_discovery"]);
    let propagation = list(&["istio_headers"]);
    let config = match class {
        ListenerClass::SidecarInbound => typed_struct(
            PEER,
            vec![
                ("downstream_discovery", discovery),
                ("downstream_propagation", propagation),
            ],
        ),
        _ => typed_struct(
            PEER,
            vec![
                ("upstream_discovery", discovery),
                ("upstream_propagation", propagation),
            ],
        ),
    };
    HttpFilter {
        name: MX_FILTER.into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(config)),
        ..Default::default()
    }
}

fn tcp_metadata_exchange_config() -> Any {
    typed_struct(
        "type.googleapis.com/envoy.tcp.metadataexchange.config.MetadataExchange",
        vec![
            (
                "enable_discovery",
                Value {
                    kind: Some(value::Kind::BoolValue(true)),
                },
            ),
            (
                "protocol",
                Value {
                    kind: Some(value::Kind::StringValue("istio-peer-exchange".into())),
                },
            ),
        ],
    )
}

/// The `istio.metadata_exchange` network filter Istio puts first on inbound chains
/// (`TCPListenerMx`).
pub fn network_metadata_exchange() -> Filter {
    Filter {
        name: MX_FILTER.into(),
        config_type: Some(filter::ConfigType::TypedConfig(
            tcp_metadata_exchange_config(),
        )),
    }
}

/// The `istio.metadata_exchange` upstream filter of outbound clusters
/// (`TCPClusterMx`).
pub fn upstream_metadata_exchange() -> ClusterFilter {
    ClusterFilter {
        name: MX_FILTER.into(),
        typed_config: Some(tcp_metadata_exchange_config()),
        ..Default::default()
    }
}

// === Stats ===

fn prometheus_name(metric: &str) -> &str {
    match metric {
        "REQUEST_COUNT" => "requests_total",
        "REQUEST_DURATION" => "request_duration_milliseconds",
        "REQUEST_SIZE" => "request_bytes",
        "RESPONSE_SIZE" => "response_bytes",
        "TCP_OPENED_CONNECTIONS" => "tcp_connections_opened_total",
        "TCP_CLOSED_CONNECTIONS" => "tcp_connections_closed_total",
        "TCP_SENT_BYTES" => "tcp_sent_bytes_total",
        "TCP_RECEIVED_BYTES" => "tcp_received_bytes_total",
        "GRPC_REQUEST_MESSAGES" => "request_messages_total",
        "GRPC_RESPONSE_MESSAGES" => "response_messages_total",
        other => other,
    }
}

/// The `istio.stats` config of a prometheus provider for `class`, `None` when its
/// metrics are disabled there (Istio's `generateStatsConfig`).
pub fn stats_config(class: ListenerClass, cfg: &MetricsConfig) -> Option<StatsPluginConfig> {
    let direction = cfg.for_class(class);
    if direction.disabled {
        return None;
    }
    Some(StatsPluginConfig {
        disable_host_header_fallback: matches!(
            class,
            ListenerClass::SidecarInbound | ListenerClass::Gateway
        ),
        tcp_reporting_duration: cfg
            .reporting_interval
            .map(crate::generate::proto::pb_duration),
        metrics: direction
            .overrides
            .iter()
            .map(|o| StatsMetricConfig {
                dimensions: o
                    .tags
                    .iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.clone()?)))
                    .collect(),
                name: prometheus_name(&o.name).to_string(),
                tags_to_remove: o
                    .tags
                    .iter()
                    .filter(|(_, v)| v.is_none())
                    .map(|(k, _)| k.clone())
                    .collect(),
                drop: o.disabled,
            })
            .collect(),
    })
}

// === Per proxy ===

/// What a connection manager gets.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HttpTelemetry {
    /// The `istio.metadata_exchange` filter, first in the chain.
    pub metadata_exchange: Option<HttpFilter>,
    /// The `istio.stats` filters, right before the router.
    pub stats: Vec<HttpFilter>,
    /// The connection manager's `access_log`.
    pub access_log: Vec<AccessLog>,
    /// Its `tracing`.
    pub tracing: Option<http_connection_manager::Tracing>,
    /// Its `request_id_extension`.
    pub request_id_extension: Option<RequestIdExtension>,
}

impl HttpTelemetry {
    /// Sets `hcm`'s access logs, tracing and request id extension, puts the metadata
    /// exchange filter first and the stats filters before the router (the last
    /// filter), as Istio's `buildHTTPConnectionManager` orders them.
    pub fn apply(&self, hcm: &mut HttpConnectionManager) {
        hcm.access_log.extend(self.access_log.iter().cloned());
        hcm.tracing = self.tracing.clone();
        hcm.request_id_extension = self.request_id_extension.clone();
        let router = hcm
            .http_filters
            .iter()
            .rposition(|f| f.name == "envoy.filters.http.router")
            .unwrap_or(hcm.http_filters.len());
        for (i, f) in self.stats.iter().enumerate() {
            hcm.http_filters.insert(router + i, f.clone());
        }
        if let Some(mx) = &self.metadata_exchange {
            hcm.http_filters.insert(0, mx.clone());
        }
    }
}

/// What a TCP chain gets.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TcpTelemetry {
    /// The `istio.metadata_exchange` network filter, first on inbound chains.
    pub metadata_exchange: Option<Filter>,
    /// The `istio.stats` network filters, right before the TCP proxy.
    pub stats: Vec<Filter>,
    /// The TCP proxy's `access_log`.
    pub access_log: Vec<AccessLog>,
}

impl TcpTelemetry {
    /// Adds the access logs to `tcp`.
    pub fn apply(&self, tcp: &mut TcpProxy) {
        tcp.access_log.extend(self.access_log.iter().cloned());
    }
}

/// Everything telemetry gives one proxy's listeners, per direction.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProxyTelemetry {
    http: BTreeMap<ListenerClass, HttpTelemetry>,
    tcp: BTreeMap<ListenerClass, TcpTelemetry>,
    listener: BTreeMap<ListenerClass, Vec<AccessLog>>,
    /// The Telemetry objects that applied (`namespace/name`).
    pub applied: Vec<String>,
}

/// Istio's `LookupCluster`: a provider's `[<namespace>/]<hostname>` and port to the
/// hostname and its outbound cluster, or why there is none.
pub type ClusterLookup<'a> = dyn Fn(&str, u32) -> Result<(String, String), String> + 'a;

/// The snapshot-level inputs telemetry reads.
pub struct MeshInputs<'a> {
    /// The mesh config.
    pub mesh: &'a MeshConfig,
    /// Every Telemetry, in Istio's order (oldest first).
    pub telemetries: &'a [Arc<Config<tel::Telemetry>>],
    /// `[<namespace>/]<hostname>` and port to (hostname, outbound cluster).
    pub lookup: &'a ClusterLookup<'a>,
}

/// The proxy facts telemetry reads (all in a listener's cache key).
pub struct ProxyFacts<'a> {
    /// Config namespace.
    pub namespace: &'a str,
    /// Workload labels.
    pub labels: &'a BTreeMap<String, String>,
    /// Its cluster.
    pub cluster_id: Option<&'a str>,
    /// A gateway.
    pub router: bool,
}

static EMPTY_HTTP: std::sync::LazyLock<HttpTelemetry> = std::sync::LazyLock::new(Default::default);
static EMPTY_TCP: std::sync::LazyLock<TcpTelemetry> = std::sync::LazyLock::new(Default::default);

impl ProxyTelemetry {
    /// The telemetry of `client`'s listeners in `snapshot`.
    pub fn new(snapshot: &Snapshot, client: &ClientView) -> ProxyTelemetry {
        let services = snapshot.services();
        let lookup = |service: &str, port: u32| {
            crate::generate::authz::ext_authz::lookup_cluster(service, port, &|h| {
                services.namespaces_of(h)
            })
        };
        let config = snapshot.config();
        ProxyTelemetry::build(
            &MeshInputs {
                mesh: &snapshot.mesh().config,
                telemetries: config.telemetries(),
                lookup: &lookup,
            },
            &ProxyFacts {
                namespace: &client.namespace,
                labels: &client.labels,
                cluster_id: client.cluster_id.as_ref().map(|c| c.as_str()),
                router: client.is_router(),
            },
        )
    }

    /// The telemetry of a proxy from its facts and the mesh-level inputs.
    pub fn build(inputs: &MeshInputs<'_>, proxy: &ProxyFacts<'_>) -> ProxyTelemetry {
        let mesh = inputs.mesh;
        let providers = Providers::new(mesh);
        let applicable = merge::applicable(
            inputs.telemetries,
            &mesh.root_namespace,
            proxy.namespace,
            proxy.labels,
        );
        let tags = tracing::ProxyTags::new(
            proxy.namespace,
            proxy.labels,
            proxy.cluster_id,
            mesh,
            proxy.router,
        );
        let tracing_cfg = merge::merge_tracing(&applicable.tracing, mesh, &providers);
        let metrics = merge::merge_metrics(&applicable.metrics, mesh);
        let classes: &[ListenerClass] = if proxy.router {
            &[ListenerClass::Gateway]
        } else {
            &[
                ListenerClass::SidecarInbound,
                ListenerClass::SidecarOutbound,
            ]
        };
        let mut out = ProxyTelemetry {
            applied: applicable.from.clone(),
            ..Default::default()
        };
        let default_logging = mesh
            .default_providers
            .as_ref()
            .is_some_and(|d| !d.access_logging.is_empty());
        for &class in classes {
            // Access logs: the Telemetry API when anything there speaks, else the
            // mesh config's legacy settings.
            let telemetry_logs = (!applicable.logging.is_empty() || default_logging).then(|| {
                telemetry_logs(&applicable.logging, mesh, &providers, class, inputs.lookup)
            });
            let with_filter =
                |extra: Option<envoy_types::pb::envoy::config::accesslog::v3::AccessLogFilter>| {
                    move |LogEntry { log, spec, .. }: &LogEntry| {
                        if spec.disabled {
                            return None;
                        }
                        let mut filters = Vec::new();
                        filters.extend(extra.clone());
                        filters.extend(spec.filter.as_ref().map(access_log::cel_filter));
                        let mut log = log.clone();
                        log.filter = access_log::and_filter(filters);
                        Some(log)
                    }
                };
            let (http_logs, tcp_logs, listener_logs) = match &telemetry_logs {
                Some(logs) if !logs.is_empty() => (
                    logs.iter().filter_map(with_filter(None)).collect(),
                    logs.iter().filter_map(with_filter(None)).collect(),
                    if mesh.disable_envoy_listener_log {
                        Vec::new()
                    } else {
                        logs.iter()
                            .filter_map(with_filter(Some(access_log::no_route_filter())))
                            .collect()
                    },
                ),
                _ => legacy_logs(mesh),
            };
            let hcm_tracing =
                tracing::hcm_tracing(tracing_cfg.as_ref(), mesh, class, &tags, inputs.lookup);
            let mut http_stats = Vec::new();
            let mut tcp_stats = Vec::new();
            for (name, cfg) in &metrics {
                let Some(p) = providers.fetch(name) else {
                    continue;
                };
                if !matches!(p.provider, Some(Provider::Prometheus(_))) {
                    continue;
                }
                if let Some(stats) = stats_config(class, cfg) {
                    let config = any(&stats);
                    http_stats.push(HttpFilter {
                        name: STATS_FILTER.into(),
                        config_type: Some(http_filter::ConfigType::TypedConfig(config.clone())),
                        ..Default::default()
                    });
                    tcp_stats.push(Filter {
                        name: STATS_FILTER.into(),
                        config_type: Some(filter::ConfigType::TypedConfig(config)),
                    });
                }
            }
            out.http.insert(
                class,
                HttpTelemetry {
                    metadata_exchange: Some(http_metadata_exchange(class)),
                    stats: http_stats,
                    access_log: http_logs,
                    tracing: hcm_tracing.tracing,
                    request_id_extension: hcm_tracing.request_id_extension,
                },
            );
            out.tcp.insert(
                class,
                TcpTelemetry {
                    metadata_exchange: (class == ListenerClass::SidecarInbound)
                        .then(network_metadata_exchange),
                    stats: tcp_stats,
                    access_log: tcp_logs,
                },
            );
            out.listener.insert(class, listener_logs);
        }
        out
    }

    /// What a `class` connection manager gets.
    pub fn http(&self, class: ListenerClass) -> &HttpTelemetry {
        self.http.get(&class).unwrap_or(&EMPTY_HTTP)
    }

    /// What a `class` TCP chain gets.
    pub fn tcp(&self, class: ListenerClass) -> &TcpTelemetry {
        self.tcp.get(&class).unwrap_or(&EMPTY_TCP)
    }

    /// The listener-level access logs of a `class` listener (connections no chain
    /// took).
    pub fn listener_access_log(&self, class: ListenerClass) -> &[AccessLog] {
        self.listener
            .get(&class)
            .map(Vec::as_slice)
            .unwrap_or_default()
    }
}

/// One access log provider in force for a direction.
#[derive(Clone, Debug, PartialEq)]
pub struct LogEntry {
    /// The provider's name.
    pub name: String,
    /// The log it writes (without the Telemetry filter).
    pub log: AccessLog,
    /// Whether it is disabled and which requests it logs.
    pub spec: merge::LoggingSpec,
}

/// The access log providers the Telemetry API puts in force for `class` (Istio's
/// `Telemetries.AccessLogging`), sorted by provider name; providers that do not
/// exist, write no access log (tracing, metrics, stackdriver) or whose service cannot
/// be found are left out. An empty answer means the legacy mesh settings apply.
pub fn telemetry_logs(
    logging: &[&[tel::AccessLogging]],
    mesh: &MeshConfig,
    providers: &Providers,
    class: ListenerClass,
    lookup: &ClusterLookup<'_>,
) -> Vec<LogEntry> {
    let merged = merge::merge_logs(logging, mesh, class.mode());
    let mut logs = Vec::new();
    for (name, spec) in merged {
        let Some(p) = providers.fetch(&name) else {
            continue;
        };
        let Some(kind) = p.provider.as_ref() else {
            continue;
        };
        if let Some(log) = access_log::provider_log(&p.name, kind, mesh, lookup) {
            logs.push(LogEntry {
                name: p.name.clone(),
                log,
                spec,
            });
        }
    }
    logs.sort_by(|a, b| a.name.cmp(&b.name));
    logs
}

/// The mesh config's legacy access logs: HTTP, TCP and listener-level.
fn legacy_logs(mesh: &MeshConfig) -> (Vec<AccessLog>, Vec<AccessLog>, Vec<AccessLog>) {
    let mut http = Vec::new();
    let mut tcp = Vec::new();
    let mut listener = Vec::new();
    if !mesh.access_log_file.is_empty() {
        let log = access_log::file_log_from_mesh(&mesh.access_log_file, mesh);
        http.push(log.clone());
        tcp.push(log.clone());
        if !mesh.disable_envoy_listener_log {
            let mut l = log;
            l.filter = Some(access_log::no_route_filter());
            listener.push(l);
        }
    }
    if mesh.enable_envoy_access_log_service {
        http.push(access_log::legacy_http_als());
        tcp.push(access_log::legacy_tcp_als(false));
        if !mesh.disable_envoy_listener_log {
            listener.push(access_log::legacy_tcp_als(true));
        }
    }
    (http, tcp, listener)
}

// === Applying it to built listeners ===

const HCM_FILTER: &str = "envoy.filters.network.http_connection_manager";
const TCP_PROXY_FILTER: &str = "envoy.filters.network.tcp_proxy";

fn listener_class(listener: &Listener, router: bool) -> ListenerClass {
    use envoy_types::pb::envoy::config::core::v3::TrafficDirection;
    if router {
        ListenerClass::Gateway
    } else if listener.traffic_direction == TrafficDirection::Inbound as i32 {
        ListenerClass::SidecarInbound
    } else {
        ListenerClass::SidecarOutbound
    }
}

impl ProxyTelemetry {
    /// Puts the telemetry into `listeners` as Istio's listener builder does, per
    /// listener direction (a gateway's are all [`ListenerClass::Gateway`]): every
    /// connection manager gets [`HttpTelemetry::apply`]; every chain ending in a TCP
    /// proxy gets the stats filters before it and its access logs; inbound chains
    /// start with the metadata exchange network filter; every listener gets the
    /// listener-level access logs (Istio's `buildListener` sets them on each).
    pub fn apply_to_listeners(&self, listeners: &mut [Listener], router: bool) {
        for l in listeners.iter_mut() {
            let class = listener_class(l, router);
            let http = self.http(class);
            let tcp = self.tcp(class);
            let chains = l
                .filter_chains
                .iter_mut()
                .chain(l.default_filter_chain.as_mut());
            for chain in chains {
                apply_to_chain(&mut chain.filters, http, tcp);
            }
            l.access_log
                .extend(self.listener_access_log(class).iter().cloned());
        }
    }
}

fn typed(f: &Filter) -> Option<&Any> {
    match &f.config_type {
        Some(filter::ConfigType::TypedConfig(a)) => Some(a),
        _ => None,
    }
}

fn apply_to_chain(filters: &mut Vec<Filter>, http: &HttpTelemetry, tcp: &TcpTelemetry) {
    let mut has_terminal = false;
    let mut i = 0;
    while i < filters.len() {
        let name = filters[i].name.clone();
        if name == HCM_FILTER {
            has_terminal = true;
            if let Some(any) = typed(&filters[i])
                && let Ok(mut hcm) = HttpConnectionManager::decode(any.value.as_slice())
            {
                http.apply(&mut hcm);
                filters[i].config_type = Some(filter::ConfigType::TypedConfig(any_of(&hcm)));
            }
        } else if name == TCP_PROXY_FILTER {
            has_terminal = true;
            if let Some(any) = typed(&filters[i])
                && let Ok(mut proxy) = TcpProxy::decode(any.value.as_slice())
            {
                // Istio logs nothing on the black hole's TCP proxies.
                let black_hole = matches!(
                    &proxy.cluster_specifier,
                    Some(envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::tcp_proxy::ClusterSpecifier::Cluster(c))
                        if c == crate::xds::names::BLACK_HOLE
                );
                if !black_hole {
                    tcp.apply(&mut proxy);
                }
                filters[i].config_type = Some(filter::ConfigType::TypedConfig(any_of(&proxy)));
            }
            for (k, f) in tcp.stats.iter().enumerate() {
                filters.insert(i + k, f.clone());
            }
            i += tcp.stats.len();
        }
        i += 1;
    }
    if has_terminal && let Some(mx) = &tcp.metadata_exchange {
        filters.insert(0, mx.clone());
    }
}

fn any_of<M: Message + Name>(m: &M) -> Any {
    crate::generate::proto::pack(m)
}

/// The Telemetry objects of `snapshot` naming providers its mesh config does not
/// define or that cannot do what they are named for (Istio's analyzer findings), for
/// `/debug/configz`: kind, namespace, name, field and message, sorted.
pub fn provider_findings(snapshot: &Snapshot) -> Vec<serde_json::Value> {
    let mesh = &snapshot.mesh().config;
    let mut out: Vec<serde_json::Value> = snapshot
        .config()
        .telemetries()
        .iter()
        .flat_map(|t| {
            meshfed_registry::config::validate::unknown_providers(&t.spec, mesh)
                .into_iter()
                .map(|(field, message)| {
                    serde_json::json!({
                        "kind": "Telemetry",
                        "namespace": t.namespace,
                        "name": t.name,
                        "field": field,
                        "message": message,
                    })
                })
        })
        .collect();
    out.sort_by_key(|v| v.to_string());
    out
}
