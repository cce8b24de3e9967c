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

/// The shared endpoint index. Writers hold the lock only to swap one entry; readers take
/// a cheap copy of the entry map (a map of `Arc`s) when a snapshot is built.
#[derive(Debug, Default)]
pub struct EndpointIndex {
    entries: Mutex<HashMap<ServiceKey, Arc<EndpointShards>>>,
}

impl EndpointIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// Replaces `shard`'s endpoints for `key` and says what push that needs.
    pub fn update(
        &self,
        shard: &ShardKey,
        key: &ServiceKey,
        endpoints: Vec<Endpoint>,
    ) -> EndpointPush {
        let mut entries = self.entries.lock().expect("endpoint index poisoned");
        let created = !entries.contains_key(key);
        let current = entries.entry(key.clone()).or_default();
        if endpoints.is_empty() {
            if !current.shards.contains_key(shard) {
                return if created {
                    EndpointPush::Full
                } else {
                    EndpointPush::None
                };
            }
            let mut next = (**current).clone();
            next.shards.remove(shard);
            next.recompute_service_accounts();
            *current = Arc::new(next);
            return EndpointPush::Incremental;
        }
        if current
            .shards
            .get(shard)
            .is_some_and(|old| **old == *endpoints)
        {
            return if created {
                EndpointPush::Full
            } else {
                EndpointPush::None
            };
        }
        let mut next = (**current).clone();
        let old_accounts = std::mem::take(&mut next.service_accounts);
        next.shards.insert(shard.clone(), Arc::from(endpoints));
        next.recompute_service_accounts();
        let accounts_changed = old_accounts != next.service_accounts;
        *current = Arc::new(next);
        if created || accounts_changed {
            EndpointPush::Full
        } else {
            EndpointPush::Incremental
        }
    }

    /// Drops `shard`'s endpoints for `key` (the registry deleted the service). The key
    /// itself goes when no shard is left.
    pub fn delete_service_shard(&self, shard: &ShardKey, key: &ServiceKey) {
        let mut entries = self.entries.lock().expect("endpoint index poisoned");
        let Some(current) = entries.get_mut(key) else {
            return;
        };
        if current.shards.contains_key(shard) {
            let mut next = (**current).clone();
            next.shards.remove(shard);
            next.recompute_service_accounts();
            *current = Arc::new(next);
        }
        if current.shards.is_empty() {
            entries.remove(key);
        }
    }

    /// Drops a whole registry's shard from every service (the registry was removed).
    /// Returns the keys that lost endpoints.
    pub fn remove_shard(&self, shard: &ShardKey) -> Vec<ServiceKey> {
        let mut entries = self.entries.lock().expect("endpoint index poisoned");
        let mut touched = Vec::new();
        entries.retain(|key, current| {
            if current.shards.contains_key(shard) {
                let mut next = (**current).clone();
                next.shards.remove(shard);
                next.recompute_service_accounts();
                touched.push(key.clone());
                if next.shards.is_empty() {
                    return false;
                }
                *current = Arc::new(next);
            }
            true
        });
        touched.sort();
        touched
    }

    /// The shards of one service.
    pub fn get(&self, key: &ServiceKey) -> Option<Arc<EndpointShards>> {
        self.entries
            .lock()
            .expect("endpoint index poisoned")
            .get(key)
            .cloned()
    }

    /// Whether the index has an entry (possibly with no endpoints) for `key`.
    pub fn contains(&self, key: &ServiceKey) -> bool {
        self.entries
            .lock()
            .expect("endpoint index poisoned")
            .contains_key(key)
    }

    /// A point-in-time copy of the whole index for a snapshot.
    pub fn snapshot(&self) -> HashMap<ServiceKey, Arc<EndpointShards>> {
        self.entries
            .lock()
            .expect("endpoint index poisoned")
            .clone()
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
