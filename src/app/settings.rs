//! What `meshfed discovery` is configured with: [`DiscoveryConfig`] and the settings of
//! its parts (the secure port, the CA, leader election).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use meshfed_registry::ClusterId;
use meshfed_registry::source::{MockSource, RegistrySource};

use crate::ads::transport::XdsLimits;
use crate::generate::GeneratorOptions;
use crate::push::debounce::DebounceConfig;

pub use meshfed_kube::{KubeSettings, KubeSource, RemoteSecretSettings};

/// The Consul registry's settings (`--registries Consul`, `--consulserverURL`, ...).
pub use meshfed_consul::ConsulConfig as ConsulSettings;

/// Everything `meshfed discovery` is configured with.
#[derive(Clone, Debug)]
pub struct DiscoveryConfig {
    /// Plaintext ADS address (`--grpcAddr`); `None` turns the plaintext port off.
    pub grpc_addr: Option<SocketAddr>,
    /// Secure ADS + CreateCertificate address (`--secureGrpcAddr`, Istio's 15012),
    /// served when there is a CA or serving files; `None` turns it off.
    pub secure_grpc_addr: Option<SocketAddr>,
    /// The validating webhook's HTTPS address (`--httpsAddr`, Istio's 15017), served
    /// when there is a CA or serving files; `None` (the library's default) turns it off.
    pub https_addr: Option<SocketAddr>,
    /// TLS and authentication of the secure port.
    pub secure: SecureSettings,
    /// New xDS streams a second on both ports, burst one
    /// (`--maxRequestsPerSecond`, Istio's `PILOT_MAX_REQUESTS_PER_SECOND`); `None`:
    /// no limit.
    pub max_requests_per_second: Option<f64>,
    /// `/ready` and debug address.
    pub http_addr: SocketAddr,
    /// `/metrics`, `/version` and debug address.
    pub monitoring_addr: SocketAddr,
    /// Limits of the two admin ports (`--adminReadHeaderTimeout`,
    /// `--adminIdleTimeout`, `--adminMaxConnections`), each port separately.
    pub admin_limits: crate::admin::AdminLimits,
    /// meshfed's own cluster id.
    pub cluster_id: ClusterId,
    /// DNS domain suffix (`--domain`, default `cluster.local`).
    pub domain: String,
    /// The GatewayClass controller name whose Gateway API Gateways are served
    /// (`--gatewayControllerName`, Istio's `PILOT_GATEWAY_API_CONTROLLER_NAME`; default
    /// `istio.io/gateway-controller`).
    pub gateway_controller_name: String,
    /// Mock registry source.
    pub mock: MockSource,
    /// The Kubernetes registry, when enabled.
    pub kubernetes: Option<KubeSettings>,
    /// With the Kubernetes registry: also read Istio config (the `networking.istio.io`
    /// CRDs) from its API server (`--kubeConfigStore`, default on).
    pub kube_config_store: bool,
    /// The Consul registry, when enabled.
    pub consul: Option<ConsulSettings>,
    /// Further registries (a registry crate's [`RegistrySource`]), started after the
    /// ones above in this order.
    pub registries: Vec<Arc<dyn RegistrySource>>,
    /// `--configDir`: Istio config files, watched.
    pub config_dir: Option<PathBuf>,
    /// `--meshConfig`: MeshConfig YAML (Istio defaults when absent).
    pub mesh_config: Option<PathBuf>,
    /// `--networksConfig`: meshNetworks YAML.
    pub networks_config: Option<PathBuf>,
    /// Debounce timings.
    pub debounce: DebounceConfig,
    /// Concurrent pushes.
    pub push_throttle: usize,
    /// Limits of the xDS port.
    pub xds_limits: XdsLimits,
    /// The mesh CA (`--caDir`, `--cacertsDir`); `None`: no CA.
    pub ca: Option<CaSource>,
    /// With the Kubernetes registry: leader election over a Lease in the system
    /// namespace, for singleton duties (`--leaderElection`); `None` turns it off.
    pub lease: Option<LeaseSettings>,
    /// With the Kubernetes registry: the ConfigMap in the system namespace whose `mesh`
    /// and `meshNetworks` keys supply the mesh settings not given as files
    /// (`--meshConfigMap`, istiod's `istio`); `None` turns it off.
    pub mesh_config_map: Option<String>,
    /// How long after start readiness waits for the remote clusters present then
    /// (`--remoteClusterTimeout`, Istio's `PILOT_REMOTE_CLUSTER_TIMEOUT`); later ones
    /// never affect readiness.
    pub remote_cluster_timeout: Duration,
    /// Generator settings.
    pub generator: GeneratorOptions,
    /// Let non-loopback callers use the debug endpoints.
    pub debug_open: bool,
    /// How long shutdown waits for tasks before aborting them, after the drain.
    pub drain_deadline: Duration,
    /// Over how long the ADS streams are closed at shutdown (`--drainDuration`), so
    /// their proxies move to other replicas gradually; zero closes them all at once.
    pub drain_duration: Duration,
    /// `--maxConfigFileSize`: the size limit of every watched file (mock registry,
    /// `--configDir` files, mesh files), in bytes.
    pub max_config_file_size: u64,
    /// Run-time log level control for `/logging` (set by the binary).
    pub log_control: Option<crate::logging::LogControl>,
    /// WorkloadEntry auto-registration and health (`--workloadEntryGracePeriod`, ...);
    /// its `max_connection_age` is taken from `xds_limits`.
    pub workload_entries: crate::autoregistration::Settings,
    /// Config status (`--enableStatus`, Istio's `PILOT_ENABLE_STATUS`): with the
    /// Kubernetes config store, the leader writes `status` on Istio config objects at
    /// this pace; `None` (the default) writes nothing.
    pub status: Option<meshfed_kube::status::StatusSettings>,
    /// MCP-over-xDS serving (`--mcpExportRegistries`, `--mcpExportNamespaces`,
    /// `--mcpAllowedIdentities`).
    pub mcp: McpSettings,
}

/// What MCP-over-xDS exports and to whom (see `crate::ads::mcp`).
#[derive(Clone, Debug, Default)]
pub struct McpSettings {
    /// Registries whose services are synthesized, by provider name; `None`: every
    /// registry but Kubernetes (`--mcpExportRegistries`).
    pub export_registries: Option<Vec<String>>,
    /// Namespaces exported; empty: all (`--mcpExportNamespaces`).
    pub export_namespaces: Vec<String>,
    /// Identities allowed to read MCP on the secure port; `None`: every identity of
    /// the system namespace (`--mcpAllowedIdentities`).
    pub allowed_identities: Option<Vec<String>>,
}

impl McpSettings {
    /// The serving state these settings describe, for a server of `cluster_id` in
    /// `system_namespace`; an error names the bad entry.
    pub fn serving(
        &self,
        cluster_id: &ClusterId,
        system_namespace: &str,
    ) -> anyhow::Result<crate::ads::mcp::McpServing> {
        use crate::ads::mcp::{McpAllowList, McpServing};
        let allowed = match &self.allowed_identities {
            None => McpAllowList::system(system_namespace),
            Some(entries) => McpAllowList::parse(entries).map_err(anyhow::Error::msg)?,
        };
        if let Some(names) = &self.export_registries {
            for name in names.iter().map(|n| n.trim()).filter(|n| !n.is_empty()) {
                let known = crate::registries::KINDS
                    .iter()
                    .any(|k| k.name().eq_ignore_ascii_case(name));
                if !known {
                    let kinds: Vec<&str> =
                        crate::registries::KINDS.iter().map(|k| k.name()).collect();
                    anyhow::bail!(
                        "--mcpExportRegistries: unknown registry {name:?} (known: {})",
                        kinds.join(", ")
                    );
                }
            }
        }
        let export = crate::generate::mcp::McpExport {
            registries: self.export_registries.as_ref().map(|names| {
                names
                    .iter()
                    .map(|n| n.trim().to_string())
                    .filter(|n| !n.is_empty())
                    .collect()
            }),
            namespaces: self
                .export_namespaces
                .iter()
                .map(|n| n.trim().to_string())
                .filter(|n| !n.is_empty())
                .collect(),
            local_cluster: cluster_id.to_string(),
        };
        Ok(McpServing::new(export, allowed))
    }
}

impl DiscoveryConfig {
    /// Adds a registry: the built-in kinds (the mock, Kubernetes and Consul
    /// registries) go to their own fields, any other to [`DiscoveryConfig::registries`].
    pub fn add_registry(&mut self, source: Arc<dyn RegistrySource>) {
        let any: &dyn std::any::Any = &*source;
        if let Some(mock) = any.downcast_ref::<MockSource>() {
            self.mock = mock.clone();
        } else if let Some(kube) = any.downcast_ref::<KubeSettings>() {
            self.kubernetes = Some(kube.clone());
        } else if let Some(consul) = any.downcast_ref::<ConsulSettings>() {
            self.consul = Some(consul.clone());
        } else {
            self.registries.push(source);
        }
    }
}

impl Default for DiscoveryConfig {
    fn default() -> Self {
        let local = |port| SocketAddr::from(([127, 0, 0, 1], port));
        DiscoveryConfig {
            grpc_addr: Some(local(15010)),
            secure_grpc_addr: Some(local(15012)),
            https_addr: None,
            secure: SecureSettings::default(),
            max_requests_per_second: Some(crate::ads::rate::istio_default_rate(
                std::thread::available_parallelism().map_or(1, |n| n.get()),
            )),
            http_addr: local(8080),
            monitoring_addr: local(15014),
            admin_limits: crate::admin::AdminLimits::default(),
            cluster_id: ClusterId::new("Kubernetes"),
            domain: "cluster.local".into(),
            gateway_controller_name: meshfed_registry::config::gateway_api::DEFAULT_CONTROLLER
                .into(),
            mock: MockSource::Embedded,
            kubernetes: None,
            kube_config_store: true,
            consul: None,
            registries: Vec::new(),
            config_dir: None,
            mesh_config: None,
            networks_config: None,
            debounce: DebounceConfig::default(),
            push_throttle: 100,
            xds_limits: XdsLimits::default(),
            ca: None,
            lease: Some(LeaseSettings::default()),
            mesh_config_map: Some("istio".into()),
            remote_cluster_timeout: Duration::from_secs(30),
            generator: GeneratorOptions::default(),
            debug_open: false,
            drain_deadline: Duration::from_secs(5),
            drain_duration: Duration::from_secs(5),
            max_config_file_size: meshfed_registry::read::DEFAULT_MAX_FILE_SIZE,
            log_control: None,
            workload_entries: crate::autoregistration::Settings::default(),
            status: None,
            mcp: McpSettings::default(),
        }
    }
}

/// TLS and authentication of the secure port.
#[derive(Clone, Debug)]
pub struct SecureSettings {
    /// The operator's serving files (`--tlsCertFile`, `--tlsKeyFile`,
    /// `--caCertFile`); `None`: a certificate issued by the mesh CA.
    pub tls_files: Option<crate::tls::TlsFiles>,
    /// Extra DNS names of the CA-issued serving certificate (Istio's
    /// `ISTIOD_CUSTOM_HOST`).
    pub custom_hosts: Vec<String>,
    /// The control plane revision (`istiod-<revision>.<ns>.svc` in the DNS names).
    pub revision: String,
    /// The namespace of the control plane's DNS names (`--systemNamespace`).
    pub namespace: String,
    /// `--tlsMinVersion`.
    pub min_version: crate::tls::TlsMinVersion,
    /// Third-party JWT issuer (Istio's `JWT_RULE`), JSON.
    pub jwt_rule: Option<String>,
    /// Audiences a Kubernetes token must have (Istio's `TOKEN_AUDIENCES`).
    pub token_audiences: Vec<String>,
    /// Where to write the root bundle for workloads outside Kubernetes
    /// (`--rootCertFile`).
    pub root_cert_file: Option<PathBuf>,
    /// `(namespace, service account)` pairs that may impersonate the workloads of
    /// their node (Istio's `CA_TRUSTED_NODE_ACCOUNTS`); empty refuses impersonation.
    pub trusted_node_accounts: std::collections::BTreeSet<(String, String)>,
}

impl Default for SecureSettings {
    fn default() -> Self {
        SecureSettings {
            tls_files: None,
            custom_hosts: Vec::new(),
            revision: String::new(),
            namespace: "istio-system".into(),
            min_version: crate::tls::TlsMinVersion::V12,
            jwt_rule: None,
            token_audiences: vec!["istio-ca".into()],
            root_cert_file: None,
            trusted_node_accounts: [("istio-system".to_string(), "ztunnel".to_string())].into(),
        }
    }
}

/// Where the mesh CA comes from.
#[derive(Clone, Debug)]
pub enum CaSource {
    /// Outside Kubernetes: a plugged-in CA from the `cacerts` directory when its
    /// files are there (`--cacertsDir`), else the self-signed root kept in
    /// `self_signed_dir` (created on first start, `--caDir`).
    Dir {
        /// Istio's `cacerts` files: ca-cert.pem, ca-key.pem, root-cert.pem,
        /// cert-chain.pem.
        cacerts: Option<PathBuf>,
        /// Where the self-signed root is kept.
        self_signed_dir: PathBuf,
    },
    /// With the Kubernetes registry (Istio's layout): the `cacerts` directory when
    /// mounted and complete, else the `cacerts` Secret of the system namespace, else
    /// the self-signed root of Secret `istio-ca-secret` (created once; every replica
    /// shares it).
    Kubernetes {
        /// A mounted `cacerts` Secret.
        cacerts: Option<PathBuf>,
    },
}

/// Leader election settings (client-go's defaults).
#[derive(Clone, Debug)]
pub struct LeaseSettings {
    /// The Lease's name in the system namespace.
    pub name: String,
    /// This replica's identity (`--leaseIdentity`; else `$POD_NAME`; else the host
    /// name and process id).
    pub identity: Option<String>,
    /// How long an unrenewed Lease stays with its holder.
    pub duration: Duration,
    /// How often it is renewed (and retried by the others).
    pub renew_every: Duration,
}

impl Default for LeaseSettings {
    fn default() -> Self {
        LeaseSettings {
            name: "meshfed-leader".into(),
            identity: None,
            duration: Duration::from_secs(15),
            renew_every: Duration::from_secs(2),
        }
    }
}

impl LeaseSettings {
    pub(super) fn identity(&self) -> String {
        if let Some(id) = &self.identity {
            return id.clone();
        }
        if let Ok(pod) = std::env::var("POD_NAME")
            && !pod.is_empty()
        {
            return pod;
        }
        let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
        format!("{}-{}", host.trim(), std::process::id())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mcp_settings_reject_unknown_registries_and_identities() {
        let cluster = ClusterId::new("Kubernetes");
        let serving = McpSettings::default()
            .serving(&cluster, "istio-system")
            .unwrap();
        assert!(serving.admits(
            true,
            Some("spiffe://cluster.local/ns/istio-system/sa/istiod")
        ));
        let listed = McpSettings {
            export_registries: Some(vec!["consul".into(), " Mock".into()]),
            ..McpSettings::default()
        };
        assert!(listed.serving(&cluster, "istio-system").is_ok());
        let typo = McpSettings {
            export_registries: Some(vec!["Consull".into()]),
            ..McpSettings::default()
        };
        let err = typo
            .serving(&cluster, "istio-system")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--mcpExportRegistries") && err.contains("Consull"),
            "{err}"
        );
        let bad = McpSettings {
            allowed_identities: Some(vec!["nobody".into()]),
            ..McpSettings::default()
        };
        let err = bad
            .serving(&cluster, "istio-system")
            .unwrap_err()
            .to_string();
        assert!(err.contains("--mcpAllowedIdentities"), "{err}");
    }
}
