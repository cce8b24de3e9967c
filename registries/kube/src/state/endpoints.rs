//! Flushing: re-deriving the marked services and their endpoints (slices, pods,
//! nodes and namespace settings merged into mesh endpoints).

use super::*;

impl ClusterState {
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
                namespaces: self.namespaces.clone(),
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
        out.nodes_changed = std::mem::take(&mut self.nodes_changed);
        for key in std::mem::take(&mut self.dirty_endpoints) {
            let mesh_key = self.service_key(&key);
            let Some(service) = self.published.services.get(&mesh_key) else {
                continue; // unpublished: its shard went with service_deleted
            };
            if service.exported_to_none() {
                continue; // Istio writes no endpoints for `exportTo: ~` services
            }
            let (mut endpoints, pending) = self.endpoints_of(&key, service);
            endpoints.extend(self.workload_entry_endpoints(&key, service));
            self.set_pending(&key, pending);
            out.endpoints.push((mesh_key, endpoints));
        }
        out
    }

    pub(super) fn set_pending(&mut self, key: &ObjectKey, pending: usize) {
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
    pub(super) fn endpoints_of(
        &self,
        key: &ObjectKey,
        service: &ConvertedService,
    ) -> (Vec<Endpoint>, usize) {
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
                let named_pod = e.pod.is_some();
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
                            if !named_pod {
                                // The object is the slice, whatever pod has its
                                // address (the pod's labels and identity stay for
                                // EDS); ambient sends it as a workload of its own.
                                endpoint.workload = Some(Arc::new(WorkloadMeta {
                                    kind: WorkloadKind::EndpointSlice,
                                    name: slice_name.to_string(),
                                    namespace: key.namespace.to_string(),
                                    uid: format!(
                                        "{}/discovery.k8s.io/EndpointSlice/{}/{slice_name}/{address}",
                                        self.config.cluster_id, key.namespace
                                    ),
                                    ..WorkloadMeta::default()
                                }));
                            }
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

    /// The endpoint for one address, with metadata from its pod and node
    /// ([`PodContext::endpoint`]).
    pub(super) fn endpoint(
        &self,
        address: IpAddr,
        service: &ObjectKey,
        pod: Option<&PodInfo>,
        slice_node: Option<&Arc<str>>,
    ) -> Endpoint {
        self.pod_context()
            .endpoint(address, service.namespace.as_str(), pod, slice_node)
    }

    /// What endpoints are made from besides the pod.
    pub(super) fn pod_context(&self) -> PodContext<'_> {
        PodContext {
            config: &self.config,
            nodes: &self.nodes,
            namespaces: &self.namespaces,
        }
    }

    /// The system namespace's network label: the network of workloads without one.
    pub(super) fn default_network(&self) -> Option<&String> {
        self.namespaces
            .get(self.config.system_namespace.as_str())
            .and_then(|ns| ns.labels.get(LABEL_NETWORK))
    }
}

/// What a pod's endpoint is made of besides the pod: the registry's settings, the
/// nodes (locality) and the namespaces (default network, ambient labels). The writer's
/// state and the published [`PodView`] both provide it.
pub(crate) struct PodContext<'a> {
    pub(crate) config: &'a KubeRegistryConfig,
    pub(crate) nodes: &'a HashMap<Arc<str>, NodeInfo>,
    pub(crate) namespaces: &'a HashMap<Arc<str>, NamespaceInfo>,
}

impl PodContext<'_> {
    /// The endpoint for one address, with metadata from its pod and node (reference
    /// §2.4, §2.6, §2.7).
    pub(crate) fn endpoint(
        &self,
        address: IpAddr,
        namespace: &str,
        pod: Option<&PodInfo>,
        slice_node: Option<&Arc<str>>,
    ) -> Endpoint {
        let config = self.config;
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
            .map(|sa| spiffe_id(&config.trust_domain, namespace, sa));
        add_topology_labels(
            &mut labels,
            &endpoint.locality,
            &config.cluster_id,
            node_name.map(|n| &**n),
            &endpoint.network,
        );
        endpoint.workload = pod.map(|p| Arc::new(self.pod_workload(p, namespace, node_name)));
        endpoint.labels = labels;
        endpoint
    }

    /// The workload record of a pod in `namespace`: its uid, node, owner and the
    /// ambient labels of the pod, else of its namespace.
    fn pod_workload(
        &self,
        pod: &PodInfo,
        namespace: &str,
        node_name: Option<&Arc<str>>,
    ) -> WorkloadMeta {
        let ns_labels = self.namespaces.get(namespace).map(|n| &n.labels);
        let label = |key: &str| -> String {
            pod.labels
                .get(key)
                .or_else(|| ns_labels.and_then(|l| l.get(key)))
                .cloned()
                .unwrap_or_default()
        };
        // The waypoint namespace goes with the label that named the waypoint.
        let (use_waypoint, use_waypoint_namespace) = match pod.labels.get(LABEL_USE_WAYPOINT) {
            Some(w) => (
                w.clone(),
                pod.labels
                    .get(LABEL_USE_WAYPOINT_NAMESPACE)
                    .cloned()
                    .unwrap_or_default(),
            ),
            None => match ns_labels.and_then(|l| l.get(LABEL_USE_WAYPOINT)) {
                Some(w) => (
                    w.clone(),
                    ns_labels
                        .and_then(|l| l.get(LABEL_USE_WAYPOINT_NAMESPACE))
                        .cloned()
                        .unwrap_or_default(),
                ),
                None => (String::new(), String::new()),
            },
        };
        WorkloadMeta {
            kind: WorkloadKind::Pod,
            name: pod.name.to_string(),
            namespace: namespace.to_string(),
            uid: format!("{}//Pod/{namespace}/{}", self.config.cluster_id, pod.name),
            node_name: node_name.map(|n| n.to_string()).unwrap_or_default(),
            workload_name: pod.owner.0.to_string(),
            owner: pod.owner.1,
            dataplane_mode: label(LABEL_DATAPLANE_MODE),
            use_waypoint,
            use_waypoint_namespace,
            ambient_redirected: pod.ambient_redirected,
            creation_time: pod.creation_time,
            host_network: pod.host_network,
        }
    }

    /// The system namespace's network label: the network of workloads without one.
    pub(super) fn default_network(&self) -> Option<&String> {
        self.namespaces
            .get(self.config.system_namespace.as_str())
            .and_then(|ns| ns.labels.get(LABEL_NETWORK))
    }
}
