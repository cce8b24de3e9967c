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
}

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

    /// Interns a value that may already be shared: a no-op when `value` is the only
    /// handle on a value equal to the interned one.
    pub fn reintern(&self, value: Arc<T>) -> Arc<T>
    where
        T: Clone,
    {
        self.intern(Arc::unwrap_or_clone(value))
    }

    /// Distinct values some connection still holds (for tests and debug output).
    pub fn live(&self) -> usize {
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
    fn reintern_of_a_modified_copy_finds_the_shared_one() {
        let interner = Interner::default();
        let shared = interner.intern(set(&["a", "b"]));
        let mut mine = interner.intern(set(&["a"]));
        Arc::make_mut(&mut mine).insert("b".into());
        let mine = interner.reintern(mine);
        assert!(Arc::ptr_eq(&mine, &shared));
    }
}
