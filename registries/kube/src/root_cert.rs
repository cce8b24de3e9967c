//! Root-certificate distribution (reference §1.8, Istio's `NamespaceController`): the
//! ConfigMap `istio-ca-root-cert` (key `root-cert.pem`, label `istio.io/config:
//! "true"`) in every namespace but `kube-public`, `kube-node-lease` and
//! `local-path-storage` (kube-system included), skipping Terminating ones, holding the
//! CA's current root bundle. pilot-agent mounts it to trust istiod.
//!
//! Only the leader writes (the Lease of [`crate::lease`]); every replica watches
//! Namespaces and those ConfigMaps (by field selector) so that a new leader starts
//! from a synced view. What needs a write is decided on that view ([`View`], plain
//! data); the writes themselves re-read the object and create, or replace it only when
//! the value differs, retrying on `AlreadyExists`, `NotFound` and `Conflict`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::PostParams;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::lease::LeaseState;

/// The ConfigMap's name (Istio's `PILOT_CA_CERT_CONFIGMAP` default).
pub const ROOT_CERT_CONFIGMAP: &str = "istio-ca-root-cert";
/// The key holding the root bundle.
pub const ROOT_CERT_KEY: &str = "root-cert.pem";
/// The label Istio puts on it.
pub const CONFIG_LABEL: (&str, &str) = ("istio.io/config", "true");
/// Namespaces that never get it.
pub const EXCLUDED_NAMESPACES: [&str; 3] = ["kube-public", "kube-node-lease", "local-path-storage"];

/// Attempts per namespace and pass (Istio retries 5 times).
const ATTEMPTS: usize = 5;
/// How long after a failed write the namespace is tried again.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// The outcome of one ConfigMap write, the label of
/// `meshfed_root_cert_configmap_writes_total{result}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteResult {
    Created,
    Updated,
    Error,
}

impl WriteResult {
    const ALL: [WriteResult; 3] = [
        WriteResult::Created,
        WriteResult::Updated,
        WriteResult::Error,
    ];

    fn as_str(self) -> &'static str {
        match self {
            WriteResult::Created => "created",
            WriteResult::Updated => "updated",
            WriteResult::Error => "error",
        }
    }
}

/// What the publisher did, for tests and metrics.
#[derive(Debug, Default)]
pub struct RootCertStats {
    created: AtomicU64,
    updated: AtomicU64,
    errors: AtomicU64,
    /// Where failed writes are reported (`/debug/duties`), when set.
    duties: std::sync::OnceLock<Arc<crate::duty::Duties>>,
}

impl RootCertStats {
    /// Reports the publisher's failures and successes to `duties` (the
    /// `root-configmaps` duty); the per-namespace warnings then become one line per
    /// distinct reason.
    pub fn report_to(&self, duties: Arc<crate::duty::Duties>) {
        duties.start(crate::duty::Duty::RootConfigMaps);
        let _ = self.duties.set(duties);
    }

    /// ConfigMaps written with this result.
    pub fn writes(&self, result: WriteResult) -> u64 {
        self.counter(result).load(Ordering::Relaxed)
    }

    fn counter(&self, result: WriteResult) -> &AtomicU64 {
        match result {
            WriteResult::Created => &self.created,
            WriteResult::Updated => &self.updated,
            WriteResult::Error => &self.errors,
        }
    }

    fn count(&self, result: WriteResult) {
        self.counter(result).fetch_add(1, Ordering::Relaxed);
    }

    /// Registers `meshfed_root_cert_configmap_writes_total{result="created"|"updated"|"error"}`
    /// into `registry`, read on every scrape.
    pub fn register_metrics(self: &Arc<Self>, registry: &mut Registry) {
        registry.register_collector(Box::new(RootCertMetrics(self.clone())));
    }
}

#[derive(Debug)]
struct RootCertMetrics(Arc<RootCertStats>);

impl Collector for RootCertMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let mut family = encoder.encode_descriptor(
            "meshfed_root_cert_configmap_writes",
            "Writes of the istio-ca-root-cert ConfigMaps by this replica, by result",
            None,
            MetricType::Counter,
        )?;
        for result in WriteResult::ALL {
            let labels = [("result", result.as_str())];
            ConstCounter::new(self.0.writes(result)).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// The watched state and the namespaces to look at: no IO, so the rules (which
/// namespaces, when a write is due) are tested on plain values.
#[derive(Debug, Default)]
struct View {
    /// Namespace → Terminating.
    namespaces: BTreeMap<String, bool>,
    /// Namespace → the root-cert ConfigMap's value and whether it has the label.
    config_maps: BTreeMap<String, (Option<String>, bool)>,
    /// Relists in progress.
    namespaces_listing: Option<BTreeMap<String, bool>>,
    config_maps_listing: Option<BTreeMap<String, (Option<String>, bool)>>,
    namespaces_synced: bool,
    config_maps_synced: bool,
    /// Namespaces to look at on the next pass.
    dirty: BTreeSet<String>,
}

fn terminating(ns: &Namespace) -> bool {
    ns.metadata.deletion_timestamp.is_some()
        || ns.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Terminating")
}

fn published(cm: &ConfigMap) -> (Option<String>, bool) {
    let value = cm.data.as_ref().and_then(|d| d.get(ROOT_CERT_KEY)).cloned();
    let labelled = cm
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(CONFIG_LABEL.0))
        .is_some_and(|v| v == CONFIG_LABEL.1);
    (value, labelled)
}

/// Applies one watch event to `map` (and the relist buffer), returning the namespace
/// it touched (or `None` while relisting; the relist marks all at its end).
fn apply_event<K, V>(
    map: &mut BTreeMap<String, V>,
    listing: &mut Option<BTreeMap<String, V>>,
    synced: &mut bool,
    event: Event<K>,
    key: impl Fn(&K) -> Option<String>,
    value: impl Fn(&K) -> V,
) -> Option<Vec<String>> {
    match event {
        Event::Init => {
            *listing = Some(BTreeMap::new());
            None
        }
        Event::InitApply(obj) => {
            if let (Some(k), Some(l)) = (key(&obj), listing.as_mut()) {
                l.insert(k, value(&obj));
            }
            None
        }
        Event::InitDone => {
            let fresh = listing.take().unwrap_or_default();
            let mut touched: BTreeSet<String> = map.keys().cloned().collect();
            touched.extend(fresh.keys().cloned());
            *map = fresh;
            *synced = true;
            Some(touched.into_iter().collect())
        }
        Event::Apply(obj) => {
            let k = key(&obj)?;
            map.insert(k.clone(), value(&obj));
            Some(vec![k])
        }
        Event::Delete(obj) => {
            let k = key(&obj)?;
            map.remove(&k);
            Some(vec![k])
        }
    }
}

impl View {
    fn on_namespace(&mut self, event: Event<Namespace>) {
        let touched = apply_event(
            &mut self.namespaces,
            &mut self.namespaces_listing,
            &mut self.namespaces_synced,
            event,
            |ns| ns.metadata.name.clone(),
            terminating,
        );
        self.dirty.extend(touched.into_iter().flatten());
    }

    fn on_config_map(&mut self, event: Event<ConfigMap>) {
        let touched = apply_event(
            &mut self.config_maps,
            &mut self.config_maps_listing,
            &mut self.config_maps_synced,
            event,
            |cm| {
                (cm.metadata.name.as_deref() == Some(ROOT_CERT_CONFIGMAP))
                    .then(|| cm.metadata.namespace.clone())
                    .flatten()
            },
            published,
        );
        self.dirty.extend(touched.into_iter().flatten());
    }

    fn synced(&self) -> bool {
        self.namespaces_synced && self.config_maps_synced
    }

    fn mark_all(&mut self) {
        self.dirty.extend(self.namespaces.keys().cloned());
    }

    /// Whether `namespace` should get (or get a new) ConfigMap with `root`: it exists,
    /// is not excluded nor Terminating, and its ConfigMap is missing, holds another
    /// value or lacks the label.
    fn needs_write(&self, namespace: &str, root: &str) -> bool {
        if EXCLUDED_NAMESPACES.contains(&namespace)
            || self.namespaces.get(namespace) != Some(&false)
        {
            return false;
        }
        match self.config_maps.get(namespace) {
            Some((value, labelled)) => value.as_deref() != Some(root) || !labelled,
            None => true,
        }
    }
}

/// Makes `namespace`'s ConfigMap hold `root`: read it, create it when missing, replace
/// it when its value (or label) differs. `Ok(None)` when nothing had to be written or
/// the namespace is gone.
async fn ensure(
    api: &Api<ConfigMap>,
    namespace: &str,
    root: &str,
) -> kube::Result<Option<WriteResult>> {
    let mut last = None;
    for _ in 0..ATTEMPTS {
        let current = api.get_opt(ROOT_CERT_CONFIGMAP).await?;
        let (result, written) = match current {
            None => {
                let cm = ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(ROOT_CERT_CONFIGMAP.to_string()),
                        namespace: Some(namespace.to_string()),
                        labels: Some(BTreeMap::from([(
                            CONFIG_LABEL.0.to_string(),
                            CONFIG_LABEL.1.to_string(),
                        )])),
                        ..Default::default()
                    },
                    data: Some(BTreeMap::from([(
                        ROOT_CERT_KEY.to_string(),
                        root.to_string(),
                    )])),
                    ..Default::default()
                };
                (
                    WriteResult::Created,
                    api.create(&PostParams::default(), &cm).await,
                )
            }
            Some(mut cm) => {
                if published(&cm) == (Some(root.to_string()), true) {
                    return Ok(None);
                }
                cm.data
                    .get_or_insert_default()
                    .insert(ROOT_CERT_KEY.to_string(), root.to_string());
                cm.metadata
                    .labels
                    .get_or_insert_default()
                    .insert(CONFIG_LABEL.0.to_string(), CONFIG_LABEL.1.to_string());
                (
                    WriteResult::Updated,
                    api.replace(ROOT_CERT_CONFIGMAP, &PostParams::default(), &cm)
                        .await,
                )
            }
        };
        match written {
            Ok(_) => return Ok(Some(result)),
            // Created meanwhile (AlreadyExists), changed meanwhile (Conflict) or
            // deleted meanwhile (NotFound on replace): read again.
            Err(kube::Error::Api(status))
                if status.code == 409 || (status.code == 404 && result == WriteResult::Updated) =>
            {
                debug!(namespace, reason = %status.reason, "root cert ConfigMap changed meanwhile; re-reading");
                last = Some(kube::Error::Api(status));
            }
            // The namespace is gone: nothing to publish to.
            Err(kube::Error::Api(status)) if status.code == 404 => return Ok(None),
            Err(err) => return Err(err),
        }
    }
    Err(last.expect("the loop ran"))
}

/// One pass over the namespaces marked dirty, while this replica leads. Returns the
/// namespaces whose write failed (retried later).
async fn publish(
    client: &kube::Client,
    view: &mut View,
    root: &str,
    leader: &LeaseState,
    stats: &RootCertStats,
) -> BTreeSet<String> {
    let mut failed = BTreeSet::new();
    while let Some(namespace) = view.dirty.pop_first() {
        if !leader.is_leader() {
            // Lost the Lease mid-pass: the new leader reconciles everything.
            view.dirty.insert(namespace);
            break;
        }
        if !view.needs_write(&namespace, root) {
            continue;
        }
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
        match ensure(&api, &namespace, root).await {
            Ok(Some(result)) => {
                stats.count(result);
                debug!(namespace = %namespace, result = result.as_str(), "root cert ConfigMap written");
            }
            Ok(None) => {}
            Err(err) => {
                stats.count(WriteResult::Error);
                if let Some(duties) = stats.duties.get() {
                    duties.failed(
                        crate::duty::Duty::RootConfigMaps,
                        &crate::duty::explain(
                            &err,
                            &format!("writing ConfigMap {namespace}/{ROOT_CERT_CONFIGMAP}"),
                            &namespace,
                        ),
                        RETRY_AFTER,
                    );
                    failed.insert(namespace);
                    continue;
                }
                match &err {
                    kube::Error::Api(status) if status.code == 403 => warn!(
                        namespace = %namespace, reason = %status.message,
                        "root cert ConfigMap: forbidden"
                    ),
                    _ => warn!(namespace = %namespace, "root cert ConfigMap: {err}"),
                }
                failed.insert(namespace);
            }
        }
    }
    if failed.is_empty()
        && view.dirty.is_empty()
        && let Some(duties) = stats.duties.get()
    {
        duties.done(crate::duty::Duty::RootConfigMaps);
    }
    failed
}

/// Publishes `root` (the CA's root bundle; nothing is written while it is empty) to
/// every namespace's `istio-ca-root-cert` ConfigMap until `shutdown`, writing only
/// while `leader` says this replica holds the Lease. Becoming leader or a new root
/// rewrites every namespace that needs it; a namespace added, or a ConfigMap deleted
/// or edited, is fixed as its watch event arrives. Failed writes are retried after a
/// second.
pub async fn run_root_cert_publisher(
    client: kube::Client,
    leader: Arc<LeaseState>,
    mut root: watch::Receiver<String>,
    stats: Arc<RootCertStats>,
    shutdown: impl Future<Output = ()>,
) {
    let fields = format!("metadata.name={ROOT_CERT_CONFIGMAP}");
    let mut namespaces = watcher::watcher(
        Api::<Namespace>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .boxed();
    let mut config_maps = watcher::watcher(
        Api::<ConfigMap>::all(client.clone()),
        watcher::Config::default().fields(&fields),
    )
    .default_backoff()
    .boxed();
    let mut leading = leader.subscribe();
    let mut view = View::default();
    let mut failed = BTreeSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    let retry = tokio::time::sleep(RETRY_AFTER);
    tokio::pin!(retry);
    loop {
        let current = root.borrow_and_update().clone();
        if leader.is_leader() && view.synced() && !current.is_empty() && !view.dirty.is_empty() {
            let failures = publish(&client, &mut view, &current, &leader, &stats).await;
            if !failures.is_empty() {
                if failed.is_empty() {
                    retry
                        .as_mut()
                        .reset(tokio::time::Instant::now() + RETRY_AFTER);
                }
                failed.extend(failures);
            }
        }
        tokio::select! {
            () = &mut shutdown => break,
            Some(event) = namespaces.next() => match event {
                Ok(event) => view.on_namespace(event),
                Err(err) => warn!("root cert publisher: namespace watch: {err}"),
            },
            Some(event) = config_maps.next() => match event {
                Ok(event) => view.on_config_map(event),
                Err(err) => warn!("root cert publisher: ConfigMap watch: {err}"),
            },
            Ok(()) = root.changed() => {
                info!("root cert changed; publishing it to every namespace");
                view.mark_all();
            }
            Ok(()) = leading.changed() => {
                if *leading.borrow_and_update() {
                    info!("root cert publisher: leading; reconciling every namespace");
                    view.mark_all();
                }
            }
            () = &mut retry, if !failed.is_empty() => {
                view.dirty.append(&mut failed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::NamespaceStatus;

    use super::*;
    use crate::fake_api::objects;

    fn ns(name: &str, phase: &str) -> Namespace {
        let mut ns = objects::namespace(name, &[]);
        ns.status = Some(NamespaceStatus {
            phase: Some(phase.into()),
            ..Default::default()
        });
        ns
    }

    fn cm(namespace: &str, value: &str, labelled: bool) -> ConfigMap {
        let mut cm = objects::config_map(namespace, ROOT_CERT_CONFIGMAP, &[(ROOT_CERT_KEY, value)]);
        if labelled {
            cm.metadata.labels = Some(BTreeMap::from([(
                CONFIG_LABEL.0.to_string(),
                CONFIG_LABEL.1.to_string(),
            )]));
        }
        cm
    }

    fn synced(namespaces: Vec<Namespace>, config_maps: Vec<ConfigMap>) -> View {
        let mut view = View::default();
        view.on_namespace(Event::Init);
        for n in namespaces {
            view.on_namespace(Event::InitApply(n));
        }
        view.on_namespace(Event::InitDone);
        view.on_config_map(Event::Init);
        for c in config_maps {
            view.on_config_map(Event::InitApply(c));
        }
        view.on_config_map(Event::InitDone);
        view
    }

    #[test]
    fn which_namespaces_need_a_write() {
        let view = synced(
            vec![
                ns("default", "Active"),
                ns("kube-system", "Active"),
                ns("kube-public", "Active"),
                ns("kube-node-lease", "Active"),
                ns("local-path-storage", "Active"),
                ns("going", "Terminating"),
                ns("same", "Active"),
                ns("unlabelled", "Active"),
                ns("stale", "Active"),
            ],
            vec![
                cm("same", "ROOT", true),
                cm("unlabelled", "ROOT", false),
                cm("stale", "OLD", true),
            ],
        );
        assert!(view.synced());
        let due: Vec<&str> = view
            .dirty
            .iter()
            .map(String::as_str)
            .filter(|n| view.needs_write(n, "ROOT"))
            .collect();
        assert_eq!(due, ["default", "kube-system", "stale", "unlabelled"]);
        assert!(!view.needs_write("nonexistent", "ROOT"));
    }

    #[test]
    fn events_mark_their_namespace_and_a_relist_marks_all() {
        let mut view = synced(vec![ns("a", "Active"), ns("b", "Active")], vec![]);
        view.dirty.clear();
        view.on_config_map(Event::Delete(cm("a", "ROOT", true)));
        view.on_config_map(Event::Apply(objects::config_map("b", "other", &[])));
        assert_eq!(
            view.dirty.iter().collect::<Vec<_>>(),
            ["a"],
            "other ConfigMaps are ignored"
        );
        view.dirty.clear();
        view.on_namespace(Event::Init);
        view.on_namespace(Event::InitApply(ns("c", "Active")));
        assert!(view.dirty.is_empty(), "nothing until the relist is done");
        view.on_namespace(Event::InitDone);
        assert_eq!(view.dirty.iter().collect::<Vec<_>>(), ["a", "b", "c"]);
        assert!(!view.needs_write("a", "ROOT"), "a is gone after the relist");
    }
}
