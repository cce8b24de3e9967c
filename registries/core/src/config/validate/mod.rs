//! Validation of config specs, after Istio's `pkg/config/validation`.
//!
//! One submodule per kind or family of kinds holds the rules of its spec (the validator
//! its declaration in [`crate::config::kinds`] names); this module holds the vocabulary
//! they report in. The answer is either the list of warnings (the spec is usable) or the
//! list of every error found, each naming the field ([`FieldPath`], e.g.
//! `spec.http[0].route[1].weight`) and the reason. Warnings are Istio's warnings: legal
//! but probably not what was meant (a deprecated field, a duplicate host), never a reason
//! to reject. Whole objects (metadata and spec) are checked by
//! [`crate::config::validation`], which reads config objects; nothing here does.
//!
//! Where Istio's rules and this module differ, the module doc of the kind says so.

pub(crate) mod common;
pub mod config_sources;
mod http_route;
mod mesh;
pub mod regex;
mod route_common;
// The per-kind validators: each kind's declaration (`crate::config::kinds`) names its
// validator by path.
pub(crate) mod destination_rule;
pub mod envoy_filter;
pub(crate) mod gateway;
pub(crate) mod security;
pub(crate) mod service_entry;
pub(crate) mod sidecar;
pub(crate) mod telemetry;
pub(crate) mod virtual_service;
pub(crate) mod wasm_plugin;

use std::fmt;

use serde::Serialize;

pub use destination_rule::validate_destination_rule;
pub use envoy_filter::validate_envoy_filter;
pub use gateway::validate_gateway;
pub use http_route::{GRPC_STATUSES, grpc_status_code, jwt_routing_claim};
pub use mesh::{
    ext_authz_status, validate_extension_providers, validate_mesh_config, validate_mesh_networks,
};
pub use security::{
    validate_authorization_policy, validate_peer_authentication, validate_request_authentication,
};
pub use service_entry::{validate_service_entry, validate_workload_entry};
pub use sidecar::validate_sidecar;
pub use telemetry::{BUILTIN_PROVIDERS, unknown_providers, validate_telemetry};
pub use virtual_service::validate_virtual_service;
pub use wasm_plugin::validate_wasm_plugin;

/// The outcome of a validation: warnings when the object may be used, every error
/// otherwise.
pub type Validation = Result<Vec<Warning>, Vec<FieldError>>;

/// One step of a [`FieldPath`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Segment {
    /// A field of a message (camelCase, as written in YAML): `.http`.
    Field(String),
    /// An element of a list: `[0]`.
    Index(usize),
    /// An entry of a map (labels, headers, ports): `[app]`.
    Key(String),
}

/// Where in an object a problem is: `spec.http[0].route[1].weight`,
/// `metadata.labels[app]`. Field names are the camelCase names of the YAML form.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct FieldPath(Vec<Segment>);

impl FieldPath {
    /// The empty path (the object itself).
    pub fn root() -> FieldPath {
        FieldPath(Vec::new())
    }

    /// `spec`, where every spec rule starts.
    pub fn spec() -> FieldPath {
        FieldPath::root().field("spec")
    }

    /// This path followed by a field.
    pub fn field(&self, name: &str) -> FieldPath {
        self.with(Segment::Field(name.to_string()))
    }

    /// This path followed by a list index.
    pub fn index(&self, i: usize) -> FieldPath {
        self.with(Segment::Index(i))
    }

    /// This path followed by a map key.
    pub fn key(&self, k: &str) -> FieldPath {
        self.with(Segment::Key(k.to_string()))
    }

    /// The steps of the path.
    pub fn segments(&self) -> &[Segment] {
        &self.0
    }

    /// True for the empty path.
    pub fn is_root(&self) -> bool {
        self.0.is_empty()
    }

    pub(crate) fn from_segments(segments: Vec<Segment>) -> FieldPath {
        FieldPath(segments)
    }

    /// This path followed by every step of `more`.
    pub fn join(&self, more: &FieldPath) -> FieldPath {
        let mut segments = self.0.clone();
        segments.extend_from_slice(&more.0);
        FieldPath(segments)
    }

    fn with(&self, segment: Segment) -> FieldPath {
        let mut segments = Vec::with_capacity(self.0.len() + 1);
        segments.extend_from_slice(&self.0);
        segments.push(segment);
        FieldPath(segments)
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, segment) in self.0.iter().enumerate() {
            match segment {
                Segment::Field(name) if i == 0 => f.write_str(name)?,
                Segment::Field(name) => write!(f, ".{name}")?,
                Segment::Index(n) => write!(f, "[{n}]")?,
                Segment::Key(k) => write!(f, "[{k}]")?,
            }
        }
        Ok(())
    }
}

impl Serialize for FieldPath {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// A reason to reject an object: which field and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FieldError {
    /// The field at fault (the nearest enclosing one when a field is missing).
    pub field: FieldPath,
    /// Why, in words an operator can act on.
    pub reason: String,
}

impl FieldError {
    /// Builds an error.
    pub fn new(field: FieldPath, reason: impl Into<String>) -> FieldError {
        FieldError {
            field,
            reason: reason.into(),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_root() {
            f.write_str(&self.reason)
        } else {
            write!(f, "{}: {}", self.field, self.reason)
        }
    }
}

/// Something legal but probably unintended; the object is still used.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Warning {
    /// The field concerned.
    pub field: FieldPath,
    /// What looks wrong.
    pub message: String,
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_root() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.field, self.message)
        }
    }
}

/// Collects the findings of one validation run.
#[derive(Debug, Default)]
pub(crate) struct Findings {
    errors: Vec<FieldError>,
    warnings: Vec<Warning>,
}

impl Findings {
    pub(crate) fn new() -> Findings {
        Findings::default()
    }

    /// Records an error at `at`.
    pub(crate) fn error(&mut self, at: &FieldPath, reason: impl Into<String>) {
        self.errors.push(FieldError::new(at.clone(), reason));
    }

    /// Records a warning at `at`.
    pub(crate) fn warn(&mut self, at: &FieldPath, message: impl Into<String>) {
        self.warnings.push(Warning {
            field: at.clone(),
            message: message.into(),
        });
    }

    /// Records `check`'s error, if any, at `at`.
    pub(crate) fn check(&mut self, at: &FieldPath, check: Result<(), String>) {
        if let Err(reason) = check {
            self.error(at, reason);
        }
    }

    /// Records the findings of another validation run (a spec's, say).
    pub(crate) fn absorb(&mut self, result: Validation) {
        match result {
            Ok(warnings) => self.warnings.extend(warnings),
            Err(errors) => self.errors.extend(errors),
        }
    }

    /// The errors recorded so far, taken out.
    pub(crate) fn into_errors(self) -> Vec<FieldError> {
        self.errors
    }

    pub(crate) fn finish(self) -> Validation {
        if self.errors.is_empty() {
            Ok(self.warnings)
        } else {
            Err(self.errors)
        }
    }
}

#[cfg(test)]
pub(crate) mod test_support {
    //! Helpers for the per-kind tests: build a spec from YAML and assert on findings.

    use super::*;

    /// Parses a spec from YAML (as it would appear under `spec:`).
    pub(crate) fn spec<T: serde::de::DeserializeOwned>(yaml: &str) -> T {
        let value: serde_json::Value = serde_norway::from_str(yaml).expect("test YAML");
        serde_json::from_value(value).unwrap_or_else(|e| panic!("test spec should parse: {e}"))
    }

    /// Asserts that validation fails with an error at `field` whose reason contains
    /// `reason`.
    #[track_caller]
    pub(crate) fn assert_error(result: &Validation, field: &str, reason: &str) {
        match result {
            Ok(warnings) => panic!("expected an error at {field} ({reason}), got Ok({warnings:?})"),
            Err(errors) => {
                assert!(
                    errors
                        .iter()
                        .any(|e| e.field.to_string() == field && e.reason.contains(reason)),
                    "expected an error at {field} containing {reason:?}; got:\n{}",
                    errors
                        .iter()
                        .map(|e| format!("  {e}"))
                        .collect::<Vec<_>>()
                        .join("\n")
                );
            }
        }
    }

    /// Asserts that validation passes; returns the warnings.
    #[track_caller]
    pub(crate) fn assert_ok(result: &Validation) -> Vec<Warning> {
        match result {
            Ok(w) => w.clone(),
            Err(errors) => panic!(
                "expected no errors, got:\n{}",
                errors
                    .iter()
                    .map(|e| format!("  {e}"))
                    .collect::<Vec<_>>()
                    .join("\n")
            ),
        }
    }

    /// Asserts a warning at `field` containing `message`.
    #[track_caller]
    pub(crate) fn assert_warning(result: &Validation, field: &str, message: &str) {
        let warnings = match result {
            Ok(w) => w,
            Err(errors) => panic!("expected a warning, got errors {errors:?}"),
        };
        assert!(
            warnings
                .iter()
                .any(|w| w.field.to_string() == field && w.message.contains(message)),
            "expected a warning at {field} containing {message:?}; got {warnings:?}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_paths_render_like_kubernetes() {
        let p = FieldPath::spec()
            .field("http")
            .index(0)
            .field("route")
            .index(1)
            .field("weight");
        assert_eq!(p.to_string(), "spec.http[0].route[1].weight");
        let labels = FieldPath::root()
            .field("metadata")
            .field("labels")
            .key("app");
        assert_eq!(labels.to_string(), "metadata.labels[app]");
        assert_eq!(FieldPath::root().to_string(), "");
    }
}
