//! Validation of `telemetry.istio.io` Telemetry, after Istio's `ValidateTelemetry`
//! (`pkg/config/validation`), and the check Istio's analyzers make of the providers a
//! Telemetry names ([`unknown_providers`]).
//!
//! Beyond Istio: an access log `filter.expression` is checked for balanced brackets
//! and quotes rather than parsed as CEL (no CEL parser here); an expression Istio
//! refuses and this check accepts is still refused by Envoy (the listener is NACKed).

use meshfed_api::mesh::v1alpha1::MeshConfig;
use meshfed_api::mesh::v1alpha1::mesh_config::extension_provider::Provider;
use meshfed_api::telemetry::v1alpha1 as tel;

use super::security::targets;
use super::{FieldPath, Findings, Validation};

/// Telemetry: one way of selecting, provider names set, sampling 0..=100, custom tags
/// with values, tag overrides consistent with their operation, filters well formed.
pub fn validate_telemetry(t: &tel::Telemetry) -> Validation {
    let mut f = Findings::new();
    let spec = FieldPath::spec();
    targets(
        &mut f,
        &spec,
        t.selector.as_ref(),
        t.target_ref.as_ref(),
        &t.target_refs,
    );
    if t.access_logging.len() > 1 {
        f.warn(
            &spec.field("accessLogging"),
            "multiple accessLogging is not currently supported",
        );
    }
    for (i, l) in t.access_logging.iter().enumerate() {
        let at = spec.field("accessLogging").index(i);
        providers(&mut f, &at, &l.providers);
        if let Some(filter) = &l.filter
            && let Err(e) = check_expression(&filter.expression)
        {
            f.error(&at.field("filter").field("expression"), e);
        }
    }
    if t.tracing.len() > 1 {
        f.warn(
            &spec.field("tracing"),
            "multiple tracing is not currently supported",
        );
    }
    for (i, tr) in t.tracing.iter().enumerate() {
        let at = spec.field("tracing").index(i);
        if tr.providers.len() > 1 {
            f.warn(
                &at.field("providers"),
                "multiple providers is not currently supported",
            );
        }
        providers(&mut f, &at, &tr.providers);
        if let Some(p) = tr.random_sampling_percentage
            && !(0.0..=100.0).contains(&p.value)
        {
            f.error(
                &at.field("randomSamplingPercentage"),
                "randomSamplingPercentage must be in range [0.0, 100.0]",
            );
        }
        for (name, tag) in &tr.custom_tags {
            let here = at.field("customTags").key(name);
            if name.is_empty() {
                f.error(&here, "tag name may not be empty");
            }
            use tel::tracing::custom_tag::Type;
            match &tag.r#type {
                None => f.error(&here, format!("tag '{name}' may not have a nil value")),
                Some(Type::Literal(l)) if l.value.is_empty() => {
                    f.error(&here, "literal tag value may not be empty")
                }
                Some(Type::Header(h)) if h.name.is_empty() => {
                    f.error(&here, "header tag name may not be empty")
                }
                Some(Type::Environment(e)) if e.name.is_empty() => {
                    f.error(&here, "environment tag name may not be empty")
                }
                Some(_) => {}
            }
        }
    }
    for (i, m) in t.metrics.iter().enumerate() {
        let at = spec.field("metrics").index(i);
        providers(&mut f, &at, &m.providers);
        if let Some(d) = m.reporting_interval
            && (d.seconds < 0 || (d.seconds == 0 && d.nanos <= 0))
        {
            f.error(
                &at.field("reportingInterval"),
                "reportingInterval must be a positive duration",
            );
        }
        for (j, o) in m.overrides.iter().enumerate() {
            let here = at.field("overrides").index(j);
            for (tag, to) in &o.tag_overrides {
                let tag_at = here.field("tagOverrides").key(tag);
                if tag.is_empty() {
                    f.warn(&tag_at, "tagOverrides.name may not be empty");
                }
                use tel::metrics_overrides::tag_override::Operation;
                match to.operation() {
                    Operation::Upsert if to.value.is_empty() => f.error(
                        &tag_at,
                        "tagOverrides.value must be set set when operation is UPSERT",
                    ),
                    Operation::Remove if !to.value.is_empty() => f.error(
                        &tag_at,
                        "tagOverrides.value may only be set when operation is UPSERT",
                    ),
                    _ => {}
                }
            }
            if let Some(tel::metric_selector::MetricMatch::CustomMetric(c)) =
                o.r#match.as_ref().and_then(|m| m.metric_match.as_ref())
                && c.is_empty()
            {
                f.error(
                    &here.field("match").field("customMetric"),
                    "customMetric may not be empty",
                );
            }
        }
    }
    f.finish()
}

fn providers(f: &mut Findings, at: &FieldPath, refs: &[tel::ProviderRef]) {
    for (i, p) in refs.iter().enumerate() {
        if p.name.is_empty() {
            f.error(
                &at.field("providers").index(i).field("name"),
                "providers.name may not be empty",
            );
        }
    }
}

/// A light check of a CEL expression: not empty, brackets balanced, strings closed.
fn check_expression(expr: &str) -> Result<(), String> {
    if expr.trim().is_empty() {
        return Err("expression may not be empty".into());
    }
    let mut stack = Vec::new();
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for c in expr.chars() {
        if let Some(q) = quote {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == q {
                quote = None;
            }
            continue;
        }
        match c {
            '"' | '\'' => quote = Some(c),
            '(' | '[' | '{' => stack.push(c),
            ')' | ']' | '}' => {
                let open = match c {
                    ')' => '(',
                    ']' => '[',
                    _ => '{',
                };
                if stack.pop() != Some(open) {
                    return Err(format!("invalid CEL expression {expr:?}: unbalanced {c:?}"));
                }
            }
            _ => {}
        }
    }
    if quote.is_some() {
        return Err(format!(
            "invalid CEL expression {expr:?}: unterminated string"
        ));
    }
    if !stack.is_empty() {
        return Err(format!("invalid CEL expression {expr:?}: unclosed bracket"));
    }
    Ok(())
}

/// Istio's built-in extension providers, known without being listed in the mesh
/// config (`prometheus`, `stackdriver`, `envoy`), unless the mesh config defines a
/// provider of the same name.
pub const BUILTIN_PROVIDERS: [&str; 3] = ["prometheus", "stackdriver", "envoy"];

/// What the providers a Telemetry names have wrong against `mesh`, as Istio's
/// analyzers report it: a name that is no extension provider (of the mesh config or
/// built in), or a provider that cannot do what the rule asks (tracing, metrics,
/// access logging). Each entry is the field (`spec.tracing[0].providers[0]`) and what
/// is wrong with the provider it names.
pub fn unknown_providers(t: &tel::Telemetry, mesh: &MeshConfig) -> Vec<(String, String)> {
    #[derive(Clone, Copy, PartialEq)]
    enum Use {
        Tracing,
        Metrics,
        Logging,
    }
    let find = |name: &str| {
        mesh.extension_providers
            .iter()
            .find(|p| p.name.eq_ignore_ascii_case(name))
    };
    let mut out = Vec::new();
    let mut check = |field: String, name: &str, want: Use| {
        if name.is_empty() {
            return;
        }
        let Some(p) = find(name) else {
            if !BUILTIN_PROVIDERS
                .iter()
                .any(|b| b.eq_ignore_ascii_case(name))
            {
                out.push((
                    field,
                    format!("provider {name:?} is not an extension provider of the mesh config"),
                ));
            } else if (want == Use::Tracing)
                || (want == Use::Logging && !name.eq_ignore_ascii_case("envoy"))
                || (want == Use::Metrics && name.eq_ignore_ascii_case("envoy"))
            {
                out.push((
                    field,
                    format!("built-in provider {name:?} cannot be used here; it is ignored"),
                ));
            }
            return;
        };
        let fits = matches!(
            (&p.provider, want),
            (
                Some(
                    Provider::Zipkin(_)
                        | Provider::Datadog(_)
                        | Provider::Skywalking(_)
                        | Provider::Opentelemetry(_),
                ),
                Use::Tracing,
            ) | (Some(Provider::Prometheus(_)), Use::Metrics)
                | (
                    Some(
                        Provider::EnvoyFileAccessLog(_)
                            | Provider::EnvoyHttpAls(_)
                            | Provider::EnvoyTcpAls(_)
                            | Provider::EnvoyOtelAls(_),
                    ),
                    Use::Logging,
                )
        );
        if !fits {
            let what = match want {
                Use::Tracing => "tracing",
                Use::Metrics => "metrics",
                Use::Logging => "access logging",
            };
            out.push((
                field,
                format!("provider {name:?} cannot be used for {what}; it is ignored"),
            ));
        }
    };
    for (i, tr) in t.tracing.iter().enumerate() {
        for (j, p) in tr.providers.iter().enumerate() {
            check(
                format!("spec.tracing[{i}].providers[{j}]"),
                &p.name,
                Use::Tracing,
            );
        }
    }
    for (i, m) in t.metrics.iter().enumerate() {
        for (j, p) in m.providers.iter().enumerate() {
            check(
                format!("spec.metrics[{i}].providers[{j}]"),
                &p.name,
                Use::Metrics,
            );
        }
    }
    for (i, l) in t.access_logging.iter().enumerate() {
        for (j, p) in l.providers.iter().enumerate() {
            check(
                format!("spec.accessLogging[{i}].providers[{j}]"),
                &p.name,
                Use::Logging,
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{assert_error, assert_ok, spec};
    use super::*;

    #[test]
    fn telemetry_is_validated_as_istio_validates_it() {
        let ok: tel::Telemetry = spec(
            r#"
selector: {matchLabels: {app: reviews}}
tracing:
- providers: [{name: otel}]
  randomSamplingPercentage: 10
  customTags:
    team: {literal: {value: payments}}
    user: {header: {name: x-user, defaultValue: anon}}
metrics:
- providers: [{name: prometheus}]
  overrides:
  - match: {metric: REQUEST_COUNT, mode: SERVER}
    tagOverrides:
      response_code: {operation: REMOVE}
      method: {value: request.method}
accessLogging:
- providers: [{name: envoy}]
  filter: {expression: "response.code >= 400"}
"#,
        );
        assert_ok(&validate_telemetry(&ok));

        let bad: tel::Telemetry = spec(
            r#"
tracing:
- providers: [{name: ""}]
  randomSamplingPercentage: 101
  customTags:
    a: {literal: {value: ""}}
    b: {header: {}}
    c: {environment: {}}
metrics:
- overrides:
  - match: {customMetric: ""}
    tagOverrides:
      x: {operation: UPSERT}
      y: {operation: REMOVE, value: "1"}
accessLogging:
- filter: {expression: "response.code >= (400"}
"#,
        );
        let r = validate_telemetry(&bad);
        assert_error(&r, "spec.tracing[0].providers[0].name", "may not be empty");
        assert_error(
            &r,
            "spec.tracing[0].randomSamplingPercentage",
            "must be in range",
        );
        assert_error(&r, "spec.tracing[0].customTags[a]", "literal tag value");
        assert_error(&r, "spec.tracing[0].customTags[b]", "header tag name");
        assert_error(&r, "spec.tracing[0].customTags[c]", "environment tag name");
        assert_error(
            &r,
            "spec.metrics[0].overrides[0].match.customMetric",
            "may not be empty",
        );
        assert_error(
            &r,
            "spec.metrics[0].overrides[0].tagOverrides[x]",
            "must be set",
        );
        assert_error(
            &r,
            "spec.metrics[0].overrides[0].tagOverrides[y]",
            "may only be set",
        );
        assert_error(
            &r,
            "spec.accessLogging[0].filter.expression",
            "unclosed bracket",
        );
    }

    #[test]
    fn unknown_and_misused_providers_are_reported() {
        let mesh: MeshConfig = spec(
            r#"
extensionProviders:
- name: otel
  opentelemetry: {service: otel-collector.observability.svc.cluster.local, port: 4317}
- name: log
  envoyFileAccessLog: {path: /dev/stdout}
"#,
        );
        let t: tel::Telemetry = spec(
            r#"
tracing: [{providers: [{name: OTEL}]}]
metrics: [{providers: [{name: prometheus}]}]
accessLogging:
- providers: [{name: log}, {name: envoy}, {name: missing}, {name: otel}]
"#,
        );
        let found = unknown_providers(&t, &mesh);
        assert_eq!(found.len(), 2, "{found:?}");
        assert_eq!(found[0].0, "spec.accessLogging[0].providers[2]");
        assert!(
            found[0]
                .1
                .contains("\"missing\" is not an extension provider")
        );
        assert_eq!(found[1].0, "spec.accessLogging[0].providers[3]");
        assert!(found[1].1.contains("cannot be used for access logging"));
        let zipkin_as_metrics: tel::Telemetry = spec("metrics: [{providers: [{name: otel}]}]");
        assert_eq!(unknown_providers(&zipkin_as_metrics, &mesh).len(), 1);
    }
}
