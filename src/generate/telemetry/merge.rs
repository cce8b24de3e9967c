//! Which Telemetry objects apply to a proxy and what they add up to, as Istio's
//! `pilot/pkg/model/telemetry.go` merges them: the root namespace's selector-less
//! Telemetry, then the proxy namespace's selector-less one, then every Telemetry of
//! the proxy's namespace whose selector matches its labels; later scopes override
//! earlier ones, field by field for tracing, provider by provider for logs and
//! metrics.

use std::collections::{BTreeMap, BTreeSet};

use meshfed_api::mesh::v1alpha1::MeshConfig;
use meshfed_api::mesh::v1alpha1::mesh_config::ExtensionProvider;
use meshfed_api::mesh::v1alpha1::mesh_config::extension_provider::{
    EnvoyFileAccessLogProvider, PrometheusMetricsProvider, Provider,
};
use meshfed_api::telemetry::v1alpha1 as tel;
use tel::WorkloadMode;

use crate::push::config_index::Config;

/// The kind of listener a connection manager or TCP proxy belongs to (Istio's
/// `ListenerClass`): which side of the traffic the proxy is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ListenerClass {
    /// A sidecar's inbound chains (the proxy is the server).
    SidecarInbound,
    /// A sidecar's outbound listeners (the proxy is the client).
    SidecarOutbound,
    /// A gateway's listeners (client side, as Istio).
    Gateway,
}

impl ListenerClass {
    /// The workload mode rules of this class match (Istio's `workloadMode`).
    pub fn mode(self) -> WorkloadMode {
        match self {
            ListenerClass::SidecarInbound => WorkloadMode::Server,
            ListenerClass::SidecarOutbound | ListenerClass::Gateway => WorkloadMode::Client,
        }
    }
}

/// The extension providers Telemetry and `defaultProviders` may name: the mesh
/// config's, then Istio's built-in ones it does not redefine (`prometheus`,
/// `stackdriver`, `envoy` writing to /dev/stdout).
#[derive(Clone, Debug)]
pub struct Providers {
    all: Vec<ExtensionProvider>,
}

impl Providers {
    /// The providers of `mesh`.
    pub fn new(mesh: &MeshConfig) -> Providers {
        let mut all = mesh.extension_providers.clone();
        let builtins = [
            ExtensionProvider {
                name: "prometheus".into(),
                provider: Some(Provider::Prometheus(PrometheusMetricsProvider {})),
            },
            ExtensionProvider {
                name: "stackdriver".into(),
                provider: Some(Provider::Stackdriver(Default::default())),
            },
            ExtensionProvider {
                name: "envoy".into(),
                provider: Some(Provider::EnvoyFileAccessLog(EnvoyFileAccessLogProvider {
                    path: "/dev/stdout".into(),
                    ..Default::default()
                })),
            },
        ];
        for b in builtins {
            if !all.iter().any(|p| p.name == b.name) {
                all.push(b);
            }
        }
        Providers { all }
    }

    /// The provider called `name`, case-insensitively (Istio's `fetchProvider`).
    pub fn fetch(&self, name: &str) -> Option<&ExtensionProvider> {
        self.all.iter().find(|p| p.name.eq_ignore_ascii_case(name))
    }
}

/// The Telemetry rules that apply to one proxy, in order (least specific first).
#[derive(Debug, Default)]
pub struct Applicable<'a> {
    /// Metrics rules of every scope.
    pub metrics: Vec<&'a tel::Metrics>,
    /// Access logging rules, grouped by the Telemetry they come from.
    pub logging: Vec<&'a [tel::AccessLogging]>,
    /// Tracing rules of every scope.
    pub tracing: Vec<&'a tel::Tracing>,
    /// The Telemetry objects that applied (`namespace/name`), for debugging.
    pub from: Vec<String>,
}

fn selects_namespace(t: &tel::Telemetry) -> bool {
    t.selector
        .as_ref()
        .is_none_or(|s| s.match_labels.is_empty())
        && t.target_ref.is_none()
        && t.target_refs.is_empty()
}

/// The rules that apply to a proxy of `namespace` with `labels`; `telemetries` are in
/// Istio's order (oldest first, then namespace and name).
pub fn applicable<'a>(
    telemetries: &'a [std::sync::Arc<Config<tel::Telemetry>>],
    root_namespace: &str,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> Applicable<'a> {
    let mut out = Applicable::default();
    let mut add = |c: &'a Config<tel::Telemetry>| {
        out.metrics.extend(c.spec.metrics.iter());
        if !c.spec.access_logging.is_empty() {
            out.logging.push(&c.spec.access_logging);
        }
        out.tracing.extend(c.spec.tracing.iter());
        out.from.push(format!("{}/{}", c.namespace, c.name));
    };
    let namespace_wide = |ns: &str| {
        telemetries
            .iter()
            .find(|c| c.namespace == ns && selects_namespace(&c.spec))
    };
    if !root_namespace.is_empty()
        && let Some(c) = namespace_wide(root_namespace)
    {
        add(c);
    }
    if namespace != root_namespace
        && let Some(c) = namespace_wide(namespace)
    {
        add(c);
    }
    for c in telemetries.iter().filter(|c| c.namespace == namespace) {
        let Some(selector) = c
            .spec
            .selector
            .as_ref()
            .filter(|s| !s.match_labels.is_empty())
        else {
            continue;
        };
        // Telemetry attached to Gateway API resources (targetRefs) is not applied.
        if c.spec.target_ref.is_some() || !c.spec.target_refs.is_empty() {
            continue;
        }
        if selector
            .match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
        {
            add(c);
        }
    }
    out
}

fn provider_names(refs: &[tel::ProviderRef]) -> Vec<String> {
    refs.iter().map(|p| p.name.clone()).collect()
}

fn matches_mode(selector: Option<&tel::access_logging::LogSelector>, mode: WorkloadMode) -> bool {
    match selector {
        None => true,
        Some(s) => s.mode() == WorkloadMode::ClientAndServer || s.mode() == mode,
    }
}

/// Whether and how one access log provider logs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LoggingSpec {
    /// Logging to it was turned off.
    pub disabled: bool,
    /// Which requests are logged.
    pub filter: Option<tel::access_logging::Filter>,
}

/// The access log providers in force for `mode` (Istio's `mergeLogs`).
pub fn merge_logs(
    logs: &[&[tel::AccessLogging]],
    mesh: &MeshConfig,
    mode: WorkloadMode,
) -> BTreeMap<String, LoggingSpec> {
    let defaults: Vec<String> = mesh
        .default_providers
        .as_ref()
        .map(|d| d.access_logging.clone())
        .unwrap_or_default();
    let mut providers = BTreeMap::new();
    if logs.is_empty() {
        for d in defaults {
            providers.insert(d, LoggingSpec::default());
        }
        return providers;
    }
    let mut names_in_scope = defaults.clone();
    let mut filters: BTreeMap<String, LoggingSpec> = BTreeMap::new();
    for level in logs {
        let mut names = BTreeSet::new();
        for rule in level.iter() {
            if !matches_mode(rule.r#match.as_ref(), mode) {
                continue;
            }
            for p in provider_names(&rule.providers) {
                filters.insert(
                    p.clone(),
                    LoggingSpec {
                        disabled: false,
                        filter: rule.filter.clone(),
                    },
                );
                names.insert(p);
            }
        }
        if !names.is_empty() {
            names_in_scope = names.into_iter().collect();
        }
    }
    let in_scope: BTreeSet<String> = names_in_scope.into_iter().collect();
    let mut parent = defaults;
    for level in logs {
        for rule in level.iter() {
            let mut names = provider_names(&rule.providers);
            if names.is_empty() {
                names = parent.clone();
            }
            parent = names.clone();
            for p in names {
                if !in_scope.contains(&p) || !matches_mode(rule.r#match.as_ref(), mode) {
                    continue;
                }
                if rule.disabled.as_ref().is_some_and(|d| d.value) {
                    providers.insert(
                        p,
                        LoggingSpec {
                            disabled: true,
                            filter: None,
                        },
                    );
                    continue;
                }
                let spec = filters.get(&p).cloned().unwrap_or_default();
                providers.insert(p, spec);
            }
        }
    }
    providers
}

/// One metric's override after merging (Istio's `metricsOverride`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MetricOverride {
    /// The metric: an `IstioMetric` name or a custom metric.
    pub name: String,
    /// Dropped.
    pub disabled: bool,
    /// Tag changes, by tag name: `None` removes, `Some(value)` upserts.
    pub tags: BTreeMap<String, Option<String>>,
}

/// What one direction of a provider's metrics looks like.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MetricConfig {
    /// Every metric is disabled: no filter.
    pub disabled: bool,
    /// Overrides, sorted by metric name.
    pub overrides: Vec<MetricOverride>,
}

/// A metrics provider's merged settings (Istio's `metricsConfig`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MetricsConfig {
    /// Client side (outbound, gateways).
    pub client: MetricConfig,
    /// Server side (inbound).
    pub server: MetricConfig,
    /// TCP reporting interval.
    pub reporting_interval: Option<meshfed_api::Duration>,
}

impl MetricsConfig {
    /// The direction `class` uses.
    pub fn for_class(&self, class: ListenerClass) -> &MetricConfig {
        match class {
            ListenerClass::SidecarInbound => &self.server,
            _ => &self.client,
        }
    }
}

/// Every standard metric, sorted by name (`ALL_METRICS` expanded).
fn all_metrics() -> Vec<String> {
    let mut all: Vec<String> = (1..=10)
        .filter_map(|n| tel::metric_selector::IstioMetric::try_from(n).ok())
        .map(|m| m.as_str_name().to_string())
        .collect();
    all.sort();
    all
}

fn modes(mode: WorkloadMode) -> Vec<WorkloadMode> {
    match mode {
        WorkloadMode::Client | WorkloadMode::Server => vec![mode],
        WorkloadMode::ClientAndServer => vec![WorkloadMode::Client, WorkloadMode::Server],
    }
}

/// The metrics providers in force and their settings (Istio's `mergeMetrics`).
pub fn merge_metrics(
    metrics: &[&tel::Metrics],
    mesh: &MeshConfig,
) -> BTreeMap<String, MetricsConfig> {
    use tel::metric_selector::{IstioMetric, MetricMatch};
    #[derive(Default, Clone)]
    struct Override {
        disabled: Option<bool>,
        tags: BTreeMap<String, tel::metrics_overrides::TagOverride>,
    }
    type ModeMap = BTreeMap<i32, BTreeMap<String, Override>>;
    let defaults: Vec<String> = mesh
        .default_providers
        .as_ref()
        .map(|d| d.metrics.clone())
        .unwrap_or_default();
    let mut providers: BTreeMap<String, ModeMap> = BTreeMap::new();
    if metrics.is_empty() {
        for d in &defaults {
            providers.insert(d.clone(), ModeMap::new());
        }
    }
    let mut in_scope = defaults.clone();
    for m in metrics {
        let names = provider_names(&m.providers);
        if !names.is_empty() {
            in_scope = names;
        }
    }
    let in_scope: BTreeSet<String> = in_scope.into_iter().collect();
    let mut parent = defaults;
    let mut disabled_all: BTreeSet<(String, i32)> = BTreeSet::new();
    let mut intervals: BTreeMap<String, meshfed_api::Duration> = BTreeMap::new();
    for m in metrics {
        let mut names = provider_names(&m.providers);
        if names.is_empty() {
            names = parent.clone();
        }
        parent = names.clone();
        for provider in names {
            if !in_scope.contains(&provider) {
                continue;
            }
            if let Some(d) = m.reporting_interval {
                intervals.insert(provider.clone(), d);
            }
            let mp = providers.entry(provider.clone()).or_insert_with(|| {
                [
                    (WorkloadMode::Client as i32, BTreeMap::new()),
                    (WorkloadMode::Server as i32, BTreeMap::new()),
                ]
                .into()
            });
            for o in &m.overrides {
                let selector = o.r#match.as_ref();
                let metric_match = selector.and_then(|s| s.metric_match.as_ref());
                let is_all = match metric_match {
                    Some(MetricMatch::CustomMetric(_)) => false,
                    Some(MetricMatch::Metric(m)) => *m == IstioMetric::AllMetrics as i32,
                    None => true,
                };
                let mode = selector.map(|s| s.mode()).unwrap_or_default();
                if is_all && o.disabled.as_ref().is_some_and(|d| d.value) {
                    for md in modes(mode) {
                        disabled_all.insert((provider.clone(), md as i32));
                    }
                    continue;
                }
                let metric_names = match metric_match {
                    Some(MetricMatch::CustomMetric(c)) => vec![c.clone()],
                    Some(MetricMatch::Metric(m)) if *m != IstioMetric::AllMetrics as i32 => {
                        vec![
                            IstioMetric::try_from(*m)
                                .map(|m| m.as_str_name().to_string())
                                .unwrap_or_default(),
                        ]
                    }
                    _ => all_metrics(),
                };
                for md in modes(mode) {
                    disabled_all.remove(&(provider.clone(), md as i32));
                    let by_metric = mp.entry(md as i32).or_default();
                    for name in &metric_names {
                        let entry = by_metric.entry(name.clone()).or_default();
                        if let Some(d) = &o.disabled {
                            entry.disabled = Some(d.value);
                        }
                        for (k, v) in &o.tag_overrides {
                            entry.tags.insert(k.clone(), v.clone());
                        }
                    }
                }
            }
        }
    }
    let mut out = BTreeMap::new();
    for (provider, mode_map) in providers {
        let mut cfg = MetricsConfig {
            reporting_interval: intervals.get(&provider).copied(),
            ..Default::default()
        };
        for (mode, by_metric) in mode_map {
            let target = if mode == WorkloadMode::Client as i32 {
                &mut cfg.client
            } else {
                &mut cfg.server
            };
            if disabled_all.contains(&(provider.clone(), mode)) {
                target.disabled = true;
                continue;
            }
            for (name, o) in by_metric {
                use tel::metrics_overrides::tag_override::Operation;
                target.overrides.push(MetricOverride {
                    name,
                    disabled: o.disabled.unwrap_or(false),
                    tags: o
                        .tags
                        .into_iter()
                        .map(|(k, v)| {
                            let value = match v.operation() {
                                Operation::Remove => None,
                                Operation::Upsert => Some(v.value),
                            };
                            (k, value)
                        })
                        .collect(),
                });
            }
        }
        // A direction disabled before any override reached it still counts.
        for mode in [WorkloadMode::Client, WorkloadMode::Server] {
            if disabled_all.contains(&(provider.clone(), mode as i32)) {
                match mode {
                    WorkloadMode::Client => cfg.client.disabled = true,
                    _ => cfg.server.disabled = true,
                }
            }
        }
        out.insert(provider, cfg);
    }
    out
}

/// One direction's tracing after merging (Istio's `TracingSpec`).
#[derive(Clone, Debug, PartialEq)]
pub struct TracingSpec {
    /// The provider (the first named one), if it exists.
    pub provider: Option<ExtensionProvider>,
    /// No spans reported.
    pub disabled: bool,
    /// Random sampling percentage, when some scope set it.
    pub random_sampling_percentage: Option<f64>,
    /// Custom tags (the last scope that set any wins).
    pub custom_tags: Option<BTreeMap<String, tel::tracing::CustomTag>>,
    /// The x-request-id decides sampling.
    pub use_request_id_for_trace_sampling: bool,
    /// Istio's own span tags.
    pub enable_istio_tags: bool,
}

impl Default for TracingSpec {
    fn default() -> Self {
        TracingSpec {
            provider: None,
            disabled: false,
            random_sampling_percentage: None,
            custom_tags: None,
            use_request_id_for_trace_sampling: true,
            enable_istio_tags: true,
        }
    }
}

/// Both directions' tracing (Istio's `TracingConfig`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TracingConfig {
    /// Client side (outbound, gateways).
    pub client: TracingSpec,
    /// Server side (inbound).
    pub server: TracingSpec,
}

/// Tracing from the Telemetry API, or `None` when neither a Telemetry nor
/// `defaultProviders.tracing` says anything (then the mesh config's legacy
/// `enableTracing` applies) (Istio's `Telemetries.Tracing`).
pub fn merge_tracing(
    tracing: &[&tel::Tracing],
    mesh: &MeshConfig,
    providers: &Providers,
) -> Option<TracingConfig> {
    let defaults: &[String] = mesh
        .default_providers
        .as_ref()
        .map(|d| d.tracing.as_slice())
        .unwrap_or_default();
    if tracing.is_empty() && defaults.is_empty() {
        return None;
    }
    let mut cfg = TracingConfig::default();
    if let Some(first) = defaults.first() {
        let fetched = providers.fetch(first).cloned();
        cfg.client.provider = fetched.clone();
        cfg.server.provider = fetched;
    }
    for m in tracing {
        let mode = m.r#match.as_ref().map(|s| s.mode()).unwrap_or_default();
        let mut specs: Vec<&mut TracingSpec> = match mode {
            WorkloadMode::Client => vec![&mut cfg.client],
            WorkloadMode::Server => vec![&mut cfg.server],
            WorkloadMode::ClientAndServer => vec![&mut cfg.client, &mut cfg.server],
        };
        if let Some(first) = m.providers.first() {
            let fetched = providers.fetch(&first.name).cloned();
            for s in specs.iter_mut() {
                s.provider = fetched.clone();
            }
        }
        for s in specs.iter_mut() {
            if let Some(d) = &m.disable_span_reporting {
                s.disabled = d.value;
            }
            if !m.custom_tags.is_empty() {
                s.custom_tags = Some(m.custom_tags.clone());
            }
            if let Some(p) = &m.random_sampling_percentage {
                s.random_sampling_percentage = Some(p.value);
            }
            if let Some(u) = &m.use_request_id_for_trace_sampling {
                s.use_request_id_for_trace_sampling = u.value;
            }
            if let Some(e) = &m.enable_istio_tags {
                s.enable_istio_tags = e.value;
            }
        }
    }
    for s in [&mut cfg.client, &mut cfg.server] {
        if s.provider.is_none() {
            s.disabled = true;
        }
    }
    Some(cfg)
}
