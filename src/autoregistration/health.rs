//! Health reports of workloads (Istio's `internal/health` and `internal/state`): the
//! agent sends a request of type `istio.io/health` on its ADS stream when its
//! readiness probe changes (with `error_detail` when unhealthy); the entry's
//! `Healthy` status condition follows it, written only by the instance that holds
//! the workload's connection.

use std::time::SystemTime;

use meshfed_registry::config::{Condition, ConfigObject};

use super::entry::CONDITION_HEALTHY;
use super::store::{EntryStore, WriteError};

pub use crate::ads::connection::HEALTH_TYPE_URL;

/// One report of the agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthEvent {
    /// Whether the probe passed.
    pub healthy: bool,
    /// The probe's error, when it failed.
    pub message: String,
}

impl HealthEvent {
    /// The report an `istio.io/health` request carries: healthy unless it has an
    /// `error_detail`, whose message is the error.
    pub fn from_error_detail(message: Option<&str>) -> HealthEvent {
        HealthEvent {
            healthy: message.is_none(),
            message: message.unwrap_or_default().to_string(),
        }
    }
}

/// The `Healthy` condition of a report made at `now` (probe and transition times are
/// the same: the agent reports transitions only).
pub fn condition(event: &HealthEvent, now: SystemTime) -> Condition {
    Condition {
        kind: CONDITION_HEALTHY.to_string(),
        status: if event.healthy { "True" } else { "False" }.to_string(),
        reason: String::new(),
        message: if event.healthy {
            String::new()
        } else {
            event.message.clone()
        },
        last_probe_time: Some(now),
        last_transition_time: Some(now),
    }
}

/// Why a health report was not written.
#[derive(Debug, thiserror::Error)]
pub enum HealthError {
    /// The entry is not (or not yet) in the cache.
    #[error(
        "failed to update health status for {proxy}: WorkloadEntry {namespace}/{name} not found"
    )]
    NotFound {
        /// The reporting proxy.
        proxy: String,
        /// The entry's namespace.
        namespace: String,
        /// The entry's name.
        name: String,
    },
    /// The write failed.
    #[error("error while updating WorkloadEntry health status for {proxy}: {error}")]
    Write {
        /// The reporting proxy.
        proxy: String,
        /// What failed.
        error: WriteError,
    },
}

/// Writes `condition` on the entry, unless another instance holds its connection or
/// the entry already has a newer report.
pub async fn update_health(
    store: &dyn EntryStore,
    is_controller: impl Fn(&ConfigObject) -> bool,
    proxy: &str,
    namespace: &str,
    name: &str,
    condition: Condition,
) -> Result<(), HealthError> {
    let Some(current) = store.entry(namespace, name) else {
        return Err(HealthError::NotFound {
            proxy: proxy.to_string(),
            namespace: namespace.to_string(),
            name: name.to_string(),
        });
    };
    if !is_controller(&current) {
        return Ok(());
    }
    if let Some(existing) = current.condition(CONDITION_HEALTHY)
        && existing.last_probe_time > condition.last_probe_time
    {
        return Ok(());
    }
    let mut next = (*current).clone();
    replace_condition(&mut next, condition);
    store
        .update_status(next)
        .await
        .map_err(|error| HealthError::Write {
            proxy: proxy.to_string(),
            error,
        })?;
    tracing::debug!(
        proxy,
        "updated health status of WorkloadEntry {namespace}/{name}"
    );
    Ok(())
}

/// Removes the `Healthy` condition (a workload without auto-registration that did not
/// come back: its health is no longer known).
pub async fn delete_health_condition(
    store: &dyn EntryStore,
    entry: &ConfigObject,
) -> Result<(), WriteError> {
    let mut next = entry.clone();
    next.conditions.retain(|c| c.kind != CONDITION_HEALTHY);
    match store.update_status(next).await {
        Err(WriteError::NotFound) | Ok(()) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Istio's `UpdateConfigCondition`: replaces the condition of the same type, or adds
/// it.
fn replace_condition(obj: &mut ConfigObject, condition: Condition) {
    match obj.conditions.iter_mut().find(|c| c.kind == condition.kind) {
        Some(existing) => *existing = condition,
        None => obj.conditions.push(condition),
    }
}
