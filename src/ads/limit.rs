//! Rate limits for log lines that a peer can cause at will (NACKs, malformed requests,
//! refused connections): the first few of a window are written, the rest are counted
//! and the count rides on the next line written.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Allows `burst` log lines per `window`.
#[derive(Debug)]
pub struct LogLimiter {
    burst: u32,
    window: Duration,
    state: Mutex<Window>,
}

#[derive(Debug)]
struct Window {
    started: Option<Instant>,
    written: u32,
    suppressed: u64,
}

impl LogLimiter {
    /// At most `burst` lines per `window`.
    pub fn new(burst: u32, window: Duration) -> Self {
        LogLimiter {
            burst,
            window,
            state: Mutex::new(Window {
                started: None,
                written: 0,
                suppressed: 0,
            }),
        }
    }

    /// `Some(n)` when a line may be written now, `n` being how many were held back
    /// since the last one written; `None` when this one is held back.
    pub fn allow(&self) -> Option<u64> {
        let now = Instant::now();
        let mut w = self.state.lock().expect("log limiter poisoned");
        if w.started
            .is_none_or(|s| now.duration_since(s) >= self.window)
        {
            w.started = Some(now);
            w.written = 0;
        }
        if w.written < self.burst {
            w.written += 1;
            Some(std::mem::take(&mut w.suppressed))
        } else {
            w.suppressed += 1;
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_burst_per_window_then_the_count_of_what_was_held() {
        let limiter = LogLimiter::new(2, Duration::from_secs(10));
        assert_eq!(limiter.allow(), Some(0));
        assert_eq!(limiter.allow(), Some(0));
        for _ in 0..5 {
            assert_eq!(limiter.allow(), None);
        }
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(limiter.allow(), Some(5));
        assert_eq!(limiter.allow(), Some(0));
        assert_eq!(limiter.allow(), None);
    }
}
