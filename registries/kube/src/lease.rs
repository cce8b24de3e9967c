//! Leader election over a `coordination.k8s.io/v1` Lease, as client-go's leader
//! election does it: the holder renews the Lease every `renew_every`; another replica
//! takes it once it has not been renewed for `duration`; a replica that stops releases
//! it (clears the holder) so another takes it at once. Writes go through the API
//! server's optimistic concurrency (the Lease's `resourceVersion`), so two replicas
//! never both believe they hold it for longer than one renew period.
//!
//! Replicas serve xDS alike; only singleton duties (writes that must happen once per
//! mesh) wait for [`LeaseState::is_leader`].

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;
use meshfed_registry::metrics::encode_gauges;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tracing::{debug, info, warn};

/// Which Lease, held by whom, for how long.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    /// The Lease's namespace (the system namespace).
    pub namespace: String,
    /// The Lease's name.
    pub name: String,
    /// This replica's identity (the pod name).
    pub identity: String,
    /// How long a Lease not renewed stays with its holder (client-go's
    /// `LeaseDuration`, 15 s).
    pub duration: Duration,
    /// How often the holder renews, and others retry (client-go's `RetryPeriod`, 2 s).
    pub renew_every: Duration,
    /// Where failures are reported (`/debug/duties`, logged once per reason); without
    /// it every failed attempt is logged.
    pub duties: Option<Arc<crate::duty::Duties>>,
}

impl LeaseConfig {
    /// client-go's defaults for `name` in `namespace`, held as `identity`.
    pub fn new(namespace: &str, name: &str, identity: &str) -> Self {
        LeaseConfig {
            namespace: namespace.to_string(),
            name: name.to_string(),
            identity: identity.to_string(),
            duration: Duration::from_secs(15),
            renew_every: Duration::from_secs(2),
            duties: None,
        }
    }
}

/// Whether this replica holds the Lease, for the duties that need it and for metrics.
#[derive(Debug)]
pub struct LeaseState {
    leader: AtomicBool,
    acquired: AtomicU64,
    renewed: AtomicU64,
    /// The same flag for duties that act when it changes ([`LeaseState::subscribe`]).
    changes: watch::Sender<bool>,
}

impl Default for LeaseState {
    fn default() -> Self {
        LeaseState {
            leader: AtomicBool::new(false),
            acquired: AtomicU64::new(0),
            renewed: AtomicU64::new(0),
            changes: watch::Sender::new(false),
        }
    }
}

impl LeaseState {
    /// The state of a replica that runs without leader election: it is the leader
    /// for good (one replica, or an operator who turned election off on purpose).
    pub fn sole() -> Self {
        let state = LeaseState::default();
        state.set_leader(true);
        state
    }

    /// Follows [`LeaseState::is_leader`]: the receiver sees every change (a duty that
    /// becomes leader reconciles everything at once instead of polling).
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.changes.subscribe()
    }

    fn set_leader(&self, held: bool) -> bool {
        let was = self.leader.swap(held, Ordering::AcqRel);
        self.changes
            .send_if_modified(|v| std::mem::replace(v, held) != held);
        was
    }

    /// True while this replica holds the Lease.
    pub fn is_leader(&self) -> bool {
        self.leader.load(Ordering::Acquire)
    }

    /// Times this replica took the Lease.
    pub fn acquired(&self) -> u64 {
        self.acquired.load(Ordering::Relaxed)
    }

    /// Successful renewals by this replica.
    pub fn renewed(&self) -> u64 {
        self.renewed.load(Ordering::Relaxed)
    }

    /// Registers `meshfed_leader{lease}` (1 while this replica holds the Lease) and
    /// `meshfed_leader_acquired{lease}` into `registry`, read on every scrape.
    pub fn register_metrics(self: &Arc<Self>, registry: &mut Registry, lease: &str) {
        registry.register_collector(Box::new(LeaseMetrics(self.clone(), lease.to_string())));
    }
}

#[derive(Debug)]
struct LeaseMetrics(Arc<LeaseState>, String);

impl Collector for LeaseMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        encode_gauges(
            &mut encoder,
            "meshfed_leader",
            "1 while this replica holds the leader-election Lease",
            "lease",
            [(self.1.as_str(), i64::from(self.0.is_leader()))],
        )?;
        encode_gauges(
            &mut encoder,
            "meshfed_leader_acquired",
            "Times this replica took the leader-election Lease",
            "lease",
            [(self.1.as_str(), self.0.acquired() as i64)],
        )
    }
}

fn now() -> MicroTime {
    MicroTime(Timestamp::now())
}

fn seconds(d: Duration) -> i32 {
    i32::try_from(d.as_secs().max(1)).unwrap_or(i32::MAX)
}

/// One attempt: take, renew or leave the Lease. `Ok(true)` when this replica holds it
/// afterwards.
async fn try_acquire_or_renew(api: &Api<Lease>, config: &LeaseConfig) -> kube::Result<bool> {
    let Some(mut lease) = api.get_opt(&config.name).await? else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(config.name.clone()),
                namespace: Some(config.namespace.clone()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(config.identity.clone()),
                lease_duration_seconds: Some(seconds(config.duration)),
                acquire_time: Some(now()),
                renew_time: Some(now()),
                lease_transitions: Some(0),
                ..Default::default()
            }),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        };
    };
    let mut spec = lease.spec.take().unwrap_or_default();
    let holder = spec.holder_identity.clone().unwrap_or_default();
    if holder != config.identity {
        let held_for = i64::from(spec.lease_duration_seconds.unwrap_or(0));
        let renewed = spec.renew_time.as_ref().map_or(0, |t| t.0.as_second());
        let expired = holder.is_empty() || renewed + held_for < Timestamp::now().as_second();
        if !expired {
            return Ok(false);
        }
        spec.holder_identity = Some(config.identity.clone());
        spec.acquire_time = Some(now());
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    }
    spec.renew_time = Some(now());
    spec.lease_duration_seconds = Some(seconds(config.duration));
    lease.spec = Some(spec);
    match api
        .replace(&config.name, &PostParams::default(), &lease)
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Gives the Lease up if this replica holds it: the holder is cleared, so another
/// replica takes it at its next attempt instead of waiting the Lease out.
async fn release(api: &Api<Lease>, config: &LeaseConfig) -> kube::Result<()> {
    let Some(mut lease) = api.get_opt(&config.name).await? else {
        return Ok(());
    };
    let Some(spec) = lease.spec.as_mut() else {
        return Ok(());
    };
    if spec.holder_identity.as_deref() != Some(config.identity.as_str()) {
        return Ok(());
    }
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    spec.renew_time = Some(now());
    api.replace(&config.name, &PostParams::default(), &lease)
        .await
        .map(|_| ())
}

/// Runs the election until `shutdown`, keeping `state` current, then releases the
/// Lease if held.
pub async fn run_lease(
    client: kube::Client,
    config: LeaseConfig,
    state: Arc<LeaseState>,
    shutdown: impl Future<Output = ()>,
) {
    let api: Api<Lease> = Api::namespaced(client, &config.namespace);
    let mut shutdown = std::pin::pin!(shutdown);
    let duty = crate::duty::Duty::LeaderLease;
    if let Some(duties) = &config.duties {
        duties.start(duty);
    }
    loop {
        let held = match try_acquire_or_renew(&api, &config).await {
            Ok(held) => {
                if let Some(duties) = &config.duties {
                    duties.done(duty);
                }
                held
            }
            Err(err) => {
                match &config.duties {
                    Some(duties) => duties.failed(
                        duty,
                        &crate::duty::explain(
                            &err,
                            &format!(
                                "leader election over Lease {}/{}",
                                config.namespace, config.name
                            ),
                            &config.namespace,
                        ),
                        config.renew_every,
                    ),
                    None => warn!(lease = %config.name, "leader election: {err}"),
                }
                false
            }
        };
        let was = state.set_leader(held);
        match (was, held) {
            (false, true) => {
                state.acquired.fetch_add(1, Ordering::Relaxed);
                info!(lease = %format!("{}/{}", config.namespace, config.name), identity = %config.identity, "leader election: this replica holds the Lease");
            }
            (true, false) => {
                warn!(lease = %format!("{}/{}", config.namespace, config.name), "leader election: this replica lost the Lease");
            }
            (true, true) => {
                state.renewed.fetch_add(1, Ordering::Relaxed);
            }
            (false, false) => {
                debug!(lease = %config.name, "leader election: held by another replica")
            }
        }
        tokio::select! {
            () = &mut shutdown => break,
            () = tokio::time::sleep(config.renew_every) => {}
        }
    }
    if state.set_leader(false) {
        match release(&api, &config).await {
            Ok(()) => info!(lease = %config.name, "leader election: Lease released"),
            Err(err) => warn!(lease = %config.name, "leader election: releasing the Lease: {err}"),
        }
    }
}
