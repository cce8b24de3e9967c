//! Istio's vectors for the Telemetry merge and the filters it builds
//! (`pilot/pkg/model/telemetry_test.go`, `telemetry_logging_test.go`,
//! `pilot/pkg/networking/core/tracing_test.go`, `accesslog_test.go`), ported.

// The vector tables are tuples, as Istio's test tables are structs.
#![allow(clippy::type_complexity)]

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

// === TestAccessLogging (telemetry_logging_test.go) ===

#[test]
fn istio_access_logging_vectors() {
    let prometheus = "metrics: [{providers: [{name: envoy}]}]";
    let envoy = "accessLogging: [{providers: [{name: envoy}]}]";
    let client = "accessLogging: [{match: {mode: CLIENT}, providers: [{name: envoy}]}]";
    let client_disabled =
        "accessLogging: [{match: {mode: CLIENT}, providers: [{name: envoy}], disabled: true}]";
    let sidecar_client = "selector: {matchLabels: {app: test}}\naccessLogging: [{match: {mode: CLIENT}, providers: [{name: envoy}]}]";
    let server = "accessLogging: [{match: {mode: SERVER}, providers: [{name: envoy}]}]";
    let server_disabled =
        "accessLogging: [{match: {mode: SERVER}, providers: [{name: envoy}], disabled: true}]";
    let server_and_client =
        "accessLogging: [{match: {mode: CLIENT_AND_SERVER}, providers: [{name: envoy}]}]";
    let stackdriver = "accessLogging: [{providers: [{name: stackdriver}]}]";
    let empty = "accessLogging: [{}]";
    let default_json = "accessLogging: [{providers: [{name: envoy-json}]}]";
    let disabled = "accessLogging: [{disabled: true}]";
    let non_existent = "accessLogging: [{providers: [{name: custom-provider}]}]";
    let multi = "accessLogging: [{providers: [{name: envoy}]}, {providers: [{name: envoy-json}]}]";
    let multi_disabled = "accessLogging: [{providers: [{name: envoy}]}, {providers: [{name: envoy-json}], disabled: true}]";
    let multi_providers = "accessLogging: [{providers: [{name: envoy}, {name: envoy-json}]}, {providers: [{name: envoy}]}]";
    let multi_filters = "accessLogging: [{match: {mode: SERVER}, providers: [{name: envoy}]}, {match: {mode: CLIENT_AND_SERVER}, providers: [{name: envoy}]}]";
    let multi_filters_disabled = "accessLogging: [{match: {mode: SERVER}, providers: [{name: envoy}]}, {match: {mode: CLIENT_AND_SERVER}, providers: [{name: envoy}], disabled: true}]";
    let different = "accessLogging: [{match: {mode: SERVER}, providers: [{name: envoy}]}, {match: {mode: CLIENT}, providers: [{name: envoy-json}]}]";
    let workload_prometheus =
        "selector: {matchLabels: {app: test}}\nmetrics: [{providers: [{name: envoy}]}]";
    use ListenerClass::{Gateway as Gw, SidecarInbound as In, SidecarOutbound as Out};
    type Case<'a> = (
        &'a str,
        Vec<(&'a str, &'a str)>,
        ListenerClass,
        Vec<&'a str>,
        Option<Vec<&'a str>>,
    );
    let cases: Vec<Case> = vec![
        ("empty", vec![], Out, vec![], None),
        (
            "prometheus-mesh",
            vec![("istio-system", prometheus)],
            Out,
            vec![],
            None,
        ),
        (
            "prometheus-namespace",
            vec![("default", prometheus)],
            Out,
            vec![],
            None,
        ),
        (
            "prometheus-workload",
            vec![("default", workload_prometheus)],
            Out,
            vec![],
            None,
        ),
        (
            "default provider only",
            vec![],
            Out,
            vec!["envoy"],
            Some(vec!["envoy"]),
        ),
        (
            "provider only",
            vec![("istio-system", envoy)],
            Out,
            vec![],
            Some(vec!["envoy"]),
        ),
        (
            "client - gateway",
            vec![("istio-system", client)],
            Gw,
            vec![],
            Some(vec!["envoy"]),
        ),
        (
            "client - outbound",
            vec![("istio-system", client)],
            Out,
            vec![],
            Some(vec!["envoy"]),
        ),
        (
            "client - inbound",
            vec![("istio-system", client)],
            In,
            vec![],
            Some(vec![]),
        ),
        (
            "client - disabled server",
            vec![("istio-system", client), ("default", server_disabled)],
            Out,
            vec![],
            Some(vec!["envoy"]),
        ),
        (
            "client - disabled client",
            vec![("istio-system", client), ("default", client_disabled)],
            Out,
            vec![],
            Some(vec![]),
        ),
        (
            "client - disabled - enabled",
            vec![
                ("istio-system", client),
                ("default", client_disabled),
                ("default", sidecar_client),
            ],
            Out,
            vec![],
            Some(vec!["envoy"]),
        ),
        (
            "server - gateway",
            vec![("istio-system", server)],
            Gw,
            vec![],
            Some(vec![]),
        ),
        (
            "server - inbound",
            vec![("istio-system", server)],
            In,
            vec![],
            Some(vec!["envoy"]),
        ),
        (
            "server - outbound",
            vec![("istio-system", server)],
            Out,
            vec![],
            Some(vec![]),
        ),
        (
            "server and client - gateway",
            vec![("istio-system", server_and_client)],
            Gw,
            vec![],
            Some(vec!["envoy"]),
        ),
        (
            "server and client - inbound",
            vec![("istio-system", server_and_client)],
            In,
            vec![],
            Some(vec!["envoy"]),
        ),
        (
            "server and client - outbound",
            vec![("istio-system", server_and_client)],
            Out,
            vec![],
            Some(vec!["envoy"]),
        ),
        (
            "override default",
            vec![("istio-system", envoy)],
            Out,
            vec!["stackdriver"],
            Some(vec!["envoy"]),
        ),
        (
            "override namespace",
            vec![("istio-system", envoy), ("default", default_json)],
            Out,
            vec![],
            Some(vec!["envoy-json"]),
        ),
        (
            "empty config inherits",
            vec![("istio-system", envoy), ("default", empty)],
            Out,
            vec![],
            Some(vec!["envoy"]),
        ),
        (
            "stackdriver",
            vec![("istio-system", envoy), ("default", stackdriver)],
            Out,
            vec![],
            Some(vec![]),
        ),
        (
            "default envoy JSON",
            vec![("istio-system", default_json)],
            Out,
            vec![],
            Some(vec!["envoy-json"]),
        ),
        (
            "disable config",
            vec![("istio-system", envoy), ("default", disabled)],
            Out,
            vec![],
            Some(vec![]),
        ),
        (
            "disable default",
            vec![("default", disabled)],
            Out,
            vec!["envoy"],
            Some(vec![]),
        ),
        (
            "non existing",
            vec![("default", non_existent)],
            Out,
            vec!["envoy"],
            Some(vec![]),
        ),
        (
            "server - multi filters",
            vec![("istio-system", multi_filters)],
            Out,
            vec![],
            Some(vec!["envoy"]),
        ),
        (
            "server - multi filters disabled",
            vec![("istio-system", multi_filters_disabled)],
            Out,
            vec![],
            Some(vec![]),
        ),
        (
            "multi accesslogging",
            vec![("istio-system", envoy), ("default", multi)],
            Out,
            vec![],
            Some(vec!["envoy", "envoy-json"]),
        ),
        (
            "multi accesslogging with disabled",
            vec![("istio-system", envoy), ("default", multi_disabled)],
            Out,
            vec![],
            Some(vec!["envoy"]),
        ),
        (
            "multi accesslogging - multi providers",
            vec![("istio-system", envoy), ("default", multi_providers)],
            Out,
            vec![],
            Some(vec!["envoy", "envoy-json"]),
        ),
        (
            "server and client different - inbound",
            vec![("istio-system", different)],
            In,
            vec![],
            Some(vec!["envoy"]),
        ),
        (
            "server and client different - outbound",
            vec![("istio-system", different)],
            Out,
            vec![],
            Some(vec!["envoy-json"]),
        ),
    ];
    let mut failed = Vec::new();
    let count = cases.len();
    for (name, cfgs, class, defaults, want) in cases {
        let mut mesh = test_mesh();
        mesh.default_providers
            .get_or_insert_default()
            .access_logging = defaults.iter().map(|s| s.to_string()).collect();
        let cfgs = arcs(cfgs.iter().map(|(ns, spec)| telemetry(ns, spec)).collect());
        let a = merge::applicable(&cfgs, "istio-system", "default", &sidecar_labels());
        let got = (!a.logging.is_empty() || !defaults.is_empty()).then(|| {
            super::telemetry_logs(&a.logging, &mesh, &Providers::new(&mesh), class, &no_lookup)
                .into_iter()
                .filter(|e| !e.spec.disabled)
                .map(|e| e.name)
                .collect::<Vec<_>>()
        });
        let want: Option<Vec<String>> = want.map(|w| w.into_iter().map(str::to_string).collect());
        if got != want {
            failed.push(format!("{name}: got {got:?} want {want:?}"));
        }
    }
    assert_eq!(count, 33, "ported case count");
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

// === TestAccessLoggingWithFilter (telemetry_logging_test.go) ===

fn file_config(
    log: &envoy_types::pb::envoy::config::accesslog::v3::AccessLog,
) -> envoy_types::pb::envoy::extensions::access_loggers::file::v3::FileAccessLog {
    use envoy_types::pb::envoy::config::accesslog::v3::access_log::ConfigType;
    let Some(ConfigType::TypedConfig(any)) = &log.config_type else {
        panic!("no config")
    };
    envoy_types::pb::envoy::extensions::access_loggers::file::v3::FileAccessLog::decode(
        any.value.as_slice(),
    )
    .unwrap()
}

fn default_json_labels_out()
-> envoy_types::pb::envoy::extensions::access_loggers::file::v3::FileAccessLog {
    use envoy_types::pb::envoy::config::core::v3::{
        JsonFormatOptions, SubstitutionFormatString, substitution_format_string,
    };
    use envoy_types::pb::envoy::extensions::access_loggers::file::v3::{
        FileAccessLog, file_access_log,
    };
    #[allow(deprecated)]
    let format = SubstitutionFormatString {
        format: Some(substitution_format_string::Format::JsonFormat(
            access_log::default_json_struct(),
        )),
        json_format_options: Some(JsonFormatOptions {
            sort_properties: false,
        }),
        ..Default::default()
    };
    FileAccessLog {
        path: "/dev/stdout".into(),
        access_log_format: Some(file_access_log::AccessLogFormat::LogFormat(format)),
    }
}

#[test]
fn istio_access_logging_with_filter_vectors() {
    let code400 = "accessLogging: [{providers: [{name: envoy-json}], filter: {expression: 'response.code >= 400'}}]";
    let code500 = "accessLogging: [{providers: [{name: envoy-json}], filter: {expression: 'response.code >= 500'}}]";
    let multi = "accessLogging: [{providers: [{name: envoy-json}], filter: {expression: 'response.code >= 500'}}, {providers: [{name: envoy-json}], filter: {expression: 'response.code >= 400'}}]";
    let multi_nil = "accessLogging: [{providers: [{name: envoy-json}], filter: {expression: 'response.code >= 500'}}, {providers: [{name: envoy-json}]}]";
    let cases: Vec<(&str, Vec<(&str, &str)>, Option<&str>)> = vec![
        (
            "filter",
            vec![("default", code400)],
            Some("response.code >= 400"),
        ),
        (
            "namespace-filter",
            vec![("istio-system", code400), ("default", code500)],
            Some("response.code >= 500"),
        ),
        (
            "multi-accesslogging",
            vec![("default", multi)],
            Some("response.code >= 400"),
        ),
        (
            "multi-accesslogging-nil",
            vec![("default", multi_nil)],
            None,
        ),
    ];
    for (name, cfgs, want) in cases {
        let mut mesh = test_mesh();
        mesh.default_providers
            .get_or_insert_default()
            .access_logging = vec!["envoy".into()];
        let cfgs = arcs(cfgs.iter().map(|(ns, spec)| telemetry(ns, spec)).collect());
        let a = merge::applicable(&cfgs, "istio-system", "default", &sidecar_labels());
        let got = super::telemetry_logs(
            &a.logging,
            &mesh,
            &Providers::new(&mesh),
            ListenerClass::SidecarOutbound,
            &no_lookup,
        );
        assert_eq!(got.len(), 1, "{name}");
        assert_eq!(got[0].name, "envoy-json", "{name}");
        assert_eq!(
            file_config(&got[0].log),
            default_json_labels_out(),
            "{name}"
        );
        assert_eq!(
            got[0].spec.filter.as_ref().map(|f| f.expression.as_str()),
            want,
            "{name}"
        );
        // The built connection manager log carries the CEL filter.
        let t = build(&mesh, &cfgs, "default", &sidecar_labels(), false);
        let log = &t.http(ListenerClass::SidecarOutbound).access_log[0];
        assert_eq!(log.filter.is_some(), want.is_some(), "{name}");
    }
}

// === TestBuildOpenTelemetryAccessLogConfig, TestTelemetryAccessLog ===

fn provider(
    yaml_text: &str,
) -> (
    String,
    meshfed_api::mesh::v1alpha1::mesh_config::extension_provider::Provider,
) {
    let p: meshfed_api::mesh::v1alpha1::mesh_config::ExtensionProvider = yaml(yaml_text);
    (p.name, p.provider.unwrap())
}

fn grpc_lookup(_: &str, _: u32) -> Result<(String, String), String> {
    Ok((
        "grpc-als.foo.svc.cluster.local".into(),
        "outbound|9811||grpc-als.foo.svc.cluster.local".into(),
    ))
}

fn typed<M: Message + Default>(
    log: &envoy_types::pb::envoy::config::accesslog::v3::AccessLog,
) -> M {
    use envoy_types::pb::envoy::config::accesslog::v3::access_log::ConfigType;
    let Some(ConfigType::TypedConfig(any)) = &log.config_type else {
        panic!("no config")
    };
    M::decode(any.value.as_slice()).unwrap()
}

fn text_out(
    path: &str,
    text: &str,
) -> envoy_types::pb::envoy::extensions::access_loggers::file::v3::FileAccessLog {
    use envoy_types::pb::envoy::config::core::v3::{
        DataSource, SubstitutionFormatString, data_source, substitution_format_string,
    };
    use envoy_types::pb::envoy::extensions::access_loggers::file::v3::{
        FileAccessLog, file_access_log,
    };
    FileAccessLog {
        path: path.into(),
        access_log_format: Some(file_access_log::AccessLogFormat::LogFormat(
            SubstitutionFormatString {
                format: Some(substitution_format_string::Format::TextFormatSource(
                    DataSource {
                        specifier: Some(data_source::Specifier::InlineString(text.into())),
                        ..Default::default()
                    },
                )),
                ..Default::default()
            },
        )),
    }
}

#[test]
fn istio_telemetry_access_log_vectors() {
    use envoy_types::pb::envoy::extensions::access_loggers::file::v3::FileAccessLog;
    use envoy_types::pb::envoy::extensions::access_loggers::grpc::v3::{
        HttpGrpcAccessLogConfig, TcpGrpcAccessLogConfig,
    };
    use envoy_types::pb::envoy::extensions::access_loggers::open_telemetry::v3::OpenTelemetryAccessLogConfig;
    let text_mesh = MeshConfig::default();
    let custom = "%LOCAL_REPLY_BODY%:%RESPONSE_CODE%:path=%REQ(:path)%";
    // stdout, stderr, custom-text
    for (p, path, text) in [
        (
            "{name: stdout, envoyFileAccessLog: {path: /dev/stdout}}",
            "/dev/stdout",
            access_log::TEXT_FORMAT.to_string(),
        ),
        (
            "{name: stderr, envoyFileAccessLog: {path: /dev/stderr}}",
            "/dev/stderr",
            access_log::TEXT_FORMAT.to_string(),
        ),
        (
            "{name: custom-text, envoyFileAccessLog: {path: /dev/stdout, logFormat: {text: '%LOCAL_REPLY_BODY%:%RESPONSE_CODE%:path=%REQ(:path)%'}}}",
            "/dev/stdout",
            format!("{custom}\n"),
        ),
    ] {
        let (name, kind) = provider(p);
        let log = access_log::provider_log(&name, &kind, &text_mesh, &grpc_lookup).unwrap();
        assert_eq!(log.name, "envoy.access_loggers.file");
        assert_eq!(
            typed::<FileAccessLog>(&log),
            text_out(path, &text),
            "{name}"
        );
    }
    // default-labels: empty labels are Istio's default JSON.
    let (name, kind) = provider(
        "{name: envoy-json, envoyFileAccessLog: {path: /dev/stdout, logFormat: {labels: {}}}}",
    );
    let log = access_log::provider_log(&name, &kind, &text_mesh, &grpc_lookup).unwrap();
    assert_eq!(typed::<FileAccessLog>(&log), default_json_labels_out());
    // custom-labels: the labels as given.
    let (name, kind) = provider(
        "{name: custom-label, envoyFileAccessLog: {path: /dev/stdout, logFormat: {labels: {protocol: '%PROTOCOL%', upstream_cluster: '%UPSTREAM_CLUSTER%'}}}}",
    );
    let log = access_log::provider_log(&name, &kind, &text_mesh, &grpc_lookup).unwrap();
    let got = typed::<FileAccessLog>(&log);
    let mut want = default_json_labels_out();
    if let Some(envoy_types::pb::envoy::extensions::access_loggers::file::v3::file_access_log::AccessLogFormat::LogFormat(f)) = want.access_log_format.as_mut() {
        f.format = Some(envoy_types::pb::envoy::config::core::v3::substitution_format_string::Format::JsonFormat(
            access_log::json_struct(r#"{"protocol":"%PROTOCOL%","upstream_cluster":"%UPSTREAM_CLUSTER%"}"#).unwrap(),
        ));
    }
    assert_eq!(got, want);
    // otel: body is Istio's text format, labels become sorted attributes.
    let (name, kind) = provider(
        "{name: otel_envoy_accesslog, envoyOtelAls: {service: otel.foo.svc.cluster.local, port: 9811, logFormat: {labels: {start_time: '%START_TIME%', protocol: '%PROTOCOL%'}}}}",
    );
    let log = access_log::provider_log(&name, &kind, &text_mesh, &grpc_lookup).unwrap();
    assert_eq!(log.name, "envoy.access_loggers.open_telemetry");
    let otel = typed::<OpenTelemetryAccessLogConfig>(&log);
    #[allow(deprecated)]
    let common = otel.common_config.clone().unwrap();
    assert_eq!(common.log_name, "otel_envoy_accesslog");
    assert_eq!(common.filter_state_objects_to_log.len(), 6);
    assert!(otel.disable_builtin_labels);
    let keys: Vec<&str> = otel
        .attributes
        .as_ref()
        .unwrap()
        .values
        .iter()
        .map(|k| k.key.as_str())
        .collect();
    assert_eq!(keys, ["protocol", "start_time"]);
    assert!(matches!(
        otel.body.as_ref().and_then(|b| b.value.as_ref()),
        Some(envoy_types::pb::opentelemetry::proto::common::v1::any_value::Value::StringValue(s)) if s == access_log::TEXT_FORMAT
    ));
    // grpc-http, grpc-tcp
    let (name, kind) = provider(
        "{name: grpc-http-als, envoyHttpAls: {logName: grpc-http-als, service: grpc-als.foo.svc.cluster.local, port: 9811, additionalRequestHeadersToLog: [fake-request-header1], additionalResponseHeadersToLog: [fake-response-header1], additionalResponseTrailersToLog: [fake-response-trailer1], filterStateObjectsToLog: [fake-filter-state-object1, fake-filter-state-object1]}}",
    );
    let log = access_log::provider_log(&name, &kind, &text_mesh, &grpc_lookup).unwrap();
    assert_eq!(log.name, "envoy.access_loggers.http_grpc");
    let http = typed::<HttpGrpcAccessLogConfig>(&log);
    let c = http.common_config.unwrap();
    assert_eq!(c.log_name, "grpc-http-als");
    assert_eq!(
        c.filter_state_objects_to_log,
        ["fake-filter-state-object1", "fake-filter-state-object1"]
    );
    assert_eq!(
        http.additional_response_trailers_to_log,
        ["fake-response-trailer1"]
    );
    let (name, kind) = provider(
        "{name: grpc-tcp-als, envoyTcpAls: {logName: grpc-tcp-als, service: grpc-als.foo.svc.cluster.local, port: 9811, filterStateObjectsToLog: [a]}}",
    );
    let log = access_log::provider_log(&name, &kind, &text_mesh, &grpc_lookup).unwrap();
    assert_eq!(log.name, "envoy.tcp_grpc_access_log");
    let tcp = typed::<TcpGrpcAccessLogConfig>(&log);
    let c = tcp.common_config.unwrap();
    assert_eq!(c.log_name, "grpc-tcp-als");
    match c.grpc_service.unwrap().target_specifier.unwrap() {
        envoy_types::pb::envoy::config::core::v3::grpc_service::TargetSpecifier::EnvoyGrpc(g) => {
            assert_eq!(
                g.cluster_name,
                "outbound|9811||grpc-als.foo.svc.cluster.local"
            );
            assert_eq!(g.authority, "grpc-als.foo.svc.cluster.local");
        }
        other => panic!("{other:?}"),
    }
    // builtin-fallback: the built-in `envoy` provider follows the mesh's JSON format.
    let json_mesh = MeshConfig {
        access_log_encoding: meshfed_api::mesh::v1alpha1::mesh_config::AccessLogEncoding::Json
            as i32,
        access_log_format: serde_json::to_string(&serde_json::Value::Object(
            access_log::JSON_FIELDS
                .iter()
                .map(|(k, v)| (k.to_string(), serde_json::Value::String(v.to_string())))
                .collect(),
        ))
        .unwrap(),
        ..Default::default()
    };
    let (name, kind) = provider("{name: envoy, envoyFileAccessLog: {path: /dev/stdout}}");
    let log = access_log::provider_log(&name, &kind, &json_mesh, &grpc_lookup).unwrap();
    assert_eq!(typed::<FileAccessLog>(&log), default_json_labels_out());
    // builtin-not-fallback: with a format of its own it does not.
    let (name, kind) = provider(
        "{name: envoy, envoyFileAccessLog: {path: /dev/stdout, logFormat: {text: '%LOCAL_REPLY_BODY%:%RESPONSE_CODE%:path=%REQ(:path)%'}}}",
    );
    let log = access_log::provider_log(&name, &kind, &json_mesh, &grpc_lookup).unwrap();
    assert_eq!(
        typed::<FileAccessLog>(&log),
        text_out("/dev/stdout", &format!("{custom}\n"))
    );
}
// touch

#[test]
fn equal_config_encodes_to_equal_bytes() {
    let mut mesh = test_mesh();
    mesh.access_log_file = "/dev/stdout".into();
    mesh.access_log_encoding =
        meshfed_api::mesh::v1alpha1::mesh_config::AccessLogEncoding::Json as i32;
    mesh.access_log_format =
        r#"{"a":"%PROTOCOL%","b":"%START_TIME%","c":{"d":"%DURATION%"}}"#.into();
    let encode = || {
        let t = build(&mesh, &[], "default", &sidecar_labels(), false);
        let h = t.http(ListenerClass::SidecarOutbound);
        (
            h.access_log[0].encode_to_vec(),
            h.metadata_exchange.as_ref().unwrap().encode_to_vec(),
        )
    };
    let first = encode();
    for _ in 0..20 {
        assert_eq!(encode(), first);
    }
}

// === TestConfigureTracing (networking/core/tracing_test.go) ===

fn cluster_lookup(_: &str, _: u32) -> Result<(String, String), String> {
    Ok(("testhost".into(), "testcluster".into()))
}

/// The proxy of Istio's tests: no labels, no metadata.
fn bare_tags() -> super::tracing::ProxyTags {
    super::tracing::ProxyTags {
        canonical_service: "unknown".into(),
        canonical_revision: "latest".into(),
        mesh_id: "unknown".into(),
        namespace: "default".into(),
        cluster_id: "unknown".into(),
        service_cluster: "fake-cluster".into(),
        router: false,
    }
}

fn tracing_spec(
    provider: Option<&str>,
    sampling: f64,
    use_request_id: bool,
    istio_tags: bool,
) -> TracingConfig {
    let s = TracingSpec {
        provider: provider.map(yaml),
        disabled: false,
        random_sampling_percentage: Some(sampling),
        custom_tags: None,
        use_request_id_for_trace_sampling: use_request_id,
        enable_istio_tags: istio_tags,
    };
    TracingConfig {
        client: s.clone(),
        server: s,
    }
}

const ZIPKIN: &str = "{name: foo, zipkin: {service: zipkin, port: 9411, maxTagLength: 256}}";
const PROXY_TRACING: &str = "tracing: {sampling: 55.55, maxPathTagLength: 13, customTags: {test: {environment: {name: FOO}}}}";

fn tracing_mesh(enable: bool, providers: &[&str], proxy: Option<&str>) -> MeshConfig {
    MeshConfig {
        enable_tracing: enable,
        extension_providers: providers.iter().map(|p| yaml(p)).collect(),
        default_config: proxy.map(yaml),
        ..Default::default()
    }
}

/// What a test looks at: the provider (name and decoded config), sampling, max path
/// length, tag names, spawn upstream span, and the request id extension's sampling flag.
#[derive(Debug, PartialEq)]
struct Seen {
    provider: Option<String>,
    random: f64,
    max_path: Option<u32>,
    tags: Vec<String>,
    spawn: bool,
    uuid_sampling: bool,
}

fn seen(t: &super::tracing::HcmTracing) -> Option<Seen> {
    use envoy_types::pb::envoy::extensions::request_id::uuid::v3::UuidRequestIdConfig;
    let tr = t.tracing.as_ref()?;
    let uuid = UuidRequestIdConfig::decode(
        t.request_id_extension
            .as_ref()
            .unwrap()
            .typed_config
            .as_ref()
            .unwrap()
            .value
            .as_slice(),
    )
    .unwrap();
    assert_eq!(tr.client_sampling.as_ref().unwrap().value, 100.0);
    assert_eq!(tr.overall_sampling.as_ref().unwrap().value, 100.0);
    Some(Seen {
        provider: tr.provider.as_ref().map(|p| p.name.clone()),
        random: tr.random_sampling.as_ref().unwrap().value,
        max_path: tr.max_path_tag_length.as_ref().map(|v| v.value),
        tags: tr.custom_tags.iter().map(|t| t.tag.clone()).collect(),
        spawn: tr.spawn_upstream_span.as_ref().is_some_and(|b| b.value),
        uuid_sampling: uuid.use_request_id_for_trace_sampling.unwrap().value,
    })
}

fn default_tags(extra: &[&str]) -> Vec<String> {
    let mut tags: Vec<String> = [
        "istio.authorization.dry_run.allow_policy.name",
        "istio.authorization.dry_run.allow_policy.result",
        "istio.authorization.dry_run.deny_policy.name",
        "istio.authorization.dry_run.deny_policy.result",
        "istio.canonical_revision",
        "istio.canonical_service",
        "istio.cluster_id",
        "istio.mesh_id",
        "istio.namespace",
    ]
    .iter()
    .chain(extra)
    .map(|s| s.to_string())
    .collect();
    tags.sort();
    tags
}

fn expect(
    provider: Option<&str>,
    random: f64,
    max_path: Option<u32>,
    tags: Vec<String>,
    uuid_sampling: bool,
) -> Option<Seen> {
    Some(Seen {
        provider: provider.map(str::to_string),
        random,
        max_path,
        tags,
        spawn: provider == Some("envoy.tracers.skywalking"),
        uuid_sampling,
    })
}

#[test]
fn istio_configure_tracing_vectors() {
    let server = ListenerClass::SidecarInbound;
    let zipkin = Some("envoy.tracers.zipkin");
    let skywalking = "{name: foo, skywalking: {service: skywalking-oap.istio-system.svc.cluster.local, port: 11800}}";
    let otel_grpc = "{name: opentelemetry, opentelemetry: {service: otel-collector, port: 4317, maxTagLength: 256}}";
    let otel_http = "{name: opentelemetry, opentelemetry: {service: my-o11y-backend, port: 443, maxTagLength: 256, http: {path: /v1/traces, timeout: 3s, headers: [{name: custom-header, value: custom-value}]}}}";
    let otel_metadata = "{name: opentelemetry, opentelemetry: {service: tracing.example.com, port: 8090, maxTagLength: 256, grpc: {timeout: 3s, initialMetadata: [{name: Authentication, value: token-xxxxx}]}}}";
    let datadog = "{name: datadog, datadog: {service: datadog, port: 8126, maxTagLength: 256}}";
    let zipkin_path = "{name: foo, zipkin: {service: zipkin, port: 9411, maxTagLength: 256, path: /custom/path/api/v2/spans}}";
    let zipkin_64 = "{name: foo, zipkin: {service: zipkin, port: 9411, maxTagLength: 256, enable64bitTraceId: true}}";
    let mut default_providers = tracing_spec(Some(ZIPKIN), 55.5, false, true);
    default_providers.client.disabled = true;
    // Istio's client-only and server-only specs: useRequestIdForTraceSampling false,
    // Istio tags on.
    let mut client_only = tracing_spec(Some(skywalking), 99.999, false, true);
    client_only.server.disabled = true;
    let mut server_only = tracing_spec(Some(skywalking), 99.999, false, true);
    server_only.client.disabled = true;
    let env = |extra: bool| {
        if extra {
            default_tags(&["test"])
        } else {
            default_tags(&[])
        }
    };
    let cases: Vec<(&str, Option<TracingConfig>, MeshConfig, Option<Seen>)> = vec![
        (
            "no telemetry api",
            None,
            tracing_mesh(true, &[], Some(PROXY_TRACING)),
            expect(None, 55.55, Some(13), env(true), true),
        ),
        (
            "default providers",
            Some(default_providers),
            tracing_mesh(false, &[ZIPKIN], None),
            expect(zipkin, 55.5, Some(256), env(false), false),
        ),
        (
            "no telemetry api and nil custom tag",
            None,
            tracing_mesh(
                true,
                &[],
                Some("tracing: {sampling: 55.55, maxPathTagLength: 13, customTags: {test: {}}}"),
            ),
            expect(None, 55.55, Some(13), env(false), true),
        ),
        (
            "only telemetry api (no provider)",
            Some(tracing_spec(None, 99.999, true, true)),
            tracing_mesh(
                false,
                &[ZIPKIN],
                Some("tracing: {customTags: {test: {environment: {name: FOO}}}}"),
            ),
            expect(None, 99.999, None, env(true), true),
        ),
        (
            "only telemetry api (no provider) and disabled istio tags",
            Some(tracing_spec(None, 99.999, true, false)),
            tracing_mesh(
                false,
                &[ZIPKIN],
                Some("tracing: {customTags: {test: {environment: {name: FOO}}}}"),
            ),
            expect(None, 99.999, None, vec!["test".into()], true),
        ),
        (
            "only telemetry api (no provider) with nil custom tag",
            Some(tracing_spec(None, 99.999, true, true)),
            tracing_mesh(false, &[ZIPKIN], Some("tracing: {customTags: {test: {}}}")),
            expect(None, 99.999, None, env(false), true),
        ),
        (
            "only telemetry api (with provider)",
            Some(tracing_spec(Some(ZIPKIN), 99.999, true, true)),
            tracing_mesh(
                false,
                &[ZIPKIN],
                Some("tracing: {customTags: {test: {environment: {name: FOO}}}}"),
            ),
            expect(zipkin, 99.999, Some(256), env(true), true),
        ),
        (
            "zipkin enable 64bit trace id",
            Some(tracing_spec(Some(zipkin_64), 99.999, true, true)),
            tracing_mesh(
                false,
                &[zipkin_64],
                Some("tracing: {customTags: {test: {environment: {name: FOO}}}}"),
            ),
            expect(zipkin, 99.999, Some(256), env(true), true),
        ),
        (
            "both tracing enabled (no provider)",
            Some(tracing_spec(None, 99.999, true, true)),
            tracing_mesh(true, &[ZIPKIN], Some(PROXY_TRACING)),
            expect(None, 99.999, Some(13), env(true), true),
        ),
        (
            "both tracing disabled (no provider)",
            Some(tracing_spec(None, 99.999, true, true)),
            tracing_mesh(false, &[ZIPKIN], Some(PROXY_TRACING)),
            expect(None, 99.999, Some(13), env(true), true),
        ),
        (
            "both tracing enabled (with provider)",
            Some(tracing_spec(Some(ZIPKIN), 99.999, true, true)),
            tracing_mesh(true, &[ZIPKIN], Some(PROXY_TRACING)),
            expect(zipkin, 99.999, Some(256), env(true), true),
        ),
        (
            "both tracing disabled (with provider)",
            Some(tracing_spec(Some(ZIPKIN), 99.999, true, true)),
            tracing_mesh(false, &[ZIPKIN], Some(PROXY_TRACING)),
            expect(zipkin, 99.999, Some(256), env(true), true),
        ),
        (
            "basic config (with datadog provider)",
            Some(tracing_spec(Some(datadog), 99.999, true, true)),
            tracing_mesh(
                false,
                &[datadog],
                Some("tracing: {customTags: {test: {environment: {name: FOO}}}}"),
            ),
            expect(
                Some("envoy.tracers.datadog"),
                99.999,
                Some(256),
                env(true),
                true,
            ),
        ),
        (
            "basic config (with skywalking provider)",
            Some(tracing_spec(Some(skywalking), 99.999, false, true)),
            tracing_mesh(
                false,
                &[skywalking],
                Some("tracing: {customTags: {test: {environment: {name: FOO}}}}"),
            ),
            expect(
                Some("envoy.tracers.skywalking"),
                99.999,
                None,
                env(true),
                false,
            ),
        ),
        (
            "basic config (with opentelemetry provider via grpc)",
            Some(tracing_spec(Some(otel_grpc), 99.999, true, true)),
            tracing_mesh(
                false,
                &[otel_grpc],
                Some("tracing: {customTags: {test: {environment: {name: FOO}}}}"),
            ),
            expect(
                Some("envoy.tracers.opentelemetry"),
                99.999,
                Some(256),
                env(true),
                true,
            ),
        ),
        (
            "basic config (with opentelemetry provider via http)",
            Some(tracing_spec(Some(otel_http), 99.999, true, true)),
            tracing_mesh(
                false,
                &[otel_http],
                Some("tracing: {customTags: {test: {environment: {name: FOO}}}}"),
            ),
            expect(
                Some("envoy.tracers.opentelemetry"),
                99.999,
                Some(256),
                env(true),
                true,
            ),
        ),
        (
            "client-only config for server",
            Some(client_only),
            tracing_mesh(false, &[skywalking], None),
            None,
        ),
        (
            "server-only config for skywalking server",
            Some(server_only),
            tracing_mesh(
                false,
                &[skywalking],
                Some("tracing: {customTags: {test: {environment: {name: FOO}}}}"),
            ),
            expect(
                Some("envoy.tracers.skywalking"),
                99.999,
                None,
                default_tags(&["test"]),
                false,
            ),
        ),
        (
            "invalid provider",
            Some(tracing_spec(
                Some("{name: foo, prometheus: {}}"),
                99.999,
                true,
                true,
            )),
            tracing_mesh(true, &[ZIPKIN], Some(PROXY_TRACING)),
            None,
        ),
        (
            "basic config (with opentelemetry provider via grpc with initial metadata)",
            Some(tracing_spec(Some(otel_metadata), 99.999, true, true)),
            tracing_mesh(
                false,
                &[otel_metadata],
                Some("tracing: {customTags: {test: {environment: {name: FOO}}}}"),
            ),
            expect(
                Some("envoy.tracers.opentelemetry"),
                99.999,
                Some(256),
                env(true),
                true,
            ),
        ),
        (
            "only telemetry api (with provider, custom zipkin path)",
            Some(tracing_spec(Some(zipkin_path), 99.999, true, true)),
            tracing_mesh(
                false,
                &[zipkin_path],
                Some("tracing: {customTags: {test: {environment: {name: FOO}}}}"),
            ),
            expect(zipkin, 99.999, Some(256), env(true), true),
        ),
    ];
    assert_eq!(cases.len(), 21);
    let mut failed = Vec::new();
    for (name, spec, mesh, want) in cases {
        let got = super::tracing::hcm_tracing(
            spec.as_ref(),
            &mesh,
            server,
            &bare_tags(),
            &cluster_lookup,
        );
        // Every answer carries a request id extension.
        assert!(got.request_id_extension.is_some(), "{name}");
        let got = seen(&got);
        if got != want {
            failed.push(format!("{name}: got {got:?}\n want {want:?}"));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

#[test]
fn tracing_providers_are_built_as_istio_builds_them() {
    use envoy_types::pb::envoy::config::trace::v3::{
        DatadogConfig, OpenTelemetryConfig, ZipkinConfig, tracing::http::ConfigType,
    };
    let provider_config = |p: &str, mesh: &MeshConfig| {
        let spec = tracing_spec(Some(p), 10.0, true, true);
        let t = super::tracing::hcm_tracing(
            Some(&spec),
            mesh,
            ListenerClass::SidecarOutbound,
            &bare_tags(),
            &cluster_lookup,
        );
        match t.tracing.unwrap().provider.unwrap().config_type.unwrap() {
            ConfigType::TypedConfig(a) => a,
        }
    };
    let mesh = MeshConfig::default();
    // Zipkin: the collector's cluster and host, /api/v2/spans, 128-bit ids, JSON v2.
    let z = ZipkinConfig::decode(provider_config(ZIPKIN, &mesh).value.as_slice()).unwrap();
    assert_eq!(
        (z.collector_cluster.as_str(), z.collector_hostname.as_str()),
        ("testcluster", "testhost")
    );
    assert_eq!(z.collector_endpoint, "/api/v2/spans");
    assert!(z.trace_id_128bit);
    assert_eq!(
        z.shared_span_context,
        Some(envoy_types::pb::google::protobuf::BoolValue { value: false })
    );
    let z64 = ZipkinConfig::decode(
        provider_config("{name: foo, zipkin: {service: zipkin, port: 9411, enable64bitTraceId: true, path: /custom/path/api/v2/spans}}", &mesh).value.as_slice(),
    )
    .unwrap();
    assert!(!z64.trace_id_128bit);
    assert_eq!(z64.collector_endpoint, "/custom/path/api/v2/spans");
    // Datadog: the proxy's service cluster as the service name.
    let d = DatadogConfig::decode(
        provider_config(
            "{name: datadog, datadog: {service: datadog, port: 8126}}",
            &mesh,
        )
        .value
        .as_slice(),
    )
    .unwrap();
    assert_eq!(d.service_name, "fake-cluster");
    // OpenTelemetry over HTTP: the collector host joined with the path, headers set.
    let o = OpenTelemetryConfig::decode(
        provider_config("{name: otel, opentelemetry: {service: my-o11y-backend, port: 443, http: {path: /v1/traces, timeout: 3s, headers: [{name: custom-header, value: custom-value}]}}}", &mesh).value.as_slice(),
    )
    .unwrap();
    let http = o.http_service.unwrap();
    assert_eq!(http.http_uri.as_ref().unwrap().uri, "testhost/v1/traces");
    assert_eq!(http.http_uri.as_ref().unwrap().timeout.unwrap().seconds, 3);
    assert_eq!(
        http.request_headers_to_add[0].header.as_ref().unwrap().key,
        "custom-header"
    );
    // ... and over gRPC with initial metadata.
    let o = OpenTelemetryConfig::decode(
        provider_config("{name: otel, opentelemetry: {service: tracing.example.com, port: 8090, grpc: {timeout: 3s, initialMetadata: [{name: Authentication, value: token-xxxxx}]}}}", &mesh).value.as_slice(),
    )
    .unwrap();
    let g = o.grpc_service.unwrap();
    assert_eq!(g.initial_metadata[0].key, "Authentication");
    assert_eq!(g.initial_metadata[0].value, "token-xxxxx");
    assert_eq!(o.service_name, "fake-cluster");
}

#[test]
fn listeners_get_filters_logs_and_tracing_where_istio_puts_them() {
    use envoy_types::pb::envoy::config::core::v3::TrafficDirection;
    use envoy_types::pb::envoy::config::listener::v3::{FilterChain, Listener};
    use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
    let hcm = HttpConnectionManager {
        http_filters: vec![
            HttpFilter {
                name: "envoy.filters.http.rbac".into(),
                ..Default::default()
            },
            HttpFilter {
                name: "envoy.filters.http.router".into(),
                config_type: Some(http_filter::ConfigType::TypedConfig(
                    any(&Router::default()),
                )),
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    let hcm_filter = Filter {
        name: HCM_FILTER.into(),
        config_type: Some(filter::ConfigType::TypedConfig(any(&hcm))),
    };
    let tcp_filter = Filter {
        name: TCP_PROXY_FILTER.into(),
        config_type: Some(filter::ConfigType::TypedConfig(any(&TcpProxy::default()))),
    };
    let listener = |name: &str, direction: TrafficDirection| Listener {
        name: name.into(),
        traffic_direction: direction as i32,
        filter_chains: vec![
            FilterChain {
                filters: vec![hcm_filter.clone()],
                ..Default::default()
            },
            FilterChain {
                filters: vec![
                    Filter {
                        name: "envoy.filters.network.rbac".into(),
                        config_type: None,
                    },
                    tcp_filter.clone(),
                ],
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    let mut mesh = test_mesh();
    mesh.access_log_file = "/dev/stdout".into();
    let t = build(&mesh, &[], "default", &sidecar_labels(), false);
    let mut listeners = vec![
        listener("virtualInbound", TrafficDirection::Inbound),
        listener("0.0.0.0_8080", TrafficDirection::Outbound),
    ];
    t.apply_to_listeners(&mut listeners, false);
    let names = |chain: &FilterChain| {
        chain
            .filters
            .iter()
            .map(|f| f.name.clone())
            .collect::<Vec<_>>()
    };
    let http_names = |chain: &FilterChain| {
        let h = HttpConnectionManager::decode(
            super::typed(chain.filters.last().unwrap())
                .unwrap()
                .value
                .as_slice(),
        )
        .unwrap();
        (
            h.http_filters
                .iter()
                .map(|f| f.name.clone())
                .collect::<Vec<_>>(),
            h,
        )
    };
    // Inbound: metadata exchange first on every chain, stats before the TCP proxy.
    let inbound = &listeners[0];
    assert_eq!(names(&inbound.filter_chains[0]), [MX_FILTER, HCM_FILTER]);
    assert_eq!(
        names(&inbound.filter_chains[1]),
        [
            MX_FILTER,
            "envoy.filters.network.rbac",
            STATS_FILTER,
            TCP_PROXY_FILTER
        ]
    );
    let (filters, h) = http_names(&inbound.filter_chains[0]);
    assert_eq!(
        filters,
        [
            MX_FILTER,
            "envoy.filters.http.rbac",
            STATS_FILTER,
            "envoy.filters.http.router"
        ]
    );
    assert_eq!(h.access_log.len(), 1);
    assert!(h.tracing.is_some(), "enableTracing is on by default");
    assert!(h.request_id_extension.is_some());
    assert_eq!(
        inbound.access_log.len(),
        1,
        "listener-level log on the capture listener"
    );
    let tcp = TcpProxy::decode(
        super::typed(inbound.filter_chains[1].filters.last().unwrap())
            .unwrap()
            .value
            .as_slice(),
    )
    .unwrap();
    assert_eq!(tcp.access_log.len(), 1);
    // Outbound: no metadata exchange network filter (the cluster does it); the
    // listener-level log is on every listener.
    let outbound = &listeners[1];
    assert_eq!(names(&outbound.filter_chains[0]), [HCM_FILTER]);
    assert_eq!(
        names(&outbound.filter_chains[1]),
        ["envoy.filters.network.rbac", STATS_FILTER, TCP_PROXY_FILTER]
    );
    assert_eq!(outbound.access_log.len(), 1);
    // The inbound stats config differs from the outbound one (host header fallback).
    let stats = |chain: &FilterChain| {
        StatsPluginConfig::decode(
            super::typed(&chain.filters[chain.filters.len() - 2])
                .unwrap()
                .value
                .as_slice(),
        )
        .unwrap()
    };
    assert!(stats(&inbound.filter_chains[1]).disable_host_header_fallback);
    assert!(!stats(&outbound.filter_chains[1]).disable_host_header_fallback);
}

// === accesslog_test.go (networking/core) ===

#[test]
fn istio_listener_access_log_vectors() {
    use envoy_types::pb::envoy::config::core::v3::substitution_format_string::Format;
    use envoy_types::pb::envoy::extensions::access_loggers::file::v3::{
        FileAccessLog, file_access_log,
    };
    use meshfed_api::mesh::v1alpha1::mesh_config::AccessLogEncoding::{Json, Text};
    let default_json = access_log::default_json_struct();
    let cases = [
        (
            "valid json object",
            Json,
            r#"{"foo": "bar"}"#,
            Some(access_log::json_struct(r#"{"foo":"bar"}"#).unwrap()),
            None,
        ),
        (
            "valid nested json object",
            Json,
            r#"{"foo": {"bar": "ha"}}"#,
            Some(access_log::json_struct(r#"{"foo":{"bar":"ha"}}"#).unwrap()),
            None,
        ),
        (
            "invalid json object",
            Json,
            "foo",
            Some(default_json.clone()),
            None,
        ),
        (
            "incorrect json type",
            Json,
            "[]",
            Some(default_json.clone()),
            None,
        ),
        (
            "incorrect json type (string)",
            Json,
            r#""{}""#,
            Some(default_json.clone()),
            None,
        ),
        (
            "default json format",
            Json,
            "",
            Some(default_json.clone()),
            None,
        ),
        (
            "default text format",
            Text,
            "",
            None,
            Some(access_log::TEXT_FORMAT),
        ),
    ];
    for (name, encoding, format, want_json, want_text) in cases {
        let mut mesh = crate::mesh::default_mesh_config();
        mesh.access_log_file = "foo".into();
        mesh.access_log_encoding = encoding as i32;
        mesh.access_log_format = format.into();
        let t = build(&mesh, &[], "default", &sidecar_labels(), false);
        for class in [
            ListenerClass::SidecarInbound,
            ListenerClass::SidecarOutbound,
        ] {
            let listener = t.listener_access_log(class);
            assert!(
                listener[0].filter.is_some(),
                "{name}: the listener log filters NR"
            );
            let logs = [
                &listener[0],
                &t.http(class).access_log[0],
                &t.tcp(class).access_log[0],
            ];
            assert!(t.tcp(class).access_log[0].filter.is_none(), "{name}");
            for log in logs {
                let f: FileAccessLog = typed(log);
                assert_eq!(f.path, "foo");
                let Some(file_access_log::AccessLogFormat::LogFormat(lf)) = f.access_log_format
                else {
                    panic!("{name}")
                };
                match (lf.format.unwrap(), &want_json, want_text) {
                    (Format::JsonFormat(j), Some(w), _) => assert_eq!(&j, w, "{name}"),
                    (Format::TextFormatSource(src), _, Some(w)) => assert_eq!(
                        src.specifier,
                        Some(envoy_types::pb::envoy::config::core::v3::data_source::Specifier::InlineString(w.into())),
                        "{name}"
                    ),
                    (other, _, _) => panic!("{name}: {other:?}"),
                }
            }
        }
    }
}

/// TestSetTCPAccessLog and TestSetHttpAccessLog: the same four proxies, TCP proxy and
/// connection manager alike.
#[test]
fn istio_set_tcp_and_http_access_log_vectors() {
    use envoy_types::pb::envoy::extensions::access_loggers::file::v3::FileAccessLog;
    let mut mesh = crate::mesh::default_mesh_config();
    mesh.access_log_file = "/dev/stdout".into();
    mesh.extension_providers = yaml(
        "[{name: envoy-json, envoyFileAccessLog: {path: /dev/stdout, logFormat: {labels: {}}}}]",
    );
    let cfgs = arcs(vec![
        telemetry_named(
            "default",
            "test",
            "selector: {matchLabels: {app: test}}\naccessLogging: [{providers: [{name: envoy-json}]}]",
        ),
        telemetry_named(
            "default",
            "test-with-server-accesslog-filter",
            "selector: {matchLabels: {app: test-with-server-accesslog-filter}}\naccessLogging: [{match: {mode: SERVER}, providers: [{name: envoy-json}]}]",
        ),
        telemetry_named(
            "default",
            "test-disable-accesslog",
            "selector: {matchLabels: {app: test-disable-accesslog}}\naccessLogging: [{providers: [{name: envoy}], disabled: true}]",
        ),
    ]);
    let default_out = text_out("/dev/stdout", access_log::TEXT_FORMAT);
    let json_out = default_json_labels_out();
    let cases = [
        (
            "telemetry",
            "test",
            ListenerClass::SidecarInbound,
            Some(&json_out),
        ),
        (
            "log-selector-unmatched-telemetry",
            "test-with-server-accesslog-filter",
            ListenerClass::SidecarOutbound,
            Some(&default_out),
        ),
        (
            "without-telemetry",
            "without-telemetry",
            ListenerClass::SidecarInbound,
            Some(&default_out),
        ),
        (
            "disable-accesslog",
            "test-disable-accesslog",
            ListenerClass::SidecarInbound,
            None,
        ),
    ];
    for (name, app, class, want) in cases {
        let labels: BTreeMap<String, String> = [("app".to_string(), app.to_string())].into();
        let t = build(&mesh, &cfgs, "default", &labels, false);
        for logs in [&t.tcp(class).access_log, &t.http(class).access_log] {
            match want {
                Some(w) => {
                    assert_eq!(logs.len(), 1, "{name}");
                    assert_eq!(&typed::<FileAccessLog>(&logs[0]), w, "{name}");
                    assert!(logs[0].filter.is_none(), "{name}");
                }
                None => assert!(logs.is_empty(), "{name}"),
            }
        }
    }
}
