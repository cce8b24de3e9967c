//! The in-memory (mock) registry: services and endpoints set through a Rust API, for
//! tests, demos and the mock-registry file.
//!
//! A [`MemoryRegistry`] is a cheap handle; clones share one registry. Every call updates
//! the in-memory view first and then reports the change through the registry's
//! [`UpdateSink`], so a reader that sees the push also sees the new state.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use crate::events::UpdateSink;
use crate::model::{ClusterId, Endpoint, ProviderId, Service, ServiceKey, ShardKey};
use crate::registry::ServiceRegistry;

/// A service with its endpoints, the unit [`MemoryRegistry::replace_all`] works on.
#[derive(Clone, Debug, PartialEq)]
pub struct ServiceWithEndpoints {
    /// The service.
    pub service: Service,
    /// Its endpoints in this registry.
    pub endpoints: Vec<Endpoint>,
}

/// A registry's content: each service with its endpoints.
type Content = BTreeMap<ServiceKey, (Arc<Service>, Vec<Endpoint>)>;

#[derive(Debug)]
struct Inner {
    provider: ProviderId,
    cluster: ClusterId,
    sink: UpdateSink,
    synced: AtomicBool,
    stale: AtomicBool,
    state: RwLock<Content>,
}

/// An in-memory registry handle.
#[derive(Clone, Debug)]
pub struct MemoryRegistry {
    inner: Arc<Inner>,
}

impl MemoryRegistry {
    /// A `Mock` registry for `cluster`, reporting through `sink`. It counts as synced
    /// at once; use [`MemoryRegistry::new_unsynced`] to hold readiness back.
    pub fn new(cluster: impl Into<ClusterId>, sink: UpdateSink) -> Self {
        let registry = Self::with_provider(ProviderId::Mock, cluster, sink);
        registry.mark_synced();
        registry
    }

    /// A registry that reports not-synced until [`MemoryRegistry::mark_synced`].
    pub fn new_unsynced(cluster: impl Into<ClusterId>, sink: UpdateSink) -> Self {
        Self::with_provider(ProviderId::Mock, cluster, sink)
    }

    /// A registry posing as another provider (for tests of the merge policy with
    /// simulated Kubernetes or Consul sources). Starts unsynced.
    pub fn with_provider(
        provider: ProviderId,
        cluster: impl Into<ClusterId>,
        sink: UpdateSink,
    ) -> Self {
        MemoryRegistry {
            inner: Arc::new(Inner {
                provider,
                cluster: cluster.into(),
                sink,
                synced: AtomicBool::new(false),
                stale: AtomicBool::new(false),
                state: RwLock::new(BTreeMap::new()),
            }),
        }
    }

    /// Marks the initial sync done and tells the push pipeline.
    pub fn mark_synced(&self) {
        if !self.inner.synced.swap(true, Ordering::SeqCst) {
            self.inner.sink.synced(&self.shard_key());
        }
    }

    /// Marks the view as stale (its source is unreachable) or fresh again.
    pub fn set_stale(&self, stale: bool) {
        self.inner.stale.store(stale, Ordering::SeqCst);
    }

    /// Adds or replaces a service. Provider and cluster are set to this registry's.
    /// Endpoints already set for the key are kept.
    pub fn add_service(&self, mut service: Service) {
        service.provider = self.inner.provider;
        service.cluster_id = self.inner.cluster.clone();
        let key = service.key();
        let changed = {
            let mut state = self.inner.state.write().expect("memory registry poisoned");
            match state.get_mut(&key) {
                Some(entry) if *entry.0 == service => false,
                Some(entry) => {
                    entry.0 = Arc::new(service);
                    true
                }
                None => {
                    state.insert(key.clone(), (Arc::new(service), Vec::new()));
                    true
                }
            }
        };
        if changed {
            self.inner.sink.services_changed([key]);
        }
    }

    /// Removes a service and its endpoints; returns whether it existed.
    pub fn remove_service(&self, key: &ServiceKey) -> bool {
        let existed = self
            .inner
            .state
            .write()
            .expect("memory registry poisoned")
            .remove(key)
            .is_some();
        if existed {
            self.inner.sink.service_deleted(&self.shard_key(), key);
        }
        existed
    }

    /// Replaces the endpoints of a service (which need not be added yet: endpoints may
    /// arrive first, as with Kubernetes). Endpoints without a cluster id get this
    /// registry's.
    pub fn set_endpoints(&self, key: &ServiceKey, mut endpoints: Vec<Endpoint>) {
        for e in &mut endpoints {
            if e.cluster_id.is_empty() {
                e.cluster_id = self.inner.cluster.clone();
            }
        }
        if let Some(entry) = self
            .inner
            .state
            .write()
            .expect("memory registry poisoned")
            .get_mut(key)
        {
            entry.1 = endpoints.clone();
        }
        self.inner
            .sink
            .update_endpoints(&self.shard_key(), key, endpoints);
    }

    /// Replaces the whole content, reporting only what differs from the current one:
    /// removed services, added or changed services, changed endpoints. VIPs filed
    /// under the empty cluster id are moved to this registry's cluster.
    pub fn replace_all(&self, next: Vec<ServiceWithEndpoints>) {
        let mut wanted: BTreeMap<ServiceKey, ServiceWithEndpoints> = BTreeMap::new();
        for mut entry in next {
            entry.service.provider = self.inner.provider;
            entry.service.cluster_id = self.inner.cluster.clone();
            // VIPs given without a cluster (as the mock file does) belong to this one.
            if let Some(vips) = entry.service.cluster_vips.remove(&ClusterId::default()) {
                entry
                    .service
                    .cluster_vips
                    .insert(self.inner.cluster.clone(), vips);
            }
            for e in &mut entry.endpoints {
                if e.cluster_id.is_empty() {
                    e.cluster_id = self.inner.cluster.clone();
                }
            }
            wanted.insert(entry.service.key(), entry);
        }
        let current: Vec<ServiceKey> = self
            .inner
            .state
            .read()
            .expect("memory registry poisoned")
            .keys()
            .cloned()
            .collect();
        for key in current.iter().filter(|k| !wanted.contains_key(*k)) {
            self.remove_service(key);
        }
        for (key, entry) in wanted {
            let (unchanged_service, unchanged_endpoints) = self
                .inner
                .state
                .read()
                .expect("memory registry poisoned")
                .get(&key)
                .map_or((false, false), |(s, e)| {
                    (**s == entry.service, *e == entry.endpoints)
                });
            if !unchanged_service {
                self.add_service(entry.service);
            } else if unchanged_endpoints {
                // A file rewritten for one change repeats every other service as it was.
                continue;
            }
            self.set_endpoints(&key, entry.endpoints);
        }
    }

    /// The endpoints currently set for a service.
    pub fn endpoints(&self, key: &ServiceKey) -> Vec<Endpoint> {
        self.inner
            .state
            .read()
            .expect("memory registry poisoned")
            .get(key)
            .map(|e| e.1.clone())
            .unwrap_or_default()
    }
}

impl ServiceRegistry for MemoryRegistry {
    fn provider(&self) -> ProviderId {
        self.inner.provider
    }

    fn cluster_id(&self) -> &ClusterId {
        &self.inner.cluster
    }

    fn shard_key(&self) -> ShardKey {
        ShardKey::new(self.inner.provider, self.inner.cluster.clone())
    }

    fn services(&self) -> Vec<Arc<Service>> {
        self.inner
            .state
            .read()
            .expect("memory registry poisoned")
            .values()
            .map(|(s, _)| s.clone())
            .collect()
    }

    fn has_synced(&self) -> bool {
        self.inner.synced.load(Ordering::SeqCst)
    }

    fn is_stale(&self) -> bool {
        self.inner.stale.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoints::EndpointIndex;
    use crate::events::RegistryEvent;
    use crate::model::{Port, Protocol};

    fn service(host: &str) -> Service {
        let mut s = Service::new(host, "default", ProviderId::Mock, "");
        s.ports.push(Port::new("http", 80, Protocol::Http).unwrap());
        s
    }

    fn drain(rx: &mut tokio::sync::mpsc::UnboundedReceiver<RegistryEvent>) -> Vec<RegistryEvent> {
        std::iter::from_fn(|| rx.try_recv().ok()).collect()
    }

    #[test]
    fn api_updates_state_and_index_and_announces() {
        let index = Arc::new(EndpointIndex::new());
        let (sink, mut rx) = UpdateSink::new(index.clone());
        let reg = MemoryRegistry::new("c1", sink);
        assert!(reg.has_synced());
        let key = ServiceKey::new("a.default.svc.cluster.local", "default");
        reg.add_service(service("a.default.svc.cluster.local"));
        reg.set_endpoints(
            &key,
            vec![Endpoint::new("10.0.0.1".parse().unwrap()).with_port("http", 8080)],
        );
        assert_eq!(reg.services().len(), 1);
        let shards = index.get(&key).unwrap();
        assert_eq!(shards.iter().next().unwrap().1.cluster_id.as_str(), "c1");
        let events = drain(&mut rx);
        assert!(matches!(events[0], RegistryEvent::Synced(_)));
        assert_eq!(events.len(), 3);
        assert!(reg.remove_service(&key));
        assert!(!index.contains(&key));
        assert!(!reg.remove_service(&key));
    }

    #[test]
    fn replace_all_reports_only_differences() {
        let index = Arc::new(EndpointIndex::new());
        let (sink, mut rx) = UpdateSink::new(index);
        let reg = MemoryRegistry::new("c1", sink);
        let entry = |host: &str, ip: &str| ServiceWithEndpoints {
            service: service(host),
            endpoints: vec![Endpoint::new(ip.parse().unwrap()).with_port("http", 8080)],
        };
        reg.replace_all(vec![entry("a.x", "10.0.0.1"), entry("b.x", "10.0.0.2")]);
        drain(&mut rx);
        reg.replace_all(vec![entry("a.x", "10.0.0.1"), entry("b.x", "10.0.0.3")]);
        let events = drain(&mut rx);
        assert_eq!(events.len(), 1, "only b's endpoints changed: {events:?}");
        let RegistryEvent::Push(req) = &events[0] else {
            panic!()
        };
        assert!(req.is_endpoints_only());
        reg.replace_all(vec![entry("a.x", "10.0.0.1")]);
        let events = drain(&mut rx);
        assert_eq!(events.len(), 1);
        let RegistryEvent::Push(req) = &events[0] else {
            panic!()
        };
        assert!(req.full);
        assert_eq!(reg.services().len(), 1);
    }

    #[test]
    fn replace_all_files_unclustered_vips_under_this_cluster() {
        let (sink, _rx) = UpdateSink::new(Arc::new(EndpointIndex::new()));
        let reg = MemoryRegistry::new("c1", sink);
        let mut s = service("a.x");
        s.cluster_vips
            .insert(ClusterId::default(), vec!["10.0.0.1".parse().unwrap()]);
        reg.replace_all(vec![ServiceWithEndpoints {
            service: s,
            endpoints: vec![],
        }]);
        let vips = &reg.services()[0].cluster_vips;
        assert_eq!(
            vips.keys().map(|c| c.as_str()).collect::<Vec<_>>(),
            vec!["c1"]
        );
    }
}
