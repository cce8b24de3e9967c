//! The rate limit of status writes: a token bucket with client-go's meaning of QPS and
//! burst (the bucket holds `burst` tokens, refilled at `qps` per second; a request
//! waits for a token), as Istio configures its status client.

use std::time::Duration;

use tokio::time::Instant;

/// A token bucket on tokio's clock (so tests run it on a paused clock).
#[derive(Debug)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    /// A full bucket of `burst` tokens refilled at `qps` per second (`qps` > 0,
    /// `burst` ≥ 1).
    pub fn new(qps: f64, burst: u32) -> TokenBucket {
        let burst = f64::from(burst.max(1));
        TokenBucket {
            qps: qps.max(f64::MIN_POSITIVE),
            burst,
            tokens: burst,
            at: Instant::now(),
        }
    }

    fn refill(&mut self) {
        let now = Instant::now();
        let elapsed = now.duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
        self.at = now;
    }

    /// Takes a token, waiting for one when the bucket is empty.
    pub async fn acquire(&mut self) {
        self.refill();
        if self.tokens < 1.0 {
            let wait = (1.0 - self.tokens) / self.qps;
            tokio::time::sleep(Duration::from_secs_f64(wait)).await;
            self.refill();
        }
        self.tokens -= 1.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_burst_passes_then_requests_wait_for_the_rate() {
        let mut bucket = TokenBucket::new(10.0, 5);
        let start = Instant::now();
        for _ in 0..5 {
            bucket.acquire().await;
        }
        assert_eq!(Instant::now(), start, "the burst does not wait");
        for _ in 0..10 {
            bucket.acquire().await;
        }
        let waited = Instant::now().duration_since(start);
        assert!(
            waited >= Duration::from_millis(990) && waited <= Duration::from_millis(1010),
            "{waited:?}: ten more at 10 per second"
        );
    }
}
