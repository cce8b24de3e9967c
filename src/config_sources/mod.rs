//! Reading Istio config from `xds://` config sources (`MeshConfig.configSources`):
//! each source is an ADS client ([`client`]) feeding a config store of its own
//! ([`store`]), which the server reads like the config directory and the Kubernetes
//! CRDs: objects validated, rejected one by one, merged into the snapshot's config,
//! their `source` naming the source (`/debug/configz`). What the source sent stays
//! when it goes away (the last known good, marked stale); per-source metrics are in
//! [`metrics`]. `k8s://` and `fs://` sources are the existing stores, started by the
//! wiring (`app::config`).

pub mod client;
#[cfg(any(test, feature = "testing"))]
pub mod fake;
pub mod metrics;
pub mod store;

use std::sync::Arc;
use std::time::Duration;

use meshfed_registry::UpdateSink;
use meshfed_registry::read::Backoff;
use tokio::task::JoinSet;
use tracing::{info, warn};

use crate::drain::Shutdown;
pub use client::{ClientIdentity, SourceClient};
pub use metrics::SourceMetrics;
pub use store::{SourceStatus, SourceStore};

/// Starts one client per `xds://` authority (`host:port`) and returns their stores.
/// A source that has not sent every kind within `sync_timeout` stops holding
/// readiness (as remote clusters do after `--remoteClusterTimeout`), with a WARN.
pub fn start(
    authorities: &[String],
    identity: &ClientIdentity,
    sink: &UpdateSink,
    metrics: &Arc<SourceMetrics>,
    sync_timeout: Duration,
    shutdown: &Shutdown,
    tasks: &mut JoinSet<()>,
) -> Vec<SourceStore> {
    let mut stores = Vec::new();
    for authority in authorities {
        let name = format!("xds://{authority}");
        let store = SourceStore::new(&name, sink.clone()).with_revision(&identity.revision);
        let client = SourceClient {
            authority: authority.clone(),
            identity: identity.clone(),
            store: store.clone(),
            metrics: metrics.clone(),
            backoff: Backoff::default(),
        };
        info!(source = %name, "config source: following");
        tasks.spawn(client.run(shutdown.clone()));
        let waited = store.clone();
        let mut stop = shutdown.clone();
        tasks.spawn(async move {
            tokio::select! {
                () = tokio::time::sleep(sync_timeout) => {
                    if waited.give_up_initial_sync() {
                        warn!(source = %waited.name(), after = ?sync_timeout, "config source has not synced; no longer waiting for it (its objects apply when they arrive)");
                    }
                }
                () = stop.wait() => {}
            }
        });
        stores.push(store);
    }
    stores
}

#[cfg(test)]
mod tests;
