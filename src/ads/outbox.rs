//! The queue between a stream's task and its response body: bounded, one sender,
//! one receiver.
//!
//! Every connected proxy has one for as long as it is connected. tokio's bounded
//! channel allocates its shared state and a first block of 32 slots when created,
//! about 1 KB per stream whether or not anything is ever queued; this queue is one
//! small allocation, and its slots are allocated when first used (four at most).

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

/// The receiver is gone: nothing sent now would be read.
#[derive(Debug, PartialEq, Eq)]
pub struct Closed;

/// Why [`Sender::try_reserve`] gave no room.
#[derive(Debug, PartialEq, Eq)]
pub enum TryReserveError {
    /// The queue is full.
    Full,
    /// The receiver is gone.
    Closed,
}

#[derive(Debug)]
struct State<T> {
    queue: VecDeque<T>,
    /// Room promised by permits not used yet.
    reserved: usize,
    capacity: usize,
    receiver: Option<Waker>,
    sender: Option<Waker>,
    sender_gone: bool,
    receiver_gone: bool,
}

#[derive(Debug)]
struct Shared<T>(Mutex<State<T>>);

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The sending half (one task sends; not `Clone`).
#[derive(Debug)]
pub struct Sender<T>(Arc<Shared<T>>);

/// The receiving half.
#[derive(Debug)]
pub struct Receiver<T>(Arc<Shared<T>>);

/// Room for one value, taken from the queue's capacity until used or dropped.
#[derive(Debug)]
pub struct Permit<'a, T> {
    sender: &'a Sender<T>,
    used: bool,
}

/// A queue holding at most `capacity` values (at least one).
pub fn channel<T>(capacity: usize) -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Shared(Mutex::new(State {
        queue: VecDeque::new(),
        reserved: 0,
        capacity: capacity.max(1),
        receiver: None,
        sender: None,
        sender_gone: false,
        receiver_gone: false,
    })));
    (Sender(shared.clone()), Receiver(shared))
}

fn wake(waker: &mut Option<Waker>) {
    if let Some(w) = waker.take() {
        w.wake();
    }
}

fn park(slot: &mut Option<Waker>, cx: &Context<'_>) {
    if !slot.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
        *slot = Some(cx.waker().clone());
    }
}

impl<T> Sender<T> {
    /// Room for one value now, if there is any.
    pub fn try_reserve(&self) -> Result<Permit<'_, T>, TryReserveError> {
        let mut state = self.0.lock();
        if state.receiver_gone {
            return Err(TryReserveError::Closed);
        }
        if state.queue.len() + state.reserved >= state.capacity {
            return Err(TryReserveError::Full);
        }
        state.reserved += 1;
        Ok(Permit {
            sender: self,
            used: false,
        })
    }

    /// Room for one value, once there is some.
    pub async fn reserve(&self) -> Result<Permit<'_, T>, Closed> {
        poll_fn(|cx| {
            let mut state = self.0.lock();
            if state.receiver_gone {
                return Poll::Ready(Err(Closed));
            }
            if state.queue.len() + state.reserved < state.capacity {
                state.reserved += 1;
                return Poll::Ready(Ok(()));
            }
            park(&mut state.sender, cx);
            Poll::Pending
        })
        .await?;
        Ok(Permit {
            sender: self,
            used: false,
        })
    }

    /// Sends `value` once there is room.
    pub async fn send(&self, value: T) -> Result<(), Closed> {
        self.reserve().await?.send(value);
        Ok(())
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.sender_gone = true;
        wake(&mut state.receiver);
    }
}

impl<T> Permit<'_, T> {
    /// Queues `value` in the room this permit holds.
    pub fn send(mut self, value: T) {
        self.used = true;
        let mut state = self.sender.0.lock();
        state.reserved -= 1;
        if !state.receiver_gone {
            state.queue.push_back(value);
            wake(&mut state.receiver);
        }
    }
}

impl<T> Drop for Permit<'_, T> {
    fn drop(&mut self) {
        if !self.used {
            let mut state = self.sender.0.lock();
            state.reserved -= 1;
            wake(&mut state.sender);
        }
    }
}

impl<T> Receiver<T> {
    /// The next value; `None` once the sender is gone and everything was read.
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let mut state = self.0.lock();
        if let Some(value) = state.queue.pop_front() {
            wake(&mut state.sender);
            return Poll::Ready(Some(value));
        }
        if state.sender_gone {
            return Poll::Ready(None);
        }
        park(&mut state.receiver, cx);
        Poll::Pending
    }

    /// The next value; `None` once the sender is gone and everything was read.
    pub async fn recv(&mut self) -> Option<T> {
        poll_fn(|cx| self.poll_recv(cx)).await
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        let queued = {
            let mut state = self.0.lock();
            state.receiver_gone = true;
            wake(&mut state.sender);
            std::mem::take(&mut state.queue)
        };
        // Dropped outside the lock: a queued response can be large.
        drop(queued);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn values_arrive_in_order_and_the_sender_waits_for_room() {
        let (tx, mut rx) = channel::<u32>(2);
        tx.send(1).await.unwrap();
        let permit = tx.try_reserve().unwrap();
        assert_eq!(tx.try_reserve().unwrap_err(), TryReserveError::Full);
        permit.send(2);
        let sender = async {
            tx.send(3).await.unwrap();
            tx
        };
        let receiver = async {
            let mut got = Vec::new();
            while got.len() < 3 {
                got.push(rx.recv().await.unwrap());
            }
            (got, rx)
        };
        let (tx, (got, mut rx)) = tokio::join!(sender, receiver);
        assert_eq!(got, vec![1, 2, 3]);
        drop(tx);
        assert_eq!(rx.recv().await, None, "the sender is gone");
    }

    #[tokio::test]
    async fn an_unused_permit_gives_its_room_back() {
        let (tx, _rx) = channel::<u32>(1);
        drop(tx.try_reserve().unwrap());
        assert!(tx.try_reserve().is_ok());
    }

    #[tokio::test]
    async fn a_sender_waiting_for_room_learns_that_the_receiver_is_gone() {
        let (tx, rx) = channel::<u32>(1);
        tx.send(1).await.unwrap();
        let waiting = tx.reserve();
        tokio::pin!(waiting);
        assert!(futures::poll!(waiting.as_mut()).is_pending());
        drop(rx);
        assert_eq!(waiting.await.unwrap_err(), Closed);
        assert_eq!(tx.try_reserve().unwrap_err(), TryReserveError::Closed);
        assert_eq!(tx.send(2).await, Err(Closed));
    }
}
