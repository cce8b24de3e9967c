//! One AdmissionReview in, one out: istiod's validation server
//! (`pkg/webhooks/validation/server`) over meshfed's checks, with no IO.
//!
//! The object of a CREATE or UPDATE is checked exactly as `meshfed validate` checks a
//! file ([`meshfed_registry::config::validate_value`]: decoding, object and spec rules,
//! warnings); what istiod adds around it is kept: other operations are allowed,
//! unknown kinds are denied as unrecognized, top-level fields other than `apiVersion`,
//! `kind`, `metadata`, `spec` and `status` are denied, and the answer echoes the
//! review's `apiVersion`, `kind` and `request.uid`.

use std::path::Path;

use meshfed_registry::config::{Decoded, Diagnostic, Kind, decode, validate_value};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// istiod's limit on a request body (`kube.MaxRequestBodyBytes`, 6 MiB).
pub const MAX_BODY_BYTES: usize = 6 * 1024 * 1024;

/// Kinds istiod validates that meshfed does not read: allowed with a warning (istiod
/// would check them; meshfed ignores them, so it cannot).
const ISTIO_KINDS_NOT_READ: &[(&str, &str)] = &[("networking.istio.io", "ProxyConfig")];

/// Why a review was not passed (the `reason` label of `galley_validation_failed`,
/// istiod's values).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailReason {
    /// Not CREATE or UPDATE (allowed all the same).
    UnsupportedOperation,
    /// The object is not a JSON object.
    YamlDecodeError,
    /// No kind of that group meshfed or istiod knows.
    UnknownType,
    /// The object does not decode as its kind (wrong types, unknown version, ...).
    CrdConversionError,
    /// Validation errors, or an unknown top-level field.
    InvalidResource,
}

impl FailReason {
    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            FailReason::UnsupportedOperation => "unsupported_operation",
            FailReason::YamlDecodeError => "yaml_decode_error",
            FailReason::UnknownType => "unknown_type",
            FailReason::CrdConversionError => "crd_conversion_error",
            FailReason::InvalidResource => "invalid_resource",
        }
    }
}

/// `group`, `version`, `kind` (or `resource`) of the request.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct GroupVersion {
    /// The API group (`networking.istio.io`).
    #[serde(default)]
    pub group: String,
    /// The version (`v1`).
    #[serde(default)]
    pub version: String,
    /// The resource (`virtualservices`) or, read from `kind`, the kind.
    #[serde(default, alias = "kind")]
    pub resource: String,
}

/// The fields of an `AdmissionRequest` the webhook reads (the rest is ignored).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest {
    /// The request's id, echoed in the response.
    #[serde(default)]
    pub uid: String,
    /// The object's kind (`{group, version, kind}`).
    #[serde(default)]
    pub kind: GroupVersion,
    /// The resource (`{group, version, resource}`): the metrics' labels.
    #[serde(default)]
    pub resource: GroupVersion,
    /// The object's name.
    #[serde(default)]
    pub name: String,
    /// The object's namespace.
    #[serde(default)]
    pub namespace: String,
    /// `CREATE`, `UPDATE`, `DELETE` or `CONNECT`.
    #[serde(default)]
    pub operation: String,
    /// The object as it would be stored (absent for DELETE).
    #[serde(default)]
    pub object: Option<Value>,
    /// Whether nothing will be stored (`kubectl apply --dry-run=server`).
    #[serde(default)]
    pub dry_run: Option<bool>,
}

#[derive(Debug, Deserialize)]
struct IncomingReview {
    #[serde(default, rename = "apiVersion")]
    api_version: String,
    #[serde(default)]
    kind: String,
    request: Option<AdmissionRequest>,
}

/// `metav1.Status` as istiod fills it: a message only (`metadata` is always written by
/// Go's encoder).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Status {
    /// Always empty.
    pub metadata: serde_json::Map<String, Value>,
    /// Why the object was denied.
    pub message: String,
}

/// `AdmissionResponse` in Kubernetes' field order; empty fields left out as Go does.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct AdmissionResponse {
    /// The request's `uid`.
    pub uid: String,
    /// Whether the API server may go on.
    pub allowed: bool,
    /// Why not, on a denial.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    /// What the user should know of an allowed object.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

impl AdmissionResponse {
    fn allow(warnings: Vec<String>) -> Self {
        AdmissionResponse {
            uid: String::new(),
            allowed: true,
            status: None,
            warnings,
        }
    }

    fn deny(message: impl Into<String>) -> Self {
        AdmissionResponse {
            uid: String::new(),
            allowed: false,
            status: Some(Status {
                metadata: serde_json::Map::new(),
                message: message.into(),
            }),
            warnings: Vec::new(),
        }
    }
}

/// The `AdmissionReview` sent back.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct OutgoingReview {
    /// `AdmissionReview`, as the request said (empty for an undecodable body).
    #[serde(skip_serializing_if = "String::is_empty", default)]
    pub kind: String,
    /// The request's version (`admission.k8s.io/v1` or `v1beta1`).
    #[serde(
        rename = "apiVersion",
        skip_serializing_if = "String::is_empty",
        default
    )]
    pub api_version: String,
    /// The answer.
    pub response: AdmissionResponse,
}

/// What a review came to, for the metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Passed validation (or a kind meshfed does not read, allowed with a warning).
    Passed {
        /// The request's resource.
        resource: GroupVersion,
    },
    /// Not passed (allowed or not), why, and whether it was a dry run.
    Failed {
        /// The request's resource.
        resource: GroupVersion,
        /// Why.
        reason: FailReason,
        /// The request was a dry run.
        dry_run: bool,
    },
    /// The body was no AdmissionReview.
    Undecodable,
}

/// Answers one AdmissionReview body (already read and size-checked).
pub fn review(body: &[u8]) -> (OutgoingReview, Verdict) {
    let incoming: IncomingReview = match serde_json::from_slice(body) {
        Ok(review) => review,
        Err(e) => return undecodable(format!("could not decode body: {e}")),
    };
    let group_version = incoming.api_version.as_str();
    if incoming.kind.is_empty() {
        return undecodable("could not decode body: Object 'Kind' is missing".to_string());
    }
    if incoming.kind != "AdmissionReview"
        || !matches!(
            group_version,
            "admission.k8s.io/v1" | "admission.k8s.io/v1beta1"
        )
    {
        return undecodable(format!(
            "could not decode body: no kind {:?} is registered for version {:?}",
            incoming.kind, group_version
        ));
    }
    let Some(request) = incoming.request else {
        return undecodable("could not decode object: the AdmissionReview has no request".into());
    };
    let (mut response, verdict) = admit(&request);
    response.uid = request.uid.clone();
    (
        OutgoingReview {
            kind: incoming.kind,
            api_version: incoming.api_version,
            response,
        },
        verdict,
    )
}

fn undecodable(message: String) -> (OutgoingReview, Verdict) {
    (
        OutgoingReview {
            kind: String::new(),
            api_version: String::new(),
            response: AdmissionResponse::deny(message),
        },
        Verdict::Undecodable,
    )
}

/// istiod's `validate`: the answer for one request.
pub fn admit(request: &AdmissionRequest) -> (AdmissionResponse, Verdict) {
    let dry_run = request.dry_run.unwrap_or(false);
    let failed = |reason| Verdict::Failed {
        resource: request.resource.clone(),
        reason,
        dry_run,
    };
    if !matches!(request.operation.as_str(), "CREATE" | "UPDATE") {
        return (
            AdmissionResponse::allow(Vec::new()),
            failed(FailReason::UnsupportedOperation),
        );
    }
    let object = match &request.object {
        Some(Value::Object(map)) => map,
        Some(other) => {
            return (
                AdmissionResponse::deny(format!(
                    "cannot decode configuration: expected a JSON object, found {}",
                    json_type(other)
                )),
                failed(FailReason::YamlDecodeError),
            );
        }
        None => {
            return (
                AdmissionResponse::deny(
                    "cannot decode configuration: unexpected end of JSON input",
                ),
                failed(FailReason::YamlDecodeError),
            );
        }
    };
    let text = |key: &str| object.get(key).and_then(Value::as_str).unwrap_or_default();
    let (api_version, kind_name) = (text("apiVersion"), text("kind"));
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let name = object
        .get("metadata")
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    let ours = Kind::from_group_kind(group, kind_name);
    if ours.is_none() {
        if ISTIO_KINDS_NOT_READ.contains(&(group, kind_name)) {
            return (
                AdmissionResponse::allow(vec![format!(
                    "{kind_name} ({group}) is not read by meshfed, so it was not validated; meshfed ignores it"
                )]),
                Verdict::Passed {
                    resource: request.resource.clone(),
                },
            );
        }
        return (
            AdmissionResponse::deny(format!(
                "unrecognized type {group}/{version}, Kind={kind_name}"
            )),
            failed(FailReason::UnknownType),
        );
    }
    // The API server has set the namespace of a namespaced object; fill it from the
    // request where a client-built review left it out.
    let mut value = Value::Object(object.clone());
    if !request.namespace.is_empty()
        && let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut)
        && !meta.contains_key("namespace")
    {
        meta.insert("namespace".into(), Value::String(request.namespace.clone()));
    }
    let decoded_ok = !matches!(decode(&value, "admission"), Decoded::Invalid(_));
    let report = validate_value(Path::new("admission.json"), value);
    if !report.errors.is_empty() {
        let errors: Vec<String> = report.errors.iter().map(reason).collect();
        return if decoded_ok {
            (
                AdmissionResponse::deny(format!("configuration is invalid: {}", joined(&errors))),
                failed(FailReason::InvalidResource),
            )
        } else {
            (
                AdmissionResponse::deny(format!(
                    "error decoding configuration: {}",
                    joined(&errors)
                )),
                failed(FailReason::CrdConversionError),
            )
        };
    }
    if let Some(key) = object.keys().find(|k| {
        !matches!(
            k.as_str(),
            "apiVersion" | "kind" | "metadata" | "spec" | "status"
        )
    }) {
        return (
            AdmissionResponse::deny(format!(
                "unknown field {key:?} on {} resource {}/{name}",
                request.kind.resource, request.namespace
            )),
            failed(FailReason::InvalidResource),
        );
    }
    let warnings = report.warnings.iter().map(reason).collect();
    (
        AdmissionResponse::allow(warnings),
        Verdict::Passed {
            resource: request.resource.clone(),
        },
    )
}

/// A diagnostic as the admission message carries it: `field: message`, the text
/// `meshfed validate` prints after the object's location and name.
fn reason(d: &Diagnostic) -> String {
    if d.field.is_empty() {
        d.message.clone()
    } else {
        format!("{}: {}", d.field, d.message)
    }
}

/// One error as itself; several as Go's multierror lists them.
fn joined(errors: &[String]) -> String {
    match errors {
        [one] => one.clone(),
        many => {
            let mut text = format!("{} errors occurred:", many.len());
            for e in many {
                text.push_str("\n\t* ");
                text.push_str(e);
            }
            text.push_str("\n\n");
            text
        }
    }
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn vs(weights: &[u32]) -> Value {
        let route: Vec<Value> = weights
            .iter()
            .enumerate()
            .map(|(i, w)| json!({"destination": {"host": format!("r{i}")}, "weight": w}))
            .collect();
        json!({
            "apiVersion": "networking.istio.io/v1",
            "kind": "VirtualService",
            "metadata": {"name": "reviews", "namespace": "default"},
            "spec": {"hosts": ["reviews"], "http": [{"route": route}]},
        })
    }

    fn request(operation: &str, object: Option<Value>) -> AdmissionRequest {
        AdmissionRequest {
            uid: "u".into(),
            kind: GroupVersion {
                group: "networking.istio.io".into(),
                version: "v1".into(),
                resource: "VirtualService".into(),
            },
            resource: GroupVersion {
                group: "networking.istio.io".into(),
                version: "v1".into(),
                resource: "virtualservices".into(),
            },
            namespace: "default".into(),
            operation: operation.into(),
            object,
            ..AdmissionRequest::default()
        }
    }

    /// Istio's TestAdmitPilot, with a VirtualService for the mock kind.
    #[test]
    fn admit_pilot_vectors() {
        let valid = vs(&[60, 40]);
        let invalid = vs(&[60, 50]);
        let mut extra = valid.clone();
        extra["unexpected_key"] = json!("any value");
        let cases: [(&str, AdmissionRequest, bool); 6] = [
            ("valid create", request("CREATE", Some(valid.clone())), true),
            ("valid update", request("UPDATE", Some(valid.clone())), true),
            (
                "unsupported operation",
                request("DELETE", Some(valid.clone())),
                true,
            ),
            ("invalid spec", request("CREATE", Some(invalid)), false),
            (
                "corrupt object",
                request("CREATE", Some(json!(format!("---{valid}")))),
                false,
            ),
            (
                "invalid extra key create",
                request("CREATE", Some(extra)),
                false,
            ),
        ];
        for (name, request, allowed) in cases {
            assert_eq!(admit(&request).0.allowed, allowed, "{name}");
        }
    }

    #[test]
    fn unknown_kinds_follow_istio_and_kinds_meshfed_does_not_read_warn() {
        let mut object = vs(&[100]);
        object["kind"] = json!("Bogus");
        let (response, verdict) = admit(&request("CREATE", Some(object.clone())));
        assert_eq!(
            response.status.unwrap().message,
            "unrecognized type networking.istio.io/v1, Kind=Bogus"
        );
        assert!(matches!(
            verdict,
            Verdict::Failed {
                reason: FailReason::UnknownType,
                ..
            }
        ));
        object["kind"] = json!("ProxyConfig");
        let (response, _) = admit(&request("CREATE", Some(object)));
        assert!(response.allowed);
        assert!(response.warnings[0].contains("ProxyConfig"), "{response:?}");
    }

    #[test]
    fn several_errors_are_listed_as_go_lists_them() {
        assert_eq!(joined(&["a".into()]), "a");
        assert_eq!(
            joined(&["a".into(), "b".into()]),
            "2 errors occurred:\n\t* a\n\t* b\n\n"
        );
    }
}
