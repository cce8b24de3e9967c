//! The watch index: (type, resource name) -> the connections watching it, plus the
//! wildcard watchers of each type, kept up to date as subscriptions change. An
//! incremental push asks it which connections watch a changed name, and wakes only
//! those, handing each the names it watches.
//!
//! Subscriptions are interned (connections asking for the same names share one set,
//! see `ads::intern`), and a mesh of thousands of sidecars has few distinct sets. The
//! index therefore maps names to the distinct sets that contain them, and each set to
//! the connections holding it: a connection changing its subscription costs the size
//! of a set only when it is the first to hold it or the last to drop it.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, RwLock};

use crate::xds::TypeUrl;
use crate::xds::names::host_of;

/// A connection, as the index knows it.
pub type ConnId = u64;

/// A subscribed name set, identified by its shared allocation.
type SetId = usize;

fn set_id(names: &Arc<BTreeSet<String>>) -> SetId {
    Arc::as_ptr(names) as SetId
}

#[derive(Debug)]
struct HeldSet {
    names: Arc<BTreeSet<String>>,
    connections: HashSet<ConnId>,
}

#[derive(Debug, Default)]
struct TypeIndex {
    sets: HashMap<SetId, HeldSet>,
    /// Host -> name -> the sets that contain the name.
    by_host: HashMap<Arc<str>, HashMap<Arc<str>, HashSet<SetId>>>,
    wildcard: HashSet<ConnId>,
}

impl TypeIndex {
    fn add(&mut self, conn: ConnId, names: &Arc<BTreeSet<String>>) {
        if names.is_empty() {
            return;
        }
        let id = set_id(names);
        let held = self.sets.entry(id).or_insert_with(|| HeldSet {
            names: names.clone(),
            connections: HashSet::new(),
        });
        let first = held.connections.is_empty();
        held.connections.insert(conn);
        if first {
            for name in names.iter() {
                let host: Arc<str> = Arc::from(host_of(name));
                self.by_host
                    .entry(host)
                    .or_default()
                    .entry(Arc::from(name.as_str()))
                    .or_default()
                    .insert(id);
            }
        }
    }

    fn remove(&mut self, conn: ConnId, names: &Arc<BTreeSet<String>>) {
        let id = set_id(names);
        let Some(held) = self.sets.get_mut(&id) else {
            return;
        };
        held.connections.remove(&conn);
        if !held.connections.is_empty() {
            return;
        }
        let held = self.sets.remove(&id).expect("present");
        for name in held.names.iter() {
            let host = host_of(name);
            if let Some(by_name) = self.by_host.get_mut(host) {
                if let Some(sets) = by_name.get_mut(name.as_str()) {
                    sets.remove(&id);
                    if sets.is_empty() {
                        by_name.remove(name.as_str());
                    }
                }
                if by_name.is_empty() {
                    self.by_host.remove(host);
                }
            }
        }
    }
}

/// What one connection watches of one type, as the index records it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Watched {
    /// The interned name set.
    pub names: Option<Arc<BTreeSet<String>>>,
    /// Subscribed to everything of the type.
    pub wildcard: bool,
}

impl Watched {
    /// The same subscription: the same interned name set (by identity) and wildcard.
    pub fn same(&self, other: &Watched) -> bool {
        self.wildcard == other.wildcard
            && match (&self.names, &other.names) {
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                (None, None) => true,
                _ => false,
            }
    }
}

/// Who watches what, for every type.
#[derive(Debug, Default)]
pub struct WatchIndex {
    types: RwLock<HashMap<TypeUrl, TypeIndex>>,
}

/// The connections an incremental push reaches.
#[derive(Debug, Default)]
pub struct Watchers {
    /// The changed names each subscribed set holds, with the connections holding the
    /// set (one connection holds one set per type).
    pub by_set: Vec<(Arc<BTreeSet<String>>, Vec<ConnId>)>,
    /// Connections watching every resource of the type.
    pub wildcard: HashSet<ConnId>,
}

impl WatchIndex {
    /// Records that `conn` now watches `after` of `type_url` instead of `before`.
    pub fn update(&self, conn: ConnId, type_url: TypeUrl, before: &Watched, after: &Watched) {
        if before.same(after) {
            return;
        }
        let mut types = self.types.write().expect("watch index poisoned");
        let index = types.entry(type_url).or_default();
        if let Some(names) = &before.names {
            index.remove(conn, names);
        }
        if let Some(names) = &after.names {
            index.add(conn, names);
        }
        if after.wildcard {
            index.wildcard.insert(conn);
        } else {
            index.wildcard.remove(&conn);
        }
    }

    /// The connections watching a resource of `type_url` derived from one of `hosts`,
    /// each with the names it watches; and the wildcard watchers of the type.
    pub fn watchers<'a>(
        &self,
        type_url: TypeUrl,
        hosts: impl IntoIterator<Item = &'a str>,
    ) -> Watchers {
        let types = self.types.read().expect("watch index poisoned");
        let Some(index) = types.get(&type_url) else {
            return Watchers::default();
        };
        // Set -> the changed names it holds, then fanned out to the set's holders.
        let mut per_set: HashMap<SetId, Vec<&Arc<str>>> = HashMap::new();
        for host in hosts {
            let Some(by_name) = index.by_host.get(host) else {
                continue;
            };
            for (name, sets) in by_name {
                for set in sets {
                    per_set.entry(*set).or_default().push(name);
                }
            }
        }
        let by_set = per_set
            .into_iter()
            .map(|(set, names)| {
                let held = &index.sets[&set];
                let names: BTreeSet<String> = names.iter().map(|n| n.to_string()).collect();
                (Arc::new(names), held.connections.iter().copied().collect())
            })
            .collect();
        Watchers {
            by_set,
            wildcard: index.wildcard.clone(),
        }
    }

    /// Distinct name sets and indexed names per type, for debug output.
    pub fn sizes(&self) -> Vec<(TypeUrl, usize, usize)> {
        let types = self.types.read().expect("watch index poisoned");
        let mut out: Vec<(TypeUrl, usize, usize)> = types
            .iter()
            .map(|(t, i)| (*t, i.sets.len(), i.by_host.values().map(HashMap::len).sum()))
            .collect();
        out.sort();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> Arc<BTreeSet<String>> {
        Arc::new(names.iter().map(|s| s.to_string()).collect())
    }

    fn watched(names: &Arc<BTreeSet<String>>) -> Watched {
        Watched {
            names: Some(names.clone()),
            wildcard: false,
        }
    }

    fn by_conn(w: &Watchers) -> HashMap<ConnId, BTreeSet<String>> {
        let mut out = HashMap::new();
        for (names, conns) in &w.by_set {
            for c in conns {
                assert!(
                    out.insert(*c, (**names).clone()).is_none(),
                    "one set per connection"
                );
            }
        }
        out
    }

    const A80: &str = "outbound|80||a.ns.svc.cluster.local";
    const A80V1: &str = "outbound|80|v1|a.ns.svc.cluster.local";
    const B80: &str = "outbound|80||b.ns.svc.cluster.local";

    #[test]
    fn only_connections_watching_a_changed_host_are_found_with_their_names() {
        let index = WatchIndex::default();
        let ab = set(&[A80, A80V1, B80]);
        let b = set(&[B80]);
        let none = Watched::default();
        index.update(1, TypeUrl::Endpoint, &none, &watched(&ab));
        index.update(2, TypeUrl::Endpoint, &none, &watched(&ab));
        index.update(3, TypeUrl::Endpoint, &none, &watched(&b));
        index.update(
            4,
            TypeUrl::Endpoint,
            &none,
            &Watched {
                names: None,
                wildcard: true,
            },
        );

        let w = index.watchers(TypeUrl::Endpoint, ["a.ns.svc.cluster.local"]);
        let expected: BTreeSet<String> = [A80, A80V1].iter().map(|s| s.to_string()).collect();
        assert_eq!(by_conn(&w).len(), 2);
        assert_eq!(by_conn(&w)[&1], expected);
        assert_eq!(by_conn(&w)[&2], expected);
        assert_eq!(w.by_set.len(), 1, "one set, shared by both");
        assert_eq!(w.wildcard, HashSet::from([4]));
        assert!(
            index
                .watchers(TypeUrl::Cluster, ["a.ns.svc.cluster.local"])
                .by_set
                .is_empty()
        );

        // Connection 1 narrows to b only; 2 leaves; nobody watches a any more.
        index.update(1, TypeUrl::Endpoint, &watched(&ab), &watched(&b));
        let w = index.watchers(TypeUrl::Endpoint, ["a.ns.svc.cluster.local"]);
        assert_eq!(by_conn(&w).keys().collect::<Vec<_>>(), vec![&2]);
        index.update(2, TypeUrl::Endpoint, &watched(&ab), &none);
        assert!(
            index
                .watchers(TypeUrl::Endpoint, ["a.ns.svc.cluster.local"])
                .by_set
                .is_empty()
        );
        assert_eq!(
            index.sizes(),
            vec![(TypeUrl::Endpoint, 1, 1)],
            "only b's set is left"
        );
        let w = index.watchers(TypeUrl::Endpoint, ["b.ns.svc.cluster.local"]);
        let mut conns: Vec<_> = by_conn(&w).keys().copied().collect();
        conns.sort();
        assert_eq!(conns, vec![1, 3]);
    }
}
