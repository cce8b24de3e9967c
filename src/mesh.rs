//! MeshConfig and MeshNetworks: Istio's defaults, loading from files, and following
//! those files.
//!
//! A mesh config file is what Istio keeps under the `mesh` key of its `istio` ConfigMap:
//! a MeshConfig document in YAML. Fields the file sets replace Istio's defaults; the
//! rest keep them. A meshNetworks file is a MeshNetworks document (`networks: {...}`).
//! A change reloads the file and forces a full push; an invalid file keeps the
//! previous content and says why in the log.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;
use meshfed_api::mesh::v1alpha1::{MeshConfig, MeshNetworks, mesh_config};
use meshfed_registry::follow::{FileOptions, FollowOptions, Read, Reload, Settle, WatchedFile};
use meshfed_registry::read::{ReadError, read_watched_file_blocking};
use meshfed_registry::watch::PathWatcher;
use meshfed_registry::{ConfigKey, ConfigKind, PushRequest, TriggerReason, UpdateSink};
use tracing::{error, info, warn};

/// Why a mesh file was not applied.
#[derive(Debug, thiserror::Error)]
pub enum MeshError {
    /// The file could not be read (missing, not a regular file, over the size limit,
    /// ...); the message starts with the file.
    #[error("{source}")]
    Read { path: String, source: ReadError },
    /// Not YAML, or not a MeshConfig/MeshNetworks document.
    #[error("{path}: {reason}")]
    Invalid { path: String, reason: String },
}

/// The mesh-wide settings every snapshot is built with.
#[derive(Clone, Debug, Default)]
pub struct MeshSettings {
    /// MeshConfig with Istio's defaults for unset fields.
    pub config: MeshConfig,
    /// meshNetworks (empty: one flat network).
    pub networks: MeshNetworks,
}

/// Istio's default MeshConfig (the fields meshfed uses).
pub fn default_mesh_config() -> MeshConfig {
    let mut m = MeshConfig {
        proxy_listen_port: 15001,
        proxy_inbound_listen_port: 15006,
        proxy_http_port: 0,
        connect_timeout: Some(
            std::time::Duration::from_secs(10)
                .try_into()
                .expect("10s fits"),
        ),
        ingress_class: "istio".into(),
        ingress_service: "istio-ingressgateway".into(),
        trust_domain: "cluster.local".into(),
        root_namespace: "istio-system".into(),
        default_service_export_to: vec!["*".into()],
        default_virtual_service_export_to: vec!["*".into()],
        default_destination_rule_export_to: vec!["*".into()],
        enable_auto_mtls: Some(true.into()),
        enable_prometheus_merge: Some(true.into()),
        dns_refresh_rate: Some(
            std::time::Duration::from_secs(60)
                .try_into()
                .expect("60s fits"),
        ),
        ..Default::default()
    };
    m.outbound_traffic_policy = Some(mesh_config::OutboundTrafficPolicy {
        mode: mesh_config::outbound_traffic_policy::Mode::AllowAny as i32,
    });
    // Telemetry: Istio traces by default (the sampling and tags of
    // `defaultConfig.tracing`) and reports its standard metrics through the built-in
    // `prometheus` provider.
    m.enable_tracing = true;
    m.default_providers = Some(mesh_config::DefaultProviders {
        metrics: vec!["prometheus".into()],
        ..Default::default()
    });
    m
}

/// Parses a mesh config document onto Istio's defaults.
pub fn parse_mesh_config(path: &Path, text: &str) -> Result<MeshConfig, MeshError> {
    let invalid = |reason: String| MeshError::Invalid {
        path: path.display().to_string(),
        reason,
    };
    let file: serde_json::Value = if text.trim().is_empty() {
        serde_json::Value::Object(Default::default())
    } else {
        serde_norway::from_str(text).map_err(|e| invalid(format!("not valid YAML: {e}")))?
    };
    if !file.is_object() {
        return Err(invalid(
            "a mesh config must be a YAML mapping of MeshConfig fields".into(),
        ));
    }
    for field in unsupported_fields(MESH_CONFIG, &file) {
        warn!(file = %path.display(), field, "mesh config field not supported by meshfed, ignored");
    }
    let mut merged = serde_json::to_value(default_mesh_config()).expect("MeshConfig serialises");
    merge(&mut merged, file);
    let config: MeshConfig =
        serde_json::from_value(merged).map_err(|e| invalid(format!("MeshConfig: {e}")))?;
    validate_mesh_config(&config).map_err(invalid)?;
    Ok(config)
}

/// Parses a meshNetworks document.
pub fn parse_mesh_networks(path: &Path, text: &str) -> Result<MeshNetworks, MeshError> {
    let invalid = |reason: String| MeshError::Invalid {
        path: path.display().to_string(),
        reason,
    };
    if text.trim().is_empty() {
        return Ok(MeshNetworks::default());
    }
    let value: serde_json::Value =
        serde_norway::from_str(text).map_err(|e| invalid(format!("not valid YAML: {e}")))?;
    for field in unsupported_fields(MESH_NETWORKS, &value) {
        warn!(file = %path.display(), field, "meshNetworks field not supported by meshfed, ignored");
    }
    let networks: MeshNetworks =
        serde_json::from_value(value).map_err(|e| invalid(format!("MeshNetworks: {e}")))?;
    validate_mesh_networks(&networks).map_err(invalid)?;
    Ok(networks)
}

const MESH_CONFIG: &str = "istio.mesh.v1alpha1.MeshConfig";
const MESH_NETWORKS: &str = "istio.mesh.v1alpha1.MeshNetworks";

/// Istio's ProxyConfig fields (`defaultConfig`) that configure the agent and Envoy's
/// bootstrap rather than xDS. The agent reads them (and passes what istiod needs in
/// the node's `PROXY_CONFIG` metadata), so meshfed accepts them without modelling them.
const AGENT_PROXY_CONFIG_FIELDS: &[&str] = &[
    "configPath",
    "binaryPath",
    "serviceCluster",
    "tracingServiceName",
    "drainDuration",
    "parentShutdownDuration",
    "discoveryAddress",
    "discoveryRefreshDelay",
    "zipkinAddress",
    "statsdUdpAddress",
    "envoyMetricsServiceAddress",
    "proxyAdminPort",
    "availabilityZone",
    "controlPlaneAuthPolicy",
    "customConfigFile",
    "statNameLength",
    "concurrency",
    "proxyBootstrapTemplatePath",
    "interceptionMode",
    "sds",
    "envoyAccessLogService",
    "envoyMetricsService",
    "proxyMetadata",
    "runtimeValues",
    "statusPort",
    "extraStatTags",
    "gatewayTopology",
    "terminationDrainDuration",
    "readinessProbe",
    "proxyStatsMatcher",
    "holdApplicationUntilProxyStarts",
    "caCertificatesPem",
    "image",
    "privateKeyProvider",
    "proxyHeaders",
    "fileFlushInterval",
    "fileFlushMinSizeKb",
];

/// `defaultConfig.tracing` fields that pick the bootstrap's tracer (the agent's).
const AGENT_TRACING_FIELDS: &[&str] = &[
    "zipkin",
    "lightstep",
    "datadog",
    "stackdriver",
    "openCensusAgent",
    "tlsSettings",
];

/// The fields of a mesh config (`MESH_CONFIG`) or meshNetworks document that meshfed
/// neither models nor leaves to the agent, by path (`extensionProviders[1].zipkin.x`):
/// typos, and Istio fields meshfed does not support. The generated readers skip them
/// as istiod skips unknown fields, so they are named here to be warned about.
pub fn unsupported_fields(message: &str, document: &serde_json::Value) -> Vec<String> {
    let agent = |path: &str| {
        let Some(rest) = path
            .strip_prefix("defaultConfig.")
            .or_else(|| path.strip_prefix("default_config."))
        else {
            return false;
        };
        let mut parts = rest.splitn(3, '.');
        let first = camel_case(parts.next().unwrap_or_default());
        match parts.next() {
            None => AGENT_PROXY_CONFIG_FIELDS.contains(&first.as_str()),
            Some(second) => {
                first == "tracing" && AGENT_TRACING_FIELDS.contains(&camel_case(second).as_str())
            }
        }
    };
    meshfed_api::unknown_fields::unknown_fields(message, document)
        .into_iter()
        .filter(|p| !agent(p))
        .collect()
}

/// The warnings `meshfed validate --meshConfig` prints for a mesh config file: one per
/// field meshfed ignores.
pub fn mesh_config_warnings(path: &Path, text: &str) -> Vec<String> {
    let Ok(document) = serde_norway::from_str::<serde_json::Value>(text) else {
        return Vec::new();
    };
    let mut warnings: Vec<String> = unsupported_fields(MESH_CONFIG, &document)
        .into_iter()
        .map(|field| {
            format!(
                "warning: {}: {field}: not a mesh config field meshfed supports; ignored",
                path.display()
            )
        })
        .collect();
    // What configSources sets that meshfed (like istiod) does not act on.
    if let Ok(config) = serde_json::from_value::<MeshConfig>(document)
        && let Ok(found) = meshfed_registry::config::validate_config_sources(&config)
    {
        warnings.extend(
            service_scope_warnings(&config)
                .iter()
                .map(|w| format!("warning: {}: {w}", path.display())),
        );
        warnings.extend(
            found
                .iter()
                .map(|w| format!("warning: {}: {w}", path.display())),
        );
    }
    warnings
}

/// Kubernetes label selector semantics; `None` when the selector is invalid (an
/// unknown operator, `In`/`NotIn` without values). An unset selector matches
/// everything, as Istio treats the empty selector.
pub fn selector_matches(
    selector: Option<&meshfed_api::mesh::v1alpha1::LabelSelector>,
    labels: &std::collections::BTreeMap<String, String>,
) -> Option<bool> {
    let Some(selector) = selector else {
        return Some(true);
    };
    let mut ok = selector
        .match_labels
        .iter()
        .all(|(k, v)| labels.get(k) == Some(v));
    for r in &selector.match_expressions {
        let value = labels.get(&r.key);
        let holds = match r.operator.as_str() {
            "In" if !r.values.is_empty() => value.is_some_and(|v| r.values.contains(v)),
            "NotIn" if !r.values.is_empty() => value.is_none_or(|v| !r.values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => return None,
        };
        ok &= holds;
    }
    Some(ok)
}

/// Why a `serviceScopeConfigs` entry is skipped, if it is (for warnings).
fn invalid_scope_config(config: &mesh_config::ServiceScopeConfigs) -> Option<String> {
    let empty = std::collections::BTreeMap::new();
    for (field, selector) in [
        ("namespaceSelector", config.namespace_selector.as_ref()),
        ("servicesSelector", config.services_selector.as_ref()),
    ] {
        if selector_matches(selector, &empty).is_none() {
            return Some(format!(
                "{field}: an operator is not In, NotIn, Exists or DoesNotExist, or In/NotIn has no values; the entry is skipped"
            ));
        }
    }
    None
}

/// What meshfed says about MeshConfig `serviceScopeConfigs`: that only ambient
/// multi-network reads it (sidecars do not, in istiod either), and which entries
/// are skipped for an invalid selector.
pub fn service_scope_warnings(m: &MeshConfig) -> Vec<String> {
    if m.service_scope_configs.is_empty() {
        return Vec::new();
    }
    let mut out = vec![
        "serviceScopeConfigs: read for ztunnel's services with --ambientMultiNetwork (AMBIENT_ENABLE_MULTI_NETWORK) only; sidecars and gateways ignore it, as istiod's do".to_string(),
    ];
    for (i, c) in m.service_scope_configs.iter().enumerate() {
        if let Some(why) = invalid_scope_config(c) {
            out.push(format!("serviceScopeConfigs[{i}].{why}"));
        }
    }
    out
}

fn validate_mesh_config(m: &MeshConfig) -> Result<(), String> {
    if let Some(t) = &m.connect_timeout {
        let d: Result<std::time::Duration, _> = (*t).try_into();
        if !matches!(d, Ok(d) if d > std::time::Duration::ZERO) {
            return Err("connectTimeout: must be a positive duration".into());
        }
    }
    if m.root_namespace.is_empty() {
        return Err("rootNamespace: must not be empty".into());
    }
    for (field, values) in [
        ("defaultServiceExportTo", &m.default_service_export_to),
        (
            "defaultVirtualServiceExportTo",
            &m.default_virtual_service_export_to,
        ),
        (
            "defaultDestinationRuleExportTo",
            &m.default_destination_rule_export_to,
        ),
    ] {
        if values.iter().any(|v| v.is_empty()) {
            return Err(format!("{field}: entries must not be empty"));
        }
    }
    for w in service_scope_warnings(m) {
        warn!("mesh config: {w}");
    }
    // configSources: addresses meshfed can read (see `config::config_sources`).
    match meshfed_registry::config::validate_config_sources(m) {
        Ok(warnings) => {
            for w in warnings {
                warn!("mesh config: {w}");
            }
        }
        Err(errors) => {
            let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
            return Err(text.join("; "));
        }
    }
    // Istio's ValidateMeshConfig refuses a mesh config with a broken extension provider.
    if let Err(errors) = meshfed_registry::config::validate::validate_extension_providers(m) {
        let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
        return Err(text.join("; "));
    }
    Ok(())
}

fn validate_mesh_networks(n: &MeshNetworks) -> Result<(), String> {
    use meshfed_api::mesh::v1alpha1::network::{istio_network_gateway::Gw, network_endpoints::Ne};
    for (name, network) in &n.networks {
        for (i, e) in network.endpoints.iter().enumerate() {
            match &e.ne {
                Some(Ne::FromCidr(cidr)) if parse_cidr(cidr).is_none() => {
                    return Err(format!(
                        "networks.{name}.endpoints[{i}].fromCidr: {cidr:?} is not a CIDR"
                    ));
                }
                Some(Ne::FromRegistry(r)) if r.is_empty() => {
                    return Err(format!(
                        "networks.{name}.endpoints[{i}].fromRegistry: must not be empty"
                    ));
                }
                None => {
                    return Err(format!(
                        "networks.{name}.endpoints[{i}]: needs fromCidr or fromRegistry"
                    ));
                }
                _ => {}
            }
        }
        for (i, g) in network.gateways.iter().enumerate() {
            if g.port == 0 || g.port > 65535 {
                return Err(format!(
                    "networks.{name}.gateways[{i}].port: {} is not a port",
                    g.port
                ));
            }
            match &g.gw {
                Some(Gw::Address(a)) if a.is_empty() => {
                    return Err(format!(
                        "networks.{name}.gateways[{i}].address: must not be empty"
                    ));
                }
                Some(Gw::RegistryServiceName(s)) if s.is_empty() => {
                    return Err(format!(
                        "networks.{name}.gateways[{i}].registryServiceName: must not be empty"
                    ));
                }
                None => {
                    return Err(format!(
                        "networks.{name}.gateways[{i}]: needs address or registryServiceName"
                    ));
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// Parses `addr/len`.
pub fn parse_cidr(s: &str) -> Option<(std::net::IpAddr, u8)> {
    let (addr, len) = s.split_once('/')?;
    let addr: std::net::IpAddr = addr.parse().ok()?;
    let len: u8 = len.parse().ok()?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    (len <= max).then_some((addr, len))
}

/// Deep-merges `overlay` onto `base` (objects merge, everything else replaces).
fn merge(base: &mut serde_json::Value, overlay: serde_json::Value) {
    match (base, overlay) {
        (serde_json::Value::Object(b), serde_json::Value::Object(o)) => {
            for (k, v) in o {
                // The file may use snake_case; the defaults are camelCase.
                let key = camel_case(&k);
                match b.get_mut(&key) {
                    Some(existing) if existing.is_object() && v.is_object() => merge(existing, v),
                    _ => {
                        b.insert(key, v);
                    }
                }
            }
        }
        (b, o) => *b = o,
    }
}

fn camel_case(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut upper = false;
    for c in s.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

use meshfed_registry::read::EMPTY_SETTLE;

/// Which mesh file a follower reads.
#[derive(Clone, Copy, Debug)]
pub enum MeshFile {
    /// `--meshConfig`.
    Config,
    /// `--networksConfig`.
    Networks,
}

/// Loads the mesh files once, at start-up, under the rules of
/// [`meshfed_registry::read`] (regular files of at most `max_file_size` bytes). A
/// missing or invalid file is an error here (the operator asked for it), unlike later
/// reloads, which keep the last good one.
pub fn load_initial(
    config: Option<&Path>,
    networks: Option<&Path>,
    max_file_size: u64,
) -> Result<MeshSettings, MeshError> {
    let read = |p: &Path| {
        let bytes =
            read_watched_file_blocking(p, max_file_size).map_err(|source| MeshError::Read {
                path: p.display().to_string(),
                source,
            })?;
        String::from_utf8(bytes).map_err(|_| MeshError::Invalid {
            path: p.display().to_string(),
            reason: "the file is not valid UTF-8".to_string(),
        })
    };
    Ok(MeshSettings {
        config: match config {
            Some(p) => parse_mesh_config(p, &read(p)?)?,
            None => default_mesh_config(),
        },
        networks: match networks {
            Some(p) => parse_mesh_networks(p, &read(p)?)?,
            None => MeshNetworks::default(),
        },
    })
}

/// Starts following one mesh file: the watch is set up before this returns, so no
/// later change is missed. The returned future runs until `shutdown` (at once, even
/// mid-read), swapping good content into `settings` and forcing a full push whenever
/// the content changes. Reads follow [`meshfed_registry::read`]: regular files of at
/// most `max_file_size` bytes, settled content only, and a failed read (other than a
/// missing file) is retried with backoff until it succeeds. A file emptied after it
/// had content applies (as the defaults) only once it has stayed empty for
/// [`EMPTY_SETTLE`].
pub fn follow(
    path: PathBuf,
    which: MeshFile,
    settings: Arc<ArcSwap<MeshSettings>>,
    sink: UpdateSink,
    max_file_size: u64,
    shutdown: impl Future<Output = ()>,
) -> Result<impl Future<Output = ()>, MeshError> {
    let watcher = PathWatcher::watch(&path, false).map_err(|e| MeshError::Invalid {
        path: path.display().to_string(),
        reason: format!("cannot watch: {e}"),
    })?;
    let options = FileOptions {
        max_file_size,
        ..FileOptions::default()
    };
    let mut follower = MeshFollower {
        file: WatchedFile::new(path.clone(), options),
        which,
        settings,
        sink,
        held_content: true,
    };
    Ok(async move {
        // The caller read the file at start-up (`load_initial`): wait for a change.
        let options = FollowOptions::default();
        let followed =
            meshfed_registry::follow::follow(&mut [watcher], &mut follower, options, shutdown)
                .await;
        if followed.is_err() {
            error!(
                "{}: watcher stopped; changes will need a restart",
                path.display()
            );
        }
    })
}

/// The reload step of one followed mesh file.
struct MeshFollower {
    file: WatchedFile,
    which: MeshFile,
    settings: Arc<ArcSwap<MeshSettings>>,
    sink: UpdateSink,
    /// Whether the settings in force came from a file with content (load_initial's
    /// read included), so that an emptied file waits before it resets them.
    held_content: bool,
}

impl Reload for MeshFollower {
    async fn reload(&mut self) -> Option<std::time::Duration> {
        match self.file.read().await {
            Read::Unchanged => None,
            Read::Content => self.apply(),
            Read::Missing {
                error, had_content, ..
            } => {
                if had_content {
                    warn!("{error}; keeping the last good content");
                }
                None
            }
            Read::Changing { error, delay } => {
                tracing::debug!("{error}; reading again in {delay:?}");
                Some(delay)
            }
            Read::Failed {
                error,
                repeated,
                delay,
            } => {
                if repeated {
                    tracing::debug!("{error}; reading again in {delay:?}");
                } else {
                    warn!("{error}; keeping the last good content, retrying in {delay:?}");
                }
                Some(delay)
            }
        }
    }
}

impl MeshFollower {
    /// Applies the content just read (the defaults for a blank file, once it has
    /// stayed blank for [`EMPTY_SETTLE`]).
    fn apply(&mut self) -> Option<std::time::Duration> {
        let path = self.file.path().to_path_buf();
        let blank = meshfed_registry::read::is_blank(self.file.content());
        // Emptied: a writer may have truncated the file and not written yet.
        match self
            .file
            .settle(blank && self.held_content, tokio::time::Instant::now())
        {
            Settle::Apply => {}
            Settle::Wait { remaining, .. } => return Some(remaining),
            Settle::Settled => warn!(
                "{}: the file has stayed empty for {EMPTY_SETTLE:?}; applying the defaults",
                path.display()
            ),
        }
        self.held_content = !blank;
        let text = String::from_utf8_lossy(self.file.content());
        let current = self.settings.load_full();
        let mut next = (*current).clone();
        let applied = match self.which {
            MeshFile::Config => parse_mesh_config(&path, &text).map(|c| next.config = c),
            MeshFile::Networks => parse_mesh_networks(&path, &text).map(|n| next.networks = n),
        };
        match applied {
            Ok(()) => {
                if publish(&self.settings, &current, next, &self.sink) {
                    info!(file = %path.display(), "mesh file reloaded; pushing to every proxy");
                }
            }
            Err(err) => error!("{err}; keeping the previous content"),
        }
        None
    }
}

/// Swaps `next` in if it differs from `current` and forces a push naming what changed
/// (MeshConfig: a global push; meshNetworks only: a networks push). True when it did.
fn publish(
    settings: &ArcSwap<MeshSettings>,
    current: &MeshSettings,
    next: MeshSettings,
    sink: &UpdateSink,
) -> bool {
    let config_changed = next.config != current.config;
    let networks_changed = next.networks != current.networks;
    if !config_changed && !networks_changed {
        return false;
    }
    if next.config.config_sources != current.config.config_sources {
        warn!(
            "mesh config: configSources changed; the config stores are chosen at start, so this takes effect at the next start"
        );
    }
    settings.store(Arc::new(next));
    let reason = if config_changed {
        TriggerReason::Global
    } else {
        TriggerReason::Networks
    };
    let mut request = PushRequest::forced(reason);
    for (changed, kind) in [
        (config_changed, ConfigKind::MeshConfig),
        (networks_changed, ConfigKind::MeshNetworks),
    ] {
        if changed {
            request
                .configs_updated
                .insert(ConfigKey::new(kind, "mesh", ""));
        }
    }
    sink.push(request);
    true
}

/// Which mesh settings a ConfigMap supplies (the ones not given as files).
#[derive(Clone, Copy, Debug)]
pub struct MapKeys {
    /// Read MeshConfig from the `mesh` key.
    pub mesh: bool,
    /// Read meshNetworks from the `meshNetworks` key.
    pub networks: bool,
}

/// Applies istiod's `istio` ConfigMap (`mesh` and `meshNetworks` keys, as istiod reads
/// them) to `settings` as it changes, until `shutdown`: good content is swapped in with
/// a forced push; a key that does not parse keeps its last good content (logged with
/// the ConfigMap, the key and why). A ConfigMap absent at start means Istio's defaults;
/// one deleted later keeps the last good content. `synced` is set once the initial
/// list has been applied (readiness waits for it).
pub async fn follow_config_map(
    updates: impl futures::Stream<Item = meshfed_kube::ConfigMapUpdate>,
    name: String,
    keys: MapKeys,
    settings: Arc<ArcSwap<MeshSettings>>,
    sink: UpdateSink,
    synced: Arc<std::sync::atomic::AtomicBool>,
    shutdown: impl Future<Output = ()>,
) {
    use futures::StreamExt;
    use meshfed_kube::ConfigMapUpdate;
    let mut updates = std::pin::pin!(updates);
    let mut shutdown = std::pin::pin!(shutdown);
    let mut seen_once = false;
    loop {
        let update = tokio::select! {
            () = &mut shutdown => return,
            update = updates.next() => match update {
                Some(update) => update,
                None => return,
            },
        };
        let data = match update {
            ConfigMapUpdate::Error(err) => {
                warn!(configmap = %name, "watching the mesh ConfigMap: {err}; keeping the current mesh settings");
                continue;
            }
            ConfigMapUpdate::Absent if seen_once => {
                warn!(configmap = %name, "the mesh ConfigMap is gone; keeping the last good mesh settings");
                continue;
            }
            ConfigMapUpdate::Absent => {
                info!(configmap = %name, "no mesh ConfigMap: Istio's defaults apply");
                std::collections::BTreeMap::new()
            }
            ConfigMapUpdate::Data(data) => data,
        };
        seen_once = true;
        let current = settings.load_full();
        let mut next = (*current).clone();
        if keys.mesh {
            let key = format!("ConfigMap {name}, key mesh");
            match data.get("mesh") {
                None => next.config = default_mesh_config(),
                Some(text) => match parse_mesh_config(Path::new(&key), text) {
                    Ok(config) => next.config = config,
                    Err(err) => error!("{err}; keeping the previous MeshConfig"),
                },
            }
        }
        if keys.networks {
            let key = format!("ConfigMap {name}, key meshNetworks");
            match data.get("meshNetworks") {
                None => next.networks = MeshNetworks::default(),
                Some(text) => match parse_mesh_networks(Path::new(&key), text) {
                    Ok(networks) => next.networks = networks,
                    Err(err) => error!("{err}; keeping the previous meshNetworks"),
                },
            }
        }
        if publish(&settings, &current, next, &sink) {
            info!(configmap = %name, "mesh settings from the ConfigMap applied; pushing to every proxy");
        }
        synced.store(true, std::sync::atomic::Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshfed_registry::read::DEFAULT_MAX_FILE_SIZE;

    fn p() -> &'static Path {
        Path::new("mesh.yaml")
    }

    #[test]
    fn extension_providers_are_read_from_the_mesh_file_and_bad_ones_refuse_it() {
        let m = parse_mesh_config(
            p(),
            "extensionProviders:\n- name: authz\n  envoyExtAuthzGrpc: {service: foo/authz.foo.svc.cluster.local, port: 9000, timeout: 2s, failOpen: true}\n- name: zipkin\n  zipkin: {service: zipkin.istio-system.svc.cluster.local, port: 9411}\n",
        )
        .expect("valid providers load");
        assert_eq!(m.extension_providers.len(), 2);
        assert_eq!(m.extension_providers[0].name, "authz");
        let bad = parse_mesh_config(
            p(),
            "extensionProviders:\n- name: authz\n  envoyExtAuthzHttp: {service: foo/authz.foo.svc.cluster.local, port: 0}\n",
        );
        let Err(MeshError::Invalid { reason, .. }) = bad else {
            panic!("a provider without a port refuses the file: {bad:?}")
        };
        assert!(
            reason.contains("extensionProviders[0].envoyExtAuthzHttp.port"),
            "{reason}"
        );
    }

    #[test]
    fn fields_meshfed_ignores_are_named_and_agent_settings_are_not() {
        let text = "\
defaultConfig:
  discoveryAddress: istiod:15012
  proxy_metadata: {ISTIO_META_DNS_CAPTURE: \"true\"}
  tracing: {sampling: 5, zipkin: {address: z:9411}, samplng: 3}
  holdApplicationUntilProxyStarts: true
  discoverAddress: typo
enableTracing: true
enableTracng: true
extensionProviders:
- name: z
  zipkin: {service: z.ns.svc.cluster.local, port: 9411, traceContextOption: USE_B3_WITH_W3C_PROPAGATION}
";
        let document: serde_json::Value = serde_norway::from_str(text).unwrap();
        assert_eq!(
            unsupported_fields(MESH_CONFIG, &document),
            vec![
                "defaultConfig.discoverAddress",
                "defaultConfig.tracing.samplng",
                "enableTracng",
                "extensionProviders[0].zipkin.traceContextOption",
            ]
        );
        let warnings = mesh_config_warnings(p(), text);
        assert_eq!(warnings.len(), 4);
        assert!(
            warnings[2]
                .ends_with(": enableTracng: not a mesh config field meshfed supports; ignored"),
            "{}",
            warnings[2]
        );
        // The file still loads, with what it sets that meshfed reads.
        assert!(parse_mesh_config(p(), text).unwrap().enable_tracing);
        let networks: serde_json::Value = serde_norway::from_str(
            "networks: {n1: {endpoints: [{fromRegistry: c1}], gateways: [{address: 1.1.1.1, port: 15443, weight: 1}]}}",
        )
        .unwrap();
        assert_eq!(
            unsupported_fields(MESH_NETWORKS, &networks),
            vec!["networks[n1].gateways[0].weight"]
        );
    }

    #[test]
    fn config_sources_are_checked_naming_the_field() {
        let text = "configSources:\n- address: xds://127.0.0.1:15010\n  subscribedResources: [SERVICE_REGISTRY]\n";
        let config = parse_mesh_config(p(), text).unwrap();
        assert_eq!(config.config_sources[0].address, "xds://127.0.0.1:15010");
        let warnings = mesh_config_warnings(p(), text);
        assert!(
            warnings
                .iter()
                .any(|w| w.contains("configSources[0].subscribedResources")),
            "{warnings:?}"
        );
        let err = parse_mesh_config(
            p(),
            "configSources: [{address: 'k8s://'}, {address: 'k8s://'}]",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("configSources[1].address: a second k8s://"),
            "{err}"
        );
        let err = parse_mesh_config(
            p(),
            "configSources: [{address: 'xds://a:1', tlsSettings: {mode: ISTIO_MUTUAL}}]",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("configSources[0].tlsSettings: not supported"),
            "{err}"
        );
    }

    #[test]
    fn file_fields_override_defaults_and_the_rest_stay() {
        let m = parse_mesh_config(
            p(),
            "rootNamespace: mesh-root\nconnect_timeout: 2s\noutboundTrafficPolicy: {mode: REGISTRY_ONLY}\n",
        )
        .unwrap();
        assert_eq!(m.root_namespace, "mesh-root");
        assert_eq!(
            std::time::Duration::try_from(m.connect_timeout.unwrap())
                .unwrap()
                .as_secs(),
            2
        );
        assert_eq!(
            m.outbound_traffic_policy.unwrap().mode,
            mesh_config::outbound_traffic_policy::Mode::RegistryOnly as i32
        );
        assert_eq!(m.trust_domain, "cluster.local");
        assert_eq!(m.default_service_export_to, vec!["*".to_string()]);
        assert_eq!(m.enable_auto_mtls.map(|b| b.value), Some(true));
        assert_eq!(parse_mesh_config(p(), "").unwrap(), default_mesh_config());
    }

    #[test]
    fn bad_mesh_config_says_why() {
        let err = parse_mesh_config(p(), "connectTimeout: ten seconds\n").unwrap_err();
        assert!(
            err.to_string().starts_with("mesh.yaml: MeshConfig:"),
            "{err}"
        );
        let err = parse_mesh_config(p(), "- a list\n").unwrap_err();
        assert!(err.to_string().contains("mapping"), "{err}");
        let err =
            parse_mesh_config(p(), "outboundTrafficPolicy: {mode: ALLOW_SOME}\n").unwrap_err();
        assert!(err.to_string().contains("ALLOW_SOME"), "{err}");
        let err = parse_mesh_config(p(), "connectTimeout: 0s\n").unwrap_err();
        assert!(err.to_string().contains("connectTimeout"), "{err}");
    }

    #[test]
    fn mesh_networks_parse_and_validate() {
        let n = parse_mesh_networks(
            p(),
            "networks:\n  n1:\n    endpoints: [{fromRegistry: c1}, {fromCidr: 10.0.0.0/8}]\n    gateways: [{address: 1.2.3.4, port: 15443}]\n",
        )
        .unwrap();
        assert_eq!(n.networks["n1"].endpoints.len(), 2);
        let err = parse_mesh_networks(
            p(),
            "networks:\n  n1:\n    endpoints: [{fromCidr: 10.0.0.0/99}]\n",
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("networks.n1.endpoints[0].fromCidr"),
            "{err}"
        );
        let err = parse_mesh_networks(
            p(),
            "networks:\n  n1:\n    gateways: [{address: 1.2.3.4, port: 0}]\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("gateways[0].port"), "{err}");
    }

    #[tokio::test]
    async fn follow_applies_good_edits_and_keeps_the_last_good_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mesh.yaml");
        std::fs::write(&path, "rootNamespace: one\n").unwrap();
        let settings = Arc::new(ArcSwap::from_pointee(
            load_initial(Some(&path), None, DEFAULT_MAX_FILE_SIZE).unwrap(),
        ));
        let (sink, mut rx) = UpdateSink::new(Arc::default());
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let follower = follow(
            path.clone(),
            MeshFile::Config,
            settings.clone(),
            sink,
            DEFAULT_MAX_FILE_SIZE,
            async move {
                let _ = stop_rx.await;
            },
        )
        .unwrap();
        let task = tokio::spawn(follower);
        let tmp = dir.path().join("mesh.tmp");
        std::fs::write(&tmp, "rootNamespace: two\n").unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        let event = tokio::time::timeout(std::time::Duration::from_secs(10), rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert!(
            matches!(event, meshfed_registry::RegistryEvent::Push(ref r) if r.forced),
            "{event:?}"
        );
        assert_eq!(settings.load().config.root_namespace, "two");

        // A bad edit: no push, content kept; the next good edit applies.
        std::fs::write(&path, "rootNamespace: [not, a, string]\n").unwrap();
        std::fs::write(&tmp, "rootNamespace: three\n").unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        let event = tokio::time::timeout(std::time::Duration::from_secs(10), rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert!(matches!(event, meshfed_registry::RegistryEvent::Push(_)));
        assert_eq!(settings.load().config.root_namespace, "three");
        stop_tx.send(()).unwrap();
        task.await.unwrap();
    }

    #[test]
    fn load_initial_refuses_devices_and_files_over_the_limit() {
        let err =
            load_initial(Some(Path::new("/dev/zero")), None, DEFAULT_MAX_FILE_SIZE).unwrap_err();
        assert!(
            err.to_string()
                .contains("/dev/zero: not a regular file (it is a character device)"),
            "{err}"
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mesh.yaml");
        std::fs::write(&path, "rootNamespace: one\n").unwrap();
        let err = load_initial(None, Some(&path), 5).unwrap_err();
        assert!(
            err.to_string().contains(
                "larger than the size limit of 5 bytes (raise it with --maxConfigFileSize)"
            ),
            "{err}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_emptied_mesh_file_applies_only_after_the_settle_period() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mesh.yaml");
        std::fs::write(&path, "rootNamespace: one\n").unwrap();
        let settings = Arc::new(ArcSwap::from_pointee(
            load_initial(Some(&path), None, DEFAULT_MAX_FILE_SIZE).unwrap(),
        ));
        let (sink, _rx) = UpdateSink::new(Arc::default());
        let follower = follow(
            path.clone(),
            MeshFile::Config,
            settings.clone(),
            sink,
            DEFAULT_MAX_FILE_SIZE,
            std::future::pending(),
        )
        .unwrap();
        let task = tokio::spawn(follower);
        // Truncated in place (`: > mesh.yaml`); the watch notices it by itself.
        std::fs::File::create(&path).unwrap();
        let start = tokio::time::Instant::now();
        tokio::time::sleep(EMPTY_SETTLE - std::time::Duration::from_millis(100)).await;
        assert_eq!(
            settings.load().config.root_namespace,
            "one",
            "not reset while the file may still be written"
        );
        let wait = async {
            while settings.load().config.root_namespace == "one" {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(30), wait)
            .await
            .expect("the emptied file applies after the settle period");
        assert!(start.elapsed() >= EMPTY_SETTLE);
        assert_eq!(
            settings.load().config.root_namespace,
            default_mesh_config().root_namespace
        );
        task.abort();
    }
}
