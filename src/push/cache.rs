//! The cache of one snapshot, keyed by typed generator inputs.
//!
//! Every cached value is produced by an input struct that derives `Hash + Eq`, *is*
//! its key and generates it ([`CacheInput::generate`]): the cache calls `generate`
//! with the input and the snapshot, nothing else, so a generator cannot read anything
//! about the proxy that the key leaves out, and two proxies that would get the same
//! bytes share one entry. There is no way to hand the cache a closure. Inputs of
//! different types live side by side; a key only ever equals a key of its own type.
//!
//! Most inputs produce one encoded resource ([`Resource`]). An input may instead
//! produce an intermediate that several resources read through the cache (the whole
//! set of listeners of a sidecar, which is generated at once and read by one input per
//! listener; a router's merged Gateways, read by each of its route tables).
//!
//! Envoy's field rules ([`crate::xds::pgv`]) are checked in test builds on every
//! resource generated for the cache: a generator's resource is made by
//! [`crate::xds::EncodedResource::encode`], which checks it.
//!
//! The cache is split into shards, each behind its own lock held only for a map
//! look-up or insert (never while generating), so connections generating at once do
//! not queue on one lock. A new snapshot starts from the previous one's entries minus
//! those its push touches ([`crate::xds::deps::PushScope::touch`]).
//!
//! The cache does not name the snapshot (the snapshot holds the cache): the context an
//! input generates from is a type parameter, and the generators' only way in,
//! [`crate::push::snapshot::Snapshot::cached`], fixes it to the snapshot.

use std::any::Any;
use std::collections::HashMap;
use std::fmt::Debug;
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use serde::Serialize;

use crate::model::ProxyClass;
use crate::xds::TypeUrl;
use crate::xds::deps::{PushScope, Touch};

/// A generator input that is its own cache key and generates its value from the
/// context `Cx` (the snapshot) alone.
pub trait CacheInput<Cx: ?Sized>: Hash + Eq + Debug + Send + Sync + 'static {
    /// The type of resource it produces or is read for: which pushes drop it.
    const TYPE: TypeUrl;

    /// What it produces: a [`crate::xds::Resource`], or an intermediate that other
    /// inputs read through the cache.
    type Output: Clone + Send + Sync + 'static;

    /// The class of proxy it was generated for; `None` when the resource is shared by
    /// every class (it is then dropped when a push touches the type for any class).
    fn class(&self) -> Option<ProxyClass>;

    /// The type of this input's value, when it depends on the input (one input type
    /// serves every MCP type): [`CacheInput::TYPE`] by default.
    fn type_url(&self) -> TypeUrl {
        Self::TYPE
    }

    /// The service (hostname) the resource is derived from, when it is derived from
    /// exactly one; a push that changes other services keeps it. None by default.
    fn service(&self) -> Option<&str> {
        None
    }

    /// The value, from this input and the context alone; `None` means "no such
    /// resource" (not cached).
    fn generate(&self, cx: &Cx) -> Option<Self::Output>;

    /// What generating `output` found wrong in the config, when its output records
    /// it (see [`Findings`]).
    fn findings(output: &Self::Output) -> Option<&Findings> {
        let _ = output;
        None
    }
}

/// What generating a value found wrong in the config: facts of the config, part of
/// the value generated (never written anywhere else), so they stand while the value
/// stands in the cache and go with it. A snapshot's findings are those of the values
/// its cache holds ([`ResourceCache::findings`]): what building the connected
/// proxies' resources met, as Istio reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Findings {
    /// Conflicts: metric name -> listener -> message (Istio's `ProxyStatus`).
    pub conflicts:
        std::collections::BTreeMap<&'static str, std::collections::BTreeMap<String, String>>,
    /// Rejected or ignored configs: `(type, name)` -> how many parts of it were
    /// dropped (`pilot_total_rejected_configs`).
    pub rejected: std::collections::BTreeMap<(&'static str, String), u64>,
}

impl Findings {
    /// Whether nothing was found.
    pub fn is_empty(&self) -> bool {
        self.conflicts.is_empty() && self.rejected.is_empty()
    }

    /// Adds `other`'s findings: conflicts by listener (the last message stands),
    /// rejections summed.
    pub fn merge(&mut self, other: &Findings) {
        for (metric, listeners) in &other.conflicts {
            let mine = self.conflicts.entry(metric).or_default();
            for (listener, message) in listeners {
                mine.insert(listener.clone(), message.clone());
            }
        }
        for (config, count) in &other.rejected {
            *self.rejected.entry(config.clone()).or_default() += count;
        }
    }
}

/// An entry with its types erased, compared only with entries of its own type.
trait ErasedEntry: Debug + Send + Sync {
    fn as_any(&self) -> &dyn Any;
    fn type_url(&self) -> TypeUrl;
    fn class(&self) -> Option<ProxyClass>;
    fn service(&self) -> Option<&str>;
    fn findings(&self) -> Option<&Findings>;
}

/// An input with the value it generated.
struct Typed<K: CacheInput<Cx>, Cx: ?Sized> {
    input: K,
    output: K::Output,
    context: PhantomData<fn(&Cx)>,
}

impl<K: CacheInput<Cx>, Cx: ?Sized> Debug for Typed<K, Cx> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.input.fmt(f)
    }
}

impl<K: CacheInput<Cx>, Cx: ?Sized + 'static> ErasedEntry for Typed<K, Cx> {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn type_url(&self) -> TypeUrl {
        self.input.type_url()
    }
    fn class(&self) -> Option<ProxyClass> {
        self.input.class()
    }
    fn service(&self) -> Option<&str> {
        self.input.service()
    }
    fn findings(&self) -> Option<&Findings> {
        K::findings(&self.output)
    }
}

type Entry = Arc<dyn ErasedEntry>;

/// The value in `entry` when it is `input`'s.
fn value_of<K: CacheInput<Cx>, Cx: ?Sized + 'static>(
    entry: &Entry,
    input: &K,
) -> Option<K::Output> {
    let typed = entry.as_any().downcast_ref::<Typed<K, Cx>>()?;
    (typed.input == *input).then(|| typed.output.clone())
}

const SHARDS: usize = 64;

/// Hash of a key, with its type: equal inputs of different types do not collide. Keys
/// are hashed on every look-up (thousands per proxy push), so with foldhash rather
/// than SipHash, seeded per process.
fn hash_of<K: Hash + 'static>(state: &foldhash::fast::RandomState, input: &K) -> u64 {
    let mut h = state.build_hasher();
    std::any::TypeId::of::<K>().hash(&mut h);
    input.hash(&mut h);
    h.finish()
}

/// The buckets are keyed by [`hash_of`] already: hashing that again is wasted work.
#[derive(Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) | u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

type Shard = RwLock<HashMap<u64, Vec<Entry>, BuildHasherDefault<PassThrough>>>;

/// The encoded-resource cache of one snapshot.
#[derive(Debug)]
pub struct ResourceCache {
    /// Shared by a cache and the caches carried over from it (keys keep their hash).
    state: foldhash::fast::RandomState,
    shards: Box<[Shard]>,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl Default for ResourceCache {
    fn default() -> Self {
        ResourceCache {
            state: foldhash::fast::RandomState::default(),
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }
}

/// Hit/miss/size figures for `/debug/cachez` and metrics.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    pub size: usize,
}

impl ResourceCache {
    fn shard(&self, hash: u64) -> &Shard {
        // Middle bits pick the shard: the map inside a shard uses the low bits for the
        // bucket and the top ones for its tag, so those must vary within a shard.
        &self.shards[(hash >> 32) as usize % SHARDS]
    }

    fn find<K: CacheInput<Cx>, Cx: ?Sized + 'static>(
        &self,
        hash: u64,
        input: &K,
    ) -> Option<K::Output> {
        let shard = self.shard(hash).read().expect("cache shard poisoned");
        shard.get(&hash)?.iter().find_map(|e| value_of(e, input))
    }

    /// The value of `input`: cached, or generated by the input from `cx` and cached.
    /// Generators reach this through [`crate::push::snapshot::Snapshot::cached`].
    pub(in crate::push) fn get_or_insert<K: CacheInput<Cx>, Cx: ?Sized + 'static>(
        &self,
        input: K,
        cx: &Cx,
    ) -> Option<K::Output> {
        let hash = hash_of(&self.state, &input);
        if let Some(hit) = self.find(hash, &input) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Some(hit);
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        // Generated without a lock held; two racing connections may both generate the
        // same value, and it is the same either way.
        let output = input.generate(cx)?;
        let mut shard = self.shard(hash).write().expect("cache shard poisoned");
        let bucket = shard.entry(hash).or_default();
        if let Some(existing) = bucket.iter().find_map(|e| value_of(e, &input)) {
            return Some(existing);
        }
        bucket.push(Arc::new(Typed {
            input,
            output: output.clone(),
            context: PhantomData,
        }));
        Some(output)
    }

    /// The cache for the snapshot that follows a push of `scope`: the entries the
    /// push does not touch are carried over.
    pub fn carry_over(&self, scope: &PushScope<'_>) -> ResourceCache {
        const ALL: [ProxyClass; 3] = [ProxyClass::Sidecar, ProxyClass::Router, ProxyClass::Grpc];
        let keeps = |e: &Entry| {
            let one;
            let classes: &[ProxyClass] = match e.class() {
                Some(c) => {
                    one = [c];
                    &one
                }
                None => &ALL,
            };
            classes.iter().all(|c| match scope.touch(*c, e.type_url()) {
                Touch::Nothing => true,
                Touch::Services(hosts) => e.service().is_some_and(|s| !hosts.contains(s)),
                Touch::Everything => false,
            })
        };
        let next = ResourceCache {
            state: self.state.clone(),
            ..ResourceCache::default()
        };
        for (from, to) in self.shards.iter().zip(next.shards.iter()) {
            let from = from.read().expect("cache shard poisoned");
            let mut to = to.write().expect("cache shard poisoned");
            for (hash, bucket) in from.iter() {
                let kept: Vec<Entry> = bucket.iter().filter(|e| keeps(e)).cloned().collect();
                if !kept.is_empty() {
                    to.insert(*hash, kept);
                }
            }
        }
        next
    }

    /// The findings of every value in the cache, merged.
    pub fn findings(&self) -> Findings {
        let mut out = Findings::default();
        for shard in self.shards.iter() {
            let shard = shard.read().expect("cache shard poisoned");
            for entry in shard.values().flatten() {
                if let Some(found) = entry.findings() {
                    out.merge(found);
                }
            }
        }
        out
    }

    /// Current figures.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            size: self
                .shards
                .iter()
                .map(|s| {
                    s.read()
                        .expect("cache shard poisoned")
                        .values()
                        .map(Vec::len)
                        .sum::<usize>()
                })
                .sum(),
        }
    }
}

#[cfg(test)]
mod tests {
    use meshfed_registry::{ConfigKey, ConfigKind, PushRequest, ServiceKey, TriggerReason};

    use super::*;
    use crate::xds::{EncodedResource, Resource};

    #[derive(Clone, PartialEq, Eq, Hash, Debug)]
    struct Eds(&'static str);

    /// The test's context: how many resources were generated.
    type Generated = std::cell::Cell<u32>;

    impl CacheInput<Generated> for Eds {
        const TYPE: TypeUrl = TypeUrl::Endpoint;
        type Output = Resource;
        fn class(&self) -> Option<ProxyClass> {
            None
        }
        fn service(&self) -> Option<&str> {
            Some(self.0)
        }
        fn generate(&self, generated: &Generated) -> Option<Resource> {
            generated.set(generated.get() + 1);
            Some(res(self.0))
        }
    }

    /// Same shape as `Eds`, another type: never equal to it.
    #[derive(Clone, PartialEq, Eq, Hash, Debug)]
    struct SidecarListener(&'static str);

    impl CacheInput<Generated> for SidecarListener {
        const TYPE: TypeUrl = TypeUrl::Listener;
        type Output = Resource;
        fn class(&self) -> Option<ProxyClass> {
            Some(ProxyClass::Sidecar)
        }
        fn generate(&self, _: &Generated) -> Option<Resource> {
            Some(res("l"))
        }
    }

    fn res(name: &str) -> Resource {
        EncodedResource::encode(
            TypeUrl::Endpoint,
            name,
            &envoy_types::pb::google::protobuf::StringValue { value: name.into() },
        )
    }

    #[test]
    fn caches_by_typed_input_and_carries_over_what_a_push_did_not_touch() {
        let cache = ResourceCache::default();
        let generated = Generated::default();
        for _ in 0..2 {
            cache.get_or_insert(Eds("a.ns"), &generated);
        }
        let calls = generated.get();
        assert_eq!(calls, 1);
        cache.get_or_insert(Eds("b.ns"), &generated);
        let l = cache.get_or_insert(SidecarListener("a.ns"), &generated);
        assert_eq!(
            &*l.unwrap().name,
            "l",
            "an equal field of another type is another key"
        );
        assert_eq!(cache.stats().size, 3);

        let eds_a = PushRequest::endpoints(&ServiceKey::new("a.ns", "ns"));
        let next = cache.carry_over(&PushScope::new(&eds_a));
        assert_eq!(
            next.stats().size,
            2,
            "a's EDS entry goes, b's and the listener stay"
        );

        let svc_b = PushRequest::full(
            TriggerReason::Service,
            [ConfigKey::service(&ServiceKey::new("b.ns", "ns"))],
        );
        assert_eq!(
            cache.carry_over(&PushScope::new(&svc_b)).stats().size,
            1,
            "only a's entry survives a full push for b (listeners read every service)"
        );

        let vs = PushRequest::full(
            TriggerReason::Config,
            [ConfigKey::new(ConfigKind::VirtualService, "r", "ns")],
        );
        assert_eq!(
            cache.carry_over(&PushScope::new(&vs)).stats().size,
            0,
            "sidecar listeners read VirtualServices (tcp/tls routes); shared EDS entries may be \
             read by gateways"
        );
        let forced = PushRequest::forced(TriggerReason::Debug);
        assert_eq!(cache.carry_over(&PushScope::new(&forced)).stats().size, 0);
    }
}
