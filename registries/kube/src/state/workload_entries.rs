//! WorkloadEntries selected by Services (Istio's `PILOT_ENABLE_K8S_SELECT_WORKLOAD_ENTRIES`,
//! on by default): the entries the ServiceEntry registry publishes
//! ([`meshfed_registry::workload_instances`]) join the endpoints of every Service of
//! their namespace whose selector matches their labels, in this cluster's shard, after
//! the Service's own (EndpointSlice) endpoints.
//!
//! As Istio's Kubernetes controller does it (`serviceInstancesFromWorkloadInstances`):
//! - only Services with client-side load balancing (a cluster IP; not headless, not
//!   ExternalName) and a non-empty selector;
//! - per service port: a numeric `targetPort` gives the port, unless the entry's
//!   `ports` names the service port (then that port); a named `targetPort` takes the
//!   entry's port of that name, and without one the entry does not serve that port;
//! - an entry without an address is kept as an endpoint without one (split-horizon EDS
//!   sends it as its network's gateway);
//! - the entry's network, locality, weight, TLS mode and service account
//!   (`spiffe://<trust domain>/ns/<namespace>/sa/<name>`) carry over; its labels get
//!   the topology labels (cluster, locality, network) as a pod's do; it is healthy.
//!
//! A change is cheap: only the namespaces whose entries changed are compared, and only
//! the Services of those namespaces whose selector matches an entry's old or new
//! labels get their endpoints recomputed (an incremental EDS push of those Services).

use meshfed_registry::workload_instances::{
    NamespaceEntries, WorkloadEntryInstance, WorkloadEntrySet, changed_entries,
};
use meshfed_registry::{MeshLocation, Resolution};

use super::*;

impl ClusterState {
    /// Takes a new set of WorkloadEntries and marks the Services whose selection it
    /// changes.
    pub(crate) fn set_workload_entries(&mut self, next: Arc<WorkloadEntrySet>) {
        let previous = std::mem::replace(&mut self.workload_entries, next);
        let namespaces: BTreeSet<&String> = previous
            .keys()
            .chain(self.workload_entries.keys())
            .collect();
        let mut dirty = Vec::new();
        for namespace in namespaces {
            let (old, new) = (
                previous.get(namespace),
                self.workload_entries.get(namespace),
            );
            if let (Some(old), Some(new)) = (old, new)
                && Arc::ptr_eq(old, new)
            {
                continue;
            }
            let changed = changed_entries(old.map(|o| &**o), new.map(|n| &**n));
            if changed.is_empty() {
                continue;
            }
            for name in self
                .services_by_namespace
                .get(namespace.as_str())
                .into_iter()
                .flatten()
            {
                let key = ObjectKey {
                    namespace: Namespace::from(namespace.as_str()),
                    name: name.clone(),
                };
                let Some(service) = self.services.get(&key) else {
                    continue;
                };
                let selector = &service.attributes.selector;
                let touched = changed.iter().any(|(before, after)| {
                    before.is_some_and(|e| e.selected_by(selector))
                        || after.is_some_and(|e| e.selected_by(selector))
                });
                if touched {
                    dirty.push(key);
                }
            }
        }
        self.dirty_endpoints.extend(dirty);
    }

    /// The endpoints the WorkloadEntries selected by `service` give it, in entry-name
    /// order.
    pub(super) fn workload_entry_endpoints(
        &self,
        key: &ObjectKey,
        service: &ConvertedService,
    ) -> Vec<Endpoint> {
        if !selects_workload_entries(service) {
            return Vec::new();
        }
        let Some(entries) = self.workload_entries.get(key.namespace.as_str()) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for entry in selected(entries, &service.attributes.selector) {
            let ports = entry_ports(entry, service);
            if ports.is_empty() {
                continue;
            }
            let mut endpoint = match entry.address {
                Some(address) => Endpoint::new(address),
                // Reachable only through its network's gateway, as in Istio: EDS never
                // sends an endpoint without an address as an IP.
                None => Endpoint::without_address(),
            };
            endpoint.ports = ports;
            self.fill_from_entry(&mut endpoint, entry, key.namespace.as_str());
            out.push(endpoint);
        }
        out
    }

    fn fill_from_entry(
        &self,
        endpoint: &mut Endpoint,
        entry: &WorkloadEntryInstance,
        namespace: &str,
    ) {
        let config = &self.config;
        endpoint.cluster_id = config.cluster_id.clone();
        endpoint.network = entry.network.clone();
        endpoint.locality = entry.locality.clone();
        endpoint.weight = entry.weight.max(1);
        endpoint.tls_mode = entry.tls_mode;
        endpoint.health = entry.health;
        endpoint.service_account = (!entry.service_account.is_empty())
            .then(|| spiffe_id(&config.trust_domain, namespace, &entry.service_account));
        let mut labels = entry.labels.clone();
        add_topology_labels(
            &mut labels,
            &endpoint.locality,
            &config.cluster_id,
            None,
            &endpoint.network,
        );
        endpoint.workload = Some(Arc::new(WorkloadMeta {
            kind: WorkloadKind::WorkloadEntry,
            name: entry.name.clone(),
            namespace: namespace.to_string(),
            uid: format!(
                "{}/networking.istio.io/WorkloadEntry/{namespace}/{}",
                config.cluster_id, entry.name
            ),
            workload_name: entry.name.clone(),
            dataplane_mode: labels
                .get(LABEL_DATAPLANE_MODE)
                .cloned()
                .unwrap_or_default(),
            use_waypoint: labels.get(LABEL_USE_WAYPOINT).cloned().unwrap_or_default(),
            use_waypoint_namespace: labels
                .get(LABEL_USE_WAYPOINT_NAMESPACE)
                .cloned()
                .unwrap_or_default(),
            creation_time: Some(entry.creation_time),
            ..WorkloadMeta::default()
        }));
        endpoint.labels = labels;
    }
}

/// Whether a Service can select WorkloadEntries: a cluster-IP Service of this
/// cluster with a selector.
fn selects_workload_entries(service: &ConvertedService) -> bool {
    service.service.resolution == Resolution::ClientSideLb
        && service.service.location == MeshLocation::MeshInternal
        && !service.attributes.selector.is_empty()
}

fn selected<'a>(
    entries: &'a NamespaceEntries,
    selector: &'a BTreeMap<String, String>,
) -> impl Iterator<Item = &'a WorkloadEntryInstance> + 'a {
    entries
        .values()
        .map(|e| &**e)
        .filter(move |e| e.selected_by(selector))
}

/// Service port name -> the entry's port for it (see the module docs).
fn entry_ports(
    entry: &WorkloadEntryInstance,
    service: &ConvertedService,
) -> BTreeMap<Arc<str>, u16> {
    let named = |name: &str| {
        entry
            .ports
            .get(name)
            .copied()
            .filter(|p| *p != 0)
            .and_then(|p| u16::try_from(p).ok())
    };
    let mut ports = BTreeMap::new();
    let targets = service.attributes.target_ports.iter();
    for (target, port) in targets.zip(&service.service.ports) {
        let number = match &target.target {
            TargetPort::Number(n) => named(&port.name).unwrap_or(*n),
            TargetPort::Name(name) => match named(name) {
                Some(n) => n,
                None => continue,
            },
        };
        ports.insert(port.name.clone(), number);
    }
    ports
}
