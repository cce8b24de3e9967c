//! The config object model: Kubernetes metadata plus a typed spec.
//!
//! The kinds are VirtualService, DestinationRule, Gateway, ServiceEntry, WorkloadEntry
//! and Sidecar of group `networking.istio.io`, versions `v1`, `v1beta1` and `v1alpha3`
//! (one schema), and PeerAuthentication, RequestAuthentication and AuthorizationPolicy
//! of group `security.istio.io`, versions `v1` and `v1beta1`.
//! [`crate::config::decode()`] reads them from their Kubernetes form; [`ConfigObject`]
//! serializes back to it.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use meshfed_api::networking::v1alpha3 as net;
use meshfed_api::security::v1beta1 as sec;
use serde::Serialize;
use serde_json::Value;

use crate::config::decode::decode_spec;
use crate::config::time::format_rfc3339;
use crate::config::validate::FieldError;
use crate::events::{ConfigKey, ConfigKind};

/// The API group of the networking kinds.
pub const GROUP: &str = "networking.istio.io";

/// The versions of [`GROUP`] that are accepted (they share one schema).
pub const VERSIONS: [&str; 3] = ["v1", "v1beta1", "v1alpha3"];

/// The API group of the security kinds.
pub const SECURITY_GROUP: &str = "security.istio.io";

/// The versions of [`SECURITY_GROUP`] that are accepted (one schema).
pub const SECURITY_VERSIONS: [&str; 2] = ["v1", "v1beta1"];

/// True for an `apiVersion` of the kind's group in one of its versions.
pub fn supported_api_version(kind: Kind, api_version: &str) -> bool {
    api_version
        .split_once('/')
        .is_some_and(|(group, version)| group == kind.group() && kind.versions().contains(&version))
}

/// The config kinds meshfed reads. The order is the order of [`ConfigStore::all`]
/// (kind, then namespace, then name).
///
/// [`ConfigStore::all`]: crate::config::ConfigStore::all
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Serialize)]
pub enum Kind {
    VirtualService,
    DestinationRule,
    Gateway,
    ServiceEntry,
    WorkloadEntry,
    Sidecar,
    PeerAuthentication,
    RequestAuthentication,
    AuthorizationPolicy,
}

impl Kind {
    /// Every kind, in order.
    pub const ALL: [Kind; 9] = [
        Kind::VirtualService,
        Kind::DestinationRule,
        Kind::Gateway,
        Kind::ServiceEntry,
        Kind::WorkloadEntry,
        Kind::Sidecar,
        Kind::PeerAuthentication,
        Kind::RequestAuthentication,
        Kind::AuthorizationPolicy,
    ];

    /// The kind's API group.
    pub fn group(self) -> &'static str {
        if self.is_security() {
            SECURITY_GROUP
        } else {
            GROUP
        }
    }

    /// The versions of the kind's group that are read, preferred first.
    pub fn versions(self) -> &'static [&'static str] {
        if self.is_security() {
            &SECURITY_VERSIONS
        } else {
            &VERSIONS
        }
    }

    /// `<group>/<preferred version>`, written when an object is serialized.
    pub fn api_version(self) -> &'static str {
        if self.is_security() {
            "security.istio.io/v1"
        } else {
            "networking.istio.io/v1"
        }
    }

    /// A `security.istio.io` kind.
    pub fn is_security(self) -> bool {
        matches!(
            self,
            Kind::PeerAuthentication | Kind::RequestAuthentication | Kind::AuthorizationPolicy
        )
    }

    /// The Kubernetes kind name (`VirtualService`).
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::VirtualService => "VirtualService",
            Kind::DestinationRule => "DestinationRule",
            Kind::Gateway => "Gateway",
            Kind::ServiceEntry => "ServiceEntry",
            Kind::WorkloadEntry => "WorkloadEntry",
            Kind::Sidecar => "Sidecar",
            Kind::PeerAuthentication => "PeerAuthentication",
            Kind::RequestAuthentication => "RequestAuthentication",
            Kind::AuthorizationPolicy => "AuthorizationPolicy",
        }
    }

    /// The kind of a Kubernetes kind name (exact spelling).
    pub fn from_name(kind: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.as_str() == kind)
    }

    /// The [`ConfigKind`] of push keys for objects of this kind.
    pub fn config_kind(self) -> ConfigKind {
        match self {
            Kind::VirtualService => ConfigKind::VirtualService,
            Kind::DestinationRule => ConfigKind::DestinationRule,
            Kind::Gateway => ConfigKind::Gateway,
            Kind::ServiceEntry => ConfigKind::ServiceEntry,
            Kind::WorkloadEntry => ConfigKind::WorkloadEntry,
            Kind::Sidecar => ConfigKind::Sidecar,
            Kind::PeerAuthentication => ConfigKind::PeerAuthentication,
            Kind::RequestAuthentication => ConfigKind::RequestAuthentication,
            Kind::AuthorizationPolicy => ConfigKind::AuthorizationPolicy,
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The typed spec of a config object.
// Specs live behind `Arc` in the stores; boxing the large variants would only add an
// indirection to every read.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum Spec {
    VirtualService(net::VirtualService),
    DestinationRule(net::DestinationRule),
    Gateway(net::Gateway),
    ServiceEntry(net::ServiceEntry),
    WorkloadEntry(net::WorkloadEntry),
    Sidecar(net::Sidecar),
    PeerAuthentication(sec::PeerAuthentication),
    RequestAuthentication(sec::RequestAuthentication),
    AuthorizationPolicy(sec::AuthorizationPolicy),
}

impl Spec {
    /// The kind this spec belongs to.
    pub fn kind(&self) -> Kind {
        match self {
            Spec::VirtualService(_) => Kind::VirtualService,
            Spec::DestinationRule(_) => Kind::DestinationRule,
            Spec::Gateway(_) => Kind::Gateway,
            Spec::ServiceEntry(_) => Kind::ServiceEntry,
            Spec::WorkloadEntry(_) => Kind::WorkloadEntry,
            Spec::Sidecar(_) => Kind::Sidecar,
            Spec::PeerAuthentication(_) => Kind::PeerAuthentication,
            Spec::RequestAuthentication(_) => Kind::RequestAuthentication,
            Spec::AuthorizationPolicy(_) => Kind::AuthorizationPolicy,
        }
    }

    /// Reads the spec of a `kind` object from its proto3 JSON form. A missing or null
    /// spec is the empty message. Errors name the field (`spec.http[0].timeout`).
    pub fn from_value(kind: Kind, value: &Value) -> Result<Spec, FieldError> {
        let empty = Value::Object(serde_json::Map::new());
        let value = if value.is_null() { &empty } else { value };
        Ok(match kind {
            Kind::VirtualService => Spec::VirtualService(decode_spec(value)?),
            Kind::DestinationRule => Spec::DestinationRule(decode_spec(value)?),
            Kind::Gateway => Spec::Gateway(decode_spec(value)?),
            Kind::ServiceEntry => Spec::ServiceEntry(decode_spec(value)?),
            Kind::WorkloadEntry => Spec::WorkloadEntry(decode_spec(value)?),
            Kind::Sidecar => Spec::Sidecar(decode_spec(value)?),
            Kind::PeerAuthentication => Spec::PeerAuthentication(decode_spec(value)?),
            Kind::RequestAuthentication => Spec::RequestAuthentication(decode_spec(value)?),
            Kind::AuthorizationPolicy => Spec::AuthorizationPolicy(decode_spec(value)?),
        })
    }

    /// The VirtualService, if this is one.
    pub fn as_virtual_service(&self) -> Option<&net::VirtualService> {
        match self {
            Spec::VirtualService(s) => Some(s),
            _ => None,
        }
    }

    /// The DestinationRule, if this is one.
    pub fn as_destination_rule(&self) -> Option<&net::DestinationRule> {
        match self {
            Spec::DestinationRule(s) => Some(s),
            _ => None,
        }
    }

    /// The Gateway, if this is one.
    pub fn as_gateway(&self) -> Option<&net::Gateway> {
        match self {
            Spec::Gateway(s) => Some(s),
            _ => None,
        }
    }

    /// The ServiceEntry, if this is one.
    pub fn as_service_entry(&self) -> Option<&net::ServiceEntry> {
        match self {
            Spec::ServiceEntry(s) => Some(s),
            _ => None,
        }
    }

    /// The WorkloadEntry, if this is one.
    pub fn as_workload_entry(&self) -> Option<&net::WorkloadEntry> {
        match self {
            Spec::WorkloadEntry(s) => Some(s),
            _ => None,
        }
    }

    /// The Sidecar, if this is one.
    pub fn as_sidecar(&self) -> Option<&net::Sidecar> {
        match self {
            Spec::Sidecar(s) => Some(s),
            _ => None,
        }
    }
}

impl Serialize for Spec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Spec::VirtualService(v) => v.serialize(s),
            Spec::DestinationRule(v) => v.serialize(s),
            Spec::Gateway(v) => v.serialize(s),
            Spec::ServiceEntry(v) => v.serialize(s),
            Spec::WorkloadEntry(v) => v.serialize(s),
            Spec::Sidecar(v) => v.serialize(s),
            Spec::PeerAuthentication(v) => v.serialize(s),
            Spec::RequestAuthentication(v) => v.serialize(s),
            Spec::AuthorizationPolicy(v) => v.serialize(s),
        }
    }
}

macro_rules! spec_from {
    ($($variant:ident),*) => {
        $(impl From<net::$variant> for Spec {
            fn from(spec: net::$variant) -> Spec {
                Spec::$variant(spec)
            }
        })*
    };
}
spec_from!(
    VirtualService,
    DestinationRule,
    Gateway,
    ServiceEntry,
    WorkloadEntry,
    Sidecar
);

macro_rules! security_spec_from {
    ($($variant:ident),*) => {
        $(impl From<sec::$variant> for Spec {
            fn from(spec: sec::$variant) -> Spec {
                Spec::$variant(spec)
            }
        })*
    };
}
security_spec_from!(
    PeerAuthentication,
    RequestAuthentication,
    AuthorizationPolicy
);

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
        }
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
    /// creation time do not count).
    pub fn same_content(&self, other: &ConfigObject) -> bool {
        self.spec == other.spec
            && self.labels == other.labels
            && self.annotations == other.annotations
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
            kind: Kind,
            metadata: Metadata<'a>,
            spec: &'a Spec,
        }
        Object {
            api_version: self.kind.api_version(),
            kind: self.kind,
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
