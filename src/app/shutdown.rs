//! Signals and the drain at shutdown.

use std::time::Duration;

use tracing::{info, warn};

use super::Server;

impl Server {
    /// Waits for Ctrl-C or SIGTERM, then shuts down. A signal that arrives before
    /// this is called takes the default action (the process dies): the binary uses
    /// [`ShutdownSignals`] taken before the server starts instead.
    pub async fn run_until_signal(self) {
        wait_for_signal().await;
        info!("shutdown signal received, draining");
        self.shutdown().await;
    }

    /// Waits for `signals`, then shuts down.
    pub async fn run_until(self, signals: ShutdownSignals) {
        signals.wait().await;
        info!("shutdown signal received, draining");
        self.shutdown().await;
    }

    /// Drains, then stops every task: first `/ready` turns 503, the xDS port stops
    /// accepting and sends HTTP/2 GOAWAY, and the ADS streams are closed one by one over
    /// the drain duration (each proxy reconnects to another replica); then every task
    /// is stopped, gracefully first, aborted after the drain deadline.
    pub async fn shutdown(mut self) {
        self.drain_trigger.trigger();
        if !self.drain_duration.is_zero() {
            info!(connections = self.connections.len(), over = ?self.drain_duration, "draining the ADS streams");
            let until = tokio::time::Instant::now() + self.drain_duration + Duration::from_secs(1);
            while !self.connections.is_empty() && tokio::time::Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        self.trigger.trigger();
        let drained = tokio::time::timeout(self.drain_deadline, async {
            while self.tasks.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            warn!(deadline = ?self.drain_deadline, "tasks still running after the drain deadline; aborting them");
            self.tasks.abort_all();
            while self.tasks.join_next().await.is_some() {}
        }
        info!("meshfed stopped");
    }
}

/// SIGTERM and SIGINT, listened for from the moment this is made: a signal that comes
/// while the server is still starting is kept, and shuts it down once it runs (rather
/// than killing the process with the default action).
#[derive(Debug)]
pub struct ShutdownSignals {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl ShutdownSignals {
    /// Starts listening (in a tokio runtime).
    pub fn listen() -> std::io::Result<ShutdownSignals> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(ShutdownSignals {
                term: signal(SignalKind::terminate())?,
                int: signal(SignalKind::interrupt())?,
            })
        }
        #[cfg(not(unix))]
        {
            Ok(ShutdownSignals {})
        }
    }

    /// Resolves at the first signal (at once if one already came).
    pub async fn wait(mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
