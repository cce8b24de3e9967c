//! xDS resource types and encoded resources.
//!
//! A generator's output is encoded once into [`Bytes`] and shared by every connection
//! that receives the same resource (the snapshot's cache, `push::cache`, keys it by the
//! generator's typed input).

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use bytes::Bytes;
use serde::Serialize;

use super::mcp::McpType;
use super::wire::SharedAny;

/// The resource types served over ADS, in push order (make-before-break: clusters
/// before their endpoints, both before the listeners and routes that use them), then
/// the MCP types.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub enum TypeUrl {
    /// CDS.
    Cluster,
    /// EDS.
    Endpoint,
    /// LDS.
    Listener,
    /// RDS.
    Route,
    /// SDS: gateway credentials (`crate::sds`).
    Secret,
    /// NDS: the DNS name table of a proxy that captures DNS (Istio's
    /// `istio.networking.nds.v1.NameTable`; one resource, named `""`). Istio pushes
    /// it after the ordered types.
    NameTable,
    /// ECDS: extension configs (`envoy.config.core.v3.TypedExtensionConfig`), the
    /// WasmPlugins' filters that listeners reference by name (`config_discovery`).
    /// Not among Istio's ordered types: pushed after them.
    ExtensionConfig,
    /// Ambient WDS: workloads and services for ztunnel
    /// (`istio.workload.Address`, `crate::generate::ambient`). Wildcard; also served
    /// on demand by name (workload uid, `namespace/hostname`, or `network/IP`).
    Address,
    /// Ambient authorization policies for ztunnel (`istio.security.Authorization`).
    /// Wildcard; served the same way as [`TypeUrl::Address`].
    Authorization,
    /// An MCP-over-xDS type (`networking.istio.io/v1/ServiceEntry`, ...): Istio config
    /// as `istio.mcp.v1alpha1.Resource`s (see [`super::mcp`]). Not in
    /// [`TypeUrl::ALL`]: those are the Envoy types, which arrays are indexed by.
    Mcp(McpType),
}

impl Serialize for TypeUrl {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            TypeUrl::Cluster => s.serialize_str("Cluster"),
            TypeUrl::Endpoint => s.serialize_str("Endpoint"),
            TypeUrl::Listener => s.serialize_str("Listener"),
            TypeUrl::Route => s.serialize_str("Route"),
            TypeUrl::Secret => s.serialize_str("Secret"),
            TypeUrl::NameTable => s.serialize_str("NameTable"),
            TypeUrl::ExtensionConfig => s.serialize_str("ExtensionConfig"),
            TypeUrl::Address => s.serialize_str("Address"),
            TypeUrl::Authorization => s.serialize_str("Authorization"),
            TypeUrl::Mcp(t) => s.serialize_str(t.as_str()),
        }
    }
}

impl TypeUrl {
    /// Every xDS type served but the MCP ones (Envoy's, NDS, ECDS and ztunnel's), in
    /// push order (MCP types are not listed: see
    /// [`TypeUrl::Mcp`]).
    pub const ALL: [TypeUrl; 9] = [
        TypeUrl::Cluster,
        TypeUrl::Endpoint,
        TypeUrl::Listener,
        TypeUrl::Route,
        TypeUrl::Secret,
        TypeUrl::NameTable,
        TypeUrl::ExtensionConfig,
        TypeUrl::Address,
        TypeUrl::Authorization,
    ];

    /// The type's position in [`TypeUrl::ALL`] (arrays indexed by type). MCP types
    /// are not in it: their index is `TypeUrl::ALL.len()`, one past the end, and an
    /// array indexed by type holds nothing for them.
    pub const fn index(self) -> usize {
        match self {
            TypeUrl::Cluster => 0,
            TypeUrl::Endpoint => 1,
            TypeUrl::Listener => 2,
            TypeUrl::Route => 3,
            TypeUrl::Secret => 4,
            TypeUrl::NameTable => 5,
            TypeUrl::ExtensionConfig => 6,
            TypeUrl::Address => 7,
            TypeUrl::Authorization => 8,
            TypeUrl::Mcp(_) => TypeUrl::ALL.len(),
        }
    }

    /// Whether it is an MCP type.
    pub const fn is_mcp(self) -> bool {
        matches!(self, TypeUrl::Mcp(_))
    }

    /// The v3 type URL (for an MCP type, its `<group>/<version>/<kind>`).
    pub fn as_str(self) -> &'static str {
        match self {
            TypeUrl::Cluster => "type.googleapis.com/envoy.config.cluster.v3.Cluster",
            TypeUrl::Endpoint => {
                "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
            }
            TypeUrl::Listener => "type.googleapis.com/envoy.config.listener.v3.Listener",
            TypeUrl::Route => "type.googleapis.com/envoy.config.route.v3.RouteConfiguration",
            TypeUrl::Secret => {
                "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"
            }
            TypeUrl::NameTable => "type.googleapis.com/istio.networking.nds.v1.NameTable",
            TypeUrl::ExtensionConfig => {
                "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig"
            }
            TypeUrl::Address => "type.googleapis.com/istio.workload.Address",
            TypeUrl::Authorization => "type.googleapis.com/istio.security.Authorization",
            TypeUrl::Mcp(t) => t.as_str(),
        }
    }

    /// Parses a type URL: an Envoy type, or an MCP type this server serves.
    pub fn parse(s: &str) -> Option<TypeUrl> {
        TypeUrl::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .or_else(|| McpType::parse(s).map(TypeUrl::Mcp))
    }

    /// Short name used in metrics and logs (`cds`, `eds`, `lds`, `rds`, `sds`, `nds`,
    /// `ecds`;
    /// an MCP type is its type URL, as Istio labels the types it has no name for).
    pub fn short(self) -> &'static str {
        match self {
            TypeUrl::Cluster => "cds",
            TypeUrl::Endpoint => "eds",
            TypeUrl::Listener => "lds",
            TypeUrl::Route => "rds",
            TypeUrl::Secret => "sds",
            TypeUrl::NameTable => "nds",
            TypeUrl::ExtensionConfig => "ecds",
            TypeUrl::Address => "wds",
            TypeUrl::Authorization => "authorization",
            TypeUrl::Mcp(t) => t.as_str(),
        }
    }

    /// Wildcard types: an empty subscription means "everything" (Istio's own types,
    /// NDS among them, are wildcard; so are the MCP types, whose generator ignores
    /// resource names).
    pub const fn is_wildcard(self) -> bool {
        matches!(
            self,
            TypeUrl::Cluster
                | TypeUrl::Listener
                | TypeUrl::NameTable
                | TypeUrl::Address
                | TypeUrl::Authorization
                | TypeUrl::Mcp(_)
        )
    }

    /// Whether Delta responses name the resources a client holds that are gone. Not
    /// for ECDS: Istio never removes extension configs (Envoy issue 32823: a removed
    /// config a listener still references leaves the listener without its filter).
    pub const fn sends_removals(self) -> bool {
        !matches!(self, TypeUrl::ExtensionConfig)
    }

    /// Whether a generator that has nothing for the proxy sends nothing rather than an
    /// empty response: NDS, for a proxy that does not capture DNS (Istio sends no
    /// response when its generator returns none).
    pub const fn silent_when_empty(self) -> bool {
        matches!(self, TypeUrl::NameTable)
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

/// The resources of one response: the proxy's own list, or a cached list shared by
/// every proxy of one shape, held by one reference rather than copied per proxy (a
/// copy raises and then lowers thousands of shared reference counts, contended
/// between cores: 8 % of the server's CPU for the initial configs of 2,000
/// sidecars of a 2,000-cluster mesh).
#[derive(Clone, Debug)]
pub enum ResourceList {
    Owned(Vec<Resource>),
    Shared(Arc<[Resource]>),
}

impl Default for ResourceList {
    fn default() -> Self {
        ResourceList::Owned(Vec::new())
    }
}

impl std::ops::Deref for ResourceList {
    type Target = [Resource];
    fn deref(&self) -> &[Resource] {
        match self {
            ResourceList::Owned(v) => v,
            ResourceList::Shared(s) => s,
        }
    }
}

impl ResourceList {
    /// The list as a vector of its own (a copy of a shared one).
    pub fn into_vec(self) -> Vec<Resource> {
        match self {
            ResourceList::Owned(v) => v,
            ResourceList::Shared(s) => s.to_vec(),
        }
    }
}

impl From<Vec<Resource>> for ResourceList {
    fn from(v: Vec<Resource>) -> Self {
        ResourceList::Owned(v)
    }
}

impl From<Arc<[Resource]>> for ResourceList {
    fn from(s: Arc<[Resource]>) -> Self {
        ResourceList::Shared(s)
    }
}

impl FromIterator<Resource> for ResourceList {
    fn from_iter<I: IntoIterator<Item = Resource>>(iter: I) -> Self {
        ResourceList::Owned(iter.into_iter().collect())
    }
}

impl IntoIterator for ResourceList {
    type Item = Resource;
    type IntoIter = std::vec::IntoIter<Resource>;
    fn into_iter(self) -> Self::IntoIter {
        self.into_vec().into_iter()
    }
}

impl<'a> IntoIterator for &'a ResourceList {
    type Item = &'a Resource;
    type IntoIter = std::slice::Iter<'a, Resource>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl PartialEq for ResourceList {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl EncodedResource {
    /// Encodes `message` of type `type_url` under `name`.
    pub fn encode<M: prost::Message>(
        type_url: TypeUrl,
        name: impl Into<Arc<str>>,
        message: &M,
    ) -> Resource {
        let bytes = Bytes::from(message.encode_to_vec());
        let name = name.into();
        // Tests fail on anything Envoy would NACK (see `super::pgv`).
        #[cfg(any(test, feature = "testing"))]
        super::pgv::assert_valid(&name, type_url.as_str(), &bytes);
        let mut h = DefaultHasher::new();
        bytes.hash(&mut h);
        Arc::new(EncodedResource {
            name,
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

#[cfg(test)]
mod tests {
    use super::TypeUrl;

    #[test]
    fn index_is_the_position_in_all() {
        for (i, t) in TypeUrl::ALL.into_iter().enumerate() {
            assert_eq!(t.index(), i, "{t:?}");
        }
    }

    #[test]
    fn mcp_types_parse_outside_all() {
        let t = TypeUrl::parse("networking.istio.io/v1alpha3/ServiceEntry").unwrap();
        assert!(t.is_mcp() && t.is_wildcard() && !TypeUrl::ALL.contains(&t));
        assert_eq!(t.as_str(), "networking.istio.io/v1alpha3/ServiceEntry");
        assert_eq!(t.index(), TypeUrl::ALL.len());
        assert_eq!(
            serde_json::to_string(&t).unwrap(),
            "\"networking.istio.io/v1alpha3/ServiceEntry\""
        );
    }
}
