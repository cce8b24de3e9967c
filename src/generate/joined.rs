//! A cached list shared by every proxy of one shape followed by a few resources of
//! the proxy's own (a sidecar's wildcard CDS: the outbound clusters of its client
//! facts, then its special and inbound clusters), joined once per distinct pair and
//! shared by every proxy that gets the same: not copied per proxy, which raised and
//! lowered thousands of shared reference counts for each one.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, LazyLock, Mutex};

use crate::xds::Resource;

/// At most this many resource handles held by the joined lists kept (16 MiB of
/// handles): about 1,000 distinct sidecar shapes of a 2,000-cluster mesh.
const KEPT_HANDLES: usize = 1 << 21;

/// One joined list and what it was joined from. Holding the parts keeps their
/// allocations, so their addresses (the memo's key) cannot be reused meanwhile.
struct Entry {
    shared: Arc<[Resource]>,
    own: Vec<Resource>,
    joined: Arc<[Resource]>,
}

#[derive(Default)]
struct Memo {
    by_key: HashMap<u64, Entry>,
    /// Keys, oldest first.
    order: VecDeque<u64>,
    handles: usize,
}

static MEMO: LazyLock<Mutex<Memo>> = LazyLock::new(Mutex::default);

fn key(shared: &Arc<[Resource]>, own: &[Resource]) -> u64 {
    let mut h = foldhash::fast::FixedState::default().build_hasher();
    h.write_usize(Arc::as_ptr(shared).cast::<u8>() as usize);
    for r in own {
        h.write_usize(Arc::as_ptr(r) as usize);
    }
    h.finish()
}

fn same(entry: &Entry, shared: &Arc<[Resource]>, own: &[Resource]) -> bool {
    Arc::ptr_eq(&entry.shared, shared)
        && entry.own.len() == own.len()
        && entry.own.iter().zip(own).all(|(a, b)| Arc::ptr_eq(a, b))
}

/// `shared` followed by `own`, as one shared list.
pub fn joined(shared: &Arc<[Resource]>, own: Vec<Resource>) -> Arc<[Resource]> {
    if own.is_empty() {
        return shared.clone();
    }
    let key = key(shared, &own);
    {
        let memo = MEMO.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = memo.by_key.get(&key)
            && same(entry, shared, &own)
        {
            return entry.joined.clone();
        }
    }
    let joined: Arc<[Resource]> = shared.iter().chain(&own).cloned().collect();
    let mut memo = MEMO.lock().unwrap_or_else(|e| e.into_inner());
    let handles = joined.len();
    let entry = Entry {
        shared: shared.clone(),
        own,
        joined: joined.clone(),
    };
    if let Some(old) = memo.by_key.insert(key, entry) {
        memo.handles -= old.joined.len();
    } else {
        memo.order.push_back(key);
    }
    memo.handles += handles;
    while memo.handles > KEPT_HANDLES {
        let Some(oldest) = memo.order.pop_front() else {
            break;
        };
        if let Some(old) = memo.by_key.remove(&oldest) {
            memo.handles -= old.joined.len();
        }
    }
    joined
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xds::{EncodedResource, TypeUrl};

    fn resource(name: &str) -> Resource {
        EncodedResource::encode(TypeUrl::Cluster, name, &name.to_string())
    }

    #[test]
    fn equal_parts_give_the_same_list_and_other_parts_their_own() {
        let shared: Arc<[Resource]> = vec![resource("joined-a"), resource("joined-b")].into();
        let special = resource("joined-special");
        let one = joined(&shared, vec![special.clone()]);
        let two = joined(&shared, vec![special.clone()]);
        assert!(Arc::ptr_eq(&one, &two));
        let names = |l: &Arc<[Resource]>| l.iter().map(|r| r.name.to_string()).collect::<Vec<_>>();
        assert_eq!(names(&one), ["joined-a", "joined-b", "joined-special"]);
        // Equal content in another allocation is another part: never taken for it.
        let other = joined(&shared, vec![resource("joined-special")]);
        assert!(!Arc::ptr_eq(&one, &other));
        assert_eq!(names(&other), names(&one));
        let more = joined(&shared, vec![special.clone(), resource("joined-inbound")]);
        assert_eq!(more.len(), 4);
        // Nothing of its own: the shared list itself.
        assert!(Arc::ptr_eq(&joined(&shared, Vec::new()), &shared));
    }
}
