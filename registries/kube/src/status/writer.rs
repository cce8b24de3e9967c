//! The status writer task: every interval, while this replica leads, each object whose
//! desired status or stored version changed since it was last checked is read and,
//! when its status would change, written through `PUT .../<name>/status`, every API
//! call paced by the token bucket.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kube::Api;
use kube::api::{ApiResource, DynamicObject, PostParams};
use meshfed_registry::config::{Kind, ObjectId};
use prometheus_client::encoding::EncodeMetric;
use tokio::sync::watch;
use tracing::debug;

use super::{DesiredStatus, DesiredStatuses, TokenBucket, merged_status};
use crate::duty::{Duties, Duty};
use crate::lease::LeaseState;
use crate::{KubeConfigStore, crd};

/// Istio's status manager settings.
#[derive(Clone, Debug)]
pub struct StatusSettings {
    /// API requests per second (`PILOT_STATUS_QPS`, 100).
    pub qps: f64,
    /// Requests allowed at once above the rate (`PILOT_STATUS_BURST`, 500).
    pub burst: u32,
    /// How often statuses are compared and written (`PILOT_STATUS_UPDATE_INTERVAL`,
    /// 500 ms).
    pub interval: Duration,
}

impl Default for StatusSettings {
    fn default() -> Self {
        StatusSettings {
            qps: 100.0,
            burst: 500,
            interval: Duration::from_millis(500),
        }
    }
}

/// What the writer did (for tests and `meshfed_config_status_writes_total`).
#[derive(Debug, Default)]
pub struct StatusStats {
    /// Status writes that succeeded.
    pub written: AtomicU64,
    /// Objects read whose status needed no write.
    pub unchanged: AtomicU64,
    /// Failed reads or writes.
    pub errors: AtomicU64,
}

impl StatusStats {
    /// Registers `meshfed_config_status_writes_total{result="written"|"unchanged"|"error"}`.
    pub fn register_metrics(
        self: &Arc<Self>,
        registry: &mut prometheus_client::registry::Registry,
    ) {
        use prometheus_client::metrics::counter::ConstCounter;
        #[derive(Debug)]
        struct Metrics(Arc<StatusStats>);
        impl prometheus_client::collector::Collector for Metrics {
            fn encode(
                &self,
                mut encoder: prometheus_client::encoding::DescriptorEncoder,
            ) -> std::fmt::Result {
                let mut family = encoder.encode_descriptor(
                    "meshfed_config_status_writes",
                    "Config status (--enableStatus) reads and writes by result",
                    None,
                    prometheus_client::metrics::MetricType::Counter,
                )?;
                for (result, value) in [
                    ("written", &self.0.written),
                    ("unchanged", &self.0.unchanged),
                    ("error", &self.0.errors),
                ] {
                    let labels = [("result", result)];
                    ConstCounter::new(value.load(Ordering::Relaxed))
                        .encode(family.encode_family(&labels)?)?;
                }
                Ok(())
            }
        }
        registry.register_collector(Box::new(Metrics(self.clone())));
    }
}

/// Per object: what was last settled (desired, and the resourceVersions the store may
/// hold for it then: the one read and the one our write made, since the store need
/// not publish a status-only change), so an unchanged object costs no API call.
type Settled = HashMap<ObjectId, (DesiredStatus, [String; 2])>;

/// What the status writer works with.
pub struct StatusWriter {
    /// The config cluster.
    pub client: kube::Client,
    /// The objects read from it (their stored versions).
    pub store: KubeConfigStore,
    /// Whether this replica leads: only the leader writes.
    pub leader: Arc<LeaseState>,
    pub settings: StatusSettings,
    pub stats: Arc<StatusStats>,
    /// Where failures are reported (the `config-status` duty).
    pub duties: Option<Arc<Duties>>,
}

/// Writes the statuses of `desired` on the objects of the writer's store until
/// `shutdown`, only while this replica leads, paced by its settings. Failures are
/// retried at the next interval and reported to the `config-status` duty.
pub async fn run_status_writer(
    writer: StatusWriter,
    mut desired: watch::Receiver<DesiredStatuses>,
    shutdown: impl Future<Output = ()>,
) {
    let StatusWriter {
        client,
        store,
        leader,
        settings,
        stats,
        duties,
    } = writer;
    let mut shutdown = std::pin::pin!(shutdown);
    let mut bucket = TokenBucket::new(settings.qps, settings.burst);
    let mut settled = Settled::new();
    let mut ticks = tokio::time::interval(settings.interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    if let Some(duties) = &duties {
        duties.start(Duty::ConfigStatus);
    }
    loop {
        tokio::select! {
            () = &mut shutdown => return,
            _ = ticks.tick() => {}
        }
        if !leader.is_leader() {
            // A new leader starts from what the API server holds.
            settled.clear();
            continue;
        }
        let want = desired.borrow_and_update().clone();
        settled.retain(|id, _| want.contains_key(id));
        let mut failure = None;
        for (id, status) in want.iter() {
            // A rejected object is not in the store (unless an earlier version of it
            // is in force): its status is written when the desired status changes.
            let stored_rv = store
                .get(id.kind, &id.namespace, &id.name)
                .map(|o| o.resource_version.clone())
                .unwrap_or_default();
            if settled.get(id).is_some_and(|(s, rvs)| {
                s == status && (rvs.contains(&stored_rv) || stored_rv.is_empty())
            }) {
                continue;
            }
            if !leader.is_leader() {
                break;
            }
            match write_one(&client, &store, id, status, &mut bucket).await {
                Ok(Some(rv)) => {
                    stats.written.fetch_add(1, Ordering::Relaxed);
                    settled.insert(id.clone(), (status.clone(), [stored_rv, rv]));
                }
                Ok(None) => {
                    stats.unchanged.fetch_add(1, Ordering::Relaxed);
                    settled.insert(id.clone(), (status.clone(), [stored_rv.clone(), stored_rv]));
                }
                Err(kube::Error::Api(status)) if status.code == 404 => {
                    // Deleted meanwhile; its desired status goes with it.
                }
                Err(err) => {
                    stats.errors.fetch_add(1, Ordering::Relaxed);
                    debug!(object = %id, "config status: {err}");
                    failure.get_or_insert_with(|| {
                        crate::duty::explain(
                            &err,
                            &format!(
                                "writing the status of {} {}/{}",
                                id.kind, id.namespace, id.name
                            ),
                            &id.namespace,
                        )
                    });
                }
            }
        }
        if let Some(duties) = &duties {
            match failure {
                Some(reason) => duties.failed(Duty::ConfigStatus, &reason, settings.interval),
                None => duties.done(Duty::ConfigStatus),
            }
        }
    }
}

fn api_resource(store: &KubeConfigStore, kind: Kind) -> Option<ApiResource> {
    let version = store.served_version(kind)?;
    Some(ApiResource {
        group: kind.group().to_string(),
        version: version.to_string(),
        api_version: format!("{}/{version}", kind.group()),
        kind: kind.as_str().to_string(),
        plural: crd::plural(kind).to_string(),
    })
}

/// Reads one object and writes its status when it would change: the new
/// resourceVersion when written, `None` when nothing changed.
async fn write_one(
    client: &kube::Client,
    store: &KubeConfigStore,
    id: &ObjectId,
    status: &DesiredStatus,
    bucket: &mut TokenBucket,
) -> kube::Result<Option<String>> {
    let Some(resource) = api_resource(store, id.kind) else {
        return Ok(None);
    };
    // GatewayClasses are cluster-scoped.
    let api = if id.kind == Kind::GatewayClass {
        Api::<DynamicObject>::all_with(client.clone(), &resource)
    } else {
        Api::<DynamicObject>::namespaced_with(client.clone(), &id.namespace, &resource)
    };
    bucket.acquire().await;
    let mut object = api.get_status(&id.name).await?;
    let now = k8s_openapi::jiff::Timestamp::now();
    let now = k8s_openapi::jiff::Timestamp::from_second(now.as_second())
        .unwrap_or(now)
        .to_string();
    let next = match &status.gateway_api {
        Some((desired, controller)) => serde_json::from_str(desired).ok().and_then(|desired| {
            super::merged_gateway_status(
                object.data.get("status"),
                &desired,
                object.metadata.generation,
                controller,
                &now,
            )
        }),
        None => merged_status(
            object.data.get("status"),
            status,
            object.metadata.generation,
            &now,
        ),
    };
    let Some(next) = next else {
        return Ok(None);
    };
    object.data["status"] = next;
    bucket.acquire().await;
    let written = api
        .replace_status(&id.name, &PostParams::default(), &object)
        .await?;
    Ok(Some(written.metadata.resource_version.unwrap_or_default()))
}
