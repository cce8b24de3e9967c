//! The read side of a Eureka registry: [`EurekaRegistry`] (what the aggregate and the
//! debug code read, never waiting on the writer) and its counters ([`EurekaStats`]).
//! A registry is started, with its writer task, by `EurekaRegistry::start` in the
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
use tokio::sync::Notify;

use crate::config::EurekaConfig;
use crate::convert::PROVIDER;

/// What readers see: the published services and their endpoints.
pub(crate) use meshfed_registry::catalog::CatalogSnapshot as View;

/// Why a full fetch was made.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum FullReason {
    /// The first fetch, an empty local copy (Eureka clients fetch those in full), or
    /// the first fetch after a failed one (the delta window may have passed).
    Initial,
    /// The local copy's reconcile hash code differed from the delta's.
    HashMismatch,
    /// The server did not answer the delta with 200 (Eureka answers 403 when
    /// `eureka.disableDelta` is set).
    DeltaRefused,
}

/// Counters the registry keeps, for metrics, debug output and tests. Monotonic unless
/// named a gauge.
#[derive(Debug, Default)]
pub struct EurekaStats {
    rounds: AtomicU64,
    full: [AtomicU64; 3],
    deltas: AtomicU64,
    errors: AtomicU64,
    unauthorized: AtomicU64,
    forbidden: AtomicU64,
    skipped_instances: AtomicU64,
    skipped_apps: AtomicU64,
    invalid_labels: AtomicU64,
    apps: AtomicU64,
    instances: AtomicU64,
    pub(crate) failovers: AtomicU64,
    last_error: Mutex<Option<String>>,
}

impl EurekaStats {
    /// Fetch rounds ended, successful or not.
    pub fn rounds(&self) -> u64 {
        self.rounds.load(Ordering::SeqCst)
    }

    /// Full fetches answered, for `reason`.
    pub fn full_fetches(&self, reason: FullReason) -> u64 {
        self.full[reason as usize].load(Ordering::Relaxed)
    }

    /// Reconcile hash code mismatches (each followed by a full fetch).
    pub fn hash_mismatches(&self) -> u64 {
        self.full_fetches(FullReason::HashMismatch)
    }

    /// Deltas answered and applied.
    pub fn deltas(&self) -> u64 {
        self.deltas.load(Ordering::Relaxed)
    }

    /// Failed fetch rounds (unreachable, error status, undecodable body).
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    /// Rounds that failed with HTTP 401 and 403. Also counted in
    /// [`EurekaStats::errors`].
    pub fn auth_failures(&self) -> (u64, u64) {
        (
            self.unauthorized.load(Ordering::Relaxed),
            self.forbidden.load(Ordering::Relaxed),
        )
    }

    /// Instances skipped (undecodable, or not an endpoint), counted each time an
    /// application carrying them is converted.
    pub fn skipped_instances(&self) -> u64 {
        self.skipped_instances.load(Ordering::Relaxed)
    }

    /// Applications skipped because their name cannot be a hostname label.
    pub fn skipped_apps(&self) -> u64 {
        self.skipped_apps.load(Ordering::Relaxed)
    }

    /// Metadata entries not made labels, counted each time their application is
    /// converted.
    pub fn invalid_labels(&self) -> u64 {
        self.invalid_labels.load(Ordering::Relaxed)
    }

    /// Gauges: applications and instances in the local copy.
    pub fn catalog(&self) -> (u64, u64) {
        (
            self.apps.load(Ordering::Relaxed),
            self.instances.load(Ordering::Relaxed),
        )
    }

    /// Requests that went to another server than the one asked first.
    pub fn failovers(&self) -> u64 {
        self.failovers.load(Ordering::Relaxed)
    }

    /// The last fetch error, if any (never holding a credential).
    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().expect("stats poisoned").clone()
    }

    pub(crate) fn count_round(&self) {
        self.rounds.fetch_add(1, Ordering::SeqCst);
    }

    pub(crate) fn count_full(&self, reason: FullReason) {
        self.full[reason as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_delta(&self) {
        self.deltas.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_error(&self, err: &crate::api::ApiError) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        if let crate::api::ApiError::Denied { status, .. } = err {
            let counter = if *status == 401 {
                &self.unauthorized
            } else {
                &self.forbidden
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        *self.last_error.lock().expect("stats poisoned") = Some(err.to_string());
    }

    pub(crate) fn count_skipped(&self, instances: usize, labels: usize) {
        self.skipped_instances
            .fetch_add(instances as u64, Ordering::Relaxed);
        self.invalid_labels
            .fetch_add(labels as u64, Ordering::Relaxed);
    }

    pub(crate) fn count_skipped_app(&self) {
        self.skipped_apps.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn set_catalog(&self, apps: usize, instances: usize) {
        self.apps.store(apps as u64, Ordering::Relaxed);
        self.instances.store(instances as u64, Ordering::Relaxed);
    }
}

/// A Eureka server's registry as a service registry. Cheap synchronous reads of the
/// last view the writer task published; the writer owns the fetch loop and all state.
pub struct EurekaRegistry {
    pub(crate) config: Arc<EurekaConfig>,
    cluster: ClusterId,
    shard: ShardKey,
    pub(crate) view: meshfed_registry::catalog::CatalogView,
    pub(crate) stats: Arc<EurekaStats>,
    pub(crate) fetch_now: Notify,
}

impl fmt::Debug for EurekaRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EurekaRegistry")
            .field("shard", &self.shard)
            .field("servers", &self.config.server_urls())
            .field("services", &self.view.load().services.len())
            .field("synced", &self.has_synced())
            .field("stale", &self.is_stale())
            .finish()
    }
}

impl EurekaRegistry {
    pub(crate) fn new(config: EurekaConfig) -> EurekaRegistry {
        let cluster = ClusterId::new(&config.cluster_id);
        EurekaRegistry {
            shard: ShardKey::new(PROVIDER, cluster.clone()),
            cluster,
            config: Arc::new(config),
            view: Default::default(),
            stats: Arc::default(),
            fetch_now: Notify::new(),
        }
    }

    /// The settings the registry runs with.
    pub fn config(&self) -> &EurekaConfig {
        &self.config
    }

    /// The writer's counters.
    pub fn stats(&self) -> &Arc<EurekaStats> {
        &self.stats
    }

    /// Asks the writer for a fetch round now instead of at the end of the interval
    /// (or of a retry delay); for tests and operators' tools.
    pub fn fetch_now(&self) {
        self.fetch_now.notify_one();
    }

    /// One published service.
    pub fn service(&self, key: &ServiceKey) -> Option<Arc<Service>> {
        self.view.service(key)
    }

    /// The published endpoints of a service (kept through outages).
    pub fn endpoints(&self, key: &ServiceKey) -> Vec<Endpoint> {
        self.view.endpoints(key)
    }

    /// The key of Eureka application `app` in the mesh.
    pub fn key_of(&self, app: &str) -> ServiceKey {
        ServiceKey::new(self.config.hostname(app), self.config.namespace.clone())
    }

    /// Registers the writer's counters into `registry`, read on every scrape (counters
    /// exported as gauges that only grow, as the Consul registry's):
    /// `meshfed_eureka_fetches{kind}` (`delta`, and full fetches by reason:
    /// `full_initial`, `full_hash_mismatch`, `full_delta_refused`),
    /// `meshfed_eureka_errors{registry}`, `meshfed_eureka_auth_failures{status}`,
    /// `meshfed_eureka_failovers{registry}`, `meshfed_eureka_skipped{kind}`
    /// (`instance`, `application`, `label`) and the gauge
    /// `meshfed_eureka_catalog{kind}` (`applications`, `instances`).
    pub fn register_metrics(&self, registry: &mut Registry) {
        registry.register_collector(Box::new(EurekaMetrics(self.stats.clone())));
    }
}

#[derive(Debug)]
struct EurekaMetrics(Arc<EurekaStats>);

impl Collector for EurekaMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let s = &self.0;
        encode_gauges(
            &mut encoder,
            "meshfed_eureka_fetches",
            "Eureka registry fetches answered: deltas, and full fetches by reason",
            "kind",
            [
                ("delta", s.deltas() as i64),
                ("full_initial", s.full_fetches(FullReason::Initial) as i64),
                ("full_hash_mismatch", s.hash_mismatches() as i64),
                (
                    "full_delta_refused",
                    s.full_fetches(FullReason::DeltaRefused) as i64,
                ),
            ],
        )?;
        encode_gauges(
            &mut encoder,
            "meshfed_eureka_errors",
            "Failed Eureka fetch rounds (retried with backoff; the last view stays served)",
            "registry",
            [("eureka", s.errors() as i64)],
        )?;
        let (unauthorized, forbidden) = s.auth_failures();
        encode_gauges(
            &mut encoder,
            "meshfed_eureka_auth_failures",
            "Eureka fetches refused, by HTTP status (the last view stays served)",
            "status",
            [("401", unauthorized as i64), ("403", forbidden as i64)],
        )?;
        encode_gauges(
            &mut encoder,
            "meshfed_eureka_failovers",
            "Eureka requests sent on to the next server after one failed",
            "registry",
            [("eureka", s.failovers() as i64)],
        )?;
        encode_gauges(
            &mut encoder,
            "meshfed_eureka_skipped",
            "Eureka entries not served: instances, applications, metadata entries that cannot be labels",
            "kind",
            [
                ("instance", s.skipped_instances() as i64),
                ("application", s.skipped_apps() as i64),
                ("label", s.invalid_labels() as i64),
            ],
        )?;
        let (apps, instances) = s.catalog();
        encode_gauges(
            &mut encoder,
            "meshfed_eureka_catalog",
            "Applications and instances in the local copy of the Eureka registry",
            "kind",
            [
                ("applications", apps as i64),
                ("instances", instances as i64),
            ],
        )
    }
}

impl ServiceRegistry for EurekaRegistry {
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

    /// True while the last fetch round failed: the view is the last one Eureka gave.
    fn is_stale(&self) -> bool {
        self.view.is_stale()
    }
}
