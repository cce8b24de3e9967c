//! Remote clusters found through kubeconfig Secrets (reference §3): Istio's secret
//! controller.
//!
//! [`SecretController::start`] watches the Secrets labelled `istio/multiCluster=true` in
//! one namespace of the local cluster. Each data key of such a Secret is a cluster id,
//! its value a kubeconfig for that cluster. For every cluster id a Kubernetes registry
//! ([`KubeRegistry`], shard `Kubernetes/<id>`) joins the aggregate:
//!
//! - **add**: the kubeconfig is checked ([`KubeconfigPolicy`]: no exec plugins, token
//!   files or certificate/key files from disk unless allowed), a client is built, the
//!   registry starts and is added to the aggregate, and a forced full push follows. A
//!   key equal to the local cluster id is ignored, and so is a cluster id another
//!   Secret registered first.
//! - **update** (the kubeconfig text changed): a new registry starts *paused* (it lists
//!   and watches but tells nobody, [`KubeRegistry::start_paused`]) while the old one
//!   keeps serving. Once the new one has listed everything, the old one is stopped
//!   (its writer task has ended before anything else happens), the new one is resumed
//!   (it publishes its view and rewrites the shard, which never went empty), swapped
//!   into the aggregate, the shard's services it no longer has are pruned, and a forced
//!   full push follows. An unusable new kubeconfig leaves the old registry running.
//! - **delete**: the registry stops, leaves the aggregate, and its shard is dropped
//!   with a forced full push (`UpdateSink::registry_removed`).
//!
//! Every cluster has its own task, so a remote cluster that is down (or a new
//! kubeconfig that never syncs) blocks nothing else; its registry keeps its last view
//! and endpoints (marked stale) until it is removed.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use meshfed_registry::metrics::encode_gauges;
use meshfed_registry::{
    Aggregate, ClusterId, NetworkGateway, ProviderId, PushRequest, Service, ServiceRegistry,
    ShardKey, TriggerReason, UpdateSink, WorkloadEntryFeed, WorkloadLookup,
};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;
use serde::Serialize;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tracing::{debug, error, info, warn};

use crate::config::KubeRegistryConfig;
use crate::registry::{EventType, KubeRegistry, SyncPhase};

/// The label that marks a remote-cluster Secret (`istio/multiCluster=true`).
pub const LABEL_MULTICLUSTER: &str = "istio/multiCluster";

mod cluster;
mod kubeconfig;
mod secrets;
#[cfg(all(test, feature = "test-support"))]
mod tests;

use cluster::*;
use secrets::*;

pub use kubeconfig::{
    INSECURE_KUBECONFIG_OPTIONS, KubeconfigError, KubeconfigPolicy, client_from_kubeconfig,
    parse_kubeconfig,
};

/// How the secret controller runs.
#[derive(Clone, Debug)]
pub struct MulticlusterConfig {
    /// The local cluster's id: a Secret key equal to it is ignored.
    pub local_cluster: ClusterId,
    /// Where the Secrets are read (`--clusterRegistriesNamespace`, Istio's system
    /// namespace by default).
    pub namespace: String,
    /// The settings of every remote registry; `cluster_id` is replaced by the Secret
    /// key.
    pub registry: KubeRegistryConfig,
    /// What remote kubeconfigs may use.
    pub policy: KubeconfigPolicy,
    /// A remote registry that has not synced after this long counts as synced (and
    /// stale) so that readiness does not wait forever on a cluster that is down
    /// (Istio's `PILOT_REMOTE_CLUSTER_TIMEOUT`, 30 s).
    pub sync_timeout: Duration,
}

impl MulticlusterConfig {
    /// Istio's defaults: namespace `istio-system`, strict kubeconfigs, 30 s sync
    /// timeout, remote registries configured like `registry`.
    pub fn new(local_cluster: impl Into<ClusterId>, registry: KubeRegistryConfig) -> Self {
        MulticlusterConfig {
            local_cluster: local_cluster.into(),
            namespace: "istio-system".into(),
            registry,
            policy: KubeconfigPolicy::strict(),
            sync_timeout: Duration::from_secs(30),
        }
    }
}

/// The controller's counters, for metrics and tests (Istio's
/// `remote_cluster_secret_events_total{event}`, `istiod_managed_clusters`).
#[derive(Debug, Default)]
pub struct MulticlusterStats {
    secret_events: [AtomicU64; 3],
    clusters: AtomicU64,
    rejected: AtomicU64,
    swaps: AtomicU64,
}

impl MulticlusterStats {
    /// Secret events seen, by type (initial and re-lists count as add / update).
    pub fn secret_events(&self, event: EventType) -> u64 {
        self.secret_events[event as usize].load(Ordering::Relaxed)
    }

    /// Gauge: remote clusters with a registry in the aggregate.
    pub fn clusters(&self) -> u64 {
        self.clusters.load(Ordering::Relaxed)
    }

    /// Kubeconfigs refused (policy, parse errors, client errors).
    pub fn kubeconfig_rejected(&self) -> u64 {
        self.rejected.load(Ordering::Relaxed)
    }

    /// Registries replaced after a kubeconfig change.
    pub fn swaps(&self) -> u64 {
        self.swaps.load(Ordering::Relaxed)
    }

    fn count_event(&self, event: EventType) {
        self.secret_events[event as usize].fetch_add(1, Ordering::Relaxed);
    }

    fn count_rejected(&self) {
        self.rejected.fetch_add(1, Ordering::Relaxed);
    }
}

/// One remote cluster as `/debug/clusterz` would show it.
#[derive(Clone, Debug, Serialize)]
pub struct RemoteClusterStatus {
    /// The cluster id (the Secret key).
    pub cluster: ClusterId,
    /// `namespace/name` of the Secret.
    pub secret: String,
    /// FNV-1a hash of the kubeconfig in force, hex.
    pub kubeconfig_hash: String,
    /// `starting`, `running`, `replacing` or `failed: <why>`.
    pub state: String,
    /// The registry finished its initial sync.
    pub synced: bool,
    /// The registry cannot reach its API server and serves its last view.
    pub stale: bool,
}

struct ClusterEntry {
    status: RemoteClusterStatus,
    registry: Option<Arc<KubeRegistry>>,
    /// The client the running registry reads through, for callers that need the
    /// remote API server too (token reviews for that cluster's workloads).
    client: Option<kube::Client>,
}

impl fmt::Debug for ClusterEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterEntry")
            .field("status", &self.status)
            .field("registry", &self.registry)
            .field("client", &self.client.as_ref().map(|_| "kube::Client"))
            .finish()
    }
}

#[derive(Debug)]
struct MulticlusterMetrics(Arc<SecretController>);

impl Collector for MulticlusterMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let controller = &self.0;
        let stats = controller.stats();
        encode_gauges(
            &mut encoder,
            "istiod_managed_clusters",
            "Clusters managed by this control plane, by type",
            "cluster_type",
            [("local", 1), ("remote", stats.clusters() as i64)],
        )?;
        encode_gauges(
            &mut encoder,
            "remote_cluster_secret_events_total",
            "Remote cluster secret events, by type",
            "event",
            EventType::ALL.map(|event| (event.as_str(), stats.secret_events(event) as i64)),
        )?;
        encode_gauges(
            &mut encoder,
            "istiod_remote_cluster_sync_status",
            "1 once a remote cluster's registry has synced",
            "cluster",
            controller
                .clusters()
                .into_iter()
                .map(|c| (c.cluster.to_string(), i64::from(c.synced))),
        )?;
        encode_gauges(
            &mut encoder,
            "meshfed_kubeconfig_rejected",
            "Remote cluster kubeconfigs refused (untrusted options, parse or client errors)",
            "reason",
            [("any", stats.kubeconfig_rejected() as i64)],
        )
    }
}

/// The running secret controller: its counters and the clusters it manages.
#[derive(Debug)]
pub struct SecretController {
    namespace: String,
    stats: Arc<MulticlusterStats>,
    clusters: Mutex<BTreeMap<ClusterId, ClusterEntry>>,
    listed: std::sync::atomic::AtomicBool,
}

impl SecretController {
    /// Starts watching remote-cluster Secrets through `client` (the local cluster) and
    /// returns the controller and its task, which runs until `shutdown` resolves (then
    /// every remote registry stops; the aggregate is left as it is).
    pub fn start(
        client: kube::Client,
        config: MulticlusterConfig,
        aggregate: Arc<Aggregate>,
        sink: UpdateSink,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> (Arc<SecretController>, JoinHandle<()>) {
        let controller = Arc::new(SecretController {
            namespace: config.namespace.clone(),
            stats: Arc::default(),
            clusters: Mutex::new(BTreeMap::new()),
            listed: Default::default(),
        });
        let task = tokio::spawn(run(
            client,
            config,
            aggregate,
            sink,
            controller.clone(),
            shutdown,
        ));
        (controller, task)
    }

    /// The counters.
    pub fn stats(&self) -> &Arc<MulticlusterStats> {
        &self.stats
    }

    /// The namespace watched.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// True once the Secrets have been listed once.
    pub fn has_synced(&self) -> bool {
        self.listed.load(Ordering::SeqCst)
    }

    /// Every cluster the Secrets name (except ignored ones), sorted by id.
    pub fn clusters(&self) -> Vec<RemoteClusterStatus> {
        self.lock()
            .values()
            .map(|e| {
                let mut s = e.status.clone();
                if let Some(r) = &e.registry {
                    s.synced = r.has_synced();
                    s.stale = r.is_stale();
                }
                s
            })
            .collect()
    }

    /// Registers the controller's metrics into `registry`, read on every scrape:
    /// Istio's `istiod_managed_clusters{cluster_type="local"|"remote"}`,
    /// `remote_cluster_secret_events_total{event}` and
    /// `istiod_remote_cluster_sync_status{cluster}` (one row per cluster the Secrets
    /// name), and `meshfed_kubeconfig_rejected{reason="any"}`.
    pub fn register_metrics(self: &Arc<Self>, registry: &mut Registry) {
        registry.register_collector(Box::new(MulticlusterMetrics(self.clone())));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<ClusterId, ClusterEntry>> {
        self.clusters.lock().expect("secret controller poisoned")
    }

    /// The kube client of the running registry of `cluster` (a remote cluster a
    /// Secret names), or `None` when there is none (unknown cluster, kubeconfig
    /// refused, still starting). After a kubeconfig swap it is the new client.
    pub fn client_for(&self, cluster: &ClusterId) -> Option<kube::Client> {
        let clusters = self.lock();
        let entry = clusters.get(cluster)?;
        entry.registry.as_ref()?;
        entry.client.clone()
    }

    fn set_state(
        &self,
        cluster: &ClusterId,
        state: &str,
        running: Option<(Arc<KubeRegistry>, kube::Client)>,
    ) {
        if let Some(entry) = self.lock().get_mut(cluster) {
            entry.status.state = state.to_string();
            if let Some((registry, client)) = running {
                entry.registry = Some(registry);
                entry.client = Some(client);
            }
        }
    }

    fn set_hash(&self, cluster: &ClusterId, secret: &str, hash: u64) {
        if let Some(entry) = self.lock().get_mut(cluster) {
            entry.status.secret = secret.to_string();
            entry.status.kubeconfig_hash = format!("{hash:016x}");
        }
    }
}

/// A kubeconfig taken from a Secret key, checked.
struct Source {
    secret: String,
    hash: u64,
    kubeconfig: Kubeconfig,
}

/// What a cluster task does after a command.
enum Next {
    /// Wait for the next command.
    Wait,
    /// Handle this command (it interrupted the previous one).
    Handle(Command),
    /// The controller is stopping.
    Stop,
}

enum Command {
    /// Use this kubeconfig (start, or replace the running registry).
    Use(Box<Source>),
    /// The cluster is gone from every Secret.
    Remove,
}

impl fmt::Debug for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Source")
            .field("secret", &self.secret)
            .field("hash", &format_args!("{:016x}", self.hash))
            .finish()
    }
}
