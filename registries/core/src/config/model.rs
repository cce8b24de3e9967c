//! The config object model: Kubernetes metadata plus a typed spec.
//!
//! The kinds, their groups and versions are declared in [`crate::config::kinds`].
//! [`crate::config::decode()`] reads them from their Kubernetes form; [`ConfigObject`]
//! serializes back to it.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use meshfed_api::networking::v1alpha3 as net;
use serde::Serialize;

use crate::config::time::format_rfc3339;
use crate::events::ConfigKey;

pub use crate::config::kinds::{Kind, KindSpec, Spec};
use crate::config::kinds::{NETWORKING, SECURITY};

/// The API group of the networking kinds.
pub const GROUP: &str = NETWORKING.name;

/// The versions of [`GROUP`] that are accepted (they share one schema).
pub const VERSIONS: [&str; 3] = ["v1", "v1beta1", "v1alpha3"];

/// The API group of the security kinds.
pub const SECURITY_GROUP: &str = SECURITY.name;

/// The versions of [`SECURITY_GROUP`] that are accepted (one schema).
pub const SECURITY_VERSIONS: [&str; 2] = ["v1", "v1beta1"];

/// True for an `apiVersion` of the kind's group in one of its versions.
pub fn supported_api_version(kind: Kind, api_version: &str) -> bool {
    api_version
        .split_once('/')
        .is_some_and(|(group, version)| group == kind.group() && kind.versions().contains(&version))
}

impl Spec {
    /// The VirtualService, if this is one.
    pub fn as_virtual_service(&self) -> Option<&net::VirtualService> {
        self.get()
    }

    /// The DestinationRule, if this is one.
    pub fn as_destination_rule(&self) -> Option<&net::DestinationRule> {
        self.get()
    }

    /// The Gateway, if this is one.
    pub fn as_gateway(&self) -> Option<&net::Gateway> {
        self.get()
    }

    /// The ServiceEntry, if this is one.
    pub fn as_service_entry(&self) -> Option<&net::ServiceEntry> {
        self.get()
    }

    /// The WorkloadEntry, if this is one.
    pub fn as_workload_entry(&self) -> Option<&net::WorkloadEntry> {
        self.get()
    }

    /// The Sidecar, if this is one.
    pub fn as_sidecar(&self) -> Option<&net::Sidecar> {
        self.get()
    }
}

/// A config object: Kubernetes metadata and a typed spec.
#[derive(Clone, Debug, PartialEq)]
pub struct ConfigObject {
    /// The kind; always the kind of `spec`.
    pub kind: Kind,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace` (`default` when not given).
    pub namespace: String,
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
    /// `metadata.annotations`.
    pub annotations: BTreeMap<String, String>,
    /// `metadata.creationTimestamp`, or `UNIX_EPOCH` when not given. The config
    /// directory store replaces `UNIX_EPOCH` with the time it first saw the object and
    /// keeps that time across reloads and edits, so the oldest-wins rules stay stable
    /// and a file object added later counts as younger.
    pub creation_time: SystemTime,
    /// `metadata.resourceVersion` as given (empty when not given).
    pub resource_version: String,
    /// Where the object came from: `path:line` of a file, or `memory`.
    pub source: String,
    /// The spec.
    pub spec: Spec,
    /// `status.conditions` (Istio's `IstioCondition`s; a WorkloadEntry's `Healthy`
    /// condition decides whether its endpoint is served). Empty when not given.
    pub conditions: Vec<Condition>,
    /// `status.addresses` (a Gateway API Gateway's: what its controller reports the
    /// gateway reachable at; a waypoint is configured once it has one). Empty when
    /// not given.
    pub status_addresses: Vec<StatusAddress>,
}

/// One entry of a Gateway's `status.addresses`.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct StatusAddress {
    /// `type`: `IPAddress` (the default), `Hostname`, or an implementation's own.
    pub kind: String,
    /// `value`.
    pub value: String,
}

/// One entry of `status.conditions`.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Condition {
    /// `type` (e.g. `Healthy`).
    pub kind: String,
    /// `status`: `True`, `False` or `Unknown`.
    pub status: String,
    /// `reason`.
    pub reason: String,
    /// `message`.
    pub message: String,
    /// `lastProbeTime`.
    pub last_probe_time: Option<SystemTime>,
    /// `lastTransitionTime`.
    pub last_transition_time: Option<SystemTime>,
}

impl Condition {
    /// The Kubernetes form (`{type, status, ...}`).
    pub fn to_json(&self) -> serde_json::Value {
        let mut out = serde_json::Map::new();
        out.insert("type".into(), self.kind.clone().into());
        out.insert("status".into(), self.status.clone().into());
        for (key, value) in [("reason", &self.reason), ("message", &self.message)] {
            if !value.is_empty() {
                out.insert(key.into(), value.clone().into());
            }
        }
        for (key, value) in [
            ("lastProbeTime", self.last_probe_time),
            ("lastTransitionTime", self.last_transition_time),
        ] {
            if let Some(t) = value {
                out.insert(key.into(), format_rfc3339(t).into());
            }
        }
        serde_json::Value::Object(out)
    }
}

impl ConfigObject {
    /// An object built in code (source `memory`, no labels, creation time
    /// `UNIX_EPOCH`).
    pub fn new(namespace: &str, name: &str, spec: impl Into<Spec>) -> ConfigObject {
        let spec = spec.into();
        ConfigObject {
            kind: spec.kind(),
            name: name.to_string(),
            namespace: namespace.to_string(),
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            creation_time: UNIX_EPOCH,
            resource_version: String::new(),
            source: "memory".to_string(),
            spec,
            conditions: Vec::new(),
            status_addresses: Vec::new(),
        }
    }

    /// The condition of this `type`, if any.
    pub fn condition(&self, kind: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.kind == kind)
    }

    /// The push key of this object: its kind's [`ConfigKind`], name and namespace.
    /// (For a ServiceEntry the name is the object's name, not a hostname.)
    pub fn key(&self) -> ConfigKey {
        ConfigKey::new(self.kind.config_kind(), &self.name, &self.namespace)
    }

    /// The identity of the object within a store: kind, namespace, name.
    pub fn id(&self) -> ObjectId {
        ObjectId {
            kind: self.kind,
            namespace: Arc::from(self.namespace.as_str()),
            name: Arc::from(self.name.as_str()),
        }
    }

    /// Whether a change from `other` to `self` needs a push: the spec, labels or
    /// annotations differ (as Istio's `NeedsPush`; the source, resource version and
    /// creation time do not count), or its status conditions or addresses do (a
    /// WorkloadEntry's health changes its endpoint; a waypoint Gateway's address
    /// makes it ready).
    pub fn same_content(&self, other: &ConfigObject) -> bool {
        self.spec == other.spec
            && self.labels == other.labels
            && self.annotations == other.annotations
            && self.conditions == other.conditions
            && self.status_addresses == other.status_addresses
    }
}

impl Serialize for ConfigObject {
    /// The Kubernetes form (`apiVersion: networking.istio.io/v1`, `kind`, `metadata`,
    /// `spec`), which [`crate::config::decode()`] reads back.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Metadata<'a> {
            name: &'a str,
            namespace: &'a str,
            #[serde(skip_serializing_if = "BTreeMap::is_empty")]
            labels: &'a BTreeMap<String, String>,
            #[serde(skip_serializing_if = "BTreeMap::is_empty")]
            annotations: &'a BTreeMap<String, String>,
            #[serde(skip_serializing_if = "Option::is_none")]
            creation_timestamp: Option<String>,
            #[serde(skip_serializing_if = "str::is_empty")]
            resource_version: &'a str,
        }
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Object<'a> {
            api_version: &'static str,
            kind: &'static str,
            metadata: Metadata<'a>,
            spec: &'a Spec,
            #[serde(skip_serializing_if = "Option::is_none")]
            status: Option<serde_json::Value>,
        }
        Object {
            api_version: self.kind.api_version(),
            // The Kubernetes kind name: `Gateway` for the Gateway API's, which its
            // group tells from Istio's.
            kind: self.kind.as_str(),
            metadata: Metadata {
                name: &self.name,
                namespace: &self.namespace,
                labels: &self.labels,
                annotations: &self.annotations,
                creation_timestamp: (self.creation_time != UNIX_EPOCH)
                    .then(|| format_rfc3339(self.creation_time)),
                resource_version: &self.resource_version,
            },
            spec: &self.spec,
            status: (!self.conditions.is_empty() || !self.status_addresses.is_empty()).then(|| {
                let mut status = serde_json::Map::new();
                if !self.conditions.is_empty() {
                    status.insert(
                        "conditions".into(),
                        self.conditions.iter().map(Condition::to_json).collect(),
                    );
                }
                if !self.status_addresses.is_empty() {
                    status.insert(
                        "addresses".into(),
                        self.status_addresses
                            .iter()
                            .map(|a| serde_json::json!({"type": a.kind, "value": a.value}))
                            .collect(),
                    );
                }
                serde_json::Value::Object(status)
            }),
        }
        .serialize(s)
    }
}

/// Kind, namespace and name: what identifies an object in a store.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Serialize)]
pub struct ObjectId {
    /// Kind.
    pub kind: Kind,
    /// Namespace.
    pub namespace: Arc<str>,
    /// Name.
    pub name: Arc<str>,
}

impl ObjectId {
    /// Builds an id.
    pub fn new(kind: Kind, namespace: &str, name: &str) -> ObjectId {
        ObjectId {
            kind,
            namespace: Arc::from(namespace),
            name: Arc::from(name),
        }
    }

    /// The push key of the object.
    pub fn key(&self) -> ConfigKey {
        ConfigKey::new(self.kind.config_kind(), &self.name, &self.namespace)
    }
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
    }
}
