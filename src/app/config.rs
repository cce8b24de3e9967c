//! The Istio config stores and the snapshot's config source built over them.

use std::sync::Arc;

use anyhow::Context;
use meshfed_kube::{KubeConfigStore, KubeConfigStoreConfig};
use meshfed_registry::UpdateSink;
use meshfed_registry::config::{
    ConfigObject, ConfigStore, FileConfigStore, MemoryConfigStore, Spec, run_config_dir,
};
use tokio::task::JoinSet;
use tracing::{error, info};

use super::DiscoveryConfig;
use crate::drain::Shutdown;
use crate::push::config_index::{Config, ConfigIndex, ConfigSet};
use crate::push::{ConfigSourceFn, PushMetrics};

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

    /// Builds the snapshot's config index from every store.
    pub(super) fn source(
        &self,
        domain: &str,
        metrics: Arc<PushMetrics>,
        jwks: crate::jwks::JwksResolver,
    ) -> ConfigSourceFn {
        let stores = self.all();
        let domain = domain.to_string();
        // The security objects last warned about, so a WARN goes out when they change.
        let warned: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
        Arc::new(move |mesh| {
            let mut set = ConfigSet::default();
            let rejected: usize = stores.iter().map(|s| s.rejected().len()).sum();
            metrics.config_rejected.set(rejected as i64);
            let mut not_enforced = Vec::new();
            for store in &stores {
                for object in store.all() {
                    if let Some(gap) = meshfed_registry::config::validate::not_enforced_in(
                        &object,
                        Some(&mesh.config),
                    ) {
                        not_enforced.push(format!(
                            "{} {}/{} ({}): {gap}",
                            object.kind, object.namespace, object.name, object.source
                        ));
                    }
                    add_to_set(&mut set, &object);
                }
            }
            metrics.config_not_enforced.set(not_enforced.len() as i64);
            not_enforced.sort();
            let mut last = warned.lock().unwrap_or_else(|e| e.into_inner());
            if *last != not_enforced {
                if !not_enforced.is_empty() {
                    tracing::warn!(
                        objects = %not_enforced.join("; "),
                        "security.istio.io objects meshfed does not fully apply yet"
                    );
                }
                *last = not_enforced;
            }
            // The keys of the RequestAuthentications as fetched so far; new ones are
            // fetched now and push when they arrive.
            let keys = jwks.table_for(&set.request_authentications);
            ConfigIndex::new(set, &domain, mesh).with_jwks(keys)
        })
    }
}

fn add_to_set(set: &mut ConfigSet, object: &ConfigObject) {
    fn wrap<T: Clone>(o: &ConfigObject, spec: &T) -> Config<T> {
        Config {
            name: o.name.clone(),
            namespace: o.namespace.clone(),
            labels: o.labels.clone(),
            annotations: o.annotations.clone(),
            creation_time: o.creation_time,
            spec: spec.clone(),
        }
    }
    match &object.spec {
        Spec::VirtualService(vs) => set.virtual_services.push(wrap(object, vs)),
        Spec::DestinationRule(dr) => set.destination_rules.push(wrap(object, dr)),
        Spec::Gateway(g) => set.gateways.push(wrap(object, g)),
        Spec::Sidecar(sc) => set.sidecars.push(wrap(object, sc)),
        Spec::PeerAuthentication(pa) => set.peer_authentications.push(wrap(object, pa)),
        Spec::RequestAuthentication(ra) => set.request_authentications.push(wrap(object, ra)),
        Spec::AuthorizationPolicy(ap) => set.authorization_policies.push(wrap(object, ap)),
        // ServiceEntry and WorkloadEntry feed the service registry, not the indexes.
        Spec::ServiceEntry(_) | Spec::WorkloadEntry(_) => {}
    }
}
