//! Sharing equal per-connection state between connections.
//!
//! Sidecars in the same namespace subscribe to the same resource names and, over Delta,
//! hold the same name -> version maps. Kept per connection, those sets cost ~100 KB
//! each in a 1,000-service mesh, so 2,000 sidecars would spend ~200 MB on copies of a
//! handful of distinct sets. An [`Interner`] hands out one `Arc` per distinct value:
//! a connection that builds a set equal to one already held elsewhere drops its own
//! copy and shares the existing one. Entries are weak, so a set nobody holds is freed.

use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, Weak};

/// Hands out one shared `Arc<T>` per distinct value.
#[derive(Debug)]
pub struct Interner<T> {
    inner: Mutex<Table<T>>,
    /// Memo of [`Interner::derive`]: (source allocation, change key) -> result. The
    /// weak handle on the source keeps its allocation, so its address cannot be
    /// reused by another value while the entry exists.
    derived: Mutex<HashMap<(usize, u64), Derived<T>>>,
}

/// A memoised derivation: its source and its result.
type Derived<T> = (Weak<T>, Weak<T>);

#[derive(Debug)]
struct Table<T> {
    by_hash: HashMap<u64, Vec<Weak<T>>>,
    /// Live entries after the last sweep; a sweep runs when the table doubles.
    swept_len: usize,
    len: usize,
}

impl<T: Hash + Eq> Default for Interner<T> {
    fn default() -> Self {
        Interner {
            inner: Mutex::new(Table {
                by_hash: HashMap::new(),
                swept_len: 0,
                len: 0,
            }),
            derived: Mutex::new(HashMap::new()),
        }
    }
}

impl<T: Hash + Eq> Interner<T> {
    /// The shared copy of `value`: an existing one if some connection holds an equal
    /// value, else `value` itself, now shared.
    pub fn intern(&self, value: T) -> Arc<T> {
        let mut h = DefaultHasher::new();
        value.hash(&mut h);
        let hash = h.finish();
        let mut table = self.inner.lock().expect("interner poisoned");
        let bucket = table.by_hash.entry(hash).or_default();
        let mut found = None;
        let before = bucket.len();
        bucket.retain(|weak| match weak.upgrade() {
            Some(existing) => {
                if found.is_none() && *existing == value {
                    found = Some(existing);
                }
                true
            }
            None => false,
        });
        let removed = before - bucket.len();
        let shared = match found {
            Some(existing) => existing,
            None => {
                let shared = Arc::new(value);
                bucket.push(Arc::downgrade(&shared));
                table.len += 1;
                shared
            }
        };
        table.len -= removed;
        if table.len > 2 * table.swept_len.max(64) {
            table.sweep();
        }
        shared
    }

    /// The shared result of applying a change to a shared value: `change` identifies
    /// the change (equal keys must mean equal changes) and `apply` makes the result
    /// the first time. When 2,000 connections holding the same set apply the same
    /// change, it is computed once and the rest look it up.
    pub fn derive(&self, from: &Arc<T>, change: u64, apply: impl FnOnce(&T) -> T) -> Arc<T> {
        let key = (Arc::as_ptr(from) as usize, change);
        {
            let memo = self.derived.lock().expect("interner poisoned");
            if let Some((source, result)) = memo.get(&key)
                && source.upgrade().is_some_and(|s| Arc::ptr_eq(&s, from))
                && let Some(result) = result.upgrade()
            {
                return result;
            }
        }
        let result = self.intern(apply(from));
        let mut memo = self.derived.lock().expect("interner poisoned");
        if memo.len() >= 1024 {
            memo.retain(|_, (source, result)| {
                source.strong_count() > 0 && result.strong_count() > 0
            });
        }
        memo.insert(key, (Arc::downgrade(from), Arc::downgrade(&result)));
        result
    }

    /// Distinct values some connection still holds.
    #[cfg(test)]
    fn live(&self) -> usize {
        let table = self.inner.lock().expect("interner poisoned");
        table
            .by_hash
            .values()
            .flatten()
            .filter(|w| w.strong_count() > 0)
            .count()
    }
}

impl<T> Table<T> {
    fn sweep(&mut self) {
        self.by_hash.retain(|_, bucket| {
            bucket.retain(|w| w.strong_count() > 0);
            !bucket.is_empty()
        });
        self.len = self.by_hash.values().map(Vec::len).sum();
        self.swept_len = self.len;
    }
}

/// The last `capacity` values found by a digest, oldest first: a memo of what
/// connections of one shape compute alike (each value keeps what it was computed
/// from, so a hit is confirmed by comparing with that, not by the digest alone).
#[derive(Debug)]
pub struct Recent<V> {
    by_digest: HashMap<u64, V>,
    order: std::collections::VecDeque<u64>,
    capacity: usize,
}

impl<V> Recent<V> {
    /// A memo of at most `capacity` values.
    pub fn new(capacity: usize) -> Self {
        Recent {
            by_digest: HashMap::new(),
            order: std::collections::VecDeque::new(),
            capacity,
        }
    }

    /// The value under `digest`, if `confirm` accepts it.
    pub fn find(&self, digest: u64, confirm: impl FnOnce(&V) -> bool) -> Option<&V> {
        self.by_digest.get(&digest).filter(|v| confirm(v))
    }

    /// The values kept, newest first.
    pub fn newest_first(&self) -> impl Iterator<Item = &V> {
        self.order
            .iter()
            .rev()
            .filter_map(|d| self.by_digest.get(d))
    }

    /// Keeps `value` under `digest` (replacing one there), forgetting the oldest
    /// beyond the capacity.
    pub fn insert(&mut self, digest: u64, value: V) {
        if self.by_digest.insert(digest, value).is_none() {
            self.order.push_back(digest);
        }
        while self.order.len() > self.capacity {
            if let Some(oldest) = self.order.pop_front() {
                self.by_digest.remove(&oldest);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn equal_values_share_one_allocation_and_dead_ones_go() {
        let interner = Interner::default();
        let a = interner.intern(set(&["x", "y"]));
        let b = interner.intern(set(&["x", "y"]));
        assert!(Arc::ptr_eq(&a, &b));
        let c = interner.intern(set(&["x"]));
        assert!(!Arc::ptr_eq(&a, &c));
        assert_eq!(interner.live(), 2);
        drop((a, b));
        assert_eq!(interner.live(), 1);
        // A value nobody holds any more is not handed out again; a new one is made.
        let d = interner.intern(set(&["x", "y"]));
        assert_eq!(*d, set(&["x", "y"]));
        assert_eq!(interner.live(), 2);
    }

    #[test]
    fn the_table_does_not_grow_with_dead_entries() {
        let interner = Interner::default();
        for i in 0..10_000 {
            let _ = interner.intern(set(&[&i.to_string()]));
        }
        let table = interner.inner.lock().unwrap();
        assert!(table.by_hash.len() <= 200, "{}", table.by_hash.len());
    }

    #[test]
    fn a_change_derived_once_is_shared_by_every_holder_of_the_source() {
        let interner = Interner::default();
        let from = interner.intern(set(&["a"]));
        let calls = std::cell::Cell::new(0);
        let add_b = |s: &BTreeSet<String>| {
            calls.set(calls.get() + 1);
            let mut s = s.clone();
            s.insert("b".into());
            s
        };
        let first = interner.derive(&from, 7, add_b);
        let second = interner.derive(&from, 7, add_b);
        assert!(Arc::ptr_eq(&first, &second));
        assert_eq!(*first, set(&["a", "b"]));
        assert_eq!(calls.get(), 1);
        // Another change key is another change.
        let other = interner.derive(&from, 8, |s| {
            let mut s = s.clone();
            s.insert("c".into());
            s
        });
        assert_eq!(*other, set(&["a", "c"]));
        // A result nobody holds any more is made again.
        drop((first, second));
        let again = interner.derive(&from, 7, add_b);
        assert_eq!(*again, set(&["a", "b"]));
        assert_eq!(calls.get(), 2);
    }
}
