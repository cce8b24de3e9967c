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
    let mut out = Vec::new();
    if let Some(message) = MESSAGES.get(full_name) {
        walk(message, value, "", &mut out);
    }
    out
}

fn walk(message: &DescriptorProto, value: &Value, path: &str, out: &mut Vec<String>) {
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
            out.push(here);
            continue;
        };
        let Some(target) = message_type(field) else {
            continue;
        };
        let repeated = field.label == Some(3);
        if let Some(entry_value) = map_value(target) {
            // A map: each entry's value is of the entry's value type.
            if let (Some(value_message), Value::Object(entries)) = (entry_value, v) {
                for (k, item) in entries {
                    walk(value_message, item, &format!("{here}[{k}]"), out);
                }
            }
        } else if repeated {
            if let Value::Array(items) = v {
                for (i, item) in items.iter().enumerate() {
                    walk(target, item, &format!("{here}[{i}]"), out);
                }
            }
        } else {
            walk(target, v, &here, out);
        }
    }
}

/// The message a field holds, unless it is a scalar, an enum or a well-known type.
fn message_type(field: &FieldDescriptorProto) -> Option<&'static DescriptorProto> {
    let name = field.type_name.as_deref()?.strip_prefix('.')?;
    if name.starts_with("google.protobuf.") {
        return None;
    }
    MESSAGES.get(name)
}

/// For a map entry message: `Some(the value's message, if it is one)`.
fn map_value(entry: &DescriptorProto) -> Option<Option<&'static DescriptorProto>> {
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
