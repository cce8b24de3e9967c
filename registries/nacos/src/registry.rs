//! The read side of a Nacos registry: [`NacosRegistry`] (what the aggregate and the
//! debug code read, never waiting on the writer) and its counters ([`NacosStats`]).
//! A registry is started, with its tasks, by `NacosRegistry::start` (`writer`).

use std::fmt;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use meshfed_registry::metrics::encode_gauges;
use meshfed_registry::{
    ClusterId, Endpoint, ProviderId, Service, ServiceKey, ServiceRegistry, ShardKey,
};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;

use crate::config::NacosConfig;
use crate::convert::PROVIDER;

/// What readers see: the published services and their endpoints.
pub(crate) use meshfed_registry::catalog::CatalogSnapshot as View;

/// The transport in use, for metrics and debugging.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActiveTransport {
    /// Not connected yet, or between attempts.
    None = 0,
    /// Nacos 2.x gRPC with push.
    Grpc = 1,
    /// The 1.x HTTP open API, polled.
    Http = 2,
}

/// Counters the registry keeps, for metrics, debug output and tests. Monotonic unless
/// named a gauge.
#[derive(Debug, Default)]
pub struct NacosStats {
    answers: AtomicU64,
    errors: AtomicU64,
    denied_grpc: AtomicU64,
    denied_http: AtomicU64,
    pushes: AtomicU64,
    skipped_instances: AtomicU64,
    skipped_services: AtomicU64,
    invalid_labels: AtomicU64,
    excluded: AtomicU64,
    services: AtomicU64,
    transport: AtomicU8,
    last_error: Mutex<Option<String>>,
}

impl NacosStats {
    /// Successful answers (gRPC responses, HTTP answers).
    pub fn answers(&self) -> u64 {
        self.answers.load(Ordering::Relaxed)
    }

    /// Failed requests and connections; each is retried.
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    /// Answers refusing the credentials, over gRPC and over HTTP (the login is always
    /// HTTP). Also counted in
    /// [`NacosStats::errors`].
    pub fn auth_failures(&self) -> (u64, u64) {
        (
            self.denied_grpc.load(Ordering::Relaxed),
            self.denied_http.load(Ordering::Relaxed),
        )
    }

    /// Instance pushes received (`NotifySubscriberRequest`).
    pub fn pushes(&self) -> u64 {
        self.pushes.load(Ordering::Relaxed)
    }

    /// Instances skipped because they could not be converted (each time an answer
    /// carrying them is applied).
    pub fn skipped_instances(&self) -> u64 {
        self.skipped_instances.load(Ordering::Relaxed)
    }

    /// Services skipped because their name cannot be a hostname label.
    pub fn skipped_services(&self) -> u64 {
        self.skipped_services.load(Ordering::Relaxed)
    }

    /// Metadata entries left out of labels (each time an answer carrying them is
    /// applied).
    pub fn invalid_labels(&self) -> u64 {
        self.invalid_labels.load(Ordering::Relaxed)
    }

    /// Gauge: instances disabled or of weight 0 in the last answers.
    pub fn excluded_instances(&self) -> u64 {
        self.excluded.load(Ordering::Relaxed)
    }

    /// Gauge: Nacos services followed.
    pub fn services(&self) -> u64 {
        self.services.load(Ordering::Relaxed)
    }

    /// Gauge: the transport in use.
    pub fn transport(&self) -> ActiveTransport {
        match self.transport.load(Ordering::Relaxed) {
            1 => ActiveTransport::Grpc,
            2 => ActiveTransport::Http,
            _ => ActiveTransport::None,
        }
    }

    /// The last error, if any.
    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().expect("stats poisoned").clone()
    }

    pub(crate) fn count_answer(&self) {
        self.answers.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_error(&self, err: &crate::ApiError) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        if let crate::ApiError::Denied { what, .. } = err {
            // HTTP refusals name a path, gRPC ones a request type.
            let counter = if what.starts_with('/') {
                &self.denied_http
            } else {
                &self.denied_grpc
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        *self.last_error.lock().expect("stats poisoned") = Some(err.to_string());
    }

    pub(crate) fn count_push(&self) {
        self.pushes.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_converted(&self, skipped: usize, invalid_labels: usize) {
        self.skipped_instances
            .fetch_add(skipped as u64, Ordering::Relaxed);
        self.invalid_labels
            .fetch_add(invalid_labels as u64, Ordering::Relaxed);
    }

    pub(crate) fn count_skipped_service(&self) {
        self.skipped_services.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn set_excluded(&self, n: usize) {
        self.excluded.store(n as u64, Ordering::Relaxed);
    }

    pub(crate) fn set_services(&self, n: usize) {
        self.services.store(n as u64, Ordering::Relaxed);
    }

    pub(crate) fn set_transport(&self, t: ActiveTransport) {
        self.transport.store(t as u8, Ordering::Relaxed);
    }
}

/// Nacos naming services as a service registry. Cheap synchronous reads of the last
/// view the writer task published; the writer owns the connection and all state.
pub struct NacosRegistry {
    pub(crate) config: Arc<NacosConfig>,
    cluster: ClusterId,
    shard: ShardKey,
    pub(crate) view: meshfed_registry::catalog::CatalogView,
    pub(crate) stats: Arc<NacosStats>,
}

impl fmt::Debug for NacosRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NacosRegistry")
            .field("shard", &self.shard)
            .field("servers", &self.config.servers)
            .field("services", &self.view.load().services.len())
            .field("synced", &self.has_synced())
            .field("stale", &self.is_stale())
            .finish()
    }
}

impl NacosRegistry {
    pub(crate) fn new(config: NacosConfig) -> NacosRegistry {
        let cluster = ClusterId::new(&config.cluster_id);
        NacosRegistry {
            shard: ShardKey::new(PROVIDER, cluster.clone()),
            cluster,
            config: Arc::new(config),
            view: Default::default(),
            stats: Arc::default(),
        }
    }

    /// The settings the registry runs with.
    pub fn config(&self) -> &NacosConfig {
        &self.config
    }

    /// The writer's counters.
    pub fn stats(&self) -> &Arc<NacosStats> {
        &self.stats
    }

    /// One published service.
    pub fn service(&self, key: &ServiceKey) -> Option<Arc<Service>> {
        self.view.service(key)
    }

    /// The published endpoints of a service (kept through outages).
    pub fn endpoints(&self, key: &ServiceKey) -> Vec<Endpoint> {
        self.view.endpoints(key)
    }

    /// The key of Nacos service `name` of `group` in `namespace`.
    pub fn key_of(&self, namespace: &str, group: &str, name: &str) -> ServiceKey {
        ServiceKey::new(
            self.config.hostname(namespace, group, name),
            self.config.mesh_namespace.clone(),
        )
    }

    /// Registers the writer's counters into `registry`, read on every scrape:
    /// `meshfed_nacos_requests{result}`, `meshfed_nacos_auth_failures{transport}`,
    /// `meshfed_nacos_pushes`, `meshfed_nacos_skipped{kind}`,
    /// `meshfed_nacos_excluded_instances`, `meshfed_nacos_services` and
    /// `meshfed_nacos_transport{transport}` (1 for the one in use).
    pub fn register_metrics(&self, registry: &mut Registry) {
        registry.register_collector(Box::new(NacosMetrics(self.stats.clone())));
    }
}

#[derive(Debug)]
struct NacosMetrics(Arc<NacosStats>);

impl Collector for NacosMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let s = &self.0;
        encode_gauges(
            &mut encoder,
            "meshfed_nacos_requests",
            "Nacos answers and failed requests (failures back off; the last endpoints stay served)",
            "result",
            [("ok", s.answers() as i64), ("error", s.errors() as i64)],
        )?;
        let (grpc, http) = s.auth_failures();
        encode_gauges(
            &mut encoder,
            "meshfed_nacos_auth_failures",
            "Nacos answers refusing the credentials, by transport (the last view stays served)",
            "transport",
            [("grpc", grpc as i64), ("http", http as i64)],
        )?;
        encode_gauges(
            &mut encoder,
            "meshfed_nacos_pushes",
            "Instance pushes received from Nacos over gRPC",
            "registry",
            [("nacos", s.pushes() as i64)],
        )?;
        encode_gauges(
            &mut encoder,
            "meshfed_nacos_skipped",
            "Nacos entries not taken, by kind (instance: unconvertible; service: name not a hostname label; label: metadata that is not label text)",
            "kind",
            [
                ("instance", s.skipped_instances() as i64),
                ("service", s.skipped_services() as i64),
                ("label", s.invalid_labels() as i64),
            ],
        )?;
        encode_gauges(
            &mut encoder,
            "meshfed_nacos_excluded_instances",
            "Nacos instances disabled or of weight 0, left out of endpoints",
            "registry",
            [("nacos", s.excluded_instances() as i64)],
        )?;
        encode_gauges(
            &mut encoder,
            "meshfed_nacos_services",
            "Nacos services followed",
            "registry",
            [("nacos", s.services() as i64)],
        )?;
        let t = s.transport();
        encode_gauges(
            &mut encoder,
            "meshfed_nacos_transport",
            "The transport in use to read Nacos (1) and the other (0)",
            "transport",
            [
                ("grpc", i64::from(t == ActiveTransport::Grpc)),
                ("http", i64::from(t == ActiveTransport::Http)),
            ],
        )
    }
}

impl ServiceRegistry for NacosRegistry {
    fn provider(&self) -> ProviderId {
        PROVIDER
    }

    fn cluster_id(&self) -> &ClusterId {
        &self.cluster
    }

    fn shard_key(&self) -> ShardKey {
        self.shard.clone()
    }

    fn services(&self) -> Vec<Arc<Service>> {
        self.view.services()
    }

    fn has_synced(&self) -> bool {
        self.view.has_synced()
    }

    /// True from a failed connection or request until Nacos answers again: the view
    /// is the last one Nacos gave.
    fn is_stale(&self) -> bool {
        self.view.is_stale()
    }
}
