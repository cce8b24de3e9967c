//! The read side of a Consul registry: [`ConsulRegistry`] (what the aggregate and the
//! debug code read, never waiting on the writer) and its counters ([`ConsulStats`]).
//! A registry is started, with its writer task, by `ConsulRegistry::start` in the
//! `writer` module.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use meshfed_registry::metrics::encode_gauges;
use meshfed_registry::{
    ClusterId, Endpoint, ProviderId, Service, ServiceKey, ServiceRegistry, ShardKey,
};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;

use crate::config::ConsulConfig;

/// What readers see: the published services and their endpoints.
pub(crate) use meshfed_registry::catalog::CatalogSnapshot as View;

/// Counters the registry keeps, for metrics, debug output and tests. Monotonic unless
/// named a gauge.
#[derive(Debug, Default)]
pub struct ConsulStats {
    answers: AtomicU64,
    errors: AtomicU64,
    skipped_entries: AtomicU64,
    skipped_services: AtomicU64,
    index_resets: AtomicU64,
    unauthorized: AtomicU64,
    forbidden: AtomicU64,
    watched: AtomicU64,
    last_error: Mutex<Option<String>>,
}

impl ConsulStats {
    /// Successful answers to queries (blocking or not).
    pub fn answers(&self) -> u64 {
        self.answers.load(Ordering::Relaxed)
    }

    /// Failed queries (unreachable, error status, undecodable body); each is retried.
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    /// Health entries skipped because they could not be converted (counted every time
    /// an answer carrying them is applied).
    pub fn skipped_entries(&self) -> u64 {
        self.skipped_entries.load(Ordering::Relaxed)
    }

    /// Catalog services skipped because their name cannot be a hostname label.
    pub fn skipped_services(&self) -> u64 {
        self.skipped_services.load(Ordering::Relaxed)
    }

    /// Times an `X-Consul-Index` went backwards and the watch restarted from 0.
    pub fn index_resets(&self) -> u64 {
        self.index_resets.load(Ordering::Relaxed)
    }

    /// Answers refusing the ACL token: HTTP 401 (no or unknown token) and 403 (a
    /// token without the needed permission, or revoked). Also counted in
    /// [`ConsulStats::errors`].
    pub fn auth_failures(&self) -> (u64, u64) {
        (
            self.unauthorized.load(Ordering::Relaxed),
            self.forbidden.load(Ordering::Relaxed),
        )
    }

    /// Gauge: catalog services watched (one blocking health query each).
    pub fn watched_services(&self) -> u64 {
        self.watched.load(Ordering::Relaxed)
    }

    /// The last query error, if any.
    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().expect("stats poisoned").clone()
    }

    pub(crate) fn count_answer(&self) {
        self.answers.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_error(&self, err: &str) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        *self.last_error.lock().expect("stats poisoned") = Some(err.to_string());
    }

    pub(crate) fn count_denied(&self, status: u16) {
        let counter = if status == 401 {
            &self.unauthorized
        } else {
            &self.forbidden
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_skipped_entries(&self, n: usize) {
        self.skipped_entries.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub(crate) fn count_skipped_service(&self) {
        self.skipped_services.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_index_reset(&self) {
        self.index_resets.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn set_watched(&self, n: usize) {
        self.watched.store(n as u64, Ordering::Relaxed);
    }
}

/// A Consul catalog as a service registry. Cheap synchronous reads of the last view
/// the writer task published; the writer owns every watch and all state.
pub struct ConsulRegistry {
    pub(crate) config: Arc<ConsulConfig>,
    pub(crate) datacenter: String,
    cluster: ClusterId,
    shard: ShardKey,
    pub(crate) view: meshfed_registry::catalog::CatalogView,
    pub(crate) stats: Arc<ConsulStats>,
}

impl fmt::Debug for ConsulRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConsulRegistry")
            .field("shard", &self.shard)
            .field("url", &self.config.url)
            .field("services", &self.view.load().services.len())
            .field("synced", &self.has_synced())
            .field("stale", &self.is_stale())
            .finish()
    }
}

impl ConsulRegistry {
    /// The read side alone for `datacenter`, with nothing published yet (the writer
    /// task feeds it).
    pub(crate) fn new(config: ConsulConfig, datacenter: String) -> ConsulRegistry {
        let cluster = ClusterId::new(&datacenter);
        ConsulRegistry {
            config: Arc::new(config),
            datacenter,
            shard: ShardKey::new(ProviderId::Consul, cluster.clone()),
            cluster,
            view: Default::default(),
            stats: Arc::default(),
        }
    }

    /// The settings the registry runs with.
    pub fn config(&self) -> &ConsulConfig {
        &self.config
    }

    /// The datacenter read (also the cluster id).
    pub fn datacenter(&self) -> &str {
        &self.datacenter
    }

    /// The writer's counters.
    pub fn stats(&self) -> &Arc<ConsulStats> {
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

    /// The key of Consul service `name` in the mesh.
    pub fn key_of(&self, name: &str) -> ServiceKey {
        ServiceKey::new(
            self.config.hostname(name, &self.datacenter),
            self.config.namespace.clone(),
        )
    }

    /// Registers the writer's counters into `registry`, read on every scrape:
    /// `meshfed_consul_requests{result}`, `meshfed_consul_skipped{kind}`,
    /// `meshfed_consul_index_resets{registry="consul"}` and
    /// `meshfed_consul_auth_failures{status="401"|"403"}` (answers refusing the ACL
    /// token; counters exported as gauges that only grow, like the others).
    pub fn register_metrics(&self, registry: &mut Registry) {
        registry.register_collector(Box::new(ConsulMetrics(self.stats.clone())));
    }
}

#[derive(Debug)]
struct ConsulMetrics(Arc<ConsulStats>);

impl Collector for ConsulMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let stats = &self.0;
        encode_gauges(
            &mut encoder,
            "meshfed_consul_requests",
            "Consul HTTP answers and errors (errors back off; the last endpoints stay served)",
            "result",
            [
                ("ok", stats.answers() as i64),
                ("error", stats.errors() as i64),
            ],
        )?;
        encode_gauges(
            &mut encoder,
            "meshfed_consul_skipped",
            "Malformed Consul catalog entries skipped, by kind",
            "kind",
            [
                ("entry", stats.skipped_entries() as i64),
                ("service", stats.skipped_services() as i64),
            ],
        )?;
        encode_gauges(
            &mut encoder,
            "meshfed_consul_index_resets",
            "Blocking-query indexes that went backwards and were reset",
            "registry",
            [("consul", stats.index_resets() as i64)],
        )?;
        let (unauthorized, forbidden) = stats.auth_failures();
        encode_gauges(
            &mut encoder,
            "meshfed_consul_auth_failures",
            "Consul answers refusing the ACL token, by HTTP status (the last view stays served)",
            "status",
            [("401", unauthorized as i64), ("403", forbidden as i64)],
        )
    }
}

impl ServiceRegistry for ConsulRegistry {
    fn provider(&self) -> ProviderId {
        ProviderId::Consul
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

    /// True while the last answer of any watch (the catalog or a service) was an
    /// error: the view is the last one Consul gave.
    fn is_stale(&self) -> bool {
        self.view.is_stale()
    }
}

#[cfg(all(test, feature = "test-support"))]
mod tests {
    use std::time::Duration;

    use meshfed_registry::{EndpointIndex, RegistryEvent, UpdateSink};
    use tokio::sync::oneshot;

    use super::*;
    use crate::fake::{FakeConsul, Instance};

    fn encode(registry: &Registry) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
        text
    }

    #[tokio::test]
    async fn metrics_report_the_writers_counters_under_their_names() {
        let consul = FakeConsul::start().await.unwrap();
        consul.register(Instance::new("web", "web-1", "10.0.0.1", 8080));
        consul.register(Instance::new("bad.name", "x-1", "10.0.3.1", 80));
        let (sink, mut events) = UpdateSink::new(Arc::new(EndpointIndex::new()));
        let config = ConsulConfig {
            // Idle loops stay held by the server: no answer after the sync.
            wait: Duration::from_secs(60),
            ..ConsulConfig::new(consul.url())
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let (consul_registry, task) = ConsulRegistry::start(config, sink, async move {
            let _ = stopped.await;
        })
        .await
        .unwrap();
        let mut registry = Registry::default();
        consul_registry.register_metrics(&mut registry);

        loop {
            let event = tokio::time::timeout(Duration::from_secs(15), events.recv())
                .await
                .expect("timed out waiting for the sync")
                .expect("the sink is open");
            if matches!(event, RegistryEvent::Synced(_)) {
                break;
            }
        }
        // The catalog and web's health answered once each; bad.name cannot be a
        // hostname label, so it was skipped without a query.
        assert_eq!(
            encode(&registry),
            "# HELP meshfed_consul_requests Consul HTTP answers and errors (errors back off; the last endpoints stay served)\n\
             # TYPE meshfed_consul_requests gauge\n\
             meshfed_consul_requests{result=\"ok\"} 2\n\
             meshfed_consul_requests{result=\"error\"} 0\n\
             # HELP meshfed_consul_skipped Malformed Consul catalog entries skipped, by kind\n\
             # TYPE meshfed_consul_skipped gauge\n\
             meshfed_consul_skipped{kind=\"entry\"} 0\n\
             meshfed_consul_skipped{kind=\"service\"} 1\n\
             # HELP meshfed_consul_index_resets Blocking-query indexes that went backwards and were reset\n\
             # TYPE meshfed_consul_index_resets gauge\n\
             meshfed_consul_index_resets{registry=\"consul\"} 0\n\
             # HELP meshfed_consul_auth_failures Consul answers refusing the ACL token, by HTTP status (the last view stays served)\n\
             # TYPE meshfed_consul_auth_failures gauge\n\
             meshfed_consul_auth_failures{status=\"401\"} 0\n\
             meshfed_consul_auth_failures{status=\"403\"} 0\n\
             # EOF\n"
        );
        let _ = stop.send(());
        task.await.unwrap();
    }
}
