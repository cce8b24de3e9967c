//! Which fields of a proto3-JSON document its message does not define.
//!
//! The generated serde impls skip unknown fields (as istiod reads MeshConfig), so a
//! typo or a field this crate does not model would vanish without a word. This walks
//! the document alongside the messages' descriptors (from [`crate::FILE_DESCRIPTOR_SET`])
//! and names every key no field answers to, by its path (`defaultConfig.tracing.x`,
//! `extensionProviders[1].zipkin.bad`, `labels[app]` for map keys), so that callers can
//! warn about each one.

use std::collections::HashMap;
use std::sync::LazyLock;

use pbjson_types::{DescriptorProto, FieldDescriptorProto, FileDescriptorSet};
use prost::Message;
use serde_json::Value;

/// Every message of the crate's descriptor set by its full name (`istio.mesh.v1alpha1.MeshConfig`).
static MESSAGES: LazyLock<HashMap<String, DescriptorProto>> = LazyLock::new(|| {
    let set =
        FileDescriptorSet::decode(crate::FILE_DESCRIPTOR_SET).expect("the descriptor set decodes");
    let mut out = HashMap::new();
    for file in set.file {
        let package = file.package.unwrap_or_default();
        for message in file.message_type {
            index(&package, message, &mut out);
        }
    }
    out
});

fn index(scope: &str, message: DescriptorProto, out: &mut HashMap<String, DescriptorProto>) {
    let name = format!("{scope}.{}", message.name.as_deref().unwrap_or_default());
    for nested in &message.nested_type {
        index(&name, nested.clone(), out);
    }
    out.insert(name, message);
}

/// The paths of the keys in `value` that message `full_name` (no leading dot) does
/// not define, at any depth, in key order. Values of well-known types
/// (`google.protobuf.*`: Struct, Any, wrappers, ...) are not looked into. An unknown
/// `full_name` gives nothing.
pub fn unknown_fields(full_name: &str, value: &Value) -> Vec<String> {
    fields(full_name, value, &[]).0
}

/// The paths of the unknown keys in `value` (as [`unknown_fields`]) and of the keys
/// that are fields listed in `listed` as `(message full name, field name)` (the
/// field's proto name, `warmup_duration_secs`): fields a caller wants named wherever
/// they are set (Istio fields it does not act on, say).
pub fn fields(
    full_name: &str,
    value: &Value,
    listed: &[(&str, &str)],
) -> (Vec<String>, Vec<String>) {
    let mut walk = Walk {
        listed,
        unknown: Vec::new(),
        found: Vec::new(),
    };
    if let Some(message) = MESSAGES.get(full_name) {
        walk.walk(full_name, message, value, "");
    }
    (walk.unknown, walk.found)
}

struct Walk<'a> {
    listed: &'a [(&'a str, &'a str)],
    unknown: Vec<String>,
    found: Vec<String>,
}

impl Walk<'_> {
    fn walk(&mut self, name: &str, message: &DescriptorProto, value: &Value, path: &str) {
        let Value::Object(fields) = value else {
            return;
        };
        for (key, v) in fields {
            let here = if path.is_empty() {
                key.clone()
            } else {
                format!("{path}.{key}")
            };
            let Some(field) = message
                .field
                .iter()
                .find(|f| f.json_name.as_deref() == Some(key) || f.name.as_deref() == Some(key))
            else {
                self.unknown.push(here);
                continue;
            };
            let field_name = field.name.as_deref().unwrap_or_default();
            if self
                .listed
                .iter()
                .any(|&(m, f)| m == name && f == field_name)
            {
                self.found.push(here.clone());
            }
            let Some((target_name, target)) = message_type(field) else {
                continue;
            };
            let repeated = field.label == Some(3);
            if let Some(entry_value) = map_value(target) {
                // A map: each entry's value is of the entry's value type.
                if let (Some((value_name, value_message)), Value::Object(entries)) =
                    (entry_value, v)
                {
                    for (k, item) in entries {
                        self.walk(value_name, value_message, item, &format!("{here}[{k}]"));
                    }
                }
            } else if repeated {
                if let Value::Array(items) = v {
                    for (i, item) in items.iter().enumerate() {
                        self.walk(target_name, target, item, &format!("{here}[{i}]"));
                    }
                }
            } else {
                self.walk(target_name, target, v, &here);
            }
        }
    }
}

/// The message a field holds (its full name and descriptor), unless it is a scalar,
/// an enum or a well-known type.
fn message_type(field: &FieldDescriptorProto) -> Option<(&'static str, &'static DescriptorProto)> {
    let name = field.type_name.as_deref()?.strip_prefix('.')?;
    if name.starts_with("google.protobuf.") {
        return None;
    }
    MESSAGES.get_key_value(name).map(|(k, v)| (k.as_str(), v))
}

/// For a map entry message: `Some(the value's message, if it is one)`.
fn map_value(entry: &DescriptorProto) -> Option<Option<(&'static str, &'static DescriptorProto)>> {
    if !entry
        .options
        .as_ref()
        .and_then(|o| o.map_entry)
        .unwrap_or(false)
    {
        return None;
    }
    let value = entry.field.iter().find(|f| f.number == Some(2))?;
    Some(message_type(value))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn names_every_undefined_key_with_its_path() {
        let doc = json!({
            "rootNamespace": "istio-system",
            "enable_auto_mtls": true,
            "enablePrometheusMerj": true,
            "defaultConfig": {
                "tracing": {"sampling": 10, "customTags": {"a": {"literal": {"value": "x", "colour": 1}}}},
                "discoveryAddress": "istiod:15012"
            },
            "extensionProviders": [
                {"name": "ok", "zipkin": {"service": "z", "port": 9411}},
                {"name": "bad", "zipkin": {"service": "z", "port": 9411, "traceContextOption": "USE_B3"}}
            ],
            "meshNetworks": {}
        });
        assert_eq!(
            unknown_fields("istio.mesh.v1alpha1.MeshConfig", &doc),
            vec![
                "defaultConfig.discoveryAddress",
                "defaultConfig.tracing.customTags[a].literal.colour",
                "enablePrometheusMerj",
                "extensionProviders[1].zipkin.traceContextOption",
                "meshNetworks",
            ]
        );
    }

    #[test]
    fn known_documents_and_unknown_messages_give_nothing() {
        let doc = json!({"host": "a", "trafficPolicy": {"tls": {"mode": "ISTIO_MUTUAL"}},
                         "subsets": [{"name": "v1", "labels": {"version": "v1"}}]});
        assert!(unknown_fields("istio.networking.v1alpha3.DestinationRule", &doc).is_empty());
        assert!(unknown_fields("no.such.Message", &doc).is_empty());
        let typo = json!({"host": "a", "trafficPolcy": {}});
        assert_eq!(
            unknown_fields("istio.networking.v1alpha3.DestinationRule", &typo),
            vec!["trafficPolcy"]
        );
    }
}

#[cfg(test)]
mod listed_tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn listed_fields_are_named_wherever_they_are_set() {
        let doc = json!({"host": "a", "trafficPolicy": {"loadBalancer": {"warmup": {}}, "portLevelSettings": [
            {"port": {"number": 80}, "loadBalancer": {"warmup": {"duration": "1s"}}}]}, "bad": 1});
        let (unknown, found) = fields(
            "istio.networking.v1alpha3.DestinationRule",
            &doc,
            &[("istio.networking.v1alpha3.LoadBalancerSettings", "warmup")],
        );
        assert_eq!(unknown, ["bad"]);
        assert_eq!(
            found,
            [
                "trafficPolicy.loadBalancer.warmup",
                "trafficPolicy.portLevelSettings[0].loadBalancer.warmup"
            ]
        );
    }
}
