//! MCP-over-xDS: Istio config served as `istio.mcp.v1alpha1.Resource`s, as istiod's
//! `APIGenerator` serves it (`pilot/pkg/networking/apigen`).
//!
//! Each MCP type (see [`crate::xds::mcp`]) answers with every object of its kind the
//! config stores hold (`metadata.name` `<namespace>/<name>`, the spec as an `Any` of
//! the kind's proto, `type.googleapis.com/istio.networking.v1alpha3.ServiceEntry`),
//! whatever names the client asks for; ServiceEntries and WorkloadEntries also include
//! the objects synthesized from the exported registries ([`synth`]); the mesh config
//! type answers with the mesh config itself (an `Any` of `istio.mesh.v1alpha1.MeshConfig`,
//! not wrapped), as istiod does.
//!
//! One [`McpInput`] per kind is the cache key: the encoded resources of a kind are
//! built once per snapshot and shared by every MCP client, and survive into the next
//! snapshot unless its push touches the kind (`xds::deps::mcp_reads`).

pub mod synth;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use meshfed_api::mcp::v1alpha1 as mcp;
use meshfed_registry::Service;
use meshfed_registry::config::{ConfigObject, Kind, Spec};
use prost::Message;

use crate::generate::cds::SharedShards;
use crate::model::ProxyClass;
use crate::push::cache::CacheInput;
use crate::push::snapshot::Snapshot;
use crate::xds::mcp::{McpKind, McpType};
use crate::xds::wire::SharedAny;
use crate::xds::{EncodedResource, Resource, TypeUrl};
pub use synth::McpExport;
use synth::{Synthetic, fnv1a};

/// The `Any` type of every resource of a config kind's MCP type.
pub const RESOURCE_TYPE: &str = "type.googleapis.com/istio.mcp.v1alpha1.Resource";

/// The `Any` type of the mesh config's one resource.
pub const MESH_CONFIG_ANY_TYPE: &str = "type.googleapis.com/istio.mesh.v1alpha1.MeshConfig";

/// What one kind's MCP type serves in a snapshot.
#[derive(Clone, Debug, Default)]
pub struct McpOutput {
    /// The resources, by name.
    pub resources: Arc<[Resource]>,
    /// Synthesized services another registry also has (ServiceEntry only).
    pub conflicts: Arc<[String]>,
    /// Services or objects left out, with why.
    pub skipped: Arc<[String]>,
}

/// The cache key of one kind's MCP resources: the kind and what is exported.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct McpInput {
    /// The kind served.
    pub kind: McpKind,
    /// Which registries and namespaces are synthesized.
    pub export: Arc<McpExport>,
}

impl CacheInput<Snapshot> for McpInput {
    const TYPE: TypeUrl = TypeUrl::Mcp(McpType::preferred(McpKind::MeshConfig));
    type Output = McpOutput;

    fn type_url(&self) -> TypeUrl {
        TypeUrl::Mcp(McpType::preferred(self.kind))
    }

    fn class(&self) -> Option<ProxyClass> {
        None
    }

    fn generate(&self, snapshot: &Snapshot) -> Option<McpOutput> {
        Some(build(self.kind, snapshot, &self.export))
    }
}

/// The MCP resources of type `t` in `snapshot` (the same for every client).
pub fn generate(t: McpType, snapshot: &Snapshot, export: &Arc<McpExport>) -> McpOutput {
    snapshot
        .cached(McpInput {
            kind: t.kind,
            export: export.clone(),
        })
        .unwrap_or_default()
}

fn build(kind: McpKind, snapshot: &Snapshot, export: &Arc<McpExport>) -> McpOutput {
    let kind = match kind {
        McpKind::MeshConfig => {
            let bytes = snapshot.mesh().config.encode_to_vec();
            return McpOutput {
                resources: Arc::from([encoded("", MESH_CONFIG_ANY_TYPE, bytes)]),
                ..McpOutput::default()
            };
        }
        McpKind::Config(kind) => kind,
    };
    let objects = snapshot.config().objects_of(kind);
    let mut resources: Vec<Resource> = objects.iter().map(|o| object_resource(o)).collect();
    let mut out = McpOutput::default();
    if matches!(kind, Kind::ServiceEntry | Kind::WorkloadEntry) {
        let taken: BTreeSet<Arc<str>> = resources.iter().map(|r| r.name.clone()).collect();
        let services = snapshot.services();
        let mut skipped = Vec::new();
        for service in services.all().iter().filter(|s| export.exports_service(s)) {
            let Some(made) = snapshot.cached(SynthInput {
                service: SharedService(service.clone()),
                shards: SharedShards(snapshot.shards(&service.key()).cloned()),
                export: export.clone(),
            }) else {
                continue;
            };
            skipped.extend(made.skipped.iter().cloned());
            let list = if kind == Kind::ServiceEntry {
                made.service_entry.as_slice()
            } else {
                made.workload_entries.as_slice()
            };
            for resource in list {
                if taken.contains(&resource.name) {
                    skipped.push(format!(
                        "{}: a {kind} of that name exists; it is served instead",
                        resource.name
                    ));
                } else {
                    resources.push(resource.clone());
                }
            }
        }
        resources.sort_by(|a, b| a.name.cmp(&b.name));
        if kind == Kind::ServiceEntry {
            let conflicts: Vec<_> = services
                .conflicts()
                .iter()
                .map(|c| (c.service.clone(), c.winner.clone(), c.loser.clone()))
                .collect();
            out.conflicts = synth::conflict_lines(&conflicts, |k| {
                services.get(k).is_some_and(|s| export.exports_service(s))
            })
            .into();
        }
        out.skipped = skipped.into();
    }
    out.resources = resources.into();
    out
}

/// A merged service in a cache key, compared by identity (a changed service is a new
/// allocation, which the key holds).
#[derive(Clone)]
pub struct SharedService(pub Arc<Service>);

impl PartialEq for SharedService {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for SharedService {}

impl std::hash::Hash for SharedService {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        Arc::as_ptr(&self.0).hash(state);
    }
}

impl std::fmt::Debug for SharedService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.0.namespace, self.0.hostname)
    }
}

/// The cache key of one exported service's synthesized objects: the service and its
/// endpoint shards (by identity) and what is exported. Kept across snapshots unless a
/// push changes that service (its hostname), so a change of one service re-encodes
/// that service's objects only.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SynthInput {
    /// The merged service.
    pub service: SharedService,
    /// Its endpoint shards.
    pub shards: SharedShards,
    /// What is exported.
    pub export: Arc<McpExport>,
}

/// The encoded objects of one service.
#[derive(Debug, Default)]
pub struct SynthResources {
    /// Its ServiceEntry.
    pub service_entry: Option<Resource>,
    /// Its WorkloadEntries.
    pub workload_entries: Vec<Resource>,
    /// Why it was left out, when it was.
    pub skipped: Option<String>,
}

impl CacheInput<Snapshot> for SynthInput {
    // WorkloadEntries are touched by both service and endpoint changes.
    const TYPE: TypeUrl = TypeUrl::Mcp(McpType::preferred(McpKind::Config(Kind::WorkloadEntry)));
    type Output = Arc<SynthResources>;

    fn class(&self) -> Option<ProxyClass> {
        None
    }

    fn service(&self) -> Option<&str> {
        Some(self.service.0.hostname.as_str())
    }

    fn generate(&self, _: &Snapshot) -> Option<Arc<SynthResources>> {
        let made =
            synth::synthesize_service(&self.service.0, self.shards.0.as_deref(), &self.export);
        Some(Arc::new(SynthResources {
            service_entry: made
                .service_entry
                .as_ref()
                .map(|s| SyntheticObject::Se(s).resource()),
            workload_entries: made
                .workload_entries
                .iter()
                .map(|w| SyntheticObject::We(w).resource())
                .collect(),
            skipped: made.skipped,
        }))
    }
}

/// A synthesized object of either kind.
enum SyntheticObject<'a> {
    Se(&'a Synthetic<meshfed_api::networking::v1alpha3::ServiceEntry>),
    We(&'a Synthetic<meshfed_api::networking::v1alpha3::WorkloadEntry>),
}

impl SyntheticObject<'_> {
    fn resource(&self) -> Resource {
        let (namespace, name, body, message, labels, annotations, created) = match self {
            SyntheticObject::Se(s) => (
                &s.namespace,
                &s.name,
                s.spec.encode_to_vec(),
                Kind::ServiceEntry.message_name(),
                &s.labels,
                &s.annotations,
                s.creation_time,
            ),
            SyntheticObject::We(w) => (
                &w.namespace,
                &w.name,
                w.spec.encode_to_vec(),
                Kind::WorkloadEntry.message_name(),
                &w.labels,
                &w.annotations,
                w.creation_time,
            ),
        };
        envelope(
            namespace,
            name,
            "",
            labels,
            annotations,
            created,
            &message,
            body,
        )
    }
}

/// The resource of a config object as the stores hold it.
fn object_resource(object: &ConfigObject) -> Resource {
    envelope(
        &object.namespace,
        &object.name,
        &object.resource_version,
        &object.labels,
        &object.annotations,
        object.creation_time,
        &object.kind.message_name(),
        encode_spec(&object.spec),
    )
}

/// The encoded spec, on the wire as the kind's Istio proto.
pub fn encode_spec(spec: &Spec) -> Vec<u8> {
    match spec {
        Spec::VirtualService(s) => s.encode_to_vec(),
        Spec::DestinationRule(s) => s.encode_to_vec(),
        Spec::Gateway(s) => s.encode_to_vec(),
        Spec::ServiceEntry(s) => s.encode_to_vec(),
        Spec::WorkloadEntry(s) => s.encode_to_vec(),
        Spec::Sidecar(s) => s.encode_to_vec(),
        Spec::PeerAuthentication(s) => s.encode_to_vec(),
        Spec::RequestAuthentication(s) => s.encode_to_vec(),
        Spec::AuthorizationPolicy(s) => s.encode_to_vec(),
        Spec::WorkloadGroup(s) => s.encode_to_vec(),
        Spec::Telemetry(s) => s.encode_to_vec(),
        Spec::EnvoyFilter(s) => s.encode_to_vec(),
        Spec::WasmPlugin(s) => s.encode_to_vec(),
        // The Gateway API kinds are not protos: a `google.protobuf.Struct`.
        other => other.encode_proto(),
    }
}

/// One `Resource` envelope. `version` is the object's `resourceVersion`, or when it
/// has none a digest of what a consumer stores (spec, labels, annotations): Istio's
/// client replaces an object only when its version changes.
#[allow(clippy::too_many_arguments)]
fn envelope(
    namespace: &str,
    name: &str,
    version: &str,
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
    created: SystemTime,
    message: &str,
    body: Vec<u8>,
) -> Resource {
    let version = if version.is_empty() {
        let mut digest = body.clone();
        for (k, v) in labels.iter().chain(annotations) {
            digest.extend_from_slice(k.as_bytes());
            digest.push(0);
            digest.extend_from_slice(v.as_bytes());
            digest.push(0);
        }
        format!("{:016x}", fnv1a(&digest))
    } else {
        version.to_string()
    };
    let since = created.duration_since(UNIX_EPOCH).unwrap_or_default();
    let resource = mcp::Resource {
        metadata: Some(mcp::Metadata {
            name: format!("{namespace}/{name}"),
            create_time: Some(pbjson_types::Timestamp {
                seconds: i64::try_from(since.as_secs()).unwrap_or(i64::MAX),
                nanos: i32::try_from(since.subsec_nanos()).unwrap_or(0),
            }),
            version,
            labels: labels.clone(),
            annotations: annotations.clone(),
        }),
        body: Some(pbjson_types::Any {
            type_url: format!("type.googleapis.com/{message}"),
            value: body.into(),
        }),
    };
    encoded(
        &format!("{namespace}/{name}"),
        RESOURCE_TYPE,
        resource.encode_to_vec(),
    )
}

/// An encoded resource whose `Any` is of `any_type` (an MCP type's responses carry
/// `Resource`s, not messages of the type URL asked for).
fn encoded(name: &str, any_type: &'static str, bytes: Vec<u8>) -> Resource {
    let value = Bytes::from(bytes);
    Arc::new(EncodedResource {
        name: Arc::from(name),
        version: Arc::from(format!("{:016x}", fnv1a(&value))),
        body: SharedAny {
            type_url: any_type,
            value,
        },
        placeholder: false,
    })
}
