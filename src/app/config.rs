//! The Istio config stores and the snapshot's config source built over them.

use std::sync::Arc;

use anyhow::Context;
use meshfed_kube::{KubeConfigStore, KubeConfigStoreConfig};
use meshfed_registry::UpdateSink;
use meshfed_registry::config::{ConfigStore, FileConfigStore, MemoryConfigStore, run_config_dir};
use tokio::task::JoinSet;
use tracing::{error, info};

use super::DiscoveryConfig;
use crate::drain::Shutdown;

/// The Istio config stores: one in memory (for the Rust API), with `--configDir` one
/// fed from files, and with the Kubernetes registry one fed from its API server's CRDs
/// (its writer starts with the registry, once there is a client).
#[derive(Clone, Debug)]
pub(super) struct ConfigStores {
    pub(super) memory: MemoryConfigStore,
    pub(super) files: Option<FileConfigStore>,
    pub(super) kube: Option<KubeConfigStore>,
}

impl ConfigStores {
    pub(super) fn start(
        config: &DiscoveryConfig,
        sink: &UpdateSink,
        shutdown: &Shutdown,
        tasks: &mut JoinSet<()>,
    ) -> anyhow::Result<ConfigStores> {
        let memory = MemoryConfigStore::new(sink.clone());
        let files = match &config.config_dir {
            None => None,
            Some(dir) => {
                if !dir.is_dir() {
                    anyhow::bail!("--configDir {}: not a directory", dir.display());
                }
                let store = FileConfigStore::new(sink.clone());
                let task_store = store.clone();
                let dir = dir.clone();
                let mut stop = shutdown.clone();
                let limit = config.max_config_file_size;
                info!(dir = %dir.display(), "config: following directory");
                tasks.spawn(async move {
                    if let Err(err) =
                        run_config_dir(dir, task_store, limit, async move { stop.wait().await })
                            .await
                    {
                        error!("config directory: {err}");
                    }
                });
                Some(store)
            }
        };
        let kube = match &config.kubernetes {
            Some(kube) if config.kube_config_store => {
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
        Ok(ConfigStores {
            memory,
            files,
            kube,
        })
    }

    pub(super) fn all(&self) -> Vec<Arc<dyn ConfigStore>> {
        let mut all: Vec<Arc<dyn ConfigStore>> = vec![Arc::new(self.memory.clone())];
        if let Some(files) = &self.files {
            all.push(Arc::new(files.clone()));
        }
        if let Some(kube) = &self.kube {
            all.push(Arc::new(kube.clone()));
        }
        all
    }
}
