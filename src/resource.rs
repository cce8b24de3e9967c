//! xDS resource types, encoded resources, and the per-snapshot resource cache.
//!
//! A generator's output is encoded once into [`Bytes`] and shared by every connection
//! that receives the same resource. The cache key is the generator's argument list
//! (type, resource name, and a digest of the proxy properties that influence the
//! output), so two proxies that would get the same bytes share one entry.

use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use meshfed_registry::{ConfigKind, Hostname, PushRequest};
use serde::Serialize;

use crate::ads::wire::SharedAny;

/// The resource types served over ADS, in push order (make-before-break: clusters
/// before their endpoints, both before the listeners and routes that use them).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Serialize)]
pub enum TypeUrl {
    /// CDS.
    Cluster,
    /// EDS.
    Endpoint,
    /// LDS.
    Listener,
    /// RDS.
    Route,
}

impl TypeUrl {
    /// Every type, in push order.
    pub const ALL: [TypeUrl; 4] = [
        TypeUrl::Cluster,
        TypeUrl::Endpoint,
        TypeUrl::Listener,
        TypeUrl::Route,
    ];

    /// The v3 type URL.
    pub const fn as_str(self) -> &'static str {
        match self {
            TypeUrl::Cluster => "type.googleapis.com/envoy.config.cluster.v3.Cluster",
            TypeUrl::Endpoint => {
                "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
            }
            TypeUrl::Listener => "type.googleapis.com/envoy.config.listener.v3.Listener",
            TypeUrl::Route => "type.googleapis.com/envoy.config.route.v3.RouteConfiguration",
        }
    }

    /// Parses a type URL.
    pub fn parse(s: &str) -> Option<TypeUrl> {
        TypeUrl::ALL.into_iter().find(|t| t.as_str() == s)
    }

    /// Short name used in metrics and logs (`cds`, `eds`, `lds`, `rds`).
    pub const fn short(self) -> &'static str {
        match self {
            TypeUrl::Cluster => "cds",
            TypeUrl::Endpoint => "eds",
            TypeUrl::Listener => "lds",
            TypeUrl::Route => "rds",
        }
    }

    /// Wildcard types: an empty subscription means "everything".
    pub const fn is_wildcard(self) -> bool {
        matches!(self, TypeUrl::Cluster | TypeUrl::Listener)
    }
}

/// One encoded resource, shared by every connection that is sent it.
#[derive(Debug, PartialEq)]
pub struct EncodedResource {
    /// Resource name (cluster name, listener name, ...).
    pub name: Arc<str>,
    /// The encoded message with its type URL.
    pub body: SharedAny,
    /// Content version: a digest of the bytes (used as the Delta resource version).
    pub version: Arc<str>,
    /// Stands in for a subscribed resource that does not exist (an empty load
    /// assignment for a service that is gone): State of the world sends it so a client
    /// never waits; Delta reports the name as removed instead.
    pub placeholder: bool,
}

/// A shared encoded resource.
pub type Resource = Arc<EncodedResource>;

impl EncodedResource {
    /// Encodes `message` of type `type_url` under `name`.
    pub fn encode<M: prost::Message>(
        type_url: TypeUrl,
        name: impl Into<Arc<str>>,
        message: &M,
    ) -> Resource {
        let bytes = Bytes::from(message.encode_to_vec());
        let mut h = DefaultHasher::new();
        bytes.hash(&mut h);
        Arc::new(EncodedResource {
            name: name.into(),
            body: SharedAny {
                type_url: type_url.as_str(),
                value: bytes,
            },
            version: Arc::from(format!("{:016x}", h.finish())),
            placeholder: false,
        })
    }

    /// Encodes a placeholder (see [`EncodedResource::placeholder`]).
    pub fn encode_placeholder<M: prost::Message>(
        type_url: TypeUrl,
        name: impl Into<Arc<str>>,
        message: &M,
    ) -> Resource {
        let mut resource =
            Arc::try_unwrap(Self::encode(type_url, name, message)).expect("fresh resource");
        resource.placeholder = true;
        Arc::new(resource)
    }
}

/// Identifies one generator call: type, resource name and the digest of the proxy
/// properties the output depends on (0 when it depends on none).
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct CacheKey {
    pub type_url: TypeUrl,
    pub name: Arc<str>,
    pub view: u64,
}

/// Digest of proxy properties for a [`CacheKey`].
pub fn view_digest(parts: &[&str]) -> u64 {
    let mut h = DefaultHasher::new();
    parts.hash(&mut h);
    h.finish()
}

#[derive(Debug)]
struct CacheEntry {
    /// The service hostname the resource is derived from; `None` means it depends on
    /// more than one service and is dropped by any full push.
    depends_on: Option<Hostname>,
    resource: Resource,
}

/// The encoded-resource cache of one snapshot. A new snapshot starts from the
/// previous one's entries minus those the push request invalidates.
#[derive(Debug, Default)]
pub struct ResourceCache {
    entries: Mutex<HashMap<CacheKey, CacheEntry>>,
    hits: AtomicU64,
    misses: AtomicU64,
}

/// Hit/miss/size figures for `/debug/cachez` and metrics.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    pub size: usize,
}

impl ResourceCache {
    /// Returns the cached resource for `key`, or generates, encodes and caches it.
    /// `generate` returning `None` means "no such resource" (not cached).
    pub fn get_or_insert(
        &self,
        key: CacheKey,
        depends_on: Option<&Hostname>,
        generate: impl FnOnce() -> Option<Resource>,
    ) -> Option<Resource> {
        if let Some(hit) = self.entries.lock().expect("cache poisoned").get(&key) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Some(hit.resource.clone());
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        // Generated without the lock held; two racing connections may both encode the
        // same resource, and the bytes are identical either way.
        let resource = generate()?;
        self.entries.lock().expect("cache poisoned").insert(
            key,
            CacheEntry {
                depends_on: depends_on.cloned(),
                resource: resource.clone(),
            },
        );
        Some(resource)
    }

    /// The cache for the snapshot that follows `request`: entries that the request
    /// cannot have changed are carried over.
    pub fn carry_over(&self, request: &PushRequest) -> ResourceCache {
        let only_services = request
            .configs_updated
            .iter()
            .all(|k| matches!(k.kind, ConfigKind::Endpoints | ConfigKind::ServiceEntry));
        if request.forced
            || (request.full && (!only_services || request.configs_updated.is_empty()))
        {
            return ResourceCache::default();
        }
        let changed: std::collections::HashSet<&str> = request.updated_hostnames().collect();
        let entries = self.entries.lock().expect("cache poisoned");
        let kept = entries
            .iter()
            .filter(|(key, entry)| {
                let per_service = matches!(key.type_url, TypeUrl::Cluster | TypeUrl::Endpoint);
                match &entry.depends_on {
                    Some(host) => per_service && !changed.contains(host.as_str()),
                    // Aggregates (listeners, routes) survive endpoint-only pushes only.
                    None => !request.full,
                }
            })
            .map(|(k, e)| {
                (
                    k.clone(),
                    CacheEntry {
                        depends_on: e.depends_on.clone(),
                        resource: e.resource.clone(),
                    },
                )
            })
            .collect();
        ResourceCache {
            entries: Mutex::new(kept),
            ..Default::default()
        }
    }

    /// Current figures.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            size: self.entries.lock().expect("cache poisoned").len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use meshfed_registry::{ConfigKey, ServiceKey, TriggerReason};

    use super::*;

    fn res(name: &str) -> Resource {
        EncodedResource::encode(
            TypeUrl::Endpoint,
            name,
            &envoy_types::pb::google::protobuf::Empty {},
        )
    }

    fn key(t: TypeUrl, name: &str) -> CacheKey {
        CacheKey {
            type_url: t,
            name: Arc::from(name),
            view: 0,
        }
    }

    #[test]
    fn caches_and_carries_over_what_a_push_did_not_touch() {
        let cache = ResourceCache::default();
        let a: Hostname = "a.ns".into();
        let b: Hostname = "b.ns".into();
        let mut calls = 0;
        for _ in 0..2 {
            cache.get_or_insert(key(TypeUrl::Endpoint, "ea"), Some(&a), || {
                calls += 1;
                Some(res("ea"))
            });
        }
        assert_eq!(calls, 1);
        cache.get_or_insert(key(TypeUrl::Endpoint, "eb"), Some(&b), || Some(res("eb")));
        cache.get_or_insert(key(TypeUrl::Listener, "l"), None, || Some(res("l")));
        assert_eq!(cache.stats().size, 3);

        let eds_a = PushRequest::endpoints(&ServiceKey::new("a.ns", "ns"));
        let next = cache.carry_over(&eds_a);
        assert_eq!(
            next.stats().size,
            2,
            "a's EDS entry is dropped, b's and the listener stay"
        );

        let svc_b = PushRequest::full(
            TriggerReason::Service,
            [ConfigKey::service(&ServiceKey::new("b.ns", "ns"))],
        );
        assert_eq!(
            cache.carry_over(&svc_b).stats().size,
            1,
            "only a's entry survives a full push for b"
        );
        assert_eq!(
            cache
                .carry_over(&PushRequest::forced(TriggerReason::Debug))
                .stats()
                .size,
            0
        );
    }
}
