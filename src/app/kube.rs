//! What the server takes from the local Kubernetes cluster beyond its registry: the
//! writer of the Istio CRD config store, the leader Lease, and the mesh ConfigMap.
//! (The CA's Secrets, gateway credentials and TokenReviews use the same client; see
//! `secure` and `Server::start`.)

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use arc_swap::ArcSwap;
use meshfed_kube::{KubeCluster, KubeConfigStore, LeaseState};
use meshfed_registry::UpdateSink;
use tokio::task::JoinSet;
use tracing::info;

use super::{DiscoveryConfig, KubeSettings};
use crate::drain::Shutdown;
use crate::mesh::{self, MeshSettings};

/// The leader-election state: without leader election this replica does the singleton
/// duties itself.
pub(super) fn lease_state(config: &DiscoveryConfig) -> Arc<LeaseState> {
    Arc::new(if config.lease.is_some() {
        LeaseState::default()
    } else {
        LeaseState::sole()
    })
}

/// The cluster's services besides its registry.
pub(super) struct Platform<'a> {
    pub(super) config: &'a DiscoveryConfig,
    pub(super) kube: &'a KubeSettings,
    pub(super) cluster: &'a KubeCluster,
    pub(super) shutdown: &'a Shutdown,
    /// Where the Lease reports its failures (`/debug/duties`).
    pub(super) duties: &'a Arc<meshfed_kube::Duties>,
}

impl Platform<'_> {
    /// Starts the CRD config store's writer (when there is a store) and the Lease
    /// (unless turned off), and follows the mesh ConfigMap; returns the ConfigMap's name
    /// and synced flag for readiness, when followed.
    pub(super) fn start(
        &self,
        config_store: Option<&KubeConfigStore>,
        lease_state: &Arc<LeaseState>,
        mesh: &Arc<ArcSwap<MeshSettings>>,
        sink: &UpdateSink,
        tasks: &mut JoinSet<()>,
    ) -> Option<(String, Arc<AtomicBool>)> {
        if let Some(store) = config_store {
            let mut stop = self.shutdown.clone();
            tasks.spawn(meshfed_kube::run_kube_config(
                self.cluster.client.clone(),
                store.clone(),
                async move { stop.wait().await },
            ));
            info!(cluster = %self.config.cluster_id, "Kubernetes config store started (networking.istio.io CRDs); /ready waits for its initial lists");
        }
        self.start_lease(lease_state, tasks);
        self.follow_mesh_config_map(mesh, sink, tasks)
    }

    fn start_lease(&self, lease_state: &Arc<LeaseState>, tasks: &mut JoinSet<()>) {
        let Some(lease) = &self.config.lease else {
            return;
        };
        let namespace = &self.kube.system_namespace;
        let lease_config = meshfed_kube::LeaseConfig {
            duration: lease.duration,
            renew_every: lease.renew_every,
            duties: Some(self.duties.clone()),
            ..meshfed_kube::LeaseConfig::new(namespace, &lease.name, &lease.identity())
        };
        info!(lease = %format!("{namespace}/{}", lease.name), identity = %lease_config.identity, "leader election started");
        let mut stop = self.shutdown.clone();
        tasks.spawn(meshfed_kube::run_lease(
            self.cluster.client.clone(),
            lease_config,
            lease_state.clone(),
            async move { stop.wait().await },
        ));
    }

    /// Mesh settings not given as files come from istiod's ConfigMap.
    fn follow_mesh_config_map(
        &self,
        mesh: &Arc<ArcSwap<MeshSettings>>,
        sink: &UpdateSink,
        tasks: &mut JoinSet<()>,
    ) -> Option<(String, Arc<AtomicBool>)> {
        let keys = mesh::MapKeys {
            mesh: self.config.mesh_config.is_none(),
            networks: self.config.networks_config.is_none(),
        };
        let name = self.config.mesh_config_map.as_ref()?;
        if !(keys.mesh || keys.networks) {
            return None;
        }
        let namespace = &self.kube.system_namespace;
        let synced = Arc::new(AtomicBool::new(false));
        let full_name = format!("{namespace}/{name}");
        let updates = meshfed_kube::follow_config_map(self.cluster.client.clone(), namespace, name);
        let mut stop = self.shutdown.clone();
        tasks.spawn(mesh::follow_config_map(
            updates,
            full_name.clone(),
            keys,
            mesh.clone(),
            sink.clone(),
            synced.clone(),
            async move { stop.wait().await },
        ));
        info!(configmap = %full_name, mesh = keys.mesh, mesh_networks = keys.networks, "following the mesh ConfigMap; /ready waits for its initial list");
        Some((full_name, synced))
    }
}

/// Starts config status (`--enableStatus`) when there is a Kubernetes config store:
/// the desired statuses computed every interval, and the leader's writer.
pub(super) fn start_status(
    config: &DiscoveryConfig,
    store: Option<&KubeConfigStore>,
    client: Option<&meshfed_kube::Client>,
    parts: StatusParts,
    registry: &mut prometheus_client::registry::Registry,
    tasks: &mut JoinSet<()>,
) {
    let Some(settings) = &config.status else {
        return;
    };
    let (Some(store), Some(client)) = (store, client) else {
        tracing::warn!("--enableStatus: no Kubernetes config store, so no status is written");
        return;
    };
    let (tx, rx) = tokio::sync::watch::channel(Arc::default());
    let mut stop = parts.shutdown.clone();
    let gateway_api: crate::status::GatewayApiStatus = {
        let snapshot = parts.snapshot.clone();
        let controller = config.gateway_controller_name.clone();
        Arc::new(move || {
            let current = snapshot.load();
            (
                current.config().gateway_api().status.clone(),
                controller.clone(),
            )
        })
    };
    tasks.spawn(crate::status::run_status_source(
        store.clone(),
        parts.connections,
        Some(crate::status::analysis_source(
            store.clone(),
            parts.snapshot,
            parts.root_namespace,
            config.domain.clone(),
        )),
        Some(gateway_api),
        settings.interval,
        tx,
        async move { stop.wait().await },
    ));
    let stats = Arc::new(meshfed_kube::status::StatusStats::default());
    stats.register_metrics(registry);
    let mut stop = parts.shutdown.clone();
    let writer = meshfed_kube::status::StatusWriter {
        client: client.clone(),
        store: store.clone(),
        leader: parts.lease_state,
        settings: settings.clone(),
        stats,
        duties: Some(parts.duties),
    };
    tasks.spawn(meshfed_kube::status::run_status_writer(
        writer,
        rx,
        async move { stop.wait().await },
    ));
    info!(qps = settings.qps, burst = settings.burst, interval = ?settings.interval, "config status on: the leader writes status.conditions (Reconciled) and status.validationMessages on Istio config objects");
}

/// What config status reads from the rest of the server.
pub(super) struct StatusParts {
    pub(super) connections: Arc<crate::ads::Connections>,
    /// Where the analyzers find the services destinations may name.
    pub(super) snapshot: Arc<arc_swap::ArcSwap<crate::push::snapshot::Snapshot>>,
    /// The mesh's root namespace, for the analyzers.
    pub(super) root_namespace: String,
    pub(super) lease_state: Arc<LeaseState>,
    pub(super) duties: Arc<meshfed_kube::Duties>,
    pub(super) shutdown: Shutdown,
}
