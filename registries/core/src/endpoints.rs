//! The endpoint index: `(hostname, namespace)` -> one shard of endpoints per registry.
//!
//! Endpoints never go through the aggregate. Each registry replaces its own shard, and
//! the index says what kind of push that change needs (Istio's `EDSUpdate` rules):
//! a key seen for the first time or a changed set of service accounts is a full push;
//! changed endpoints are an incremental (EDS-only) push; identical endpoints need none.
//! An empty list drops the shard but keeps the key, so a service flapping between zero
//! and one endpoint does not cause full pushes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use serde::Serialize;

use crate::model::{Endpoint, ServiceKey, ShardKey};

/// The endpoints of one service, per registry shard. Immutable once built: the index
/// swaps in a new `Arc` on every change so snapshots can hold the old one.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct EndpointShards {
    /// One list per registry, iterated in key order for deterministic output.
    pub shards: BTreeMap<ShardKey, Arc<[Endpoint]>>,
    /// Union of the endpoints' service accounts (secure naming in CDS).
    pub service_accounts: BTreeSet<String>,
}

impl EndpointShards {
    /// Every endpoint of every shard, shards in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&ShardKey, &Endpoint)> {
        self.shards
            .iter()
            .flat_map(|(k, eps)| eps.iter().map(move |e| (k, e)))
    }

    /// Number of endpoints over all shards.
    pub fn len(&self) -> usize {
        self.shards.values().map(|s| s.len()).sum()
    }

    /// True when no shard holds an endpoint.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn recompute_service_accounts(&mut self) {
        self.service_accounts = self
            .iter()
            .filter_map(|(_, e)| e.service_account.clone())
            .collect();
    }
}

/// What an endpoint change requires from the push pipeline.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum EndpointPush {
    /// Nothing a proxy sees changed.
    None,
    /// Re-send only this service's load assignments.
    Incremental,
    /// Clusters may change (new service, new identities): full push.
    Full,
}

/// Every service's endpoint shards: the index's content, and what a snapshot holds.
/// Looked up for every cluster of every proxy push, so hashed with foldhash rather
/// than SipHash.
pub type EndpointMap = HashMap<ServiceKey, Arc<EndpointShards>, foldhash::fast::RandomState>;

/// The shared endpoint index. Its content is one copy-on-write map: a snapshot takes
/// the map itself (an `Arc`, no copy), and the first write after that copies the map
/// of `Arc`s once (never the endpoints), so a snapshot shares every unchanged shard
/// with its predecessor. Writers hold the lock only while swapping entries; a write
/// that changes nothing copies nothing.
#[derive(Debug, Default)]
pub struct EndpointIndex {
    entries: Mutex<Arc<EndpointMap>>,
}

impl EndpointIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Arc<EndpointMap>> {
        self.entries.lock().expect("endpoint index poisoned")
    }

    /// Replaces `shard`'s endpoints for `key` and says what push that needs.
    pub fn update(
        &self,
        shard: &ShardKey,
        key: &ServiceKey,
        endpoints: Vec<Endpoint>,
    ) -> EndpointPush {
        let mut entries = self.lock();
        let existing = entries.get(key).cloned();
        let created = existing.is_none();
        let current = existing.unwrap_or_default();
        let unchanged = if endpoints.is_empty() {
            !current.shards.contains_key(shard)
        } else {
            current
                .shards
                .get(shard)
                .is_some_and(|old| **old == *endpoints)
        };
        if unchanged {
            if created {
                // The key is kept even with no endpoints (see the module docs).
                Arc::make_mut(&mut entries).insert(key.clone(), current);
                return EndpointPush::Full;
            }
            return EndpointPush::None;
        }
        let mut next = (*current).clone();
        if endpoints.is_empty() {
            // Dropping a shard keeps the key: flapping to zero and back stays
            // incremental.
            next.shards.remove(shard);
            next.recompute_service_accounts();
            Arc::make_mut(&mut entries).insert(key.clone(), Arc::new(next));
            return EndpointPush::Incremental;
        }
        let old_accounts = std::mem::take(&mut next.service_accounts);
        next.shards.insert(shard.clone(), Arc::from(endpoints));
        next.recompute_service_accounts();
        let accounts_changed = old_accounts != next.service_accounts;
        Arc::make_mut(&mut entries).insert(key.clone(), Arc::new(next));
        if created || accounts_changed {
            EndpointPush::Full
        } else {
            EndpointPush::Incremental
        }
    }

    /// Drops `shard`'s endpoints for `key` (the registry deleted the service). The key
    /// itself goes when no shard is left.
    pub fn delete_service_shard(&self, shard: &ShardKey, key: &ServiceKey) {
        let mut entries = self.lock();
        let Some(current) = entries.get(key) else {
            return;
        };
        if current.shards.contains_key(shard) {
            let mut next = (**current).clone();
            next.shards.remove(shard);
            next.recompute_service_accounts();
            let map = Arc::make_mut(&mut entries);
            if next.shards.is_empty() {
                map.remove(key);
            } else {
                map.insert(key.clone(), Arc::new(next));
            }
        } else if current.shards.is_empty() {
            Arc::make_mut(&mut entries).remove(key);
        }
    }

    /// Drops a whole registry's shard from every service (the registry was removed).
    /// Returns the keys that lost endpoints.
    pub fn remove_shard(&self, shard: &ShardKey) -> Vec<ServiceKey> {
        let mut entries = self.lock();
        let mut touched: Vec<ServiceKey> = entries
            .iter()
            .filter(|(_, current)| current.shards.contains_key(shard))
            .map(|(key, _)| key.clone())
            .collect();
        if touched.is_empty() {
            return touched;
        }
        let map = Arc::make_mut(&mut entries);
        for key in &touched {
            let mut next = (*map[key]).clone();
            next.shards.remove(shard);
            next.recompute_service_accounts();
            if next.shards.is_empty() {
                map.remove(key);
            } else {
                map.insert(key.clone(), Arc::new(next));
            }
        }
        touched.sort();
        touched
    }

    /// The shards of one service.
    pub fn get(&self, key: &ServiceKey) -> Option<Arc<EndpointShards>> {
        self.lock().get(key).cloned()
    }

    /// Whether the index has an entry (possibly with no endpoints) for `key`.
    pub fn contains(&self, key: &ServiceKey) -> bool {
        self.lock().contains_key(key)
    }

    /// The whole index as it is now, for a snapshot: shared, not copied; later writes
    /// do not show in it.
    pub fn snapshot(&self) -> Arc<EndpointMap> {
        self.lock().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ProviderId;

    fn ep(ip: &str) -> Endpoint {
        Endpoint::new(ip.parse().unwrap()).with_port("http", 8080)
    }

    fn key() -> ServiceKey {
        ServiceKey::new("a.ns.svc.cluster.local", "ns")
    }

    #[test]
    fn first_update_is_full_then_incremental_then_none() {
        let index = EndpointIndex::new();
        let shard = ShardKey::new(ProviderId::Mock, "c1");
        assert_eq!(
            index.update(&shard, &key(), vec![ep("10.0.0.1")]),
            EndpointPush::Full
        );
        assert_eq!(
            index.update(&shard, &key(), vec![ep("10.0.0.1"), ep("10.0.0.2")]),
            EndpointPush::Incremental
        );
        assert_eq!(
            index.update(&shard, &key(), vec![ep("10.0.0.1"), ep("10.0.0.2")]),
            EndpointPush::None
        );
    }

    #[test]
    fn zero_endpoints_keep_the_key_so_flapping_is_incremental() {
        let index = EndpointIndex::new();
        let shard = ShardKey::new(ProviderId::Mock, "c1");
        index.update(&shard, &key(), vec![ep("10.0.0.1")]);
        assert_eq!(
            index.update(&shard, &key(), vec![]),
            EndpointPush::Incremental
        );
        assert!(index.contains(&key()));
        assert!(index.get(&key()).unwrap().is_empty());
        assert_eq!(
            index.update(&shard, &key(), vec![ep("10.0.0.1")]),
            EndpointPush::Incremental
        );
    }

    #[test]
    fn service_account_change_is_full() {
        let index = EndpointIndex::new();
        let shard = ShardKey::new(ProviderId::Mock, "c1");
        index.update(&shard, &key(), vec![ep("10.0.0.1")]);
        let mut with_sa = ep("10.0.0.1");
        with_sa.service_account = Some("spiffe://cluster.local/ns/ns/sa/a".into());
        assert_eq!(
            index.update(&shard, &key(), vec![with_sa]),
            EndpointPush::Full
        );
    }

    #[test]
    fn shards_are_independent_and_removal_drops_only_one() {
        let index = EndpointIndex::new();
        let c1 = ShardKey::new(ProviderId::Kubernetes, "c1");
        let c2 = ShardKey::new(ProviderId::Kubernetes, "c2");
        index.update(&c1, &key(), vec![ep("10.0.0.1")]);
        assert_eq!(
            index.update(&c2, &key(), vec![ep("10.1.0.1")]),
            EndpointPush::Incremental
        );
        assert_eq!(index.get(&key()).unwrap().len(), 2);
        assert_eq!(index.remove_shard(&c2), vec![key()]);
        let left = index.get(&key()).unwrap();
        assert_eq!(left.shards.keys().collect::<Vec<_>>(), vec![&c1]);
        assert_eq!(index.remove_shard(&c1), vec![key()]);
        assert!(!index.contains(&key()));
    }

    #[test]
    fn a_snapshot_shares_the_map_and_a_write_copies_only_pointers() {
        let index = EndpointIndex::new();
        let shard = ShardKey::new(ProviderId::Mock, "c1");
        let other = ServiceKey::new("b.ns.svc.cluster.local", "ns");
        index.update(&shard, &key(), vec![ep("10.0.0.1")]);
        index.update(&shard, &other, vec![ep("10.0.0.9")]);
        let first = index.snapshot();
        // No write in between: the same map, not a copy.
        assert!(Arc::ptr_eq(&first, &index.snapshot()));
        // A write that changes nothing copies nothing.
        assert_eq!(
            index.update(&shard, &key(), vec![ep("10.0.0.1")]),
            EndpointPush::None
        );
        assert!(Arc::ptr_eq(&first, &index.snapshot()));
        // A change: a new map whose untouched entries are the very same shards.
        index.update(&shard, &key(), vec![ep("10.0.0.2")]);
        let second = index.snapshot();
        assert!(!Arc::ptr_eq(&first, &second));
        assert!(Arc::ptr_eq(&first[&other], &second[&other]));
        assert!(!Arc::ptr_eq(&first[&key()], &second[&key()]));
    }

    #[test]
    fn snapshots_do_not_see_later_writes() {
        let index = EndpointIndex::new();
        let shard = ShardKey::new(ProviderId::Mock, "c1");
        index.update(&shard, &key(), vec![ep("10.0.0.1")]);
        let snap = index.snapshot();
        index.update(&shard, &key(), vec![ep("10.0.0.2")]);
        let held = &snap[&key()];
        assert_eq!(
            held.iter().next().unwrap().1.address.to_string(),
            "10.0.0.1"
        );
    }
}
