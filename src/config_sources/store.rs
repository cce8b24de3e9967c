//! The config store of one `xds://` config source: what the source last sent, by
//! kind, validated like every other config.
//!
//! Each response is the whole set of its kind (SotW), so a response replaces that
//! kind's objects, as istiod's client does (`pkg/adsc` `handleMCP`): objects it
//! leaves out are deleted; an object whose `metadata.version` is unchanged and not
//! empty is kept as it was. An object that does not decode or validate is rejected
//! alone, naming the source, the object and the field; an earlier valid version of it
//! stays, as in every store. When the source goes away the objects stay (the last
//! known good), marked stale in the status until the source has sent every kind again.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use meshfed_api::mcp::v1alpha1::Resource;
use meshfed_registry::UpdateSink;
use meshfed_registry::config::store::{Objects, Published, StoreCore, list_kind};
use meshfed_registry::config::{ConfigObject, ConfigStore, Kind, ObjectId, RejectedConfig, Spec};
use prost::Message;
use serde::Serialize;
use tokio::sync::watch;
use tracing::{debug, info, warn};

/// The type URL of the MCP envelope every resource of a response is wrapped in.
pub const RESOURCE_TYPE_URL: &str = "type.googleapis.com/istio.mcp.v1alpha1.Resource";

/// The type URL a config source is asked for `kind` with: `<group>/<version>/<kind>`,
/// the version being the one of the kind's proto package, as istiod's collections
/// name them (`networking.istio.io/v1alpha3/ServiceEntry`).
pub fn type_url(kind: Kind) -> String {
    format!("{}/{}/{}", kind.group(), kind.mcp_version(), kind.as_str())
}

/// The kind a type URL asks for, if it is one of [`type_url`]'s.
pub fn kind_of(type_url_: &str) -> Option<Kind> {
    Kind::ALL.into_iter().find(|k| type_url(*k) == type_url_)
}

#[derive(Debug, Default)]
struct State {
    objects: Objects,
    /// What the last response of each kind held that was not taken.
    rejected: BTreeMap<Kind, Vec<RejectedConfig>>,
}

impl Published for State {
    fn objects(&self) -> &Objects {
        &self.objects
    }

    fn rejected(&self) -> Vec<RejectedConfig> {
        self.rejected.values().flatten().cloned().collect()
    }
}

/// The connection state of a source, for `/debug/configz` and the metrics.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceStatus {
    /// `xds://host:port`.
    pub address: String,
    /// A stream to the source is open.
    pub connected: bool,
    /// The source has sent every kind at least once (or the start-up wait ran out).
    pub synced: bool,
    /// The start-up wait ran out before the source sent every kind.
    pub sync_timed_out: bool,
    /// The objects are the last known good of a stream that ended: the current
    /// stream has not yet sent every kind again.
    pub stale: bool,
    /// Seconds since the epoch of the last response applied.
    pub last_update: Option<f64>,
    /// Streams opened so far.
    pub connects: u64,
    /// Why the last stream or connection attempt ended, if it did.
    pub last_error: Option<String>,
    /// The kinds the current stream has sent.
    #[serde(skip)]
    pub(crate) received: BTreeSet<Kind>,
}

/// The store of one `xds://` source. A cheap handle; clones share one store.
#[derive(Clone, Debug)]
pub struct SourceStore {
    name: Arc<str>,
    /// This server's revision: objects labelled `istio.io/rev` with another one are
    /// not read (as istiod's `ObjectInRevision`). Empty reads every object.
    revision: Arc<str>,
    core: Arc<StoreCore<State>>,
    status: Arc<Mutex<SourceStatus>>,
}

/// What applying one response did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// Objects of the kind now held.
    pub objects: usize,
    /// Resources of the response not taken.
    pub rejected: usize,
}

impl SourceStore {
    /// An empty, unsynced store for the source named `name` (`xds://host:port`),
    /// announcing through `sink`.
    pub fn new(name: &str, sink: UpdateSink) -> SourceStore {
        SourceStore {
            name: name.into(),
            revision: "".into(),
            core: Arc::new(StoreCore::new(sink)),
            status: Arc::new(Mutex::new(SourceStatus {
                address: name.to_string(),
                ..SourceStatus::default()
            })),
        }
    }

    /// Reads only the objects of `revision` (and those of none), as istiod's client.
    pub fn with_revision(mut self, revision: &str) -> SourceStore {
        self.revision = revision.into();
        self
    }

    /// The source's name (its address).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A copy of the connection state.
    pub fn status(&self) -> SourceStatus {
        self.status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn update_status<T>(&self, change: impl FnOnce(&mut SourceStatus) -> T) -> T {
        change(&mut self.status.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// A stream is open: nothing of it received yet.
    pub fn connected(&self) {
        self.update_status(|s| {
            s.connected = true;
            s.connects += 1;
            s.received.clear();
        });
    }

    /// The stream (or the attempt to open one) ended with `error`: the objects stay,
    /// stale if there are any.
    pub fn disconnected(&self, error: &str) {
        let held = !self.core.read().objects.is_empty();
        self.update_status(|s| {
            s.connected = false;
            s.stale = held || s.stale;
            s.last_error = Some(error.to_string());
            s.received.clear();
        });
    }

    /// The start-up wait for the source ran out: the server stops waiting for it
    /// (readiness), and the status says so.
    pub fn give_up_initial_sync(&self) -> bool {
        if self.core.has_synced() {
            return false;
        }
        self.update_status(|s| s.sync_timed_out = true);
        self.mark_synced();
        true
    }

    fn mark_synced(&self) {
        self.update_status(|s| s.synced = true);
        self.core.mark_synced();
    }

    /// Applies one response for `kind`: `resources` replace the kind's objects. Every
    /// resource is decoded and validated; the rejected ones are listed (and logged).
    /// `expected` is the number of kinds the stream asked for: once it has sent them
    /// all, the store is synced and no longer stale.
    pub fn apply(&self, kind: Kind, resources: &[(&str, &[u8])], expected: usize) -> Applied {
        let mut received = Objects::new();
        let mut rejected = Vec::new();
        for (type_url, value) in resources {
            match decode_resource(&self.name, kind, type_url, value) {
                Ok(obj) if !in_revision(&obj, &self.revision) => {
                    debug!(source = %self.name, "{} {}/{} belongs to another revision; not read", obj.kind, obj.namespace, obj.name);
                }
                Ok(obj) => match meshfed_registry::config::validate(&obj) {
                    Ok(_) => {
                        received.insert(obj.id(), Arc::new(obj));
                    }
                    Err(errors) => rejected.push(RejectedConfig {
                        source: self.name.to_string(),
                        kind: kind.to_string(),
                        namespace: obj.namespace.clone(),
                        name: obj.name.clone(),
                        errors: errors.iter().map(ToString::to_string).collect(),
                    }),
                },
                Err(r) => rejected.push(*r),
            }
        }
        for r in &rejected {
            warn!(source = %self.name, "config source object rejected: {r}");
        }
        let (changed, objects) = {
            let mut state = self.core.write();
            let before = list_kind(&state.objects, kind);
            let mut changed = Vec::new();
            let mut next: Objects = Objects::new();
            for (id, mut obj) in received {
                if let Some(old) = state.objects.get(&id) {
                    // Istio's client updates only when the version differs or is unset.
                    if !obj.resource_version.is_empty()
                        && old.resource_version == obj.resource_version
                    {
                        obj = old.clone();
                    } else if !old.same_content(&obj) {
                        changed.push(id.key());
                    }
                } else {
                    changed.push(id.key());
                }
                next.insert(id, obj);
            }
            // A rejected object keeps its earlier valid version.
            for r in &rejected {
                let id = ObjectId::new(kind, &r.namespace, &r.name);
                if let Some(old) = state.objects.get(&id) {
                    next.entry(id).or_insert_with(|| old.clone());
                }
            }
            for old in before {
                let id = old.id();
                if !next.contains_key(&id) {
                    changed.push(id.key());
                }
                state.objects.remove(&id);
            }
            let objects = next.len();
            state.objects.extend(next);
            state.rejected.insert(kind, rejected.clone());
            (changed, objects)
        };
        let all_received = self.update_status(|s| {
            s.received.insert(kind);
            s.last_update = Some(now_seconds());
            let all = s.received.len() >= expected;
            if all && s.stale {
                info!(source = %self.name, "config source resynced: its objects are current again");
                s.stale = false;
            }
            all
        });
        if all_received && !self.core.has_synced() {
            info!(source = %self.name, "config source synced");
            self.mark_synced();
        }
        if !changed.is_empty() {
            self.core.announce(changed);
        }
        Applied {
            objects,
            rejected: rejected.len(),
        }
    }

    /// Objects held.
    pub fn len(&self) -> usize {
        self.core.read().objects.len()
    }

    /// True when no object is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Istio's `ObjectInRevision`: an object without `istio.io/rev` belongs to every
/// revision, and a server without a revision reads every object.
fn in_revision(obj: &ConfigObject, revision: &str) -> bool {
    revision.is_empty()
        || obj
            .labels
            .get("istio.io/rev")
            .is_none_or(|rev| rev == revision)
}

fn now_seconds() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default()
}

/// Reads one resource of a `kind` response from `source`: the MCP envelope, its
/// `<namespace>/<name>`, its body (which must be the kind's message), labels,
/// annotations, creation time and version. The object's `source` is the source's
/// name (its provenance).
pub fn decode_resource(
    source: &str,
    kind: Kind,
    type_url: &str,
    value: &[u8],
) -> Result<ConfigObject, Box<RejectedConfig>> {
    let reject = |namespace: &str, name: &str, error: String| {
        Box::new(RejectedConfig {
            source: source.to_string(),
            kind: kind.to_string(),
            namespace: namespace.to_string(),
            name: name.to_string(),
            errors: vec![error],
        })
    };
    if type_url != RESOURCE_TYPE_URL {
        return Err(reject(
            "",
            "",
            format!("resource of type {type_url:?}: a config source sends {RESOURCE_TYPE_URL}"),
        ));
    }
    let resource = Resource::decode(value)
        .map_err(|e| reject("", "", format!("not an istio.mcp.v1alpha1.Resource: {e}")))?;
    let metadata = resource.metadata.unwrap_or_default();
    let Some((namespace, name)) = metadata
        .name
        .split_once('/')
        .filter(|(ns, n)| !ns.is_empty() && !n.is_empty() && !n.contains('/'))
    else {
        return Err(reject(
            "",
            &metadata.name,
            format!(
                "metadata.name: {:?} is not <namespace>/<name>",
                metadata.name
            ),
        ));
    };
    let Some(body) = resource.body else {
        return Err(reject(namespace, name, "body: missing".into()));
    };
    let message = kind.message_name();
    if body.type_url.rsplit('/').next() != Some(message.as_str()) {
        return Err(reject(
            namespace,
            name,
            format!("body: a {kind} is a {message}, not {:?}", body.type_url),
        ));
    }
    let spec = Spec::decode_proto(kind, &body.value)
        .map_err(|e| reject(namespace, name, format!("body: not a {message}: {e}")))?;
    let creation_time = metadata
        .create_time
        .and_then(|t| {
            let secs = u64::try_from(t.seconds).ok()?;
            let nanos = u32::try_from(t.nanos).ok()?;
            UNIX_EPOCH.checked_add(Duration::new(secs, nanos))
        })
        .unwrap_or(UNIX_EPOCH);
    Ok(ConfigObject {
        kind,
        name: name.to_string(),
        namespace: namespace.to_string(),
        labels: metadata.labels.into_iter().collect(),
        annotations: metadata.annotations.into_iter().collect(),
        creation_time,
        resource_version: metadata.version,
        source: source.to_string(),
        spec,
        conditions: Vec::new(),
        status_addresses: Vec::new(),
    })
}

impl ConfigStore for SourceStore {
    fn list(&self, kind: Kind) -> Vec<Arc<ConfigObject>> {
        self.core.list(kind)
    }

    fn all(&self) -> Vec<Arc<ConfigObject>> {
        self.core.all()
    }

    fn rejected(&self) -> Vec<RejectedConfig> {
        self.core.rejected()
    }

    fn has_synced(&self) -> bool {
        self.core.has_synced()
    }

    fn changes(&self) -> Option<watch::Receiver<u64>> {
        Some(self.core.changes())
    }

    fn source_status(&self) -> Option<serde_json::Value> {
        let mut value = serde_json::to_value(self.status()).ok()?;
        value["objects"] = self.len().into();
        value["rejected"] = self.core.rejected().len().into();
        Some(value)
    }
}
