//! The Kubernetes registry as a source: `--registries Kubernetes`, its flags, the local
//! cluster's registry and the remote-cluster secret controller.
//!
//! A Kubernetes cluster is more than a registry to the server (the CA's Secrets, the
//! leader Lease, gateway credentials, TokenReviews, the mesh ConfigMap, the Istio CRD
//! store); those it builds itself from the client this source hands back
//! ([`KubeCluster`]).

use std::path::PathBuf;
use std::sync::Arc;

use clap::{Args, FromArgMatches};
use meshfed_registry::ClusterId;
use meshfed_registry::source::{
    BoxError, BoxFuture, CommonSettings, RegistryKind, RegistrySource, SourceContext, SourceError,
    SourceReadiness, StartedSource,
};
use tracing::info;

use crate::{
    Client, GatewayServiceRef, KubeRegistry, KubeRegistryConfig, KubeconfigPolicy, MeshGateways,
    MulticlusterConfig, NamespaceFilter, SecretController,
};

/// Istio log scopes of this crate and the tracing target each covers.
pub const LOG_SCOPES: &[(&str, &str)] = &[("kube", "meshfed_kube")];

/// How to reach a Kubernetes API server for the Kubernetes registry.
#[derive(Clone)]
pub enum KubeSource {
    /// `--kubeconfig FILE`, else `KUBECONFIG`, else in-cluster config.
    Kubeconfig(Option<PathBuf>),
    /// A ready client (tests and embedding applications).
    Client(Client),
}

impl std::fmt::Debug for KubeSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KubeSource::Kubeconfig(p) => f.debug_tuple("Kubeconfig").field(p).finish(),
            KubeSource::Client(_) => f.write_str("Client(..)"),
        }
    }
}

/// The Kubernetes registry's settings.
#[derive(Clone, Debug)]
pub struct KubeSettings {
    /// Where the API server is.
    pub source: KubeSource,
    /// Which namespaces to publish (`--appNamespace`; all by default).
    pub namespaces: NamespaceFilter,
    /// Istio's system namespace (network label, remote secrets).
    pub system_namespace: String,
    /// Remote clusters from kubeconfig Secrets in the local cluster.
    pub remote_secrets: RemoteSecretSettings,
}

/// The remote-cluster secret controller (reference §3): Secrets labelled
/// `istio/multiCluster=true`, each data key a cluster id and its kubeconfig.
#[derive(Clone, Debug)]
pub struct RemoteSecretSettings {
    /// `--clusterRegistriesNamespace`: the namespace whose Secrets are read (default
    /// `istio-system`); `None` turns the controller off.
    pub namespace: Option<String>,
    /// `--allowInsecureKubeconfig`: kubeconfig options allowed although they run a
    /// command or read local files (`exec`, `tokenFile`, `clientCertificate`,
    /// `clientKey`, `certificateAuthority`, an auth provider name, or `all`).
    pub allow_insecure: Vec<String>,
}

impl Default for RemoteSecretSettings {
    fn default() -> Self {
        RemoteSecretSettings {
            namespace: Some("istio-system".into()),
            allow_insecure: Vec::new(),
        }
    }
}

/// The Kubernetes registry's flags (`--systemNamespace` is the server's: the CA and
/// the serving certificate read it too).
#[derive(Args, Clone, Debug)]
pub struct KubeArgs {
    /// Kubeconfig for the local cluster (else KUBECONFIG, else in-cluster config).
    #[arg(long = "kubeconfig")]
    pub kubeconfig: Option<PathBuf>,
    /// Only publish services of these namespaces (comma separated; default all).
    #[arg(long = "appNamespace", value_delimiter = ',')]
    pub app_namespace: Vec<String>,
    /// Namespace of the remote-cluster Secrets (labelled `istio/multiCluster=true`, one
    /// data key per cluster id holding its kubeconfig) in the local cluster. Empty
    /// turns remote clusters off.
    #[arg(long = "clusterRegistriesNamespace", default_value = "istio-system")]
    pub cluster_registries_namespace: String,
    /// Kubeconfig options remote-cluster Secrets may use although they run a command or
    /// read the control plane's files (comma separated): exec, tokenFile,
    /// clientCertificate, clientKey, certificateAuthority, an auth provider name, or
    /// all. Refused by default.
    #[arg(long = "allowInsecureKubeconfig", value_delimiter = ',')]
    pub allow_insecure_kubeconfig: Vec<String>,
}

impl KubeArgs {
    /// The registry's settings from the flags.
    pub fn settings(&self, system_namespace: &str) -> KubeSettings {
        KubeSettings {
            source: KubeSource::Kubeconfig(self.kubeconfig.clone()),
            namespaces: if self.app_namespace.is_empty() {
                NamespaceFilter::All
            } else {
                NamespaceFilter::Names(self.app_namespace.iter().cloned().collect())
            },
            system_namespace: system_namespace.to_string(),
            remote_secrets: RemoteSecretSettings {
                namespace: Some(self.cluster_registries_namespace.clone())
                    .filter(|ns| !ns.is_empty()),
                allow_insecure: self.allow_insecure_kubeconfig.clone(),
            },
        }
    }
}

/// `--registries Kubernetes`.
#[derive(Clone, Copy, Debug)]
pub struct KubeKind;

impl RegistryKind for KubeKind {
    fn name(&self) -> &'static str {
        "Kubernetes"
    }

    fn log_scopes(&self) -> &'static [(&'static str, &'static str)] {
        LOG_SCOPES
    }

    fn augment_args(&self, cmd: clap::Command) -> clap::Command {
        KubeArgs::augment_args(cmd)
    }

    fn source(
        &self,
        flags: &clap::ArgMatches,
        common: &CommonSettings,
    ) -> Result<Arc<dyn RegistrySource>, BoxError> {
        let args = KubeArgs::from_arg_matches(flags)?;
        Ok(Arc::new(args.settings(&common.system_namespace)))
    }

    fn check_unselected(&self, flags: &clap::ArgMatches) -> Result<(), BoxError> {
        if KubeArgs::from_arg_matches(flags)?.kubeconfig.is_some() {
            return Err(SourceError::msg(
                "--kubeconfig needs the Kubernetes registry in --registries",
            )
            .into());
        }
        Ok(())
    }

    fn detected(&self, flags: &clap::ArgMatches) -> bool {
        KubeArgs::from_arg_matches(flags).is_ok_and(|a| a.kubeconfig.is_some())
            || std::env::var_os("KUBECONFIG").is_some()
            || std::env::var_os("KUBERNETES_SERVICE_HOST").is_some()
    }
}

/// The local cluster as the server uses it beyond its registry: the started source's
/// handle.
#[derive(Clone)]
pub struct KubeCluster {
    /// The local cluster's client.
    pub client: Client,
    /// The remote-cluster secret controller, unless turned off.
    pub remotes: Option<Arc<SecretController>>,
}

impl std::fmt::Debug for KubeCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeCluster")
            .field("remotes", &self.remotes.is_some())
            .finish_non_exhaustive()
    }
}

impl RegistrySource for KubeSettings {
    fn start<'a>(
        &'a self,
        ctx: SourceContext<'a>,
    ) -> BoxFuture<'a, Result<StartedSource, BoxError>> {
        Box::pin(self.start_cluster(ctx))
    }
}

impl KubeSettings {
    async fn start_cluster(&self, mut ctx: SourceContext<'_>) -> Result<StartedSource, BoxError> {
        let client = match &self.source {
            KubeSource::Client(client) => client.clone(),
            KubeSource::Kubeconfig(path) => {
                crate::client_from(path.as_deref()).await.map_err(|e| {
                    SourceError::new(
                        "connecting to Kubernetes (--kubeconfig, KUBECONFIG or in-cluster config)",
                        e,
                    )
                })?
            }
        };
        // meshNetworks `registryServiceName` gateways, read live so reloads apply.
        let lookup = ctx.mesh_gateways.clone();
        let mesh_gateways = MeshGateways::new(move |cluster| {
            lookup
                .for_cluster(cluster)
                .into_iter()
                .map(|g| GatewayServiceRef {
                    network: g.network,
                    hostname: g.hostname,
                    port: g.port,
                })
                .collect()
        });
        let registry_config = KubeRegistryConfig {
            cluster_id: ctx.cluster_id.clone(),
            domain: ctx.domain.to_string(),
            trust_domain: ctx.trust_domain.to_string(),
            system_namespace: self.system_namespace.clone(),
            namespaces: self.namespaces.clone(),
            mesh_gateways,
            workload_entries: ctx.workload_entries.clone(),
            ambient_workloads: true,
        };
        let (registry, writer) = KubeRegistry::start(
            client.clone(),
            registry_config.clone(),
            ctx.sink.clone(),
            ctx.stop.wait(),
        )
        .await
        .map_err(|e| SourceError::new("starting the Kubernetes registry", e))?;
        ctx.aggregate.add_registry(registry);
        ctx.tasks.spawn(async move {
            let _ = writer.await;
        });
        info!(cluster = %ctx.cluster_id, "Kubernetes registry started; /ready waits for its initial sync");

        let remotes = self.start_remotes(&client, registry_config, &mut ctx);
        Ok(StartedSource {
            readiness: remotes.clone().map(|controller| {
                Arc::new(RemoteClusters {
                    controller,
                    timeout: ctx.remote_cluster_timeout,
                }) as Arc<dyn SourceReadiness>
            }),
            metrics: remotes.clone().map(|c| {
                Box::new(move |r: &mut prometheus_client::registry::Registry| c.register_metrics(r))
                    as meshfed_registry::source::RegisterMetrics
            }),
            handle: Some(Arc::new(KubeCluster { client, remotes })),
        })
    }

    /// Starts the remote-cluster secret controller, unless turned off.
    fn start_remotes(
        &self,
        client: &Client,
        registry_config: KubeRegistryConfig,
        ctx: &mut SourceContext<'_>,
    ) -> Option<Arc<SecretController>> {
        let namespace = self.remote_secrets.namespace.as_ref()?;
        let multicluster = MulticlusterConfig {
            namespace: namespace.clone(),
            policy: KubeconfigPolicy::allowing(&self.remote_secrets.allow_insecure),
            sync_timeout: ctx.remote_cluster_timeout,
            ..MulticlusterConfig::new(ctx.cluster_id.clone(), registry_config)
        };
        let (controller, task) = SecretController::start(
            client.clone(),
            multicluster,
            ctx.aggregate.clone(),
            ctx.sink.clone(),
            ctx.stop.wait(),
        );
        ctx.tasks.spawn(async move {
            let _ = task.await;
        });
        info!(%namespace, "remote cluster secret controller started (Secrets labelled istio/multiCluster=true)");
        Some(controller)
    }
}

/// Readiness of the remote clusters: the Secrets' initial list, and the clusters they
/// name at start, each waited for during the start-up window only.
#[derive(Debug)]
struct RemoteClusters {
    controller: Arc<SecretController>,
    /// `--remoteClusterTimeout`, for the message.
    timeout: std::time::Duration,
}

impl SourceReadiness for RemoteClusters {
    fn pending(&self, within_remote_timeout: bool) -> Vec<String> {
        let mut pending = Vec::new();
        if !self.controller.has_synced() {
            pending.push("remote cluster secrets (initial list)".to_string());
        }
        for cluster in self.controller.clusters() {
            if !cluster.synced && within_remote_timeout {
                pending.push(format!(
                    "remote cluster {} (waited for at most {:?} after start, --remoteClusterTimeout)",
                    cluster.cluster, self.timeout
                ));
            }
        }
        pending
    }

    fn remote_clusters(&self) -> Vec<ClusterId> {
        self.controller
            .clusters()
            .into_iter()
            .map(|c| c.cluster)
            .collect()
    }
}
