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
    ShardKey, TriggerReason, UpdateSink, WorkloadLookup,
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

/// The kubeconfig options [`KubeconfigPolicy`] refuses unless allowed. Auth providers
/// are allowed by name (`oidc` always is).
pub const INSECURE_KUBECONFIG_OPTIONS: [&str; 5] = [
    "exec",
    "tokenFile",
    "clientCertificate",
    "clientKey",
    "certificateAuthority",
];

/// What a remote kubeconfig may use. Kubeconfigs in Secrets are untrusted input: one
/// that runs a program (an `exec` plugin) or reads files from the control plane's disk
/// (`tokenFile`, `client-certificate`, `client-key`, `certificate-authority` paths), or
/// uses an auth provider other than `oidc`, is refused unless that option is allowed
/// (Istio's `PILOT_INSECURE_MULTICLUSTER_KUBECONFIG_OPTIONS`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KubeconfigPolicy {
    allowed: BTreeSet<String>,
}

impl KubeconfigPolicy {
    /// Nothing insecure allowed (the default).
    pub fn strict() -> Self {
        Self::default()
    }

    /// Allows these options: names from [`INSECURE_KUBECONFIG_OPTIONS`], auth provider
    /// names, or `all`.
    pub fn allowing<S: AsRef<str>>(options: impl IntoIterator<Item = S>) -> Self {
        KubeconfigPolicy {
            allowed: options
                .into_iter()
                .map(|o| o.as_ref().trim().to_string())
                .filter(|o| !o.is_empty())
                .collect(),
        }
    }

    fn allows(&self, option: &str) -> bool {
        self.allowed.contains("all") || self.allowed.contains(option)
    }

    /// Checks every user and cluster of a kubeconfig (not only the current context's,
    /// as Istio does).
    pub fn check(&self, kubeconfig: &Kubeconfig) -> Result<(), KubeconfigError> {
        let refuse = |entry: String, option: &str, detail: String| {
            Err(KubeconfigError::Refused {
                entry,
                option: option.to_string(),
                detail,
            })
        };
        for named in &kubeconfig.auth_infos {
            let Some(user) = &named.auth_info else {
                continue;
            };
            let entry = format!("user {:?}", named.name);
            if let Some(exec) = &user.exec
                && !self.allows("exec")
            {
                let command = exec.command.as_deref().unwrap_or("");
                return refuse(entry, "exec", format!("runs the command {command:?}"));
            }
            if let Some(file) = &user.token_file
                && !self.allows("tokenFile")
            {
                return refuse(entry, "tokenFile", format!("reads the token file {file:?}"));
            }
            if let Some(file) = &user.client_certificate
                && !self.allows("clientCertificate")
            {
                return refuse(
                    entry,
                    "clientCertificate",
                    format!("reads the client certificate file {file:?}"),
                );
            }
            if let Some(file) = &user.client_key
                && !self.allows("clientKey")
            {
                return refuse(
                    entry,
                    "clientKey",
                    format!("reads the client key file {file:?}"),
                );
            }
            if let Some(provider) = &user.auth_provider
                && provider.name != "oidc"
                && !self.allows(&provider.name)
            {
                return refuse(
                    entry,
                    &provider.name,
                    format!("uses the auth provider {:?}", provider.name),
                );
            }
        }
        for named in &kubeconfig.clusters {
            let Some(cluster) = &named.cluster else {
                continue;
            };
            if let Some(file) = &cluster.certificate_authority
                && !self.allows("certificateAuthority")
            {
                return refuse(
                    format!("cluster {:?}", named.name),
                    "certificateAuthority",
                    format!("reads the CA file {file:?}"),
                );
            }
        }
        Ok(())
    }
}

/// Why a remote kubeconfig was not used.
#[derive(Debug, thiserror::Error)]
pub enum KubeconfigError {
    /// Not UTF-8 or not a kubeconfig document.
    #[error("not a valid kubeconfig: {0}")]
    Parse(String),
    /// An option the [`KubeconfigPolicy`] refuses.
    #[error(
        "{entry} {detail}; refused ({option} is not allowed for remote clusters; \
         allow it with --allowInsecureKubeconfig {option})"
    )]
    Refused {
        /// The kubeconfig entry (`user "admin"`, `cluster "c2"`).
        entry: String,
        /// The refused option.
        option: String,
        /// What it would have done.
        detail: String,
    },
    /// The client could not be built from it.
    #[error("building a client from it: {0}")]
    Client(String),
}

/// Parses and checks a kubeconfig from a Secret.
pub fn parse_kubeconfig(
    bytes: &[u8],
    policy: &KubeconfigPolicy,
) -> Result<Kubeconfig, KubeconfigError> {
    let text =
        std::str::from_utf8(bytes).map_err(|_| KubeconfigError::Parse("not UTF-8 text".into()))?;
    let kubeconfig =
        Kubeconfig::from_yaml(text).map_err(|e| KubeconfigError::Parse(e.to_string()))?;
    policy.check(&kubeconfig)?;
    Ok(kubeconfig)
}

/// A client from a checked kubeconfig (its current context).
pub async fn client_from_kubeconfig(
    kubeconfig: Kubeconfig,
) -> Result<kube::Client, KubeconfigError> {
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| KubeconfigError::Client(e.to_string()))?;
    kube::Client::try_from(config).map_err(|e| KubeconfigError::Client(e.to_string()))
}

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

/// A remote registry as the aggregate holds it: the Kubernetes registry, reported as
/// synced (and stale) once the sync timeout has passed without a sync, so that a
/// cluster that is down does not hold readiness forever.
#[derive(Debug)]
struct RemoteRegistry {
    inner: Arc<KubeRegistry>,
    added: Instant,
    sync_timeout: Duration,
}

impl RemoteRegistry {
    fn timed_out(&self) -> bool {
        !self.inner.has_synced() && self.added.elapsed() >= self.sync_timeout
    }
}

impl ServiceRegistry for RemoteRegistry {
    fn provider(&self) -> ProviderId {
        self.inner.provider()
    }

    fn cluster_id(&self) -> &ClusterId {
        self.inner.cluster_id()
    }

    fn shard_key(&self) -> ShardKey {
        self.inner.shard_key()
    }

    fn services(&self) -> Vec<Arc<Service>> {
        self.inner.services()
    }

    fn has_synced(&self) -> bool {
        self.inner.has_synced() || self.timed_out()
    }

    fn is_stale(&self) -> bool {
        self.inner.is_stale() || self.timed_out()
    }

    fn network_gateways(&self) -> Vec<NetworkGateway> {
        self.inner.network_gateways()
    }

    fn workloads(&self) -> Option<Arc<dyn WorkloadLookup>> {
        self.inner.workloads()
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

/// FNV-1a, 64 bit: a stable fingerprint of a kubeconfig for logs and debug output.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The data of a remote-cluster Secret: cluster id -> kubeconfig bytes.
type SecretData = BTreeMap<String, Arc<[u8]>>;

fn secret_data(secret: &Secret) -> SecretData {
    let mut data: SecretData = secret
        .string_data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), Arc::from(v.as_bytes())))
        .collect();
    for (k, v) in secret.data.iter().flatten() {
        data.insert(k.clone(), Arc::from(v.0.as_slice()));
    }
    data
}

/// What the controller loop keeps.
struct State {
    config: MulticlusterConfig,
    aggregate: Arc<Aggregate>,
    sink: UpdateSink,
    controller: Arc<SecretController>,
    shutdown: watch::Receiver<bool>,
    /// Secret name -> its data.
    secrets: BTreeMap<String, SecretData>,
    /// Secrets buffered during a (re)list.
    listing: Option<BTreeMap<String, SecretData>>,
    /// Running clusters: owning Secret, the kubeconfig in force, the cluster's task.
    running: BTreeMap<ClusterId, Running>,
    /// Tasks still removing a cluster.
    removing: BTreeMap<ClusterId, JoinHandle<()>>,
    /// Kubeconfigs refused, so that the same bytes are not refused (and logged) again.
    refused: BTreeMap<ClusterId, u64>,
}

struct Running {
    secret: String,
    bytes: Arc<[u8]>,
    commands: mpsc::UnboundedSender<Command>,
    task: JoinHandle<()>,
}

async fn run(
    client: kube::Client,
    config: MulticlusterConfig,
    aggregate: Arc<Aggregate>,
    sink: UpdateSink,
    controller: Arc<SecretController>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let api: Api<Secret> = Api::namespaced(client, &config.namespace);
    let selector = format!("{LABEL_MULTICLUSTER}=true");
    let mut secrets = watcher::watcher(api, watcher::Config::default().labels(&selector))
        .default_backoff()
        .boxed();
    let (stop_tx, stop_rx) = watch::channel(false);
    info!(namespace = %config.namespace, "remote cluster secrets: watching");
    let mut state = State {
        config,
        aggregate,
        sink,
        controller,
        shutdown: stop_rx,
        secrets: BTreeMap::new(),
        listing: None,
        running: BTreeMap::new(),
        removing: BTreeMap::new(),
        refused: BTreeMap::new(),
    };
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            event = secrets.next() => match event {
                Some(Ok(event)) => state.on_event(event),
                Some(Err(err)) => {
                    warn!(namespace = %state.config.namespace, "remote cluster secrets: watch: {err}");
                }
                None => break,
            },
        }
    }
    // Stop every remote registry; leave the aggregate alone (the server is stopping).
    stop_tx.send_replace(true);
    for (_, running) in std::mem::take(&mut state.running) {
        let _ = running.task.await;
    }
    for (_, task) in std::mem::take(&mut state.removing) {
        let _ = task.await;
    }
    debug!("remote cluster secrets: stopped");
}

impl State {
    fn on_event(&mut self, event: Event<Secret>) {
        match event {
            Event::Init => self.listing = Some(BTreeMap::new()),
            Event::InitApply(secret) => {
                if let Some(name) = secret.metadata.name.clone() {
                    let data = secret_data(&secret);
                    self.listing
                        .get_or_insert_with(BTreeMap::new)
                        .insert(name, data);
                }
            }
            Event::InitDone => {
                let listed = self.listing.take().unwrap_or_default();
                for name in self.secrets.keys() {
                    if !listed.contains_key(name) {
                        self.controller.stats.count_event(EventType::Delete);
                    }
                }
                for (name, data) in &listed {
                    let event = match self.secrets.get(name) {
                        None => EventType::Add,
                        Some(old) if old == data => continue,
                        Some(_) => EventType::Update,
                    };
                    self.controller.stats.count_event(event);
                    info!(secret = %self.secret_name(name), ?event, "remote cluster secret");
                }
                self.secrets = listed;
                self.controller.listed.store(true, Ordering::SeqCst);
                self.reconcile();
            }
            Event::Apply(secret) => {
                let Some(name) = secret.metadata.name.clone() else {
                    return;
                };
                let data = secret_data(&secret);
                let event = match self.secrets.get(&name) {
                    None => EventType::Add,
                    Some(old) if *old == data => return,
                    Some(_) => EventType::Update,
                };
                self.controller.stats.count_event(event);
                info!(secret = %self.secret_name(&name), ?event, "remote cluster secret");
                self.secrets.insert(name, data);
                self.reconcile();
            }
            Event::Delete(secret) => {
                let Some(name) = secret.metadata.name.clone() else {
                    return;
                };
                if self.secrets.remove(&name).is_some() {
                    self.controller.stats.count_event(EventType::Delete);
                    info!(secret = %self.secret_name(&name), "remote cluster secret deleted");
                    self.reconcile();
                }
            }
        }
    }

    fn secret_name(&self, name: &str) -> String {
        format!("{}/{name}", self.config.namespace)
    }

    /// Brings the running clusters in line with the Secrets.
    fn reconcile(&mut self) {
        // Which Secret provides each cluster: the one already providing it while it
        // still lists it, else the first by name (later ones are ignored, as in Istio).
        let mut desired: BTreeMap<ClusterId, (String, Arc<[u8]>)> = BTreeMap::new();
        for (cluster, running) in &self.running {
            if let Some(bytes) = self
                .secrets
                .get(&running.secret)
                .and_then(|d| d.get(cluster.as_str()))
            {
                desired.insert(cluster.clone(), (running.secret.clone(), bytes.clone()));
            }
        }
        for (secret, data) in &self.secrets {
            for (key, bytes) in data {
                let cluster = ClusterId::new(key);
                if key.is_empty() {
                    continue;
                }
                if cluster == self.config.local_cluster {
                    debug!(secret = %self.secret_name(secret), key = %key,
                        "remote cluster secret: key is the local cluster id; ignored");
                    continue;
                }
                match desired.get(&cluster) {
                    Some((owner, _)) if owner != secret => {
                        debug!(secret = %self.secret_name(secret), key = %key,
                            "remote cluster secret: cluster already registered by secret {}; ignored",
                            self.secret_name(owner));
                    }
                    Some(_) => {}
                    None => {
                        desired.insert(cluster, (secret.clone(), bytes.clone()));
                    }
                }
            }
        }

        let gone: Vec<ClusterId> = self
            .running
            .keys()
            .filter(|c| !desired.contains_key(*c))
            .cloned()
            .collect();
        self.removing.retain(|_, task| !task.is_finished());
        for cluster in gone {
            if let Some(running) = self.running.remove(&cluster) {
                info!(cluster = %cluster, secret = %self.secret_name(&running.secret),
                    "remote cluster removed");
                let _ = running.commands.send(Command::Remove);
                // The cluster's task finishes the removal; a later task for the same
                // cluster waits for it (it must not remove the new registry).
                self.removing.insert(cluster, running.task);
            }
        }
        self.refused.retain(|c, _| desired.contains_key(c));
        self.controller
            .lock()
            .retain(|c, _| desired.contains_key(c));

        for (cluster, (secret, bytes)) in desired {
            let name = self.secret_name(&secret);
            if let Some(running) = self.running.get_mut(&cluster)
                && running.bytes == bytes
            {
                if running.secret != secret {
                    // Another Secret now provides the same kubeconfig: nothing to restart.
                    if let Some(entry) = self.controller.lock().get_mut(&cluster) {
                        entry.status.secret = name;
                    }
                    running.secret = secret;
                }
                continue;
            }
            let hash = fnv1a(&bytes);
            if self.refused.get(&cluster) == Some(&hash) {
                continue;
            }
            let source = match parse_kubeconfig(&bytes, &self.config.policy) {
                Ok(kubeconfig) => Source {
                    secret: self.secret_name(&secret),
                    hash,
                    kubeconfig,
                },
                Err(err) => {
                    self.controller.stats.count_rejected();
                    self.refused.insert(cluster.clone(), hash);
                    let keeps = if self.running.contains_key(&cluster) {
                        "; the cluster keeps its previous kubeconfig"
                    } else {
                        ""
                    };
                    error!(secret = %self.secret_name(&secret), key = %cluster,
                        "remote cluster secret {}, key {cluster}: kubeconfig refused: {err}{keeps}",
                        self.secret_name(&secret));
                    if !self.running.contains_key(&cluster) {
                        self.controller
                            .lock()
                            .entry(cluster.clone())
                            .or_insert_with(|| ClusterEntry {
                                status: RemoteClusterStatus {
                                    cluster: cluster.clone(),
                                    secret: self.secret_name(&secret),
                                    kubeconfig_hash: format!("{hash:016x}"),
                                    state: String::new(),
                                    synced: false,
                                    stale: false,
                                },
                                registry: None,
                                client: None,
                            })
                            .status
                            .state = format!("failed: {err}");
                    }
                    continue;
                }
            };
            self.refused.remove(&cluster);
            match self.running.get_mut(&cluster) {
                Some(running) => {
                    info!(cluster = %cluster, secret = %source.secret,
                        hash = %format!("{hash:016x}"), "remote cluster kubeconfig changed");
                    running.secret = secret;
                    running.bytes = bytes;
                    let _ = running.commands.send(Command::Use(Box::new(source)));
                }
                None => {
                    info!(cluster = %cluster, secret = %source.secret,
                        hash = %format!("{hash:016x}"), "remote cluster added");
                    self.controller.lock().insert(
                        cluster.clone(),
                        ClusterEntry {
                            status: RemoteClusterStatus {
                                cluster: cluster.clone(),
                                secret: source.secret.clone(),
                                kubeconfig_hash: format!("{hash:016x}"),
                                state: "starting".into(),
                                synced: false,
                                stale: false,
                            },
                            registry: None,
                            client: None,
                        },
                    );
                    let (tx, rx) = mpsc::unbounded_channel();
                    let _ = tx.send(Command::Use(Box::new(source)));
                    let previous = self.removing.remove(&cluster);
                    let task = ClusterTask {
                        cluster: cluster.clone(),
                        config: self.config.clone(),
                        aggregate: self.aggregate.clone(),
                        sink: self.sink.clone(),
                        controller: self.controller.clone(),
                        current: None,
                    };
                    let shutdown = self.shutdown.clone();
                    let task = tokio::spawn(async move {
                        if let Some(previous) = previous {
                            let _ = previous.await;
                        }
                        task.run(rx, shutdown).await;
                    });
                    self.running.insert(
                        cluster,
                        Running {
                            secret,
                            bytes,
                            commands: tx,
                            task,
                        },
                    );
                }
            }
        }
    }
}

/// A registry this controller started: the handle, its stop switch and its writer.
struct Started {
    registry: Arc<KubeRegistry>,
    /// The client the registry reads through.
    client: kube::Client,
    stop: oneshot::Sender<()>,
    writer: JoinHandle<()>,
}

impl Started {
    /// Stops the writer and waits until it has ended: from then on it writes nothing.
    async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.writer.await;
    }
}

/// One remote cluster's lifecycle, driven by commands from the controller loop.
struct ClusterTask {
    cluster: ClusterId,
    config: MulticlusterConfig,
    aggregate: Arc<Aggregate>,
    sink: UpdateSink,
    controller: Arc<SecretController>,
    current: Option<Started>,
}

impl ClusterTask {
    fn shard(&self) -> ShardKey {
        ShardKey::new(ProviderId::Kubernetes, self.cluster.clone())
    }

    async fn run(
        mut self,
        mut commands: mpsc::UnboundedReceiver<Command>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut pending: Option<Command> = None;
        loop {
            let command = match pending.take() {
                Some(command) => command,
                None => tokio::select! {
                    command = commands.recv() => match command {
                        Some(command) => command,
                        None => break, // the controller stopped
                    },
                    _ = shutdown.wait_for(|s| *s) => break,
                },
            };
            match command {
                Command::Remove => {
                    self.remove().await;
                    return;
                }
                Command::Use(source) => {
                    match self.apply(*source, &mut commands, &mut shutdown).await {
                        Next::Wait => {}
                        Next::Handle(command) => pending = Some(command),
                        Next::Stop => break,
                    }
                }
            }
        }
        if let Some(started) = self.current.take() {
            started.stop().await;
        }
    }

    /// Starts a registry from `source` (paused when one is running, to swap it in
    /// once listed). A command that arrives while the new registry lists abandons the
    /// replacement and is returned to be handled next.
    async fn apply(
        &mut self,
        source: Source,
        commands: &mut mpsc::UnboundedReceiver<Command>,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Next {
        let client = match client_from_kubeconfig(source.kubeconfig.clone()).await {
            Ok(client) => client,
            Err(err) => {
                self.controller.stats.count_rejected();
                error!(secret = %source.secret, key = %self.cluster,
                    "remote cluster secret {}, key {}: kubeconfig refused: {err}",
                    source.secret, self.cluster);
                let state = if self.current.is_some() {
                    "running (new kubeconfig refused)".to_string()
                } else {
                    format!("failed: {err}")
                };
                self.controller.set_state(&self.cluster, &state, None);
                return Next::Wait;
            }
        };
        let registry_config = KubeRegistryConfig {
            cluster_id: self.cluster.clone(),
            ..self.config.registry.clone()
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let stopped = async move {
            let _ = stopped.await;
        };
        let replacing = self.current.is_some();
        let remote_client = client.clone();
        let started = if replacing {
            KubeRegistry::start_paused(client, registry_config, self.sink.clone(), stopped).await
        } else {
            KubeRegistry::start(client, registry_config, self.sink.clone(), stopped).await
        };
        let (registry, writer) = match started {
            Ok(started) => started,
            Err(err) => {
                self.controller.stats.count_rejected();
                error!(cluster = %self.cluster, "remote cluster registry: {err}");
                self.controller
                    .set_state(&self.cluster, &format!("failed: {err}"), None);
                return Next::Wait;
            }
        };
        let started = Started {
            registry: registry.clone(),
            client: remote_client,
            stop,
            writer,
        };
        let Some(old) = self.current.take() else {
            self.add(started, &source);
            return Next::Wait;
        };

        // Replace: the old registry serves until the new one has listed everything.
        self.current = Some(old);
        self.controller.set_state(&self.cluster, "replacing", None);
        let interrupted = tokio::select! {
            () = registry.wait_for(SyncPhase::Listed) => None,
            command = commands.recv() => Some(command.map_or(Next::Stop, Next::Handle)),
            _ = shutdown.wait_for(|s| *s) => Some(Next::Stop),
        };
        if let Some(next) = interrupted {
            // A newer kubeconfig, a removal or shutdown: this replacement is abandoned.
            started.stop().await;
            self.controller.set_state(&self.cluster, "running", None);
            return next;
        }
        if let Some(old) = self.current.take() {
            // From here on the old registry writes nothing to the shard; the shard keeps
            // the old endpoints until the new registry rewrites them.
            old.stop().await;
        }
        registry.resume();
        registry.wait_for(SyncPhase::Synced).await;
        self.aggregate.add_registry(Arc::new(RemoteRegistry {
            inner: registry.clone(),
            added: Instant::now(),
            sync_timeout: self.config.sync_timeout,
        }));
        self.prune(&registry);
        self.controller.stats.swaps.fetch_add(1, Ordering::Relaxed);
        self.controller
            .set_hash(&self.cluster, &source.secret, source.hash);
        self.controller.set_state(
            &self.cluster,
            "running",
            Some((registry, started.client.clone())),
        );
        self.current = Some(started);
        info!(cluster = %self.cluster, secret = %source.secret,
            "remote cluster registry replaced with the new kubeconfig");
        self.sink.push(PushRequest::forced(TriggerReason::Cluster));
        Next::Wait
    }

    fn add(&mut self, started: Started, source: &Source) {
        self.aggregate.add_registry(Arc::new(RemoteRegistry {
            inner: started.registry.clone(),
            added: Instant::now(),
            sync_timeout: self.config.sync_timeout,
        }));
        self.controller
            .stats
            .clusters
            .fetch_add(1, Ordering::Relaxed);
        self.controller
            .set_hash(&self.cluster, &source.secret, source.hash);
        self.controller.set_state(
            &self.cluster,
            "running",
            Some((started.registry.clone(), started.client.clone())),
        );
        self.current = Some(started);
        info!(cluster = %self.cluster, secret = %source.secret, shard = %self.shard(),
            "remote cluster registry started");
        self.sink.push(PushRequest::forced(TriggerReason::Cluster));
    }

    /// Drops the shard's services that the new registry does not have (the old one
    /// wrote them; nobody else will delete them).
    fn prune(&self, registry: &KubeRegistry) {
        let shard = self.shard();
        let mut stale: Vec<_> = self
            .sink
            .endpoint_index()
            .snapshot()
            .into_iter()
            .filter(|(key, shards)| {
                shards.shards.contains_key(&shard) && registry.service(key).is_none()
            })
            .map(|(key, _)| key)
            .collect();
        stale.sort();
        for key in stale {
            debug!(shard = %shard, service = %key, "pruning a service the new registry does not have");
            self.sink.service_deleted(&shard, &key);
        }
    }

    async fn remove(&mut self) {
        let shard = self.shard();
        let had_registry = self.current.is_some();
        if let Some(started) = self.current.take() {
            started.stop().await;
        }
        if had_registry {
            self.aggregate.remove_registry(&shard);
            self.controller
                .stats
                .clusters
                .fetch_sub(1, Ordering::Relaxed);
            self.sink.registry_removed(&shard);
            info!(cluster = %self.cluster, shard = %shard, "remote cluster registry stopped and its shard dropped");
        }
    }
}

impl fmt::Debug for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Source")
            .field("secret", &self.secret)
            .field("hash", &format_args!("{:016x}", self.hash))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kubeconfig(user: &str) -> Kubeconfig {
        Kubeconfig::from_yaml(&format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://remote:6443\n\
             users:\n- name: u\n  user: {user}\ncontexts:\n- name: c\n  context: {{cluster: c, user: u}}\n\
             current-context: c\n"
        ))
        .unwrap()
    }

    #[test]
    fn insecure_kubeconfig_options_are_refused_unless_allowed() {
        let strict = KubeconfigPolicy::strict();
        assert!(strict.check(&kubeconfig("{token: abc}")).is_ok());
        let cases = [
            (
                "{exec: {command: aws, apiVersion: client.authentication.k8s.io/v1}}",
                "exec",
            ),
            ("{tokenFile: /var/run/token}", "tokenFile"),
            ("{client-certificate: /etc/cert.pem}", "clientCertificate"),
            ("{client-key: /etc/key.pem}", "clientKey"),
            ("{auth-provider: {name: gcp}}", "gcp"),
        ];
        for (user, option) in cases {
            let err = strict.check(&kubeconfig(user)).unwrap_err();
            let text = err.to_string();
            assert!(
                text.contains(&format!("--allowInsecureKubeconfig {option}")),
                "{user}: {text}"
            );
            assert!(text.contains("user \"u\""), "{text}");
            assert!(
                KubeconfigPolicy::allowing([option])
                    .check(&kubeconfig(user))
                    .is_ok()
            );
            assert!(
                KubeconfigPolicy::allowing(["all"])
                    .check(&kubeconfig(user))
                    .is_ok()
            );
        }
        assert!(
            strict
                .check(&kubeconfig("{auth-provider: {name: oidc}}"))
                .is_ok(),
            "oidc is always allowed"
        );
        let mut ca = kubeconfig("{}");
        ca.clusters[0]
            .cluster
            .as_mut()
            .unwrap()
            .certificate_authority = Some("/ca.pem".into());
        assert!(
            strict
                .check(&ca)
                .unwrap_err()
                .to_string()
                .contains("cluster \"c\" reads the CA file")
        );
        assert!(matches!(
            parse_kubeconfig(b"clusters: 7", &strict),
            Err(KubeconfigError::Parse(_))
        ));
    }

    #[test]
    fn fingerprints_are_stable() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}

#[cfg(all(test, feature = "test-support"))]
mod controller_tests {
    use std::time::Duration;

    use meshfed_registry::{EndpointIndex, RegistryEvent, ServiceKey};
    use tokio::sync::mpsc::UnboundedReceiver;

    use super::*;
    use crate::fake_api::FakeApiServer;
    use crate::fake_api::objects::{self, types};

    const NS: &str = "istio-system";

    fn remote_cluster(api: &FakeApiServer) {
        api.apply(&objects::service(
            "default",
            "reviews",
            "10.20.0.7",
            &[("http", 80)],
        ));
        api.apply(&objects::pod(
            "default",
            "reviews-c2",
            "reviews",
            "10.2.0.1",
            "n",
        ));
        api.apply(&objects::slice(
            "default",
            "reviews-c2",
            "reviews",
            &[("http", 9080)],
            &[("10.2.0.1", "reviews-c2")],
        ));
    }

    struct Harness {
        local: FakeApiServer,
        aggregate: Arc<Aggregate>,
        index: Arc<EndpointIndex>,
        events: UnboundedReceiver<RegistryEvent>,
        controller: Arc<SecretController>,
        stop: Option<oneshot::Sender<()>>,
        task: JoinHandle<()>,
    }

    async fn start() -> Harness {
        let local = FakeApiServer::start().await.unwrap();
        let aggregate = Arc::new(Aggregate::new("c1"));
        let index = Arc::new(EndpointIndex::new());
        let (sink, events) = UpdateSink::new(index.clone());
        let (stop, stopped) = oneshot::channel::<()>();
        let (controller, task) = SecretController::start(
            local.client(),
            MulticlusterConfig::new("c1", KubeRegistryConfig::default()),
            aggregate.clone(),
            sink,
            async move {
                let _ = stopped.await;
            },
        );
        Harness {
            local,
            aggregate,
            index,
            events,
            controller,
            stop: Some(stop),
            task,
        }
    }

    impl Harness {
        async fn until(&self, what: &str, check: impl Fn(&Harness) -> bool) {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            while !check(self) {
                assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }

        fn shard_endpoints(&self, cluster: &str) -> Vec<String> {
            let key = ServiceKey::new("reviews.default.svc.cluster.local", "default");
            let shard = ShardKey::new(ProviderId::Kubernetes, cluster);
            self.index
                .get(&key)
                .and_then(|s| s.shards.get(&shard).cloned())
                .map(|eps| eps.iter().map(|e| e.address.to_string()).collect())
                .unwrap_or_default()
        }

        fn registered(&self, cluster: &str) -> bool {
            let shard = ShardKey::new(ProviderId::Kubernetes, cluster);
            self.aggregate
                .registries()
                .iter()
                .any(|r| r.shard_key() == shard && r.has_synced())
        }

        fn forced_cluster_pushes(&mut self) -> usize {
            let mut n = 0;
            while let Ok(event) = self.events.try_recv() {
                if let RegistryEvent::Push(r) = event
                    && r.forced
                    && r.reasons.contains_key(&TriggerReason::Cluster)
                {
                    n += 1;
                }
            }
            n
        }

        async fn stop(mut self) {
            let _ = self.stop.take().unwrap().send(());
            self.task.await.unwrap();
        }
    }

    #[tokio::test]
    async fn secrets_add_replace_and_remove_remote_registries() {
        let mut h = start().await;
        let remote = FakeApiServer::start().await.unwrap();
        remote_cluster(&remote);
        h.local.apply(&objects::remote_secret(
            NS,
            "istio-remote-secret-c2",
            &[
                ("c2", &remote.kubeconfig()),
                ("c1", "ignored: the local cluster"),
            ],
        ));
        h.until("c2 registered and synced", |h| h.registered("c2"))
            .await;
        h.until("c2's endpoints in shard Kubernetes/c2", |h| {
            h.shard_endpoints("c2") == ["10.2.0.1"]
        })
        .await;
        assert!(
            !h.registered("c1"),
            "a key equal to the local cluster is ignored"
        );
        assert_eq!(h.controller.stats().clusters(), 1);
        assert_eq!(h.controller.stats().secret_events(EventType::Add), 1);
        assert!(h.forced_cluster_pushes() >= 1);
        let status = h.controller.clusters();
        assert_eq!(status.len(), 1);
        assert_eq!(status[0].secret, "istio-system/istio-remote-secret-c2");
        assert_eq!(status[0].state, "running");

        // Rotated credentials, same server: the new registry replaces the old one.
        h.local.apply(&objects::remote_secret(
            NS,
            "istio-remote-secret-c2",
            &[("c2", &remote.kubeconfig_with_token("rotated"))],
        ));
        h.until("the registry swapped", |h| {
            h.controller.stats().swaps() == 1
        })
        .await;
        assert_eq!(h.shard_endpoints("c2"), ["10.2.0.1"]);
        assert!(h.registered("c2"));
        assert_eq!(h.aggregate.registries().len(), 1);

        // The cluster moves to another server that lacks a service: after the swap the
        // shard no longer holds it (nobody else would delete it).
        let moved = FakeApiServer::start().await.unwrap();
        moved.apply(&objects::service(
            "default",
            "ratings",
            "10.20.0.9",
            &[("http", 80)],
        ));
        h.local.apply(&objects::remote_secret(
            NS,
            "istio-remote-secret-c2",
            &[("c2", &moved.kubeconfig())],
        ));
        h.until("the second swap", |h| h.controller.stats().swaps() == 2)
            .await;
        assert!(
            h.shard_endpoints("c2").is_empty(),
            "reviews pruned from Kubernetes/c2"
        );
        assert!(
            h.index
                .get(&ServiceKey::new(
                    "reviews.default.svc.cluster.local",
                    "default"
                ))
                .is_none()
        );
        let services: Vec<String> = h.aggregate.registries()[0]
            .services()
            .iter()
            .map(|s| s.hostname.to_string())
            .collect();
        assert_eq!(services, ["ratings.default.svc.cluster.local"]);

        h.forced_cluster_pushes();
        h.local
            .delete::<types::Secret>(Some(NS), "istio-remote-secret-c2");
        h.until("c2 removed", |h| h.aggregate.registries().is_empty())
            .await;
        h.until("a forced push for the removal", |h| {
            h.controller.stats().clusters() == 0
        })
        .await;
        let mut pushes = 0;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while pushes == 0 {
            assert!(tokio::time::Instant::now() < deadline, "no forced push");
            pushes += h.forced_cluster_pushes();
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(h.controller.clusters().is_empty());
        h.stop().await;
    }

    /// The names of the Services `client` lists in `default`.
    async fn services_through(client: kube::Client) -> Vec<String> {
        let api: Api<types::Service> = Api::namespaced(client, "default");
        let list = api.list(&Default::default()).await.expect("list services");
        list.items
            .into_iter()
            .filter_map(|s| s.metadata.name)
            .collect()
    }

    #[tokio::test]
    async fn client_for_is_the_running_remote_registrys_client() {
        let h = start().await;
        let c2 = ClusterId::from("c2");
        assert!(h.controller.client_for(&c2).is_none(), "no Secret yet");
        let remote = FakeApiServer::start().await.unwrap();
        remote_cluster(&remote);
        h.local.apply(&objects::remote_secret(
            NS,
            "istio-remote-secret-c2",
            &[("c2", &remote.kubeconfig()), ("c3", "not a kubeconfig")],
        ));
        h.until("c2 registered", |h| h.registered("c2")).await;
        let client = h.controller.client_for(&c2).expect("c2 runs");
        assert_eq!(services_through(client).await, ["reviews"]);
        assert!(
            h.controller.client_for(&ClusterId::from("c3")).is_none(),
            "a refused kubeconfig has no client"
        );
        assert!(
            h.controller.client_for(&ClusterId::from("c1")).is_none(),
            "the local cluster is not a remote one"
        );

        // A new kubeconfig (another server): the client follows the swap.
        let moved = FakeApiServer::start().await.unwrap();
        moved.apply(&objects::service(
            "default",
            "ratings",
            "10.20.0.9",
            &[("http", 80)],
        ));
        h.local.apply(&objects::remote_secret(
            NS,
            "istio-remote-secret-c2",
            &[("c2", &moved.kubeconfig())],
        ));
        h.until("the swap", |h| h.controller.stats().swaps() == 1)
            .await;
        let client = h.controller.client_for(&c2).expect("c2 runs");
        assert_eq!(services_through(client).await, ["ratings"]);

        h.local
            .delete::<types::Secret>(Some(NS), "istio-remote-secret-c2");
        h.until("c2 removed", |h| h.controller.client_for(&c2).is_none())
            .await;
        h.stop().await;
    }

    #[tokio::test]
    async fn a_secret_deleted_and_recreated_at_once_ends_with_the_cluster_registered() {
        let h = start().await;
        let remote = FakeApiServer::start().await.unwrap();
        remote_cluster(&remote);
        let secret = objects::remote_secret(NS, "s", &[("c2", &remote.kubeconfig())]);
        h.local.apply(&secret);
        h.until("c2 synced", |h| h.shard_endpoints("c2") == ["10.2.0.1"])
            .await;
        h.local.delete::<types::Secret>(Some(NS), "s");
        h.local.apply(&secret);
        h.until("c2 registered again", |h| {
            h.controller.stats().secret_events(EventType::Add) == 2 && h.registered("c2")
        })
        .await;
        // The removal finished before the new registry joined, so it removed nothing
        // of the new one's.
        h.until("c2's endpoints back", |h| {
            h.shard_endpoints("c2") == ["10.2.0.1"]
        })
        .await;
        assert_eq!(h.aggregate.registries().len(), 1);
        assert_eq!(h.controller.stats().clusters(), 1);
        h.stop().await;
    }

    fn encode(registry: &Registry) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
        text
    }

    /// The controller's families as `/metrics` shows them.
    fn families(remote: u64, events: [u64; 3], sync: &[(&str, u8)], rejected: u64) -> String {
        let mut text = format!(
            "# HELP istiod_managed_clusters Clusters managed by this control plane, by type\n\
             # TYPE istiod_managed_clusters gauge\n\
             istiod_managed_clusters{{cluster_type=\"local\"}} 1\n\
             istiod_managed_clusters{{cluster_type=\"remote\"}} {remote}\n\
             # HELP remote_cluster_secret_events_total Remote cluster secret events, by type\n\
             # TYPE remote_cluster_secret_events_total gauge\n\
             remote_cluster_secret_events_total{{event=\"add\"}} {}\n\
             remote_cluster_secret_events_total{{event=\"update\"}} {}\n\
             remote_cluster_secret_events_total{{event=\"delete\"}} {}\n\
             # HELP istiod_remote_cluster_sync_status 1 once a remote cluster's registry has synced\n\
             # TYPE istiod_remote_cluster_sync_status gauge\n",
            events[0], events[1], events[2]
        );
        for (cluster, synced) in sync {
            text +=
                &format!("istiod_remote_cluster_sync_status{{cluster=\"{cluster}\"}} {synced}\n");
        }
        text += &format!(
            "# HELP meshfed_kubeconfig_rejected Remote cluster kubeconfigs refused (untrusted options, parse or client errors)\n\
             # TYPE meshfed_kubeconfig_rejected gauge\n\
             meshfed_kubeconfig_rejected{{reason=\"any\"}} {rejected}\n\
             # EOF\n"
        );
        text
    }

    #[tokio::test]
    async fn metrics_report_the_managed_clusters_under_istios_names() {
        let h = start().await;
        let mut registry = Registry::default();
        h.controller.register_metrics(&mut registry);
        // Every family is listed before any Secret; the sync status has no rows yet.
        assert_eq!(encode(&registry), families(0, [0; 3], &[], 0));

        let remote = FakeApiServer::start().await.unwrap();
        remote_cluster(&remote);
        h.local.apply(&objects::remote_secret(
            NS,
            "istio-remote-secret-c3",
            &[("c3", "clusters: 7")],
        ));
        h.local.apply(&objects::remote_secret(
            NS,
            "istio-remote-secret-c2",
            &[("c2", &remote.kubeconfig())],
        ));
        h.until("c2 registered", |h| h.registered("c2")).await;
        // c3's kubeconfig does not parse: named by its Secret, never synced, counted.
        assert_eq!(
            encode(&registry),
            families(1, [2, 0, 0], &[("c2", 1), ("c3", 0)], 1)
        );
        h.stop().await;
    }

    #[tokio::test]
    async fn an_exec_kubeconfig_is_refused_and_others_still_work() {
        let h = start().await;
        let remote = FakeApiServer::start().await.unwrap();
        remote_cluster(&remote);
        let exec = "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://x'}}]\n\
            users: [{name: u, user: {exec: {command: steal-credentials, apiVersion: client.authentication.k8s.io/v1}}}]\n\
            contexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n";
        h.local.apply(&objects::remote_secret(
            NS,
            "istio-remote-secret-c3",
            &[("c3", exec)],
        ));
        h.local.apply(&objects::remote_secret(
            NS,
            "istio-remote-secret-c2",
            &[("c2", &remote.kubeconfig())],
        ));
        h.until("c2 registered", |h| h.registered("c2")).await;
        assert_eq!(h.controller.stats().kubeconfig_rejected(), 1);
        assert_eq!(h.aggregate.registries().len(), 1, "c3 never joined");
        let c3 = h
            .controller
            .clusters()
            .into_iter()
            .find(|c| c.cluster.as_str() == "c3")
            .unwrap();
        assert!(c3.state.contains("steal-credentials"), "{}", c3.state);
        h.stop().await;
    }

    #[tokio::test]
    async fn a_remote_that_is_down_keeps_its_endpoints_and_blocks_nobody() {
        let h = start().await;
        let remote = FakeApiServer::start().await.unwrap();
        remote_cluster(&remote);
        h.local.apply(&objects::remote_secret(
            NS,
            "c2",
            &[("c2", &remote.kubeconfig())],
        ));
        h.until("c2 synced", |h| h.shard_endpoints("c2") == ["10.2.0.1"])
            .await;
        let url = remote.url();
        drop(remote);
        // A second remote is added while c2 is down.
        let other = FakeApiServer::start().await.unwrap();
        remote_cluster(&other);
        h.local.apply(&objects::remote_secret(
            NS,
            "c3",
            &[("c3", &other.kubeconfig())],
        ));
        h.until("c3 synced", |h| h.shard_endpoints("c3") == ["10.2.0.1"])
            .await;
        assert_eq!(
            h.shard_endpoints("c2"),
            ["10.2.0.1"],
            "{url} is down; c2 keeps its endpoints"
        );
        assert!(h.registered("c2"));
        h.stop().await;
    }
}
