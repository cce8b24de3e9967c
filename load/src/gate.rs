//! How many connections may be in the middle of receiving responses at once.
//!
//! A response is assembled as it arrives, so thousands of proxies waiting for their
//! initial configs at once each hold a partly received one (a sidecar's CDS or RDS in
//! a 1,000-service mesh is ~1 MB): 20,000 of them held ~19 GB. With
//! `receivingConnections: N`, at most N connections hold a partly received response;
//! the others stop reading after the first frame of one, and the server waits on their
//! HTTP/2 flow-control windows (which bound what the transport holds for them) until
//! a slot frees.
//!
//! The slot belongs to the connection, not the stream: the streams sharing a
//! connection share its window, so a stream that stopped reading would stall every
//! stream of its connection, including one holding a slot. A connection takes a slot
//! when one of its streams starts receiving a message and gives it back when none of
//! them is in the middle of one.

use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The receiving slots of a connection (shared by its streams).
#[derive(Debug)]
pub struct ConnectionGate {
    /// The process-wide slots; `None`: no limit.
    slots: Option<Arc<Semaphore>>,
    /// Its streams in the middle of a message, and the slot they hold.
    state: Mutex<(usize, Option<OwnedSemaphorePermit>)>,
    /// Taken while waiting for a slot, so that the connection waits for one slot only.
    acquiring: tokio::sync::Mutex<()>,
}

impl ConnectionGate {
    /// A connection's gate over `slots` (`None`: receiving is not limited).
    pub fn new(slots: Option<Arc<Semaphore>>) -> Arc<ConnectionGate> {
        Arc::new(ConnectionGate {
            slots,
            state: Mutex::new((0, None)),
            acquiring: tokio::sync::Mutex::new(()),
        })
    }

    /// Waits until the connection holds a slot and counts one of its streams as
    /// receiving a message until the returned guard is dropped. Cancel-safe: a wait
    /// that is dropped counts nothing.
    pub async fn begin(self: &Arc<Self>) -> Receiving {
        let guard = {
            let mut state = self.state.lock().expect("gate state");
            state.0 += 1;
            Receiving(self.clone())
        };
        if let Some(slots) = &self.slots {
            let _one = self.acquiring.lock().await;
            if self.state.lock().expect("gate state").1.is_none() {
                let permit = slots.clone().acquire_owned().await.expect("never closed");
                self.state.lock().expect("gate state").1 = Some(permit);
            }
        }
        guard
    }

    /// Whether the connection holds a slot now.
    #[cfg(test)]
    fn holds_slot(&self) -> bool {
        self.state.lock().expect("gate state").1.is_some()
    }
}

/// One stream of the connection receiving a message; the slot goes back when the
/// last such guard of the connection is dropped.
#[derive(Debug)]
pub struct Receiving(Arc<ConnectionGate>);

impl Drop for Receiving {
    fn drop(&mut self) {
        let mut state = self.0.state.lock().expect("gate state");
        state.0 -= 1;
        if state.0 == 0 {
            state.1 = None;
        }
    }
}

/// The gates of the run's connections: one per shared connection (by its number), or
/// one per proxy on its own connection.
#[derive(Debug)]
pub struct Gates {
    slots: Option<Arc<Semaphore>>,
    shared: Vec<Arc<ConnectionGate>>,
}

impl Gates {
    /// `limit` connections receiving at once (0: no limit), over `shared` shared
    /// connections (0: each proxy has its own).
    pub fn new(limit: usize, shared: usize) -> Gates {
        let slots = (limit > 0).then(|| Arc::new(Semaphore::new(limit)));
        Gates {
            shared: (0..shared)
                .map(|_| ConnectionGate::new(slots.clone()))
                .collect(),
            slots,
        }
    }

    /// The gate of proxy `index`'s connection.
    pub fn for_proxy(&self, index: usize) -> Arc<ConnectionGate> {
        match self.shared.len() {
            0 => ConnectionGate::new(self.slots.clone()),
            k => self.shared[index % k].clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    use super::*;

    /// Polls once: the output if ready (the future is dropped either way).
    fn now<F: Future>(future: F) -> Option<F::Output> {
        let mut future = pin!(future);
        match future
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
        {
            Poll::Ready(out) => Some(out),
            Poll::Pending => None,
        }
    }

    #[tokio::test]
    async fn a_connection_holds_one_slot_while_any_of_its_streams_receives() {
        let gates = Gates::new(1, 2);
        let (a, b) = (gates.for_proxy(0), gates.for_proxy(1));
        let first = a.begin().await;
        assert!(a.holds_slot());
        // A second stream of the same connection needs no second slot.
        let second = now(gates.for_proxy(2).begin()).expect("same slot");
        // Another connection waits for the only slot.
        let mut waiting = Box::pin(b.begin());
        let polled = waiting
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()));
        assert!(polled.is_pending());
        drop(first);
        assert!(a.holds_slot(), "one stream still receives");
        drop(second);
        assert!(!a.holds_slot());
        let _other = waiting.await;
        assert!(b.holds_slot());
    }

    #[tokio::test]
    async fn a_dropped_wait_counts_nothing_and_no_limit_never_waits() {
        let gates = Gates::new(1, 0);
        let (a, b) = (gates.for_proxy(0), gates.for_proxy(1));
        let held = a.begin().await;
        assert!(now(b.begin()).is_none(), "dropped while waiting");
        drop(held);
        let _again = now(b.begin()).expect("the slot is free");
        assert!(b.holds_slot());
        let unlimited = Gates::new(0, 0).for_proxy(0);
        let _guard = now(unlimited.begin()).expect("no limit");
        assert!(!unlimited.holds_slot());
    }
}
