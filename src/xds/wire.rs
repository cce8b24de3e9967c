//! Response messages with shared resource bytes.
//!
//! envoy-types' `DiscoveryResponse` holds each resource as an `Any` with an owned
//! `Vec<u8>`, so sending one encoded cluster to 2,000 proxies would copy it 2,000 times
//! before encoding. These types are wire-identical (same field numbers) but hold the
//! encoded resource as [`Bytes`], so every connection shares the bytes the snapshot's
//! resource cache produced once. A SotW request is read by [`SotwRequest`], which keeps
//! the resource names as the bytes they arrived in; Delta requests use envoy-types'.

use std::borrow::Cow;
use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes};
use prost::encoding::{self, DecodeContext, WireType};
use prost::{DecodeError, Message};

/// A `google.protobuf.Any` whose value is shared, reference-counted bytes.
#[derive(Clone, PartialEq, Default, Debug)]
pub struct SharedAny {
    /// `type.googleapis.com/...`.
    pub type_url: &'static str,
    /// The encoded message.
    pub value: Bytes,
}

impl Message for SharedAny {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        put_string(1, self.type_url, buf);
        if !self.value.is_empty() {
            encoding::bytes::encode(2, &self.value, buf);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        // Only ever decoded in tests; the type URL is not kept (it is static here).
        match tag {
            2 => encoding::bytes::merge(wire_type, &mut self.value, buf, ctx),
            _ => encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        let url = string_len(1, self.type_url);
        let value = if self.value.is_empty() {
            0
        } else {
            encoding::bytes::encoded_len(2, &self.value)
        };
        url + value
    }

    fn clear(&mut self) {
        self.value.clear();
    }
}

/// `envoy.service.discovery.v3.DiscoveryRequest` as the server reads it: the resource
/// names stay as the bytes they arrived in ([`ResourceNames`]), so the common ACK that
/// repeats a thousand names costs no allocation per name, no UTF-8 check and no
/// reference count per name; names are only turned into strings when they changed.
#[derive(Clone, PartialEq, Default, Debug)]
pub struct SotwRequest {
    pub version_info: String,
    pub node: Option<envoy_types::pb::envoy::config::core::v3::Node>,
    pub resource_names: ResourceNames,
    pub type_url: String,
    pub response_nonce: String,
    pub error_detail: Option<envoy_types::pb::google::rpc::Status>,
}

/// `resource_names` (field 3) of a request, as its encoded entries: key, length and
/// name, one after the other. Senders write the repeated field in one run, so decoding
/// from [`Bytes`] keeps a slice of the received message, and decoding a message that
/// spanned HTTP/2 frames keeps a slice of each frame the run covers (an EDS ACK of a
/// large mesh is ~45 KB, three 16 KB frames, on every endpoint change: copying it
/// whole was 5 % of the server's CPU there). Entries interleaved with other fields
/// (legal, unusual) are copied into a run of their own.
#[derive(Clone, Default, Debug)]
pub struct ResourceNames {
    /// The entries' bytes, or the first piece of them when they span frames.
    encoded: Bytes,
    /// The pieces that follow `encoded`, in order (none unless they span frames).
    more: Vec<Bytes>,
    count: usize,
    /// [`ResourceNames::digest`], when known: a recalled list carries it (see
    /// [`recall`]).
    known_digest: Option<u64>,
}

impl PartialEq for ResourceNames {
    fn eq(&self, other: &ResourceNames) -> bool {
        self.same_as(other)
    }
}

/// Key of field 3, length-delimited.
const NAME_KEY: u8 = (3 << 3) | WireType::LengthDelimited as u8;

impl ResourceNames {
    /// How many names.
    pub fn len(&self) -> usize {
        self.count
    }

    /// No names (a wildcard request, or an unsubscribe of everything).
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The names, in request order, as bytes (not checked to be UTF-8): slices of the
    /// request when its names arrived in one piece, copies otherwise.
    pub fn iter(&self) -> impl Iterator<Item = Cow<'_, [u8]>> + '_ {
        let names: Vec<Cow<'_, [u8]>> = if self.more.is_empty() {
            entries(&self.encoded).map(Cow::Borrowed).collect()
        } else {
            let whole = self.contiguous();
            entries(&whole).map(|n| Cow::Owned(n.to_vec())).collect()
        };
        names.into_iter()
    }

    /// The pieces of the encoded entries, in order.
    fn pieces(&self) -> impl Iterator<Item = &Bytes> + Clone + '_ {
        std::iter::once(&self.encoded).chain(&self.more)
    }

    /// The encoded entries' length in bytes.
    fn byte_len(&self) -> usize {
        self.pieces().map(Bytes::len).sum()
    }

    /// The encoded entries in one buffer.
    fn contiguous(&self) -> Bytes {
        joined(self.pieces())
    }

    /// A digest of the names in order, for telling an unchanged list apart without
    /// looking at the names one by one (see [`digest`]); the same however the bytes
    /// were split.
    pub fn digest(&self) -> u64 {
        if let Some(digest) = self.known_digest {
            return digest;
        }
        let mut d = Digest::default();
        for piece in self.pieces() {
            d.update(piece);
        }
        d.finish()
    }

    /// The same names in the same order as `other`: one comparison of the encoded
    /// entries, no name decoded.
    pub fn same_as(&self, other: &ResourceNames) -> bool {
        let one_buffer = self.more.is_empty()
            && other.more.is_empty()
            && self.encoded.as_ptr() == other.encoded.as_ptr()
            && self.encoded.len() == other.encoded.len();
        self.count == other.count
            && self.byte_len() == other.byte_len()
            && (one_buffer || same_bytes(self.pieces(), other.pieces()))
    }

    /// The same names in one buffer of their own, with their digest: what
    /// [`recall`] keeps (a copy, so that no request's frames stay pinned).
    pub fn kept(&self) -> ResourceNames {
        let encoded = if self.more.is_empty() {
            Bytes::copy_from_slice(&self.encoded)
        } else {
            self.contiguous()
        };
        ResourceNames {
            encoded,
            more: Vec::new(),
            count: self.count,
            known_digest: Some(self.digest()),
        }
    }

    /// Whether `rest`, the remaining bytes of a message in order, starts with exactly
    /// these entries and no further entry follows them: decoding `rest` would then
    /// give a run of names equal to these.
    fn begins<'a>(&self, rest: impl Iterator<Item = &'a [u8]>) -> bool {
        let prefix = self.pieces().map(|p| &p[..]);
        after_prefix(rest, prefix).is_some_and(|after| after != Some(NAME_KEY))
    }
}

/// The name lists that set subscriptions recently (published by the connections'
/// cache of them). Every sidecar of a shape repeats the same thousands of EDS names
/// in each ACK; a run of names that begins with one of these, byte for byte, is
/// decoded as it (its bytes, count and digest shared), without walking or hashing the
/// request's own copy, which arrived cold in its frames. Per thread in unit tests, so
/// that a test sees only the lists it recalled.
#[cfg(not(test))]
static RECALLED: std::sync::LazyLock<arc_swap::ArcSwap<Vec<ResourceNames>>> =
    std::sync::LazyLock::new(arc_swap::ArcSwap::default);
#[cfg(test)]
thread_local! {
    static RECALLED: std::cell::RefCell<Arc<Vec<ResourceNames>>> = std::cell::RefCell::default();
}

/// Publishes the lists requests are first compared with (see [`RECALLED`]); each is
/// stored as [`ResourceNames::kept`] gives it.
pub fn recall(lists: Vec<ResourceNames>) {
    #[cfg(not(test))]
    RECALLED.store(Arc::new(lists));
    #[cfg(test)]
    RECALLED.with(|r| *r.borrow_mut() = Arc::new(lists));
}

/// The recalled list that `rest` begins with, if any (see [`ResourceNames::begins`]).
fn recalled<'a>(rest: impl Iterator<Item = &'a [u8]> + Clone) -> Option<ResourceNames> {
    #[cfg(not(test))]
    let lists = RECALLED.load();
    #[cfg(test)]
    let lists = RECALLED.with(|r| r.borrow().clone());
    lists
        .iter()
        .find(|list| !list.is_empty() && list.begins(rest.clone()))
        .cloned()
}

/// `pieces` in one buffer: the piece itself when there is one, else one copy.
pub fn joined<'a>(pieces: impl Iterator<Item = &'a Bytes> + Clone) -> Bytes {
    let mut rest = pieces.clone();
    match (rest.next(), rest.next()) {
        (None, _) => Bytes::new(),
        (Some(one), None) => one.clone(),
        _ => {
            let mut whole = Vec::with_capacity(pieces.clone().map(Bytes::len).sum());
            for piece in pieces {
                whole.extend_from_slice(piece);
            }
            whole.into()
        }
    }
}

/// The entries of a run of encoded names, each name's bytes.
fn entries(mut rest: &[u8]) -> impl Iterator<Item = &[u8]> {
    std::iter::from_fn(move || {
        // Only well-formed entries are ever stored (see `decode`).
        let (&key, after_key) = rest.split_first()?;
        debug_assert_eq!(key, NAME_KEY);
        let mut cursor = after_key;
        let len = encoding::decode_varint(&mut cursor).ok()? as usize;
        let (name, after) = cursor.split_at(len);
        rest = after;
        Some(name)
    })
}

/// Whether two sequences of pieces hold the same bytes, wherever each is split (the
/// caller has checked that the totals are equal).
fn same_bytes<'a>(a: impl Iterator<Item = &'a Bytes>, b: impl Iterator<Item = &'a Bytes>) -> bool {
    after_prefix(a.map(|p| &p[..]), b.map(|p| &p[..])).is_some()
}

/// Whether `bytes` begin with `prefix`, both in pieces split anywhere: `None` if not,
/// else the byte that follows the prefix (`None` at the end).
fn after_prefix<'a, 'b>(
    bytes: impl Iterator<Item = &'a [u8]>,
    prefix: impl Iterator<Item = &'b [u8]>,
) -> Option<Option<u8>> {
    let mut bytes = bytes.filter(|piece| !piece.is_empty());
    let mut x: &[u8] = &[];
    for mut y in prefix {
        while !y.is_empty() {
            if x.is_empty() {
                x = bytes.next()?;
            }
            let n = x.len().min(y.len());
            if x[..n] != y[..n] {
                return None;
            }
            (x, y) = (&x[n..], &y[n..]);
        }
    }
    Some(
        x.first()
            .or_else(|| bytes.next().and_then(|p| p.first()))
            .copied(),
    )
}

/// A digest of bytes, computed a word at a time: every EDS ACK of a large mesh carries
/// ~50 KB of names, and SipHash over them was the largest single cost of an endpoint
/// change. Each step (rotate, xor a word, multiply by an odd constant) is a bijection
/// of its lane's state, so two inputs of the same length that differ in a single word
/// never share a digest, and the length is mixed in last. It is not built to resist crafted
/// collisions; a crafted list could only confuse the subscription of the proxy that
/// sent it.
pub fn digest(bytes: &[u8]) -> u64 {
    let mut d = Digest::default();
    d.update(bytes);
    d.finish()
}

/// [`digest`] over bytes that come in pieces: the same value for the same bytes,
/// however they are split (blocks are counted from the first byte, a block cut by a
/// piece's end waits for the next piece).
struct Digest {
    /// Four independent lanes over 32-byte blocks, so the multiplies overlap.
    lanes: [u64; 4],
    /// The start of a block, cut by the end of a piece.
    carry: [u8; 32],
    carried: usize,
    len: u64,
}

impl Default for Digest {
    fn default() -> Digest {
        Digest {
            lanes: [0, 1, 2, 3],
            carry: [0; 32],
            carried: 0,
            len: 0,
        }
    }
}

impl Digest {
    const K: u64 = 0x517c_c1b7_2722_0a95;

    fn step(h: u64, word: u64) -> u64 {
        (h.rotate_left(5) ^ word).wrapping_mul(Self::K)
    }

    fn word(b: &[u8]) -> u64 {
        u64::from_le_bytes(b.try_into().expect("8 bytes"))
    }

    fn block(&mut self, block: &[u8]) {
        for (lane, w) in self.lanes.iter_mut().zip(block.chunks_exact(8)) {
            *lane = Self::step(*lane, Self::word(w));
        }
    }

    fn update(&mut self, mut bytes: &[u8]) {
        self.len += bytes.len() as u64;
        if self.carried > 0 {
            let n = (32 - self.carried).min(bytes.len());
            self.carry[self.carried..self.carried + n].copy_from_slice(&bytes[..n]);
            self.carried += n;
            bytes = &bytes[n..];
            if self.carried < 32 {
                return;
            }
            let block = self.carry;
            self.block(&block);
            self.carried = 0;
        }
        let mut blocks = bytes.chunks_exact(32);
        for block in &mut blocks {
            self.block(block);
        }
        let rest = blocks.remainder();
        self.carry[..rest.len()].copy_from_slice(rest);
        self.carried = rest.len();
    }

    fn finish(self) -> u64 {
        let mut h = self.lanes.into_iter().fold(0, Self::step);
        let mut words = self.carry[..self.carried].chunks_exact(8);
        for w in &mut words {
            h = Self::step(h, Self::word(w));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut last = [0u8; 8];
            last[..rest.len()].copy_from_slice(rest);
            h = Self::step(h, u64::from_le_bytes(last));
        }
        Self::step(h, self.len)
    }
}

/// The length in bytes and the number of the well-formed entries `NAME_KEY`, length,
/// name at the start of `bytes`.
fn name_run(bytes: &[u8]) -> (usize, usize) {
    let (mut at, mut count) = (0, 0);
    while bytes.get(at) == Some(&NAME_KEY) {
        // Names under 128 bytes (all of a mesh's cluster names, nearly) have a
        // one-byte length: read it directly rather than through the varint decoder,
        // the larger part of this loop's cost over an EDS ACK's thousand names.
        if let Some(&len) = bytes.get(at + 1)
            && len < 0x80
        {
            let end = at + 2 + usize::from(len);
            if end > bytes.len() {
                break;
            }
            at = end;
            count += 1;
            continue;
        }
        let mut rest = &bytes[at + 1..];
        let Ok(len) = encoding::decode_varint(&mut rest) else {
            break;
        };
        let Some(end) = usize::try_from(len)
            .ok()
            .filter(|len| *len <= rest.len())
            .map(|len| bytes.len() - rest.len() + len)
        else {
            break;
        };
        at = end;
        count += 1;
    }
    (at, count)
}

impl SotwRequest {
    fn merge_other(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        match tag {
            1 => encoding::string::merge(wire_type, &mut self.version_info, buf, ctx),
            2 => encoding::message::merge(
                wire_type,
                self.node.get_or_insert_with(Default::default),
                buf,
                ctx,
            ),
            4 => encoding::string::merge(wire_type, &mut self.type_url, buf, ctx),
            5 => encoding::string::merge(wire_type, &mut self.response_nonce, buf, ctx),
            6 => encoding::message::merge(
                wire_type,
                self.error_detail.get_or_insert_with(Default::default),
                buf,
                ctx,
            ),
            _ => encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }
}

impl SotwRequest {
    /// Decodes a request that arrived in `pieces` (in order), as [`Message::decode`]
    /// does the same bytes in one: the run of names is kept as slices of the pieces
    /// it covers, and only the other fields (a few hundred bytes) are copied into one
    /// buffer to be decoded. Anything unusual (names in more than one run, a name key
    /// written long, groups, malformed bytes) is decoded from one copy of the whole,
    /// so that results and errors are the same as from the bytes in one piece.
    pub fn decode_pieces(pieces: Vec<Bytes>) -> Result<SotwRequest, DecodeError> {
        let split = if pieces.len() > 1 {
            Self::split_pieces(&pieces)
        } else {
            None
        };
        let Some((others, names)) = split else {
            return SotwRequest::decode(joined(pieces.iter()));
        };
        let mut request = SotwRequest::decode(Bytes::from(others))?;
        request.resource_names = names;
        Ok(request)
    }

    /// The fields other than the names (copied) and the one run of names (a recalled
    /// list, or slices of `pieces`); `None` when the request is not that simple.
    fn split_pieces(pieces: &[Bytes]) -> Option<(Vec<u8>, ResourceNames)> {
        let mut cursor = Pieces::new(pieces);
        let mut others = Vec::new();
        let mut run: Option<(Spot, Spot)> = None;
        let mut count = 0;
        let mut known: Option<ResourceNames> = None;
        while !cursor.at_end() {
            let start = cursor.spot();
            if cursor.peek() == Some(NAME_KEY) {
                if run.is_some() {
                    return None;
                }
                if let Some(list) = recalled(cursor.rest()) {
                    cursor.advance(list.byte_len())?;
                    run = Some((start, cursor.spot()));
                    known = Some(list);
                    continue;
                }
                loop {
                    let (consumed, n) = name_run(cursor.piece_rest());
                    cursor.advance(consumed)?;
                    count += n;
                    if cursor.at_end() || cursor.peek() != Some(NAME_KEY) {
                        break;
                    }
                    if cursor.at_piece_start() && consumed > 0 {
                        // The run went on to the end of the piece: go on in the next.
                        continue;
                    }
                    // An entry cut by the end of a piece.
                    cursor.advance(1)?;
                    let len = cursor.varint()?;
                    cursor.advance(usize::try_from(len).ok()?)?;
                    count += 1;
                }
                run = Some((start, cursor.spot()));
                continue;
            }
            let key = cursor.varint()?;
            let wire_type = WireType::try_from(key & 7).ok()?;
            if key >> 3 == 3 {
                return None;
            }
            match wire_type {
                WireType::Varint => {
                    cursor.varint()?;
                }
                WireType::SixtyFourBit => cursor.advance(8)?,
                WireType::ThirtyTwoBit => cursor.advance(4)?,
                WireType::LengthDelimited => {
                    let len = cursor.varint()?;
                    cursor.advance(usize::try_from(len).ok()?)?;
                }
                WireType::StartGroup | WireType::EndGroup => return None,
            }
            cursor.copy(start, cursor.spot(), &mut others);
        }
        let names = match (known, run) {
            (Some(list), _) => list,
            (None, Some((start, end))) => {
                let mut slices = cursor.slices(start, end).into_iter();
                ResourceNames {
                    encoded: slices.next().unwrap_or_default(),
                    more: slices.collect(),
                    count,
                    known_digest: None,
                }
            }
            (None, None) => ResourceNames::default(),
        };
        Some((others, names))
    }
}

/// A place in a sequence of pieces: piece index and offset in it.
type Spot = (usize, usize);

/// A read position over pieces of bytes, always at a byte when not at the end (never
/// at the end of a piece that has a successor).
struct Pieces<'a> {
    pieces: &'a [Bytes],
    at: Spot,
}

impl<'a> Pieces<'a> {
    fn new(pieces: &'a [Bytes]) -> Pieces<'a> {
        let mut p = Pieces { pieces, at: (0, 0) };
        p.settle();
        p
    }

    fn settle(&mut self) {
        while self.at.0 < self.pieces.len() && self.at.1 == self.pieces[self.at.0].len() {
            self.at = (self.at.0 + 1, 0);
        }
    }

    fn spot(&self) -> Spot {
        self.at
    }

    fn at_end(&self) -> bool {
        self.at.0 == self.pieces.len()
    }

    fn at_piece_start(&self) -> bool {
        self.at.1 == 0
    }

    fn peek(&self) -> Option<u8> {
        self.pieces.get(self.at.0).map(|p| p[self.at.1])
    }

    /// What is left of the current piece.
    fn piece_rest(&self) -> &'a [u8] {
        self.pieces.get(self.at.0).map_or(&[], |p| &p[self.at.1..])
    }

    /// Everything left, in pieces.
    fn rest(&self) -> impl Iterator<Item = &'a [u8]> + Clone + 'a {
        let following = self.pieces.get(self.at.0 + 1..).unwrap_or_default();
        std::iter::once(self.piece_rest()).chain(following.iter().map(|p| &p[..]))
    }

    /// Moves `n` bytes on; `None` if fewer are left.
    fn advance(&mut self, mut n: usize) -> Option<()> {
        while n > 0 {
            let piece = self.pieces.get(self.at.0)?;
            let k = n.min(piece.len() - self.at.1);
            self.at.1 += k;
            n -= k;
            self.settle();
        }
        Some(())
    }

    /// Reads a varint that may be cut by the end of a piece.
    fn varint(&mut self) -> Option<u64> {
        let mut value = 0u64;
        for i in 0..10 {
            let byte = self.peek()?;
            self.advance(1)?;
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte < 0x80 {
                return Some(value);
            }
        }
        None
    }

    /// Appends the bytes from `from` to `to` to `out`.
    fn copy(&self, from: Spot, to: Spot, out: &mut Vec<u8>) {
        for piece in self.slices(from, to) {
            out.extend_from_slice(&piece);
        }
    }

    /// The bytes from `from` to `to`, as slices of the pieces.
    fn slices(&self, from: Spot, to: Spot) -> Vec<Bytes> {
        (from.0..=to.0.min(self.pieces.len().saturating_sub(1)))
            .filter_map(|i| {
                let piece = &self.pieces[i];
                let start = if i == from.0 { from.1 } else { 0 };
                let end = if i == to.0 { to.1 } else { piece.len() };
                (start < end).then(|| piece.slice(start..end))
            })
            .collect()
    }
}

impl Message for SotwRequest {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        if !self.version_info.is_empty() {
            encoding::string::encode(1, &self.version_info, buf);
        }
        if let Some(node) = &self.node {
            encoding::message::encode(2, node, buf);
        }
        for piece in self.resource_names.pieces() {
            buf.put_slice(piece);
        }
        if !self.type_url.is_empty() {
            encoding::string::encode(4, &self.type_url, buf);
        }
        if !self.response_nonce.is_empty() {
            encoding::string::encode(5, &self.response_nonce, buf);
        }
        if let Some(status) = &self.error_detail {
            encoding::message::encode(6, status, buf);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        if tag != 3 {
            return self.merge_other(tag, wire_type, buf, ctx);
        }
        // Field by field (only `Message::merge` comes here; `decode` does not):
        // the name is appended to an owned copy of the entries.
        let mut name = Vec::new();
        encoding::bytes::merge(wire_type, &mut name, buf, ctx)?;
        let mut entries = Vec::from(self.resource_names.contiguous());
        encoding::bytes::encode(3, &name, &mut entries);
        self.resource_names.encoded = entries.into();
        self.resource_names.more = Vec::new();
        self.resource_names.count += 1;
        self.resource_names.known_digest = None;
        Ok(())
    }

    /// Decodes with `resource_names` kept as a slice of `buf` when it is [`Bytes`]
    /// (the entries of a repeated field sent in one run), a copy otherwise.
    fn decode(mut buf: impl Buf) -> Result<Self, DecodeError> {
        let body = buf.copy_to_bytes(buf.remaining());
        let mut request = SotwRequest::default();
        let mut cursor = &body[..];
        // The run of name entries seen so far, as offsets into `body`; `owned` once a
        // second run starts.
        let mut run: Option<(usize, usize)> = None;
        let mut owned: Option<Vec<u8>> = None;
        // The run, when it is a recalled list (see `RECALLED`).
        let mut known: Option<ResourceNames> = None;
        while !cursor.is_empty() {
            let start = body.len() - cursor.len();
            if run.is_none()
                && owned.is_none()
                && cursor[0] == NAME_KEY
                && let Some(list) = recalled(std::iter::once(cursor))
            {
                cursor = &cursor[list.byte_len()..];
                request.resource_names.count = list.count;
                run = Some((start, start + list.byte_len()));
                known = Some(list);
                continue;
            }
            // The common case, a run of short-keyed names, in a tight loop.
            if owned.is_none() && cursor[0] == NAME_KEY && run.is_none_or(|(_, e)| e == start) {
                let (consumed, count) = name_run(cursor);
                if consumed > 0 {
                    cursor = &cursor[consumed..];
                    request.resource_names.count += count;
                    run = Some((run.map_or(start, |(s, _)| s), start + consumed));
                    continue;
                }
            }
            let (tag, wire_type) = encoding::decode_key(&mut cursor)?;
            if tag != 3 {
                request.merge_other(tag, wire_type, &mut cursor, DecodeContext::default())?;
                continue;
            }
            encoding::check_wire_type(WireType::LengthDelimited, wire_type)?;
            let mut at_len = cursor;
            // Checks the length against what is left.
            encoding::skip_field(wire_type, tag, &mut cursor, DecodeContext::default())?;
            let len = encoding::decode_varint(&mut at_len)?;
            let end = body.len() - cursor.len();
            request.resource_names.count += 1;
            let value = &body[end - len as usize..end];
            match (&mut run, &mut owned) {
                (None, None) if body[start] == NAME_KEY => run = Some((start, end)),
                (Some((_, run_end)), None) if *run_end == start && body[start] == NAME_KEY => {
                    *run_end = end
                }
                // A second run, or a key written in more than one byte (stored in its
                // short form, so that every stored entry starts with `NAME_KEY`).
                (_, _) => {
                    let owned = owned.get_or_insert_with(|| {
                        run.map_or_else(Vec::new, |(s, e)| body[s..e].to_vec())
                    });
                    owned.push(NAME_KEY);
                    encoding::encode_varint(len, owned);
                    owned.extend_from_slice(value);
                }
            }
        }
        match (owned, known, run) {
            (Some(owned), _, _) => request.resource_names.encoded = owned.into(),
            (None, Some(list), _) => request.resource_names = list,
            (None, None, Some((start, end))) => {
                request.resource_names.encoded = body.slice(start..end)
            }
            (None, None, None) => {}
        }
        Ok(request)
    }

    fn encoded_len(&self) -> usize {
        string_len(1, &self.version_info)
            + self
                .node
                .as_ref()
                .map_or(0, |n| encoding::message::encoded_len(2, n))
            + self.resource_names.byte_len()
            + string_len(4, &self.type_url)
            + string_len(5, &self.response_nonce)
            + self
                .error_detail
                .as_ref()
                .map_or(0, |s| encoding::message::encoded_len(6, s))
    }

    fn clear(&mut self) {
        *self = SotwRequest::default();
    }
}

impl From<envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest> for SotwRequest {
    fn from(req: envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest) -> Self {
        SotwRequest::decode(Bytes::from(req.encode_to_vec()))
            .expect("an encoded DiscoveryRequest decodes")
    }
}

/// A `string` field, left out when empty (proto3).
pub(super) fn put_string(tag: u32, s: &str, buf: &mut impl BufMut) {
    if !s.is_empty() {
        encoding::encode_key(tag, WireType::LengthDelimited, buf);
        encoding::encode_varint(s.len() as u64, buf);
        buf.put_slice(s.as_bytes());
    }
}

/// The encoded length of a `string` field written by [`put_string`].
pub(super) fn string_len(tag: u32, s: &str) -> usize {
    if s.is_empty() {
        0
    } else {
        encoding::key_len(tag) + encoding::encoded_len_varint(s.len() as u64) + s.len()
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::core::v3::Node;
    use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;

    /// An EDS request with every field Envoy may set, rejection included.
    fn full_request(names: Vec<String>, version: &str, nonce: &str) -> DiscoveryRequest {
        DiscoveryRequest {
            version_info: version.into(),
            node: Some(Node {
                id: "sidecar~10.0.0.1~a.ns~ns.svc.cluster.local".into(),
                ..Default::default()
            }),
            resource_names: names,
            type_url: crate::xds::TypeUrl::Endpoint.as_str().into(),
            response_nonce: nonce.into(),
            error_detail: Some(envoy_types::pb::google::rpc::Status {
                code: 3,
                message: "bad".into(),
                details: vec![],
            }),
            ..Default::default()
        }
    }

    #[test]
    fn reads_envoy_requests_with_names_as_slices() {
        let names = vec!["outbound|80||a.ns.svc.cluster.local".into(), "b".into()];
        let request = full_request(names, "v1", "n1");
        let wire = Bytes::from(request.encode_to_vec());
        let read = SotwRequest::decode(wire.clone()).unwrap();
        assert_eq!(read.version_info, "v1");
        assert_eq!(read.node, request.node);
        assert_eq!(read.type_url, request.type_url);
        assert_eq!(read.response_nonce, "n1");
        assert_eq!(read.error_detail, request.error_detail);
        assert_eq!(read.resource_names.len(), 2);
        let names: Vec<Cow<[u8]>> = read.resource_names.iter().collect();
        assert_eq!(names, [&b"outbound|80||a.ns.svc.cluster.local"[..], b"b"]);
        // Decoding from Bytes shares the received buffer instead of copying names.
        let start = wire.as_ptr() as usize;
        assert!((start..start + wire.len()).contains(&(names[0].as_ptr() as usize)));
        // And it encodes back to what Envoy sent.
        assert_eq!(read.encode_to_vec(), wire);
        assert_eq!(read.encoded_len(), wire.len());
    }

    #[test]
    fn names_split_by_other_fields_or_written_long_read_the_same() {
        let names = |r: &SotwRequest| -> Vec<Vec<u8>> {
            r.resource_names.iter().map(Cow::into_owned).collect()
        };
        let expected = vec![b"a".to_vec(), b"bb".to_vec(), b"c".to_vec()];
        // Names on both sides of the type URL: two runs.
        let mut split = Vec::new();
        encoding::string::encode(3, &"a".to_string(), &mut split);
        encoding::string::encode(4, &"t".to_string(), &mut split);
        encoding::string::encode(3, &"bb".to_string(), &mut split);
        encoding::string::encode(3, &"c".to_string(), &mut split);
        let read = SotwRequest::decode(Bytes::from(split)).unwrap();
        assert_eq!(
            (names(&read), read.type_url.as_str()),
            (expected.clone(), "t")
        );
        // A key written in two bytes (0x9a 0x00 is field 3, length-delimited).
        let long = [
            0x9a, 0x00, 1, b'a', 0x1a, 2, b'b', b'b', 0x9a, 0x00, 1, b'c',
        ];
        let read = SotwRequest::decode(Bytes::copy_from_slice(&long)).unwrap();
        assert_eq!(names(&read), expected);
        assert_eq!(read.resource_names.len(), 3);
        // Same names, same digest, however they were written.
        let plain = SotwRequest::from(DiscoveryRequest {
            resource_names: vec!["a".into(), "bb".into(), "c".into()],
            ..Default::default()
        });
        assert_eq!(plain.resource_names.digest(), read.resource_names.digest());
        // Field by field (`Message::merge`) reads the same names too.
        let mut merged = SotwRequest::default();
        merged.merge(&long[..]).unwrap();
        assert_eq!(names(&merged), expected);
    }

    #[test]
    fn a_single_changed_byte_changes_the_digest() {
        let base: Vec<u8> = (0..=100u8).collect();
        let d = digest(&base);
        for i in 0..base.len() {
            let mut other = base.clone();
            other[i] ^= 0x20;
            assert_ne!(digest(&other), d, "byte {i}");
        }
        assert_ne!(digest(&base[..100]), d);
        assert_ne!(digest(&[0; 8]), digest(&[0; 7]), "the length counts");
    }

    #[test]
    fn names_of_one_and_two_byte_lengths_read_alike() {
        let names: Vec<String> = [1, 127, 128, 300, 5, 127]
            .iter()
            .map(|n| "x".repeat(*n))
            .collect();
        let wire = DiscoveryRequest {
            resource_names: names.clone(),
            type_url: "t".into(),
            ..Default::default()
        }
        .encode_to_vec();
        let read = SotwRequest::decode(Bytes::from(wire)).unwrap();
        let got: Vec<Cow<[u8]>> = read.resource_names.iter().collect();
        let want: Vec<&[u8]> = names.iter().map(|n| n.as_bytes()).collect();
        assert_eq!(got, want);
        assert_eq!(read.resource_names.len(), names.len());
        assert_eq!(read.type_url, "t");
        assert_eq!(name_run(&[NAME_KEY, 2, b'a']), (0, 0), "a name cut short");
    }

    #[test]
    fn malformed_names_are_errors() {
        // A name longer than the message, and a name with the wrong wire type.
        for wire in [&[0x1a, 5, b'a'][..], &[0x18, 1][..]] {
            assert!(SotwRequest::decode(Bytes::copy_from_slice(wire)).is_err());
        }
    }

    #[test]
    fn a_digest_over_pieces_is_the_digest_of_the_whole() {
        let bytes: Vec<u8> = (0..200u32).map(|i| (i * 37 % 251) as u8).collect();
        let whole = digest(&bytes);
        for a in 0..bytes.len() {
            for b in (a..bytes.len()).step_by(7) {
                let mut d = Digest::default();
                for piece in [&bytes[..a], &bytes[a..b], &bytes[b..]] {
                    d.update(piece);
                }
                assert_eq!(d.finish(), whole, "cut at {a} and {b}");
            }
        }
    }

    /// `wire` cut at `cuts` (ascending offsets).
    fn cut(wire: &[u8], cuts: &[usize]) -> Vec<Bytes> {
        let mut at = 0;
        let mut pieces = Vec::new();
        for &c in cuts.iter().chain([&wire.len()]) {
            pieces.push(Bytes::copy_from_slice(&wire[at..c]));
            at = c;
        }
        pieces
    }

    #[test]
    fn a_request_in_pieces_reads_as_the_request_whole() {
        let names: Vec<String> = [3, 40, 127, 128, 300, 1, 45]
            .iter()
            .enumerate()
            .map(|(i, n)| format!("{i}{}", "x".repeat(*n)))
            .collect();
        let request = full_request(
            names.clone(),
            "2026-11-28T17:00:00Z/42",
            "2026-11-28T17:00:00Z/42/7",
        );
        let wire = request.encode_to_vec();
        let whole = SotwRequest::decode(Bytes::from(wire.clone())).unwrap();
        // Every cut in two and, around the names, in three: through keys, lengths
        // and names.
        let mut cutsets: Vec<Vec<usize>> = (1..wire.len()).map(|a| vec![a]).collect();
        for a in (1..wire.len()).step_by(5) {
            for b in (a + 1..wire.len()).step_by(11) {
                cutsets.push(vec![a, b]);
            }
        }
        for cuts in cutsets {
            let pieces = cut(&wire, &cuts);
            let read = SotwRequest::decode_pieces(pieces.clone()).unwrap();
            assert_eq!(read, whole, "cuts {cuts:?}");
            assert_eq!(read.resource_names.len(), names.len(), "cuts {cuts:?}");
            assert_eq!(
                read.resource_names.digest(),
                whole.resource_names.digest(),
                "cuts {cuts:?}"
            );
            let got: Vec<Vec<u8>> = read.resource_names.iter().map(Cow::into_owned).collect();
            let want: Vec<Vec<u8>> = names.iter().map(|n| n.as_bytes().to_vec()).collect();
            assert_eq!(got, want, "cuts {cuts:?}");
            assert_eq!(read.encode_to_vec(), wire, "cuts {cuts:?}");
            assert_eq!(read.encoded_len(), wire.len(), "cuts {cuts:?}");
        }
        // The names stay in the pieces they arrived in: none copied.
        let pieces = cut(&wire, &[wire.len() / 2]);
        let read = SotwRequest::decode_pieces(pieces.clone()).unwrap();
        let kept: Vec<usize> = read
            .resource_names
            .pieces()
            .map(|p| p.as_ptr() as usize)
            .collect();
        assert_eq!(kept.len(), 2);
        for (kept, piece) in kept.iter().zip(&pieces) {
            let start = piece.as_ptr() as usize;
            assert!((start..start + piece.len()).contains(kept));
        }
    }

    #[test]
    fn unusual_requests_in_pieces_read_as_whole() {
        // Names in two runs and a name key written long: read from one copy, as whole.
        let mut split = Vec::new();
        encoding::string::encode(3, &"a".to_string(), &mut split);
        encoding::string::encode(4, &"t".to_string(), &mut split);
        encoding::string::encode(3, &"bb".to_string(), &mut split);
        let long = vec![
            0x9a, 0x00, 1, b'a', 0x1a, 2, b'b', b'b', 0x9a, 0x00, 1, b'c',
        ];
        for wire in [split, long] {
            let whole = SotwRequest::decode(Bytes::from(wire.clone())).unwrap();
            for a in 1..wire.len() {
                let read = SotwRequest::decode_pieces(cut(&wire, &[a])).unwrap();
                assert_eq!(read, whole, "cut at {a}");
                assert_eq!(read.resource_names.len(), whole.resource_names.len());
            }
        }
        // Malformed bytes are errors in pieces as whole: a name longer than the
        // message, a truncated type URL.
        for wire in [&[0x1a, 5, b'a', b'b'][..], &[0x22, 9, b't', b'y'][..]] {
            assert!(SotwRequest::decode(Bytes::copy_from_slice(wire)).is_err());
            for a in 1..wire.len() {
                assert!(SotwRequest::decode_pieces(cut(wire, &[a])).is_err(), "{a}");
            }
        }
    }

    /// An EDS request of `n` names that no other test uses (the recalled lists are
    /// per thread in tests, but the bytes say what they are for).
    fn recall_wire(n: usize) -> (Vec<String>, Vec<u8>) {
        let names: Vec<String> = (0..n)
            .map(|i| format!("outbound|80||recalled{i}.ns.svc.cluster.local"))
            .collect();
        let wire = full_request(names.clone(), "v1", "n1").encode_to_vec();
        (names, wire)
    }

    #[test]
    fn a_run_that_repeats_a_recalled_list_is_read_as_it() {
        let (_, wire) = recall_wire(300);
        recall(Vec::new());
        let plain = SotwRequest::decode(Bytes::from(wire.clone())).unwrap();
        let kept = plain.resource_names.kept();
        assert_eq!(kept.known_digest, Some(plain.resource_names.digest()));
        recall(vec![kept.clone()]);
        let recalled = |read: &SotwRequest| {
            assert_eq!(*read, plain);
            assert_eq!(read.resource_names.len(), 300);
            assert_eq!(read.resource_names.digest(), plain.resource_names.digest());
            // The list's own bytes, not the request's.
            assert!(read.resource_names.more.is_empty());
            read.resource_names.encoded.as_ptr() == kept.encoded.as_ptr()
        };
        assert!(recalled(
            &SotwRequest::decode(Bytes::from(wire.clone())).unwrap()
        ));
        // Cut anywhere, through the fields before the names, the names and after.
        for a in 1..wire.len() {
            let read = SotwRequest::decode_pieces(cut(&wire, &[a])).unwrap();
            assert!(recalled(&read), "cut at {a}");
        }
        for a in (1..wire.len()).step_by(97) {
            for b in (a + 1..wire.len()).step_by(89) {
                let read = SotwRequest::decode_pieces(cut(&wire, &[a, b])).unwrap();
                assert!(recalled(&read), "cuts at {a}, {b}");
            }
        }
    }

    #[test]
    fn runs_that_differ_from_a_recalled_list_are_read_for_themselves() {
        let (names, wire) = recall_wire(300);
        recall(Vec::new());
        let kept = SotwRequest::decode(Bytes::from(wire))
            .unwrap()
            .resource_names
            .kept();
        let one_more = [names.clone(), vec!["outbound|80||z.ns".into()]].concat();
        let one_less = names[..299].to_vec();
        let mut last_changed = names.clone();
        last_changed[299].push('x');
        let requests = [one_more, one_less, last_changed]
            .map(|names| full_request(names, "v1", "n1").encode_to_vec());
        // Names on both sides of the type URL: the recalled run, then another.
        let mut two_runs = recall_wire(300).1;
        encoding::string::encode(4, &"t".to_string(), &mut two_runs);
        encoding::string::encode(3, &"z".to_string(), &mut two_runs);
        // A name whose key is written long (two bytes), then the recalled run.
        let mut long_key_first = vec![0x9a, 0x00, 1, b'z'];
        long_key_first.extend(recall_wire(300).1);
        for wire in requests.iter().chain([&two_runs, &long_key_first]) {
            recall(Vec::new());
            let plain = SotwRequest::decode(Bytes::from(wire.clone())).unwrap();
            recall(vec![kept.clone()]);
            let read = SotwRequest::decode(Bytes::from(wire.clone())).unwrap();
            assert_eq!(read, plain);
            assert_eq!(read.resource_names.len(), plain.resource_names.len());
            assert_eq!(read.resource_names.digest(), plain.resource_names.digest());
            assert_ne!(read.resource_names.encoded.as_ptr(), kept.encoded.as_ptr());
            for a in (1..wire.len()).step_by(13) {
                let read = SotwRequest::decode_pieces(cut(wire, &[a])).unwrap();
                assert_eq!(read, plain, "cut at {a}");
                assert_eq!(read.resource_names.len(), plain.resource_names.len());
                assert_ne!(read.resource_names.encoded.as_ptr(), kept.encoded.as_ptr());
            }
        }
        recall(Vec::new());
    }

    #[test]
    fn names_compare_equal_however_they_were_cut() {
        let wire = DiscoveryRequest {
            resource_names: (0..50).map(|i| format!("outbound|80||s{i}.ns")).collect(),
            ..Default::default()
        }
        .encode_to_vec();
        let a = SotwRequest::decode_pieces(cut(&wire, &[100, 700])).unwrap();
        let b = SotwRequest::decode_pieces(cut(&wire, &[333])).unwrap();
        let c = SotwRequest::decode(Bytes::from(wire.clone())).unwrap();
        assert!(a.resource_names.same_as(&b.resource_names));
        assert!(b.resource_names.same_as(&c.resource_names));
        let mut other = wire.clone();
        let last = other.len() - 1;
        other[last] ^= 1;
        let d = SotwRequest::decode_pieces(cut(&other, &[100, 700])).unwrap();
        assert!(!d.resource_names.same_as(&c.resource_names));
        assert!(!c.resource_names.same_as(&d.resource_names));
    }

    use super::*;
}
