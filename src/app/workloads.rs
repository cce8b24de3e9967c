//! The WorkloadEntry controller (VM auto-registration and health): entries in the
//! API server when the Kubernetes config store runs, else in the in-memory config
//! store; WorkloadGroups from every config store.

use std::sync::Arc;

use prometheus_client::registry::Registry;
use tokio::task::JoinSet;
use tracing::info;

use super::DiscoveryConfig;
use super::config::ConfigStores;
use crate::autoregistration::store::{EntryStore, Groups, KubeEntryStore, MemoryEntryStore};
use crate::autoregistration::{AutoRegistrationMetrics, Controller};
use crate::drain::Shutdown;

/// Starts the controller, unless both auto-registration and health checks are off.
pub(super) fn start(
    config: &DiscoveryConfig,
    stores: &ConfigStores,
    kube_client: Option<&meshfed_kube::Client>,
    instance: String,
    registry: &mut Registry,
    shutdown: &Shutdown,
    tasks: &mut JoinSet<()>,
) -> Option<Arc<Controller>> {
    let mut settings = config.workload_entries.clone();
    if !settings.auto_registration && !settings.health_checks {
        return None;
    }
    settings.max_connection_age = config.xds_limits.max_connection_age;
    let store: Arc<dyn EntryStore> = match (&stores.kube, kube_client) {
        (Some(view), Some(client)) => Arc::new(KubeEntryStore::new(view.clone(), client.clone())),
        _ => Arc::new(MemoryEntryStore::new(stores.memory.clone())),
    };
    info!(
        instance,
        grace_period = ?settings.grace_period,
        auto_registration = settings.auto_registration,
        health_checks = settings.health_checks,
        "WorkloadEntry controller"
    );
    let metrics = Arc::new(AutoRegistrationMetrics::new(registry));
    let controller = Controller::new(
        instance,
        store,
        Groups::new(stores.all()),
        settings,
        metrics,
    );
    tasks.spawn(controller.clone().run(shutdown.clone()));
    Some(controller)
}
