//! Shutdown as a value: one trigger, any number of watchers. Every long-running task
//! (registries, debounce, ADS streams, admin servers) holds a [`Shutdown`] and stops when
//! it fires; the app then waits for them with a deadline.

use tokio::sync::watch;

/// Fires the shutdown.
#[derive(Debug)]
pub struct ShutdownTrigger(watch::Sender<bool>);

/// Observes the shutdown. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Shutdown(watch::Receiver<bool>);

/// A new trigger and its first observer.
pub fn channel() -> (ShutdownTrigger, Shutdown) {
    let (tx, rx) = watch::channel(false);
    (ShutdownTrigger(tx), Shutdown(rx))
}

impl ShutdownTrigger {
    /// Starts the shutdown. Idempotent.
    pub fn trigger(&self) {
        self.0.send_replace(true);
    }

    /// A new observer.
    pub fn subscribe(&self) -> Shutdown {
        Shutdown(self.0.subscribe())
    }
}

impl Shutdown {
    /// Resolves once the shutdown has started (at once if it already has, or if the
    /// trigger was dropped).
    pub async fn wait(&mut self) {
        let _ = self.0.wait_for(|stop| *stop).await;
    }

    /// Whether the shutdown has started.
    pub fn is_triggered(&self) -> bool {
        *self.0.borrow()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_observer_sees_the_trigger() {
        let (trigger, a) = channel();
        let mut b = trigger.subscribe();
        let mut a2 = a.clone();
        assert!(!a.is_triggered());
        trigger.trigger();
        a2.wait().await;
        b.wait().await;
        assert!(a.is_triggered());
    }
}
