//! The frames of an HTTP/2 client's byte stream, followed without decoding them: the
//! connection preface, then each frame's 9-byte header and the payload it announces.
//! The xDS ports watch a client's bytes for its first HEADERS frame (the handshake
//! deadline, [`super::transport`]); the load tool's connections watch their own writes
//! for frames that must not wait to be gathered ([`super::coalesce`]).

/// Watches the HTTP/2 bytes a client sends until its first HEADERS frame: the moment
/// it opened a stream. Counted where the bytes are read, not where the gRPC service
/// is first called: on a saturated server the stream's task may wait seconds to run,
/// and a deadline that waited for it cut clients whose stream had long arrived (290
/// connection resets in a 20,000-sidecar reconnect storm).
#[derive(Debug)]
pub struct FrameScan {
    /// Bytes of the client preface (`PRI * HTTP/2.0...`, 24 bytes) still to come.
    preface: usize,
    /// The frame header being read (9 bytes) and how much of it has come.
    header: [u8; 9],
    have: usize,
    /// Payload bytes of the current frame still to skip.
    skip: usize,
}

impl Default for FrameScan {
    fn default() -> FrameScan {
        FrameScan {
            preface: 24,
            header: [0; 9],
            have: 0,
            skip: 0,
        }
    }
}

/// HTTP/2's HEADERS frame type.
pub(crate) const HEADERS: u8 = 0x1;

impl FrameScan {
    /// Follows `bytes` read from the client with `scan`, if still scanning; at the
    /// first HEADERS frame, ends the scan and calls `started` (which ends the
    /// connection's handshake deadline).
    pub fn follow(scan: &mut Option<Box<FrameScan>>, bytes: &[u8], started: impl FnOnce()) {
        if let Some(s) = scan
            && s.feed(bytes)
        {
            *scan = None;
            started();
        }
    }

    /// Follows `bytes` (the next ones the client sent); true once a HEADERS frame
    /// began.
    pub fn feed(&mut self, bytes: &[u8]) -> bool {
        self.walk(bytes, |kind| kind == HEADERS)
    }

    /// Still in the client's connection preface.
    pub(crate) fn in_preface(&self) -> bool {
        self.preface > 0
    }

    /// Follows all of `bytes`: true if the header of a frame whose type `marks` was
    /// read in them. The walk of a client's frames, for the handshake deadline here and
    /// for the write gathering of the load tool's connections ([`super::coalesce`]).
    pub(crate) fn walk(&mut self, mut bytes: &[u8], marks: impl Fn(u8) -> bool) -> bool {
        let mut marked = false;
        let preface = self.preface.min(bytes.len());
        self.preface -= preface;
        bytes = &bytes[preface..];
        while !bytes.is_empty() {
            if self.skip > 0 {
                let n = self.skip.min(bytes.len());
                self.skip -= n;
                bytes = &bytes[n..];
                continue;
            }
            let n = (9 - self.have).min(bytes.len());
            self.header[self.have..self.have + n].copy_from_slice(&bytes[..n]);
            self.have += n;
            bytes = &bytes[n..];
            if self.have == 9 {
                marked |= marks(self.header[3]);
                let [a, b, c, ..] = self.header;
                self.skip = usize::from(a) << 16 | usize::from(b) << 8 | usize::from(c);
                self.have = 0;
            }
        }
        marked
    }
}
