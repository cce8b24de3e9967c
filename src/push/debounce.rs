//! Debounce: many registry and config events become one push.
//!
//! The first event opens a window; every later event is merged into one request and
//! restarts the quiet timer. The merged request is pushed when no event came for
//! `quiet` or when the window is `max` old, whichever is first. Only one push runs at a
//! time: events arriving while `push` runs wait in the channel for the next window.
//! With `eds_debounce` off, endpoint-only requests skip the window and push at once.

use std::future::Future;
use std::time::Duration;

use futures::{Stream, StreamExt};
use meshfed_registry::PushRequest;
use tokio::time::{Instant, sleep_until};

/// Debounce timings (Istio's `PILOT_DEBOUNCE_AFTER`, `PILOT_DEBOUNCE_MAX`,
/// `PILOT_ENABLE_EDS_DEBOUNCE`).
#[derive(Clone, Copy, Debug)]
pub struct DebounceConfig {
    /// Quiet period after the last event.
    pub quiet: Duration,
    /// Longest a window stays open.
    pub max: Duration,
    /// Whether endpoint-only requests are debounced too.
    pub eds_debounce: bool,
}

impl Default for DebounceConfig {
    fn default() -> Self {
        DebounceConfig {
            quiet: Duration::from_millis(100),
            max: Duration::from_secs(10),
            eds_debounce: true,
        }
    }
}

/// Runs until `events` ends, calling `push` with each merged request. A window still
/// open when the stream ends is pushed before returning.
pub async fn debounce<S, F, Fut>(events: S, config: DebounceConfig, mut push: F)
where
    S: Stream<Item = PushRequest>,
    F: FnMut(PushRequest, u32) -> Fut,
    Fut: Future<Output = ()>,
{
    let mut events = std::pin::pin!(events);
    // The open window: merged request, when it opened, when the last event came, and
    // how many events it holds.
    let mut window: Option<(PushRequest, Instant, Instant, u32)> = None;
    loop {
        let deadline = window
            .as_ref()
            .map(|(_, first, last, _)| (*last + config.quiet).min(*first + config.max));
        tokio::select! {
            biased;
            event = events.next() => {
                let Some(request) = event else { break };
                if !config.eds_debounce && request.is_endpoints_only() {
                    push(request, 1).await;
                    continue;
                }
                let now = Instant::now();
                match &mut window {
                    Some((merged, _, last, count)) => {
                        merged.merge(request);
                        *last = now;
                        *count += 1;
                    }
                    None => window = Some((request, now, now, 1)),
                }
            }
            () = sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                if let Some((merged, _, _, count)) = window.take() {
                    push(merged, count).await;
                }
            }
        }
    }
    if let Some((merged, _, _, count)) = window.take() {
        push(merged, count).await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use meshfed_registry::{ConfigKey, ConfigKind, ServiceKey, TriggerReason};
    use tokio::sync::mpsc;
    use tokio_stream::wrappers::UnboundedReceiverStream;

    use super::*;

    type Log = Arc<Mutex<Vec<(Duration, PushRequest, u32)>>>;

    fn start(
        config: DebounceConfig,
    ) -> (
        mpsc::UnboundedSender<PushRequest>,
        Log,
        tokio::task::JoinHandle<()>,
    ) {
        let (tx, rx) = mpsc::unbounded_channel();
        let log: Log = Arc::default();
        let origin = Instant::now();
        let sink = log.clone();
        let task = tokio::spawn(debounce(
            UnboundedReceiverStream::new(rx),
            config,
            move |req, n| {
                sink.lock().unwrap().push((origin.elapsed(), req, n));
                async {}
            },
        ));
        (tx, log, task)
    }

    fn config_change(name: &str) -> PushRequest {
        PushRequest::full(
            TriggerReason::Config,
            [ConfigKey::new(ConfigKind::VirtualService, name, "ns")],
        )
    }

    /// Lets the debounce task run until it is blocked on time again.
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn merges_events_within_the_quiet_period() {
        let (tx, log, _task) = start(DebounceConfig::default());
        tx.send(config_change("a")).unwrap();
        settle().await;
        tokio::time::advance(Duration::from_millis(60)).await;
        tx.send(config_change("b")).unwrap();
        settle().await;
        tokio::time::advance(Duration::from_millis(99)).await;
        settle().await;
        assert!(
            log.lock().unwrap().is_empty(),
            "the second event restarted the quiet timer"
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        settle().await;
        let log = log.lock().unwrap();
        assert_eq!(log.len(), 1);
        let (at, req, n) = &log[0];
        assert_eq!(*n, 2);
        assert_eq!(req.configs_updated.len(), 2);
        assert_eq!(*at, Duration::from_millis(160));
    }

    #[tokio::test(start_paused = true)]
    async fn max_delay_bounds_a_busy_window() {
        let config = DebounceConfig {
            max: Duration::from_secs(1),
            ..Default::default()
        };
        let (tx, log, _task) = start(config);
        for i in 0..30 {
            tx.send(config_change(&format!("c{i}"))).unwrap();
            settle().await;
            tokio::time::advance(Duration::from_millis(50)).await;
        }
        settle().await;
        let log = log.lock().unwrap();
        assert!(
            !log.is_empty(),
            "a continuous stream of events must still be pushed"
        );
        assert_eq!(log[0].0, Duration::from_secs(1));
        assert_eq!(log[0].2, 21, "events at 0..=1000 ms in one window");
    }

    #[tokio::test(start_paused = true)]
    async fn endpoint_updates_bypass_the_window_when_eds_debounce_is_off() {
        let config = DebounceConfig {
            eds_debounce: false,
            ..Default::default()
        };
        let (tx, log, _task) = start(config);
        tx.send(config_change("a")).unwrap();
        tx.send(PushRequest::endpoints(&ServiceKey::new("h", "ns")))
            .unwrap();
        settle().await;
        {
            let log = log.lock().unwrap();
            assert_eq!(log.len(), 1);
            assert!(log[0].1.is_endpoints_only());
            assert_eq!(log[0].0, Duration::ZERO);
        }
        tokio::time::advance(Duration::from_millis(100)).await;
        settle().await;
        assert_eq!(log.lock().unwrap().len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn endpoint_updates_are_debounced_by_default_and_pending_work_is_flushed_on_close() {
        let (tx, log, task) = start(DebounceConfig::default());
        tx.send(PushRequest::endpoints(&ServiceKey::new("h", "ns")))
            .unwrap();
        settle().await;
        assert!(log.lock().unwrap().is_empty());
        drop(tx);
        task.await.unwrap();
        assert_eq!(log.lock().unwrap().len(), 1);
    }
}
