//! The read side of config stores ([`ConfigStore`]) and the in-memory store.
//!
//! A store holds only valid objects. What it rejected is listed by
//! [`ConfigStore::rejected`] (for `/debug/configz`, logs and metrics) and never
//! replaces what the store had: an earlier valid version of the same object stays.
//! Every change is announced through the store's [`UpdateSink`] as
//! `config_changed(keys)` with exactly the keys of the objects whose spec, labels or
//! annotations changed (added, updated or deleted) — except ServiceEntries and
//! WorkloadEntries, which feed the ServiceEntry registry (as in Istio, whose config
//! controller registers no push handler for them): that registry follows
//! [`ConfigStore::changes`] and pushes the services and endpoints they change.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use serde::Serialize;
use tokio::sync::watch;

use crate::config::ignored::IgnoredConfig;
use crate::config::kinds::Feeds;
use crate::config::model::{ConfigObject, Kind, ObjectId};
use crate::config::validate::{FieldError, Warning};
use crate::config::validation::validate;
use crate::events::{ConfigKey, UpdateSink};

/// Read access to a config store. Reads are synchronous and never wait for the
/// store's writer.
pub trait ConfigStore: Send + Sync + fmt::Debug {
    /// The objects of one kind, sorted by namespace and name.
    fn list(&self, kind: Kind) -> Vec<Arc<ConfigObject>>;

    /// Every object, sorted by kind, namespace and name.
    fn all(&self) -> Vec<Arc<ConfigObject>>;

    /// What the store rejected (and why), in a stable order (file order for files).
    fn rejected(&self) -> Vec<RejectedConfig>;

    /// Objects of kinds meshfed does not read, which the store found and does not
    /// apply ([`crate::config::ignored`]). Empty for stores that can only hold declared
    /// kinds (memory, Kubernetes).
    fn ignored(&self) -> Vec<IgnoredConfig> {
        Vec::new()
    }

    /// True once the initial load is complete.
    fn has_synced(&self) -> bool;

    /// The state of the store's connection to where its objects come from (a config
    /// source's address, whether it is connected, stale, synced), for
    /// `/debug/configz`. `None` for stores with nothing to report.
    fn source_status(&self) -> Option<serde_json::Value> {
        None
    }

    /// A generation counter that moves after every change the store applies and when
    /// it becomes synced: how consumers of the objects (the ServiceEntry registry)
    /// wait for changes. `None` for a store that cannot notify; it is then polled.
    fn changes(&self) -> Option<watch::Receiver<u64>> {
        None
    }

    /// The labels of every namespace the store knows (`kind: Namespace` objects of a
    /// config directory, the Namespaces of a cluster when the store watches them),
    /// for the Gateway API's `allowedRoutes.namespaces.from: Selector`. `None`: the
    /// store knows no namespaces.
    fn namespace_labels(&self) -> Option<NamespaceLabels> {
        None
    }

    /// The ConfigMaps the store knows (`kind: ConfigMap` objects of a config
    /// directory), for the Gateway API's `parametersRef` and BackendTLSPolicy CA
    /// references. `None`: the store knows no ConfigMaps.
    fn config_maps(&self) -> Option<ConfigMaps> {
        None
    }
}

/// Namespace name -> its labels.
pub type NamespaceLabels = BTreeMap<String, BTreeMap<String, String>>;

/// `<namespace>/<name>` of a ConfigMap -> its data.
pub type ConfigMaps = BTreeMap<String, BTreeMap<String, String>>;

/// Whether a change to an object with this key is pushed as config: only kinds that
/// feed the config index are ([`Feeds`]). ServiceEntries and WorkloadEntries are not
/// (the ServiceEntry registry pushes what they change), nor kinds nothing reads yet.
fn pushed_as_config(key: &ConfigKey) -> bool {
    key.kind
        .object_kind()
        .is_none_or(|kind| kind.info().feeds == Feeds::ConfigIndex)
}

/// Announces applied changes: moves the generation counter, then pushes the keys
/// that are pushed as config (if any). Public for stores kept in other crates (the
/// Kubernetes CRD store), which must announce the same way.
pub fn announce(
    sink: &UpdateSink,
    changes: &watch::Sender<u64>,
    keys: impl IntoIterator<Item = ConfigKey>,
) {
    changes.send_modify(|generation| *generation += 1);
    let pushed: Vec<ConfigKey> = keys.into_iter().filter(pushed_as_config).collect();
    if !pushed.is_empty() {
        sink.config_changed(pushed);
    }
}

/// The part every config store shares: its state behind one lock (read and written
/// even after a panicking writer), whether its first load is done, the generation
/// counter behind [`ConfigStore::changes`] and the sink its changes are announced
/// through. `S` is the store's own state; [`Published`] says where in it the objects
/// and rejections are. A store's [`ConfigStore`] impl hands its reads to this.
#[derive(Debug)]
pub struct StoreCore<S> {
    sink: UpdateSink,
    synced: AtomicBool,
    changes: watch::Sender<u64>,
    state: RwLock<S>,
}

/// What a store's state publishes.
pub trait Published {
    /// The objects in force.
    fn objects(&self) -> &Objects;
    /// What was rejected, in the store's stable order.
    fn rejected(&self) -> Vec<RejectedConfig>;
}

impl<S: Default + Published> StoreCore<S> {
    /// An empty, unsynced core announcing through `sink`.
    pub fn new(sink: UpdateSink) -> StoreCore<S> {
        StoreCore {
            sink,
            synced: AtomicBool::new(false),
            changes: watch::Sender::new(0),
            state: RwLock::new(S::default()),
        }
    }

    /// Reads the state.
    pub fn read(&self) -> std::sync::RwLockReadGuard<'_, S> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes the state (announce afterwards, outside the lock).
    pub fn write(&self) -> std::sync::RwLockWriteGuard<'_, S> {
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks the first load done and moves the generation counter (becoming synced
    /// is a change consumers wait for). False if it was synced already.
    pub fn mark_synced(&self) -> bool {
        let first = !self.synced.swap(true, Ordering::SeqCst);
        if first {
            self.changes.send_modify(|generation| *generation += 1);
        }
        first
    }

    /// Announces applied changes (see [`announce`]).
    pub fn announce(&self, keys: impl IntoIterator<Item = ConfigKey>) {
        announce(&self.sink, &self.changes, keys);
    }

    /// Sends `request` to the push pipeline as is (for changes that are not config
    /// objects, such as the config directory's Secrets).
    pub fn push(&self, request: crate::events::PushRequest) {
        self.sink.push(request);
    }

    /// [`ConfigStore::list`].
    pub fn list(&self, kind: Kind) -> Vec<Arc<ConfigObject>> {
        list_kind(self.read().objects(), kind)
    }

    /// [`ConfigStore::all`].
    pub fn all(&self) -> Vec<Arc<ConfigObject>> {
        self.read().objects().values().cloned().collect()
    }

    /// [`ConfigStore::rejected`].
    pub fn rejected(&self) -> Vec<RejectedConfig> {
        self.read().rejected()
    }

    /// [`ConfigStore::has_synced`].
    pub fn has_synced(&self) -> bool {
        self.synced.load(Ordering::SeqCst)
    }

    /// [`ConfigStore::changes`].
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }
}

/// An object (or a document or file) the store did not take.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RejectedConfig {
    /// Where it came from: `path:line`, or `memory`.
    pub source: String,
    /// Its kind as written (empty when it could not be read).
    pub kind: String,
    /// Its namespace (empty when unknown).
    pub namespace: String,
    /// Its name (empty when unknown).
    pub name: String,
    /// Every reason, one per field (`path:line: field: reason` for files).
    pub errors: Vec<String>,
}

impl fmt::Display for RejectedConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.source)?;
        if !self.name.is_empty() {
            write!(f, "{} {}/{}: ", self.kind, self.namespace, self.name)?;
        }
        f.write_str(&self.errors.join("; "))
    }
}

/// The objects of a store by id, as a snapshot.
pub type Objects = BTreeMap<ObjectId, Arc<ConfigObject>>;

/// Lists one kind of a snapshot (already sorted by the map order).
pub fn list_kind(objects: &Objects, kind: Kind) -> Vec<Arc<ConfigObject>> {
    objects
        .range(ObjectId::new(kind, "", "")..)
        .take_while(|(id, _)| id.kind == kind)
        .map(|(_, obj)| obj.clone())
        .collect()
}

/// The keys that differ between two snapshots: added, deleted, or changed in spec,
/// labels or annotations.
pub(crate) fn changed_keys(old: &Objects, new: &Objects) -> BTreeSet<ConfigKey> {
    let mut keys = BTreeSet::new();
    for (id, obj) in new {
        match old.get(id) {
            Some(before) if before.same_content(obj) => {}
            _ => {
                keys.insert(id.key());
            }
        }
    }
    for id in old.keys() {
        if !new.contains_key(id) {
            keys.insert(id.key());
        }
    }
    keys
}

/// The rejection record of an object built in code.
fn memory_rejection(obj: &ConfigObject, errors: &[FieldError]) -> RejectedConfig {
    RejectedConfig {
        source: obj.source.clone(),
        kind: obj.kind.to_string(),
        namespace: obj.namespace.clone(),
        name: obj.name.clone(),
        errors: errors.iter().map(ToString::to_string).collect(),
    }
}

#[derive(Debug, Default)]
struct MemoryState {
    objects: Objects,
    rejected: BTreeMap<ObjectId, RejectedConfig>,
}

impl Published for MemoryState {
    fn objects(&self) -> &Objects {
        &self.objects
    }

    fn rejected(&self) -> Vec<RejectedConfig> {
        self.rejected.values().cloned().collect()
    }
}

/// An in-memory config store for tests, demos and embedding: objects are set through
/// the API, validated like file objects. A cheap handle; clones share one store.
#[derive(Clone, Debug)]
pub struct MemoryConfigStore {
    core: Arc<StoreCore<MemoryState>>,
}

impl MemoryConfigStore {
    /// An empty store reporting changes through `sink`; it counts as synced at once.
    pub fn new(sink: UpdateSink) -> MemoryConfigStore {
        let store = MemoryConfigStore::new_unsynced(sink);
        store.mark_synced();
        store
    }

    /// An empty store that reports not-synced until [`MemoryConfigStore::mark_synced`].
    pub fn new_unsynced(sink: UpdateSink) -> MemoryConfigStore {
        MemoryConfigStore {
            core: Arc::new(StoreCore::new(sink)),
        }
    }

    /// Marks the initial load done.
    pub fn mark_synced(&self) {
        self.core.mark_synced();
    }

    /// Adds or replaces an object. An invalid object is not stored (an earlier
    /// version stays), is listed by [`ConfigStore::rejected`] and its errors are
    /// returned; a valid one clears an earlier rejection of the same object. Pushes
    /// only when spec, labels or annotations changed.
    pub fn apply(&self, obj: ConfigObject) -> Result<Vec<Warning>, Vec<FieldError>> {
        let id = obj.id();
        let warnings = match validate(&obj) {
            Ok(warnings) => warnings,
            Err(errors) => {
                tracing::warn!(
                    source = %obj.source,
                    "{id} rejected: {}",
                    errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
                );
                self.write()
                    .rejected
                    .insert(id, memory_rejection(&obj, &errors));
                return Err(errors);
            }
        };
        let changed = {
            let mut state = self.write();
            state.rejected.remove(&id);
            let changed = state
                .objects
                .get(&id)
                .is_none_or(|before| !before.same_content(&obj));
            state.objects.insert(id.clone(), Arc::new(obj));
            changed
        };
        if changed {
            self.core.announce([id.key()]);
        }
        Ok(warnings)
    }

    /// Removes an object (and any rejection of it); returns whether it existed.
    pub fn delete(&self, kind: Kind, namespace: &str, name: &str) -> bool {
        let id = ObjectId::new(kind, namespace, name);
        let existed = {
            let mut state = self.write();
            state.rejected.remove(&id);
            state.objects.remove(&id).is_some()
        };
        if existed {
            self.core.announce([id.key()]);
        }
        existed
    }

    /// Replaces the whole content with `objects`: each is validated, invalid ones are
    /// rejected (an earlier valid version stays), an object given twice keeps its
    /// first definition. One push with every changed key. Returns the rejections.
    pub fn replace_all(&self, objects: Vec<ConfigObject>) -> Vec<RejectedConfig> {
        let mut next = Objects::new();
        let mut rejected = BTreeMap::new();
        let mut invalid = Vec::new();
        for obj in objects {
            let id = obj.id();
            match validate(&obj) {
                Ok(_) if next.contains_key(&id) => {
                    rejected.insert(
                        id.clone(),
                        memory_rejection(
                            &obj,
                            &[FieldError::new(
                                Default::default(),
                                format!(
                                    "duplicate: {id} is given twice; the first definition is used"
                                ),
                            )],
                        ),
                    );
                }
                Ok(_) => {
                    next.insert(id, Arc::new(obj));
                }
                Err(errors) => {
                    rejected.insert(id.clone(), memory_rejection(&obj, &errors));
                    invalid.push(id);
                }
            }
        }
        let keys = {
            let mut state = self.write();
            for id in invalid {
                if let (false, Some(before)) = (next.contains_key(&id), state.objects.get(&id)) {
                    next.insert(id, before.clone());
                }
            }
            let keys = changed_keys(&state.objects, &next);
            state.objects = next;
            state.rejected = rejected.clone();
            keys
        };
        for r in rejected.values() {
            tracing::warn!("config rejected: {r}");
        }
        if !keys.is_empty() {
            self.core.announce(keys);
        }
        rejected.into_values().collect()
    }

    /// One object, if present.
    pub fn get(&self, kind: Kind, namespace: &str, name: &str) -> Option<Arc<ConfigObject>> {
        self.read()
            .objects
            .get(&ObjectId::new(kind, namespace, name))
            .cloned()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, MemoryState> {
        self.core.read()
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, MemoryState> {
        self.core.write()
    }
}

impl ConfigStore for MemoryConfigStore {
    fn list(&self, kind: Kind) -> Vec<Arc<ConfigObject>> {
        self.core.list(kind)
    }

    fn all(&self) -> Vec<Arc<ConfigObject>> {
        self.core.all()
    }

    fn rejected(&self) -> Vec<RejectedConfig> {
        self.core.rejected()
    }

    fn has_synced(&self) -> bool {
        self.core.has_synced()
    }

    fn changes(&self) -> Option<watch::Receiver<u64>> {
        Some(self.core.changes())
    }
}

#[cfg(test)]
pub(crate) mod test_support {
    //! Reading pushes off an [`UpdateSink`] channel in tests.

    use super::*;
    use crate::endpoints::EndpointIndex;
    use crate::events::{ConfigKind, RegistryEvent};
    use tokio::sync::mpsc::UnboundedReceiver;

    /// A sink and the receiver of its events.
    pub(crate) fn sink() -> (UpdateSink, UnboundedReceiver<RegistryEvent>) {
        UpdateSink::new(Arc::new(EndpointIndex::new()))
    }

    /// The keys of every push already on the channel (`kind/namespace/name`), or
    /// `None` when there is none.
    pub(crate) fn pushed(rx: &mut UnboundedReceiver<RegistryEvent>) -> Option<Vec<String>> {
        let mut keys: Option<Vec<String>> = None;
        while let Ok(event) = rx.try_recv() {
            if let RegistryEvent::Push(request) = event {
                assert!(request.full, "config changes are full pushes");
                keys.get_or_insert_with(Vec::new)
                    .extend(request.configs_updated.iter().map(ToString::to_string));
            }
        }
        keys
    }

    /// `ConfigKind/namespace/name`, the way [`ConfigKey`] displays.
    pub(crate) fn key(kind: ConfigKind, namespace: &str, name: &str) -> String {
        ConfigKey::new(kind, name, namespace).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::{key, pushed, sink};
    use super::*;
    use crate::events::ConfigKind;
    use meshfed_api::networking::v1alpha3 as net;

    fn vs(namespace: &str, name: &str, host: &str) -> ConfigObject {
        let spec = net::VirtualService {
            hosts: vec![host.to_string()],
            http: vec![net::HttpRoute {
                route: vec![net::HttpRouteDestination {
                    destination: Some(net::Destination {
                        host: host.to_string(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        ConfigObject::new(namespace, name, spec)
    }

    fn gateway(namespace: &str, name: &str) -> ConfigObject {
        let spec = net::Gateway {
            servers: vec![net::Server {
                port: Some(net::Port {
                    number: 80,
                    protocol: "HTTP".into(),
                    name: "http".into(),
                    target_port: 0,
                }),
                hosts: vec!["*".into()],
                ..Default::default()
            }],
            ..Default::default()
        };
        ConfigObject::new(namespace, name, spec)
    }

    #[tokio::test]
    async fn apply_pushes_only_real_changes() {
        let (sink, mut rx) = sink();
        let store = MemoryConfigStore::new(sink);
        assert!(store.has_synced());

        store.apply(vs("ns", "a", "a")).unwrap();
        assert_eq!(
            pushed(&mut rx),
            Some(vec![key(ConfigKind::VirtualService, "ns", "a")])
        );

        // Same content (a new source does not count): no push.
        let mut same = vs("ns", "a", "a");
        same.source = "elsewhere".into();
        store.apply(same).unwrap();
        assert_eq!(pushed(&mut rx), None);

        // A label change is a change.
        let mut labelled = vs("ns", "a", "a");
        labelled.labels.insert("v".into(), "2".into());
        store.apply(labelled).unwrap();
        assert_eq!(
            pushed(&mut rx),
            Some(vec![key(ConfigKind::VirtualService, "ns", "a")])
        );

        store.apply(gateway("istio-system", "gw")).unwrap();
        assert_eq!(
            pushed(&mut rx),
            Some(vec![key(ConfigKind::Gateway, "istio-system", "gw")])
        );
        assert_eq!(store.all().len(), 2);
        assert_eq!(store.list(Kind::Gateway)[0].name, "gw");
        assert!(store.list(Kind::Sidecar).is_empty());

        assert!(store.delete(Kind::VirtualService, "ns", "a"));
        assert_eq!(
            pushed(&mut rx),
            Some(vec![key(ConfigKind::VirtualService, "ns", "a")])
        );
        assert!(!store.delete(Kind::VirtualService, "ns", "a"));
        assert_eq!(pushed(&mut rx), None);
    }

    #[tokio::test]
    async fn invalid_objects_are_rejected_and_never_stored() {
        let (sink, mut rx) = sink();
        let store = MemoryConfigStore::new(sink);
        store.apply(vs("ns", "a", "a")).unwrap();
        pushed(&mut rx);

        let errors = store.apply(vs("ns", "a", "*")).unwrap_err();
        assert_eq!(errors[0].field.to_string(), "spec.hosts[0]");
        assert_eq!(pushed(&mut rx), None, "nothing changed");
        assert_eq!(
            store
                .get(Kind::VirtualService, "ns", "a")
                .unwrap()
                .spec
                .as_virtual_service()
                .unwrap()
                .hosts,
            ["a"],
            "the earlier valid version stays"
        );
        let rejected = store.rejected();
        assert_eq!(rejected.len(), 1);
        assert_eq!(
            (rejected[0].kind.as_str(), rejected[0].name.as_str()),
            ("VirtualService", "a")
        );
        assert_eq!(rejected[0].source, "memory");
        assert!(
            rejected[0].errors[0].starts_with("spec.hosts[0]: wildcard host *"),
            "{rejected:?}"
        );

        // Fixing it clears the rejection.
        store.apply(vs("ns", "a", "b")).unwrap();
        assert!(store.rejected().is_empty());
        assert_eq!(
            pushed(&mut rx),
            Some(vec![key(ConfigKind::VirtualService, "ns", "a")])
        );

        let bad_new = store.apply(gateway("ns", "Not.A.Label")).unwrap_err();
        assert_eq!(bad_new[0].field.to_string(), "metadata.name");
        assert!(store.get(Kind::Gateway, "ns", "Not.A.Label").is_none());
    }

    #[tokio::test]
    async fn replace_all_diffs_and_pushes_once() {
        let (sink, mut rx) = sink();
        let store = MemoryConfigStore::new_unsynced(sink);
        assert!(!store.has_synced());
        let rejected = store.replace_all(vec![
            vs("ns", "a", "a"),
            vs("ns", "b", "b"),
            gateway("ns", "gw"),
        ]);
        assert!(rejected.is_empty());
        store.mark_synced();
        let mut first = pushed(&mut rx).unwrap();
        first.sort();
        assert_eq!(first.len(), 3);

        // a unchanged, b changed, gw deleted, c added, d invalid, a given twice.
        let rejected = store.replace_all(vec![
            vs("ns", "a", "a"),
            vs("ns", "b", "b2"),
            vs("ns", "c", "c"),
            vs("ns", "d", "*"),
            vs("ns", "a", "other"),
        ]);
        let mut keys = pushed(&mut rx).unwrap();
        keys.sort();
        assert_eq!(
            keys,
            [
                key(ConfigKind::VirtualService, "ns", "b"),
                key(ConfigKind::VirtualService, "ns", "c"),
                key(ConfigKind::Gateway, "ns", "gw"),
            ]
            .map(String::from)
            .into_iter()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect::<Vec<_>>()
        );
        let names: Vec<&str> = rejected.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["a", "d"]);
        assert!(rejected[0].errors[0].contains("duplicate"));
        let all: Vec<String> = store
            .all()
            .iter()
            .map(|o| format!("{} {}", o.kind, o.name))
            .collect();
        assert_eq!(
            all,
            ["VirtualService a", "VirtualService b", "VirtualService c"]
        );
    }

    #[tokio::test]
    async fn changes_move_after_every_applied_change_and_on_sync() {
        let (sink, mut rx) = sink();
        let store = MemoryConfigStore::new_unsynced(sink);
        let mut changes = store.changes().expect("the memory store notifies");
        let generation = |rx: &mut watch::Receiver<u64>| *rx.borrow_and_update();
        assert_eq!(generation(&mut changes), 0);

        store.mark_synced();
        assert!(
            changes.has_changed().unwrap(),
            "becoming synced is a change"
        );
        let synced = generation(&mut changes);
        store.mark_synced();
        assert!(!changes.has_changed().unwrap(), "only once");

        store.apply(vs("ns", "a", "a")).unwrap();
        assert!(generation(&mut changes) > synced);
        store.apply(vs("ns", "a", "a")).unwrap();
        assert!(!changes.has_changed().unwrap(), "no change, no move");
        store.apply(vs("ns", "a", "*")).unwrap_err();
        assert!(
            !changes.has_changed().unwrap(),
            "a rejection changes nothing"
        );
        store.delete(Kind::VirtualService, "ns", "a");
        assert!(changes.has_changed().unwrap());
        generation(&mut changes);
        store.replace_all(vec![vs("ns", "b", "b")]);
        assert!(changes.has_changed().unwrap());
        pushed(&mut rx);
    }

    #[tokio::test]
    async fn service_and_workload_entries_are_left_to_their_registry() {
        use meshfed_api::networking::v1alpha3 as net;
        let (sink, mut rx) = sink();
        let store = MemoryConfigStore::new(sink);
        let mut changes = store.changes().unwrap();
        changes.borrow_and_update();
        let se = net::ServiceEntry {
            hosts: vec!["a.example.com".into()],
            ports: vec![net::ServicePort {
                number: 80,
                protocol: "HTTP".into(),
                name: "http".into(),
                target_port: 0,
            }],
            resolution: net::service_entry::Resolution::Dns as i32,
            ..Default::default()
        };
        store.apply(ConfigObject::new("ns", "se", se)).unwrap();
        let we = net::WorkloadEntry {
            address: "10.0.0.1".into(),
            ..Default::default()
        };
        store.apply(ConfigObject::new("ns", "we", we)).unwrap();
        assert_eq!(pushed(&mut rx), None, "no config push");
        assert!(
            changes.has_changed().unwrap(),
            "but the registry hears of it"
        );

        // Mixed with other kinds, only the other kinds are pushed.
        store.replace_all(vec![vs("ns", "a", "a")]);
        assert_eq!(
            pushed(&mut rx),
            Some(vec![key(ConfigKind::VirtualService, "ns", "a")])
        );
        assert_eq!(store.all().len(), 1);
    }
}
