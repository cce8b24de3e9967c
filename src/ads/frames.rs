//! gRPC response framing that keeps nothing per stream once a response is written.
//!
//! tonic's server-side encoder writes each response into one buffer owned by the
//! stream, and that buffer keeps the capacity of the largest response the stream ever
//! carried. A sidecar's route table in a 1,000-service mesh is ~650 KB, so 2,000 idle
//! sidecar streams would pin more than a gigabyte of buffers that hold nothing.
//!
//! Here a response becomes a list of chunks instead: the protobuf framing and small
//! resources are copied into fresh chunks of at most [`CHUNK_MAX`] bytes, and resource
//! bodies of [`SPLICE_MIN`] bytes or more are not copied at all: the chunk list holds
//! the snapshot's shared bytes. The HTTP/2 layer frees each chunk once written, so an
//! idle stream holds no response memory. [`ResponseBody`] is the HTTP body that feeds
//! these chunks to the transport and ends the stream with gRPC trailers.
//!
//! Requests are read by [`RequestStream`] for the same reason: tonic's decoder keeps a
//! buffer per stream as large as the largest request (an EDS ACK naming 1,000 clusters
//! is ~50 KB). Here the HTTP/2 data frames of a message are kept as they arrived (no
//! growing buffer, no copy while waiting); a message inside one frame is decoded from a
//! slice of it, one that spans frames is copied once into a buffer of exactly its size,
//! and nothing is kept between messages.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::task::{Context, Poll, ready};

use bytes::{BufMut, Bytes, BytesMut};
use http_body::Frame;
use prost::Message;
use prost::encoding::{self, WireType};
use tonic::codegen::http::HeaderMap;
use tonic::{Code, Status};

use super::outbox;
use super::segments::{self, SegmentMemo};
use super::transport::ConnControl;
use crate::xds::response::{DeltaResponse, SotwResponse, delta_resource_len};
use crate::xds::wire::SharedAny;
use crate::xds::{EncodedResource, Resource};

/// Resource bodies at least this long are spliced in by reference instead of copied.
pub const SPLICE_MIN: usize = 1024;
/// The largest chunk of copied bytes.
pub const CHUNK_MAX: usize = 32 * 1024;
/// gRPC's length prefix: a compression flag and a big-endian u32 length.
pub const PREFIX_LEN: usize = 5;

/// A message that can be framed as chunks, a part at a time: the head (leading
/// fields), one part per resource, then the tail (trailing fields).
pub trait FrameEncode {
    /// The protobuf-encoded length.
    fn message_len(&self) -> usize;
    /// Bytes that [`ChunkWriter::shared`] will splice rather than copy.
    fn spliced_len(&self) -> usize;
    /// How many resource parts there are.
    fn parts(&self) -> usize;
    /// Writes the fields before the resources.
    fn write_head(&self, out: &mut ChunkWriter);
    /// Writes resource `index`.
    fn write_part(&self, index: usize, out: &mut ChunkWriter);
    /// Writes the fields after the resources.
    fn write_tail(&self, out: &mut ChunkWriter);
    /// The resources, in order: part `i` is `resources()[i]`.
    fn resources(&self) -> &[Resource];
    /// The encoded length of part `index`, with its key.
    fn part_len(&self, index: usize) -> usize;
    /// Which message the parts belong to: parts of different kinds are framed
    /// differently.
    const KIND: u8;
}

/// Writes one message out as gRPC-framed chunks, only as far as the reader asks:
/// at most about one chunk of copied bytes exists at a time, however large the
/// message.
#[derive(Debug)]
pub struct FrameCursor<M> {
    message: M,
    out: ChunkWriter,
    /// 0 = prefix and head, 1..=parts = resources, parts + 1 = tail, then done.
    next: usize,
    /// Where runs of resources framed for earlier responses are found.
    segments: Option<Arc<SegmentMemo>>,
}

impl<M: FrameEncode> FrameCursor<M> {
    /// A cursor at the start of `message`, framing every resource itself.
    pub fn new(message: M) -> Self {
        Self::with_segments(message, None)
    }

    /// A cursor at the start of `message` that splices runs of resources already
    /// framed (see [`super::segments`]) from `segments`.
    pub fn with_segments(message: M, segments: Option<Arc<SegmentMemo>>) -> Self {
        let len = message.message_len();
        let copied = PREFIX_LEN + len - message.spliced_len();
        let mut out = ChunkWriter::new(copied, message.parts());
        let prefix = out.small(PREFIX_LEN);
        prefix.put_u8(0);
        prefix.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
        FrameCursor {
            message,
            out,
            next: 0,
            segments,
        }
    }

    /// Writes the resources from part `start` on: one shared segment, or one part.
    /// Returns the next part.
    fn write_from(&mut self, start: usize) -> usize {
        if let Some(memo) = &self.segments
            && let Some(end) = segments::segment(self.message.resources(), start)
        {
            let message = &self.message;
            let framed = memo.framed(M::KIND, &message.resources()[start..end], || {
                let len = (start..end).map(|i| message.part_len(i)).sum();
                let mut whole = ChunkWriter::whole(len);
                for i in start..end {
                    message.write_part(i, &mut whole);
                }
                whole.current.freeze()
            });
            match framed {
                Some(bytes) => self.out.splice(bytes),
                None => {
                    for i in start..end {
                        self.message.write_part(i, &mut self.out);
                    }
                }
            }
            return end;
        }
        self.message.write_part(start, &mut self.out);
        start + 1
    }

    /// The next chunks in order (at least one), or `None` once all are out.
    pub fn next_chunks(&mut self) -> Option<std::vec::IntoIter<Chunk>> {
        let parts = self.message.parts();
        while self.out.chunks.is_empty() && self.next <= parts + 1 {
            match self.next {
                0 => {
                    self.message.write_head(&mut self.out);
                    self.next = 1;
                }
                n if n <= parts => self.next = self.write_from(n - 1) + 1,
                _ => {
                    self.message.write_tail(&mut self.out);
                    self.out.flush();
                    self.next += 1;
                }
            }
        }
        if self.out.chunks.is_empty() {
            return None;
        }
        Some(std::mem::take(&mut self.out.chunks).into_iter())
    }

    /// The whole framed message at once (tests, small messages).
    pub fn collect(message: M) -> Vec<Bytes> {
        let mut cursor = FrameCursor::new(message);
        let mut all = Vec::new();
        while let Some(chunks) = cursor.next_chunks() {
            all.extend(chunks.map(|c| c.bytes));
        }
        all
    }
}

/// One piece of a framed message.
#[derive(Debug)]
pub struct Chunk {
    pub bytes: Bytes,
    /// A resource body of the snapshot, spliced as it is: HTTP/2 holding it costs no
    /// memory of its own, so it does not count against the send budget.
    pub spliced: bool,
}

/// Collects a message as chunks: copied bytes in bounded chunks sized to what is left
/// to copy, large shared bodies as they are.
#[derive(Debug)]
pub struct ChunkWriter {
    chunks: Vec<Chunk>,
    current: BytesMut,
    /// Copied bytes not yet written: bounds the next chunk's allocation.
    copy_left: usize,
    /// The size of a fresh buffer (see [`chunk_size`]).
    chunk_size: usize,
    /// Copy large bodies too: everything goes into one buffer.
    copy_all: bool,
}

/// The buffer size for a message of `copied` bytes to copy over `parts` resources:
/// about 32 resources' worth, between 1 KiB and [`CHUNK_MAX`]. A message whose bodies
/// are spliced copies only a few bytes of framing per resource, and a stream waiting
/// in the middle of it holds the buffer it is framing into: 20,000 such streams held
/// ~440 MB of 32 KiB buffers while a load tool read 100 connections at a time.
fn chunk_size(copied: usize, parts: usize) -> usize {
    if parts == 0 {
        return CHUNK_MAX;
    }
    (copied / parts).saturating_mul(32).clamp(1024, CHUNK_MAX)
}

impl ChunkWriter {
    fn new(copy_total: usize, parts: usize) -> Self {
        ChunkWriter {
            chunks: Vec::new(),
            current: BytesMut::new(),
            copy_left: copy_total,
            chunk_size: chunk_size(copy_total, parts),
            copy_all: false,
        }
    }

    /// A writer copying everything, bodies included, into one buffer of `len` bytes.
    fn whole(len: usize) -> Self {
        ChunkWriter {
            chunks: Vec::new(),
            current: BytesMut::with_capacity(len),
            copy_left: len,
            chunk_size: len,
            copy_all: true,
        }
    }

    /// Shared bytes framed earlier, spliced as they are.
    fn splice(&mut self, bytes: Bytes) {
        self.flush();
        self.chunks.push(Chunk {
            bytes,
            spliced: true,
        });
    }

    /// A buffer with room for `n` contiguous copied bytes.
    fn small(&mut self, n: usize) -> &mut BytesMut {
        if self.current.capacity() - self.current.len() < n {
            self.flush();
            let size = self.copy_left.clamp(n, self.chunk_size.max(n));
            self.current = BytesMut::with_capacity(size);
        }
        self.copy_left = self.copy_left.saturating_sub(n);
        &mut self.current
    }

    fn flush(&mut self) {
        if !self.current.is_empty() {
            // The written bytes go out; the rest of the allocation stays for the next
            // copied bytes. A few bytes of framing between two spliced bodies would
            // otherwise pin a fresh 32 KiB allocation each while they wait in HTTP/2
            // (1.2 GB of the heap with 20,000 sidecars reconnecting).
            self.chunks.push(Chunk {
                bytes: self.current.split().freeze(),
                spliced: false,
            });
        }
    }

    fn key(&mut self, tag: u32, len: usize) {
        let n = encoding::key_len(tag) + encoding::encoded_len_varint(len as u64);
        let buf = self.small(n);
        encoding::encode_key(tag, WireType::LengthDelimited, buf);
        encoding::encode_varint(len as u64, buf);
    }

    /// A string field (skipped when empty, as proto3 does).
    fn string(&mut self, tag: u32, value: &str) {
        if value.is_empty() {
            return;
        }
        self.key(tag, value.len());
        self.small(value.len()).put_slice(value.as_bytes());
    }

    /// A bytes field whose value is shared: spliced when large, copied when small.
    fn shared(&mut self, tag: u32, value: &Bytes) {
        if value.is_empty() {
            return;
        }
        self.key(tag, value.len());
        if value.len() >= SPLICE_MIN && !self.copy_all {
            self.splice(value.clone());
        } else {
            self.small(value.len()).put_slice(value);
        }
    }
}

fn spliced(any: &SharedAny) -> usize {
    if any.value.len() >= SPLICE_MIN {
        any.value.len()
    } else {
        0
    }
}

fn write_any(out: &mut ChunkWriter, tag: u32, any: &SharedAny) {
    out.key(tag, any.encoded_len());
    out.string(1, any.type_url);
    out.shared(2, &any.value);
}

impl FrameEncode for SotwResponse {
    fn message_len(&self) -> usize {
        self.encoded_len()
    }

    fn spliced_len(&self) -> usize {
        self.resources.iter().map(|r| spliced(&r.body)).sum()
    }

    fn parts(&self) -> usize {
        self.resources.len()
    }

    fn write_head(&self, out: &mut ChunkWriter) {
        out.string(1, &self.version_info);
    }

    fn write_part(&self, index: usize, out: &mut ChunkWriter) {
        write_any(out, 2, &self.resources[index].body);
    }

    fn write_tail(&self, out: &mut ChunkWriter) {
        out.string(4, &self.type_url);
        out.string(5, &self.nonce);
        out.shared(6, &self.control_plane);
    }

    fn resources(&self) -> &[Resource] {
        &self.resources
    }

    fn part_len(&self, index: usize) -> usize {
        encoding::message::encoded_len(2, &self.resources[index].body)
    }

    const KIND: u8 = 1;
}

impl FrameEncode for DeltaResponse {
    fn message_len(&self) -> usize {
        self.encoded_len()
    }

    fn spliced_len(&self) -> usize {
        self.resources.iter().map(|r| spliced(&r.body)).sum()
    }

    fn parts(&self) -> usize {
        self.resources.len()
    }

    fn write_head(&self, out: &mut ChunkWriter) {
        out.string(1, &self.system_version_info);
    }

    fn write_part(&self, index: usize, out: &mut ChunkWriter) {
        write_delta_resource(out, &self.resources[index]);
    }

    fn write_tail(&self, out: &mut ChunkWriter) {
        out.string(4, &self.type_url);
        out.string(5, &self.nonce);
        for name in &self.removed_resources {
            // Repeated strings are written even when empty.
            out.key(6, name.len());
            out.small(name.len()).put_slice(name.as_bytes());
        }
        out.shared(7, &self.control_plane);
    }

    fn resources(&self) -> &[Resource] {
        &self.resources
    }

    fn part_len(&self, index: usize) -> usize {
        let len = delta_resource_len(&self.resources[index]);
        encoding::key_len(2) + encoding::encoded_len_varint(len as u64) + len
    }

    const KIND: u8 = 2;
}

fn write_delta_resource(out: &mut ChunkWriter, resource: &EncodedResource) {
    out.key(2, delta_resource_len(resource));
    out.string(1, &resource.version);
    write_any(out, 2, &resource.body);
    out.string(3, &resource.name);
}

/// What a stream task hands to its response body.
#[derive(Debug)]
pub enum Outbound<M> {
    /// One message, framed by the body as the transport takes it. Boxed, so that the
    /// stream's channel (tokio allocates its slots 32 at a time) costs an idle stream
    /// 32 pointers, not 32 messages.
    Message(Box<M>),
    /// End the stream with this status (in the trailers).
    Close(Status),
}

/// The HTTP body of one ADS response stream: each message from the stream task,
/// framed chunk by chunk only when the transport asks for more data, then gRPC
/// trailers. When the task drops its sender, the stream ends with status OK.
#[derive(Debug)]
pub struct ResponseBody<M> {
    rx: outbox::Receiver<Outbound<M>>,
    current: Option<FrameCursor<M>>,
    pending: std::vec::IntoIter<Chunk>,
    done: bool,
    /// The connection: the next chunk of a message is framed only while HTTP/2
    /// keeps up ([`ConnControl::poll_send_room`]).
    control: Option<Arc<ConnControl>>,
    /// Bytes of this stream's copied chunks HTTP/2 holds.
    in_flight: Arc<AtomicUsize>,
}

impl<M> ResponseBody<M> {
    /// A body reading from `rx`, paced by the connection's socket when `control` is
    /// given.
    pub fn new(rx: outbox::Receiver<Outbound<M>>, control: Option<Arc<ConnControl>>) -> Self {
        ResponseBody {
            rx,
            current: None,
            pending: Vec::new().into_iter(),
            done: false,
            control,
            in_flight: Arc::default(),
        }
    }
}

fn trailers(status: &Status) -> HeaderMap {
    let mut map = HeaderMap::with_capacity(2);
    if status.add_header(&mut map).is_err() {
        // The message could not be a header value; keep the code alone.
        let _ = Status::new(status.code(), "").add_header(&mut map);
    }
    map
}

impl<M: FrameEncode + Unpin> http_body::Body for ResponseBody<M> {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        loop {
            if let Some(Chunk { bytes, spliced }) = this.pending.next() {
                // Only copied bytes count: a spliced body is the snapshot's, and
                // counting it made a connection's streams take turns behind one
                // large route table.
                let chunk = match &this.control {
                    Some(control) if !spliced => control.track(&this.in_flight, bytes),
                    _ => bytes,
                };
                return Poll::Ready(Some(Ok(Frame::data(chunk))));
            }
            if let Some(cursor) = &mut this.current {
                if let Some(control) = &this.control {
                    // The next chunks are copied only once the socket took the last.
                    ready!(control.poll_send_room(&this.in_flight, cx));
                }
                match cursor.next_chunks() {
                    Some(chunks) => {
                        this.pending = chunks;
                        continue;
                    }
                    None => this.current = None,
                }
            }
            if this.done {
                return Poll::Ready(None);
            }
            match ready!(this.rx.poll_recv(cx)) {
                Some(Outbound::Message(message)) => {
                    let segments = this.control.as_ref().and_then(|c| c.segments());
                    this.current = Some(FrameCursor::with_segments(*message, segments));
                }
                Some(Outbound::Close(status)) => {
                    this.done = true;
                    return Poll::Ready(Some(Ok(Frame::trailers(trailers(&status)))));
                }
                None => {
                    this.done = true;
                    let ok = Status::new(Code::Ok, "");
                    return Poll::Ready(Some(Ok(Frame::trailers(trailers(&ok)))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.current.is_none() && self.pending.len() == 0
    }
}

/// The largest request message accepted (tonic's default limit); the transport's
/// per-connection byte budget always admits one.
pub use super::transport::MAX_REQUEST;

/// Why reading a request failed.
#[derive(Debug)]
pub enum RequestError {
    /// The transport failed or the peer reset the stream: an ordinary disconnect.
    Transport(Status),
    /// The peer broke the protocol: the stream ends with `status`, and `reason` is the
    /// metric label (`malformed`, `compressed`, `oversize`, `truncated`, `buffer_limit`).
    Protocol {
        /// Metric label.
        reason: &'static str,
        /// What the peer is told.
        status: Status,
    },
}

impl RequestError {
    fn protocol(reason: &'static str, status: Status) -> Self {
        RequestError::Protocol { reason, status }
    }
}

/// The request messages of one gRPC stream, read from its HTTP body.
#[derive(Debug)]
pub struct RequestStream<M> {
    body: tonic::body::Body,
    /// Bytes of the message being assembled, as they arrived; empty between messages.
    /// Nothing is reserved ahead of the bytes by a message's claimed length.
    buf: Arrived,
    /// The connection's budget of request bytes, shared by its streams.
    control: Option<Arc<ConnControl>>,
    /// Bytes of `buf` taken from that budget.
    held: usize,
    done: bool,
    _message: std::marker::PhantomData<fn() -> M>,
}

impl<M> Drop for RequestStream<M> {
    fn drop(&mut self) {
        if let Some(control) = &self.control {
            control.release(self.held);
        }
    }
}

/// A request message, decoded from the data frames it arrived in.
pub trait RequestMessage: Message + Default {
    /// Decodes the message whose bytes are `pieces`, in order (more than one when it
    /// spanned frames). By default from one copy of the whole.
    fn decode_pieces(pieces: Vec<Bytes>) -> Result<Self, prost::DecodeError> {
        Self::decode(crate::xds::wire::joined(pieces.iter()))
    }
}

impl RequestMessage for envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest {}

impl RequestMessage for crate::xds::wire::SotwRequest {
    /// The names stay slices of the frames (see [`crate::xds::wire::ResourceNames`]).
    fn decode_pieces(pieces: Vec<Bytes>) -> Result<Self, prost::DecodeError> {
        crate::xds::wire::SotwRequest::decode_pieces(pieces)
    }
}

impl<M: RequestMessage> RequestStream<M> {
    /// Reads messages of type `M` from `body`; unfinished messages count against the
    /// connection's budget when `control` is given.
    pub fn new(body: tonic::body::Body, control: Option<Arc<ConnControl>>) -> Self {
        RequestStream {
            body,
            buf: Arrived::default(),
            control,
            held: 0,
            done: false,
            _message: std::marker::PhantomData,
        }
    }

    /// The next message; `None` when the client ended the stream. Boxed: a request
    /// (a SotW one holds its `Node` inline, ~550 bytes) would otherwise take that much
    /// room, several times over, in the future of every idle stream awaiting the next.
    pub async fn message(&mut self) -> Result<Option<Box<M>>, RequestError> {
        loop {
            if let Some(message) = self.take_message()? {
                return Ok(Some(message));
            }
            if self.done {
                return if self.buf.is_empty() {
                    Ok(None)
                } else {
                    Err(RequestError::protocol(
                        "truncated",
                        Status::invalid_argument(format!(
                            "request stream ended inside a message ({} bytes of it arrived)",
                            self.buf.len().saturating_sub(PREFIX_LEN)
                        )),
                    ))
                };
            }
            let frame = std::future::poll_fn(|cx| {
                http_body::Body::poll_frame(Pin::new(&mut self.body), cx)
            })
            .await;
            match frame {
                None => self.done = true,
                Some(Err(status)) => return Err(RequestError::Transport(status)),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.hold(data.len())?;
                        self.buf.push(data);
                    }
                }
            }
        }
    }

    fn hold(&mut self, n: usize) -> Result<(), RequestError> {
        let Some(control) = &self.control else {
            return Ok(());
        };
        if !control.hold(n) {
            return Err(RequestError::protocol(
                "buffer_limit",
                Status::resource_exhausted(format!(
                    "this connection holds more than {} bytes of unfinished request messages \
                     (--maxConnectionRequestBytes)",
                    control.budget()
                )),
            ));
        }
        self.held += n;
        Ok(())
    }

    /// Gives back to the connection's budget what `buf` no longer holds.
    fn settle(&mut self) {
        if let Some(control) = &self.control {
            control.release(self.held - self.buf.len());
        }
        self.held = self.buf.len();
    }

    /// Decodes the next message if all of it has arrived.
    fn take_message(&mut self) -> Result<Option<Box<M>>, RequestError> {
        let Some(prefix) = self.buf.prefix() else {
            return Ok(None);
        };
        if prefix[0] != 0 {
            return Err(RequestError::protocol(
                "compressed",
                Status::unimplemented(
                    "compressed request messages are not supported: send them uncompressed",
                ),
            ));
        }
        let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
        if len > MAX_REQUEST {
            return Err(RequestError::protocol(
                "oversize",
                Status::resource_exhausted(format!(
                    "request message of {len} bytes is larger than the limit of {MAX_REQUEST}"
                )),
            ));
        }
        if self.buf.len() < PREFIX_LEN + len {
            return Ok(None);
        }
        self.buf.take(PREFIX_LEN);
        // A message in one frame (most of them) is a slice of it; one that spanned
        // frames keeps its pieces.
        let decoded = if self.buf.in_one_frame(len) {
            M::decode(self.buf.take(len))
        } else {
            M::decode_pieces(self.buf.take_pieces(len))
        };
        self.settle();
        decoded.map(|m| Some(Box::new(m))).map_err(|e| {
            RequestError::protocol(
                "malformed",
                Status::invalid_argument(format!("malformed request message: {e}")),
            )
        })
    }
}

/// Data frames below this size are copied when they arrive rather than kept: a kept
/// frame pins the transport's read buffer it is a slice of, and a peer sending tiny
/// frames must not pin a buffer per byte it is charged for.
const KEEP_FRAME_MIN: usize = 4096;

/// The bytes of a gRPC stream that arrived and are not yet a whole message: the data
/// frames as the transport handed them over (small ones copied), in order. Also what
/// the load tool assembles responses with.
#[derive(Debug, Default)]
pub struct Arrived {
    frames: std::collections::VecDeque<Bytes>,
    len: usize,
}

impl Arrived {
    /// Keeps a data frame.
    pub fn push(&mut self, data: Bytes) {
        if data.is_empty() {
            return;
        }
        self.len += data.len();
        let data = if data.len() < KEEP_FRAME_MIN {
            Bytes::copy_from_slice(&data)
        } else {
            data
        };
        self.frames.push_back(data);
    }

    /// Bytes kept.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether none are kept.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The gRPC length prefix, once all of it arrived (it may span frames).
    pub fn prefix(&self) -> Option<[u8; PREFIX_LEN]> {
        if self.len < PREFIX_LEN {
            return None;
        }
        let mut prefix = [0u8; PREFIX_LEN];
        let mut at = 0;
        for frame in &self.frames {
            let n = frame.len().min(PREFIX_LEN - at);
            prefix[at..at + n].copy_from_slice(&frame[..n]);
            at += n;
            if at == PREFIX_LEN {
                break;
            }
        }
        Some(prefix)
    }

    /// Takes the first `n` bytes (at most `len()`) as they arrived: slices of the
    /// frames that hold them, in order, none copied.
    pub fn take_pieces(&mut self, n: usize) -> Vec<Bytes> {
        debug_assert!(n <= self.len);
        self.len -= n;
        let mut pieces = Vec::new();
        let mut left = n;
        while left > 0 {
            let frame = self.frames.front_mut().expect("n bytes arrived");
            if frame.len() <= left {
                left -= frame.len();
                pieces.push(self.frames.pop_front().expect("a frame"));
            } else {
                pieces.push(frame.split_to(left));
                left = 0;
            }
        }
        self.tidy();
        pieces
    }

    /// Whether the first `n` bytes are all in the first frame kept.
    pub fn in_one_frame(&self, n: usize) -> bool {
        self.frames.front().is_some_and(|f| f.len() >= n)
    }

    /// Takes the first `n` bytes (at most `len()`): a slice of the first frame when it
    /// holds them all, else one copy of exactly `n` bytes. An empty message (a valid
    /// encoding of a request with every field unset) may follow a prefix that used up
    /// the last frame.
    pub fn take(&mut self, n: usize) -> Bytes {
        if n > 0 && self.in_one_frame(n) {
            self.len -= n;
            let out = self.frames.front_mut().expect("a frame").split_to(n);
            self.tidy();
            return out;
        }
        crate::xds::wire::joined(self.take_pieces(n).iter())
    }

    /// After a take: no empty frame first, and no small leftover pinning a frame.
    fn tidy(&mut self) {
        match self.frames.front() {
            Some(first) if first.is_empty() => {
                self.frames.pop_front();
            }
            // The start of the next message, a small slice of a kept frame: copied, so
            // that it does not pin the frame's buffer while the rest is awaited.
            Some(first) if self.frames.len() == 1 && first.len() < KEEP_FRAME_MIN => {
                self.frames[0] = Bytes::copy_from_slice(first);
            }
            _ => {}
        }
        if self.frames.is_empty() {
            // Between messages a stream keeps no allocation at all.
            self.frames = Default::default();
        }
    }

    /// What the kept frames pin: the capacity of the frame list and the frames' bytes.
    #[cfg(test)]
    fn capacity(&self) -> usize {
        self.frames.capacity() * std::mem::size_of::<Bytes>()
            + self.frames.iter().map(Bytes::len).sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;
    use crate::xds::{Resource, TypeUrl};
    use tokio::sync::mpsc;

    fn any(len: usize, fill: u8) -> Resource {
        Arc::new(EncodedResource {
            name: format!("outbound|{len}||a{fill}.ns.svc.cluster.local").into(),
            body: SharedAny {
                type_url: TypeUrl::Cluster.as_str(),
                value: Bytes::from(vec![fill; len]),
            },
            version: format!("v{fill}").into(),
            placeholder: false,
        })
    }

    fn framed<M: Message>(message: &M) -> Vec<u8> {
        let body = message.encode_to_vec();
        let mut out = vec![0];
        out.extend_from_slice(&(body.len() as u32).to_be_bytes());
        out.extend_from_slice(&body);
        out
    }

    fn concat(chunks: &[Bytes]) -> Vec<u8> {
        chunks.iter().flat_map(|c| c.iter().copied()).collect()
    }

    #[test]
    fn sotw_chunks_are_the_prost_encoding() {
        // Sizes around the splice threshold, small ones enough to span several chunks.
        let mut resources: Vec<Resource> = (0..200).map(|i| any(300 + i, i as u8)).collect();
        resources.push(any(SPLICE_MIN - 1, 1));
        resources.push(any(SPLICE_MIN, 2));
        resources.push(any(200_000, 3));
        resources.push(any(0, 0));
        let response = SotwResponse {
            version_info: "2026-11-22T00:00:00Z/7".into(),
            resources: resources.into(),
            type_url: TypeUrl::Cluster.as_str().into(),
            nonce: "n-1".into(),
            control_plane: Bytes::from_static(b"\n\x07meshfed"),
        };
        let encoded = FrameCursor::collect(response.clone());
        assert_eq!(concat(&encoded), framed(&response));
        // Copied chunks stay bounded; the big body is the snapshot's own allocation.
        assert!(
            encoded
                .iter()
                .all(|c| c.len() <= CHUNK_MAX || c.len() == 200_000)
        );
        let big = &response.resources[202].body.value;
        assert!(
            encoded.iter().any(|c| c.as_ptr() == big.as_ptr()),
            "large body was copied"
        );
    }

    #[test]
    fn copied_bytes_between_spliced_bodies_share_one_allocation() {
        // Small framing, a spliced body, small framing, ...: the framing pieces are
        // consecutive slices of one buffer, not one allocation each.
        let response = SotwResponse {
            nonce: "n".into(),
            resources: (0..8).map(|i| any(SPLICE_MIN + 10, i as u8)).collect(),
            ..Default::default()
        };
        let chunks = FrameCursor::collect(response.clone());
        assert_eq!(concat(&chunks), framed(&response));
        let copied: Vec<&Bytes> = chunks.iter().filter(|c| c.len() < SPLICE_MIN).collect();
        assert!(copied.len() >= 8, "{} copied chunks", copied.len());
        for pair in copied.windows(2) {
            assert_eq!(
                pair[0].as_ptr().wrapping_add(pair[0].len()),
                pair[1].as_ptr(),
                "the next copied bytes continue the same buffer"
            );
        }
    }

    #[test]
    fn framing_between_spliced_bodies_takes_small_buffers() {
        // 200 spliced bodies: ~60 bytes of framing each, 12 KB in all, framed into
        // buffers of about 1-2 KiB, not one of 32 KiB.
        let response = SotwResponse {
            nonce: "n".into(),
            resources: (0..200).map(|i| any(SPLICE_MIN + 10, i as u8)).collect(),
            ..Default::default()
        };
        let chunks = FrameCursor::collect(response.clone());
        assert_eq!(concat(&chunks), framed(&response));
        let copied: Vec<&Bytes> = chunks.iter().filter(|c| c.len() < SPLICE_MIN).collect();
        let buffers = 1 + copied
            .windows(2)
            .filter(|p| p[0].as_ptr().wrapping_add(p[0].len()) != p[1].as_ptr())
            .count();
        let copied_len: usize = copied.iter().map(|c| c.len()).sum();
        assert!(
            buffers >= copied_len / 2048,
            "{copied_len} bytes of framing in {buffers} buffers"
        );
        // A message of small copied resources keeps large buffers.
        assert_eq!(chunk_size(600 * 1100, 600), CHUNK_MAX);
        assert_eq!(chunk_size(600 * 700, 600), 22_400);
        assert_eq!(chunk_size(200 * 60, 200), 1920);
        assert_eq!(chunk_size(5, 0), CHUNK_MAX);
    }

    fn chunks_with(message: impl FrameEncode, memo: &Arc<SegmentMemo>) -> Vec<Bytes> {
        let mut cursor = FrameCursor::with_segments(message, Some(memo.clone()));
        let mut all = Vec::new();
        while let Some(chunks) = cursor.next_chunks() {
            all.extend(chunks.map(|c| c.bytes));
        }
        all
    }

    #[test]
    fn runs_framed_for_an_earlier_response_go_out_as_one_chunk_each() {
        let memo = Arc::new(SegmentMemo::default());
        // 2,000 clusters around the splice threshold: framed alone, one chunk or two
        // per resource.
        let clusters: Vec<Resource> = (0..2000).map(|i| any(900 + i % 300, i as u8)).collect();
        let response = SotwResponse {
            version_info: "v".into(),
            resources: clusters.clone().into(),
            nonce: "n".into(),
            ..Default::default()
        };
        let first = chunks_with(response.clone(), &memo);
        assert_eq!(concat(&first), framed(&response));
        assert!(first.len() > 2000, "{} chunks the first time", first.len());
        let second = chunks_with(response.clone(), &memo);
        assert_eq!(concat(&second), framed(&response));
        assert!(
            second.len() < 200,
            "{} chunks the second time",
            second.len()
        );
        let third = chunks_with(response.clone(), &memo);
        let shared = third
            .iter()
            .filter(|c| {
                second
                    .iter()
                    .any(|s| s.as_ptr() == c.as_ptr() && c.len() > 10_000)
            })
            .count();
        assert!(
            shared * 2 > third.len(),
            "{shared} of {} chunks shared",
            third.len()
        );

        // Another proxy's list: its own resource among the shared ones. Only the
        // segments around it are framed anew: 33-170 chunks in most runs, but when it
        // lands in a run cut by `SEGMENT_MAX` (no boundary by address), the cuts after
        // it shift until the next boundary by address, so the count depends on where
        // the allocator put the resources (up to 413 seen). Framing all of it again
        // would take as many chunks as the first time (over 2,000).
        let mut own = clusters.clone();
        own.insert(1000, any(950, 1));
        let other = SotwResponse {
            resources: own.into(),
            ..response.clone()
        };
        let theirs = chunks_with(other.clone(), &memo);
        assert_eq!(concat(&theirs), framed(&other));
        assert!(
            theirs.len() * 3 < first.len(),
            "{} chunks of {}",
            theirs.len(),
            first.len()
        );

        // Delta frames the same resources differently: its own segments.
        let delta = DeltaResponse {
            resources: clusters,
            nonce: "d".into(),
            ..Default::default()
        };
        for _ in 0..3 {
            assert_eq!(concat(&chunks_with(delta.clone(), &memo)), framed(&delta));
        }
        assert!(chunks_with(delta, &memo).len() < 200);
    }

    #[test]
    fn empty_and_delta_messages_match_prost() {
        let empty = SotwResponse::default();
        assert_eq!(concat(&FrameCursor::collect(empty.clone())), framed(&empty));
        let delta = DeltaResponse {
            system_version_info: "v".into(),
            resources: vec![any(5000, 9), any(0, 0), any(SPLICE_MIN, 3)],
            type_url: TypeUrl::Endpoint.as_str().into(),
            nonce: "n".into(),
            removed_resources: vec!["gone".into(), String::new()],
            control_plane: Bytes::from_static(b"\n\x07meshfed"),
        };
        assert_eq!(concat(&FrameCursor::collect(delta.clone())), framed(&delta));
    }

    #[tokio::test]
    async fn requests_are_read_across_frames_and_nothing_is_kept_between() {
        use crate::xds::wire::SotwRequest;
        use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
        let one = SotwRequest::from(DiscoveryRequest {
            type_url: TypeUrl::Endpoint.as_str().into(),
            resource_names: (0..2000)
                .map(|i| format!("outbound|80||svc-{i}.ns.svc.cluster.local"))
                .collect(),
            ..Default::default()
        });
        let two = SotwRequest {
            response_nonce: "n".into(),
            ..Default::default()
        };
        let mut wire = framed(&one);
        wire.extend(framed(&two));
        // Split where HTTP/2 might: mid-prefix, mid-message, two messages in one frame.
        let cuts = [3, 16_384, 40_000, wire.len() - 20];
        let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, Status>>(8);
        let mut last = 0;
        for cut in cuts.into_iter().chain([wire.len()]) {
            tx.send(Ok(Frame::data(Bytes::copy_from_slice(&wire[last..cut]))))
                .await
                .unwrap();
            last = cut;
        }
        drop(tx);
        let body = http_body_util::StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx));
        let mut requests = RequestStream::<SotwRequest>::new(tonic::body::Body::new(body), None);
        assert_eq!(requests.message().await.unwrap(), Some(Box::new(one)));
        // What is kept is the start of the next message, copied out of the frame.
        assert_eq!(requests.buf.frames.len(), 1);
        assert!(requests.buf.len() < KEEP_FRAME_MIN);
        assert_eq!(requests.message().await.unwrap(), Some(Box::new(two)));
        assert_eq!(requests.buf.capacity(), 0);
        assert_eq!(requests.message().await.unwrap(), None);
    }

    #[test]
    fn arrived_bytes_are_sliced_from_a_frame_or_copied_once() {
        let big = Bytes::from((0..20_000u32).map(|i| i as u8).collect::<Vec<_>>());
        let mut arrived = Arrived::default();
        arrived.push(big.clone());
        // Within one kept frame: a slice of it, no copy.
        let head = arrived.take(10_000);
        assert_eq!(head.as_ptr(), big.as_ptr());
        // Spanning frames: one buffer of exactly the bytes asked for.
        arrived.push(Bytes::from(vec![7u8; 5_000]));
        let across = arrived.take(12_000);
        assert_eq!(&across[..10_000], &big[10_000..]);
        assert_eq!(&across[10_000..], &[7u8; 2_000][..]);
        // The small rest no longer points into the frame it came from.
        assert_eq!(arrived.len(), 3_000);
        let rest = arrived.take(3_000);
        assert_eq!(&rest[..], &[7u8; 3_000][..]);
        assert_eq!(arrived.capacity(), 0, "nothing kept between messages");
        // A tiny frame is copied, so it does not pin the buffer it came in.
        let tiny = big.slice(0..10);
        arrived.push(tiny.clone());
        assert_ne!(arrived.frames[0].as_ptr(), tiny.as_ptr());
        assert_eq!(arrived.prefix(), Some([0, 1, 2, 3, 4]));
    }

    #[test]
    fn arrived_pieces_are_slices_of_the_frames() {
        let a = Bytes::from(vec![1u8; 16_384]);
        let b = Bytes::from(vec![2u8; 16_384]);
        let c = Bytes::from(vec![3u8; 16_384]);
        let mut arrived = Arrived::default();
        for frame in [&a, &b, &c] {
            arrived.push(frame.clone());
        }
        // Within one frame: that slice alone.
        let head = arrived.take_pieces(100);
        assert_eq!((head.len(), head[0].as_ptr()), (1, a.as_ptr()));
        // Across three frames: a slice of each, in order, nothing copied.
        let body = arrived.take_pieces(16_284 + 16_384 + 10_000);
        let spans: Vec<(usize, usize)> = body
            .iter()
            .map(|p| (p.as_ptr() as usize, p.len()))
            .collect();
        assert_eq!(
            spans,
            [
                (a.as_ptr() as usize + 100, 16_284),
                (b.as_ptr() as usize, 16_384),
                (c.as_ptr() as usize, 10_000)
            ]
        );
        assert_eq!(arrived.len(), 6_384);
        assert_eq!(arrived.take_pieces(6_384).concat(), vec![3u8; 6_384]);
        assert_eq!(arrived.capacity(), 0, "nothing kept between messages");
        assert!(arrived.take_pieces(0).iter().all(Bytes::is_empty));
    }

    #[tokio::test]
    async fn an_empty_message_ending_its_frame_is_a_default_request() {
        // The fuzzer's input: a 5-byte prefix claiming 0 bytes, alone in its frame.
        for step in [1, 5, 255] {
            let wire = [0u8, 0, 0, 0, 0, 0, 0, 0, 0, 0];
            let chunks: Vec<Result<Frame<Bytes>, Status>> = wire
                .chunks(step)
                .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
                .collect();
            let body = http_body_util::StreamBody::new(futures::stream::iter(chunks));
            let control = Arc::new(ConnControl::new(64 * 1024));
            let mut requests = RequestStream::<crate::xds::wire::SotwRequest>::new(
                tonic::body::Body::new(body),
                Some(control.clone()),
            );
            for _ in 0..2 {
                assert_eq!(requests.message().await.unwrap(), Some(Box::default()));
            }
            assert_eq!(requests.message().await.unwrap(), None);
            assert_eq!(control.held(), 0);
        }
    }

    #[tokio::test]
    async fn truncated_compressed_oversized_and_malformed_requests_are_protocol_errors() {
        async fn first_error(bytes: Vec<u8>) -> (&'static str, Code) {
            let body = http_body_util::Full::new(Bytes::from(bytes));
            let mut requests = RequestStream::<crate::xds::wire::SotwRequest>::new(
                tonic::body::Body::new(body),
                None,
            );
            match requests.message().await.unwrap_err() {
                RequestError::Protocol { reason, status } => (reason, status.code()),
                RequestError::Transport(status) => panic!("transport error {status:?}"),
            }
        }
        let mut truncated = framed(&crate::xds::wire::SotwRequest {
            version_info: "v1".into(),
            ..Default::default()
        });
        truncated.pop();
        assert_eq!(
            first_error(truncated).await,
            ("truncated", Code::InvalidArgument)
        );
        assert_eq!(
            first_error(vec![1, 0, 0, 0, 0]).await,
            ("compressed", Code::Unimplemented)
        );
        assert_eq!(
            first_error(vec![0, 0xff, 0, 0, 0]).await,
            ("oversize", Code::ResourceExhausted)
        );
        // Field 1 (version_info) as a string of 3 bytes, with one byte given.
        assert_eq!(
            first_error(vec![0, 0, 0, 0, 3, 0x0a, 3, b'x']).await,
            ("malformed", Code::InvalidArgument)
        );
        // A node id that is not UTF-8: field 2 (node) holding field 1 (id).
        let bad_id = vec![0x12, 4, 0x0a, 2, 0xff, 0xfe];
        let mut wire = vec![0, 0, 0, 0, bad_id.len() as u8];
        wire.extend(bad_id);
        assert_eq!(
            first_error(wire).await,
            ("malformed", Code::InvalidArgument)
        );
    }

    #[tokio::test]
    async fn a_claimed_length_reserves_nothing_and_the_connection_budget_holds() {
        // A prefix claiming 4 MiB followed by 10 bytes: the buffer holds what arrived.
        let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, Status>>(4);
        let mut head = vec![0u8];
        head.extend_from_slice(&(MAX_REQUEST as u32).to_be_bytes());
        head.extend_from_slice(&[0x0a; 10]);
        tx.send(Ok(Frame::data(Bytes::from(head)))).await.unwrap();
        let control = Arc::new(ConnControl::new(64));
        let body = http_body_util::StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx));
        let mut requests = RequestStream::<crate::xds::wire::SotwRequest>::new(
            tonic::body::Body::new(body),
            Some(control.clone()),
        );
        let first = futures::FutureExt::now_or_never(requests.message());
        assert!(first.is_none(), "the message is not complete");
        assert!(
            requests.buf.capacity() < 1024,
            "reserved {}",
            requests.buf.capacity()
        );
        assert_eq!(control.held(), 15);
        // More than the connection's budget: refused, naming the flag.
        tx.send(Ok(Frame::data(Bytes::from(vec![0u8; 60]))))
            .await
            .unwrap();
        match requests.message().await.unwrap_err() {
            RequestError::Protocol { reason, status } => {
                assert_eq!(reason, "buffer_limit");
                assert_eq!(status.code(), Code::ResourceExhausted);
                assert!(status.message().contains("--maxConnectionRequestBytes"));
            }
            other => panic!("{other:?}"),
        }
        drop(requests);
        assert_eq!(control.held(), 0, "a finished stream gives its bytes back");
    }

    /// The body of a stream whose task queued `response` and ended.
    fn queued_body(
        response: SotwResponse,
        control: &Arc<ConnControl>,
    ) -> ResponseBody<SotwResponse> {
        let (tx, rx) = outbox::channel(1);
        tx.try_reserve()
            .unwrap()
            .send(Outbound::Message(Box::new(response)));
        ResponseBody::new(rx, Some(control.clone()))
    }

    #[test]
    fn a_body_frames_no_further_than_http2_frees() {
        use super::super::transport::SEND_BUDGET;
        let control = Arc::new(ConnControl::new(64 * 1024));
        // 2,400 small resources: ~1.5 MB of copied chunks, several budgets.
        let response = SotwResponse {
            nonce: "n".into(),
            resources: (0..2400).map(|i| any(600, i as u8)).collect(),
            ..Default::default()
        };
        let expected = framed(&response);
        let mut body = queued_body(response, &control);
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        let mut got: Vec<u8> = Vec::new();
        // The chunks HTTP/2 still holds.
        let mut queued: Vec<Bytes> = Vec::new();
        let mut stalls = 0;
        loop {
            match http_body::Body::poll_frame(Pin::new(&mut body), &mut cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        let data: Bytes = data;
                        got.extend_from_slice(&data);
                        queued.push(data);
                        assert_eq!(
                            control.in_flight(),
                            queued.iter().map(Bytes::len).sum::<usize>(),
                            "every chunk HTTP/2 holds is counted, exactly"
                        );
                        // Never more than a budget and a chunk held.
                        assert!(control.in_flight() <= SEND_BUDGET + CHUNK_MAX);
                    }
                    Err(frame) => {
                        assert_eq!(frame.trailers_ref().unwrap()["grpc-status"], "0");
                        break;
                    }
                },
                Poll::Pending => {
                    assert!(
                        control.in_flight() >= SEND_BUDGET,
                        "waits only on a full budget"
                    );
                    stalls += 1;
                    // HTTP/2 writes the older half of what it holds and frees it;
                    // a clone of a chunk (HTTP/2 splitting a frame) keeps it counted.
                    let keep = queued.split_off(queued.len() / 2);
                    let clones: Vec<Bytes> = queued.to_vec();
                    drop(std::mem::replace(&mut queued, keep));
                    assert!(control.in_flight() >= SEND_BUDGET, "clones still held");
                    drop(clones);
                }
                other => panic!("{other:?}"),
            }
        }
        assert!(
            stalls >= 2,
            "the message is larger than two budgets: {stalls}"
        );
        assert_eq!(got, expected);
        drop(queued);
        assert_eq!(control.in_flight(), 0, "every freed chunk is uncounted");
    }

    #[test]
    fn spliced_bodies_do_not_count_against_the_send_budget() {
        let control = Arc::new(ConnControl::new(64 * 1024));
        // Ten 200 KB bodies (spliced): 2 MB, thirty budgets, and a few hundred copied
        // bytes of framing between them.
        let response = SotwResponse {
            nonce: "n".into(),
            resources: (0..10).map(|i| any(200_000, i as u8)).collect(),
            ..Default::default()
        };
        let expected = framed(&response);
        let mut body = queued_body(response, &control);
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        let mut held: Vec<Bytes> = Vec::new();
        loop {
            match http_body::Body::poll_frame(Pin::new(&mut body), &mut cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => held.push(data),
                    Err(_) => break,
                },
                other => panic!("a spliced body never waits for the budget: {other:?}"),
            }
        }
        let got: Vec<u8> = held.iter().flat_map(|b| b.iter().copied()).collect();
        assert_eq!(got, expected);
        let copied = got.len() - 10 * 200_000;
        assert!(copied > 0 && copied < 4096, "framing only: {copied}");
        assert_eq!(control.in_flight(), copied, "only copied bytes are counted");
        drop(held);
        assert_eq!(control.in_flight(), 0);
    }

    #[test]
    fn a_closed_connection_stops_pacing() {
        let control = Arc::new(ConnControl::new(64));
        let stream = Arc::new(AtomicUsize::new(0));
        let held = control.track(
            &stream,
            Bytes::from(vec![0u8; super::super::transport::SEND_BUDGET]),
        );
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(control.poll_send_room(&stream, &mut cx).is_pending());
        control.close();
        assert!(control.poll_send_room(&stream, &mut cx).is_ready());
        drop(held);
        assert_eq!(control.in_flight(), 0);
    }

    #[test]
    fn a_freed_chunk_wakes_the_waiting_body() {
        use std::sync::atomic::Ordering;
        let control = Arc::new(ConnControl::new(64));
        let budget = super::super::transport::SEND_BUDGET;
        let (stalled, waiting) = (Arc::default(), Arc::new(AtomicUsize::new(0)));
        // One stream holds the whole budget, another a chunk: the second waits.
        let stalled_chunk = control.track(&stalled, Bytes::from(vec![0u8; budget]));
        let own_chunk = control.track(&waiting, Bytes::from(vec![0u8; 100]));
        let (waker, woken) = futures_test_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(control.poll_send_room(&waiting, &mut cx).is_pending());
        assert_eq!(woken.load(Ordering::Acquire), 0);
        // Once its own chunk is out, it may go on, however full the connection:
        // a stream whose peer stopped reading does not stall the others.
        drop(own_chunk);
        assert_eq!(woken.load(Ordering::Acquire), 1);
        assert!(control.poll_send_room(&waiting, &mut cx).is_ready());
        let own_chunk = control.track(&waiting, Bytes::from(vec![0u8; 100]));
        assert!(control.poll_send_room(&waiting, &mut cx).is_pending());
        // The connection's budget freed: woken, and room.
        drop(stalled_chunk);
        assert_eq!(woken.load(Ordering::Acquire), 2);
        assert!(control.poll_send_room(&waiting, &mut cx).is_ready());
        assert!(control.poll_send_room(&stalled, &mut cx).is_ready());
        drop(own_chunk);
        assert_eq!(control.in_flight(), 0);
        assert_eq!(waiting.load(Ordering::Acquire), 0);
    }

    /// A waker counting its wakes.
    fn futures_test_waker() -> (std::task::Waker, Arc<std::sync::atomic::AtomicUsize>) {
        struct Count(Arc<std::sync::atomic::AtomicUsize>);
        impl futures::task::ArcWake for Count {
            fn wake_by_ref(arc_self: &Arc<Self>) {
                arc_self.0.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            }
        }
        let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        (futures::task::waker(Arc::new(Count(count.clone()))), count)
    }

    #[tokio::test]
    async fn body_yields_chunks_then_trailers() {
        let (tx, rx) = outbox::channel(2);
        let response = SotwResponse {
            nonce: "n".into(),
            resources: vec![any(4096, 7)].into(),
            ..Default::default()
        };
        tx.send(Outbound::Message(Box::new(response.clone())))
            .await
            .unwrap();
        tx.send(Outbound::Close(Status::unavailable("bye")))
            .await
            .unwrap();
        let collected = ResponseBody::new(rx, None).collect().await.unwrap();
        let trailers = collected.trailers().cloned().unwrap();
        assert_eq!(trailers["grpc-status"], "14");
        assert_eq!(trailers["grpc-message"], "bye");
        assert_eq!(collected.to_bytes().as_ref(), framed(&response).as_slice());

        let (tx, rx) = outbox::channel(1);
        drop(tx);
        let collected = ResponseBody::<SotwResponse>::new(rx, None)
            .collect()
            .await
            .unwrap();
        assert_eq!(collected.trailers().unwrap()["grpc-status"], "0");
    }
}
