//! Istio's vectors for the Telemetry merge and the filters it builds
//! (`pilot/pkg/model/telemetry_test.go`, `telemetry_logging_test.go`,
//! `pilot/pkg/networking/core/tracing_test.go`, `accesslog_test.go`), ported.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use meshfed_api::mesh::v1alpha1::MeshConfig;
use meshfed_api::telemetry::v1alpha1 as tel;
use prost::Message;

use super::merge::{self, ListenerClass, Providers, TracingConfig, TracingSpec};
use super::*;
use crate::push::config_index::Config;

fn yaml<T: serde::de::DeserializeOwned>(text: &str) -> T {
    let v: serde_json::Value = serde_norway::from_str(text).expect("test YAML");
    serde_json::from_value(v).expect("test spec")
}

/// Telemetry `default` in `namespace`, created `age` seconds after the epoch (Istio's
/// test store keeps insertion order).
fn telemetry(namespace: &str, spec: &str) -> Config<tel::Telemetry> {
    telemetry_named(namespace, "default", spec)
}

fn telemetry_named(namespace: &str, name: &str, spec: &str) -> Config<tel::Telemetry> {
    Config {
        name: name.into(),
        namespace: namespace.into(),
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
        creation_time: SystemTime::UNIX_EPOCH + Duration::from_secs(1),
        spec: yaml(spec),
    }
}

/// Istio's test mesh: the default mesh config plus three file access log providers.
fn test_mesh() -> MeshConfig {
    let mut m = crate::mesh::default_mesh_config();
    m.extension_providers = yaml(
        r#"
- name: envoy-json
  envoyFileAccessLog: {path: /dev/stdout, logFormat: {labels: {}}}
- name: envoy-text-formatters
  envoyFileAccessLog:
    path: /dev/stdout
    logFormat: {text: "%REQ_WITHOUT_QUERY(key1:val1)% REQ_WITHOUT_QUERY(key2:val1)% %METADATA(UPSTREAM_HOST:istio)% %METADATA(CLUSTER:istio)%\n"}
"#,
    );
    m
}

fn sidecar_labels() -> BTreeMap<String, String> {
    [("app".to_string(), "test".to_string())].into()
}

fn arcs(cfgs: Vec<Config<tel::Telemetry>>) -> Vec<Arc<Config<tel::Telemetry>>> {
    cfgs.into_iter().map(Arc::new).collect()
}

// === TestTracing (telemetry_test.go) ===

const ENVOY: &str = "tracing: [{providers: [{name: envoy}]}]";
const STACKDRIVER: &str = "tracing: [{providers: [{name: stackdriver}]}]";
const EMPTY: &str = "tracing: [{}]";
const DISABLED: &str = "tracing: [{disableSpanReporting: true}]";
const OVERRIDES_A: &str = r#"
tracing:
- randomSamplingPercentage: 50.0
  customTags: {foo: {literal: {value: x}}, bar: {literal: {value: x}}}
  useRequestIdForTraceSampling: false
  enableIstioTags: false
"#;
const OVERRIDES_B: &str = r#"
tracing:
- randomSamplingPercentage: 80.0
  customTags: {foo: {literal: {value: x}}, baz: {literal: {value: x}}}
  useRequestIdForTraceSampling: true
  enableIstioTags: true
"#;
const OVERRIDES_DEFAULT_SAMPLING: &str = r#"
tracing:
- customTags: {foo: {literal: {value: x}}, baz: {literal: {value: x}}}
"#;
const NON_EXISTENT: &str = "tracing: [{providers: [{name: custom-provider}]}]";
const CLIENT_SAMPLING: &str = r#"
tracing:
- match: {mode: CLIENT}
  providers: [{name: stackdriver}]
  randomSamplingPercentage: 99.9
"#;
const SERVER_DISABLED: &str = r#"
tracing:
- match: {mode: SERVER}
  disableSpanReporting: true
"#;

fn spec(provider: Option<&str>) -> TracingSpec {
    TracingSpec {
        provider: provider.map(|n| ExtensionProviderName(n).into()),
        ..Default::default()
    }
}

/// Only the provider's name is compared, as Istio's test does.
struct ExtensionProviderName<'a>(&'a str);

impl From<ExtensionProviderName<'_>>
    for meshfed_api::mesh::v1alpha1::mesh_config::ExtensionProvider
{
    fn from(n: ExtensionProviderName<'_>) -> Self {
        meshfed_api::mesh::v1alpha1::mesh_config::ExtensionProvider {
            name: n.0.into(),
            provider: None,
        }
    }
}

fn tracing_config(provider: &str, disabled: bool) -> TracingConfig {
    let mut s = spec(Some(provider));
    s.disabled = disabled;
    TracingConfig {
        client: s.clone(),
        server: s,
    }
}

fn tags(names: &[&str]) -> Option<BTreeMap<String, tel::tracing::CustomTag>> {
    Some(
        names
            .iter()
            .map(|n| {
                (
                    n.to_string(),
                    yaml::<tel::tracing::CustomTag>("literal: {value: x}"),
                )
            })
            .collect(),
    )
}

#[test]
fn istio_tracing_vectors() {
    let ns = |n: &str, s: &str| telemetry(n, s);
    let cases: Vec<(
        &str,
        Vec<Config<tel::Telemetry>>,
        Vec<&str>,
        Option<TracingConfig>,
    )> = vec![
        ("empty", vec![], vec![], None),
        (
            "default provider only",
            vec![],
            vec!["envoy"],
            Some(tracing_config("envoy", false)),
        ),
        (
            "provider only",
            vec![ns("istio-system", ENVOY)],
            vec![],
            Some(tracing_config("envoy", false)),
        ),
        (
            "override default",
            vec![ns("istio-system", ENVOY)],
            vec!["stackdriver"],
            Some(tracing_config("envoy", false)),
        ),
        (
            "override namespace",
            vec![ns("istio-system", ENVOY), ns("default", STACKDRIVER)],
            vec![],
            Some(tracing_config("stackdriver", false)),
        ),
        (
            "empty config inherits",
            vec![ns("istio-system", ENVOY), ns("default", EMPTY)],
            vec![],
            Some(tracing_config("envoy", false)),
        ),
        (
            "disable config",
            vec![ns("istio-system", ENVOY), ns("default", DISABLED)],
            vec![],
            Some(tracing_config("envoy", true)),
        ),
        (
            "disable default",
            vec![ns("default", DISABLED)],
            vec!["envoy"],
            Some(tracing_config("envoy", true)),
        ),
        (
            "non existing",
            vec![ns("default", NON_EXISTENT)],
            vec!["envoy"],
            Some(TracingConfig {
                client: TracingSpec {
                    disabled: true,
                    ..spec(None)
                },
                server: TracingSpec {
                    disabled: true,
                    ..spec(None)
                },
            }),
        ),
        (
            "overrides",
            vec![ns("istio-system", OVERRIDES_A)],
            vec!["envoy"],
            {
                let s = TracingSpec {
                    random_sampling_percentage: Some(50.0),
                    custom_tags: tags(&["foo", "bar"]),
                    use_request_id_for_trace_sampling: false,
                    enable_istio_tags: false,
                    ..spec(Some("envoy"))
                };
                Some(TracingConfig {
                    client: s.clone(),
                    server: s,
                })
            },
        ),
        (
            "overrides with default sampling",
            vec![ns("istio-system", OVERRIDES_DEFAULT_SAMPLING)],
            vec!["envoy"],
            {
                let s = TracingSpec {
                    custom_tags: tags(&["foo", "baz"]),
                    ..spec(Some("envoy"))
                };
                Some(TracingConfig {
                    client: s.clone(),
                    server: s,
                })
            },
        ),
        (
            "multi overrides",
            vec![ns("istio-system", OVERRIDES_A), ns("default", OVERRIDES_B)],
            vec!["envoy"],
            {
                let s = TracingSpec {
                    random_sampling_percentage: Some(80.0),
                    custom_tags: tags(&["foo", "baz"]),
                    ..spec(Some("envoy"))
                };
                Some(TracingConfig {
                    client: s.clone(),
                    server: s,
                })
            },
        ),
        (
            "client-only override",
            vec![ns("istio-system", ENVOY), ns("default", CLIENT_SAMPLING)],
            vec!["envoy"],
            Some(TracingConfig {
                client: TracingSpec {
                    random_sampling_percentage: Some(99.9),
                    ..spec(Some("stackdriver"))
                },
                server: spec(Some("envoy")),
            }),
        ),
        (
            "server-only override",
            vec![ns("istio-system", ENVOY), ns("default", SERVER_DISABLED)],
            vec!["envoy"],
            Some(TracingConfig {
                client: spec(Some("envoy")),
                server: TracingSpec {
                    disabled: true,
                    ..spec(Some("envoy"))
                },
            }),
        ),
    ];
    let mut failed = Vec::new();
    for (name, cfgs, defaults, want) in cases {
        let mut mesh = test_mesh();
        mesh.default_providers.get_or_insert_default().tracing =
            defaults.iter().map(|s| s.to_string()).collect();
        let cfgs = arcs(cfgs);
        let a = merge::applicable(&cfgs, "istio-system", "default", &sidecar_labels());
        let mut got = merge::merge_tracing(&a.tracing, &mesh, &Providers::new(&mesh));
        // Only the provider names are compared.
        if let Some(g) = got.as_mut() {
            for s in [&mut g.client, &mut g.server] {
                if let Some(p) = s.provider.as_mut() {
                    p.provider = None;
                }
            }
        }
        if got != want {
            failed.push(format!("{name}: got {got:?}\n want {want:?}"));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

// === TestTelemetryFilters (telemetry_test.go) ===

const OVERRIDES: &str = r#"
- match: {metric: REQUEST_COUNT}
  tagOverrides:
    remove: {operation: REMOVE}
    add: {operation: UPSERT, value: bar}
"#;

/// The stats filter configs of `class`, as Istio's test prints them (proto names,
/// defaults left out), by filter name.
fn stats_json(t: &ProxyTelemetry, class: ListenerClass, http: bool) -> BTreeMap<String, String> {
    let configs: Vec<(String, Any)> = if http {
        t.http(class)
            .stats
            .iter()
            .map(|f| match &f.config_type {
                Some(http_filter::ConfigType::TypedConfig(a)) => (f.name.clone(), a.clone()),
                _ => unreachable!(),
            })
            .collect()
    } else {
        t.tcp(class)
            .stats
            .iter()
            .map(|f| match &f.config_type {
                Some(filter::ConfigType::TypedConfig(a)) => (f.name.clone(), a.clone()),
                _ => unreachable!(),
            })
            .collect()
    };
    configs
        .into_iter()
        .map(|(name, a)| {
            assert_eq!(a.type_url, "type.googleapis.com/stats.PluginConfig");
            let c = StatsPluginConfig::decode(a.value.as_slice()).unwrap();
            (name, plugin_json(&c))
        })
        .collect()
}

fn plugin_json(c: &StatsPluginConfig) -> String {
    let mut out = serde_json::Map::new();
    if c.disable_host_header_fallback {
        out.insert("disable_host_header_fallback".into(), true.into());
    }
    if !c.metrics.is_empty() {
        let metrics: Vec<serde_json::Value> = c
            .metrics
            .iter()
            .map(|m| {
                let mut o = serde_json::Map::new();
                if !m.dimensions.is_empty() {
                    o.insert("dimensions".into(), serde_json::json!(m.dimensions));
                }
                if m.drop {
                    o.insert("drop".into(), true.into());
                }
                o.insert("name".into(), m.name.clone().into());
                if !m.tags_to_remove.is_empty() {
                    o.insert("tags_to_remove".into(), serde_json::json!(m.tags_to_remove));
                }
                serde_json::Value::Object(o)
            })
            .collect();
        out.insert("metrics".into(), metrics.into());
    }
    if let Some(d) = &c.tcp_reporting_duration {
        out.insert(
            "tcp_reporting_duration".into(),
            format!("{}s", d.seconds).into(),
        );
    }
    serde_json::Value::Object(out).to_string()
}

fn no_lookup(_: &str, _: u32) -> Result<(String, String), String> {
    Err("no services".into())
}

fn build(
    mesh: &MeshConfig,
    cfgs: &[Arc<Config<tel::Telemetry>>],
    namespace: &str,
    labels: &BTreeMap<String, String>,
    router: bool,
) -> ProxyTelemetry {
    ProxyTelemetry::build(
        &MeshInputs {
            mesh,
            telemetries: cfgs,
            lookup: &no_lookup,
        },
        &ProxyFacts {
            namespace,
            labels,
            cluster_id: None,
            router,
        },
    )
}

#[test]
fn istio_telemetry_filter_vectors() {
    let all = |extra: &str| {
        let names = [
            "request_messages_total",
            "response_messages_total",
            "requests_total",
            "request_duration_milliseconds",
            "request_bytes",
            "response_bytes",
            "tcp_connections_closed_total",
            "tcp_connections_opened_total",
            "tcp_received_bytes_total",
            "tcp_sent_bytes_total",
        ];
        let items: Vec<String> = names
            .iter()
            .map(|n| {
                if extra.is_empty() {
                    format!(r#"{{"name":"{n}"}}"#)
                } else {
                    let add = if *n == "requests_total" && extra == "first" {
                        "add-override"
                    } else {
                        "bar"
                    };
                    format!(
                        r#"{{"dimensions":{{"add":"{add}"}},"name":"{n}","tags_to_remove":["remove"]}}"#
                    )
                }
            })
            .collect();
        format!(r#"{{"metrics":[{}]}}"#, items.join(","))
    };
    let cfg = r#"{"metrics":[{"dimensions":{"add":"bar"},"name":"requests_total","tags_to_remove":["remove"]}]}"#;
    let empty_prometheus = "metrics: [{providers: [{name: prometheus}]}]";
    let reenable =
        "metrics: [{providers: [{name: prometheus}], overrides: [{match: {metric: ALL_METRICS}}]}]";
    let overrides_prometheus = format!(
        "metrics: [{{providers: [{{name: prometheus}}], overrides: {}}}]",
        serde_json::to_string(&yaml::<serde_json::Value>(OVERRIDES)).unwrap()
    );
    let reporting = "metrics: [{providers: [{name: prometheus}], reportingInterval: 15s}]";
    let overrides_interval = "metrics: [{providers: [{name: prometheus}], reportingInterval: 10s}]";
    let overrides_empty_provider = format!(
        "metrics: [{{overrides: {}}}]",
        serde_json::to_string(&yaml::<serde_json::Value>(OVERRIDES)).unwrap()
    );
    let disabled_all = "metrics: [{providers: [{name: prometheus}], overrides: [{match: {metric: ALL_METRICS}, disabled: true}]}]";
    let disabled_all_implicit =
        "metrics: [{providers: [{name: prometheus}], overrides: [{disabled: true}]}]";
    let all_overrides = r#"
metrics:
- providers: [{name: prometheus}]
  overrides:
  - tagOverrides: {remove: {operation: REMOVE}, add: {operation: UPSERT, value: bar}}
"#;
    let all_overrides_first = r#"
metrics:
- providers: [{name: prometheus}]
  overrides:
  - tagOverrides: {remove: {operation: REMOVE}, add: {operation: UPSERT, value: bar}}
  - match: {metric: REQUEST_COUNT}
    tagOverrides: {add: {value: add-override}}
"#;
    let all_overrides_secondary = r#"
metrics:
- providers: [{name: prometheus}]
  overrides:
  - match: {metric: REQUEST_COUNT}
    tagOverrides: {add: {value: add-override}}
  - tagOverrides: {remove: {operation: REMOVE}, add: {operation: UPSERT, value: bar}}
"#;
    type Case<'a> = (
        &'a str,
        Vec<(&'a str, String)>,
        bool,
        Vec<&'a str>,
        Option<String>,
    );
    let s = |x: &str| x.to_string();
    let cases: Vec<Case> = vec![
        ("empty", vec![], true, vec![], None),
        (
            "disabled-prometheus",
            vec![("istio-system", s(disabled_all))],
            true,
            vec![],
            None,
        ),
        (
            "disabled-prometheus-implicit",
            vec![("istio-system", s(disabled_all_implicit))],
            true,
            vec![],
            None,
        ),
        (
            "disabled-then-empty",
            vec![
                ("istio-system", s(disabled_all)),
                ("default", s(empty_prometheus)),
            ],
            true,
            vec![],
            None,
        ),
        (
            "disabled-then-reenable",
            vec![("istio-system", s(disabled_all)), ("default", s(reenable))],
            true,
            vec![],
            Some(all("")),
        ),
        (
            "disabled-then-overrides",
            vec![
                ("istio-system", s(disabled_all)),
                ("default", overrides_prometheus.clone()),
            ],
            true,
            vec![],
            Some(s(cfg)),
        ),
        (
            "default prometheus",
            vec![("istio-system", s(empty_prometheus))],
            true,
            vec![],
            Some(s("{}")),
        ),
        (
            "default provider prometheus",
            vec![],
            true,
            vec!["prometheus"],
            Some(s("{}")),
        ),
        (
            "prometheus overrides",
            vec![("istio-system", overrides_prometheus.clone())],
            true,
            vec![],
            Some(s(cfg)),
        ),
        (
            "prometheus overrides all metrics",
            vec![("istio-system", s(all_overrides))],
            true,
            vec![],
            Some(all("bar")),
        ),
        (
            "prometheus overrides all metrics first",
            vec![("istio-system", s(all_overrides_first))],
            true,
            vec![],
            Some(all("first")),
        ),
        (
            "prometheus overrides all metrics secondary",
            vec![("istio-system", s(all_overrides_secondary))],
            true,
            vec![],
            Some(all("bar")),
        ),
        (
            "prometheus overrides TCP",
            vec![("istio-system", overrides_prometheus.clone())],
            false,
            vec![],
            Some(s(cfg)),
        ),
        (
            "reporting-interval",
            vec![("istio-system", s(reporting))],
            true,
            vec![],
            Some(s(r#"{"tcp_reporting_duration":"15s"}"#)),
        ),
        (
            "override-interval",
            vec![
                ("istio-system", s(reporting)),
                ("default", s(overrides_interval)),
            ],
            true,
            vec![],
            Some(s(r#"{"tcp_reporting_duration":"10s"}"#)),
        ),
        (
            "namespace overrides merge without provider",
            vec![
                ("istio-system", s(empty_prometheus)),
                ("default", overrides_empty_provider.clone()),
            ],
            true,
            vec![],
            Some(s(cfg)),
        ),
        (
            "namespace overrides merge with default provider",
            vec![("default", overrides_empty_provider.clone())],
            true,
            vec!["prometheus"],
            Some(s(cfg)),
        ),
    ];
    let mut failed = Vec::new();
    for (name, cfgs, http, defaults, want) in cases {
        let mut mesh = test_mesh();
        mesh.default_providers = Some(meshfed_api::mesh::v1alpha1::mesh_config::DefaultProviders {
            metrics: defaults.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        });
        let cfgs = arcs(cfgs.iter().map(|(ns, spec)| telemetry(ns, spec)).collect());
        let t = build(&mesh, &cfgs, "default", &sidecar_labels(), false);
        let got = stats_json(&t, ListenerClass::SidecarOutbound, http);
        let want: BTreeMap<String, String> = want
            .into_iter()
            .map(|w| (STATS_FILTER.to_string(), w))
            .collect();
        if got != want {
            failed.push(format!("{name}: got {got:?}\n want {want:?}"));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
