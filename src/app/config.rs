//! The Istio config stores and the snapshot's config source built over them.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use meshfed_api::mesh::v1alpha1::MeshConfig;
use meshfed_kube::{KubeConfigStore, KubeConfigStoreConfig};
use meshfed_registry::UpdateSink;
use meshfed_registry::config::{
    ConfigSourceAddress, ConfigStore, FileConfigStore, MemoryConfigStore, config_source_addresses,
    run_config_dir,
};
use prometheus_client::registry::Registry;
use tokio::task::JoinSet;
use tracing::{error, info};

use super::DiscoveryConfig;
use crate::config_sources::{ClientIdentity, SourceMetrics, SourceStore};
use crate::drain::Shutdown;

/// The Istio config stores: one in memory (for the Rust API), and either the default
/// ones (with `--configDir` one fed from files; with the Kubernetes registry one fed
/// from its API server's CRDs, whose writer starts with the registry once there is a
/// client) or, when the mesh config lists `configSources`, the ones it names (as
/// istiod): `fs://` directories, `k8s://` CRDs and `xds://` sources.
#[derive(Clone, Debug)]
pub(super) struct ConfigStores {
    pub(super) memory: MemoryConfigStore,
    pub(super) files: Option<FileConfigStore>,
    /// Further `fs://` config sources after the first.
    pub(super) more_files: Vec<FileConfigStore>,
    pub(super) kube: Option<KubeConfigStore>,
    /// The `xds://` config sources.
    pub(super) sources: Vec<SourceStore>,
}

/// Which stores to start.
struct Plan {
    dirs: Vec<PathBuf>,
    kube: bool,
    xds: Vec<String>,
}

fn plan(config: &DiscoveryConfig, mesh: &MeshConfig) -> anyhow::Result<Plan> {
    let addresses =
        config_source_addresses(mesh).map_err(|e| anyhow::anyhow!("mesh config: {e}"))?;
    if addresses.is_empty() {
        return Ok(Plan {
            dirs: config.config_dir.iter().cloned().collect(),
            kube: config.kube_config_store,
            xds: Vec::new(),
        });
    }
    if let Some(dir) = &config.config_dir {
        anyhow::bail!(
            "--configDir {}: not read when the mesh config lists configSources (as istiod); \
             list it there as fs://{} instead",
            dir.display(),
            dir.display()
        );
    }
    let mut plan = Plan {
        dirs: Vec::new(),
        kube: false,
        xds: Vec::new(),
    };
    for address in addresses {
        match address {
            ConfigSourceAddress::Xds { authority } => plan.xds.push(authority),
            ConfigSourceAddress::Files(dir) => plan.dirs.push(dir),
            ConfigSourceAddress::Kubernetes => {
                if config.kubernetes.is_none() {
                    anyhow::bail!(
                        "mesh config: configSources lists k8s://, which needs the Kubernetes registry (--registries Kubernetes)"
                    );
                }
                plan.kube = true;
            }
        }
    }
    Ok(plan)
}

/// Who this server says it is to `xds://` sources: its pod, namespace, IP and
/// revision, as istiod's config-source client.
fn identity(config: &DiscoveryConfig) -> ClientIdentity {
    let env = |names: &[&str], default: &str| {
        names
            .iter()
            .find_map(|n| std::env::var(n).ok().filter(|v| !v.is_empty()))
            .unwrap_or_else(|| default.to_string())
    };
    ClientIdentity {
        namespace: config.secure.namespace.clone(),
        workload: env(&["POD_NAME"], "meshfed"),
        ip: env(&["INSTANCE_IP", "POD_IP"], "127.0.0.1"),
        revision: config.secure.revision.clone(),
    }
}

/// Starts following `dir` into a new file store.
fn follow_dir(
    what: &str,
    dir: PathBuf,
    config: &DiscoveryConfig,
    sink: &UpdateSink,
    shutdown: &Shutdown,
    tasks: &mut JoinSet<()>,
) -> anyhow::Result<FileConfigStore> {
    if !dir.is_dir() {
        anyhow::bail!("{what}: not a directory");
    }
    let store = FileConfigStore::new(sink.clone());
    let task_store = store.clone();
    let mut stop = shutdown.clone();
    let limit = config.max_config_file_size;
    info!(dir = %dir.display(), "config: following directory");
    tasks.spawn(async move {
        if let Err(err) =
            run_config_dir(dir, task_store, limit, async move { stop.wait().await }).await
        {
            error!("config directory: {err}");
        }
    });
    Ok(store)
}

impl ConfigStores {
    pub(super) fn start(
        config: &DiscoveryConfig,
        mesh: &MeshConfig,
        sink: &UpdateSink,
        metrics_registry: &mut Registry,
        shutdown: &Shutdown,
        tasks: &mut JoinSet<()>,
    ) -> anyhow::Result<ConfigStores> {
        let memory = MemoryConfigStore::new(sink.clone());
        let plan = plan(config, mesh)?;
        let mut dirs = Vec::new();
        for dir in plan.dirs {
            let what = if config.config_dir.is_some() {
                format!("--configDir {}", dir.display())
            } else {
                format!("configSources fs://{}", dir.display())
            };
            dirs.push(follow_dir(&what, dir, config, sink, shutdown, tasks)?);
        }
        let mut dirs = dirs.into_iter();
        let files = dirs.next();
        let kube = match &config.kubernetes {
            Some(kube) if plan.kube => {
                let store_config = KubeConfigStoreConfig {
                    namespaces: kube.namespaces.clone(),
                    ..KubeConfigStoreConfig::new(config.cluster_id.clone())
                };
                Some(
                    KubeConfigStore::new(store_config, sink.clone())
                        .context("the Kubernetes config store")?,
                )
            }
            _ => None,
        };
        let sources = if plan.xds.is_empty() {
            Vec::new()
        } else {
            let metrics = Arc::new(SourceMetrics::new(metrics_registry));
            crate::config_sources::start(
                &plan.xds,
                &identity(config),
                sink,
                &metrics,
                config.remote_cluster_timeout,
                shutdown,
                tasks,
            )
        };
        Ok(ConfigStores {
            memory,
            files,
            more_files: dirs.collect(),
            kube,
            sources,
        })
    }

    pub(super) fn all(&self) -> Vec<Arc<dyn ConfigStore>> {
        let mut all: Vec<Arc<dyn ConfigStore>> = vec![Arc::new(self.memory.clone())];
        for files in self.files.iter().chain(&self.more_files) {
            all.push(Arc::new(files.clone()));
        }
        if let Some(kube) = &self.kube {
            all.push(Arc::new(kube.clone()));
        }
        for source in &self.sources {
            all.push(Arc::new(source.clone()));
        }
        all
    }
}
