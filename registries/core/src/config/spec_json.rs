//! Reading a spec message from its proto3 JSON form, with errors that name the failing
//! field (`spec.http[0].timeout`) and say what is wrong in words a config author reads.
//!
//! Decoding is strict, as Istio's schema validation (the CRDs' structural schemas and
//! `istioctl validate`): a key that is no field of the message is an error naming it
//! (`spec.trafficPolcy: unknown field ...`), found by a walk of the document over the
//! messages' descriptors ([`meshfed_api::unknown_fields`]). Our `.proto` files carry
//! every field of Istio's API for the kinds meshfed reads, so an Istio field is never
//! "unknown"; the few that meshfed reads but does not act on ([`NOT_ACTED_ON`]) are
//! warned about wherever they are set ([`unsupported_fields`]), and the object is used.
//!
//! A leaf: it knows the JSON and the field-error vocabulary of [`crate::config::validate`],
//! nothing of config objects or kinds, so the kind table and the object decoder both use it.

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::config::validate::{FieldError, FieldPath, Segment, Warning};

/// Fields of Istio's API that meshfed reads but does not act on, as
/// `(message full name, proto field name)`: setting one gives a warning (the object is
/// still used, without it).
pub const NOT_ACTED_ON: &[(&str, &str)] = &[
    ("istio.networking.v1alpha3.TrafficPolicy", "retry_budget"),
    ("istio.networking.v1alpha3.LoadBalancerSettings", "warmup"),
    (
        "istio.networking.v1alpha3.LoadBalancerSettings.ConsistentHashLB.HTTPCookie",
        "attributes",
    ),
    (
        "istio.networking.v1alpha3.HTTPRetry",
        "retry_ignore_previous_hosts",
    ),
    ("istio.networking.v1alpha3.HTTPRetry", "backoff"),
    (
        "istio.networking.v1alpha3.ServerTLSSettings",
        "credential_names",
    ),
    (
        "istio.networking.v1alpha3.ServerTLSSettings",
        "tls_certificates",
    ),
    (
        "istio.networking.v1alpha3.L4MatchAttributes",
        "source_subnet",
    ),
];

/// The warning given for a field of [`NOT_ACTED_ON`].
pub const NOT_ACTED_ON_MESSAGE: &str = "not supported by meshfed; ignored";

/// Reads a spec message strictly: every key that is no field of the message is an
/// error naming it (`spec.http[0].route[1].destnation`), and so is a value of the
/// wrong form (naming the field and what is wrong).
pub(crate) fn decode_spec<T: DeserializeOwned + prost::Name>(
    value: &Value,
) -> Result<T, Vec<FieldError>> {
    let mut errors: Vec<FieldError> =
        meshfed_api::unknown_fields::unknown_fields(&T::full_name(), value)
            .iter()
            .map(|path| {
                let field = path_from(path);
                let key = match field.segments().last() {
                    Some(Segment::Field(k) | Segment::Key(k)) => k.clone(),
                    _ => path.clone(),
                };
                FieldError::new(
                    FieldPath::spec().join(&field),
                    format!(
                        "unknown field {key:?}: not in Istio's {} API (a typo?)",
                        T::NAME
                    ),
                )
            })
            .collect();
    match decode_typed::<T>(value) {
        Ok(spec) if errors.is_empty() => Ok(spec),
        Ok(_) => Err(errors),
        Err(e) => {
            errors.push(e);
            Err(errors)
        }
    }
}

/// The fields of [`NOT_ACTED_ON`] set in `spec`, each as a warning at its path.
pub fn unsupported_fields<T: Serialize>(full_name: &str, spec: &T) -> Vec<Warning> {
    let Ok(value) = serde_json::to_value(spec) else {
        return Vec::new();
    };
    meshfed_api::unknown_fields::fields(full_name, &value, NOT_ACTED_ON)
        .1
        .iter()
        .map(|path| Warning {
            field: FieldPath::spec().join(&path_from(path)),
            message: NOT_ACTED_ON_MESSAGE.to_string(),
        })
        .collect()
}

/// A path in the form [`meshfed_api::unknown_fields`] writes (`http[0].route`,
/// `labels[app]`) as a [`FieldPath`].
pub(crate) fn path_from(text: &str) -> FieldPath {
    let mut segments = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('[') {
            let end = after.find(']').unwrap_or(after.len());
            let inner = &after[..end];
            segments.push(match inner.parse::<usize>() {
                Ok(i) => Segment::Index(i),
                Err(_) => Segment::Key(inner.to_string()),
            });
            rest = after.get(end + 1..).unwrap_or_default();
        } else {
            let rest_trimmed = rest.strip_prefix('.').unwrap_or(rest);
            let end = rest_trimmed.find(['.', '[']).unwrap_or(rest_trimmed.len());
            segments.push(Segment::Field(rest_trimmed[..end].to_string()));
            rest = &rest_trimmed[end..];
        }
    }
    FieldPath::from_segments(segments)
}

/// Reads a spec message, naming the failing field on error.
pub(crate) fn decode_typed<T: DeserializeOwned>(value: &Value) -> Result<T, FieldError> {
    serde_path_to_error::deserialize::<_, T>(value).map_err(|e| {
        let mut segments = vec![Segment::Field("spec".to_string())];
        for segment in e.path().iter() {
            match segment {
                serde_path_to_error::Segment::Seq { index } => {
                    segments.push(Segment::Index(*index));
                }
                serde_path_to_error::Segment::Map { key } => {
                    segments.push(Segment::Field(key.clone()));
                }
                serde_path_to_error::Segment::Enum { variant } => {
                    segments.push(Segment::Field(variant.clone()));
                }
                serde_path_to_error::Segment::Unknown => {}
            }
        }
        let at_value = value_at(value, &segments[1..]);
        let reason = explain(&e.inner().to_string(), at_value);
        FieldError::new(FieldPath::from_segments(segments), reason)
    })
}

/// The JSON value at a path (for error messages).
fn value_at<'a>(mut value: &'a Value, path: &[Segment]) -> Option<&'a Value> {
    for segment in path {
        value = match segment {
            Segment::Field(k) | Segment::Key(k) => value.get(k)?,
            Segment::Index(i) => value.get(i)?,
        };
    }
    Some(value)
}

/// Rewrites serde messages that say little into ones that say what is wrong.
fn explain(message: &str, value: Option<&Value>) -> String {
    let shown = value.map(ToString::to_string).unwrap_or_default();
    if message.contains("did not match any variant of untagged enum")
        || message.contains("invalid digit found in string")
        || message.contains("number too large")
        || message.contains("number too small")
    {
        return format!(
            "invalid number {shown}: not a whole number in the range of this field (e.g. a port or weight \
             cannot be negative)"
        );
    }
    if let Some(field) = message
        .strip_prefix("duplicate field `")
        .and_then(|rest| rest.strip_suffix('`'))
    {
        return format!(
            "`{field}` is set together with another field of the same one-of group (for example simple and \
             consistentHash, or exact and prefix); set only one"
        );
    }
    message.to_string()
}

/// "a string", "a list", ... for messages.
pub(crate) fn describe(value: &Value) -> &'static str {
    match value {
        Value::Null => "nothing (null)",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::config::{Decoded, Kind, decode, validate};

    /// Decodes a `kind` object with `spec`; the errors' display, or the warnings'.
    fn decoded(kind: Kind, spec: serde_json::Value) -> Result<Vec<String>, Vec<String>> {
        let value = json!({
            "apiVersion": kind.api_version(),
            "kind": kind.as_str(),
            "metadata": {"name": "x", "namespace": "ns"},
            "spec": spec,
        });
        match decode(&value, "test") {
            Decoded::Object(obj) => validate(&obj)
                .map(|w| w.iter().map(ToString::to_string).collect())
                .map_err(|e| e.iter().map(ToString::to_string).collect()),
            Decoded::Invalid(bad) => Err(bad.errors.iter().map(ToString::to_string).collect()),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn an_envoy_filter_patch_value_is_free_form() {
        // `patch.value` is a `google.protobuf.Struct`: any keys, checked later against
        // the Envoy type of the patch, never as unknown fields of the spec.
        let spec = json!({"configPatches": [{"applyTo": "CLUSTER", "patch": {
            "operation": "MERGE",
            "value": {"connect_timeout": "1s", "anything": {"nested": [1, "x", null, true]}},
        }}]});
        let warnings = decoded(Kind::EnvoyFilter, spec).expect("a free-form value decodes");
        assert!(
            warnings.iter().all(|w| !w.contains("unknown")),
            "{warnings:?}"
        );
    }

    #[test]
    fn a_typo_is_rejected_in_every_kind_with_its_path() {
        let cases = [
            (
                Kind::VirtualService,
                json!({"hosts": ["a"], "http": [{"route": [{"destination": {"host": "a"}}, {"destnation": {"host": "b"}}]}]}),
                "spec.http[0].route[1].destnation",
            ),
            (
                Kind::DestinationRule,
                json!({"host": "a", "trafficPolcy": {}}),
                "spec.trafficPolcy",
            ),
            (
                Kind::Gateway,
                json!({"selector": {"istio": "ingress"}, "servers": [{"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["*"], "tsl": {}}]}),
                "spec.servers[0].tsl",
            ),
            (
                Kind::ServiceEntry,
                json!({"hosts": ["a.com"], "resolution": "DNS", "ports": [{"number": 80, "name": "http", "protocl": "HTTP"}]}),
                "spec.ports[0].protocl",
            ),
            (
                Kind::WorkloadEntry,
                json!({"address": "1.2.3.4", "lables": {}}),
                "spec.lables",
            ),
            (
                Kind::Sidecar,
                json!({"egress": [{"hosts": ["./*"], "hots": []}]}),
                "spec.egress[0].hots",
            ),
            (
                Kind::PeerAuthentication,
                json!({"mtls": {"mode": "STRICT", "mod": 1}}),
                "spec.mtls.mod",
            ),
            (
                Kind::RequestAuthentication,
                json!({"jwtRules": [{"issuer": "i", "jwksUrl": "x"}]}),
                "spec.jwtRules[0].jwksUrl",
            ),
            (
                Kind::AuthorizationPolicy,
                json!({"rules": [{"from": [{"source": {"principal": ["a"]}}]}]}),
                "spec.rules[0].from[0].source.principal",
            ),
            (
                Kind::WorkloadGroup,
                json!({"template": {"serviceAccount": "a"}, "probe": {"periodSecond": 1}}),
                "spec.probe.periodSecond",
            ),
            (
                Kind::Telemetry,
                json!({"accessLogging": [{"providers": [{"name": "envoy", "nmae": "x"}]}]}),
                "spec.accessLogging[0].providers[0].nmae",
            ),
            (
                Kind::EnvoyFilter,
                json!({"configPatches": [{"applyTo": "CLUSTER", "pach": {}}]}),
                "spec.configPatches[0].pach",
            ),
        ];
        for (kind, spec, path) in cases {
            let errors =
                decoded(kind, spec).expect_err(&format!("{kind}: a typo must be rejected"));
            let field = path.rsplit(['.']).next().unwrap();
            assert!(
                errors.iter().any(
                    |e| e.starts_with(&format!("{path}: unknown field \"{field}\""))
                        && e.contains(&format!("not in Istio's {kind} API"))
                ),
                "{kind}: {errors:?}"
            );
        }
    }

    #[test]
    fn the_error_names_the_field_and_the_kind() {
        let top = decoded(
            Kind::DestinationRule,
            json!({"host": "a", "trafficPolcy": {}}),
        )
        .unwrap_err();
        assert_eq!(
            top,
            [
                "spec.trafficPolcy: unknown field \"trafficPolcy\": not in Istio's DestinationRule API (a typo?)"
            ]
        );
        let nested = decoded(
            Kind::VirtualService,
            json!({"hosts": ["a"], "http": [{"retries": {"attempt": 3}}]}),
        )
        .unwrap_err();
        assert_eq!(
            nested,
            [
                "spec.http[0].retries.attempt: unknown field \"attempt\": not in Istio's VirtualService API (a typo?)"
            ]
        );
        // Map keys are not fields: labels and headers take any key.
        assert!(
            decoded(
                Kind::DestinationRule,
                json!({"host": "a", "subsets": [{"name": "v1", "labels": {"anything": "x"}}]})
            )
            .is_ok()
        );
    }

    #[test]
    fn an_istio_field_meshfed_does_not_act_on_is_a_warning() {
        let warnings = decoded(
            Kind::VirtualService,
            json!({"hosts": ["a"], "http": [{"route": [{"destination": {"host": "a"}}], "retries": {"attempts": 2, "backoff": "1s", "retryIgnorePreviousHosts": false}}]}),
        )
        .unwrap();
        assert!(
            warnings.contains(
                &"spec.http[0].retries.backoff: not supported by meshfed; ignored".to_string()
            ),
            "{warnings:?}"
        );
        assert!(
            warnings.contains(
                &"spec.http[0].retries.retryIgnorePreviousHosts: not supported by meshfed; ignored"
                    .to_string()
            ),
            "{warnings:?}"
        );
        let warnings = decoded(
            Kind::DestinationRule,
            json!({"host": "a", "trafficPolicy": {"retryBudget": {"percent": 20}, "loadBalancer": {"simple": "ROUND_ROBIN", "warmup": {"duration": "10s"}}}}),
        )
        .unwrap();
        assert!(
            warnings.contains(
                &"spec.trafficPolicy.retryBudget: not supported by meshfed; ignored".to_string()
            ),
            "{warnings:?}"
        );
        assert!(
            warnings.contains(
                &"spec.trafficPolicy.loadBalancer.warmup: not supported by meshfed; ignored"
                    .to_string()
            ),
            "{warnings:?}"
        );
        let warnings = decoded(
            Kind::Gateway,
            json!({"servers": [{"port": {"number": 443, "name": "https", "protocol": "HTTPS"}, "hosts": ["*"], "tls": {"mode": "SIMPLE", "credentialName": "a", "credentialNames": ["a", "b"]}}]}),
        )
        .unwrap();
        assert!(
            warnings.contains(
                &"spec.servers[0].tls.credentialNames: not supported by meshfed; ignored"
                    .to_string()
            ),
            "{warnings:?}"
        );
    }

    #[test]
    fn paths_in_the_walker_form_become_field_paths() {
        assert_eq!(
            super::path_from("http[0].route[1].destnation").to_string(),
            "http[0].route[1].destnation"
        );
        assert_eq!(
            super::path_from("labels[app.kubernetes.io/name].x").to_string(),
            "labels[app.kubernetes.io/name].x"
        );
        assert_eq!(super::path_from("a").to_string(), "a");
    }
}
