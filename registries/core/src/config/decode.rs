//! Reading Kubernetes-style objects (`apiVersion`, `kind`, `metadata`, `spec`) into
//! [`ConfigObject`]s.
//!
//! Accepted: the kinds of [`Kind`] in their group: `networking.istio.io` (versions `v1`,
//! `v1beta1` and `v1alpha3`) or `security.istio.io` (`v1`, `v1beta1`), as declared in
//! [`crate::config::kinds`]. Objects of other groups or other kinds are skipped, and
//! reported as ignored ([`crate::config::ignored`]); a known kind with an unknown version of the group is an error, so
//! that a typo does not silently drop an object. A missing namespace is `default`; a
//! missing `creationTimestamp` is `UNIX_EPOCH` (which the config directory store turns
//! into the time it first saw the object).
//!
//! Specs are read in proto3 JSON form through `serde_json::Value`: camelCase and
//! snake_case field names, enums by name, durations such as `"5s"`; an unknown field is
//! an error, as in Istio's schema validation ([`crate::config::spec_json`]). Errors name
//! the field (`spec.http[0].timeout`, `spec.trafficPolcy`).

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;

use crate::config::model::{ConfigObject, Kind, Spec, supported_api_version};
use crate::config::secret::{SecretObject, decode_secret, is_secret};
use crate::config::spec_json::describe;
use crate::config::time::parse_rfc3339;
use crate::config::validate::{FieldError, FieldPath};

/// The outcome of reading one Kubernetes-style object.
// Short-lived (consumed right after decoding), so the size difference does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum Decoded {
    /// A config object (not validated yet; see [`crate::config::validate()`]).
    Object(ConfigObject),
    /// Not a kind meshfed reads (another group, or another kind of the group).
    Skipped(SkippedObject),
    /// Meant to be one of ours but unreadable: wrong types, bad enum names, bad
    /// durations, unsupported version, missing name.
    Invalid(InvalidObject),
    /// A `v1` Secret (gateway credentials for SDS, [`crate::config::secret`]).
    Secret(SecretObject),
}

/// An object of a kind meshfed does not read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SkippedObject {
    /// Its `apiVersion`.
    pub api_version: String,
    /// Its `kind`.
    pub kind: String,
    /// Its `metadata.namespace` as written (empty when not given).
    pub namespace: String,
    /// Its `metadata.name`, if any.
    pub name: String,
    /// Its `metadata.labels` (a `v1` Namespace's are read: see
    /// [`crate::config::NamespaceLabels`]).
    pub labels: std::collections::BTreeMap<String, String>,
    /// Its string `data` (a `v1` ConfigMap's are read: see
    /// [`crate::config::ConfigMaps`]).
    pub data: std::collections::BTreeMap<String, String>,
}

/// An object that could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidObject {
    /// The `kind` as written (empty when missing).
    pub kind: String,
    /// The namespace (`default` when not given, empty when unreadable).
    pub namespace: String,
    /// The name (empty when missing or unreadable).
    pub name: String,
    /// What is wrong, by field.
    pub errors: Vec<FieldError>,
}

/// Reads one Kubernetes-style object. `source` is recorded in the object (`path:line`
/// or `memory`). `kind: List` is not handled here (the file reader unpacks lists).
pub fn decode(value: &Value, source: &str) -> Decoded {
    let root = FieldPath::root();
    let Some(map) = value.as_object() else {
        return Decoded::Invalid(InvalidObject {
            kind: String::new(),
            namespace: String::new(),
            name: String::new(),
            errors: vec![FieldError::new(
                root,
                format!(
                    "expected a Kubernetes object (a mapping with apiVersion, kind, metadata and spec), found {}",
                    describe(value)
                ),
            )],
        });
    };
    let text = |field: &str| map.get(field).and_then(Value::as_str).unwrap_or_default();
    let api_version = text("apiVersion");
    let kind_name = text("kind");
    let metadata = map.get("metadata");
    let name = metadata
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let invalid = |namespace: String, errors: Vec<FieldError>| {
        Decoded::Invalid(InvalidObject {
            kind: kind_name.to_string(),
            namespace,
            name: name.clone(),
            errors,
        })
    };
    if api_version.is_empty() || kind_name.is_empty() {
        let mut errors = Vec::new();
        for (field, v) in [("apiVersion", api_version), ("kind", kind_name)] {
            if v.is_empty() {
                errors.push(FieldError::new(
                    root.field(field),
                    format!("{field} is required (not a Kubernetes object)"),
                ));
            }
        }
        return invalid(String::new(), errors);
    }
    if is_secret(api_version, kind_name) {
        let mut errors = Vec::new();
        let meta = read_metadata(metadata, &mut errors);
        return match decode_secret(map) {
            Ok(content) if errors.is_empty() => Decoded::Secret(SecretObject {
                namespace: meta.namespace,
                name: meta.name,
                source: source.to_string(),
                content,
            }),
            Ok(_) => invalid(meta.namespace, errors),
            Err(more) => {
                errors.extend(more);
                invalid(meta.namespace, errors)
            }
        };
    }
    let group = api_version.split_once('/').map_or("", |(g, _)| g);
    let kind = match Kind::from_group_kind(group, kind_name) {
        Some(kind) => kind,
        _ => {
            return Decoded::Skipped(SkippedObject {
                api_version: api_version.to_string(),
                kind: kind_name.to_string(),
                namespace: metadata
                    .and_then(|m| m.get("namespace"))
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                name,
                labels: metadata
                    .and_then(|m| m.get("labels"))
                    .and_then(Value::as_object)
                    .map(|l| {
                        l.iter()
                            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                            .collect()
                    })
                    .unwrap_or_default(),
                data: map
                    .get("data")
                    .and_then(Value::as_object)
                    .map(|d| {
                        d.iter()
                            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                            .collect()
                    })
                    .unwrap_or_default(),
            });
        }
    };

    let mut errors = Vec::new();
    if !supported_api_version(kind, api_version) {
        errors.push(FieldError::new(
            root.field("apiVersion"),
            format!(
                "apiVersion {api_version} is not supported for {kind} (use {}/{})",
                kind.group(),
                kind.versions().join(", ")
            ),
        ));
    }
    let meta = read_metadata(metadata, &mut errors);
    let spec = match Spec::from_value(kind, map.get("spec").unwrap_or(&Value::Null)) {
        Ok(spec) => Some(spec),
        Err(e) => {
            errors.extend(e);
            None
        }
    };
    match spec {
        Some(spec) if errors.is_empty() => Decoded::Object(ConfigObject {
            kind,
            name: meta.name,
            namespace: meta.namespace,
            labels: meta.labels,
            annotations: meta.annotations,
            creation_time: meta.creation_time,
            resource_version: meta.resource_version,
            source: source.to_string(),
            spec,
            conditions: read_conditions(map.get("status")),
            status_addresses: read_status_addresses(map.get("status")),
        }),
        _ => invalid(meta.namespace, errors),
    }
}

/// `status.conditions`: entries without a `type` and times that do not parse are
/// left out (status is written by controllers, never by the user, so it is not
/// validated).
fn read_conditions(status: Option<&Value>) -> Vec<crate::config::model::Condition> {
    let Some(Value::Array(list)) = status.and_then(|s| s.get("conditions")) else {
        return Vec::new();
    };
    list.iter()
        .filter_map(|c| {
            let text = |f: &str| c.get(f).and_then(Value::as_str).unwrap_or_default();
            let time = |f: &str| {
                c.get(f)
                    .and_then(Value::as_str)
                    .and_then(|t| parse_rfc3339(t).ok())
            };
            (!text("type").is_empty()).then(|| crate::config::model::Condition {
                kind: text("type").to_string(),
                status: text("status").to_string(),
                reason: text("reason").to_string(),
                message: text("message").to_string(),
                last_probe_time: time("lastProbeTime"),
                last_transition_time: time("lastTransitionTime"),
            })
        })
        .collect()
}

/// `status.addresses` (a Gateway's): entries without a `value` are left out; the
/// type defaults to `IPAddress`, as in the Gateway API.
fn read_status_addresses(status: Option<&Value>) -> Vec<crate::config::model::StatusAddress> {
    let Some(Value::Array(list)) = status.and_then(|s| s.get("addresses")) else {
        return Vec::new();
    };
    list.iter()
        .filter_map(|a| {
            let value = a.get("value").and_then(Value::as_str).unwrap_or_default();
            (!value.is_empty()).then(|| crate::config::model::StatusAddress {
                kind: a
                    .get("type")
                    .and_then(Value::as_str)
                    .unwrap_or("IPAddress")
                    .to_string(),
                value: value.to_string(),
            })
        })
        .collect()
}

/// The metadata fields meshfed keeps.
struct Metadata {
    name: String,
    namespace: String,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    creation_time: SystemTime,
    resource_version: String,
}

fn read_metadata(metadata: Option<&Value>, errors: &mut Vec<FieldError>) -> Metadata {
    let at = FieldPath::root().field("metadata");
    let mut meta = Metadata {
        name: String::new(),
        namespace: "default".to_string(),
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
        creation_time: UNIX_EPOCH,
        resource_version: String::new(),
    };
    let map = match metadata {
        Some(Value::Object(map)) => map,
        None | Some(Value::Null) => {
            errors.push(FieldError::new(
                at.field("name"),
                "metadata.name is required",
            ));
            return meta;
        }
        Some(other) => {
            errors.push(FieldError::new(
                at,
                format!("metadata must be a mapping, found {}", describe(other)),
            ));
            return meta;
        }
    };
    let string = |field: &str, errors: &mut Vec<FieldError>| -> Option<String> {
        match map.get(field) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(other) => {
                errors.push(FieldError::new(
                    at.field(field),
                    format!("{field} must be a string, found {}", describe(other)),
                ));
                None
            }
        }
    };
    match string("name", errors) {
        Some(name) if !name.is_empty() => meta.name = name,
        _ => errors.push(FieldError::new(
            at.field("name"),
            "metadata.name is required",
        )),
    }
    if let Some(namespace) = string("namespace", errors).filter(|ns| !ns.is_empty()) {
        meta.namespace = namespace;
    }
    if let Some(version) = string("resourceVersion", errors) {
        meta.resource_version = version;
    }
    if let Some(created) = string("creationTimestamp", errors) {
        match parse_rfc3339(&created) {
            Ok(t) => meta.creation_time = t,
            Err(reason) => errors.push(FieldError::new(at.field("creationTimestamp"), reason)),
        }
    }
    meta.labels = string_map(map.get("labels"), &at.field("labels"), errors);
    meta.annotations = string_map(map.get("annotations"), &at.field("annotations"), errors);
    meta
}

/// A `map<string, string>` of metadata: every value must be a string (as in
/// Kubernetes; `version: 1` must be quoted).
fn string_map(
    value: Option<&Value>,
    at: &FieldPath,
    errors: &mut Vec<FieldError>,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    match value {
        None | Some(Value::Null) => {}
        Some(Value::Object(map)) => {
            for (k, v) in map {
                match v {
                    Value::String(s) => {
                        out.insert(k.clone(), s.clone());
                    }
                    other => errors.push(FieldError::new(
                        at.key(k),
                        format!(
                            "values must be strings, found {} (quote it: \"{}\")",
                            describe(other),
                            other
                        ),
                    )),
                }
            }
        }
        Some(other) => errors.push(FieldError::new(
            at.clone(),
            format!("must be a mapping of strings, found {}", describe(other)),
        )),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::model::{GROUP, VERSIONS};
    use crate::events::{ConfigKey, ConfigKind};
    use meshfed_api::networking::v1alpha3 as net;
    use serde_json::json;

    fn object(api_version: &str, kind: &str, spec: Value) -> Value {
        json!({
            "apiVersion": api_version,
            "kind": kind,
            "metadata": {"name": "x", "namespace": "ns"},
            "spec": spec,
        })
    }

    fn decoded(value: &Value) -> ConfigObject {
        match decode(value, "test") {
            Decoded::Object(obj) => obj,
            other => panic!("expected an object, got {other:?}"),
        }
    }

    fn invalid(value: &Value) -> InvalidObject {
        match decode(value, "test") {
            Decoded::Invalid(inv) => inv,
            other => panic!("expected an invalid object, got {other:?}"),
        }
    }

    #[test]
    fn every_kind_in_every_version() {
        let specs = [
            (
                "VirtualService",
                json!({"hosts": ["a"], "http": [{"route": [{"destination": {"host": "a"}}]}]}),
            ),
            (
                "DestinationRule",
                json!({"host": "a", "subsets": [{"name": "v1", "labels": {"v": "1"}}]}),
            ),
            (
                "Gateway",
                json!({"servers": [{"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["*"]}]}),
            ),
            (
                "ServiceEntry",
                json!({"hosts": ["a.example.com"], "resolution": "DNS"}),
            ),
            (
                "WorkloadEntry",
                json!({"address": "10.0.0.1", "ports": {"http": 8080}}),
            ),
            ("Sidecar", json!({"egress": [{"hosts": ["./*"]}]})),
        ];
        for version in VERSIONS {
            for (kind, spec) in &specs {
                let api_version = format!("{GROUP}/{version}");
                let obj = decoded(&object(&api_version, kind, spec.clone()));
                assert_eq!(obj.kind.as_str(), *kind);
                assert_eq!(obj.spec.kind(), obj.kind);
                assert_eq!((obj.namespace.as_str(), obj.name.as_str()), ("ns", "x"));
                assert_eq!(obj.source, "test");
            }
        }
        let vs = decoded(&object(
            "networking.istio.io/v1",
            "VirtualService",
            specs[0].1.clone(),
        ));
        assert_eq!(vs.spec.as_virtual_service().unwrap().hosts, ["a"]);
        let se = decoded(&object(
            "networking.istio.io/v1beta1",
            "ServiceEntry",
            specs[3].1.clone(),
        ));
        assert_eq!(
            se.spec.as_service_entry().unwrap().resolution(),
            net::service_entry::Resolution::Dns
        );
        assert_eq!(
            se.key(),
            ConfigKey::new(ConfigKind::ServiceEntry, "x", "ns")
        );
    }

    /// A Gateway API Gateway's `status.addresses` are kept (the type defaulting to
    /// `IPAddress`, entries without a value left out), count as content, and are
    /// written back.
    #[test]
    fn gateway_status_addresses_are_read_and_written_back() {
        let gateway = |status: Value| {
            json!({
                "apiVersion": "gateway.networking.k8s.io/v1",
                "kind": "Gateway",
                "metadata": {"name": "wp", "namespace": "ns"},
                "spec": {"gatewayClassName": "istio-waypoint", "listeners": [
                    {"name": "mesh", "port": 15008, "protocol": "HBONE"}]},
                "status": status,
            })
        };
        let pending = decoded(&gateway(json!({})));
        let ready = decoded(&gateway(json!({"addresses": [
            {"value": "10.0.0.1"},
            {"type": "Hostname", "value": "wp.ns.svc.cluster.local"},
            {"type": "Hostname"},
        ]})));
        assert!(pending.status_addresses.is_empty());
        assert_eq!(
            ready.status_addresses,
            vec![
                crate::config::StatusAddress {
                    kind: "IPAddress".into(),
                    value: "10.0.0.1".into()
                },
                crate::config::StatusAddress {
                    kind: "Hostname".into(),
                    value: "wp.ns.svc.cluster.local".into()
                },
            ]
        );
        assert!(!ready.same_content(&pending));
        let written = serde_json::to_value(&ready).unwrap();
        assert_eq!(
            written["status"]["addresses"],
            json!([
                {"type": "IPAddress", "value": "10.0.0.1"},
                {"type": "Hostname", "value": "wp.ns.svc.cluster.local"},
            ])
        );
        // Written as the Gateway API's `Gateway`, it reads back as the same object.
        assert_eq!(written["kind"], "Gateway");
        let again = decoded(&written);
        assert_eq!(again.kind, ready.kind);
        assert!(again.same_content(&ready));
    }

    #[test]
    fn camel_case_and_snake_case_both_work() {
        let camel = decoded(&object(
            "networking.istio.io/v1",
            "DestinationRule",
            json!({"host": "a", "trafficPolicy": {"connectionPool": {"tcp": {"maxConnections": 5, "connectTimeout": "250ms"}}}, "exportTo": ["."]}),
        ));
        let snake = decoded(&object(
            "networking.istio.io/v1",
            "DestinationRule",
            json!({"host": "a", "traffic_policy": {"connection_pool": {"tcp": {"max_connections": 5, "connect_timeout": "0.25s"}}}, "export_to": ["."]}),
        ));
        assert_eq!(camel.spec, snake.spec);
        let dr = camel.spec.as_destination_rule().unwrap();
        let tcp = dr
            .traffic_policy
            .as_ref()
            .unwrap()
            .connection_pool
            .unwrap()
            .tcp
            .unwrap();
        assert_eq!(tcp.max_connections, 5);
        assert_eq!(
            tcp.connect_timeout,
            Some(meshfed_api::Duration::from_millis(250))
        );
    }

    #[test]
    fn metadata_defaults_and_fields() {
        let obj = decoded(&json!({
            "apiVersion": "networking.istio.io/v1alpha3",
            "kind": "Gateway",
            "metadata": {
                "name": "gw",
                "labels": {"app": "gw"},
                "annotations": {"note": "x"},
                "creationTimestamp": "2024-05-01T12:00:00Z",
                "resourceVersion": "42",
                "uid": "ignored"
            },
            "spec": {"servers": []},
            "status": {"ignored": true}
        }));
        assert_eq!(obj.namespace, "default", "a missing namespace is default");
        assert_eq!(obj.labels["app"], "gw");
        assert_eq!(obj.annotations["note"], "x");
        assert_eq!(obj.resource_version, "42");
        assert_eq!(
            obj.creation_time
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_secs(),
            1_714_564_800
        );
        let no_time = decoded(&object("networking.istio.io/v1", "Sidecar", json!({})));
        assert_eq!(no_time.creation_time, UNIX_EPOCH);
        // A missing spec is the empty message (validation then says what is missing).
        let no_spec = decoded(
            &json!({"apiVersion": "networking.istio.io/v1", "kind": "Sidecar", "metadata": {"name": "s"}}),
        );
        assert_eq!(no_spec.spec, Spec::Sidecar(net::Sidecar::default()));
    }

    #[test]
    fn other_groups_and_kinds_are_skipped() {
        for (api_version, kind) in [
            ("apps/v1", "Deployment"),
            ("v1", "ConfigMap"),
            ("security.istio.io/v1", "VirtualService"),
            ("networking.istio.io/v1", "AuthorizationPolicy"),
            ("networking.istio.io/v1beta1", "ProxyConfig"),
            ("networking.k8s.io/v1", "Gateway"),
        ] {
            match decode(&object(api_version, kind, json!({})), "test") {
                Decoded::Skipped(s) => {
                    assert_eq!(
                        (s.api_version.as_str(), s.kind.as_str()),
                        (api_version, kind)
                    );
                    assert_eq!(s.name, "x");
                }
                other => panic!("{api_version} {kind}: expected skipped, got {other:?}"),
            }
        }
    }

    #[test]
    fn unreadable_objects_say_which_field() {
        let inv = invalid(&object(
            "networking.istio.io/v2",
            "VirtualService",
            json!({}),
        ));
        assert_eq!(inv.errors[0].field.to_string(), "apiVersion");
        assert!(
            inv.errors[0].reason.contains("not supported"),
            "{:?}",
            inv.errors
        );

        let inv = invalid(&object(
            "networking.istio.io/v1",
            "VirtualService",
            json!({"hosts": ["a"], "http": [{"timeout": "5q"}]}),
        ));
        assert_eq!(
            (inv.kind.as_str(), inv.namespace.as_str(), inv.name.as_str()),
            ("VirtualService", "ns", "x")
        );
        assert_eq!(inv.errors[0].field.to_string(), "spec.http[0].timeout");
        assert!(
            inv.errors[0].reason.contains("invalid duration"),
            "{}",
            inv.errors[0]
        );

        let inv = invalid(&object(
            "networking.istio.io/v1",
            "WorkloadEntry",
            json!({"address": "a", "weight": -1}),
        ));
        assert_eq!(inv.errors[0].field.to_string(), "spec.weight");
        assert!(
            inv.errors[0].reason.contains("invalid number -1"),
            "{}",
            inv.errors[0]
        );

        let inv = invalid(&object(
            "networking.istio.io/v1",
            "DestinationRule",
            json!({"host": "a", "trafficPolicy": {"loadBalancer": {"simple": "ROUND_ROBIN", "consistentHash": {"useSourceIp": true}}}}),
        ));
        assert_eq!(
            inv.errors[0].field.to_string(),
            "spec.trafficPolicy.loadBalancer"
        );
        assert!(
            inv.errors[0].reason.contains("one-of group"),
            "{}",
            inv.errors[0]
        );

        let inv = invalid(&object(
            "networking.istio.io/v1",
            "DestinationRule",
            json!({"host": "a", "trafficPolicy": {"loadBalancer": {"simple": "RR"}}}),
        ));
        assert_eq!(
            inv.errors[0].field.to_string(),
            "spec.trafficPolicy.loadBalancer.simple"
        );
        assert!(
            inv.errors[0].reason.contains("unknown variant `RR`"),
            "{}",
            inv.errors[0]
        );

        let inv = invalid(
            &json!({"apiVersion": "networking.istio.io/v1", "kind": "Gateway", "metadata": {"namespace": "ns", "labels": {"v": 1}}}),
        );
        let fields: Vec<String> = inv.errors.iter().map(|e| e.field.to_string()).collect();
        assert_eq!(fields, ["metadata.name", "metadata.labels[v]"]);

        let inv = invalid(
            &json!({"apiVersion": "networking.istio.io/v1", "kind": "Gateway", "metadata": {"name": "g", "creationTimestamp": "yesterday"}}),
        );
        assert_eq!(
            inv.errors[0].field.to_string(),
            "metadata.creationTimestamp"
        );

        let inv = invalid(&json!({"spec": {}}));
        assert_eq!(inv.errors.len(), 2, "apiVersion and kind are required");
        let inv = invalid(&json!(["a", "list"]));
        assert!(inv.errors[0].reason.contains("found a list"));
    }

    #[test]
    fn serializes_back_to_the_kubernetes_form() {
        let original = json!({
            "apiVersion": "networking.istio.io/v1alpha3",
            "kind": "ServiceEntry",
            "metadata": {"name": "ext", "namespace": "egress", "labels": {"a": "b"}, "creationTimestamp": "2024-05-01T12:00:00Z", "resourceVersion": "7"},
            "spec": {"hosts": ["api.example.com"], "ports": [{"number": 443, "name": "tls", "protocol": "TLS"}], "resolution": "DNS"}
        });
        let obj = decoded(&original);
        let out = serde_json::to_value(&obj).unwrap();
        assert_eq!(out["apiVersion"], "networking.istio.io/v1");
        assert_eq!(out["metadata"]["creationTimestamp"], "2024-05-01T12:00:00Z");
        assert_eq!(out["spec"]["resolution"], "DNS");
        let again = decoded(&out);
        assert_eq!(again, obj);
        let bare =
            serde_json::to_value(ConfigObject::new("ns", "s", net::Sidecar::default())).unwrap();
        assert_eq!(bare["metadata"], json!({"name": "s", "namespace": "ns"}));
    }
}
