//! The registry's state: compact copies of every watched object, the indexes between
//! them, and the view published to readers. Sans-IO: the writer task feeds
//! [`Update`]s in and takes a [`Flush`] out, which says exactly which services were
//! added, changed or deleted and which services' endpoints must be rewritten. Tests
//! drive it with literal updates.
//!
//! Nothing is pushed for an object whose compact form did not change (a pod status
//! heartbeat, a node condition), and an endpoint recomputation is scheduled only for
//! the services whose slices, pods, nodes or namespace settings actually changed.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use meshfed_registry::{Endpoint, Namespace, NetworkId, ServiceKey, TlsMode};

use crate::config::KubeRegistryConfig;
use crate::convert::{
    ConvertedService, LABEL_CLUSTER, LABEL_HOSTNAME, LABEL_NETWORK, LABEL_REGION, LABEL_SUBZONE,
    LABEL_TLS_MODE, LABEL_ZONE, NamespaceInfo, NodeInfo, ObjectKey, PodInfo, SliceEndpoint,
    SliceInfo, health, pod_locality, service_hostname, spiffe_id,
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
}

/// Everything the watchers delivered, in compact form, plus the indexes.
#[derive(Debug)]
pub(crate) struct ClusterState {
    config: Arc<KubeRegistryConfig>,
    services: HashMap<ObjectKey, ConvertedService>,
    slices: HashMap<ObjectKey, SliceInfo>,
    /// Service (namespace, name) -> names of its slices, sorted so merging is stable.
    slices_by_service: HashMap<ObjectKey, BTreeSet<Arc<str>>>,
    pods: HashMap<ObjectKey, PodInfo>,
    /// Pod IP -> pods (host-network pods share their node's IP). Also what a proxy's
    /// own pod will be found by.
    pods_by_ip: HashMap<IpAddr, Vec<ObjectKey>>,
    /// Pod -> slices naming it in a `targetRef`, present or not: a pod that arrives after
    /// its slice re-evaluates exactly these.
    slices_by_pod: HashMap<ObjectKey, Vec<ObjectKey>>,
    /// (namespace, IP) -> slices with an endpoint at that IP but no pod `targetRef`
    /// (host-network or hand-written slices, matched to pods by IP).
    slices_by_ip: HashMap<(Namespace, IpAddr), Vec<ObjectKey>>,
    nodes: HashMap<Arc<str>, NodeInfo>,
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
}

impl ClusterState {
    pub(crate) fn new(config: Arc<KubeRegistryConfig>) -> Self {
        ClusterState {
            config,
            services: HashMap::new(),
            slices: HashMap::new(),
            slices_by_service: HashMap::new(),
            pods: HashMap::new(),
            pods_by_ip: HashMap::new(),
            slices_by_pod: HashMap::new(),
            slices_by_ip: HashMap::new(),
            nodes: HashMap::new(),
            namespaces: HashMap::new(),
            published: Arc::default(),
            dirty_services: BTreeSet::new(),
            dirty_endpoints: BTreeSet::new(),
            pending: HashMap::new(),
            pending_total: 0,
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

    /// The pods at an IP (for a proxy's own pod, and endpoints without a `targetRef`).
    #[allow(dead_code)] // proxy service targets will read it
    pub(crate) fn pods_at(&self, ip: IpAddr) -> impl Iterator<Item = (&ObjectKey, &PodInfo)> {
        self.pods_by_ip
            .get(&ip)
            .into_iter()
            .flatten()
            .filter_map(|k| self.pods.get(k).map(|p| (k, p)))
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
        if self.pods.get(&key) == next.as_ref() {
            return;
        }
        let old = match &next {
            Some(next) => self.pods.insert(key.clone(), next.clone()),
            None => self.pods.remove(&key),
        };
        let mut ips: BTreeSet<IpAddr> = BTreeSet::new();
        if let Some(old) = &old {
            for ip in &old.ips {
                remove_from_vec(&mut self.pods_by_ip, ip, &key);
                ips.insert(*ip);
            }
        }
        if let Some(next) = &next {
            for ip in &next.ips {
                self.pods_by_ip.entry(*ip).or_default().push(key.clone());
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
        let old_locality = match next {
            Some(next) => self
                .nodes
                .insert(name.clone(), next.clone())
                .map(|o| o.locality),
            None => self.nodes.remove(&name).map(|o| o.locality),
        };
        let new_locality = self.nodes.get(&name).map(|n| n.locality.clone());
        if old_locality == new_locality {
            return; // only external IPs changed: no endpoint depends on them
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
                    view.services.insert(mesh_key.clone(), desired.clone());
                    if !silent {
                        out.changed.push(mesh_key);
                    }
                    self.dirty_endpoints.insert(key);
                }
                None => {
                    view.services.remove(&mesh_key);
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
                            Some(pod) => Some(pod),
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
        let network = labels.get(LABEL_NETWORK).cloned().or_else(|| {
            self.namespaces
                .get(config.system_namespace.as_str())
                .and_then(|ns| ns.labels.get(LABEL_NETWORK).cloned())
        });
        endpoint.network = network.map(NetworkId::from).unwrap_or_default();
        endpoint.tls_mode = match labels.get(LABEL_TLS_MODE).map(String::as_str) {
            Some("istio") => TlsMode::Istio,
            _ => TlsMode::Disabled,
        };
        endpoint.service_account = pod
            .and_then(|p| p.service_account.as_deref())
            .map(|sa| spiffe_id(&config.trust_domain, service.namespace.as_str(), sa));
        let locality = &endpoint.locality;
        for (label, value) in [
            (LABEL_REGION, &locality.region),
            (LABEL_ZONE, &locality.zone),
            (LABEL_SUBZONE, &locality.subzone),
        ] {
            if !value.is_empty() {
                labels.insert(label.to_string(), value.clone());
            }
        }
        labels.insert(LABEL_CLUSTER.to_string(), config.cluster_id.to_string());
        if let Some(node) = node_name {
            labels.insert(LABEL_HOSTNAME.to_string(), node.to_string());
        }
        if !endpoint.network.is_empty() {
            labels
                .entry(LABEL_NETWORK.to_string())
                .or_insert_with(|| endpoint.network.to_string());
        }
        endpoint.labels = labels;
        endpoint
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
}
