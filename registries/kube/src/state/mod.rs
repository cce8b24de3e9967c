//! The registry's state: compact copies of every watched object, the indexes between
//! them, and the view published to readers. Sans-IO: the writer task feeds
//! [`Update`]s in and takes a [`Flush`] out, which says exactly which services were
//! added, changed or deleted and which services' endpoints must be rewritten. Tests
//! drive it with literal updates.
//!
//! Nothing is pushed for an object whose compact form did not change (a pod status
//! heartbeat, a node condition), and an endpoint recomputation is scheduled only for
//! the services whose slices, pods, nodes or namespace settings actually changed.
//!
//! Two views are published to readers: [`View`] (the services) and [`PodView`] (pods by
//! IP plus the topology their labels are completed with), from which
//! [`find_workload`] answers "which pod is this proxy" without the writer.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::net::IpAddr;
use std::sync::Arc;

use meshfed_registry::{
    ClusterId, Endpoint, Locality, Namespace, NetworkId, Protocol, ServiceKey, ServiceTarget,
    TlsMode, WorkloadInstance, WorkloadKind, WorkloadMeta, WorkloadQuery,
};

use meshfed_registry::workload_instances::WorkloadEntrySet;

use crate::config::KubeRegistryConfig;
use crate::convert::{
    ConvertedService, LABEL_CLUSTER, LABEL_DATAPLANE_MODE, LABEL_HOSTNAME, LABEL_NETWORK,
    LABEL_REGION, LABEL_SUBZONE, LABEL_TLS_MODE, LABEL_USE_WAYPOINT, LABEL_USE_WAYPOINT_NAMESPACE,
    LABEL_ZONE, NamespaceInfo, NodeInfo, ObjectKey, PodInfo, SliceEndpoint, SliceInfo, TargetPort,
    health, pod_locality, service_hostname, spiffe_id,
};
use crate::resource_kind::ResourceKind;

mod endpoints;
#[cfg(all(test, feature = "test-support"))]
mod tests;
mod workload;
mod workload_entries;
#[cfg(all(test, feature = "test-support"))]
mod workload_entries_tests;

use workload::add_topology_labels;
pub(crate) use workload::{find_workload, pod_workloads};

/// One object's new compact state; `None` means it is gone (deleted, or no longer
/// something the registry reads, such as a Failed pod).
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Update {
    Service(ObjectKey, Option<ConvertedService>),
    Slice(ObjectKey, Option<SliceInfo>),
    Pod(ObjectKey, Option<PodInfo>),
    Node(ObjectKey, Option<NodeInfo>),
    Namespace(ObjectKey, Option<NamespaceInfo>),
}

impl Update {
    /// The update that removes `key` of `kind`.
    pub(crate) fn removal(kind: ResourceKind, key: ObjectKey) -> Update {
        match kind {
            ResourceKind::Service => Update::Service(key, None),
            ResourceKind::EndpointSlice => Update::Slice(key, None),
            ResourceKind::Pod => Update::Pod(key, None),
            ResourceKind::Node => Update::Node(key, None),
            ResourceKind::Namespace => Update::Namespace(key, None),
        }
    }
}

/// The published services, keyed by mesh key. Readers hold an `Arc` of it.
#[derive(Clone, Debug, Default)]
pub(crate) struct View {
    pub(crate) services: BTreeMap<ServiceKey, ConvertedService>,
    /// Namespace -> its services' keys (a proxy's pod is matched against the services
    /// of its own namespace only).
    by_namespace: HashMap<Namespace, BTreeSet<ServiceKey>>,
}

impl View {
    fn insert(&mut self, key: ServiceKey, service: ConvertedService) {
        self.by_namespace
            .entry(key.namespace.clone())
            .or_default()
            .insert(key.clone());
        self.services.insert(key, service);
    }

    fn remove(&mut self, key: &ServiceKey) {
        self.services.remove(key);
        remove_from(&mut self.by_namespace, &key.namespace, key);
    }

    /// The services of one namespace, in key order.
    fn in_namespace<'a>(
        &'a self,
        namespace: &str,
    ) -> impl Iterator<Item = (&'a ServiceKey, &'a ConvertedService)> + 'a {
        self.by_namespace
            .get(namespace)
            .into_iter()
            .flatten()
            .filter_map(|key| self.services.get(key).map(|s| (key, s)))
    }
}

/// How many shards [`PodsByIp`] splits the pods into.
const POD_SHARDS: usize = 64;

/// One pod as the IP index holds it.
pub(crate) type PodRef = (ObjectKey, Arc<PodInfo>);

/// Pods by IP (host-network pods share their node's IP), in shards that are copied on
/// write. Publishing the index to readers clones the shard pointers only; the writer's
/// next change to a shard then copies that shard alone (about 1/64 of the pods), so a
/// pod event never copies the whole index.
#[derive(Clone, Debug)]
pub(crate) struct PodsByIp {
    shards: Vec<Arc<HashMap<IpAddr, Vec<PodRef>>>>,
}

impl Default for PodsByIp {
    fn default() -> Self {
        PodsByIp {
            shards: (0..POD_SHARDS).map(|_| Arc::default()).collect(),
        }
    }
}

impl PodsByIp {
    fn shard(ip: &IpAddr) -> usize {
        let mut hasher = std::hash::DefaultHasher::new();
        ip.hash(&mut hasher);
        (hasher.finish() % POD_SHARDS as u64) as usize
    }

    /// Every pod, once per IP it has, with that IP.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&IpAddr, &PodRef)> {
        self.shards
            .iter()
            .flat_map(|shard| shard.iter())
            .flat_map(|(ip, pods)| pods.iter().map(move |p| (ip, p)))
    }

    /// The pods at `ip`.
    pub(crate) fn get(&self, ip: &IpAddr) -> &[PodRef] {
        self.shards[Self::shard(ip)]
            .get(ip)
            .map_or(&[], Vec::as_slice)
    }

    fn insert(&mut self, ip: IpAddr, pod: PodRef) {
        let shard = Arc::make_mut(&mut self.shards[Self::shard(&ip)]);
        shard.entry(ip).or_default().push(pod);
    }

    fn remove(&mut self, ip: &IpAddr, key: &ObjectKey) {
        let i = Self::shard(ip);
        if !self.shards[i].contains_key(ip) {
            return; // nothing to remove: do not copy a shared shard for it
        }
        let shard = Arc::make_mut(&mut self.shards[i]);
        if let Some(pods) = shard.get_mut(ip) {
            pods.retain(|(k, _)| k != key);
            if pods.is_empty() {
                shard.remove(ip);
            }
        }
    }
}

/// What readers need to find a proxy's own pod ([`find_workload`]): the pods by IP and
/// the topology their labels are completed with. Published apart from [`View`] since
/// pods change far more often than services.
#[derive(Clone, Debug, Default)]
pub(crate) struct PodView {
    pub(crate) pods: PodsByIp,
    /// Nodes, for the locality of pods without a locality label.
    pub(crate) nodes: Arc<HashMap<Arc<str>, NodeInfo>>,
    /// The `topology.istio.io/network` label of the system namespace: the network of
    /// pods without a network label.
    pub(crate) default_network: Option<String>,
    /// Namespaces (their ambient labels complete a pod's workload record).
    pub(crate) namespaces: Arc<HashMap<Arc<str>, NamespaceInfo>>,
}

/// A pod whose compact form changed since the last flush.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct PodChange {
    pub(crate) key: ObjectKey,
    /// Its IPs before the change.
    pub(crate) before: Vec<IpAddr>,
    /// Its IPs now; empty when it is gone.
    pub(crate) now: Vec<IpAddr>,
}

/// What the writer must tell the push pipeline after a batch of updates, in this order:
/// publish `view`, delete, announce changed services, write endpoints.
#[derive(Debug, Default)]
pub(crate) struct Flush {
    /// The new reader view, when the set of published services changed.
    pub(crate) view: Option<Arc<View>>,
    /// Services no longer published.
    pub(crate) deleted: Vec<ServiceKey>,
    /// Services added or changed.
    pub(crate) changed: Vec<ServiceKey>,
    /// Full endpoint lists of the services whose endpoints may have changed.
    pub(crate) endpoints: Vec<(ServiceKey, Vec<Endpoint>)>,
    /// The new pod view, when pods or their topology changed (published before the
    /// services view is told about).
    pub(crate) pods: Option<Arc<PodView>>,
    /// Pods that changed, sorted by key: a proxy running as one needs a push.
    pub(crate) changed_pods: Vec<PodChange>,
    /// A node changed: NodePort gateways are read again.
    pub(crate) nodes_changed: bool,
}

/// Everything the watchers delivered, in compact form, plus the indexes.
#[derive(Debug)]
pub(crate) struct ClusterState {
    config: Arc<KubeRegistryConfig>,
    services: HashMap<ObjectKey, ConvertedService>,
    /// Namespace -> names of its services (the Services a WorkloadEntry may join).
    services_by_namespace: HashMap<Namespace, BTreeSet<Arc<str>>>,
    /// The WorkloadEntries Services select, by namespace.
    workload_entries: Arc<WorkloadEntrySet>,
    slices: HashMap<ObjectKey, SliceInfo>,
    /// Service (namespace, name) -> names of its slices, sorted so merging is stable.
    slices_by_service: HashMap<ObjectKey, BTreeSet<Arc<str>>>,
    /// Pods, shared with the IP index and the published [`PodView`].
    pods: HashMap<ObjectKey, Arc<PodInfo>>,
    /// Pod IP -> pods: endpoints without a `targetRef` and proxies find pods by it.
    pods_by_ip: PodsByIp,
    /// Pod -> slices naming it in a `targetRef`, present or not: a pod that arrives after
    /// its slice re-evaluates exactly these.
    slices_by_pod: HashMap<ObjectKey, Vec<ObjectKey>>,
    /// (namespace, IP) -> slices with an endpoint at that IP but no pod `targetRef`
    /// (host-network or hand-written slices, matched to pods by IP).
    slices_by_ip: HashMap<(Namespace, IpAddr), Vec<ObjectKey>>,
    /// Copied on write, since the published [`PodView`] shares it.
    nodes: Arc<HashMap<Arc<str>, NodeInfo>>,
    /// Copied on write, since the published [`PodView`] shares it.
    namespaces: Arc<HashMap<Arc<str>, NamespaceInfo>>,
    /// What readers see; only services in selected namespaces.
    published: Arc<View>,
    /// Services whose published form must be re-derived.
    dirty_services: BTreeSet<ObjectKey>,
    /// Services whose endpoints must be recomputed.
    dirty_endpoints: BTreeSet<ObjectKey>,
    /// Endpoint addresses skipped because their pod is not known yet, per service.
    pending: HashMap<ObjectKey, usize>,
    pending_total: usize,
    /// The pod view must be republished.
    pods_dirty: bool,
    /// A node changed since the last flush (NodePort gateways may have).
    nodes_changed: bool,
    /// Pods changed since the last flush -> their IPs before the first change.
    changed_pods: HashMap<ObjectKey, Vec<IpAddr>>,
}

impl ClusterState {
    pub(crate) fn new(config: Arc<KubeRegistryConfig>) -> Self {
        ClusterState {
            config,
            services: HashMap::new(),
            services_by_namespace: HashMap::new(),
            workload_entries: Arc::default(),
            slices: HashMap::new(),
            slices_by_service: HashMap::new(),
            pods: HashMap::new(),
            pods_by_ip: PodsByIp::default(),
            slices_by_pod: HashMap::new(),
            slices_by_ip: HashMap::new(),
            nodes: Arc::default(),
            namespaces: Arc::default(),
            published: Arc::default(),
            dirty_services: BTreeSet::new(),
            dirty_endpoints: BTreeSet::new(),
            pending: HashMap::new(),
            pending_total: 0,
            pods_dirty: true,
            nodes_changed: false,
            changed_pods: HashMap::new(),
        }
    }

    /// How many objects of a kind are held.
    pub(crate) fn count(&self, kind: ResourceKind) -> usize {
        match kind {
            ResourceKind::Service => self.services.len(),
            ResourceKind::EndpointSlice => self.slices.len(),
            ResourceKind::Pod => self.pods.len(),
            ResourceKind::Node => self.nodes.len(),
            ResourceKind::Namespace => self.namespaces.len(),
        }
    }

    /// Endpoint addresses waiting for their pod.
    pub(crate) fn pending_pods(&self) -> usize {
        self.pending_total
    }

    /// Whether an object is held.
    pub(crate) fn contains(&self, kind: ResourceKind, key: &ObjectKey) -> bool {
        match kind {
            ResourceKind::Service => self.services.contains_key(key),
            ResourceKind::EndpointSlice => self.slices.contains_key(key),
            ResourceKind::Pod => self.pods.contains_key(key),
            ResourceKind::Node => self.nodes.contains_key(&key.name),
            ResourceKind::Namespace => self.namespaces.contains_key(&key.name),
        }
    }

    /// The keys held for a kind (a relist deletes those it no longer sees).
    pub(crate) fn keys(&self, kind: ResourceKind) -> Vec<ObjectKey> {
        let named = |names: &mut dyn Iterator<Item = &Arc<str>>| -> Vec<ObjectKey> {
            names.map(|n| ObjectKey::new("", n)).collect()
        };
        match kind {
            ResourceKind::Service => self.services.keys().cloned().collect(),
            ResourceKind::EndpointSlice => self.slices.keys().cloned().collect(),
            ResourceKind::Pod => self.pods.keys().cloned().collect(),
            ResourceKind::Node => named(&mut self.nodes.keys()),
            ResourceKind::Namespace => named(&mut self.namespaces.keys()),
        }
    }

    /// The pods at an IP (for endpoints without a `targetRef`).
    pub(crate) fn pods_at(&self, ip: IpAddr) -> impl Iterator<Item = (&ObjectKey, &PodInfo)> {
        self.pods_by_ip.get(&ip).iter().map(|(k, p)| (k, &**p))
    }

    /// Applies one update; records what must be re-derived at the next flush.
    pub(crate) fn apply(&mut self, update: Update) {
        match update {
            Update::Service(key, next) => self.apply_service(key, next),
            Update::Slice(key, next) => self.apply_slice(key, next),
            Update::Pod(key, next) => self.apply_pod(key, next),
            Update::Node(key, next) => self.apply_node(key.name, next),
            Update::Namespace(key, next) => self.apply_namespace(key.name, next),
        }
    }

    fn apply_service(&mut self, key: ObjectKey, next: Option<ConvertedService>) {
        let changed = match next {
            Some(next) => {
                self.services_by_namespace
                    .entry(key.namespace.clone())
                    .or_default()
                    .insert(key.name.clone());
                self.services.insert(key.clone(), next.clone()) != Some(next)
            }
            None => {
                remove_from(&mut self.services_by_namespace, &key.namespace, &key.name);
                self.services.remove(&key).is_some()
            }
        };
        if changed {
            self.dirty_services.insert(key.clone());
            self.dirty_endpoints.insert(key);
        }
    }

    fn apply_slice(&mut self, key: ObjectKey, next: Option<SliceInfo>) {
        if self.slices.get(&key) == next.as_ref() {
            return;
        }
        if let Some(old) = self.slices.remove(&key) {
            self.unindex_slice(&key, &old);
        }
        if let Some(next) = next {
            self.index_slice(&key, &next);
            self.slices.insert(key, next);
        }
    }

    fn index_slice(&mut self, key: &ObjectKey, slice: &SliceInfo) {
        let service = ObjectKey {
            namespace: key.namespace.clone(),
            name: slice.service.clone(),
        };
        self.slices_by_service
            .entry(service.clone())
            .or_default()
            .insert(key.name.clone());
        for e in &slice.endpoints {
            for target in self.targets(key, e) {
                let slices = match target {
                    Target::Pod(pod) => self.slices_by_pod.entry(pod).or_default(),
                    Target::Ip(ns_ip) => self.slices_by_ip.entry(ns_ip).or_default(),
                };
                // A short list (usually one slice): cheaper than a set per pod.
                if !slices.contains(key) {
                    slices.push(key.clone());
                }
            }
        }
        self.dirty_endpoints.insert(service);
    }

    fn unindex_slice(&mut self, key: &ObjectKey, slice: &SliceInfo) {
        let service = ObjectKey {
            namespace: key.namespace.clone(),
            name: slice.service.clone(),
        };
        remove_from(&mut self.slices_by_service, &service, &key.name);
        for e in &slice.endpoints {
            for target in self.targets(key, e) {
                match target {
                    Target::Pod(pod) => remove_from_vec(&mut self.slices_by_pod, &pod, key),
                    Target::Ip(ns_ip) => remove_from_vec(&mut self.slices_by_ip, &ns_ip, key),
                }
            }
        }
        self.dirty_endpoints.insert(service);
    }

    fn targets(&self, slice: &ObjectKey, e: &SliceEndpoint) -> Vec<Target> {
        match &e.pod {
            Some(pod) => vec![Target::Pod(ObjectKey {
                namespace: slice.namespace.clone(),
                name: pod.clone(),
            })],
            None => e
                .addresses
                .iter()
                .map(|ip| Target::Ip((slice.namespace.clone(), *ip)))
                .collect(),
        }
    }

    fn apply_pod(&mut self, key: ObjectKey, next: Option<PodInfo>) {
        if self.pods.get(&key).map(|p| &**p) == next.as_ref() {
            return;
        }
        let next = next.map(Arc::new);
        let old = match &next {
            Some(next) => self.pods.insert(key.clone(), next.clone()),
            None => self.pods.remove(&key),
        };
        self.pods_dirty = true;
        self.changed_pods
            .entry(key.clone())
            .or_insert_with(|| old.as_ref().map(|o| o.ips.clone()).unwrap_or_default());
        let mut ips: BTreeSet<IpAddr> = BTreeSet::new();
        if let Some(old) = &old {
            for ip in &old.ips {
                self.pods_by_ip.remove(ip, &key);
                ips.insert(*ip);
            }
        }
        if let Some(next) = &next {
            for ip in &next.ips {
                self.pods_by_ip.insert(*ip, (key.clone(), next.clone()));
                ips.insert(*ip);
            }
        }
        let mut slices: BTreeSet<ObjectKey> = self
            .slices_by_pod
            .get(&key)
            .into_iter()
            .flatten()
            .cloned()
            .collect();
        for ip in ips {
            if let Some(by_ip) = self.slices_by_ip.get(&(key.namespace.clone(), ip)) {
                slices.extend(by_ip.iter().cloned());
            }
        }
        self.mark_slices(slices.iter());
    }

    fn mark_slices<'a>(&mut self, slices: impl Iterator<Item = &'a ObjectKey>) {
        for slice_key in slices {
            if let Some(slice) = self.slices.get(slice_key) {
                self.dirty_endpoints.insert(ObjectKey {
                    namespace: slice_key.namespace.clone(),
                    name: slice.service.clone(),
                });
            }
        }
    }

    fn apply_node(&mut self, name: Arc<str>, next: Option<NodeInfo>) {
        if self.nodes.get(&name) == next.as_ref() {
            return;
        }
        let nodes = Arc::make_mut(&mut self.nodes);
        let old_locality = match next {
            Some(next) => nodes.insert(name.clone(), next.clone()).map(|o| o.locality),
            None => nodes.remove(&name).map(|o| o.locality),
        };
        let new_locality = self.nodes.get(&name).map(|n| n.locality.clone());
        // The pod view carries the nodes, which NodePort gateways are read from.
        self.pods_dirty = true;
        self.nodes_changed = true;
        if old_locality == new_locality {
            return; // only external IPs or labels changed: no endpoint depends on them
        }
        // Rare (node labels seldom change): scan for endpoints placed on the node.
        let on_node: Vec<ObjectKey> = self
            .slices
            .iter()
            .filter(|(key, slice)| {
                slice.endpoints.iter().any(|e| {
                    let pod_node = e.pod.as_ref().and_then(|p| {
                        let pod_key = ObjectKey {
                            namespace: key.namespace.clone(),
                            name: p.clone(),
                        };
                        self.pods.get(&pod_key).and_then(|p| p.node_name.clone())
                    });
                    pod_node.or_else(|| e.node_name.clone()).as_ref() == Some(&name)
                })
            })
            .map(|(key, _)| key.clone())
            .collect();
        self.mark_slices(on_node.iter());
    }

    fn apply_namespace(&mut self, name: Arc<str>, next: Option<NamespaceInfo>) {
        if self.namespaces.get(&name) == next.as_ref() {
            return;
        }
        let namespaces = Arc::make_mut(&mut self.namespaces);
        let old = match next {
            Some(next) => namespaces.insert(name.clone(), next),
            None => namespaces.remove(&name),
        };
        // The pod view carries the namespaces (pods' workload records read them).
        self.pods_dirty = true;
        let network =
            |info: Option<&NamespaceInfo>| info.and_then(|n| n.labels.get(LABEL_NETWORK)).cloned();
        let new = self.namespaces.get(&name);
        if *name == *self.config.system_namespace && network(old.as_ref()) != network(new) {
            // The cluster's default network changed: every endpoint may change.
            self.dirty_endpoints.extend(self.services.keys().cloned());
            self.pods_dirty = true;
        }
        let ambient = |info: Option<&NamespaceInfo>| {
            [
                LABEL_DATAPLANE_MODE,
                LABEL_USE_WAYPOINT,
                LABEL_USE_WAYPOINT_NAMESPACE,
            ]
            .map(|k| info.and_then(|n| n.labels.get(k)).cloned())
        };
        if ambient(old.as_ref()) != ambient(new) {
            // Pods inherit these labels: their endpoints' workload records change.
            let in_namespace: Vec<ObjectKey> = self
                .services
                .keys()
                .filter(|k| k.namespace.as_str() == &*name)
                .cloned()
                .collect();
            self.dirty_endpoints.extend(in_namespace);
        }
        // Selection may have changed: re-derive the namespace's services.
        // (Published services are a subset of `services` plus those already dirty.)
        let in_namespace = self
            .services
            .keys()
            .filter(|k| k.namespace.as_str() == &*name)
            .cloned()
            .collect::<Vec<_>>();
        self.dirty_services.extend(in_namespace);
    }

    fn selected(&self, namespace: &str) -> bool {
        self.config
            .namespaces
            .selects(namespace, self.namespaces.get(namespace).map(|n| &n.labels))
    }

    fn service_key(&self, key: &ObjectKey) -> ServiceKey {
        ServiceKey::new(
            service_hostname(&key.name, key.namespace.as_str(), &self.config.domain),
            key.namespace.clone(),
        )
    }
}

/// What a slice endpoint points at, for the reverse indexes.
enum Target {
    Pod(ObjectKey),
    Ip((Namespace, IpAddr)),
}

fn remove_from<K, V>(map: &mut HashMap<K, BTreeSet<V>>, key: &K, value: &V)
where
    K: std::hash::Hash + Eq,
    V: Ord,
{
    if let Some(set) = map.get_mut(key) {
        set.remove(value);
        if set.is_empty() {
            map.remove(key);
        }
    }
}

fn remove_from_vec<K, V>(map: &mut HashMap<K, Vec<V>>, key: &K, value: &V)
where
    K: std::hash::Hash + Eq,
    V: PartialEq,
{
    if let Some(list) = map.get_mut(key) {
        list.retain(|v| v != value);
        if list.is_empty() {
            map.remove(key);
        }
    }
}
