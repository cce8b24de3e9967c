//! What a run will do and what the simulated proxies should see, fixed before the
//! first proxy connects: the resource names of every service the run will ever
//! have, which services each proxyless client watches, and which change touches
//! which service. Shared read-only by every proxy.

use std::collections::HashMap;
use std::sync::Arc;

use super::registry::{Applied, ChangeKind, Registry};
use super::scenario::{Mode, Scenario, SidecarScope};
use super::tables::Shared;

/// A resource name the plan knows: shared text and the service it belongs to.
#[derive(Clone, Debug)]
struct Known {
    name: Arc<str>,
    service: usize,
}

/// The run's expectations (see the module docs).
#[derive(Debug)]
pub struct Plan {
    /// Sidecar or proxyless.
    pub mode: Mode,
    /// What each sidecar imports: the whole mesh or its namespace.
    pub sidecar_scope: SidecarScope,
    /// Namespaces proxies are spread over.
    pub namespaces: usize,
    /// Endpoints every service has (the consistency check of an initial config).
    pub endpoints_per_service: usize,
    /// Ports (so clusters) of every service.
    pub ports_per_service: usize,
    /// What the proxies share of what they hold (see [`Shared`]).
    pub shared: Shared,
    /// Services each proxyless client watches.
    pub grpc_services_per_client: usize,
    /// Services present before the churn.
    pub initial_services: usize,
    /// Every change of the churn, in order, as it will be applied.
    pub changes: Vec<Applied>,
    /// Cluster (and EDS) names: `outbound|<port>||<host>` -> service.
    clusters: HashMap<Arc<str>, Known>,
    /// Cluster names of each service, its first port's first.
    service_clusters: Vec<Vec<Arc<str>>>,
    /// Proxyless LDS name (`<host>:8080`) of each service.
    listener_names: Vec<Arc<str>>,
    /// Whether each service is present before the churn.
    initially_present: Vec<bool>,
    /// Namespace number of each service.
    service_namespaces: Vec<usize>,
    /// Per namespace: its services present before the churn.
    initial_per_namespace: Vec<usize>,
    /// Services proxyless clients may watch.
    watchable: Vec<usize>,
    /// Per service: the endpoint changes that touch it, ascending.
    endpoint_changes: Vec<Vec<u32>>,
    /// Per service: the change that adds it.
    added_by: Vec<Option<u32>>,
    /// Per service: the change that removes it.
    removed_by: Vec<Option<u32>>,
    /// The config changes, ascending.
    config_changes: Vec<u32>,
    /// The scenario's EnvoyFilters (the label each sidecar carries).
    pub envoy_filters: super::scenario::EnvoyFilters,
}

impl Plan {
    /// Works the churn out on a copy of `registry` (which must be in the state the run
    /// starts from, its plan already drawn) so the real run, applying `kinds` in the
    /// same order, makes exactly these changes.
    pub fn new(scenario: &Scenario, registry: &Registry, kinds: &[ChangeKind]) -> Plan {
        let mut dry = registry.clone();
        let changes: Vec<Applied> = kinds
            .iter()
            .enumerate()
            .map(|(i, kind)| dry.apply(i, *kind))
            .collect();
        let count = dry.service_count();
        let mut endpoint_changes = vec![Vec::new(); count];
        let mut added_by = vec![None; count];
        let mut removed_by = vec![None; count];
        let mut config_changes = Vec::new();
        for (i, change) in changes.iter().enumerate() {
            let Some(service) = change.service else {
                continue;
            };
            let i = i as u32;
            match change.kind {
                ChangeKind::Endpoint => endpoint_changes[service].push(i),
                ChangeKind::ServiceAdd => added_by[service] = Some(i),
                ChangeKind::ServiceRemove => removed_by[service] = Some(i),
                ChangeKind::Config => config_changes.push(i),
            }
        }
        let service_clusters: Vec<Vec<Arc<str>>> = (0..count)
            .map(|s| dry.cluster_names(s).into_iter().map(Arc::from).collect())
            .collect();
        let clusters = service_clusters
            .iter()
            .enumerate()
            .flat_map(|(service, names)| {
                names.iter().map(move |name| {
                    (
                        name.clone(),
                        Known {
                            name: name.clone(),
                            service,
                        },
                    )
                })
            })
            .collect();
        let initially_present: Vec<bool> = (0..count)
            .map(|s| s < registry.service_count() && registry.is_present(s))
            .collect();
        let service_namespaces: Vec<usize> = (0..count).map(|s| dry.namespace_of(s)).collect();
        let mut initial_per_namespace = vec![0; scenario.namespaces];
        for (s, present) in initially_present.iter().enumerate() {
            if *present {
                initial_per_namespace[service_namespaces[s]] += 1;
            }
        }
        Plan {
            mode: scenario.mode,
            sidecar_scope: scenario.sidecar_scope,
            namespaces: scenario.namespaces,
            endpoints_per_service: scenario.endpoints_per_service,
            ports_per_service: scenario.ports_per_service,
            shared: Shared::new(scenario.decode),
            grpc_services_per_client: scenario.grpc_services_per_client,
            initial_services: initially_present.iter().filter(|p| **p).count(),
            changes,
            clusters,
            listener_names: (0..count)
                .map(|s| Arc::from(dry.grpc_listener_name(s)))
                .collect(),
            service_clusters,
            initially_present,
            service_namespaces,
            initial_per_namespace,
            watchable: registry.watchable(),
            endpoint_changes,
            added_by,
            removed_by,
            config_changes,
            envoy_filters: scenario.envoy_filters.clone(),
        }
    }

    /// Every service the run will ever have.
    pub fn service_count(&self) -> usize {
        self.service_clusters.len()
    }

    /// The shared text of a name the plan knows, or a new one.
    pub fn intern(&self, name: &str) -> Arc<str> {
        match self.clusters.get(name) {
            Some(known) => known.name.clone(),
            None => Arc::from(name),
        }
    }

    /// The service a cluster (or EDS) name belongs to.
    pub fn service_of_cluster(&self, name: &str) -> Option<usize> {
        self.clusters.get(name).map(|k| k.service)
    }

    /// The cluster (and EDS) name of a service's first port (the one endpoint changes
    /// show in).
    pub fn cluster_name(&self, service: usize) -> &Arc<str> {
        &self.service_clusters[service][0]
    }

    /// The cluster (and EDS) names of every port of a service (`portsPerService`).
    pub fn cluster_names(&self, service: usize) -> &[Arc<str>] {
        &self.service_clusters[service]
    }

    /// The LDS name a proxyless client asks for to reach a service.
    pub fn listener_name(&self, service: usize) -> &Arc<str> {
        &self.listener_names[service]
    }

    /// Whether the service is present before the churn.
    pub fn initially_present(&self, service: usize) -> bool {
        self.initially_present[service]
    }

    /// Namespace number of proxy `proxy` (`load-<n>`).
    pub fn proxy_namespace(&self, proxy: usize) -> usize {
        proxy % self.namespaces
    }

    /// Namespace number of `service`.
    pub fn service_namespace(&self, service: usize) -> usize {
        self.service_namespaces[service]
    }

    /// Whether a sidecar in namespace `proxy_ns` imports `service` (its Sidecar scope).
    pub fn sidecar_sees(&self, proxy_ns: usize, service: usize) -> bool {
        match self.sidecar_scope {
            SidecarScope::Mesh => true,
            SidecarScope::Namespace => self.service_namespaces[service] == proxy_ns,
        }
    }

    /// The services present before the churn that a sidecar in namespace `proxy_ns`
    /// imports.
    pub fn sidecar_initial_services(&self, proxy_ns: usize) -> usize {
        match self.sidecar_scope {
            SidecarScope::Mesh => self.initial_services,
            SidecarScope::Namespace => self.initial_per_namespace[proxy_ns],
        }
    }

    /// The services proxyless client `proxy` watches: a window of the watchable
    /// services, shifted per client so every service has about the same number of
    /// watchers.
    pub fn grpc_watch(&self, proxy: usize) -> Vec<usize> {
        let w = self.watchable.len();
        let m = self.grpc_services_per_client.min(w);
        (0..m)
            .map(|k| self.watchable[(proxy * m + k) % w])
            .collect()
    }

    /// The endpoint changes of `service` with an index in `(after, upto]`: a load
    /// assignment is a full state, so one that carries change `upto`'s marker also
    /// carries every earlier change to the same service.
    pub fn endpoint_changes_between(
        &self,
        service: usize,
        after: Option<u32>,
        upto: u32,
    ) -> impl Iterator<Item = u32> + '_ {
        self.endpoint_changes[service]
            .iter()
            .copied()
            .filter(move |c| after.is_none_or(|a| *c > a) && *c <= upto)
    }

    /// Whether the churn changes config (proxies then read route names).
    pub fn has_config_changes(&self) -> bool {
        !self.config_changes.is_empty()
    }

    /// The config changes with an index in `(after, upto]`: the VirtualService is
    /// rewritten whole, so a route named after change `upto` shows every earlier one.
    pub fn config_changes_between(
        &self,
        after: Option<u32>,
        upto: u32,
    ) -> impl Iterator<Item = u32> + '_ {
        self.config_changes
            .iter()
            .copied()
            .filter(move |c| after.is_none_or(|a| *c > a) && *c <= upto)
    }

    /// The change that adds `service`, if the churn adds it.
    pub fn added_by(&self, service: usize) -> Option<u32> {
        self.added_by[service]
    }

    /// The change that removes `service`, if the churn removes it.
    pub fn removed_by(&self, service: usize) -> Option<u32> {
        self.removed_by[service]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::Churn;

    #[test]
    fn knows_every_change_and_name() {
        let scenario = Scenario {
            services: 6,
            endpoints_per_service: 2,
            namespaces: 2,
            mode: Mode::Grpc,
            grpc_services_per_client: 2,
            churn: Churn {
                rate: 1.0,
                endpoint_changes: 5,
                service_adds: 1,
                service_removes: 2,
                config_changes: 0,
                reconnect_storm: false,
                ..Churn::default()
            },
            ..Scenario::default()
        };
        let mut registry = Registry::new(&scenario);
        let kinds = registry.plan(&scenario);
        let plan = Plan::new(&scenario, &registry, &kinds);
        assert_eq!(plan.service_count(), 7, "6 + 1 added");
        assert_eq!(plan.initial_services, 6);
        assert!(!plan.initially_present(6));
        // The real run makes the same changes as the dry run.
        for (i, kind) in kinds.iter().enumerate() {
            assert_eq!(registry.apply(i, *kind), plan.changes[i]);
        }
        let add = plan.added_by(6).expect("the added service");
        assert_eq!(plan.changes[add as usize].kind, ChangeKind::ServiceAdd);
        let name = plan.cluster_name(6).clone();
        assert_eq!(plan.service_of_cluster(&name), Some(6));
        assert!(Arc::ptr_eq(&plan.intern(&name), &name));
        assert_eq!(
            &**plan.listener_name(0),
            "svc-0.load-0.svc.cluster.local:8080"
        );
        // One original service is reserved for removal: 5 watchable, windows of 2.
        assert_eq!(plan.grpc_watch(0), vec![0, 1]);
        assert_eq!(plan.grpc_watch(2), vec![4, 0]);
        let total: usize = (0..6)
            .map(|s| plan.endpoint_changes_between(s, None, u32::MAX).count())
            .sum();
        assert_eq!(total, 5);
        // Without Sidecars every sidecar sees every service.
        assert!(plan.sidecar_sees(1, 0));
        assert_eq!(plan.sidecar_initial_services(1), 6);
    }

    #[test]
    fn namespace_scope_limits_sidecars_to_their_namespace() {
        let scenario = Scenario {
            services: 7,
            namespaces: 3,
            sidecar_scope: SidecarScope::Namespace,
            churn: Churn {
                rate: 1.0,
                service_adds: 2,
                ..Churn::default()
            },
            ..Scenario::default()
        };
        let mut registry = Registry::new(&scenario);
        let kinds = registry.plan(&scenario);
        let plan = Plan::new(&scenario, &registry, &kinds);
        // svc-0, 3, 6 in load-0; 1, 4 in load-1; 2, 5 in load-2; then svc-add-0 and
        // svc-add-1 in load-0 and load-1.
        assert_eq!(
            (0..3)
                .map(|ns| plan.sidecar_initial_services(ns))
                .collect::<Vec<_>>(),
            vec![3, 2, 2]
        );
        assert_eq!(plan.proxy_namespace(4), 1);
        assert!(plan.sidecar_sees(1, 4) && !plan.sidecar_sees(1, 3));
        assert_eq!(plan.service_namespace(7), 0);
        assert_eq!(plan.service_namespace(8), 1);
    }
}
