//! The new-stream rate limit of the xDS ports (reference §1.9): a token bucket of
//! `--maxRequestsPerSecond` with a burst of one, shared by both ports, where a new
//! stream waits up to a second for its token and is refused with `RESOURCE_EXHAUSTED`
//! beyond that — Istio's `PILOT_MAX_REQUESTS_PER_SECOND`.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Istio's default rate when none is given: `min(15 + 5 × cores, 100)` per second.
pub fn istio_default_rate(cores: usize) -> f64 {
    (15.0 + 5.0 * cores as f64).min(100.0)
}

/// How long a new stream may wait for its token.
pub const MAX_WAIT: Duration = Duration::from_secs(1);

/// A token bucket with a burst of one.
#[derive(Debug)]
pub struct StreamRateLimiter {
    interval: Duration,
    /// When the next token is free (in the past: one is available now).
    next_free: Mutex<Instant>,
}

impl StreamRateLimiter {
    /// `per_second` new streams a second (clamped to 0.001..=1e9).
    pub fn new(per_second: f64) -> Self {
        let per_second = per_second.clamp(1e-3, 1e9);
        StreamRateLimiter {
            interval: Duration::from_secs_f64(1.0 / per_second),
            next_free: Mutex::new(Instant::now()),
        }
    }

    /// The rate, per second.
    pub fn rate(&self) -> f64 {
        1.0 / self.interval.as_secs_f64()
    }

    /// Takes a token, waiting for it if it comes within `max_wait`; `false` (and no
    /// token taken) when it would come later.
    pub async fn acquire(&self, max_wait: Duration) -> bool {
        let wait = {
            let mut next = self.next_free.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            // Burst one: an idle bucket holds a single token.
            let at = (*next).max(now);
            let wait = at - now;
            if wait > max_wait {
                return false;
            }
            *next = at + self.interval;
            wait
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_follows_istio() {
        assert_eq!(istio_default_rate(2), 25.0);
        assert_eq!(istio_default_rate(64), 100.0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_of_one_then_the_rate_and_a_refusal_past_a_second() {
        let limiter = StreamRateLimiter::new(4.0);
        let start = Instant::now();
        assert!(limiter.acquire(MAX_WAIT).await, "the first is free");
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert!(limiter.acquire(MAX_WAIT).await);
        assert_eq!(start.elapsed(), Duration::from_millis(250));
        // Reserve up to a second ahead: three more fit (500, 750, 1000 ms from now
        // is 1 s after the last grant at most), then a refusal.
        let mut granted = 0;
        let mut refused = 0;
        let mut waits = Vec::new();
        for _ in 0..6 {
            let l = &limiter;
            waits.push(async move { l.acquire(MAX_WAIT).await });
        }
        for ok in futures::future::join_all(waits).await {
            if ok {
                granted += 1;
            } else {
                refused += 1;
            }
        }
        assert_eq!((granted, refused), (4, 2));
        // Idle time does not bank more than one token.
        tokio::time::advance(Duration::from_secs(10)).await;
        let t = Instant::now();
        assert!(limiter.acquire(Duration::ZERO).await);
        assert!(!limiter.acquire(Duration::ZERO).await, "burst one");
        assert_eq!(t.elapsed(), Duration::ZERO);
    }
}
