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
    TlsMode, WorkloadInstance, WorkloadQuery,
};

use crate::config::KubeRegistryConfig;
use crate::convert::{
    ConvertedService, LABEL_CLUSTER, LABEL_HOSTNAME, LABEL_NETWORK, LABEL_REGION, LABEL_SUBZONE,
    LABEL_TLS_MODE, LABEL_ZONE, NamespaceInfo, NodeInfo, ObjectKey, PodInfo, SliceEndpoint,
    SliceInfo, TargetPort, health, pod_locality, service_hostname, spiffe_id,
};
use crate::registry::ResourceKind;

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
}

/// Everything the watchers delivered, in compact form, plus the indexes.
#[derive(Debug)]
pub(crate) struct ClusterState {
    config: Arc<KubeRegistryConfig>,
    services: HashMap<ObjectKey, ConvertedService>,
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
    namespaces: HashMap<Arc<str>, NamespaceInfo>,
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
    /// Pods changed since the last flush -> their IPs before the first change.
    changed_pods: HashMap<ObjectKey, Vec<IpAddr>>,
}

impl ClusterState {
    pub(crate) fn new(config: Arc<KubeRegistryConfig>) -> Self {
        ClusterState {
            config,
            services: HashMap::new(),
            slices: HashMap::new(),
            slices_by_service: HashMap::new(),
            pods: HashMap::new(),
            pods_by_ip: PodsByIp::default(),
            slices_by_pod: HashMap::new(),
            slices_by_ip: HashMap::new(),
            nodes: Arc::default(),
            namespaces: HashMap::new(),
            published: Arc::default(),
            dirty_services: BTreeSet::new(),
            dirty_endpoints: BTreeSet::new(),
            pending: HashMap::new(),
            pending_total: 0,
            pods_dirty: true,
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
            Some(next) => self.services.insert(key.clone(), next.clone()) != Some(next),
            None => self.services.remove(&key).is_some(),
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
        if old_locality == new_locality {
            return; // only external IPs changed: no endpoint or pod depends on them
        }
        self.pods_dirty = true;
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
        let old = match next {
            Some(next) => self.namespaces.insert(name.clone(), next),
            None => self.namespaces.remove(&name),
        };
        let network =
            |info: Option<&NamespaceInfo>| info.and_then(|n| n.labels.get(LABEL_NETWORK)).cloned();
        let new = self.namespaces.get(&name);
        if *name == *self.config.system_namespace && network(old.as_ref()) != network(new) {
            // The cluster's default network changed: every endpoint may change.
            self.dirty_endpoints.extend(self.services.keys().cloned());
            self.pods_dirty = true;
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

    /// Re-derives everything marked since the last flush.
    pub(crate) fn flush(&mut self) -> Flush {
        let mut out = Flush::default();
        let dirty_services = std::mem::take(&mut self.dirty_services);
        let mut view: Option<View> = None;
        for key in dirty_services {
            let mesh_key = self.service_key(&key);
            let desired = self
                .services
                .get(&key)
                .filter(|_| self.selected(key.namespace.as_str()));
            let current = self.published.services.get(&mesh_key);
            if current == desired {
                continue;
            }
            // Istio announces nothing about a service that is, and was, exported to
            // nobody (`exportTo: ~`).
            let silent = desired.is_some_and(ConvertedService::exported_to_none)
                && current.is_none_or(ConvertedService::exported_to_none);
            let view = view.get_or_insert_with(|| (*self.published).clone());
            match desired {
                Some(desired) => {
                    view.insert(mesh_key.clone(), desired.clone());
                    if !silent {
                        out.changed.push(mesh_key);
                    }
                    self.dirty_endpoints.insert(key);
                }
                None => {
                    view.remove(&mesh_key);
                    out.deleted.push(mesh_key);
                    self.set_pending(&key, 0);
                }
            }
        }
        if let Some(view) = view {
            let view = Arc::new(view);
            self.published = view.clone();
            out.view = Some(view);
        }
        if std::mem::take(&mut self.pods_dirty) {
            out.pods = Some(Arc::new(PodView {
                pods: self.pods_by_ip.clone(),
                nodes: self.nodes.clone(),
                default_network: self.default_network().cloned(),
            }));
        }
        // Taken, not drained: the initial sync fills it with every pod once.
        let mut changed_pods: Vec<PodChange> = std::mem::take(&mut self.changed_pods)
            .into_iter()
            .map(|(key, before)| PodChange {
                now: self
                    .pods
                    .get(&key)
                    .map(|p| p.ips.clone())
                    .unwrap_or_default(),
                key,
                before,
            })
            .collect();
        changed_pods.sort_by(|a, b| a.key.cmp(&b.key));
        out.changed_pods = changed_pods;
        for key in std::mem::take(&mut self.dirty_endpoints) {
            let mesh_key = self.service_key(&key);
            let Some(service) = self.published.services.get(&mesh_key) else {
                continue; // unpublished: its shard went with service_deleted
            };
            if service.exported_to_none() {
                continue; // Istio writes no endpoints for `exportTo: ~` services
            }
            let (endpoints, pending) = self.endpoints_of(&key, service);
            self.set_pending(&key, pending);
            out.endpoints.push((mesh_key, endpoints));
        }
        out
    }

    fn set_pending(&mut self, key: &ObjectKey, pending: usize) {
        let before = if pending == 0 {
            self.pending.remove(key).unwrap_or(0)
        } else {
            self.pending.insert(key.clone(), pending).unwrap_or(0)
        };
        self.pending_total = self.pending_total + pending - before;
    }

    /// All endpoints of one service: its slices of the service's IP family merged in
    /// slice-name order, de-duplicated by address (an endpoint moving between slices
    /// appears in both for a while; its ports are united). Returns the count of
    /// addresses skipped because their pod is not known yet.
    fn endpoints_of(&self, key: &ObjectKey, service: &ConvertedService) -> (Vec<Endpoint>, usize) {
        let mut by_address: BTreeMap<IpAddr, Endpoint> = BTreeMap::new();
        let mut pending = 0;
        let attributes = &service.attributes;
        for slice_name in self.slices_by_service.get(key).into_iter().flatten() {
            let slice_key = ObjectKey {
                namespace: key.namespace.clone(),
                name: slice_name.clone(),
            };
            let Some(slice) = self.slices.get(&slice_key) else {
                continue;
            };
            if slice.family != attributes.ip_family {
                continue;
            }
            for e in &slice.endpoints {
                let pod = match &e.pod {
                    Some(name) => {
                        let pod_key = ObjectKey {
                            namespace: key.namespace.clone(),
                            name: name.clone(),
                        };
                        match self.pods.get(&pod_key) {
                            Some(pod) => Some(&**pod),
                            None => {
                                // Istio skips it until the pod arrives; the pod's
                                // arrival re-evaluates this service.
                                pending += e.addresses.len();
                                continue;
                            }
                        }
                    }
                    None => e.addresses.first().and_then(|ip| {
                        self.pods_at(*ip)
                            .find(|(k, _)| k.namespace == key.namespace)
                            .map(|(_, p)| p)
                    }),
                };
                let health = health(e.conditions, attributes.persistent_sessions);
                for address in &e.addresses {
                    match by_address.entry(*address) {
                        Entry::Occupied(mut existing) => {
                            for (name, port) in &slice.ports {
                                existing
                                    .get_mut()
                                    .ports
                                    .entry(name.clone())
                                    .or_insert(*port);
                            }
                        }
                        Entry::Vacant(slot) => {
                            let mut endpoint =
                                self.endpoint(*address, key, pod, e.node_name.as_ref());
                            endpoint.health = health;
                            endpoint.ports = slice.ports.iter().cloned().collect();
                            slot.insert(endpoint);
                        }
                    }
                }
            }
        }
        (by_address.into_values().collect(), pending)
    }

    /// The endpoint for one address, with metadata from its pod and node (reference
    /// §2.4, §2.6, §2.7).
    fn endpoint(
        &self,
        address: IpAddr,
        service: &ObjectKey,
        pod: Option<&PodInfo>,
        slice_node: Option<&Arc<str>>,
    ) -> Endpoint {
        let config = &self.config;
        let mut endpoint = Endpoint::new(address);
        endpoint.cluster_id = config.cluster_id.clone();
        let mut labels = pod.map(|p| p.labels.clone()).unwrap_or_default();
        let node_name = pod.and_then(|p| p.node_name.as_ref()).or(slice_node);
        endpoint.locality = pod
            .and_then(|p| pod_locality(&p.labels))
            .or_else(|| {
                node_name
                    .and_then(|n| self.nodes.get(n))
                    .map(|n| n.locality.clone())
            })
            .unwrap_or_default();
        let network = labels
            .get(LABEL_NETWORK)
            .or_else(|| self.default_network())
            .cloned();
        endpoint.network = network.map(NetworkId::from).unwrap_or_default();
        endpoint.tls_mode = match labels.get(LABEL_TLS_MODE).map(String::as_str) {
            Some("istio") => TlsMode::Istio,
            _ => TlsMode::Disabled,
        };
        endpoint.service_account = pod
            .and_then(|p| p.service_account.as_deref())
            .map(|sa| spiffe_id(&config.trust_domain, service.namespace.as_str(), sa));
        add_topology_labels(
            &mut labels,
            &endpoint.locality,
            &config.cluster_id,
            node_name.map(|n| &**n),
            &endpoint.network,
        );
        endpoint.labels = labels;
        endpoint
    }

    /// The system namespace's network label: the network of workloads without one.
    fn default_network(&self) -> Option<&String> {
        self.namespaces
            .get(self.config.system_namespace.as_str())
            .and_then(|ns| ns.labels.get(LABEL_NETWORK))
    }
}

/// Adds the topology labels Istio gives every workload and proxy (reference §2.6):
/// region, zone and subzone when set, the cluster, the node, and the network unless
/// the workload names one itself.
fn add_topology_labels(
    labels: &mut BTreeMap<String, String>,
    locality: &Locality,
    cluster: &ClusterId,
    node: Option<&str>,
    network: &NetworkId,
) {
    for (label, value) in [
        (LABEL_REGION, &locality.region),
        (LABEL_ZONE, &locality.zone),
        (LABEL_SUBZONE, &locality.subzone),
    ] {
        if !value.is_empty() {
            labels.insert(label.to_string(), value.clone());
        }
    }
    labels.insert(LABEL_CLUSTER.to_string(), cluster.to_string());
    if let Some(node) = node {
        labels.insert(LABEL_HOSTNAME.to_string(), node.to_string());
    }
    if !network.is_empty() {
        labels
            .entry(LABEL_NETWORK.to_string())
            .or_insert_with(|| network.to_string());
    }
}

/// The workload a proxy runs as (reference §2.8), from the published views:
/// - its pod: the pod at one of the proxy's IPs; when several pods share them
///   (host-network pods), the one the proxy id `<pod>.<namespace>` names, in the
///   proxy's namespace; none if that leaves it ambiguous;
/// - its labels: the pod's, plus the topology labels (locality from the pod's label,
///   else its node; network from the pod's label, else the system namespace's);
/// - its targets: every service of the pod's namespace whose (non-empty) selector
///   matches the pod's labels, each port with its target port (a named one resolved
///   among the pod's container ports; a port whose name the pod lacks is skipped),
///   once per (target port, protocol) within a service.
///
/// The caller checks the proxy's cluster; this only looks.
pub(crate) fn find_workload(
    config: &KubeRegistryConfig,
    view: &View,
    pods: &PodView,
    query: &WorkloadQuery<'_>,
) -> Option<WorkloadInstance> {
    let mut candidates: Vec<&PodRef> = Vec::new();
    for ip in query.ips {
        for pod in pods.pods.get(ip) {
            if !candidates.iter().any(|c| c.0 == pod.0) {
                candidates.push(pod);
            }
        }
    }
    let named = candidates
        .iter()
        .find(|(key, _)| key.namespace.as_str() == query.namespace && names_pod(query.id, key));
    let (key, pod) = match (named, candidates.as_slice()) {
        (Some(pod), _) => *pod,
        (None, [only]) => *only,
        _ => return None,
    };

    let mut targets = Vec::new();
    for (service_key, service) in view.in_namespace(key.namespace.as_str()) {
        let selector = &service.attributes.selector;
        if selector.is_empty() || !selector.iter().all(|(k, v)| pod.labels.get(k) == Some(v)) {
            continue;
        }
        let mut seen: Vec<(u16, Protocol)> = Vec::new();
        let ports = service.attributes.target_ports.iter();
        for (target, port) in ports.zip(&service.service.ports) {
            let number = match &target.target {
                TargetPort::Number(n) => *n,
                TargetPort::Name(name) => {
                    match pod.named_ports.iter().find(|(n, _)| **n == **name) {
                        Some((_, number)) => *number,
                        None => continue,
                    }
                }
            };
            if seen.contains(&(number, port.protocol)) {
                continue;
            }
            seen.push((number, port.protocol));
            targets.push(ServiceTarget {
                service: service_key.clone(),
                port: target.port,
                target_port: number,
            });
        }
    }

    let node = pod.node_name.as_deref();
    let locality = pod_locality(&pod.labels)
        .or_else(|| {
            node.and_then(|n| pods.nodes.get(n))
                .map(|n| n.locality.clone())
        })
        .unwrap_or_default();
    let network = pod
        .labels
        .get(LABEL_NETWORK)
        .or(pods.default_network.as_ref())
        .map(NetworkId::new)
        .unwrap_or_default();
    let mut labels = pod.labels.clone();
    add_topology_labels(&mut labels, &locality, &config.cluster_id, node, &network);
    Some(WorkloadInstance {
        name: key.name.to_string(),
        namespace: key.namespace.clone(),
        cluster_id: config.cluster_id.clone(),
        labels,
        locality,
        service_account: pod
            .service_account
            .as_deref()
            .map(|sa| spiffe_id(&config.trust_domain, key.namespace.as_str(), sa)),
        targets,
    })
}

/// Whether a proxy id `<pod>.<namespace>` names this pod.
fn names_pod(id: &str, pod: &ObjectKey) -> bool {
    id.strip_suffix(pod.namespace.as_str())
        .and_then(|rest| rest.strip_suffix('.'))
        == Some(&*pod.name)
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

#[cfg(all(test, feature = "test-support"))]
mod tests {
    use super::*;
    use crate::convert::{
        convert_namespace, convert_node, convert_pod, convert_service, convert_slice,
    };
    use crate::fake_api::objects::{namespace, node, pod, service, slice, slice_endpoint};
    use meshfed_registry::HealthStatus;

    fn state() -> ClusterState {
        ClusterState::new(Arc::new(KubeRegistryConfig::new("c1")))
    }

    fn k(ns: &str, name: &str) -> ObjectKey {
        ObjectKey::new(ns, name)
    }

    fn add_service(s: &mut ClusterState, name: &str) {
        let svc = service("ns", name, "10.0.0.1", &[("http", 80)]);
        let converted = convert_service(&svc, &s.config).unwrap();
        s.apply(Update::Service(k("ns", name), Some(converted)));
    }

    fn add_pod(s: &mut ClusterState, name: &str, ip: &str) {
        let p = convert_pod(&pod("ns", name, "app", ip, "n1")).unwrap();
        s.apply(Update::Pod(k("ns", name), p));
    }

    fn add_slice(s: &mut ClusterState, name: &str, service: &str, eps: &[(&str, &str)]) {
        let info = convert_slice(&slice("ns", name, service, &[("http", 80)], eps)).unwrap();
        s.apply(Update::Slice(k("ns", name), info));
    }

    fn endpoints(flush: &Flush) -> Vec<(String, Vec<String>)> {
        flush
            .endpoints
            .iter()
            .map(|(key, eps)| {
                (
                    key.hostname.to_string(),
                    eps.iter().map(|e| e.address.to_string()).collect(),
                )
            })
            .collect()
    }

    #[test]
    fn a_late_pod_re_evaluates_only_its_service() {
        let mut s = state();
        add_service(&mut s, "a");
        add_service(&mut s, "b");
        add_slice(&mut s, "a-1", "a", &[("10.1.0.1", "a-1")]);
        let first = s.flush();
        assert_eq!(first.changed.len(), 2);
        assert_eq!(s.pending_pods(), 1);
        assert!(endpoints(&first).iter().all(|(_, eps)| eps.is_empty()));

        add_pod(&mut s, "a-1", "10.1.0.1");
        let next = s.flush();
        assert!(next.changed.is_empty() && next.view.is_none());
        assert_eq!(
            endpoints(&next),
            vec![(
                "a.ns.svc.cluster.local".to_string(),
                vec!["10.1.0.1".to_string()]
            )]
        );
        assert_eq!(s.pending_pods(), 0);

        // The same pod again (a status heartbeat): nothing to do.
        add_pod(&mut s, "a-1", "10.1.0.1");
        let idle = s.flush();
        assert!(idle.endpoints.is_empty() && idle.changed.is_empty());
    }

    #[test]
    fn slices_merge_by_address_and_only_the_service_family_counts() {
        let mut s = state();
        add_service(&mut s, "a");
        add_pod(&mut s, "a-1", "10.1.0.1");
        add_pod(&mut s, "a-2", "10.1.0.2");
        add_slice(&mut s, "a-x", "a", &[("10.1.0.1", "a-1")]);
        // The endpoint moving to another slice shows up in both for a while.
        let mut moved = slice("ns", "a-y", "a", &[("grpc", 90)], &[("10.1.0.1", "a-1")]);
        moved
            .endpoints
            .push(slice_endpoint("ns", "10.1.0.2", Some("a-2")));
        let mut terminating = slice_endpoint("ns", "10.1.0.3", None);
        terminating.conditions = Some(k8s_openapi::api::discovery::v1::EndpointConditions {
            ready: Some(false),
            serving: Some(true),
            terminating: Some(true),
        });
        moved.endpoints.push(terminating);
        s.apply(Update::Slice(
            k("ns", "a-y"),
            convert_slice(&moved).unwrap(),
        ));
        let mut v6 = slice("ns", "a-v6", "a", &[("http", 80)], &[]);
        v6.address_type = "IPv6".into();
        v6.endpoints.push(slice_endpoint("ns", "fd00::1", None));
        s.apply(Update::Slice(k("ns", "a-v6"), convert_slice(&v6).unwrap()));

        let flush = s.flush();
        let (_, eps) = &flush.endpoints[0];
        let addresses: Vec<String> = eps.iter().map(|e| e.address.to_string()).collect();
        assert_eq!(addresses, vec!["10.1.0.1", "10.1.0.2", "10.1.0.3"]);
        let first = &eps[0];
        assert_eq!(first.ports.get("http"), Some(&80));
        assert_eq!(first.ports.get("grpc"), Some(&90), "ports of both slices");
        assert_eq!(eps[2].health, HealthStatus::Terminating);
    }

    #[test]
    fn node_and_system_namespace_changes_reach_the_endpoints() {
        let mut s = state();
        add_service(&mut s, "a");
        add_pod(&mut s, "a-1", "10.1.0.1");
        add_slice(&mut s, "a-1", "a", &[("10.1.0.1", "a-1")]);
        s.apply(Update::Node(
            k("", "n1"),
            Some(convert_node(&node("n1", "r1", "z1"))),
        ));
        let eps = &s.flush().endpoints[0].1;
        assert_eq!(eps[0].locality.to_string(), "r1/z1/");

        // Only the external IP changes: no endpoint depends on it.
        let mut n = node("n1", "r1", "z1");
        n.status.as_mut().unwrap().addresses.as_mut().unwrap()[0].address = "192.0.2.9".into();
        s.apply(Update::Node(k("", "n1"), Some(convert_node(&n))));
        assert!(s.flush().endpoints.is_empty());

        s.apply(Update::Node(
            k("", "n1"),
            Some(convert_node(&node("n1", "r2", "z1"))),
        ));
        assert_eq!(s.flush().endpoints[0].1[0].locality.region, "r2");

        let system = namespace("istio-system", &[("topology.istio.io/network", "n-1")]);
        s.apply(Update::Namespace(
            k("", "istio-system"),
            Some(convert_namespace(&system)),
        ));
        assert_eq!(s.flush().endpoints[0].1[0].network.as_str(), "n-1");
    }

    #[test]
    fn services_exported_to_nobody_are_silent() {
        let mut s = state();
        let mut svc = service("ns", "hidden", "10.0.0.9", &[("http", 80)]);
        svc.metadata.annotations =
            Some([("networking.istio.io/exportTo".to_string(), "~".to_string())].into());
        let converted = convert_service(&svc, &s.config).unwrap();
        s.apply(Update::Service(k("ns", "hidden"), Some(converted)));
        let flush = s.flush();
        assert!(flush.view.is_some(), "readers still see it");
        assert!(flush.changed.is_empty() && flush.endpoints.is_empty());
        s.apply(Update::Service(k("ns", "hidden"), None));
        assert_eq!(s.flush().deleted.len(), 1);
    }

    /// A pod `name` in `ns` at `ip` with `labels` and a container port `web` = 9081.
    fn workload_pod(ns: &str, name: &str, ip: &str, labels: &[(&str, &str)]) -> PodInfo {
        let mut p = pod(ns, name, "unused", ip, "n1");
        p.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        p.spec.as_mut().unwrap().containers[0].ports =
            Some(vec![k8s_openapi::api::core::v1::ContainerPort {
                name: Some("web".into()),
                container_port: 9081,
                ..Default::default()
            }]);
        // Not ready: what matters is that it exists, not that a slice lists it.
        p.status.as_mut().unwrap().conditions =
            Some(vec![k8s_openapi::api::core::v1::PodCondition {
                type_: "Ready".into(),
                status: "False".into(),
                ..Default::default()
            }]);
        convert_pod(&p).unwrap().unwrap()
    }

    /// Service `name` in `ns` selecting `app=<app>`, with (port name, port, targetPort)
    /// ports; a target that does not parse as a number is a named port.
    fn selecting_service(
        s: &mut ClusterState,
        ns: &str,
        name: &str,
        app: &str,
        ports: &[(&str, i32, &str)],
    ) {
        use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
        let plain: Vec<(&str, i32)> = ports.iter().map(|(n, p, _)| (*n, *p)).collect();
        let mut svc = service(ns, name, "10.0.0.1", &plain);
        let spec = svc.spec.as_mut().unwrap();
        spec.selector = Some([("app".to_string(), app.to_string())].into());
        for (port, (_, _, target)) in spec.ports.as_mut().unwrap().iter_mut().zip(ports) {
            port.target_port = Some(match target.parse::<i32>() {
                Ok(n) => IntOrString::Int(n),
                Err(_) => IntOrString::String(target.to_string()),
            });
        }
        let converted = convert_service(&svc, &s.config).unwrap();
        s.apply(Update::Service(k(ns, name), Some(converted)));
    }

    fn find(s: &ClusterState, ips: &[&str], id: &str, ns: &str) -> Option<WorkloadInstance> {
        let ips: Vec<IpAddr> = ips.iter().map(|ip| ip.parse().unwrap()).collect();
        let pods = PodView {
            pods: s.pods_by_ip.clone(),
            nodes: s.nodes.clone(),
            default_network: s.default_network().cloned(),
        };
        find_workload(
            &s.config,
            &s.published,
            &pods,
            &WorkloadQuery {
                ips: &ips,
                id,
                namespace: ns,
                cluster: None,
            },
        )
    }

    fn targets(w: &WorkloadInstance) -> Vec<(String, u16, u16)> {
        w.targets
            .iter()
            .map(|t| (t.service.hostname.to_string(), t.port, t.target_port))
            .collect()
    }

    #[test]
    fn a_pod_is_served_by_the_services_selecting_it_with_target_ports_resolved() {
        let mut s = state();
        s.apply(Update::Node(
            k("", "n1"),
            Some(convert_node(&node("n1", "r1", "z1"))),
        ));
        selecting_service(
            &mut s,
            "ns",
            "reviews",
            "reviews",
            // A named target, a numeric one, a name the pod lacks, and a port landing
            // on the same target port and protocol as the first (kept once).
            &[
                ("http", 9080, "web"),
                ("grpc", 7070, "7071"),
                ("http-admin", 15000, "admin"),
                ("http-alt", 8080, "9081"),
            ],
        );
        selecting_service(&mut s, "ns", "other", "other", &[("http", 80, "80")]);
        // The same selector in another namespace does not select the pod.
        selecting_service(
            &mut s,
            "elsewhere",
            "reviews",
            "reviews",
            &[("http", 80, "80")],
        );
        s.apply(Update::Pod(
            k("ns", "reviews-1"),
            Some(workload_pod(
                "ns",
                "reviews-1",
                "10.1.0.5",
                &[("app", "reviews")],
            )),
        ));
        s.flush();

        let w = find(&s, &["10.1.0.5"], "reviews-1.ns", "ns").expect("the pod");
        assert_eq!(
            targets(&w),
            vec![
                ("reviews.ns.svc.cluster.local".to_string(), 9080, 9081),
                ("reviews.ns.svc.cluster.local".to_string(), 7070, 7071),
            ]
        );
        assert_eq!((w.name.as_str(), w.namespace.as_str()), ("reviews-1", "ns"));
        assert_eq!(w.cluster_id.as_str(), "c1");
        assert_eq!(w.labels["app"], "reviews");
        assert_eq!(w.labels[LABEL_ZONE], "z1", "topology from the node");
        assert_eq!(w.labels[LABEL_CLUSTER], "c1");
        assert_eq!(w.labels[LABEL_HOSTNAME], "n1");
        assert_eq!(w.locality.to_string(), "r1/z1/");
        assert_eq!(
            w.service_account.as_deref(),
            Some("spiffe://cluster.local/ns/ns/sa/unused")
        );
        // Found by IP whatever the id says; unknown IPs find nothing.
        assert!(find(&s, &["10.1.0.5"], "whatever", "ns").is_some());
        assert!(find(&s, &["10.9.9.9"], "reviews-1.ns", "ns").is_none());
    }

    #[test]
    fn a_pod_whose_labels_no_service_selects_has_no_targets() {
        let mut s = state();
        selecting_service(&mut s, "ns", "reviews", "reviews", &[("http", 80, "80")]);
        s.apply(Update::Pod(
            k("ns", "lonely"),
            Some(workload_pod(
                "ns",
                "lonely",
                "10.1.0.6",
                &[("app", "lonely")],
            )),
        ));
        s.flush();
        let w = find(&s, &["10.1.0.6"], "lonely.ns", "ns").unwrap();
        assert!(w.targets.is_empty());
        assert_eq!(w.labels["app"], "lonely");
    }

    #[test]
    fn pods_sharing_an_ip_are_told_apart_by_the_proxy_id() {
        let mut s = state();
        for name in ["a", "b"] {
            s.apply(Update::Pod(
                k("ns", name),
                Some(workload_pod("ns", name, "10.1.0.7", &[("app", name)])),
            ));
        }
        s.flush();
        let found = |id: &str, ns: &str| find(&s, &["10.1.0.7"], id, ns).map(|w| w.name);
        assert_eq!(found("b.ns", "ns").as_deref(), Some("b"));
        assert_eq!(found("a.ns", "ns").as_deref(), Some("a"));
        assert_eq!(
            found("b.ns", "other"),
            None,
            "the id must match the namespace"
        );
        assert_eq!(found("c.ns", "ns"), None, "ambiguous: no pod");
    }

    #[test]
    fn pod_changes_publish_the_pod_view_and_name_the_pod() {
        let mut s = state();
        s.flush();
        let p = |labels: &[(&str, &str)]| workload_pod("ns", "p", "10.1.0.8", labels);
        s.apply(Update::Pod(k("ns", "p"), Some(p(&[("app", "a")]))));
        let flush = s.flush();
        assert!(flush.pods.is_some());
        let ip: IpAddr = "10.1.0.8".parse().unwrap();
        assert_eq!(
            flush.changed_pods,
            vec![PodChange {
                key: k("ns", "p"),
                before: vec![],
                now: vec![ip],
            }]
        );
        // The same pod again: nothing.
        s.apply(Update::Pod(k("ns", "p"), Some(p(&[("app", "a")]))));
        let idle = s.flush();
        assert!(idle.pods.is_none() && idle.changed_pods.is_empty());
        // A label change, then deletion.
        s.apply(Update::Pod(k("ns", "p"), Some(p(&[("app", "b")]))));
        let flush = s.flush();
        let published = flush.pods.unwrap();
        assert_eq!(published.pods.get(&ip)[0].1.labels["app"], "b");
        assert_eq!(flush.changed_pods[0].before, vec![ip]);
        s.apply(Update::Pod(k("ns", "p"), None));
        let flush = s.flush();
        assert!(flush.pods.unwrap().pods.get(&ip).is_empty());
        assert_eq!(flush.changed_pods[0].now, Vec::<IpAddr>::new());
        // The earlier published view is untouched (copy on write).
        assert_eq!(published.pods.get(&ip).len(), 1);
    }
}
