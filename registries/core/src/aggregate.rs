//! The aggregate: every registry behind one view, merged by an explicit policy.
//!
//! For each `(hostname, namespace)`:
//! 1. Kubernetes services from several clusters are one service: the base attributes
//!    come from the primary (config) cluster if it has the service, else from the oldest
//!    one; every cluster's VIPs are kept under its cluster id and service accounts are
//!    unioned. Port lists are not merged; a mismatch is reported as a conflict.
//! 2. A Kubernetes service beats any other provider's service (anti hostname squatting).
//! 3. Otherwise the oldest service (creation time) wins; equal times are broken by
//!    provider and then cluster id, so the outcome never depends on registration order.
//!
//! Every decision that drops or overrides a service is returned as a [`Conflict`] for
//! `/debug/registryz` and the conflict metric. Endpoints are not part of this: they live
//! in the endpoint index, one shard per registry, and EDS merges all shards of a key.
//!
//! A registry that held services and then holds none (an agent restarted with an empty
//! catalog, a deleted config directory) withdraws all of them at once: the aggregate
//! notices it when it next merges, logs a warning naming the registry and how many it
//! had, and counts it in `meshfed_registry_emptied{registry}`.
//!
//! A proxy's own workload (its pod) is looked up through [`WorkloadSources`]: the
//! registries' workloads frozen when it was taken; the first registry that knows the
//! proxy answers, Kubernetes registries first.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, RwLock};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;
use serde::Serialize;

use crate::metrics::encode_gauges;
use crate::model::{
    ClusterId, Endpoint, ProviderId, Service, ServiceKey, ShardKey, WorkloadInstance,
};
use crate::registry::{NetworkGateway, ServiceRegistry, WorkloadLookup, WorkloadQuery};

/// Why a service lost to another with the same `(hostname, namespace)`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug, Serialize)]
pub enum ConflictReason {
    /// A Kubernetes service always beats other providers.
    KubernetesPrecedence,
    /// The older service wins.
    OldestWins,
    /// Kubernetes clusters disagree on the port list; the base cluster's list is used.
    PortMismatch,
}

/// One merge decision worth showing to an operator.
#[derive(Clone, PartialEq, Debug, Serialize)]
pub struct Conflict {
    /// The contested key.
    pub service: ServiceKey,
    /// The registry whose service is served.
    pub winner: ShardKey,
    /// The registry whose service was dropped (or whose ports were ignored).
    pub loser: ShardKey,
    /// Why.
    pub reason: ConflictReason,
}

/// The merged view at one moment.
#[derive(Clone, Debug, Default)]
pub struct MergedServices {
    /// One service per `(hostname, namespace)`, sorted by key.
    pub services: Vec<Arc<Service>>,
    /// Every contributing registry per key (for debug output), in merge order.
    pub sources: BTreeMap<ServiceKey, Vec<ShardKey>>,
    /// Merge decisions, sorted.
    pub conflicts: Vec<Conflict>,
}

/// The set of registries behind one view.
#[derive(Debug)]
pub struct Aggregate {
    /// The cluster meshfed itself runs in; its Kubernetes services supply defaults.
    primary_cluster: ClusterId,
    registries: RwLock<Vec<Arc<dyn ServiceRegistry>>>,
    /// Per registry: how many services it had at the last merge, and how often it
    /// went from some to none.
    counts: Mutex<BTreeMap<ShardKey, ServiceCount>>,
}

/// One registry's service count as merges see it.
#[derive(Clone, Copy, Debug, Default)]
struct ServiceCount {
    last: usize,
    emptied: u64,
}

impl Aggregate {
    /// An empty aggregate whose primary (config) cluster is `primary_cluster`.
    pub fn new(primary_cluster: impl Into<ClusterId>) -> Self {
        Aggregate {
            primary_cluster: primary_cluster.into(),
            registries: RwLock::new(Vec::new()),
            counts: Mutex::new(BTreeMap::new()),
        }
    }

    /// Adds a registry. A registry with the same shard key replaces the old one (used to
    /// swap in a registry with rotated credentials once it has synced).
    pub fn add_registry(&self, registry: Arc<dyn ServiceRegistry>) {
        let mut registries = self.registries.write().expect("aggregate poisoned");
        let shard = registry.shard_key();
        registries.retain(|r| r.shard_key() != shard);
        registries.push(registry);
        registries.sort_by_key(|r| r.shard_key());
    }

    /// Removes the registry for `shard`; returns whether one was there.
    pub fn remove_registry(&self, shard: &ShardKey) -> bool {
        let mut registries = self.registries.write().expect("aggregate poisoned");
        let before = registries.len();
        registries.retain(|r| &r.shard_key() != shard);
        let removed = registries.len() != before;
        if removed {
            // A registry removed (a remote cluster's secret deleted) did not empty:
            // its next incarnation starts counting afresh.
            self.counts
                .lock()
                .expect("aggregate poisoned")
                .remove(shard);
        }
        removed
    }

    /// How many times the registry for `shard` went from some services to none.
    pub fn emptied_count(&self, shard: &ShardKey) -> u64 {
        self.counts
            .lock()
            .expect("aggregate poisoned")
            .get(shard)
            .map_or(0, |c| c.emptied)
    }

    /// Notes each registry's service count after a merge; a registry that had
    /// services and now has none is logged and counted.
    fn note_counts(&self, now: &[(ShardKey, usize)]) {
        let mut counts = self.counts.lock().expect("aggregate poisoned");
        for (shard, n) in now {
            let count = counts.entry(shard.clone()).or_default();
            if count.last > 0 && *n == 0 {
                count.emptied += 1;
                tracing::warn!(
                    registry = %shard,
                    before = count.last,
                    "registry {shard} went from {} services to none: all of them are withdrawn",
                    count.last
                );
            }
            count.last = *n;
        }
    }

    /// The registries, sorted by shard key.
    pub fn registries(&self) -> Vec<Arc<dyn ServiceRegistry>> {
        self.registries.read().expect("aggregate poisoned").clone()
    }

    /// True when every registry has synced.
    pub fn has_synced(&self) -> bool {
        self.registries().iter().all(|r| r.has_synced())
    }

    /// Union of all registries' network gateways, sorted and de-duplicated.
    pub fn network_gateways(&self) -> Vec<NetworkGateway> {
        let mut all: Vec<NetworkGateway> = self
            .registries()
            .iter()
            .flat_map(|r| r.network_gateways())
            .collect();
        all.sort();
        all.dedup();
        all
    }

    /// Every registry's external addresses of the service `hostname`
    /// ([`ServiceRegistry::external_addresses`]), in registry order, de-duplicated.
    pub fn external_addresses(&self, hostname: &str) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for address in self
            .registries()
            .iter()
            .flat_map(|r| r.external_addresses(hostname))
        {
            if !out.contains(&address) {
                out.push(address);
            }
        }
        out
    }

    /// The registries' workloads as they are now, frozen, for looking up proxies' own
    /// workloads: later registry changes do not show through (a snapshot takes these
    /// when it is built).
    pub fn workload_sources(&self) -> WorkloadSources {
        let mut registries = self.registries();
        registries.sort_by_key(|r| {
            (
                r.provider() != ProviderId::Kubernetes,
                r.cluster_id() != &self.primary_cluster,
                r.shard_key(),
            )
        });
        WorkloadSources {
            lookups: registries
                .iter()
                .filter_map(|r| Some((r.shard_key(), r.workloads()?)))
                .collect(),
        }
    }

    /// Merges every registry's services by the policy in the module docs.
    pub fn merged(&self) -> MergedServices {
        let mut groups: BTreeMap<ServiceKey, Vec<Arc<Service>>> = BTreeMap::new();
        let registries = self.registries();
        let mut counts = Vec::with_capacity(registries.len());
        for registry in registries {
            let services = registry.services();
            counts.push((registry.shard_key(), services.len()));
            for service in services {
                groups.entry(service.key()).or_default().push(service);
            }
        }
        self.note_counts(&counts);
        let mut merged = MergedServices::default();
        for (key, mut candidates) in groups {
            candidates.sort_by(|a, b| self.precedence(a).cmp(&self.precedence(b)));
            let winner = self.merge_group(&key, &candidates, &mut merged.conflicts);
            merged.sources.insert(
                key,
                candidates
                    .iter()
                    .map(|s| ShardKey::new(s.provider, s.cluster_id.clone()))
                    .collect(),
            );
            merged.services.push(winner);
        }
        merged.conflicts.sort_by(|a, b| {
            (&a.service, &a.winner, &a.loser, a.reason)
                .cmp(&(&b.service, &b.winner, &b.loser, b.reason))
        });
        merged
    }

    /// Sort key: Kubernetes first, the primary cluster first among those, then oldest,
    /// then provider and cluster id as deterministic tie-breakers. Being in the
    /// primary cluster counts for Kubernetes services only: the ServiceEntry registry
    /// carries the primary cluster's id too, and must not beat an older Mock or Consul
    /// service by it.
    fn precedence<'a>(
        &self,
        s: &'a Service,
    ) -> (bool, bool, std::time::SystemTime, ProviderId, &'a ClusterId) {
        let kube = s.provider == ProviderId::Kubernetes;
        (
            !kube,
            !(kube && s.cluster_id == self.primary_cluster),
            s.creation_time,
            s.provider,
            &s.cluster_id,
        )
    }

    fn merge_group(
        &self,
        key: &ServiceKey,
        sorted: &[Arc<Service>],
        conflicts: &mut Vec<Conflict>,
    ) -> Arc<Service> {
        let base = &sorted[0];
        let base_shard = ShardKey::new(base.provider, base.cluster_id.clone());
        if sorted.len() == 1 {
            return base.clone();
        }
        let mut merged: Option<Service> = None;
        for other in &sorted[1..] {
            let other_shard = ShardKey::new(other.provider, other.cluster_id.clone());
            let both_kube =
                base.provider == ProviderId::Kubernetes && other.provider == ProviderId::Kubernetes;
            if both_kube && base.cluster_id != other.cluster_id {
                let m = merged.get_or_insert_with(|| (**base).clone());
                for (cluster, vips) in &other.cluster_vips {
                    m.cluster_vips
                        .entry(cluster.clone())
                        .or_insert_with(|| vips.clone());
                }
                m.service_accounts
                    .extend(other.service_accounts.iter().cloned());
                if other.ports != base.ports {
                    conflicts.push(Conflict {
                        service: key.clone(),
                        winner: base_shard.clone(),
                        loser: other_shard,
                        reason: ConflictReason::PortMismatch,
                    });
                }
                continue;
            }
            let reason = if base.provider == ProviderId::Kubernetes
                && other.provider != ProviderId::Kubernetes
            {
                ConflictReason::KubernetesPrecedence
            } else {
                ConflictReason::OldestWins
            };
            conflicts.push(Conflict {
                service: key.clone(),
                winner: base_shard.clone(),
                loser: other_shard,
                reason,
            });
        }
        merged.map(Arc::new).unwrap_or_else(|| base.clone())
    }
}

/// Where a proxy's own workload is looked up: the registries' workloads as they were
/// when [`Aggregate::workload_sources`] was called ([`ServiceRegistry::workloads`]),
/// in Istio's order (Kubernetes first, the primary cluster first among those). Each
/// registry decides whether a proxy is its own (a Kubernetes registry answers only
/// proxies of its cluster, or proxies that name no cluster); the first answer wins.
/// Nothing here reads a live registry.
#[derive(Clone, Debug, Default)]
pub struct WorkloadSources {
    lookups: Vec<(ShardKey, Arc<dyn WorkloadLookup>)>,
}

impl WorkloadSources {
    /// The workload the proxy described by `query` runs as, if any registry knows it.
    pub fn find(&self, query: &WorkloadQuery<'_>) -> Option<WorkloadInstance> {
        self.lookups.iter().find_map(|(_, l)| l.find(query))
    }

    /// Every registry's workloads ([`WorkloadLookup::every_workload`]), each with the
    /// shard of the registry that knows it, in the look-up order.
    pub fn every_workload(&self) -> Vec<(ShardKey, Endpoint)> {
        self.lookups
            .iter()
            .flat_map(|(shard, l)| l.every_workload().into_iter().map(|e| (shard.clone(), e)))
            .collect()
    }
}

// === metrics ===

impl Aggregate {
    /// Registers the per-registry gauges into `registry`, read on every scrape with one
    /// row per registry in the aggregate at that moment (label `registry`, its shard
    /// key): `meshfed_registry_synced`, `meshfed_registry_stale`,
    /// `meshfed_registry_services` and `meshfed_registry_emptied` (times the registry
    /// went from some services to none, seen at merges; a gauge that only grows, like
    /// the other counters of this code base; kept when a registry is replaced by one
    /// with the same shard key, dropped when it is removed).
    pub fn register_metrics(self: &Arc<Self>, registry: &mut Registry) {
        registry.register_collector(Box::new(AggregateMetrics(self.clone())));
    }
}

#[derive(Debug)]
struct AggregateMetrics(Arc<Aggregate>);

impl Collector for AggregateMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let registries = self.0.registries();
        let rows = |f: fn(&dyn ServiceRegistry) -> i64| -> Vec<(String, i64)> {
            registries
                .iter()
                .map(|r| (r.shard_key().to_string(), f(r.as_ref())))
                .collect()
        };
        encode_gauges(
            &mut encoder,
            "meshfed_registry_synced",
            "1 once the registry finished its initial sync",
            "registry",
            rows(|r| i64::from(r.has_synced())),
        )?;
        encode_gauges(
            &mut encoder,
            "meshfed_registry_stale",
            "1 while the registry's source is unreachable and its last known view is served",
            "registry",
            rows(|r| i64::from(r.is_stale())),
        )?;
        encode_gauges(
            &mut encoder,
            "meshfed_registry_services",
            "Services the registry holds (before merging)",
            "registry",
            rows(|r| r.services().len() as i64),
        )?;
        let emptied: Vec<(String, i64)> = registries
            .iter()
            .map(|r| {
                let shard = r.shard_key();
                let n = self.0.emptied_count(&shard) as i64;
                (shard.to_string(), n)
            })
            .collect();
        encode_gauges(
            &mut encoder,
            "meshfed_registry_emptied",
            "Times the registry went from some services to none (all withdrawn at once)",
            "registry",
            emptied,
        )
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;
    use crate::model::{Port, Protocol};

    #[derive(Debug)]
    struct Fixed {
        provider: ProviderId,
        cluster: ClusterId,
        services: Vec<Arc<Service>>,
        stale: bool,
    }

    impl ServiceRegistry for Fixed {
        fn provider(&self) -> ProviderId {
            self.provider
        }
        fn cluster_id(&self) -> &ClusterId {
            &self.cluster
        }
        fn services(&self) -> Vec<Arc<Service>> {
            self.services.clone()
        }
        fn has_synced(&self) -> bool {
            true
        }
        fn is_stale(&self) -> bool {
            self.stale
        }
    }

    fn svc(provider: ProviderId, cluster: &str, vip: Option<&str>, age_secs: u64) -> Service {
        let mut s = Service::new("foo.ns.svc.cluster.local", "ns", provider, cluster);
        s.ports.push(Port::new("http", 80, Protocol::Http).unwrap());
        if let Some(vip) = vip {
            s.cluster_vips
                .insert(cluster.into(), vec![vip.parse().unwrap()]);
        }
        s.creation_time = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 - age_secs);
        s
    }

    fn registry(
        provider: ProviderId,
        cluster: &str,
        services: Vec<Service>,
    ) -> Arc<dyn ServiceRegistry> {
        Arc::new(Fixed {
            provider,
            cluster: cluster.into(),
            services: services.into_iter().map(Arc::new).collect(),
            stale: false,
        })
    }

    #[test]
    fn metrics_report_each_registrys_state_under_its_shard_key() {
        let agg = Arc::new(Aggregate::new("c1"));
        let mut metrics = Registry::default();
        agg.register_metrics(&mut metrics);
        let encode = || {
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, &metrics).unwrap();
            text
        };
        let families = |rows: &[(&str, u8, u8, usize)]| {
            let mut text = String::new();
            for (name, help) in [
                (
                    "meshfed_registry_synced",
                    "1 once the registry finished its initial sync",
                ),
                (
                    "meshfed_registry_stale",
                    "1 while the registry's source is unreachable and its last known view is served",
                ),
                (
                    "meshfed_registry_services",
                    "Services the registry holds (before merging)",
                ),
                (
                    "meshfed_registry_emptied",
                    "Times the registry went from some services to none (all withdrawn at once)",
                ),
            ] {
                text += &format!("# HELP {name} {help}\n# TYPE {name} gauge\n");
                for (registry, synced, stale, services) in rows {
                    let value = match name {
                        "meshfed_registry_synced" => synced.to_string(),
                        "meshfed_registry_stale" => stale.to_string(),
                        "meshfed_registry_services" => services.to_string(),
                        _ => "0".to_string(),
                    };
                    text += &format!("{name}{{registry=\"{registry}\"}} {value}\n");
                }
            }
            text + "# EOF\n"
        };
        // No registry yet: the families are listed without rows.
        assert_eq!(encode(), families(&[]));

        agg.add_registry(registry(
            ProviderId::Kubernetes,
            "c1",
            vec![svc(ProviderId::Kubernetes, "c1", None, 1)],
        ));
        agg.add_registry(Arc::new(Fixed {
            provider: ProviderId::Consul,
            cluster: "dc1".into(),
            services: Vec::new(),
            stale: true,
        }));
        let (sink, _rx) = crate::events::UpdateSink::new(Arc::new(crate::EndpointIndex::new()));
        agg.add_registry(Arc::new(crate::MemoryRegistry::new_unsynced("c2", sink)));
        assert_eq!(
            encode(),
            families(&[
                ("Kubernetes/c1", 1, 0, 1),
                ("Mock/c2", 0, 0, 0),
                ("Consul/dc1", 1, 1, 0),
            ])
        );
    }

    #[test]
    fn a_registry_going_from_some_services_to_none_is_counted_once() {
        let agg = Arc::new(Aggregate::new("c1"));
        let mut metrics = Registry::default();
        agg.register_metrics(&mut metrics);
        let emptied_row = || {
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, &metrics).unwrap();
            text.lines()
                .find(|l| l.starts_with("meshfed_registry_emptied{registry=\"Mock/m1\"}"))
                .map(str::to_string)
        };
        let (sink, _rx) = crate::events::UpdateSink::new(Arc::new(crate::EndpointIndex::new()));
        let mock = crate::MemoryRegistry::new("m1", sink);
        let shard = ShardKey::new(ProviderId::Mock, "m1");
        agg.add_registry(Arc::new(mock.clone()));

        // Empty from the start is not "emptied".
        agg.merged();
        assert_eq!(agg.emptied_count(&shard), 0);
        let first = svc(ProviderId::Mock, "m1", None, 1);
        let a = first.key();
        mock.add_service(first);
        let mut other = svc(ProviderId::Mock, "m1", None, 1);
        other.hostname = "bar.ns.svc.cluster.local".into();
        let b = other.key();
        mock.add_service(other);
        agg.merged();
        mock.remove_service(&a);
        agg.merged();
        assert_eq!(agg.emptied_count(&shard), 0, "2 -> 1 is not emptied");

        mock.remove_service(&b);
        assert!(agg.merged().services.is_empty());
        assert_eq!(agg.emptied_count(&shard), 1);
        assert_eq!(
            emptied_row().as_deref(),
            Some("meshfed_registry_emptied{registry=\"Mock/m1\"} 1")
        );
        // Staying empty over more merges counts nothing more; refilling and emptying
        // again counts again.
        agg.merged();
        assert_eq!(agg.emptied_count(&shard), 1);
        mock.add_service(svc(ProviderId::Mock, "m1", None, 1));
        agg.merged();
        mock.remove_service(&a);
        agg.merged();
        assert_eq!(agg.emptied_count(&shard), 2);

        // A removed registry is not counted as emptied, and its count goes with it.
        mock.add_service(svc(ProviderId::Mock, "m1", None, 1));
        agg.merged();
        assert!(agg.remove_registry(&shard));
        agg.merged();
        assert_eq!(agg.emptied_count(&shard), 0);
        assert_eq!(emptied_row(), None);
    }

    #[test]
    fn kubernetes_clusters_merge_with_per_cluster_vips() {
        let agg = Aggregate::new("c1");
        let mut a = svc(ProviderId::Kubernetes, "c1", Some("10.0.0.1"), 1);
        a.service_accounts.insert("sa-a".into());
        let mut b = svc(ProviderId::Kubernetes, "c2", Some("10.1.0.1"), 100);
        b.service_accounts.insert("sa-b".into());
        agg.add_registry(registry(ProviderId::Kubernetes, "c2", vec![b]));
        agg.add_registry(registry(ProviderId::Kubernetes, "c1", vec![a]));
        let merged = agg.merged();
        assert_eq!(merged.services.len(), 1);
        let s = &merged.services[0];
        assert_eq!(
            s.cluster_id.as_str(),
            "c1",
            "the primary cluster supplies the base even though c2 is older"
        );
        assert_eq!(s.cluster_vips.len(), 2);
        assert_eq!(
            s.address_for(Some(&"c2".into())).unwrap().to_string(),
            "10.1.0.1"
        );
        assert_eq!(s.address_for(None).unwrap().to_string(), "10.0.0.1");
        assert_eq!(s.service_accounts.len(), 2);
        assert!(merged.conflicts.is_empty());
    }

    #[test]
    fn without_the_primary_cluster_the_oldest_kubernetes_service_is_the_base() {
        let agg = Aggregate::new("local");
        agg.add_registry(registry(
            ProviderId::Kubernetes,
            "c1",
            vec![svc(ProviderId::Kubernetes, "c1", Some("10.0.0.1"), 1)],
        ));
        agg.add_registry(registry(
            ProviderId::Kubernetes,
            "c2",
            vec![svc(ProviderId::Kubernetes, "c2", Some("10.1.0.1"), 50)],
        ));
        assert_eq!(agg.merged().services[0].cluster_id.as_str(), "c2");
    }

    #[test]
    fn kubernetes_beats_other_providers_even_when_younger() {
        let agg = Aggregate::new("c1");
        agg.add_registry(registry(
            ProviderId::External,
            "c1",
            vec![svc(ProviderId::External, "c1", None, 1000)],
        ));
        agg.add_registry(registry(
            ProviderId::Kubernetes,
            "c1",
            vec![svc(ProviderId::Kubernetes, "c1", Some("10.0.0.1"), 1)],
        ));
        let merged = agg.merged();
        assert_eq!(merged.services[0].provider, ProviderId::Kubernetes);
        assert_eq!(merged.conflicts.len(), 1);
        assert_eq!(
            merged.conflicts[0].reason,
            ConflictReason::KubernetesPrecedence
        );
        assert_eq!(merged.conflicts[0].loser.to_string(), "External/c1");
    }

    #[test]
    fn otherwise_the_oldest_wins_regardless_of_registration_order() {
        for order in [[0, 1], [1, 0]] {
            let agg = Aggregate::new("c1");
            let regs = [
                registry(
                    ProviderId::Mock,
                    "m1",
                    vec![svc(ProviderId::Mock, "m1", None, 10)],
                ),
                registry(
                    ProviderId::Consul,
                    "dc1",
                    vec![svc(ProviderId::Consul, "dc1", None, 20)],
                ),
            ];
            for i in order {
                agg.add_registry(regs[i].clone());
            }
            let merged = agg.merged();
            assert_eq!(merged.services[0].provider, ProviderId::Consul);
            assert_eq!(merged.conflicts[0].reason, ConflictReason::OldestWins);
        }
    }

    #[test]
    fn the_primary_cluster_id_does_not_help_a_younger_non_kubernetes_service() {
        // The ServiceEntry registry runs under the primary cluster's id.
        let agg = Aggregate::new("c1");
        agg.add_registry(registry(
            ProviderId::External,
            "c1",
            vec![svc(ProviderId::External, "c1", None, 1)],
        ));
        agg.add_registry(registry(
            ProviderId::Mock,
            "m1",
            vec![svc(ProviderId::Mock, "m1", None, 100)],
        ));
        let merged = agg.merged();
        assert_eq!(merged.services[0].provider, ProviderId::Mock);
        assert_eq!(merged.conflicts.len(), 1);
        assert_eq!(merged.conflicts[0].reason, ConflictReason::OldestWins);
        assert_eq!(
            merged.conflicts[0].loser,
            ShardKey::new(ProviderId::External, "c1")
        );
    }

    #[test]
    fn equal_ages_break_ties_by_provider_then_cluster() {
        let agg = Aggregate::new("x");
        agg.add_registry(registry(
            ProviderId::Mock,
            "b",
            vec![svc(ProviderId::Mock, "b", None, 5)],
        ));
        agg.add_registry(registry(
            ProviderId::Mock,
            "a",
            vec![svc(ProviderId::Mock, "a", None, 5)],
        ));
        assert_eq!(agg.merged().services[0].cluster_id.as_str(), "a");
    }

    #[test]
    fn same_hostname_in_different_namespaces_stays_separate() {
        let agg = Aggregate::new("c1");
        let a = svc(ProviderId::External, "c1", None, 1);
        let mut b = a.clone();
        b.namespace = "other".into();
        agg.add_registry(registry(ProviderId::External, "c1", vec![a, b]));
        assert_eq!(agg.merged().services.len(), 2);
    }

    #[test]
    fn port_mismatch_across_clusters_is_reported() {
        let agg = Aggregate::new("c1");
        let a = svc(ProviderId::Kubernetes, "c1", Some("10.0.0.1"), 1);
        let mut b = svc(ProviderId::Kubernetes, "c2", Some("10.1.0.1"), 1);
        b.ports.push(Port::new("grpc", 90, Protocol::Grpc).unwrap());
        agg.add_registry(registry(ProviderId::Kubernetes, "c1", vec![a]));
        agg.add_registry(registry(ProviderId::Kubernetes, "c2", vec![b]));
        let merged = agg.merged();
        assert_eq!(merged.services[0].ports.len(), 1);
        assert_eq!(merged.conflicts[0].reason, ConflictReason::PortMismatch);
    }

    /// A Kubernetes-like registry that knows one pod and answers only proxies of its
    /// cluster (or proxies naming none).
    #[derive(Clone, Debug)]
    struct OnePod {
        cluster: ClusterId,
        ip: std::net::IpAddr,
    }

    impl ServiceRegistry for OnePod {
        fn provider(&self) -> ProviderId {
            ProviderId::Kubernetes
        }
        fn cluster_id(&self) -> &ClusterId {
            &self.cluster
        }
        fn services(&self) -> Vec<Arc<Service>> {
            Vec::new()
        }
        fn has_synced(&self) -> bool {
            true
        }
        fn workloads(&self) -> Option<Arc<dyn WorkloadLookup>> {
            Some(Arc::new(self.clone()))
        }
    }

    impl WorkloadLookup for OnePod {
        fn find(&self, query: &WorkloadQuery<'_>) -> Option<WorkloadInstance> {
            if query.cluster.is_some_and(|c| *c != self.cluster) || !query.ips.contains(&self.ip) {
                return None;
            }
            Some(WorkloadInstance {
                name: format!("pod-in-{}", self.cluster),
                namespace: "ns".into(),
                cluster_id: self.cluster.clone(),
                labels: Default::default(),
                locality: Default::default(),
                service_account: None,
                targets: Vec::new(),
            })
        }
    }

    #[test]
    fn workloads_come_from_the_proxy_cluster_else_the_primary_first() {
        let agg = Aggregate::new("c2");
        let ip = "10.0.0.1".parse().unwrap();
        agg.add_registry(registry(ProviderId::Mock, "a", vec![]));
        for cluster in ["c1", "c2", "c3"] {
            agg.add_registry(Arc::new(OnePod {
                cluster: cluster.into(),
                ip,
            }));
        }
        let sources = agg.workload_sources();
        let find = |cluster: Option<&str>| {
            let cluster = cluster.map(ClusterId::new);
            sources
                .find(&WorkloadQuery {
                    ips: &[ip],
                    id: "pod.ns",
                    namespace: "ns",
                    cluster: cluster.as_ref(),
                })
                .map(|w| w.name)
        };
        assert_eq!(find(None).as_deref(), Some("pod-in-c2"), "primary first");
        assert_eq!(find(Some("c3")).as_deref(), Some("pod-in-c3"));
        assert_eq!(find(Some("elsewhere")), None);
    }

    /// A registry whose one pod can move: `workloads` hands out the pod as it is now.
    #[derive(Debug)]
    struct MovingPod {
        cluster: ClusterId,
        now: RwLock<Arc<OnePod>>,
    }

    impl MovingPod {
        fn move_to(&self, ip: &str) {
            *self.now.write().unwrap() = Arc::new(OnePod {
                cluster: self.cluster.clone(),
                ip: ip.parse().unwrap(),
            });
        }
    }

    impl ServiceRegistry for MovingPod {
        fn provider(&self) -> ProviderId {
            ProviderId::Kubernetes
        }
        fn cluster_id(&self) -> &ClusterId {
            &self.cluster
        }
        fn services(&self) -> Vec<Arc<Service>> {
            Vec::new()
        }
        fn has_synced(&self) -> bool {
            true
        }
        fn workloads(&self) -> Option<Arc<dyn WorkloadLookup>> {
            Some(self.now.read().unwrap().clone())
        }
    }

    #[test]
    fn workload_sources_answer_from_the_registries_as_they_were_when_taken() {
        let agg = Aggregate::new("c1");
        let registry = Arc::new(MovingPod {
            cluster: "c1".into(),
            now: RwLock::new(Arc::new(OnePod {
                cluster: "c1".into(),
                ip: "10.0.0.1".parse().unwrap(),
            })),
        });
        agg.add_registry(registry.clone());
        let found = |sources: &WorkloadSources, ip: &str| {
            let ips = [ip.parse().unwrap()];
            sources
                .find(&WorkloadQuery {
                    ips: &ips,
                    id: "pod.ns",
                    namespace: "ns",
                    cluster: None,
                })
                .is_some()
        };
        let frozen = agg.workload_sources();
        assert!(found(&frozen, "10.0.0.1"));

        registry.move_to("10.0.0.2");
        assert!(
            found(&frozen, "10.0.0.1") && !found(&frozen, "10.0.0.2"),
            "taken before the move: still the old pod"
        );
        let now = agg.workload_sources();
        assert!(!found(&now, "10.0.0.1") && found(&now, "10.0.0.2"));

        // A registry added (or removed) later is not among the frozen sources either.
        agg.add_registry(Arc::new(OnePod {
            cluster: "c2".into(),
            ip: "10.0.0.3".parse().unwrap(),
        }));
        assert!(!found(&frozen, "10.0.0.3"));
        assert!(found(&agg.workload_sources(), "10.0.0.3"));
    }

    #[test]
    fn replacing_and_removing_registries() {
        let agg = Aggregate::new("c1");
        agg.add_registry(registry(
            ProviderId::Mock,
            "m",
            vec![svc(ProviderId::Mock, "m", None, 1)],
        ));
        agg.add_registry(registry(ProviderId::Mock, "m", vec![]));
        assert_eq!(agg.registries().len(), 1);
        assert!(agg.merged().services.is_empty());
        assert!(agg.remove_registry(&ShardKey::new(ProviderId::Mock, "m")));
        assert!(agg.registries().is_empty());
    }
}
