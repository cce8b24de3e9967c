//! Blocking-query loops: one for the catalog's service list, one per watched service's
//! health. Each loop keeps its own `X-Consul-Index` and reports answers worth applying
//! (and every failure) to the writer task.
//!
//! Index handling follows Consul's implementation notes for blocking queries:
//! - the first query (and the first after a reset) sends no index: it answers at once;
//! - a returned index below the one held means the index went backwards (a snapshot
//!   restore, a new leader): reset to 0, so the next query is a non-blocking re-read;
//! - an index below 1 is treated as 1, so that 0 is never sent once an index is known
//!   (a 0 would make every query answer at once);
//! - consecutive queries of one loop start at least `min_query_interval` apart, so an
//!   answer that comes back at once with an unchanged index cannot spin.
//!
//! A failed query is retried after `retry_interval`, doubled per further failure up to
//! `max_retry_interval`; the retry keeps the index but waits at most
//! `retry_interval`, so that a recovered server answers (and the registry stops being
//! stale) quickly even when nothing changed. Service loops in backoff retry at once
//! when the catalog loop recovers.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::time::Instant;
use tracing::{debug, info};

use crate::api::{ApiError, ConsulClient};
use crate::config::ConsulConfig;
use crate::registry::ConsulStats;

/// How an answer's `X-Consul-Index` moved relative to the index held.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum IndexMove {
    /// The index is new (or the first one): the answer may carry changes.
    Moved,
    /// Same index: the wait elapsed without a change.
    Same,
    /// The index went backwards: the index was reset to 0.
    Backwards,
}

/// The `X-Consul-Index` a blocking loop holds.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct BlockingIndex {
    held: u64,
}

impl BlockingIndex {
    /// No index yet: the next query does not block.
    pub fn new() -> Self {
        Self::default()
    }

    /// The `index` to send; 0 means "send none" (a non-blocking read).
    pub fn index(&self) -> u64 {
        self.held
    }

    /// Applies the `X-Consul-Index` of an answer (`None` when the header was missing).
    pub fn advance(&mut self, returned: Option<u64>) -> IndexMove {
        let returned = returned.unwrap_or(0).max(1);
        if returned < self.held {
            self.held = 0;
            return IndexMove::Backwards;
        }
        let moved = returned != self.held;
        self.held = returned;
        if moved {
            IndexMove::Moved
        } else {
            IndexMove::Same
        }
    }
}

/// The delay before retry number `failures` (1-based): `base * 2^(failures-1)`,
/// capped at `max`.
pub fn backoff(base: Duration, max: Duration, failures: u32) -> Duration {
    let factor = 1u32 << failures.saturating_sub(1).min(16);
    base.saturating_mul(factor).min(max)
}

/// Which loop a report comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum WatchId {
    /// `/v1/catalog/services`.
    Catalog,
    /// `/v1/health/service/<name>`; the generation tells a loop from an earlier one
    /// for the same name (removed and re-added).
    Service { name: String, generation: u64 },
}

/// A decoded answer.
#[derive(Debug)]
pub(crate) enum Answer {
    /// Service name -> tags.
    Catalog(BTreeMap<String, Value>),
    /// Raw health entries.
    Health(Vec<Value>),
}

/// What a loop tells the writer.
#[derive(Debug)]
pub(crate) struct Report {
    pub(crate) id: WatchId,
    pub(crate) result: Result<Answer, ApiError>,
}

/// What every loop shares.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) client: ConsulClient,
    pub(crate) config: Arc<ConsulConfig>,
    pub(crate) stats: Arc<ConsulStats>,
    /// Bounds the service loops' queries in flight (the catalog loop never waits).
    pub(crate) permits: Semaphore,
    /// Bumped by the writer when the catalog loop recovers from failures.
    pub(crate) recovered: watch::Receiver<u64>,
}

async fn query(
    shared: &Shared,
    id: &WatchId,
    index: u64,
    wait: Duration,
) -> Result<(Option<u64>, Answer), ApiError> {
    match id {
        WatchId::Catalog => {
            let a = shared.client.catalog_services(index, wait).await?;
            Ok((a.index, Answer::Catalog(a.value)))
        }
        WatchId::Service { name, .. } => {
            let _permit = shared
                .permits
                .acquire()
                .await
                .expect("the semaphore is never closed");
            let a = shared.client.health_service(name, index, wait).await?;
            Ok((a.index, Answer::Health(a.value)))
        }
    }
}

/// Runs one loop until the writer goes away (or the task is aborted).
pub(crate) async fn run(shared: Arc<Shared>, id: WatchId, tx: mpsc::UnboundedSender<Report>) {
    let config = shared.config.clone();
    let mut index = BlockingIndex::new();
    let mut failures = 0u32;
    let mut last_start: Option<Instant> = None;
    let mut recovered = shared.recovered.clone();
    loop {
        if let Some(started) = last_start {
            tokio::time::sleep_until(started + config.min_query_interval).await;
        }
        last_start = Some(Instant::now());
        let wait = if failures > 0 {
            config.wait.min(config.retry_interval)
        } else {
            config.wait
        };
        let result = query(&shared, &id, index.index(), wait).await;
        let report = match result {
            Ok((returned, answer)) => {
                shared.stats.count_answer();
                let movement = index.advance(returned);
                if movement == IndexMove::Backwards {
                    shared.stats.count_index_reset();
                    info!(watch = ?id, ?returned, "consul: index went backwards; re-reading from index 0");
                }
                let recovering = failures > 0;
                failures = 0;
                if movement == IndexMove::Same && !recovering {
                    continue;
                }
                Report {
                    id: id.clone(),
                    result: Ok(answer),
                }
            }
            Err(err) => {
                failures = failures.saturating_add(1);
                shared.stats.count_error(&err.to_string());
                if let ApiError::Denied { status, .. } = &err {
                    shared.stats.count_denied(*status);
                }
                Report {
                    id: id.clone(),
                    result: Err(err),
                }
            }
        };
        let failed = report.result.is_err();
        if tx.send(report).is_err() {
            return;
        }
        if failed {
            let delay = backoff(config.retry_interval, config.max_retry_interval, failures);
            debug!(watch = ?id, ?delay, failures, "consul: retrying after an error");
            recovered.borrow_and_update();
            let catalog = matches!(id, WatchId::Catalog);
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                // A recovered catalog means Consul is back: no need to sit out the delay.
                Ok(()) = recovered.changed(), if !catalog => {}
            }
            last_start = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_follows_consuls_rules() {
        let mut i = BlockingIndex::new();
        assert_eq!(i.index(), 0, "the first query does not block");
        assert_eq!(i.advance(Some(10)), IndexMove::Moved);
        assert_eq!(i.index(), 10);
        assert_eq!(i.advance(Some(10)), IndexMove::Same);
        assert_eq!(i.advance(Some(12)), IndexMove::Moved);
        assert_eq!(i.advance(Some(5)), IndexMove::Backwards);
        assert_eq!(
            i.index(),
            0,
            "reset: the next query re-reads without blocking"
        );
        assert_eq!(i.advance(Some(5)), IndexMove::Moved);
        assert_eq!(i.index(), 5);
    }

    #[test]
    fn index_below_one_is_one_and_never_goes_back_to_zero() {
        let mut i = BlockingIndex::new();
        assert_eq!(i.advance(Some(0)), IndexMove::Moved);
        assert_eq!(i.index(), 1);
        assert_eq!(
            i.advance(None),
            IndexMove::Same,
            "a missing header is not a reset"
        );
        assert_eq!(i.index(), 1);
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let s = Duration::from_secs;
        assert_eq!(backoff(s(2), s(30), 1), s(2));
        assert_eq!(backoff(s(2), s(30), 2), s(4));
        assert_eq!(backoff(s(2), s(30), 4), s(16));
        assert_eq!(backoff(s(2), s(30), 5), s(30));
        assert_eq!(backoff(s(2), s(30), 500), s(30));
    }
}
