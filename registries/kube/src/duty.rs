//! The optional duties a replica owes the cluster beside serving (the CA Secret, the
//! leader Lease, the root-cert ConfigMaps, config status writes), and what stands in
//! their way.
//!
//! None of them may stop serving: a duty that cannot be done (the system namespace is
//! missing, RBAC forbids it, the API server is unreachable) is logged once, with what
//! the operator should do, and retried with backoff by its owner; [`Duties`] keeps each
//! one's state for `/debug/duties` and the metrics `meshfed_startup_duty_failures_total{duty}`
//! (every failed attempt) and `meshfed_unmet_duties` (duties not done now).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde::Serialize;
use tracing::{debug, info, warn};

/// The optional duties, a closed set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Duty {
    /// Loading (or creating) the mesh CA from its Secrets in the system namespace.
    CaSecret,
    /// Taking part in leader election over the Lease in the system namespace.
    LeaderLease,
    /// Publishing the root certificate to every namespace's `istio-ca-root-cert`.
    RootConfigMaps,
    /// Writing `status` on Istio config objects (`--enableStatus`).
    ConfigStatus,
}

impl Duty {
    /// The name in logs, metrics and `/debug/duties`.
    pub fn as_str(self) -> &'static str {
        match self {
            Duty::CaSecret => "ca-secret",
            Duty::LeaderLease => "leader-lease",
            Duty::RootConfigMaps => "root-configmaps",
            Duty::ConfigStatus => "config-status",
        }
    }
}

/// Where a duty stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DutyState {
    /// Started, not yet done nor failed.
    Pending,
    /// Done (or, for continuous duties, its last attempt succeeded).
    Done,
    /// Its last attempt failed; it is being retried.
    Failing,
}

/// One duty as `/debug/duties` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct DutyView {
    pub duty: Duty,
    pub state: DutyState,
    /// The last failure, with what to do about it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Failed attempts so far.
    pub failures: u64,
    /// When the state last changed (seconds since the epoch).
    pub since: u64,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DutyLabels {
    duty: &'static str,
}

/// The duties of this replica, shared by their owners and the admin server.
#[derive(Debug, Default)]
pub struct Duties {
    table: Mutex<BTreeMap<Duty, DutyView>>,
    failures: Family<DutyLabels, Counter>,
    unmet: Gauge,
}

impl Duties {
    /// Registers `meshfed_startup_duty_failures_total{duty}` and `meshfed_unmet_duties`.
    pub fn register_metrics(self: &Arc<Self>, registry: &mut Registry) {
        registry.register(
            "meshfed_startup_duty_failures",
            "Failed attempts at an optional duty (CA Secret, leader Lease, root ConfigMaps, config status), by duty",
            self.failures.clone(),
        );
        registry.register(
            "meshfed_unmet_duties",
            "Optional duties started and not done now (see /debug/duties)",
            self.unmet.clone(),
        );
    }

    fn set(&self, duty: Duty, f: impl FnOnce(&mut DutyView)) -> (DutyState, Option<String>) {
        let mut table = self.table.lock().expect("duty table poisoned");
        let view = table.entry(duty).or_insert_with(|| DutyView {
            duty,
            state: DutyState::Pending,
            last_error: None,
            failures: 0,
            since: now(),
        });
        let before = (view.state, view.last_error.clone());
        f(view);
        if view.state != before.0 {
            view.since = now();
        }
        let unmet = table
            .values()
            .filter(|v| v.state != DutyState::Done)
            .count();
        self.unmet.set(unmet as i64);
        before
    }

    /// A duty starts (shown as pending until done or failed).
    pub fn start(&self, duty: Duty) {
        self.set(duty, |_| {});
    }

    /// A duty is done (or its last attempt succeeded); logged when it recovers.
    pub fn done(&self, duty: Duty) {
        let (was, _) = self.set(duty, |v| v.state = DutyState::Done);
        if was == DutyState::Failing {
            info!(duty = duty.as_str(), "optional duty recovered");
        }
    }

    /// A duty's attempt failed with `reason` (what is wrong and what to do); it will be
    /// retried by its owner after `retry_in`. Logged at warn the first time a reason
    /// is seen, at debug while it repeats.
    pub fn failed(&self, duty: Duty, reason: &str, retry_in: Duration) {
        self.failures
            .get_or_create(&DutyLabels {
                duty: duty.as_str(),
            })
            .inc();
        let (_, last) = self.set(duty, |v| {
            v.state = DutyState::Failing;
            v.last_error = Some(reason.to_string());
            v.failures += 1;
        });
        if last.as_deref() == Some(reason) {
            debug!(duty = duty.as_str(), retry_in = ?retry_in, "{reason}");
        } else {
            warn!(
                duty = duty.as_str(),
                "{reason} (retrying with backoff; serving goes on; see /debug/duties)"
            );
        }
    }

    /// Every duty started, sorted by duty.
    pub fn views(&self) -> Vec<DutyView> {
        self.table
            .lock()
            .expect("duty table poisoned")
            .values()
            .cloned()
            .collect()
    }

    /// The state of `duty`, if started.
    pub fn state(&self, duty: Duty) -> Option<DutyState> {
        self.table
            .lock()
            .expect("duty table poisoned")
            .get(&duty)
            .map(|v| v.state)
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// What an API error means for a duty that `action`s (e.g. "creating Secret
/// istio-system/istio-ca-secret") in `namespace`, and what the operator can do.
pub fn explain(err: &kube::Error, action: &str, namespace: &str) -> String {
    match err {
        kube::Error::Api(status)
            if status.code == 404 && status.message.starts_with("namespaces ") =>
        {
            format!(
                "{action}: namespace {namespace} does not exist: create it (kubectl create namespace {namespace}), or point --systemNamespace at the namespace meshfed runs in (deploy/deployment.yaml passes $(POD_NAMESPACE))"
            )
        }
        kube::Error::Api(status) if status.code == 403 => format!(
            "{action}: forbidden by RBAC ({}): grant meshfed's service account the verbs deploy/rbac.yaml lists",
            status.message
        ),
        kube::Error::Api(status) => format!("{action}: {} ({})", status.message, status.code),
        other => format!("{action}: the API server is unreachable or failed: {other}"),
    }
}

/// Retry delays of a duty: 1 s doubling to 60 s.
pub fn retry_backoff() -> meshfed_registry::read::Backoff {
    meshfed_registry::read::Backoff::new(Duration::from_secs(1), Duration::from_secs(60))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_is_counted_and_recovery_clears_the_unmet_gauge() {
        let duties = Duties::default();
        duties.start(Duty::CaSecret);
        assert_eq!(duties.unmet.get(), 1);
        duties.failed(
            Duty::CaSecret,
            "namespace x does not exist",
            Duration::from_secs(1),
        );
        duties.failed(
            Duty::CaSecret,
            "namespace x does not exist",
            Duration::from_secs(2),
        );
        let view = &duties.views()[0];
        assert_eq!(view.state, DutyState::Failing);
        assert_eq!(view.failures, 2);
        duties.done(Duty::CaSecret);
        assert_eq!(duties.state(Duty::CaSecret), Some(DutyState::Done));
        assert_eq!(duties.unmet.get(), 0);
        assert_eq!(
            duties.views()[0].last_error.as_deref(),
            Some("namespace x does not exist"),
            "the last error stays visible"
        );
    }

    #[test]
    fn backoff_doubles_to_a_minute() {
        let mut b = retry_backoff();
        let delays: Vec<u64> = (0..8).map(|_| b.next_delay().as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 60, 60]);
    }
}
