//! Runs of resources framed once and shared by every response that carries them.
//!
//! Most proxies of a mesh get the very same resources: 2,000 sidecars of one
//! namespace receive the same 2,000 clusters and the same 2,000 load assignments, as
//! the same `Arc`s of the snapshot. Framed one resource at a time, each response is a
//! few thousand small chunks (a spliced body, then the next resource's key and type
//! URL, ...), and HTTP/2 turns every chunk into a DATA frame of its own: a lock of
//! the connection's stream state, a queue slot and a wake-up per chunk. That, not the
//! bytes, was most of the server's CPU when 2,000 sidecars connected (and as much
//! again in the client reading the frames).
//!
//! So a response's resources are cut into segments, and a segment seen a second time
//! is framed into one buffer, kept by [`SegmentMemo`] and spliced into every later
//! response as a single chunk. Segment boundaries depend on the resources alone (a
//! hash of each one's address decides whether a segment ends after it), so two lists
//! that differ by a few resources (a sidecar's own inbound clusters among the shared
//! outbound ones) still share every segment away from the difference. A segment seen
//! only once (one proxy's own resources) is framed as before and costs a digest.
//!
//! An entry holds its resources, so their addresses cannot be reused while it stands;
//! the memo is bounded by the bytes it holds and forgets the least recently used.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use super::connection::{hash_identities, same_resources};
use crate::xds::Resource;

/// Resource bodies at least this long are never part of a segment: each is already
/// one chunk, spliced as it is.
pub const LARGE_BODY: usize = 64 * 1024;
/// The most resources in one segment.
pub const SEGMENT_MAX: usize = 128;
/// Segments of fewer resources are framed as they are: not worth a look-up.
pub const SEGMENT_MIN: usize = 4;
/// A segment ends after about one resource in this many.
const BOUNDARY_ODDS: usize = 64;
/// The bytes of framed segments one memo keeps.
pub const MEMO_BYTES: usize = 96 * 1024 * 1024;
/// Digests of segments seen once that the memo remembers before starting over.
const SEEN_MAX: usize = 1 << 16;

/// Whether a segment ends after `resource`: decided by its address alone, so every
/// list holding it cuts there.
fn ends_after(resource: &Resource) -> bool {
    let address = Arc::as_ptr(resource) as usize as u64;
    // The low bits of an allocation's address are alignment; mix all of them.
    let mixed = (address >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    mixed < u64::MAX / BOUNDARY_ODDS as u64
}

/// The end (exclusive) of the segment starting at `start`, or `None` when the
/// resource at `start` goes out on its own (a large body, or a run too short to be
/// worth a look-up).
pub fn segment(resources: &[Resource], start: usize) -> Option<usize> {
    let mut end = start;
    while end < resources.len() && end - start < SEGMENT_MAX {
        let resource = &resources[end];
        if resource.body.value.len() >= LARGE_BODY {
            break;
        }
        end += 1;
        if ends_after(resource) {
            break;
        }
    }
    (end - start >= SEGMENT_MIN).then_some(end)
}

/// Framed segments, found again by the identity of their resources.
#[derive(Debug)]
pub struct SegmentMemo {
    inner: Mutex<Inner>,
    capacity: usize,
}

#[derive(Debug, Default)]
struct Inner {
    entries: HashMap<u64, Entry>,
    /// Digests of segments framed once and not kept.
    seen: HashSet<u64>,
    bytes: usize,
    clock: u64,
}

#[derive(Debug)]
struct Entry {
    kind: u8,
    resources: Box<[Resource]>,
    framed: Bytes,
    used: u64,
}

impl Default for SegmentMemo {
    fn default() -> Self {
        SegmentMemo::new(MEMO_BYTES)
    }
}

impl SegmentMemo {
    /// A memo keeping at most `capacity` bytes of framed segments.
    pub fn new(capacity: usize) -> Self {
        SegmentMemo {
            inner: Mutex::new(Inner::default()),
            capacity,
        }
    }

    /// The framed bytes of `segment` in a message of `kind` (resources are framed
    /// differently per message kind): remembered ones as they are, a segment seen
    /// before framed now by `frame` and kept, `None` for a segment seen the first
    /// time (the caller frames it as usual).
    pub fn framed(
        &self,
        kind: u8,
        segment: &[Resource],
        frame: impl FnOnce() -> Bytes,
    ) -> Option<Bytes> {
        let digest = digest(kind, segment);
        {
            let mut inner = self.lock();
            inner.clock += 1;
            let now = inner.clock;
            if let Some(entry) = inner.entries.get_mut(&digest) {
                if entry.kind == kind && same_resources(&entry.resources, segment) {
                    entry.used = now;
                    return Some(entry.framed.clone());
                }
            } else if inner.seen.len() >= SEEN_MAX {
                inner.seen.clear();
            }
            if inner.seen.insert(digest) {
                return None;
            }
        }
        let framed = frame();
        let mut inner = self.lock();
        let now = inner.clock;
        let len = framed.len();
        if let Some(old) = inner.entries.insert(
            digest,
            Entry {
                kind,
                resources: segment.into(),
                framed: framed.clone(),
                used: now,
            },
        ) {
            inner.bytes -= old.framed.len();
        }
        inner.seen.remove(&digest);
        inner.bytes += len;
        if inner.bytes > self.capacity {
            inner.evict(self.capacity / 4 * 3);
        }
        Some(framed)
    }

    /// Bytes of framed segments held.
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Inner {
    /// Forgets the least recently used entries until at most `target` bytes are held.
    fn evict(&mut self, target: usize) {
        let mut by_use: Vec<(u64, u64)> = self.entries.iter().map(|(d, e)| (e.used, *d)).collect();
        by_use.sort_unstable();
        for (_, digest) in by_use {
            if self.bytes <= target {
                break;
            }
            if let Some(entry) = self.entries.remove(&digest) {
                self.bytes -= entry.framed.len();
            }
        }
    }
}

fn digest(kind: u8, segment: &[Resource]) -> u64 {
    let mut h = foldhash::fast::FixedState::default().build_hasher();
    h.write_u8(kind);
    hash_identities(&mut h, segment);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xds::{EncodedResource, TypeUrl, wire::SharedAny};

    fn resource(len: usize) -> Resource {
        Arc::new(EncodedResource {
            name: "r".into(),
            body: SharedAny {
                type_url: TypeUrl::Cluster.as_str(),
                value: Bytes::from(vec![7; len]),
            },
            version: "v".into(),
            placeholder: false,
        })
    }

    #[test]
    fn a_segment_is_kept_the_second_time_it_is_seen() {
        let memo = SegmentMemo::new(1 << 20);
        let run: Vec<Resource> = (0..8).map(|_| resource(100)).collect();
        let framings = std::cell::Cell::new(0);
        let frame = || {
            framings.set(framings.get() + 1);
            Bytes::from(vec![1; 800])
        };
        assert!(memo.framed(1, &run, frame).is_none(), "first sight");
        let kept = memo.framed(1, &run, frame).expect("second sight");
        let again = memo.framed(1, &run, frame).expect("kept");
        assert_eq!(kept.as_ptr(), again.as_ptr(), "the same bytes, not a copy");
        assert_eq!(framings.get(), 1);
        // Another message kind frames the same resources differently.
        assert!(memo.framed(2, &run, frame).is_none());
        // Other resources (or the same in another order) are another segment.
        let mut reversed = run.clone();
        reversed.reverse();
        assert!(memo.framed(1, &reversed, frame).is_none());
        assert_eq!(memo.bytes(), 800);
    }

    #[test]
    fn the_least_recently_used_segments_go_first() {
        let memo = SegmentMemo::new(3000);
        let runs: Vec<Vec<Resource>> = (0..4)
            .map(|_| (0..4).map(|_| resource(10)).collect())
            .collect();
        let frame = || Bytes::from(vec![0; 1000]);
        for run in &runs[..3] {
            memo.framed(1, run, frame);
            memo.framed(1, run, frame).expect("kept");
        }
        // The first is used again, so the second is the oldest.
        memo.framed(1, &runs[0], frame).expect("kept");
        memo.framed(1, &runs[3], frame);
        memo.framed(1, &runs[3], frame).expect("kept");
        assert!(memo.bytes() <= 3000);
        let framings = std::cell::Cell::new(0);
        let count = || {
            framings.set(framings.get() + 1);
            Bytes::from(vec![0; 1000])
        };
        memo.framed(1, &runs[0], count)
            .expect("recently used: kept");
        assert!(memo.framed(1, &runs[1], count).is_none(), "evicted");
        assert_eq!(framings.get(), 0);
    }

    #[test]
    fn segments_cut_where_the_resources_say_and_never_hold_large_bodies() {
        let list: Vec<Resource> = (0..2000).map(|_| resource(100)).collect();
        let mut starts = vec![0];
        let mut at = 0;
        while at < list.len() {
            at = segment(&list, at).unwrap_or(at + 1);
            starts.push(at);
        }
        // A list with one more resource in front cuts at the same places after the
        // first boundary.
        let mut longer = vec![resource(100)];
        longer.extend(list.iter().cloned());
        let mut at = 0;
        let mut shifted = Vec::new();
        while at < longer.len() {
            at = segment(&longer, at).unwrap_or(at + 1);
            shifted.push(at - 1);
        }
        // Cuts forced by `SEGMENT_MAX` (a run with no boundary by address: one segment in
        // eight or so) differ until the next boundary by address, so the share depends
        // on where the allocator put the resources: 88-100 % in runs. Cuts placed at
        // random would share a few percent.
        let common = starts.iter().filter(|s| shifted.contains(s)).count();
        assert!(
            common * 4 >= starts.len() * 3,
            "{common} of {} boundaries shared",
            starts.len()
        );
        let sizes: Vec<usize> = starts.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(sizes.iter().all(|&n| n <= SEGMENT_MAX));
        assert!(
            sizes.len() < 200,
            "{} segments for 2,000 resources",
            sizes.len()
        );

        let mixed = vec![
            resource(10),
            resource(10),
            resource(LARGE_BODY),
            resource(10),
        ];
        assert_eq!(
            segment(&mixed, 0),
            None,
            "two before a large body: too short"
        );
        assert_eq!(segment(&mixed, 2), None, "a large body goes out alone");
    }
}
