//! Validation of config objects, after Istio's `pkg/config/validation`.
//!
//! [`validate`] checks one [`ConfigObject`]: its metadata and its spec, with the rules of
//! its kind (the validator its declaration in [`crate::config::kinds`] names; one
//! submodule per kind or family of kinds). The answer is either the list of warnings (the
//! object is usable) or the list of every error found, each naming the field
//! ([`FieldPath`], e.g. `spec.http[0].route[1].weight`) and the reason. Warnings are
//! Istio's warnings: legal but probably not what was meant (a deprecated field, a
//! duplicate host), never a reason to reject.
//!
//! Where Istio's rules and this module differ, the module doc of the kind says so.

mod common;
mod http_route;
mod mesh;
mod references;
pub mod regex;
// The per-kind validators: each kind's declaration (`crate::config::kinds`) names its
// validator by path.
pub(crate) mod destination_rule;
pub(crate) mod gateway;
pub(crate) mod security;
pub(crate) mod service_entry;
pub(crate) mod sidecar;
pub(crate) mod virtual_service;

use std::fmt;

use serde::Serialize;

use crate::config::model::{ConfigObject, Kind, Spec};

pub use destination_rule::validate_destination_rule;
pub use gateway::validate_gateway;
pub use http_route::{GRPC_STATUSES, grpc_status_code, jwt_routing_claim};
pub use mesh::{
    ext_authz_status, validate_extension_providers, validate_mesh_config, validate_mesh_networks,
};
pub(crate) use references::cross_object_warnings;
pub use security::{
    validate_authorization_policy, validate_peer_authentication, validate_request_authentication,
};
pub use service_entry::{validate_service_entry, validate_workload_entry};
pub use sidecar::validate_sidecar;
pub use virtual_service::validate_virtual_service;

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

/// Validates a config object: metadata (name, namespace, labels) and the spec with the
/// rules of its kind.
pub fn validate(obj: &ConfigObject) -> Validation {
    let mut findings = Findings::new();
    validate_metadata(obj, &mut findings);
    if obj.kind != obj.spec.kind() {
        findings.error(
            &FieldPath::root().field("kind"),
            format!(
                "kind {} does not match the spec, which is a {}",
                obj.kind,
                obj.spec.kind()
            ),
        );
    }
    let spec = obj.spec.validate_spec(&obj.namespace);
    match spec {
        Ok(warnings) => findings.warnings.extend(warnings),
        Err(errors) => findings.errors.extend(errors),
    }
    if let Some(gap) = not_enforced(obj) {
        findings.warn(&FieldPath::spec(), gap);
    }
    findings.finish()
}

/// What meshfed does not apply yet of a valid object, said where the user looks
/// (`meshfed validate`, the store's warnings); `None` when it is applied. Without
/// the mesh config, see [`not_enforced_in`].
pub fn not_enforced(obj: &ConfigObject) -> Option<String> {
    not_enforced_in(obj, None)
}

/// [`not_enforced`], knowing the mesh config: a CUSTOM AuthorizationPolicy whose
/// provider is not an ext_authz extension provider of it is said to deny instead.
pub fn not_enforced_in(
    obj: &ConfigObject,
    mesh: Option<&meshfed_api::mesh::v1alpha1::MeshConfig>,
) -> Option<String> {
    use meshfed_api::mesh::v1alpha1::mesh_config::extension_provider::Provider;
    use meshfed_api::security::v1beta1::authorization_policy::{Action, ActionDetail};
    match &obj.spec {
        Spec::RequestAuthentication(ra)
            if ra.target_ref.is_some() || !ra.target_refs.is_empty() =>
        {
            Some(
                "RequestAuthentication with targetRef(s) is not enforced by meshfed yet: \
                 Gateway API gateways get no JWT filter from it"
                    .into(),
            )
        }
        Spec::RequestAuthentication(_) => Some(
            "RequestAuthentication is enforced on sidecars' inbound HTTP chains and on \
             gateways: proxyless gRPC servers do not validate its tokens (nor do they in \
             Istio)"
                .into(),
        ),
        Spec::AuthorizationPolicy(ap) if ap.target_ref.is_some() || !ap.target_refs.is_empty() => {
            Some(
                "AuthorizationPolicy with targetRef(s) is not enforced by meshfed: it attaches \
                 to Gateway API gateways, which meshfed does not serve (sidecars and Istio \
                 gateways take selector policies only, as in Istio)"
                    .into(),
            )
        }
        Spec::AuthorizationPolicy(ap) => {
            let provider = match &ap.action_detail {
                Some(ActionDetail::Provider(p)) => p.name.as_str(),
                None => "",
            };
            let ext_authz = |p: &meshfed_api::mesh::v1alpha1::mesh_config::ExtensionProvider| {
                p.name == provider
                    && matches!(
                        p.provider,
                        Some(Provider::EnvoyExtAuthzHttp(_) | Provider::EnvoyExtAuthzGrpc(_))
                    )
            };
            match (ap.action(), mesh) {
                (Action::Custom, Some(mesh)) if !mesh.extension_providers.iter().any(ext_authz) => {
                    Some(format!(
                        "AuthorizationPolicy with action CUSTOM names provider {provider:?}, \
                         which is not an ext_authz extension provider of the mesh config \
                         (envoyExtAuthzHttp or envoyExtAuthzGrpc): its rules deny the requests \
                         they match instead"
                    ))
                }
                (Action::Custom, _) => Some(
                    "AuthorizationPolicy with action CUSTOM is enforced on sidecars and \
                     gateways: proxyless gRPC servers have no ext_authz and do not apply it"
                        .into(),
                ),
                (Action::Audit, _) => Some(
                    "AuthorizationPolicy with action AUDIT is enforced on sidecars and \
                     gateways: proxyless gRPC servers have no audit action"
                        .into(),
                ),
                _ => None,
            }
        }
        _ => None,
    }
}

fn validate_metadata(obj: &ConfigObject, findings: &mut Findings) {
    let metadata = FieldPath::root().field("metadata");
    let name = metadata.field("name");
    if obj.name.is_empty() {
        findings.error(&name, "name is required");
    } else if !common::is_dns1123_subdomain(&obj.name) {
        findings.error(
            &name,
            format!(
                "{:?} is not a valid name (lower case letters, digits, '-' and '.', starting and ending with \
                 a letter or digit, at most 253 characters)",
                obj.name
            ),
        );
    } else if obj.kind == Kind::Gateway && !common::is_dns1123_label(&obj.name) {
        // Istio: a Gateway name is referenced as `namespace/name`, so no dots.
        findings.error(
            &name,
            format!(
                "invalid gateway name {:?}: must be a DNS label (no dots)",
                obj.name
            ),
        );
    }
    let namespace = metadata.field("namespace");
    if !common::is_dns1123_label(&obj.namespace)
        || obj.namespace.bytes().any(|b| b.is_ascii_uppercase())
    {
        findings.error(
            &namespace,
            format!(
                "{:?} is not a valid namespace (a lower case DNS label: letters, digits and '-', at most 63 characters)",
                obj.namespace
            ),
        );
    }
    common::validate_labels(findings, &metadata.field("labels"), &obj.labels);
    for key in obj.annotations.keys() {
        if let Err(reason) = common::validate_label_key(key) {
            findings.error(&metadata.field("annotations").key(key), reason);
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
    use super::test_support::*;
    use super::*;
    use meshfed_api::networking::v1alpha3 as net;

    fn gateway(name: &str, namespace: &str) -> ConfigObject {
        let gw: net::Gateway =
            spec("servers: [{port: {number: 80, name: http, protocol: HTTP}, hosts: ['*']}]");
        ConfigObject::new(namespace, name, gw)
    }

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

    #[test]
    fn metadata_is_checked() {
        assert_ok(&validate(&gateway("public", "istio-system")));
        assert_error(
            &validate(&gateway("", "default")),
            "metadata.name",
            "required",
        );
        assert_error(
            &validate(&gateway("Public_GW", "default")),
            "metadata.name",
            "not a valid name",
        );
        assert_error(
            &validate(&gateway("gw.v1", "default")),
            "metadata.name",
            "invalid gateway name",
        );
        assert_error(
            &validate(&gateway("gw", "Default")),
            "metadata.namespace",
            "not a valid namespace",
        );
        let mut labelled = gateway("gw", "default");
        labelled.labels.insert("app".into(), "bad value!".into());
        assert_error(
            &validate(&labelled),
            "metadata.labels[app]",
            "invalid label value",
        );
    }

    #[test]
    fn kind_must_match_the_spec() {
        let mut obj = gateway("gw", "default");
        obj.kind = Kind::Sidecar;
        assert_error(&validate(&obj), "kind", "does not match");
    }
}
