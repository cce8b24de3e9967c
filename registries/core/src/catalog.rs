//! What a catalog registry (Consul, Nacos, Eureka: one writer task following a remote
//! catalog) publishes to its readers: the services and endpoints of its last
//! successful read, swapped in whole, and whether it has synced and is serving a
//! stale view through an outage.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arc_swap::{ArcSwap, Guard};

use crate::model::{Endpoint, Service, ServiceKey};

/// One published state of the catalog.
#[derive(Debug, Default)]
pub struct CatalogSnapshot {
    pub services: BTreeMap<ServiceKey, Arc<Service>>,
    pub endpoints: BTreeMap<ServiceKey, Arc<[Endpoint]>>,
}

/// The catalog's published state, read without locks.
#[derive(Debug, Default)]
pub struct CatalogView {
    view: ArcSwap<CatalogSnapshot>,
    synced: AtomicBool,
    stale: AtomicBool,
}

impl CatalogView {
    /// The state published last.
    pub fn load(&self) -> Guard<Arc<CatalogSnapshot>> {
        self.view.load()
    }

    /// Publishes `snapshot` in place of the last one.
    pub fn store(&self, snapshot: Arc<CatalogSnapshot>) {
        self.view.store(snapshot);
    }

    /// Every published service.
    pub fn services(&self) -> Vec<Arc<Service>> {
        self.view.load().services.values().cloned().collect()
    }

    /// One published service.
    pub fn service(&self, key: &ServiceKey) -> Option<Arc<Service>> {
        self.view.load().services.get(key).cloned()
    }

    /// The published endpoints of a service (kept through outages).
    pub fn endpoints(&self, key: &ServiceKey) -> Vec<Endpoint> {
        self.view
            .load()
            .endpoints
            .get(key)
            .map(|e| e.to_vec())
            .unwrap_or_default()
    }

    /// Whether the first complete read was published.
    pub fn has_synced(&self) -> bool {
        self.synced.load(Ordering::SeqCst)
    }

    /// Records that the first complete read was published.
    pub fn set_synced(&self) {
        self.synced.store(true, Ordering::SeqCst);
    }

    /// Whether the published state is the last one read before a failure.
    pub fn is_stale(&self) -> bool {
        self.stale.load(Ordering::SeqCst)
    }

    /// Sets whether the published state is stale; returns what it was.
    pub fn set_stale(&self, stale: bool) -> bool {
        self.stale.swap(stale, Ordering::SeqCst)
    }
}
