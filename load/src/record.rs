//! What the simulated proxies report while the run goes: connections, initial
//! convergence, every observation of a change (the moment the proxy had sent its ACK
//! for the response that carried it), and bytes received per type. Lock-free counters
//! on the hot path; the per-change latency lists take a short lock.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use meshfed::xds::TypeUrl;

const UNWRITTEN: u64 = u64::MAX;

/// One change of the churn as measured.
#[derive(Debug)]
pub struct ChangeSlot {
    /// When it was written, in nanoseconds since the recorder's base (`UNWRITTEN`
    /// until then).
    written_ns: AtomicU64,
    /// Proxies expected to observe it (fixed when it is written).
    watchers: AtomicUsize,
    /// Proxies that have observed it.
    observed: AtomicUsize,
    /// Write -> ACK of each observation, in microseconds.
    latencies: Mutex<Vec<u32>>,
    /// Skipped (a kind the tool cannot make yet).
    skipped: std::sync::atomic::AtomicBool,
}

impl ChangeSlot {
    fn new() -> ChangeSlot {
        ChangeSlot {
            written_ns: AtomicU64::new(UNWRITTEN),
            watchers: AtomicUsize::new(0),
            observed: AtomicUsize::new(0),
            latencies: Mutex::new(Vec::new()),
            skipped: Default::default(),
        }
    }
}

/// Received responses of one type.
#[derive(Debug, Default)]
pub struct TypeCounters {
    /// Responses.
    pub responses: AtomicU64,
    /// Resources in them.
    pub resources: AtomicU64,
    /// Their encoded size.
    pub bytes: AtomicU64,
}

/// Everything measured during a run.
#[derive(Debug)]
pub struct Recorder {
    base: Instant,
    /// Proxies started by the ramp.
    pub started: AtomicUsize,
    /// Streams open now.
    pub connected: AtomicUsize,
    /// Stream attempts that failed (connect errors, refused streams, resets).
    pub stream_failures: AtomicUsize,
    /// Stream attempts the server refused with `RESOURCE_EXHAUSTED` (its new-stream
    /// rate limit), retried with backoff; not counted as failures.
    pub refused: AtomicUsize,
    /// Failed stream attempts whose error says the connection was reset.
    pub connection_resets: AtomicUsize,
    /// Failed stream attempts whose error says the connection was refused.
    pub connections_refused: AtomicUsize,
    /// Proxies that have had a complete initial config.
    pub converged: AtomicUsize,
    /// Converged proxies whose stream is still up: the watchers of a sidecar change.
    pub live_converged: AtomicUsize,
    /// Per service: converged proxyless clients watching it, stream up.
    pub service_watchers: Vec<AtomicUsize>,
    /// Per namespace: its converged proxies, stream up (the watchers of a change to
    /// one of its services when sidecars are scoped to their namespace).
    pub namespace_watchers: Vec<AtomicUsize>,
    /// Nanoseconds since base of the latest first convergence.
    last_converged_ns: AtomicU64,
    /// When the last response arrived at any proxy.
    last_response_ns: AtomicU64,
    /// Per proxy: its start -> complete initial config, in microseconds.
    convergence: Mutex<Vec<u32>>,
    changes: Vec<ChangeSlot>,
    /// Per type (TypeUrl order).
    pub types: [TypeCounters; TypeUrl::ALL.len()],
    /// Responses the proxies could not decode (NACKed).
    pub nacks: AtomicU64,
    /// Names proxies asked for and were never sent, by type (a server gap; see
    /// `ProxyState::is_complete`).
    unserved: Mutex<BTreeMap<&'static str, BTreeSet<String>>>,
    /// What incomplete proxies were still missing when asked (first few).
    missing: Mutex<Vec<String>>,
    /// First errors, for the report.
    errors: Mutex<Vec<String>>,
    /// While set, the proxies that received a response are noted in `pushed`.
    counting_pushes: AtomicBool,
    /// Proxies (by index) that received a response while `counting_pushes`.
    pushed: Mutex<BTreeSet<usize>>,
}

/// How many distinct messages of a kind the report keeps.
const KEEP: usize = 10;

impl Recorder {
    /// A recorder for `changes` changes, `services` services and `namespaces`
    /// namespaces.
    pub fn new(changes: usize, services: usize, namespaces: usize) -> Recorder {
        Recorder {
            base: Instant::now(),
            started: AtomicUsize::new(0),
            connected: AtomicUsize::new(0),
            stream_failures: AtomicUsize::new(0),
            refused: AtomicUsize::new(0),
            connection_resets: AtomicUsize::new(0),
            connections_refused: AtomicUsize::new(0),
            converged: AtomicUsize::new(0),
            live_converged: AtomicUsize::new(0),
            service_watchers: (0..services).map(|_| AtomicUsize::new(0)).collect(),
            namespace_watchers: (0..namespaces).map(|_| AtomicUsize::new(0)).collect(),
            last_converged_ns: AtomicU64::new(0),
            last_response_ns: AtomicU64::new(0),
            convergence: Mutex::new(Vec::new()),
            changes: (0..changes).map(|_| ChangeSlot::new()).collect(),
            types: Default::default(),
            nacks: AtomicU64::new(0),
            unserved: Mutex::new(BTreeMap::new()),
            missing: Mutex::new(Vec::new()),
            errors: Mutex::new(Vec::new()),
            counting_pushes: AtomicBool::new(false),
            pushed: Mutex::new(BTreeSet::new()),
        }
    }

    /// Proxy `index` received a response (noted while pushes are counted).
    pub fn proxy_received(&self, index: usize) {
        if self.counting_pushes.load(Ordering::Relaxed) {
            self.pushed.lock().expect("poisoned").insert(index);
        }
    }

    /// Starts noting which proxies receive responses (forgetting earlier ones).
    pub fn count_pushes(&self) {
        self.pushed.lock().expect("poisoned").clear();
        self.counting_pushes.store(true, Ordering::SeqCst);
    }

    /// Stops noting and returns how many proxies received a response since
    /// [`Recorder::count_pushes`].
    pub fn pushed_proxies(&self) -> usize {
        self.counting_pushes.store(false, Ordering::SeqCst);
        self.pushed.lock().expect("poisoned").len()
    }

    /// The instant every recorded time is relative to.
    pub fn base(&self) -> Instant {
        self.base
    }

    fn since_base(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.base).as_nanos() as u64
    }

    /// A response of `type_url` arrived.
    pub fn received(&self, type_url: TypeUrl, resources: usize, bytes: usize) {
        self.last_response_ns
            .fetch_max(self.since_base(Instant::now()), Ordering::Relaxed);
        let t = &self.types[type_url.index()];
        t.responses.fetch_add(1, Ordering::Relaxed);
        t.resources.fetch_add(resources as u64, Ordering::Relaxed);
        t.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// A proxy had its complete initial config `took` after it started, at `at`.
    pub fn proxy_converged(&self, took: Duration, at: Instant) {
        self.converged.fetch_add(1, Ordering::SeqCst);
        self.last_converged_ns
            .fetch_max(self.since_base(at), Ordering::SeqCst);
        let micros = took.as_micros().min(u128::from(u32::MAX)) as u32;
        self.convergence.lock().expect("poisoned").push(micros);
    }

    /// How long no proxy has received a response.
    pub fn quiet_for(&self) -> Duration {
        let last = self.base + Duration::from_nanos(self.last_response_ns.load(Ordering::Relaxed));
        last.elapsed()
    }

    /// When the last proxy converged so far.
    pub fn last_converged(&self) -> Instant {
        self.base + Duration::from_nanos(self.last_converged_ns.load(Ordering::SeqCst))
    }

    /// Per proxy: start -> complete initial config.
    pub fn convergence_times(&self) -> Vec<Duration> {
        self.convergence
            .lock()
            .expect("poisoned")
            .iter()
            .map(|m| Duration::from_micros(u64::from(*m)))
            .collect()
    }

    /// Change `index` is about to be written, watched by `watchers` proxies.
    pub fn change_written(&self, index: usize, watchers: usize, at: Instant) {
        let slot = &self.changes[index];
        slot.watchers.store(watchers, Ordering::SeqCst);
        slot.written_ns.store(self.since_base(at), Ordering::SeqCst);
    }

    /// Change `index` was not made.
    pub fn change_skipped(&self, index: usize) {
        self.changes[index].skipped.store(true, Ordering::SeqCst);
    }

    /// A proxy had ACKed a response carrying change `index` at `acked`.
    pub fn observe(&self, index: u32, acked: Instant) {
        let Some(slot) = self.changes.get(index as usize) else {
            return;
        };
        let written = slot.written_ns.load(Ordering::SeqCst);
        if written == UNWRITTEN {
            return;
        }
        let latency = self.since_base(acked).saturating_sub(written) / 1_000;
        slot.latencies
            .lock()
            .expect("poisoned")
            .push(latency.min(u64::from(u32::MAX)) as u32);
        slot.observed.fetch_add(1, Ordering::SeqCst);
    }

    /// Whether every watcher of change `index` has observed it (or it was skipped).
    pub fn change_done(&self, index: usize) -> bool {
        let slot = &self.changes[index];
        slot.skipped.load(Ordering::SeqCst)
            || (slot.written_ns.load(Ordering::SeqCst) != UNWRITTEN
                && slot.observed.load(Ordering::SeqCst) >= slot.watchers.load(Ordering::SeqCst))
    }

    /// Changes written (or skipped) so far, and how many of them are done.
    pub fn change_progress(&self) -> (usize, usize) {
        let written = self
            .changes
            .iter()
            .filter(|s| {
                s.skipped.load(Ordering::SeqCst) || s.written_ns.load(Ordering::SeqCst) != UNWRITTEN
            })
            .count();
        let done = (0..self.changes.len())
            .filter(|i| self.change_done(*i))
            .count();
        (written, done)
    }

    /// What was measured for change `index`.
    pub fn change_outcome(&self, index: usize) -> ChangeOutcome {
        let slot = &self.changes[index];
        let mut latencies = slot.latencies.lock().expect("poisoned").clone();
        latencies.sort_unstable();
        ChangeOutcome {
            skipped: slot.skipped.load(Ordering::SeqCst),
            written: slot.written_ns.load(Ordering::SeqCst) != UNWRITTEN,
            watchers: slot.watchers.load(Ordering::SeqCst),
            observed: slot.observed.load(Ordering::SeqCst),
            latencies: latencies
                .into_iter()
                .map(|m| Duration::from_micros(u64::from(m)))
                .collect(),
        }
    }

    /// Proxies asked for `name` of `type_url` and the server never sent it.
    pub fn unserved(&self, type_url: TypeUrl, name: &str) {
        let mut map = self.unserved.lock().expect("poisoned");
        let set = map.entry(type_url.short()).or_default();
        if set.len() < KEEP {
            set.insert(name.to_string());
        }
    }

    /// Unserved names by type.
    pub fn unserved_names(&self) -> BTreeMap<&'static str, BTreeSet<String>> {
        self.unserved.lock().expect("poisoned").clone()
    }

    /// An incomplete proxy says what it still misses.
    pub fn missing(&self, what: String) {
        let mut list = self.missing.lock().expect("poisoned");
        if list.len() < KEEP {
            list.push(what);
        }
    }

    /// What incomplete proxies said they miss.
    pub fn missing_reports(&self) -> Vec<String> {
        self.missing.lock().expect("poisoned").clone()
    }

    /// Records an error (the first few distinct ones are kept).
    pub fn error(&self, message: String) {
        let mut list = self.errors.lock().expect("poisoned");
        if list.len() < KEEP && !list.contains(&message) {
            list.push(message);
        }
    }

    /// The errors kept.
    pub fn errors(&self) -> Vec<String> {
        self.errors.lock().expect("poisoned").clone()
    }
}

/// One change as measured.
#[derive(Clone, Debug)]
pub struct ChangeOutcome {
    /// Not made (a kind the tool cannot make yet).
    pub skipped: bool,
    /// Written to the registry.
    pub written: bool,
    /// Proxies expected to observe it.
    pub watchers: usize,
    /// Proxies that did.
    pub observed: usize,
    /// Write -> ACK per observation, ascending.
    pub latencies: Vec<Duration>,
}

impl ChangeOutcome {
    /// Every watcher observed it.
    pub fn complete(&self) -> bool {
        self.written && self.observed >= self.watchers
    }

    /// Write -> the first watcher's ACK, when any watcher observed it: how long the
    /// server took to react (registry, debounce, snapshot) before its fan-out began.
    pub fn first_ack(&self) -> Option<Duration> {
        (self.written && self.watchers > 0)
            .then(|| self.latencies.first().copied())
            .flatten()
    }

    /// Write -> the last watcher's ACK, when complete and watched.
    pub fn last_ack(&self) -> Option<Duration> {
        (self.complete() && self.watchers > 0)
            .then(|| self.latencies.last().copied())
            .flatten()
    }
}

/// Percentiles of a sample, in milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Percentiles {
    /// Sample size.
    pub count: usize,
    /// Median.
    pub p50_ms: f64,
    /// 90th percentile.
    pub p90_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Largest.
    pub max_ms: f64,
}

impl Percentiles {
    /// The percentiles of `sample` (any order); all zero for an empty sample.
    pub fn of(sample: &[Duration]) -> Percentiles {
        let mut sorted: Vec<Duration> = sample.to_vec();
        sorted.sort_unstable();
        let ms = |d: Option<&Duration>| d.map_or(0.0, |d| d.as_secs_f64() * 1e3);
        Percentiles {
            count: sorted.len(),
            p50_ms: ms(nearest_rank(&sorted, 50.0)),
            p90_ms: ms(nearest_rank(&sorted, 90.0)),
            p99_ms: ms(nearest_rank(&sorted, 99.0)),
            max_ms: ms(sorted.last()),
        }
    }
}

/// The nearest-rank percentile `p` (0 < p <= 100) of an ascending sample: the
/// smallest value that at least p% of the sample is less than or equal to.
pub fn nearest_rank<T>(sorted: &[T], p: f64) -> Option<&T> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.clamp(1, sorted.len()) - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<u32> = (1..=100).collect();
        assert_eq!(nearest_rank(&v, 50.0), Some(&50));
        assert_eq!(nearest_rank(&v, 99.0), Some(&99));
        assert_eq!(nearest_rank(&v, 100.0), Some(&100));
        assert_eq!(nearest_rank(&v, 0.1), Some(&1));
        let v = [7, 9, 30];
        assert_eq!(nearest_rank(&v, 50.0), Some(&9));
        assert_eq!(nearest_rank(&v, 99.0), Some(&30));
        assert_eq!(nearest_rank(&[5], 50.0), Some(&5));
        assert_eq!(nearest_rank::<u32>(&[], 50.0), None);
    }

    #[test]
    fn percentiles_in_milliseconds() {
        let sample: Vec<Duration> = [300, 100, 200, 400]
            .iter()
            .map(|ms| Duration::from_millis(*ms))
            .collect();
        let p = Percentiles::of(&sample);
        assert_eq!(p.count, 4);
        assert_eq!(p.p50_ms, 200.0);
        assert_eq!(p.p90_ms, 400.0);
        assert_eq!(p.p99_ms, 400.0);
        assert_eq!(p.max_ms, 400.0);
        assert_eq!(Percentiles::of(&[]), Percentiles::default());
    }

    #[test]
    fn a_change_is_done_when_every_watcher_acked() {
        let r = Recorder::new(2, 1, 1);
        assert!(!r.change_done(0));
        let t0 = r.base() + Duration::from_millis(10);
        r.observe(0, t0); // not written yet: ignored
        r.change_written(0, 2, t0);
        r.observe(0, t0 + Duration::from_millis(150));
        assert!(!r.change_done(0));
        r.observe(0, t0 + Duration::from_millis(250));
        assert!(r.change_done(0));
        let outcome = r.change_outcome(0);
        assert_eq!(outcome.first_ack(), Some(Duration::from_millis(150)));
        assert_eq!(outcome.last_ack(), Some(Duration::from_millis(250)));
        r.change_skipped(1);
        assert!(r.change_done(1));
        assert_eq!(r.change_outcome(1).first_ack(), None);
        assert_eq!(r.change_progress(), (2, 2));
    }
}
