//! Building [`Inputs`] from Kubernetes-style documents: Istio config objects (decoded
//! and validated as everywhere else, strictly), and the Services, Pods and Namespaces
//! the analyzers look at. Documents come from files (multi-document YAML, JSON,
//! `kind: List`, directories walked like `--configDir`) or from a cluster listing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{Inputs, ObjectRef, Pod, Service, ServicePort};
use crate::config::spec_json::path_from;
use crate::config::{Decoded, Kind, Segment, decode, validate};

/// One document and where it was read (`path:line`, empty for a cluster).
#[derive(Clone, Debug)]
pub struct Document {
    pub value: Value,
    pub source: String,
}

/// Collects documents into [`Inputs`].
#[derive(Debug)]
pub struct InputBuilder {
    inputs: Inputs,
    /// The namespace of objects that do not name one (istioctl's `-n`, `default`).
    default_namespace: String,
}

impl InputBuilder {
    /// A builder whose objects without a namespace are in `default_namespace`.
    pub fn new(default_namespace: &str) -> InputBuilder {
        InputBuilder {
            inputs: Inputs::new(),
            default_namespace: default_namespace.to_string(),
        }
    }

    /// Sets the mesh's root namespace (default `istio-system`).
    pub fn root_namespace(mut self, ns: &str) -> InputBuilder {
        self.inputs.root_namespace = ns.to_string();
        self
    }

    /// Adds one document (a `kind: List` adds its items).
    pub fn add(&mut self, doc: Document) {
        let Document { mut value, source } = doc;
        if value.get("kind").and_then(Value::as_str) == Some("List") {
            if let Some(Value::Array(items)) = value.get_mut("items").map(Value::take) {
                for item in items {
                    self.add(Document {
                        value: item,
                        source: source.clone(),
                    });
                }
            }
            return;
        }
        let text = |v: &Value, f: &str| {
            v.get(f)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let api_version = text(&value, "apiVersion");
        let kind = text(&value, "kind");
        // A namespaced object without a namespace is in the default namespace.
        if kind != "Namespace"
            && let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut)
            && meta
                .get("namespace")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .is_empty()
        {
            meta.insert(
                "namespace".into(),
                Value::String(self.default_namespace.clone()),
            );
        }
        let meta = value.get("metadata").cloned().unwrap_or(Value::Null);
        let object = ObjectRef {
            kind: kind.clone(),
            namespace: if kind == "Namespace" {
                String::new()
            } else {
                text(&meta, "namespace")
            },
            name: text(&meta, "name"),
            source: source.clone(),
        };
        let labels = string_map(meta.get("labels"));
        if api_version == "v1" {
            match kind.as_str() {
                "Namespace" => {
                    self.inputs.namespaces.push(object.name);
                    return;
                }
                "Pod" => {
                    self.inputs.pods.push(Pod { object, labels });
                    return;
                }
                "Service" => {
                    self.inputs
                        .services
                        .push(service(object, &meta, value.get("spec")));
                    return;
                }
                _ => {}
            }
        }
        match decode(&value, &source) {
            Decoded::Object(obj) => match validate(&obj) {
                Ok(warnings) => self.inputs.configs.push((obj, warnings)),
                Err(errors) => {
                    self.inputs.invalid.push((object, errors));
                    self.inputs.configs.push((obj, Vec::new()));
                }
            },
            Decoded::Invalid(bad) => {
                // Analyzed as the API server would keep it (unknown fields pruned), so
                // that a typo does not hide the object from the other analyzers.
                if let Some(Decoded::Object(obj)) = pruned(&value).map(|v| decode(&v, &source)) {
                    self.inputs.configs.push((obj, Vec::new()));
                }
                self.inputs.invalid.push((object, bad.errors));
            }
            Decoded::Skipped(_) | Decoded::Secret(_) => {}
        }
    }

    /// The inputs.
    pub fn finish(mut self) -> Inputs {
        self.inputs.namespaces.sort();
        self.inputs.namespaces.dedup();
        self.inputs
    }
}

/// `value` without the spec fields its kind does not define, when it had some.
fn pruned(value: &Value) -> Option<Value> {
    let kind = Kind::from_name(value.get("kind")?.as_str()?)?;
    let mut value = value.clone();
    let spec = value.get_mut("spec")?;
    let unknown = meshfed_api::unknown_fields::unknown_fields(&kind.message_name(), spec);
    if unknown.is_empty() {
        return None;
    }
    for path in unknown {
        let segments = path_from(&path);
        let Some((last, parents)) = segments.segments().split_last() else {
            continue;
        };
        let pointer: String = parents
            .iter()
            .map(|segment| match segment {
                Segment::Field(k) | Segment::Key(k) => {
                    format!("/{}", k.replace('~', "~0").replace('/', "~1"))
                }
                Segment::Index(i) => format!("/{i}"),
            })
            .collect();
        if let (Segment::Field(k) | Segment::Key(k), Some(map)) = (
            last,
            spec.pointer_mut(&pointer).and_then(Value::as_object_mut),
        ) {
            map.remove(k);
        }
    }
    Some(value)
}

fn string_map(v: Option<&Value>) -> BTreeMap<String, String> {
    v.and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| {
                    (
                        k.clone(),
                        v.as_str().map_or_else(|| v.to_string(), str::to_string),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn service(object: ObjectRef, meta: &Value, spec: Option<&Value>) -> Service {
    let spec = spec.cloned().unwrap_or(Value::Null);
    let ports = spec
        .get("ports")
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .map(|p| ServicePort {
                    name: p
                        .get("name")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string(),
                    port: p.get("port").and_then(Value::as_u64).unwrap_or_default() as u32,
                    protocol: p
                        .get("protocol")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string(),
                    app_protocol: p
                        .get("appProtocol")
                        .and_then(Value::as_str)
                        .map(str::to_string),
                    target_port: match p.get("targetPort") {
                        Some(Value::String(s)) => s.clone(),
                        Some(Value::Number(n)) => n.to_string(),
                        _ => String::new(),
                    },
                })
                .collect()
        })
        .unwrap_or_default();
    let export_to = string_map(meta.get("annotations"))
        .get("networking.istio.io/exportTo")
        .map(|a| {
            a.split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect()
        })
        .unwrap_or_default();
    Service {
        object,
        service_type: spec
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        selector: spec.get("selector").map(|s| string_map(Some(s))),
        ports,
        export_to,
    }
}

/// Splits a file's text into documents with their first line: JSON for `.json`,
/// multi-document YAML otherwise. A document that does not parse is an error
/// naming the file and line.
pub fn documents(path: &Path, text: &str) -> Result<Vec<Document>, String> {
    let shown = path.display();
    if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"))
    {
        let value: Value = serde_json::from_str(text).map_err(|e| format!("{shown}: {e}"))?;
        return Ok(vec![Document {
            value,
            source: format!("{shown}:1"),
        }]);
    }
    let mut out = Vec::new();
    for (line, parsed) in crate::config::source::yaml_documents(text) {
        let value = parsed.map_err(|e| format!("{shown}:{}: {}", e.line, e.message))?;
        if !value.is_null() {
            out.push(Document {
                value,
                source: format!("{shown}:{line}"),
            });
        }
    }
    Ok(out)
}

/// The documents of files and directories (walked recursively like `--configDir`).
pub fn read_paths(paths: &[PathBuf]) -> Result<Vec<Document>, String> {
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            files.extend(
                crate::config::source::config_files(path)
                    .map_err(|e| format!("{}: {e}", path.display()))?,
            );
        } else {
            files.push(path.clone());
        }
    }
    let mut out = Vec::new();
    for file in files {
        let text =
            std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        out.extend(documents(&file, &text)?);
    }
    Ok(out)
}
