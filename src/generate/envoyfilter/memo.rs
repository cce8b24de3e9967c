//! Patched resources shared between proxies. What a set of patches makes of one
//! resource depends only on the patches (each compiled patch has a unique id), on
//! whether the proxy is a router (its patch context) and on the resource's bytes: the
//! proxies that share those share the patched encoding, so each resource is decoded,
//! patched and re-encoded once per distinct patch set instead of once per proxy (with
//! mesh-wide EnvoyFilters, once instead of once per sidecar).
//!
//! The cache is bounded: past [`CAPACITY`] entries it starts over (entries of
//! resources or patches that no longer exist are never asked for again). The
//! environment variable `MESHFED_ENVOYFILTER_MEMO=off` turns it off (every proxy's
//! resources patched on their own), for measuring what it saves.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, LazyLock, Mutex};

use meshfed_api::networking::v1alpha3::envoy_filter::ApplyTo;

use super::ProxyPatches;
use crate::xds::{Resource, TypeUrl};

/// Entries kept before the cache starts over.
pub const CAPACITY: usize = 262_144;

/// (type, patch set, resource name, resource version).
type Key = (u8, u64, Arc<str>, Arc<str>);

/// Whether the cache is on (`MESHFED_ENVOYFILTER_MEMO` is not `off`).
static ENABLED: LazyLock<bool> =
    LazyLock::new(|| std::env::var("MESHFED_ENVOYFILTER_MEMO").as_deref() != Ok("off"));

/// What a patch set made of a resource: `None` when a patch removed it.
static PATCHED: LazyLock<Mutex<HashMap<Key, Option<Resource>>>> = LazyLock::new(Mutex::default);

fn type_tag(t: TypeUrl) -> u8 {
    match t {
        TypeUrl::Cluster => 1,
        TypeUrl::Listener => 2,
        _ => 3,
    }
}

/// The identity of the patches of `kinds` in `patches` for a proxy that is a router
/// or not.
pub fn patch_set(patches: &ProxyPatches, kinds: &[ApplyTo], router: bool) -> u64 {
    let mut h = DefaultHasher::new();
    router.hash(&mut h);
    for k in kinds {
        (*k as i32).hash(&mut h);
        for p in patches.of(*k) {
            p.id.hash(&mut h);
        }
    }
    h.finish()
}

/// A patch set `set` told apart by the per-proxy input its patches read besides the
/// resource (a router's gateway port map, [`super::route::GatewayPortMap`]; a sidecar's
/// inbound services, [`super::cluster::InboundHosts`]); an empty map leaves it as it is.
pub fn with_input<K: Hash, V: Hash>(set: u64, input: &std::collections::BTreeMap<K, V>) -> u64 {
    if input.is_empty() {
        return set;
    }
    let mut h = DefaultHasher::new();
    set.hash(&mut h);
    input.hash(&mut h);
    h.finish()
}

/// `resources` patched one by one with `patch` (its result for one resource: `None`
/// when removed), reusing what the same patch set (`set` of the resource) made of the
/// same resources before.
pub fn patched(
    type_url: TypeUrl,
    set: impl Fn(&Resource) -> u64,
    resources: Vec<Resource>,
    mut patch: impl FnMut(&Resource) -> Option<Resource>,
) -> Vec<Resource> {
    if !*ENABLED {
        return resources.iter().filter_map(&mut patch).collect();
    }
    let tag = type_tag(type_url);
    let key = |r: &Resource| (tag, set(r), r.name.clone(), r.version.clone());
    let known: Vec<Option<Option<Resource>>> = {
        let cache = PATCHED.lock().unwrap_or_else(|e| e.into_inner());
        resources
            .iter()
            .map(|r| cache.get(&key(r)).cloned())
            .collect()
    };
    let mut fresh = Vec::new();
    let mut out = Vec::with_capacity(resources.len());
    for (r, known) in resources.into_iter().zip(known) {
        let result = match known {
            Some(result) => result,
            None => {
                let result = patch(&r);
                fresh.push((key(&r), result.clone()));
                result
            }
        };
        out.extend(result);
    }
    if !fresh.is_empty() {
        let mut cache = PATCHED.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() + fresh.len() > CAPACITY {
            cache.clear();
        }
        cache.extend(fresh);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xds::EncodedResource;
    use envoy_types::pb::envoy::config::cluster::v3::Cluster;

    fn cluster(name: &str, alt: &str) -> Resource {
        EncodedResource::encode(
            TypeUrl::Cluster,
            name,
            &Cluster {
                name: name.into(),
                alt_stat_name: alt.into(),
                ..Default::default()
            },
        )
    }

    #[test]
    fn each_resource_is_patched_once_per_patch_set() {
        let set = 0x5eed_0001;
        let input = vec![cluster("memo-a", ""), cluster("memo-b", "")];
        let calls = std::cell::Cell::new(0);
        let mut patch = |r: &Resource| {
            calls.set(calls.get() + 1);
            (&*r.name != "memo-b").then(|| cluster(&r.name, "patched"))
        };
        let first = patched(TypeUrl::Cluster, |_| set, input.clone(), &mut patch);
        let second = patched(TypeUrl::Cluster, |_| set, input.clone(), &mut patch);
        assert_eq!(
            calls.get(),
            2,
            "the second proxy reuses the first one's results"
        );
        assert_eq!(first.len(), 1, "memo-b removed");
        assert!(Arc::ptr_eq(&first[0], &second[0]), "one shared encoding");
        patched(TypeUrl::Cluster, |_| set + 1, input.clone(), &mut patch);
        assert_eq!(calls.get(), 4, "another patch set patches again");
        let changed = vec![cluster("memo-a", "new bytes")];
        patched(TypeUrl::Cluster, |_| set, changed, &mut patch);
        assert_eq!(calls.get(), 5, "changed bytes are patched again");
    }
}
