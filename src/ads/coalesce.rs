//! Writes gathered into fewer system calls.
//!
//! The HTTP/2 layer writes one DATA frame at a time and flushes after each: a response
//! cut into 16 KB frames (the peer's default `SETTINGS_MAX_FRAME_SIZE`, Envoy's
//! included) costs a system call and a TCP segment per 16 KB, and a 650 KB route table
//! to 20,000 proxies costs 800,000 of each. In a profile of that push, the send path
//! (segments through TCP and, on loopback, the receiver's side of them) was half of the
//! server's CPU, and the copy of the bytes themselves a fifth. Envoy and gRPC-Go gather
//! their frames in a write buffer and write it once the event loop has nothing more to
//! add; this does the same below hyper:
//!
//! - a write that fits in [`GATHER`] bytes with what is held is copied and reported
//!   written; a larger one goes out in one vectored call together with what is held;
//! - a flush after new writes is deferred: the task is woken so that it runs again,
//!   and the frames it queues meanwhile (the rest of a response, other streams'
//!   responses) join the same write. The next flush with nothing new written writes
//!   everything out, as does a shutdown. A deferral lasts one turn of the task at
//!   most: once the task has read again (HTTP/2 reads first on each turn), the next
//!   flush writes, new writes or not, so a connection that writes a little on every
//!   turn is not held back for ever;
//! - an emptied buffer goes back to a small process-wide pool: an idle connection
//!   holds none, and bursts reuse the same pages;
//! - at most [`GATHER_BUDGET`] bytes of buffers exist in the process at once: a push
//!   to 20,000 connections whose tasks all wait for their next turn would otherwise
//!   hold 1.3 GB of copies. Past it, writes go straight to the socket as before.
//!
//! A client ([`WriteBuffer::client`]) defers no flush of a turn that wrote a frame
//! other than DATA, WINDOW_UPDATE or PING (its connection preface, SETTINGS, a
//! stream's HEADERS, RST_STREAM, GOAWAY): a deferred flush costs the task one more
//! wait in the runtime's queue, and a load tool saturated by 20,000 reconnecting
//! proxies kept connections' first streams from the server past its handshake
//! deadline that way. Frames that only carry data keep being gathered.
//!
//! The cost is one copy of what is gathered (a fifth of what the system calls and
//! segments it saves cost) and one more poll of the connection's task per burst.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::h2scan::FrameScan;

/// Most bytes held before they are written: the size of one TCP segment on loopback
/// (and of a TSO segment), and four of Envoy's 16 KB frames.
pub const GATHER: usize = 64 * 1024;

/// Most bytes of gathering buffers in the process at once (1,024 of them).
pub const GATHER_BUDGET: usize = 1024 * GATHER;

/// Bytes of gathering buffers allocated now, over every connection.
static GATHERING: AtomicUsize = AtomicUsize::new(0);

/// Takes a buffer's worth of [`GATHER_BUDGET`], if it has room.
fn take_budget() -> bool {
    take_budget_of(&GATHERING)
}

fn take_budget_of(counter: &AtomicUsize) -> bool {
    counter
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
            (held + GATHER <= GATHER_BUDGET).then_some(held + GATHER)
        })
        .is_ok()
}

/// Emptied buffers kept for the next burst, at most [`POOLED`]: a buffer per burst
/// from the allocator left its pages behind, freed but resident until the allocator
/// purged them (8 KB more RSS per idle connection just after 4,000 connected, 70 MiB
/// more with 10,000 proxyless clients); pooled, the same few pages are reused.
// Boxed: a buffer moves between the pool and connections' `WriteBuffer`s as is.
#[allow(clippy::vec_box)]
static POOL: std::sync::Mutex<Vec<Box<Held>>> = std::sync::Mutex::new(Vec::new());

/// Most buffers kept in [`POOL`] (8 MiB of them).
const POOLED: usize = 128;

/// A buffer of [`GATHER`] bytes' capacity, from the pool if it has one.
fn pooled() -> Box<Held> {
    let reused = POOL.lock().unwrap_or_else(|e| e.into_inner()).pop();
    reused.unwrap_or_else(|| {
        Box::new(Held {
            bytes: Vec::with_capacity(GATHER),
            start: 0,
        })
    })
}

/// Gives an emptied buffer back to the pool (or to the allocator when it is full).
fn unpool(mut buf: Box<Held>) {
    buf.bytes.clear();
    buf.start = 0;
    if buf.bytes.capacity() != GATHER {
        return;
    }
    let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
    if pool.len() < POOLED {
        pool.push(buf);
    }
}

/// Bytes written by the layer above and not yet handed to the socket.
#[derive(Debug, Default)]
pub struct WriteBuffer {
    /// What is held, if anything (boxed with its cursor: every connection's future
    /// holds a `WriteBuffer`, and most of them hold nothing most of the time).
    held: Option<Box<Held>>,
    /// A client's: the frames written, followed to tell which may wait (boxed: a
    /// server's connections, by the thousand, have none).
    frames: Option<Box<FrameScan>>,
    /// A frame that should not wait for another turn was written since the last
    /// write-out (client only).
    urgent: bool,
    /// Written to since the last flush was asked for.
    fresh: bool,
    /// A flush was deferred and nothing written out since.
    deferred: bool,
    /// The task read since the flush was deferred (a later turn of it).
    read_since: bool,
    /// Writes go straight through (a TLS connection's socket: its stream gathers
    /// above the encryption).
    through: bool,
}

/// A gathering buffer and how much of it was written out already.
#[derive(Debug)]
struct Held {
    bytes: Vec<u8>,
    start: usize,
}

impl Held {
    fn unwritten(&self) -> &[u8] {
        &self.bytes[self.start..]
    }
}

impl WriteBuffer {
    /// A client's buffer: as a server's, but a turn that wrote a frame other than
    /// data is written out at its end (see the module's comment).
    pub fn client() -> WriteBuffer {
        let mut writes = WriteBuffer::default();
        writes.frames = Some(Box::default());
        writes
    }

    /// Follows the first `n` bytes of `bufs`, taken (client only).
    fn taken(&mut self, bufs: &[IoSlice<'_>], mut n: usize) {
        let Some(frames) = &mut self.frames else {
            return;
        };
        for b in bufs {
            let k = n.min(b.len());
            // The preface and any frame but DATA, PING and WINDOW_UPDATE may not wait.
            self.urgent |= (frames.in_preface() && k > 0)
                | frames.walk(&b[..k], |kind| !matches!(kind, 0x0 | 0x6 | 0x8));
            n -= k;
            if n == 0 {
                break;
            }
        }
    }

    fn held(&self) -> usize {
        self.held.as_ref().map_or(0, |h| h.unwritten().len())
    }

    /// Takes `bufs` (all of them, or a part once a write of what is held with them
    /// went out partly).
    pub fn poll_write_vectored<W: AsyncWrite + Unpin>(
        &mut self,
        io: &mut W,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.through {
            return Pin::new(&mut *io).poll_write_vectored(cx, bufs);
        }
        let n: usize = bufs.iter().map(|b| b.len()).sum();
        loop {
            let held = self.held();
            if n == 0 {
                return Poll::Ready(Ok(0));
            }
            if held + n <= GATHER && (self.held.is_some() || take_budget()) {
                let h = self.held.get_or_insert_with(pooled);
                if h.start > 0 {
                    // Part of it went out in a short write: keep the rest at the front.
                    h.bytes.drain(..h.start);
                    h.start = 0;
                }
                for b in bufs {
                    h.bytes.extend_from_slice(b);
                }
                self.fresh = true;
                self.taken(bufs, n);
                return Poll::Ready(Ok(n));
            }
            if held == 0 {
                self.release();
                let written = ready!(Pin::new(&mut *io).poll_write_vectored(cx, bufs))?;
                self.taken(bufs, written);
                return Poll::Ready(Ok(written));
            }
            let h = self.held.as_mut().expect("bytes are held");
            let mut slices = Vec::with_capacity(bufs.len() + 1);
            slices.push(IoSlice::new(h.unwritten()));
            slices.extend(bufs.iter().map(|b| IoSlice::new(b)));
            let written = ready!(Pin::new(&mut *io).poll_write_vectored(cx, &slices))?;
            if written == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            if written < held {
                h.start += written;
                continue;
            }
            // What was held is out; the allocation stays for the rest of the burst.
            h.bytes.clear();
            h.start = 0;
            if written > held {
                self.taken(bufs, written - held);
                return Poll::Ready(Ok(written - held));
            }
        }
    }

    /// Writes out what is held, unless this is the first flush since new writes came
    /// in this turn of the task (see the module's comment).
    pub fn poll_flush<W: AsyncWrite + Unpin>(
        &mut self,
        io: &mut W,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        if self.through {
            return Pin::new(io).poll_flush(cx);
        }
        let fresh = std::mem::take(&mut self.fresh);
        if self.held() > 0 && fresh && !self.urgent && !(self.deferred && self.read_since) {
            self.deferred = true;
            self.read_since = false;
            cx.waker().wake_by_ref();
            return Poll::Ready(Ok(()));
        }
        ready!(self.poll_drain(io, cx))?;
        Pin::new(io).poll_flush(cx)
    }

    /// Notes that the task is reading: a deferred flush waits no longer.
    pub fn saw_read(&mut self) {
        self.read_since = true;
    }

    /// Writes out what is held, then shuts the writing side.
    pub fn poll_shutdown<W: AsyncWrite + Unpin>(
        &mut self,
        io: &mut W,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        ready!(self.poll_drain(io, cx))?;
        Pin::new(io).poll_shutdown(cx)
    }

    fn poll_drain<W: AsyncWrite + Unpin>(
        &mut self,
        io: &mut W,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        while let Some(h) = self.held.as_mut().filter(|h| !h.unwritten().is_empty()) {
            let written = ready!(Pin::new(&mut *io).poll_write(cx, h.unwritten()))?;
            if written == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            h.start += written;
        }
        self.release();
        self.fresh = false;
        self.deferred = false;
        self.urgent = false;
        Poll::Ready(Ok(()))
    }

    /// Frees the (empty) buffer and gives its budget back.
    fn release(&mut self) {
        debug_assert_eq!(self.held(), 0);
        if let Some(held) = self.held.take() {
            unpool(held);
            GATHERING.fetch_sub(GATHER, Ordering::AcqRel);
        }
    }
}

impl Drop for WriteBuffer {
    fn drop(&mut self) {
        if self.held.is_some() {
            GATHERING.fetch_sub(GATHER, Ordering::AcqRel);
        }
    }
}

/// An I/O object whose writes are gathered by a [`WriteBuffer`]: a client's, or a
/// server's accepted socket or TLS stream.
#[derive(Debug)]
pub struct Gathered<T> {
    io: T,
    writes: WriteBuffer,
}

impl<T> Gathered<T> {
    /// A server's `io` with its writes gathered (deferred a turn whatever they hold).
    pub fn server(io: T) -> Gathered<T> {
        Gathered {
            io,
            writes: WriteBuffer::default(),
        }
    }

    /// A client's `io` with its writes gathered ([`WriteBuffer::client`]).
    pub fn new(io: T) -> Gathered<T> {
        Gathered {
            io,
            writes: WriteBuffer::client(),
        }
    }

    /// Leaves gathering to the layer above: writes go straight through from now on
    /// (before any was made).
    pub fn write_through(&mut self) {
        debug_assert_eq!(self.writes.held(), 0);
        self.writes.through = true;
    }

    /// The wrapped object.
    pub fn get_ref(&self) -> &T {
        &self.io
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Gathered<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.writes.saw_read();
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Gathered<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.writes
            .poll_write_vectored(&mut this.io, cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.writes.poll_write_vectored(&mut this.io, cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        !self.writes.through || self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.writes.poll_flush(&mut this.io, cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.writes.poll_shutdown(&mut this.io, cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    /// A socket that records each write call, taking at most `room` bytes per call
    /// (`usize::MAX`: all) and none while `full`.
    #[derive(Default)]
    struct Recorder {
        calls: Vec<Vec<u8>>,
        room: usize,
        full: bool,
        flushed: usize,
        shut: bool,
    }

    impl AsyncWrite for Recorder {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            let this = self.get_mut();
            if this.full {
                return Poll::Pending;
            }
            let n = buf.len().min(this.room);
            this.calls.push(buf[..n].to_vec());
            Poll::Ready(Ok(n))
        }

        fn poll_write_vectored(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            let this = self.get_mut();
            if this.full {
                return Poll::Pending;
            }
            let all: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).collect();
            let n = all.len().min(this.room);
            this.calls.push(all[..n].to_vec());
            Poll::Ready(Ok(n))
        }

        fn is_write_vectored(&self) -> bool {
            true
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.get_mut().flushed += 1;
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.get_mut().shut = true;
            Poll::Ready(Ok(()))
        }
    }

    struct Wakes(AtomicUsize);

    impl Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A DATA frame's worth.
    const FRAME: usize = 4096;

    /// A server's gathering (across turns) over a recording socket.
    fn gathered() -> Gathered<Recorder> {
        Gathered {
            io: Recorder {
                room: usize::MAX,
                ..Default::default()
            },
            writes: WriteBuffer::default(),
        }
    }

    fn write(g: &mut Gathered<Recorder>, cx: &mut Context<'_>, data: &[u8]) -> Poll<usize> {
        Pin::new(g).poll_write(cx, data).map(|r| r.unwrap())
    }

    fn flush(g: &mut Gathered<Recorder>, cx: &mut Context<'_>) -> Poll<()> {
        Pin::new(g).poll_flush(cx).map(|r| r.unwrap())
    }

    /// Writes `data` in two writes cut at `at`, each taken whole, then flushes.
    fn write_cut_then_flush(
        g: &mut Gathered<Recorder>,
        cx: &mut Context<'_>,
        data: &[u8],
        at: usize,
    ) -> Poll<()> {
        assert_eq!(write(g, cx, &data[..at]), Poll::Ready(at));
        assert_eq!(write(g, cx, &data[at..]), Poll::Ready(data.len() - at));
        flush(g, cx)
    }

    #[test]
    fn frames_flushed_one_by_one_go_out_in_one_write() {
        let wakes = Arc::new(Wakes(AtomicUsize::new(0)));
        let waker = wakes.clone().into();
        let mut cx = Context::from_waker(&waker);
        let mut g = gathered();
        // As HTTP/2 writes: a DATA frame, a flush, the next frame, a flush...
        for i in 0..3u8 {
            assert_eq!(write(&mut g, &mut cx, &[i; FRAME]), Poll::Ready(FRAME));
            assert_eq!(flush(&mut g, &mut cx), Poll::Ready(()));
        }
        assert!(
            g.io.calls.is_empty(),
            "nothing written while frames kept coming"
        );
        assert!(
            wakes.0.load(Ordering::SeqCst) >= 1,
            "the task will run again"
        );
        // It has nothing more: the flush writes everything.
        assert_eq!(flush(&mut g, &mut cx), Poll::Ready(()));
        assert_eq!(g.io.calls.len(), 1);
        let expected: Vec<u8> = (0..3u8).flat_map(|i| [i; FRAME]).collect();
        assert_eq!(g.io.calls[0], expected);
        assert_eq!(
            g.io.flushed, 1,
            "the socket is flushed once its bytes are out"
        );
        assert!(g.writes.held.is_none(), "an emptied buffer is given back");
    }

    #[test]
    fn a_flush_waits_one_turn_of_the_task_at_most() {
        let waker = Arc::new(Wakes(AtomicUsize::new(0))).into();
        let mut cx = Context::from_waker(&waker);
        let mut g = gathered();
        // Each turn reads, then writes a frame and flushes.
        let (one, two) = (vec![1u8; FRAME], vec![2u8; FRAME]);
        assert_eq!(write(&mut g, &mut cx, &one), Poll::Ready(FRAME));
        assert_eq!(flush(&mut g, &mut cx), Poll::Ready(()));
        assert!(g.io.calls.is_empty(), "deferred to the next turn");
        g.writes.saw_read();
        assert_eq!(write(&mut g, &mut cx, &two), Poll::Ready(FRAME));
        assert_eq!(flush(&mut g, &mut cx), Poll::Ready(()));
        assert_eq!(
            g.io.calls,
            vec![[one, two].concat()],
            "written on the next turn"
        );
    }

    fn frame(kind: u8, payload: usize) -> Vec<u8> {
        let len = payload as u32;
        let mut f = vec![
            (len >> 16) as u8,
            (len >> 8) as u8,
            len as u8,
            kind,
            0,
            0,
            0,
            0,
            1,
        ];
        f.resize(9 + payload, 7);
        f
    }

    #[test]
    fn a_client_writes_out_a_turn_that_opened_a_stream_and_gathers_data() {
        let waker = Arc::new(Wakes(AtomicUsize::new(0))).into();
        let mut cx = Context::from_waker(&waker);
        let mut g = Gathered::new(Recorder {
            room: usize::MAX,
            ..Default::default()
        });
        // The connection preface and SETTINGS: out at the end of the turn.
        let hello = [&b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"[..], &frame(0x4, 6)].concat();
        assert_eq!(write(&mut g, &mut cx, &hello), Poll::Ready(hello.len()));
        assert_eq!(flush(&mut g, &mut cx), Poll::Ready(()));
        assert_eq!(g.io.calls, vec![hello.clone()]);
        // DATA and WINDOW_UPDATE: gathered across a turn, as a server's.
        let (data, window) = (frame(0x0, 16 * 1024), frame(0x8, 4));
        assert_eq!(write(&mut g, &mut cx, &data), Poll::Ready(data.len()));
        assert_eq!(write(&mut g, &mut cx, &window), Poll::Ready(window.len()));
        assert_eq!(flush(&mut g, &mut cx), Poll::Ready(()));
        assert_eq!(g.io.calls.len(), 1, "deferred");
        // A stream's HEADERS in the same turn: everything goes out at its end.
        let headers = frame(0x1, 20);
        assert_eq!(write(&mut g, &mut cx, &headers), Poll::Ready(headers.len()));
        assert_eq!(flush(&mut g, &mut cx), Poll::Ready(()));
        assert_eq!(g.io.calls[1], [&data[..], &window, &headers].concat());
        // Frames split over writes are followed all the same.
        assert_eq!(
            write_cut_then_flush(&mut g, &mut cx, &data, 5),
            Poll::Ready(())
        );
        assert_eq!(g.io.calls.len(), 2, "DATA waits");
        assert_eq!(
            write_cut_then_flush(&mut g, &mut cx, &headers, 4),
            Poll::Ready(())
        );
        assert_eq!(g.io.calls.len(), 3, "HEADERS does not");
    }

    #[test]
    fn a_socket_under_tls_writes_straight_through() {
        let waker = Arc::new(Wakes(AtomicUsize::new(0))).into();
        let mut cx = Context::from_waker(&waker);
        let mut g = gathered();
        g.write_through();
        let record = vec![3u8; FRAME];
        assert_eq!(write(&mut g, &mut cx, &record), Poll::Ready(FRAME));
        assert_eq!(g.io.calls, vec![record], "written at once, nothing held");
        assert_eq!(flush(&mut g, &mut cx), Poll::Ready(()));
        assert_eq!(g.io.flushed, 1);
    }

    #[test]
    fn a_write_beyond_the_limit_goes_out_with_what_is_held_in_one_call() {
        let waker = Arc::new(Wakes(AtomicUsize::new(0))).into();
        let mut cx = Context::from_waker(&waker);
        let mut g = gathered();
        let frame = vec![7u8; 16 * 1024];
        for _ in 0..4 {
            assert_eq!(write(&mut g, &mut cx, &frame), Poll::Ready(frame.len()));
            assert_eq!(flush(&mut g, &mut cx), Poll::Ready(()));
        }
        assert!(g.io.calls.is_empty(), "64 KB held");
        assert_eq!(write(&mut g, &mut cx, &frame), Poll::Ready(frame.len()));
        assert_eq!(g.io.calls.len(), 1);
        assert_eq!(
            g.io.calls[0].len(),
            5 * frame.len(),
            "held and new in one call"
        );
        assert_eq!(g.writes.held(), 0);
        // A large write with nothing held goes straight out.
        let big = vec![1u8; GATHER + 1];
        assert_eq!(write(&mut g, &mut cx, &big), Poll::Ready(big.len()));
        assert_eq!(g.io.calls.len(), 2);
    }

    #[test]
    fn short_writes_keep_the_rest_and_a_full_socket_holds_the_caller() {
        let waker = Arc::new(Wakes(AtomicUsize::new(0))).into();
        let mut cx = Context::from_waker(&waker);
        let mut g = gathered();
        g.io.room = 1000;
        let (first, second, third) = ([1u8; 60_000], [2u8; 10_000], [3u8; 10_000]);
        assert_eq!(write(&mut g, &mut cx, &first), Poll::Ready(first.len()));
        // Held and new exceed the limit: the socket takes 1,000 bytes per call, what is
        // held goes first until the new bytes fit.
        assert_eq!(write(&mut g, &mut cx, &second), Poll::Ready(second.len()));
        assert_eq!(g.io.calls.len(), 5);
        assert!(
            g.writes
                .held
                .as_ref()
                .is_none_or(|h| h.bytes.capacity() <= GATHER),
            "the buffer did not grow"
        );
        g.io.full = true;
        assert_eq!(write(&mut g, &mut cx, &third), Poll::Pending);
        assert_eq!(flush(&mut g, &mut cx), Poll::Ready(()), "deferred once");
        assert_eq!(
            flush(&mut g, &mut cx),
            Poll::Pending,
            "the rest waits on the socket"
        );
        g.io.full = false;
        let mut taken = 0;
        while taken < third.len() {
            let Poll::Ready(n) = write(&mut g, &mut cx, &third[taken..]) else {
                panic!("the socket has room");
            };
            taken += n;
        }
        while g.writes.held() > 0 {
            let _ = flush(&mut g, &mut cx);
        }
        let all: Vec<u8> = g.io.calls.concat();
        let expected: Vec<u8> = [&first[..], &second, &third].concat();
        assert_eq!(all, expected, "every byte once, in order");
    }

    #[test]
    fn a_buffer_holding_nothing_is_three_words() {
        // Inside every connection's future, by the ten thousand: the bytes and their
        // cursor are boxed, and a client's frame cursor too.
        assert!(std::mem::size_of::<WriteBuffer>() <= 3 * std::mem::size_of::<usize>());
    }

    #[test]
    fn the_budget_admits_a_buffer_only_while_it_has_room() {
        let counter = AtomicUsize::new(GATHER_BUDGET - 2 * GATHER);
        assert!(take_budget_of(&counter));
        assert!(take_budget_of(&counter));
        assert!(!take_budget_of(&counter), "full: writes go straight out");
        assert_eq!(counter.load(Ordering::SeqCst), GATHER_BUDGET);
    }

    #[test]
    fn shutdown_writes_out_what_is_held_first() {
        let waker = Arc::new(Wakes(AtomicUsize::new(0))).into();
        let mut cx = Context::from_waker(&waker);
        let mut g = gathered();
        let data = vec![5u8; FRAME];
        assert_eq!(write(&mut g, &mut cx, &data), Poll::Ready(FRAME));
        assert_eq!(flush(&mut g, &mut cx), Poll::Ready(()));
        assert!(g.io.calls.is_empty());
        assert!(Pin::new(&mut g).poll_shutdown(&mut cx).is_ready());
        assert_eq!(g.io.calls, vec![data]);
        assert!(g.io.shut);
    }
}
