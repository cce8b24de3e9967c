//! The status istiod writes on Gateway API objects, computed as data by
//! [`super::convert`]: GatewayClass `Accepted`; Gateway `Accepted`/`Programmed` with
//! addresses, per-listener conditions and attached routes; a route's `parents[]` with
//! `Accepted`/`ResolvedRefs` and Istio's reasons and messages. `/debug/configz` shows
//! it, `meshfed validate` reports its failures, and the status writer (leader only,
//! `--enableStatus`) writes it.

use serde::Serialize;
use serde_json::{Value, json};

use crate::config::{ConfigObject, Kind};

/// One condition (`lastTransitionTime` is set by the writer).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Condition {
    #[serde(rename = "type")]
    pub kind: String,
    pub status: String,
    pub reason: String,
    pub message: String,
}

impl Condition {
    /// A `True` condition.
    pub fn ok(kind: &str, reason: &str, message: &str) -> Condition {
        Condition {
            kind: kind.into(),
            status: "True".into(),
            reason: reason.into(),
            message: message.into(),
        }
    }

    /// A `False` condition.
    pub fn failed(kind: &str, reason: &str, message: impl Into<String>) -> Condition {
        Condition {
            kind: kind.into(),
            status: "False".into(),
            reason: reason.into(),
            message: message.into(),
        }
    }

    /// The Kubernetes form.
    pub fn to_json(&self) -> Value {
        json!({"type": self.kind, "status": self.status, "reason": self.reason, "message": self.message})
    }
}

/// The computed status of one Gateway API object.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ObjectStatus {
    /// `GatewayClass`, `KubernetesGateway` or a route kind.
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
    /// The `status` field as istiod writes it.
    pub status: Value,
    /// What meshfed does not serve of the object although the status accepts it:
    /// (spec field, message), reported with the status' own failures.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<(String, String)>,
}

impl ObjectStatus {
    /// The status of `object`.
    pub fn new(kind: Kind, object: &ConfigObject, status: Value) -> ObjectStatus {
        ObjectStatus {
            kind,
            namespace: object.namespace.clone(),
            name: object.name.clone(),
            status,
            notes: Vec::new(),
        }
    }

    /// The problems the status reports, each with the spec field it is about
    /// (`spec.parentRefs[0]`, `spec.listeners[1]`, `spec.rules` for backends), for
    /// `meshfed validate`.
    pub fn findings(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = Vec::new();
        let bad = |c: &Value| {
            let positive = !matches!(
                c["type"].as_str(),
                Some("Conflicted" | "InsecureFrontendValidationMode")
            );
            (c["status"] == "False") == positive
        };
        let text = |c: &Value| {
            format!(
                "{} {}: {}",
                c["type"].as_str().unwrap_or_default(),
                c["reason"].as_str().unwrap_or_default(),
                c["message"].as_str().unwrap_or_default()
            )
        };
        // The object's own conditions (a Gateway's `Accepted`, `Programmed`, ...).
        for c in self.status["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| bad(c))
        {
            let field = if c["reason"] == "InvalidParameters" {
                "spec.infrastructure.parametersRef"
            } else if c["type"] == "AttachedListenerSets" {
                "spec.allowedListeners"
            } else {
                "spec"
            };
            out.push((field.to_string(), text(c)));
        }
        for (i, l) in self.status["listeners"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            for c in l["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|c| bad(c))
            {
                let message = c["message"].as_str().unwrap_or_default();
                let frontend = matches!(
                    c["reason"].as_str(),
                    Some(
                        "NoValidCACertificate"
                            | "InvalidCACertificateRef"
                            | "InvalidCACertificateKind"
                    )
                ) || message.starts_with("caCertificateRef ")
                    || message.starts_with("spec.tls.frontend");
                let field = if frontend {
                    "spec.tls.frontend".to_string()
                } else if message.starts_with("tls.frontendValidation") {
                    format!("spec.listeners[{i}].tls.frontendValidation")
                } else if c["type"] == "ResolvedRefs" {
                    format!("spec.listeners[{i}].tls.certificateRefs")
                } else {
                    format!("spec.listeners[{i}]")
                };
                out.push((field, text(c)));
            }
        }
        for (i, p) in self.status["parents"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            for c in p["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|c| bad(c))
            {
                let field = if c["type"] == "ResolvedRefs" {
                    "spec.rules".to_string()
                } else {
                    format!("spec.parentRefs[{i}]")
                };
                out.push((field, text(c)));
            }
        }
        // A policy's ancestors: one per targetRef first, then the Gateways.
        for (i, a) in self.status["ancestors"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            for c in a["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|c| bad(c))
            {
                let field = if c["type"] == "ResolvedRefs" {
                    "spec.validation.caCertificateRefs".to_string()
                } else if a["ancestorRef"]["kind"] == "Gateway" {
                    "spec".to_string()
                } else {
                    format!("spec.targetRefs[{i}]")
                };
                let finding = (field, text(c));
                if !out.contains(&finding) {
                    out.push(finding);
                }
            }
        }
        out.extend(self.notes.iter().cloned());
        out
    }

    /// The problems the status reports (a `False` condition that should be `True`),
    /// as `field: type reason: message`, each naming the spec field it is about (as
    /// [`ObjectStatus::findings`]; `spec` for the object as a whole), for
    /// `/debug/configz`.
    pub fn problems(&self) -> Vec<String> {
        self.findings()
            .into_iter()
            .map(|(field, message)| format!("{field}: {message}"))
            .collect()
    }
}

/// One entry of a route's `status.parents`.
#[derive(Clone, Debug, PartialEq)]
pub struct RouteParentStatus {
    /// The parentRef as Istio echoes it (group and kind filled in).
    pub parent_ref: Value,
    /// `Accepted` failure: reason and message.
    pub not_accepted: Option<(String, String)>,
    /// `ResolvedRefs` failure: reason and message.
    pub unresolved: Option<(String, String)>,
    /// How many parents (listeners) the parentRef bound to.
    pub bound: usize,
}

/// The `Accepted` failure message of a parentRef naming no Gateway this controller
/// serves (none of that name, or one of another class). istiod leaves such a parent
/// out of the route's status (it may be another controller's), so [`route_status`]
/// reports it as a note only.
pub const NO_GATEWAY: &str = "no Gateway of this controller's classes has that name";

/// A route's status: one parent entry per parentRef, except a Gateway parentRef that
/// names no Gateway of this controller (left out as istiod leaves it out, and noted
/// for `meshfed validate` and `/debug/configz`).
pub fn route_status(
    kind: Kind,
    object: &ConfigObject,
    controller: &str,
    parents: &[RouteParentStatus],
) -> ObjectStatus {
    let unknown = |p: &RouteParentStatus| {
        p.not_accepted
            .as_ref()
            .is_some_and(|(_, m)| m == NO_GATEWAY)
    };
    let notes: Vec<(String, String)> = parents
        .iter()
        .enumerate()
        .filter(|(_, p)| unknown(p))
        .map(|(i, p)| {
            (
                format!("spec.parentRefs[{i}]"),
                format!(
                    "Gateway {}/{}: {} (the route does not attach there; no status is written for it)",
                    p.parent_ref["namespace"]
                        .as_str()
                        .unwrap_or(&object.namespace),
                    p.parent_ref["name"].as_str().unwrap_or_default(),
                    NO_GATEWAY
                ),
            )
        })
        .collect();
    let parents: Vec<Value> = parents
        .iter()
        .filter(|p| !unknown(p))
        .map(|p| {
            let accepted = match &p.not_accepted {
                None if p.bound > 1 => Condition::ok(
                    "Accepted",
                    "Accepted",
                    &format!("Route was valid, bound to {} parents", p.bound),
                ),
                None => Condition::ok("Accepted", "Accepted", "Route was valid"),
                Some((reason, message)) => Condition::failed("Accepted", reason, message.clone()),
            };
            let resolved = match &p.unresolved {
                None => Condition::ok("ResolvedRefs", "ResolvedRefs", "All references resolved"),
                Some((reason, message)) => {
                    Condition::failed("ResolvedRefs", reason, message.clone())
                }
            };
            json!({
                "conditions": [accepted.to_json(), resolved.to_json()],
                "controllerName": controller,
                "parentRef": p.parent_ref,
            })
        })
        .collect::<Vec<Value>>();
    // In the order istiod writes them: by parentRef (group and kind with their
    // defaults, name, namespace, section, port as text), last first.
    let mut parents = parents;
    parents.sort_by_cached_key(|p| {
        let r = &p["parentRef"];
        let field = |k: &str, default: &str| match &r[k] {
            Value::String(s) => s.clone(),
            Value::Null => default.to_string(),
            other => other.to_string(),
        };
        std::cmp::Reverse((
            field("group", super::GROUP),
            field("kind", "Gateway"),
            field("name", ""),
            field("namespace", ""),
            field("sectionName", ""),
            field("port", ""),
        ))
    });
    let mut status = ObjectStatus::new(kind, object, json!({ "parents": parents }));
    status.notes = notes;
    status
}
