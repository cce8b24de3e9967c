//! The writer of a [`KubeConfigStore`]: discovery, one watcher per served kind (and
//! Namespaces for label selectors), conversion, and what gets published and announced.
//!
//! The ConfigMaps the Gateway API translation reads (BackendTLSPolicy CAs, Gateway
//! `parametersRef`s: [`config_map_refs`]) are followed by name, each with its own
//! watch, while something references them: a missing one is reported as istiod reports
//! it, one created later is picked up, and the store is not synced before the
//! ConfigMaps its first lists reference are listed too.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::stream::{AbortHandle, BoxStream, SelectAll, StreamExt};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};

use meshfed_registry::config::gateway_api::convert::config_map_refs;
use meshfed_registry::config::store::Objects;
use meshfed_registry::config::{
    ConfigObject, Decoded, FieldError, FieldPath, Kind, ObjectId, RejectedConfig, decode, validate,
};
use meshfed_registry::{ClusterId, ConfigKey};
use serde_json::{Value, json};
use tracing::{debug, info, warn};

use super::{KubeConfigStore, Served, discover, index, plural};
use crate::config_map::{ConfigMapUpdate, follow_config_map};
use crate::registry::EventType;

/// One item from any watcher (boxed: objects can be large).
enum Incoming {
    Config(Kind, Box<watcher::Result<Event<DynamicObject>>>),
    Namespace(Box<watcher::Result<Event<Namespace>>>),
    /// A followed ConfigMap (namespace, name).
    ConfigMap(String, String, ConfigMapUpdate),
}

fn watch_kind(client: &kube::Client, kind: Kind, version: &str) -> BoxStream<'static, Incoming> {
    let resource = ApiResource {
        group: kind.group().to_string(),
        version: version.to_string(),
        api_version: format!("{}/{version}", kind.group()),
        kind: kind.as_str().to_string(),
        plural: plural(kind).to_string(),
    };
    let api = Api::<DynamicObject>::all_with(client.clone(), &resource);
    watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .map(move |event| Incoming::Config(kind, Box::new(event)))
        .boxed()
}

fn watch_namespaces(client: &kube::Client) -> BoxStream<'static, Incoming> {
    watcher::watcher(
        Api::<Namespace>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .map(|event| Incoming::Namespace(Box::new(event)))
    .boxed()
}

/// Delay before the next discovery attempt after `failures` failures in a row: one
/// second, doubling, at most 30 seconds.
fn discovery_backoff(failures: u32) -> Duration {
    Duration::from_secs(1u64 << failures.min(5)).min(Duration::from_secs(30))
}

/// Feeds `store` from the cluster behind `client` until `shutdown` resolves (what it
/// does is described in [`crate::crd`]). The store keeps its last content afterwards.
pub async fn run_kube_config(
    client: kube::Client,
    store: KubeConfigStore,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let cluster = store.inner.config.cluster_id.clone();
    let mut failures = 0;
    let served = loop {
        tokio::select! {
            () = &mut shutdown => return,
            result = discover(&client) => match result {
                Ok(served) => break served,
                Err(err) => {
                    warn!(%cluster, "config store: discovering the Istio config groups failed, retrying: {err}");
                    let delay = discovery_backoff(failures);
                    failures += 1;
                    tokio::select! {
                        () = &mut shutdown => return,
                        () = tokio::time::sleep(delay) => {}
                    }
                }
            },
        }
    };

    let mut incoming: SelectAll<BoxStream<'static, Incoming>> = SelectAll::new();
    let mut writer = Writer::new(store.clone(), client.clone());
    writer.start_watches(&client, served, &mut incoming, true);
    writer.watch_namespaces(&client, &mut incoming);
    writer.flush();
    incoming.extend(writer.started.drain(..));

    let mut rediscover = tokio::time::interval(store.inner.config.rediscover_every);
    rediscover.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    rediscover.reset();
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            _ = rediscover.tick(), if !writer.missing.is_empty() => {
                match discover(&client).await {
                    Ok(served) => {
                        writer.start_watches(&client, served, &mut incoming, false);
                        writer.watch_namespaces(&client, &mut incoming);
                    }
                    Err(err) => debug!(%cluster, "config store: rediscovery failed: {err}"),
                }
            }
            item = incoming.next(), if !incoming.is_empty() => {
                match item {
                    Some(Incoming::Config(kind, event)) => writer.on_config_event(kind, *event),
                    Some(Incoming::Namespace(event)) => writer.on_namespace_event(*event),
                    Some(Incoming::ConfigMap(namespace, name, update)) => {
                        writer.on_config_map(namespace, name, update);
                    }
                    None => {}
                }
                incoming.extend(writer.started.drain(..));
            }
        }
    }
    debug!(%cluster, "config store: stopped");
}

/// An object as converted during a (re)list or from a watch event.
struct Converted {
    id: ObjectId,
    outcome: std::result::Result<ConfigObject, Rejection>,
}

/// Why an object was not taken.
struct Rejection {
    /// What [`ConfigStore::rejected`](meshfed_registry::config::ConfigStore::rejected) lists.
    record: RejectedConfig,
    /// The field of the first error (`spec.hosts[0]`), for structured logs.
    field: String,
}

struct Writer {
    store: KubeConfigStore,
    /// The last valid version of every object seen, in every namespace.
    held: Objects,
    /// Every current rejection, in every namespace.
    invalid: BTreeMap<ObjectId, RejectedConfig>,
    /// Namespace labels, when label selectors decide which namespaces count.
    namespace_labels: HashMap<String, BTreeMap<String, String>>,
    /// Per kind: objects converted since `Init`, applied at `InitDone` so that a relist
    /// replaces the kind as a whole (and deletes what it no longer lists).
    listing: [Option<Vec<Converted>>; Kind::ALL.len()],
    /// Namespaces seen since the namespace watcher's `Init`.
    listing_namespaces: Option<HashMap<String, BTreeMap<String, String>>>,
    /// Per kind: the first list is in (or the kind is not served), for the sync.
    listed: [bool; Kind::ALL.len()],
    /// Per kind: its watcher completed a list, so the next one is a relist.
    watcher_listed: [bool; Kind::ALL.len()],
    namespaces_listed: bool,
    /// The Namespace watch is running.
    watching_namespaces: bool,
    /// Kinds the API server did not serve at the last discovery.
    missing: BTreeSet<Kind>,
    /// Keys changed and not yet announced (held back until synced).
    pending: BTreeSet<ConfigKey>,
    synced: bool,
    /// The client the ConfigMap watches use.
    client: kube::Client,
    /// A Gateway or BackendTLSPolicy changed since the ConfigMap references were
    /// last computed.
    refs_dirty: bool,
    /// The followed ConfigMaps (namespace, name), each with what stops its watch.
    followed_maps: BTreeMap<(String, String), AbortHandle>,
    /// Followed ConfigMaps whose initial list is not in yet.
    maps_pending: BTreeSet<(String, String)>,
    /// The data of the followed ConfigMaps that exist, by `<namespace>/<name>`.
    config_maps: BTreeMap<String, BTreeMap<String, String>>,
    /// Watches started and not yet handed to the run loop.
    started: Vec<BoxStream<'static, Incoming>>,
}

impl Writer {
    fn new(store: KubeConfigStore, client: kube::Client) -> Writer {
        Writer {
            store,
            held: Objects::new(),
            invalid: BTreeMap::new(),
            namespace_labels: HashMap::new(),
            listing: Default::default(),
            listing_namespaces: None,
            listed: [false; Kind::ALL.len()],
            watcher_listed: [false; Kind::ALL.len()],
            namespaces_listed: true,
            watching_namespaces: false,
            missing: BTreeSet::new(),
            pending: BTreeSet::new(),
            synced: false,
            client,
            refs_dirty: false,
            followed_maps: BTreeMap::new(),
            maps_pending: BTreeSet::new(),
            config_maps: BTreeMap::new(),
            started: Vec::new(),
        }
    }

    fn cluster(&self) -> &ClusterId {
        &self.store.inner.config.cluster_id
    }

    /// Starts a watcher for every served kind not watched yet. At the first discovery,
    /// kinds not served are logged and count as listed.
    fn start_watches(
        &mut self,
        client: &kube::Client,
        served: Served,
        incoming: &mut SelectAll<BoxStream<'static, Incoming>>,
        first: bool,
    ) {
        for kind in Kind::ALL {
            match served[index(kind)] {
                Some(version) if first || self.missing.contains(&kind) => {
                    if !first {
                        info!(cluster = %self.cluster(), %kind, version, "config store: {} {kind} is now served; watching it", kind.group());
                    }
                    self.missing.remove(&kind);
                    self.store.write().versions[index(kind)] = Some(version);
                    incoming.push(watch_kind(client, kind, version));
                }
                Some(_) => {}
                None if first => {
                    warn!(
                        cluster = %self.cluster(), %kind,
                        "config store: the API server does not serve {} {kind} (CRD not installed?); \
                         counting it as synced with no objects and checking again every {:?}",
                        kind.group(),
                        self.store.inner.config.rediscover_every
                    );
                    self.missing.insert(kind);
                    self.listed[index(kind)] = true;
                }
                None => {}
            }
        }
        if first {
            let versions: Vec<String> = Kind::ALL
                .iter()
                .filter_map(|k| served[index(*k)].map(|v| format!("{k}={v}")))
                .collect();
            info!(cluster = %self.cluster(), "config store: watching Istio config: {}", versions.join(" "));
        }
    }

    fn on_config_event(&mut self, kind: Kind, event: watcher::Result<Event<DynamicObject>>) {
        let stats = &self.store.inner.stats;
        let event = match event {
            Ok(event) => event,
            Err(err) => {
                // The watcher retries by itself (resume, or relist after 410 Gone).
                stats.watch_errors[index(kind)].fetch_add(1, Ordering::Relaxed);
                warn!(cluster = %self.cluster(), %kind, "config store: watch: {err}");
                return;
            }
        };
        match event {
            Event::Init => {
                if self.watcher_listed[index(kind)] {
                    stats.relists[index(kind)].fetch_add(1, Ordering::Relaxed);
                    info!(cluster = %self.cluster(), %kind, "config store: relisting");
                }
                self.listing[index(kind)] = Some(Vec::new());
            }
            Event::InitApply(obj) => {
                if let Some(converted) = self.convert(kind, &obj) {
                    self.listing[index(kind)]
                        .get_or_insert_with(Vec::new)
                        .push(converted);
                }
            }
            Event::InitDone => {
                let listed = self.listing[index(kind)].take().unwrap_or_default();
                let seen: BTreeSet<&ObjectId> = listed.iter().map(|c| &c.id).collect();
                let gone: Vec<ObjectId> = self
                    .ids_of(kind)
                    .into_iter()
                    .filter(|id| !seen.contains(id))
                    .collect();
                let mut touched = Vec::with_capacity(gone.len() + listed.len());
                for id in gone {
                    self.remove(&id);
                    touched.push(id);
                }
                for converted in listed {
                    touched.push(converted.id.clone());
                    self.apply(converted);
                }
                self.listed[index(kind)] = true;
                self.watcher_listed[index(kind)] = true;
                self.publish(touched);
                self.flush();
            }
            Event::Apply(obj) => {
                if let Some(converted) = self.convert(kind, &obj) {
                    let id = converted.id.clone();
                    self.apply(converted);
                    self.publish([id]);
                    self.flush();
                }
            }
            Event::Delete(obj) => {
                if let Some(id) = object_id(kind, &obj.metadata) {
                    self.remove(&id);
                    self.publish([id]);
                    self.flush();
                }
            }
        }
    }

    /// Starts the Namespace watch when namespace labels matter and it is not running:
    /// label selectors pick the namespaces, or a Gateway API kind is served (its
    /// listeners' `allowedRoutes.namespaces.from: Selector` reads them; a kind whose
    /// CRD is installed later starts it then).
    fn watch_namespaces(
        &mut self,
        client: &kube::Client,
        incoming: &mut SelectAll<BoxStream<'static, Incoming>>,
    ) {
        let gateway_api = {
            let state = self.store.read();
            Kind::ALL
                .into_iter()
                .any(|k| k.is_gateway_api() && state.versions[index(k)].is_some())
        };
        if self.watching_namespaces
            || !(gateway_api || self.store.inner.config.needs_namespace_labels())
        {
            return;
        }
        self.watching_namespaces = true;
        if !self.synced {
            self.namespaces_listed = false;
        }
        incoming.push(watch_namespaces(client));
    }

    fn on_namespace_event(&mut self, event: watcher::Result<Event<Namespace>>) {
        let event = match event {
            Ok(event) => event,
            Err(err) => {
                warn!(cluster = %self.cluster(), "config store: namespace watch: {err}");
                return;
            }
        };
        let labels = |ns: &Namespace| ns.metadata.labels.clone().unwrap_or_default();
        let changed: Vec<String> = match event {
            Event::Init => {
                self.listing_namespaces = Some(HashMap::new());
                return;
            }
            Event::InitApply(ns) => {
                if let Some(name) = ns.metadata.name.clone() {
                    self.listing_namespaces
                        .get_or_insert_with(HashMap::new)
                        .insert(name, labels(&ns));
                }
                return;
            }
            Event::InitDone => {
                let listed = self.listing_namespaces.take().unwrap_or_default();
                let old = std::mem::replace(&mut self.namespace_labels, listed);
                self.namespaces_listed = true;
                let mut changed: BTreeSet<String> = old.keys().cloned().collect();
                changed.extend(self.namespace_labels.keys().cloned());
                changed
                    .into_iter()
                    .filter(|n| old.get(n) != self.namespace_labels.get(n))
                    .collect()
            }
            Event::Apply(ns) => {
                let Some(name) = ns.metadata.name.clone() else {
                    return;
                };
                let new = labels(&ns);
                if self.namespace_labels.get(&name) == Some(&new) {
                    return;
                }
                self.namespace_labels.insert(name.clone(), new);
                vec![name]
            }
            Event::Delete(ns) => match ns.metadata.name.as_ref() {
                Some(name) if self.namespace_labels.remove(name).is_some() => vec![name.clone()],
                _ => return,
            },
        };
        let changed: BTreeSet<&str> = changed.iter().map(String::as_str).collect();
        // The selected namespaces may have changed: so may the ConfigMaps to follow.
        self.refs_dirty = true;
        self.store.write().namespaces = Some(
            self.namespace_labels
                .iter()
                .map(|(n, l)| (n.clone(), l.clone()))
                .collect(),
        );
        // The Gateway API objects of those namespaces read the labels: translate them
        // again even though they did not change.
        self.pending.extend(
            self.held
                .keys()
                .filter(|id| id.kind.is_gateway_api() && changed.contains(&*id.namespace))
                .map(ObjectId::key),
        );
        let touched: BTreeSet<ObjectId> = self
            .held
            .keys()
            .chain(self.invalid.keys())
            .filter(|id| changed.contains(&*id.namespace))
            .cloned()
            .collect();
        self.publish(touched);
        self.flush();
    }

    /// Every id of `kind` the writer holds, valid or rejected.
    fn ids_of(&self, kind: Kind) -> BTreeSet<ObjectId> {
        let of_kind = |id: &&ObjectId| id.kind == kind;
        self.held
            .keys()
            .filter(of_kind)
            .chain(self.invalid.keys().filter(of_kind))
            .cloned()
            .collect()
    }

    /// Decodes and validates one object. `None` only when it has no name.
    fn convert(&self, kind: Kind, obj: &DynamicObject) -> Option<Converted> {
        let Some(id) = object_id(kind, &obj.metadata) else {
            warn!(cluster = %self.cluster(), %kind, "config store: skipping an object without a name");
            return None;
        };
        let source = format!("kubernetes:{}/{}/{}", self.cluster(), id.namespace, id.name);
        let mut value = serde_json::to_value(obj).unwrap_or(Value::Null);
        // List items and watch events carry apiVersion and kind, but nothing depends on
        // it: the collection says what they are.
        if value.get("kind").is_none_or(Value::is_null) {
            value["kind"] = json!(kind.as_str());
        }
        if value.get("apiVersion").is_none_or(Value::is_null) {
            let version = self.store.read().versions[index(kind)].unwrap_or(kind.versions()[0]);
            value["apiVersion"] = json!(format!("{}/{version}", kind.group()));
        }
        let rejection = |errors: &[FieldError]| Rejection {
            record: RejectedConfig {
                source: source.clone(),
                kind: kind.as_str().to_string(),
                namespace: id.namespace.to_string(),
                name: id.name.to_string(),
                errors: errors.iter().map(ToString::to_string).collect(),
            },
            field: errors
                .first()
                .map(|e| e.field.to_string())
                .unwrap_or_default(),
        };
        let outcome = match decode(&value, &source) {
            Decoded::Object(object) if object.kind == kind => match validate(&object) {
                Ok(_warnings) => Ok(object),
                Err(errors) => Err(rejection(&errors)),
            },
            Decoded::Object(object) => {
                Err(rejection(&[unexpected_kind(kind, object.kind.as_str())]))
            }
            Decoded::Invalid(invalid) => Err(rejection(&invalid.errors)),
            Decoded::Skipped(skipped) => Err(rejection(&[unexpected_kind(kind, &skipped.kind)])),
            Decoded::Secret(_) => Err(rejection(&[unexpected_kind(kind, "Secret")])),
        };
        Some(Converted { id, outcome })
    }

    /// Takes a converted object into the held state: a valid one replaces the last
    /// valid version and clears a rejection; an invalid one is recorded (and logged
    /// when new) and leaves the last valid version in force.
    fn apply(&mut self, converted: Converted) {
        let Converted { id, outcome } = converted;
        self.refs_dirty |= reads_config_maps(id.kind);
        let stats = &self.store.inner.stats;
        match outcome {
            Ok(object) => {
                let event = if self.held.contains_key(&id) {
                    EventType::Update
                } else {
                    EventType::Add
                };
                stats.events[index(id.kind)][event as usize].fetch_add(1, Ordering::Relaxed);
                self.invalid.remove(&id);
                self.held.insert(id, Arc::new(object));
            }
            Err(Rejection { record, field }) => {
                if self.invalid.get(&id) != Some(&record) {
                    stats.rejections.fetch_add(1, Ordering::Relaxed);
                    let kept = if self.held.contains_key(&id) {
                        " (the last valid version stays in force)"
                    } else {
                        ""
                    };
                    warn!(
                        cluster = %self.cluster(),
                        kind = %id.kind,
                        namespace = %id.namespace,
                        name = %id.name,
                        field,
                        "config rejected: {record}{kept}"
                    );
                }
                self.invalid.insert(id, record);
            }
        }
    }

    /// Forgets an object: its valid version and its rejection.
    fn remove(&mut self, id: &ObjectId) {
        self.refs_dirty |= reads_config_maps(id.kind);
        if self.held.remove(id).is_some() {
            self.store.inner.stats.events[index(id.kind)][EventType::Delete as usize]
                .fetch_add(1, Ordering::Relaxed);
        }
        self.invalid.remove(id);
    }

    fn selects(&self, namespace: &str) -> bool {
        self.store
            .inner
            .config
            .namespaces
            .selects(namespace, self.namespace_labels.get(namespace))
    }

    /// Brings the published state of `ids` in line with the held state and the
    /// namespace filter, remembering the keys whose content changed.
    fn publish(&mut self, ids: impl IntoIterator<Item = ObjectId>) {
        let mut changed = Vec::new();
        {
            let stats = &self.store.inner.stats;
            let mut state = self.store.write();
            for id in ids {
                let selected = self.selects(&id.namespace);
                let want = self.held.get(&id).filter(|_| selected).cloned();
                let differs = match (state.objects.get(&id), &want) {
                    (None, None) => false,
                    (Some(before), Some(after)) => !before.same_content(after),
                    (None, Some(_)) => {
                        stats.objects[index(id.kind)].fetch_add(1, Ordering::Relaxed);
                        true
                    }
                    (Some(_), None) => {
                        stats.objects[index(id.kind)].fetch_sub(1, Ordering::Relaxed);
                        true
                    }
                };
                if differs {
                    changed.push(id.key());
                }
                match want {
                    Some(object) => state.objects.insert(id.clone(), object),
                    None => state.objects.remove(&id),
                };
                match self.invalid.get(&id).filter(|_| selected) {
                    Some(record) => state.rejected.insert(id, record.clone()),
                    None => state.rejected.remove(&id),
                };
            }
            stats
                .rejected
                .store(state.rejected.len() as u64, Ordering::Relaxed);
        }
        self.pending.extend(changed);
    }

    /// Announces what changed: nothing before every initial list is in; at that point
    /// the store becomes synced and everything is announced; afterwards each change.
    fn flush(&mut self) {
        self.follow_config_maps();
        if !self.synced {
            if !(self.namespaces_listed
                && self.listed.iter().all(|l| *l)
                && self.maps_pending.is_empty())
            {
                return;
            }
            self.synced = true;
            // Becoming synced is a change consumers wait for.
            self.store.inner.core.mark_synced();
            let (objects, rejected) = {
                let state = self.store.read();
                (state.objects.len(), state.rejected.len())
            };
            info!(cluster = %self.cluster(), objects, rejected, "config store synced");
        }
        if !self.pending.is_empty() {
            let keys = std::mem::take(&mut self.pending);
            self.store.inner.core.announce(keys);
        }
    }
}

/// Whether objects of `kind` can reference ConfigMaps the translation reads.
fn reads_config_maps(kind: Kind) -> bool {
    matches!(kind, Kind::KubernetesGateway | Kind::BackendTLSPolicy)
}

impl Writer {
    /// Follows the ConfigMaps the held objects reference and no longer follows the
    /// others (after a Gateway or BackendTLSPolicy changed).
    fn follow_config_maps(&mut self) {
        if !std::mem::take(&mut self.refs_dirty) {
            return;
        }
        // Only the objects the store publishes (in selected namespaces).
        let wanted = config_map_refs(
            self.held
                .iter()
                .filter(|(id, _)| self.selects(&id.namespace))
                .map(|(_, o)| &**o),
        );
        let unwanted: Vec<(String, String)> = self
            .followed_maps
            .keys()
            .filter(|k| !wanted.contains(*k))
            .cloned()
            .collect();
        for key in unwanted {
            debug!(cluster = %self.cluster(), namespace = %key.0, name = %key.1, "config store: no longer following ConfigMap");
            if let Some(handle) = self.followed_maps.remove(&key) {
                handle.abort();
            }
            self.maps_pending.remove(&key);
            self.config_maps.remove(&format!("{}/{}", key.0, key.1));
        }
        for key in wanted {
            if self.followed_maps.contains_key(&key) {
                continue;
            }
            debug!(cluster = %self.cluster(), namespace = %key.0, name = %key.1, "config store: following ConfigMap");
            let (namespace, name) = key.clone();
            let (stream, handle) = futures::stream::abortable(follow_config_map(
                self.client.clone(),
                &namespace,
                &name,
            ));
            self.started.push(
                stream
                    .map(move |update| Incoming::ConfigMap(namespace.clone(), name.clone(), update))
                    .boxed(),
            );
            self.followed_maps.insert(key.clone(), handle);
            self.maps_pending.insert(key);
        }
        self.publish_config_maps();
    }

    fn publish_config_maps(&self) {
        self.store.write().config_maps = Some(self.config_maps.clone());
    }

    fn on_config_map(&mut self, namespace: String, name: String, update: ConfigMapUpdate) {
        let key = (namespace, name);
        if !self.followed_maps.contains_key(&key) {
            return;
        }
        let path = format!("{}/{}", key.0, key.1);
        let data = match update {
            ConfigMapUpdate::Error(err) => {
                warn!(cluster = %self.cluster(), configmap = %path, "config store: ConfigMap watch: {err}");
                return;
            }
            ConfigMapUpdate::Data(data) => Some(data),
            ConfigMapUpdate::Absent => None,
        };
        let first = self.maps_pending.remove(&key);
        let changed = self.config_maps.get(&path) != data.as_ref();
        match data {
            Some(data) => self.config_maps.insert(path, data),
            None => self.config_maps.remove(&path),
        };
        if !(first || changed) {
            return;
        }
        self.publish_config_maps();
        // The objects of that namespace that read ConfigMaps are translated again.
        if changed {
            let readers: Vec<ConfigKey> = self
                .held
                .keys()
                .filter(|id| reads_config_maps(id.kind) && *id.namespace == *key.0)
                .filter(|id| self.selects(&id.namespace))
                .map(ObjectId::key)
                .collect();
            self.pending.extend(readers);
        }
        self.flush();
    }
}

/// The id of an object from its metadata (a missing namespace is `default`, as
/// [`decode()`] reads it).
fn object_id(kind: Kind, meta: &ObjectMeta) -> Option<ObjectId> {
    let name = meta.name.as_deref().filter(|n| !n.is_empty())?;
    let namespace = meta
        .namespace
        .as_deref()
        .filter(|n| !n.is_empty())
        .unwrap_or("default");
    Some(ObjectId::new(kind, namespace, name))
}

fn unexpected_kind(want: Kind, found: &str) -> FieldError {
    FieldError::new(
        FieldPath::root().field("kind"),
        format!(
            "the {} collection returned an object of kind {found:?}",
            plural(want)
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_backs_off_up_to_thirty_seconds() {
        assert_eq!(discovery_backoff(0), Duration::from_secs(1));
        assert_eq!(discovery_backoff(3), Duration::from_secs(8));
        assert_eq!(discovery_backoff(40), Duration::from_secs(30));
    }
}
