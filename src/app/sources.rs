//! Starting the registries: every source of the config, each through the same
//! [`RegistrySource`] trait, then what the local Kubernetes cluster offers besides its
//! registry.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use meshfed_kube::{KubeCluster, LeaseState};
use meshfed_registry::MockFileStatus;
use meshfed_registry::source::{
    MeshGatewayLookup, RegistryServiceGateway, RegistrySource, ServiceEntrySource, SourceContext,
    StartedSource, StopSignal,
};
use tokio::task::JoinSet;

use super::kube::{self, Platform};
use super::{Core, DiscoveryConfig};
use crate::drain::Shutdown;

/// The started registries.
pub(super) struct Registries {
    /// Every started source, in start order.
    pub(super) started: Vec<StartedSource>,
    /// The local Kubernetes cluster, with the Kubernetes registry.
    pub(super) kube: Option<Arc<KubeCluster>>,
    /// Leader election (with Kubernetes; else this replica is the sole leader).
    pub(super) lease_state: Arc<LeaseState>,
    /// The mesh ConfigMap's name and synced flag, when followed.
    pub(super) mesh_map_synced: Option<(String, Arc<AtomicBool>)>,
    /// The optional duties (CA Secret, Lease, root ConfigMaps, status) and their state.
    pub(super) duties: Arc<meshfed_kube::Duties>,
}

impl Registries {
    /// The local cluster's client.
    pub(super) fn kube_client(&self) -> Option<&meshfed_kube::Client> {
        self.kube.as_ref().map(|k| &k.client)
    }

    /// The remote-cluster secret controller.
    pub(super) fn remotes(&self) -> Option<Arc<meshfed_kube::SecretController>> {
        self.kube.as_ref().and_then(|k| k.remotes.clone())
    }

    /// The mock registry file's load counters, when one is followed.
    pub(super) fn mock_status(&self) -> Option<MockFileStatus> {
        self.started
            .iter()
            .find_map(|s| s.handle::<MockFileStatus>())
            .map(|status| (*status).clone())
    }
}

/// The registries of `config`, in start order: the ServiceEntry registry over the
/// config stores, the mock registry, Kubernetes, Consul, then the others.
fn sources(config: &DiscoveryConfig, core: &Core) -> Vec<Arc<dyn RegistrySource>> {
    let mut list: Vec<Arc<dyn RegistrySource>> = vec![
        Arc::new(ServiceEntrySource {
            stores: core.config_stores.all(),
        }),
        Arc::new(config.mock.clone()),
    ];
    if let Some(kube) = &config.kubernetes {
        list.push(Arc::new(kube.clone()));
    }
    if let Some(consul) = &config.consul {
        list.push(Arc::new(consul.clone()));
    }
    list.extend(config.registries.iter().cloned());
    list
}

/// Starts every registry of `config`, then the Kubernetes cluster's other services.
pub(super) async fn start(
    config: &DiscoveryConfig,
    core: &Core,
    shutdown: &Shutdown,
    tasks: &mut JoinSet<()>,
) -> anyhow::Result<Registries> {
    let stop = {
        let shutdown = shutdown.clone();
        StopSignal::new(move || {
            let mut stop = shutdown.clone();
            Box::pin(async move { stop.wait().await })
        })
    };
    let mesh_gateways = mesh_gateway_lookup(core);
    let trust_domain = core.mesh.load().config.trust_domain.clone();
    // WorkloadEntries, from the ServiceEntry source to the Kubernetes one.
    let workload_entries =
        workload_entry_feed(std::env::var(SELECT_WORKLOAD_ENTRIES_ENV).ok().as_deref())?;
    let mut started = Vec::new();
    for source in sources(config, core) {
        let ctx = SourceContext {
            cluster_id: &config.cluster_id,
            domain: &config.domain,
            trust_domain: &trust_domain,
            max_file_size: config.max_config_file_size,
            remote_cluster_timeout: config.remote_cluster_timeout,
            mesh_gateways: &mesh_gateways,
            workload_entries: &workload_entries,
            aggregate: &core.aggregate,
            sink: &core.sink,
            stop: &stop,
            tasks: &mut *tasks,
        };
        started.push(source.start(ctx).await.map_err(|e| anyhow::anyhow!(e))?);
    }
    let kube = started.iter().find_map(|s| s.handle::<KubeCluster>());
    let lease_state = kube::lease_state(config);
    let duties = Arc::new(meshfed_kube::Duties::default());
    let mut mesh_map_synced = None;
    if let (Some(settings), Some(cluster)) = (&config.kubernetes, &kube) {
        let platform = Platform {
            config,
            kube: settings,
            cluster,
            shutdown,
            duties: &duties,
        };
        mesh_map_synced = platform.start(
            core.config_stores.kube.as_ref(),
            &lease_state,
            &core.mesh,
            &core.sink,
            tasks,
        );
    }
    Ok(Registries {
        started,
        kube,
        lease_state,
        mesh_map_synced,
        duties,
    })
}

/// Istio's switch for Kubernetes Services selecting WorkloadEntries (on by default).
pub const SELECT_WORKLOAD_ENTRIES_ENV: &str = "PILOT_ENABLE_K8S_SELECT_WORKLOAD_ENTRIES";

/// The WorkloadEntry feed `PILOT_ENABLE_K8S_SELECT_WORKLOAD_ENTRIES` asks for: unset or
/// true, one the Kubernetes registry reads; false, one that stays empty. Takes Go's
/// boolean spellings, as Istio reads the variable.
fn workload_entry_feed(value: Option<&str>) -> anyhow::Result<meshfed_registry::WorkloadEntryFeed> {
    use meshfed_registry::WorkloadEntryFeed;
    match value {
        None | Some("1" | "t" | "T" | "true" | "TRUE" | "True") => Ok(WorkloadEntryFeed::new()),
        Some("0" | "f" | "F" | "false" | "FALSE" | "False") => Ok(WorkloadEntryFeed::disabled()),
        Some(other) => Err(anyhow::anyhow!(
            "{SELECT_WORKLOAD_ENTRIES_ENV}={other:?} is not a boolean (true or false)"
        )),
    }
}

/// meshNetworks `registryServiceName` gateways, read live so reloads apply.
fn mesh_gateway_lookup(core: &Core) -> MeshGatewayLookup {
    let live = core.mesh.clone();
    MeshGatewayLookup::new(move |cluster| {
        crate::networks::registry_service_gateways(&live.load().networks, cluster)
            .into_iter()
            .map(|g| RegistryServiceGateway {
                network: g.network,
                hostname: g.hostname,
                port: g.port,
            })
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use meshfed_registry::source::{BoxError, BoxFuture, SourceReadiness, StartedSource};
    use meshfed_registry::{MemoryRegistry, ProviderId};
    use prometheus_client::metrics::counter::Counter;

    use super::*;

    /// A registry from outside this workspace, as a crate would add it: its own
    /// provider name, a readiness gate and a metric.
    #[derive(Debug)]
    struct Nacos {
        synced: Arc<AtomicBool>,
    }

    #[derive(Debug)]
    struct NacosReadiness(Arc<AtomicBool>);

    impl SourceReadiness for NacosReadiness {
        fn pending(&self, _within_remote_timeout: bool) -> Vec<String> {
            if self.0.load(Ordering::Acquire) {
                Vec::new()
            } else {
                vec!["nacos naming service".to_string()]
            }
        }
    }

    impl RegistrySource for Nacos {
        fn start<'a>(
            &'a self,
            ctx: SourceContext<'a>,
        ) -> BoxFuture<'a, Result<StartedSource, BoxError>> {
            Box::pin(async move {
                let registry = MemoryRegistry::with_provider(
                    ProviderId::Named("Nacos"),
                    "nacos-dc1",
                    ctx.sink.clone(),
                );
                registry.mark_synced();
                ctx.aggregate.add_registry(Arc::new(registry.clone()));
                let requests = Counter::<u64>::default();
                requests.inc();
                Ok(StartedSource {
                    readiness: Some(Arc::new(NacosReadiness(self.synced.clone()))),
                    metrics: Some(Box::new(move |r| {
                        r.register("nacos_requests", "Requests to Nacos", requests)
                    })),
                    handle: Some(Arc::new(registry)),
                })
            })
        }
    }

    async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let response = reqwest::get(format!("http://{addr}{path}")).await.unwrap();
        let status = response.status().as_u16();
        (status, response.text().await.unwrap())
    }

    #[tokio::test]
    async fn a_registry_from_another_crate_starts_through_the_trait() {
        let local = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
        let synced = Arc::new(AtomicBool::new(false));
        let mut config = DiscoveryConfig {
            grpc_addr: None,
            secure_grpc_addr: None,
            http_addr: local,
            monitoring_addr: local,
            mock: meshfed_registry::source::MockSource::None,
            drain_duration: std::time::Duration::ZERO,
            ..DiscoveryConfig::default()
        };
        config.add_registry(Arc::new(Nacos {
            synced: synced.clone(),
        }));
        assert_eq!(config.registries.len(), 1);
        let server = crate::app::Server::start(config).await.unwrap();
        let shards: Vec<String> = server
            .aggregate()
            .registries()
            .iter()
            .map(|r| r.shard_key().to_string())
            .collect();
        assert!(
            shards.contains(&"Nacos/nacos-dc1".to_string()),
            "{shards:?}"
        );

        let bound = server.bound();
        let (status, body) = get(bound.http, "/ready").await;
        assert_eq!(status, 503);
        assert!(body.contains("nacos naming service"), "{body}");
        synced.store(true, Ordering::Release);
        let (status, body) = get(bound.http, "/ready").await;
        assert_eq!(status, 200, "{body}");
        let (_, metrics) = get(bound.monitoring, "/metrics").await;
        assert!(metrics.contains("nacos_requests_total 1"), "{metrics}");
        server.shutdown().await;
    }

    #[test]
    fn select_workload_entries_reads_gos_booleans_and_rejects_the_rest() {
        let feed = |v| workload_entry_feed(v).unwrap();
        let obj = Arc::new(meshfed_registry::config::ConfigObject::new(
            "ns",
            "vm",
            meshfed_api::networking::v1alpha3::WorkloadEntry {
                address: "10.0.0.1".into(),
                ..Default::default()
            },
        ));
        for on in [None, Some("true"), Some("1"), Some("True")] {
            assert!(feed(on).publish(std::slice::from_ref(&obj)), "{on:?}");
        }
        for off in [Some("false"), Some("0"), Some("F")] {
            assert!(!feed(off).publish(std::slice::from_ref(&obj)), "{off:?}");
        }
        let err = workload_entry_feed(Some("yes")).unwrap_err().to_string();
        assert!(err.contains(SELECT_WORKLOAD_ENTRIES_ENV), "{err}");
    }

    #[test]
    fn built_in_kinds_keep_their_typed_settings() {
        let mut config = DiscoveryConfig::default();
        config.add_registry(Arc::new(meshfed_registry::source::MockSource::None));
        config.add_registry(Arc::new(crate::app::ConsulSettings::new("http://c:8500")));
        assert!(matches!(
            config.mock,
            meshfed_registry::source::MockSource::None
        ));
        assert_eq!(
            config.consul.as_ref().map(|c| c.url.as_str()),
            Some("http://c:8500")
        );
        assert!(config.registries.is_empty());
    }
}
