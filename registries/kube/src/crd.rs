//! The Istio config store of a Kubernetes cluster: VirtualServices, DestinationRules,
//! Gateways, ServiceEntries, WorkloadEntries and Sidecars (`networking.istio.io`) read
//! from the API server and served through the same [`ConfigStore`] trait as the file
//! store (reference §9.3).
//!
//! [`KubeConfigStore`] is the read handle; [`run_kube_config`] its writer:
//!
//! 1. **Discovery.** `GET /apis/networking.istio.io` (APIGroup) and
//!    `/apis/networking.istio.io/<version>` (APIResourceList) tell which kinds are
//!    served in which versions; each kind is read in its most preferred served version
//!    (v1, then v1beta1, then v1alpha3; they share one schema). A kind the cluster does
//!    not serve (CRD not installed, or the whole group missing) is logged once at warn,
//!    counts as synced with no objects, and is looked for again every
//!    [`KubeConfigStoreConfig::rediscover_every`]; once installed it is watched like the
//!    others. A discovery that fails for another reason (API server unreachable,
//!    forbidden) is retried with backoff, and the store stays not synced meanwhile —
//!    like the Kubernetes registry, it cannot tell "no config" from "unknown config".
//! 2. **Watching.** One kube-runtime watcher per served kind over `DynamicObject`
//!    (list, then watch from the listed resourceVersion; resume after a dropped
//!    connection; relist after `410 Gone`; backoff). A relist replaces the kind as a
//!    whole, so objects deleted while the watch was down disappear.
//! 3. **Conversion.** Every object goes through
//!    [`decode()`](meshfed_registry::config::decode()) and
//!    [`validate()`](meshfed_registry::config::validate()), with the source
//!    `kubernetes:<cluster>/<namespace>/<name>`. The rules every meshfed store keeps
//!    apply: an invalid object is rejected alone (logged at warn once with
//!    namespace, name and field, listed by [`ConfigStore::rejected`], counted in
//!    [`KubeConfigStats`]), and if an earlier version of it was valid, that version
//!    stays in force; a delete removes the object and its rejection.
//! 4. **Namespace filter.** The registry's [`NamespaceFilter`] applies to config too
//!    (Istio's discovery selectors filter config informers as well): objects — and
//!    rejections — of unselected namespaces are held but not published. With label
//!    selectors the store also watches Namespaces, so relabelling a namespace publishes
//!    or withdraws its config at once.
//!
//! Nothing is announced until every kind's initial list is in; then the store reports
//! synced and announces every object at once; from then on each change is announced
//! with exactly the keys whose spec, labels or annotations changed (see
//! [`meshfed_registry::config::store`], which also explains why ServiceEntries and
//! WorkloadEntries move only the change counter).

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::APIGroup;
use kube::api::GetParams;
use meshfed_registry::config::kinds::GROUPS;
use meshfed_registry::config::store::{Objects, Published, StoreCore};
use meshfed_registry::config::{ConfigObject, ConfigStore, Kind, ObjectId, RejectedConfig};
use meshfed_registry::metrics::encode_gauges;
use meshfed_registry::{ClusterId, UpdateSink};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::{KubeRegistryConfig, NamespaceFilter, Result};
use crate::registry::EventType;

mod writer;

pub use writer::run_kube_config;

/// The plural resource name of a kind (its collection's last path segment), as
/// declared in [`meshfed_registry::config::kinds`].
pub fn plural(kind: Kind) -> &'static str {
    kind.plural()
}

/// The position of a kind in per-kind arrays.
fn index(kind: Kind) -> usize {
    kind as usize
}

/// How a Kubernetes config store reads its cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct KubeConfigStoreConfig {
    /// The cluster read (`--clusterID`); part of every object's source.
    pub cluster_id: ClusterId,
    /// Which namespaces' config is published (the registry's filter).
    pub namespaces: NamespaceFilter,
    /// How often kinds the API server did not serve are looked for again (Istio
    /// starts an informer when a CRD appears; default one minute).
    pub rediscover_every: Duration,
}

impl KubeConfigStoreConfig {
    /// Defaults for the cluster `cluster_id`: every namespace, rediscovery every minute.
    pub fn new(cluster_id: impl Into<ClusterId>) -> Self {
        KubeConfigStoreConfig {
            cluster_id: cluster_id.into(),
            namespaces: NamespaceFilter::All,
            rediscover_every: Duration::from_secs(60),
        }
    }

    /// The store's settings matching a registry's (same cluster, same namespaces).
    pub fn for_registry(registry: &KubeRegistryConfig) -> Self {
        KubeConfigStoreConfig {
            namespaces: registry.namespaces.clone(),
            ..KubeConfigStoreConfig::new(registry.cluster_id.clone())
        }
    }

    fn validate(&self) -> Result<()> {
        KubeRegistryConfig {
            namespaces: self.namespaces.clone(),
            ..KubeRegistryConfig::new(self.cluster_id.clone())
        }
        .validate()?;
        if self.rediscover_every.is_zero() {
            return Err(crate::Error::InvalidConfig(
                "config store: rediscovery interval is zero".into(),
            ));
        }
        Ok(())
    }

    /// Whether label selectors decide, so that Namespace labels must be watched (the
    /// Gateway API needs them too: see `Writer::watch_namespaces`).
    fn needs_namespace_labels(&self) -> bool {
        matches!(&self.namespaces, NamespaceFilter::Selectors(s) if !s.is_empty())
    }
}

// === impl KubeConfigStats ===

/// Counters the writer keeps, for metrics and tests. Monotonic unless named a gauge.
#[derive(Debug, Default)]
pub struct KubeConfigStats {
    events: [[AtomicU64; 3]; Kind::ALL.len()],
    rejections: AtomicU64,
    rejected: AtomicU64,
    watch_errors: [AtomicU64; Kind::ALL.len()],
    relists: [AtomicU64; Kind::ALL.len()],
    objects: [AtomicU64; Kind::ALL.len()],
}

impl KubeConfigStats {
    /// Valid objects of `kind` applied with `event` (initial lists included).
    pub fn events(&self, kind: Kind, event: EventType) -> u64 {
        self.events[index(kind)][event as usize].load(Ordering::Relaxed)
    }

    /// Rejections logged: every new invalid object or new reason (a relist seeing the
    /// same problem again does not count).
    pub fn rejections(&self) -> u64 {
        self.rejections.load(Ordering::Relaxed)
    }

    /// Gauge: rejections currently listed by [`ConfigStore::rejected`].
    pub fn rejected(&self) -> u64 {
        self.rejected.load(Ordering::Relaxed)
    }

    /// Errors the `kind` watcher reported (failed list or watch, `410 Gone`, dropped
    /// connection); each is retried with backoff.
    pub fn watch_errors(&self, kind: Kind) -> u64 {
        self.watch_errors[index(kind)].load(Ordering::Relaxed)
    }

    /// Full relists of `kind` after the initial one (after `410 Gone`).
    pub fn relists(&self, kind: Kind) -> u64 {
        self.relists[index(kind)].load(Ordering::Relaxed)
    }

    /// Gauge: published objects of `kind`.
    pub fn objects(&self, kind: Kind) -> u64 {
        self.objects[index(kind)].load(Ordering::Relaxed)
    }
}

// === impl KubeConfigStore ===

#[derive(Debug, Default)]
struct StoreState {
    /// The published objects (valid, in selected namespaces).
    objects: Objects,
    /// The published rejections (in selected namespaces).
    rejected: BTreeMap<ObjectId, RejectedConfig>,
    /// Per kind, the version watched; `None` while not served (or not discovered yet).
    versions: [Option<&'static str>; Kind::ALL.len()],
    /// Namespace labels, once the Namespaces are listed (watched when label selectors
    /// pick the namespaces or the Gateway API is served).
    namespaces: Option<meshfed_registry::config::NamespaceLabels>,
    /// The ConfigMaps the Gateway API objects reference that exist, once the writer
    /// follows them (see [`writer`]).
    config_maps: Option<meshfed_registry::config::ConfigMaps>,
}

impl Published for StoreState {
    fn objects(&self) -> &Objects {
        &self.objects
    }

    fn rejected(&self) -> Vec<RejectedConfig> {
        self.rejected.values().cloned().collect()
    }
}

#[derive(Debug)]
struct Inner {
    config: KubeConfigStoreConfig,
    core: StoreCore<StoreState>,
    stats: KubeConfigStats,
}

/// The read handle of a cluster's Istio config; [`run_kube_config`] is its writer.
/// Reads never wait for the writer. Cheap to clone; clones share one store.
#[derive(Clone)]
pub struct KubeConfigStore {
    inner: Arc<Inner>,
}

impl fmt::Debug for KubeConfigStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.read();
        f.debug_struct("KubeConfigStore")
            .field("cluster", &self.inner.config.cluster_id)
            .field("objects", &state.objects.len())
            .field("rejected", &state.rejected.len())
            .field("synced", &self.has_synced())
            .finish()
    }
}

impl KubeConfigStore {
    /// An empty, unsynced store reporting changes through `sink`. Fails for an invalid
    /// namespace filter.
    pub fn new(config: KubeConfigStoreConfig, sink: UpdateSink) -> Result<KubeConfigStore> {
        config.validate()?;
        Ok(KubeConfigStore {
            inner: Arc::new(Inner {
                config,
                core: StoreCore::new(sink),
                stats: KubeConfigStats::default(),
            }),
        })
    }

    /// A new store fed from the cluster behind `client` by a spawned
    /// [`run_kube_config`], which runs until `shutdown` resolves.
    pub fn start(
        client: kube::Client,
        config: KubeConfigStoreConfig,
        sink: UpdateSink,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(KubeConfigStore, JoinHandle<()>)> {
        let store = KubeConfigStore::new(config, sink)?;
        let task = tokio::spawn(run_kube_config(client, store.clone(), shutdown));
        Ok((store, task))
    }

    /// The settings the store runs with.
    pub fn config(&self) -> &KubeConfigStoreConfig {
        &self.inner.config
    }

    /// The writer's counters.
    pub fn stats(&self) -> &KubeConfigStats {
        &self.inner.stats
    }

    /// The version of `networking.istio.io` that `kind` is read in; `None` when the
    /// API server does not serve the kind (or discovery has not answered yet).
    pub fn served_version(&self, kind: Kind) -> Option<&'static str> {
        self.read().versions[index(kind)]
    }

    /// One published object.
    pub fn get(&self, kind: Kind, namespace: &str, name: &str) -> Option<Arc<ConfigObject>> {
        self.read()
            .objects
            .get(&ObjectId::new(kind, namespace, name))
            .cloned()
    }

    /// Waits until the initial lists are in.
    pub async fn wait_synced(&self) {
        let mut changes = self.inner.core.changes();
        // The sender lives as long as `self`, so this cannot fail.
        let _ = changes.wait_for(|_| self.has_synced()).await;
    }

    /// Registers the writer's counters into `registry`, read on every scrape:
    /// `meshfed_kube_config_objects{kind}`, `meshfed_kube_config_watch_errors{kind}`,
    /// `meshfed_kube_config_relists{kind}` (one row per kind, in [`Kind::ALL`] order)
    /// and `meshfed_kube_config_rejections{registry="kubernetes"}`.
    pub fn register_metrics(&self, registry: &mut Registry) {
        registry.register_collector(Box::new(KubeConfigMetrics(self.clone())));
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, StoreState> {
        self.inner.core.read()
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, StoreState> {
        self.inner.core.write()
    }
}

#[derive(Debug)]
struct KubeConfigMetrics(KubeConfigStore);

impl Collector for KubeConfigMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let stats = self.0.stats();
        let per_kind = |f: fn(&KubeConfigStats, Kind) -> u64| {
            Kind::ALL.map(|kind| (kind.label(), f(stats, kind) as i64))
        };
        encode_gauges(
            &mut encoder,
            "meshfed_kube_config_objects",
            "Valid Istio config objects read from the Kubernetes API server, by kind",
            "kind",
            per_kind(KubeConfigStats::objects),
        )?;
        encode_gauges(
            &mut encoder,
            "meshfed_kube_config_watch_errors",
            "Failed lists and watches of Istio config on the Kubernetes API server (retried with backoff), by kind",
            "kind",
            per_kind(KubeConfigStats::watch_errors),
        )?;
        encode_gauges(
            &mut encoder,
            "meshfed_kube_config_relists",
            "Relists of Istio config after the API server expired a watch (410 Gone), by kind",
            "kind",
            per_kind(KubeConfigStats::relists),
        )?;
        encode_gauges(
            &mut encoder,
            "meshfed_kube_config_rejections",
            "Invalid Istio config objects from the Kubernetes API server logged and rejected",
            "registry",
            [("kubernetes", stats.rejections() as i64)],
        )
    }
}

impl ConfigStore for KubeConfigStore {
    fn list(&self, kind: Kind) -> Vec<Arc<ConfigObject>> {
        self.inner.core.list(kind)
    }

    fn all(&self) -> Vec<Arc<ConfigObject>> {
        self.inner.core.all()
    }

    fn rejected(&self) -> Vec<RejectedConfig> {
        self.inner.core.rejected()
    }

    fn has_synced(&self) -> bool {
        self.inner.core.has_synced()
    }

    fn changes(&self) -> Option<watch::Receiver<u64>> {
        Some(self.inner.core.changes())
    }

    fn namespace_labels(&self) -> Option<meshfed_registry::config::NamespaceLabels> {
        self.read().namespaces.clone()
    }

    fn config_maps(&self) -> Option<meshfed_registry::config::ConfigMaps> {
        self.read().config_maps.clone()
    }
}

// === discovery ===

/// Per kind, the most preferred version the API server serves it in.
type Served = [Option<&'static str>; Kind::ALL.len()];

fn is_not_found(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 404)
}

/// Asks the API server which versions of the Istio config groups serve which kinds. A
/// group or a version that is not there (404) simply serves nothing; any other failure
/// is an error.
async fn discover(client: &kube::Client) -> Result<Served, kube::Error> {
    let mut served = Served::default();
    for group in GROUPS {
        let (group, versions) = (group.name, group.versions);
        let request = kube::core::Request::new("/apis")
            .get(group, &GetParams::default())
            .map_err(kube::Error::BuildRequest)?;
        let api_group: APIGroup = match client.request(request).await {
            Ok(g) => g,
            Err(err) if is_not_found(&err) => continue,
            Err(err) => return Err(err),
        };
        // `versions` is in preference order: the first version listing a kind wins.
        for version in versions {
            if !api_group.versions.iter().any(|v| v.version == *version) {
                continue;
            }
            let resources = match client
                .list_api_group_resources(&format!("{group}/{version}"))
                .await
            {
                Ok(list) => list.resources,
                Err(err) if is_not_found(&err) => continue,
                Err(err) => return Err(err),
            };
            for kind in Kind::ALL.into_iter().filter(|k| k.group() == group) {
                // Exact plural match: subresources (`virtualservices/status`) never match.
                let listed = resources
                    .iter()
                    .any(|r| r.kind == kind.as_str() && r.name == plural(kind));
                if listed && served[index(kind)].is_none() {
                    served[index(kind)] = Some(version);
                }
            }
        }
    }
    Ok(served)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plurals_are_the_crd_names() {
        let names: Vec<&str> = Kind::ALL.into_iter().map(plural).collect();
        assert_eq!(
            names,
            [
                "virtualservices",
                "destinationrules",
                "gateways",
                "serviceentries",
                "workloadentries",
                "sidecars",
                "peerauthentications",
                "requestauthentications",
                "authorizationpolicies",
                "workloadgroups",
                "telemetries",
                "gatewayclasses",
                "gateways",
                "httproutes",
                "grpcroutes",
                "referencegrants",
                "tcproutes",
                "tlsroutes",
                "backendtlspolicies",
                "envoyfilters",
                "wasmplugins"
            ]
        );
        for kind in Kind::ALL {
            assert_eq!(Kind::ALL[index(kind)], kind);
        }
    }
}

#[cfg(all(test, feature = "test-support"))]
mod metrics_tests {
    use std::time::Duration;

    use meshfed_registry::EndpointIndex;
    use serde_json::json;
    use tokio::sync::oneshot;

    use super::*;
    use crate::fake_api::{CustomResource, FakeApiServer, objects};

    #[tokio::test]
    async fn metrics_report_the_stores_counters_under_their_names() {
        let api = FakeApiServer::start().await.unwrap();
        api.install_crds(CustomResource::istio_networking(&["v1"]));
        let route = json!({"hosts": ["reviews"], "http": [{"route": [{"destination": {"host": "reviews"}}]}]});
        api.apply_custom(&objects::istio(
            "v1",
            "VirtualService",
            "default",
            "reviews",
            route,
        ));
        // A bare wildcard host bound to the mesh gateway is invalid: rejected alone.
        let invalid = json!({"hosts": ["*"], "http": [{"route": [{"destination": {"host": "a.example.com"}}]}]});
        api.apply_custom(&objects::istio(
            "v1",
            "VirtualService",
            "default",
            "bad",
            invalid,
        ));
        api.apply_custom(&objects::istio(
            "v1",
            "DestinationRule",
            "default",
            "reviews",
            json!({"host": "reviews"}),
        ));
        let (sink, _events) = UpdateSink::new(Arc::new(EndpointIndex::new()));
        let (stop, stopped) = oneshot::channel::<()>();
        let (store, task) = KubeConfigStore::start(
            api.client(),
            KubeConfigStoreConfig::new("c1"),
            sink,
            async move {
                let _ = stopped.await;
            },
        )
        .unwrap();
        let mut registry = Registry::default();
        store.register_metrics(&mut registry);
        tokio::time::timeout(Duration::from_secs(15), store.wait_synced())
            .await
            .expect("the store syncs");

        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let mut expected = String::new();
        for (name, help, rows) in [
            (
                "meshfed_kube_config_objects",
                "Valid Istio config objects read from the Kubernetes API server, by kind",
                [
                    1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                ],
            ),
            (
                "meshfed_kube_config_watch_errors",
                "Failed lists and watches of Istio config on the Kubernetes API server (retried with backoff), by kind",
                [0; Kind::ALL.len()],
            ),
            (
                "meshfed_kube_config_relists",
                "Relists of Istio config after the API server expired a watch (410 Gone), by kind",
                [0; Kind::ALL.len()],
            ),
        ] {
            expected += &format!("# HELP {name} {help}\n# TYPE {name} gauge\n");
            for (kind, n) in Kind::ALL.iter().zip(rows) {
                expected += &format!("{name}{{kind=\"{}\"}} {n}\n", kind.label());
            }
        }
        expected += "# HELP meshfed_kube_config_rejections Invalid Istio config objects from the Kubernetes API server logged and rejected\n\
                     # TYPE meshfed_kube_config_rejections gauge\n\
                     meshfed_kube_config_rejections{registry=\"kubernetes\"} 1\n\
                     # EOF\n";
        assert_eq!(text, expected);
        let _ = stop.send(());
        task.await.unwrap();
    }
}
