//! The byte format of a data connection between two workers.
//!
//! Every frame is `u32 length (little endian) | u8 kind | body`, where `length` counts the kind
//! byte and the body and is at most [`MAX_FRAME`]. Integers are little endian, strings are
//! `u16 length | UTF-8 bytes`. After the handshake (see [`super::handshake`]) only three kinds
//! flow, in both directions:
//!
//! | kind | body | meaning |
//! | --- | --- | --- |
//! | `DATA` | channel, element | one stream element of a channel the sender produces |
//! | `CREDIT` | channel, `u32 n` | the receiver freed `n` buffers of a channel it consumes |
//! | `CLOSED` | channel | the producer of a channel is gone; nothing more follows on it |
//! | `PRIORITY` | channel, `u64 records_before`, barrier element | a barrier on the channel's priority lane (not counted against credit) |
//!
//! A channel is `u32 edge | u32 from | u32 to` ([`ChannelId`]). Decoding never trusts a length:
//! every read is bounds-checked and a malformed frame is a [`WireError`], never a panic.

use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;

use cairn_protocol::checkpoint::CheckpointKind;
use cairn_protocol::messages::CheckpointOptions;

use super::ChannelId;
use crate::exchange::{Barrier, PriorityBarrier, Record, StreamElement};

/// Largest frame accepted, kind byte and body included.
pub const MAX_FRAME: usize = 64 * 1024;

pub(crate) const KIND_DATA: u8 = 1;
pub(crate) const KIND_CREDIT: u8 = 2;
pub(crate) const KIND_CLOSED: u8 = 3;
pub(crate) const KIND_PRIORITY: u8 = 4;
pub(crate) const KIND_HELLO: u8 = 16;
pub(crate) const KIND_CHALLENGE: u8 = 17;
pub(crate) const KIND_PROOF: u8 = 18;
pub(crate) const KIND_ACCEPT: u8 = 19;
pub(crate) const KIND_REFUSE: u8 = 20;

const EL_RECORD: u8 = 0;
const EL_WATERMARK: u8 = 1;
const EL_BARRIER: u8 = 2;
const EL_CANCEL: u8 = 3;
const EL_END_OF_DATA: u8 = 4;
const EL_END_OF_INPUT: u8 = 5;

/// A frame that does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("frame ends early: {what} needs {needed} more bytes")]
    Truncated { what: &'static str, needed: usize },
    #[error("frame has {0} bytes left over after its body")]
    Trailing(usize),
    #[error("frame of {0} bytes exceeds the limit of {MAX_FRAME}")]
    TooLarge(usize),
    #[error("empty frame (no kind byte)")]
    Empty,
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    #[error("unknown stream element tag {0}")]
    UnknownElement(u8),
    #[error("unknown checkpoint kind {0}")]
    UnknownCheckpointKind(u8),
    #[error("a priority frame carries a stream element that is not a barrier")]
    PriorityNotBarrier,
    #[error("{0} is not UTF-8")]
    NotUtf8(&'static str),
    #[error("{what} is {len} bytes long; at most {max} are allowed")]
    StringTooLong { what: &'static str, len: usize, max: usize },
}

/// A frame after the handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    Data(ChannelId, StreamElement),
    Credit(ChannelId, u32),
    Closed(ChannelId),
    Priority(ChannelId, PriorityBarrier),
}

/// Appends whole frames to a buffer (the writer flushes the buffer in one write).
#[derive(Debug, Default)]
pub struct FrameWriter {
    buf: Vec<u8>,
}

impl FrameWriter {
    pub fn buffer(&self) -> &[u8] {
        &self.buf
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    pub fn clear(&mut self) {
        self.buf.clear();
    }

    /// Starts a frame of `kind`; returns the offset of its length field.
    fn begin(&mut self, kind: u8) -> usize {
        let at = self.buf.len();
        self.buf.extend_from_slice(&[0; 4]);
        self.buf.push(kind);
        at
    }

    fn finish(&mut self, at: usize) -> Result<(), WireError> {
        let len = self.buf.len() - at - 4;
        if len > MAX_FRAME {
            self.buf.truncate(at);
            return Err(WireError::TooLarge(len));
        }
        self.buf[at..at + 4].copy_from_slice(&(len as u32).to_le_bytes());
        Ok(())
    }

    /// Appends one frame; on error (a barrier whose target path is too long) nothing is appended.
    pub fn frame(&mut self, frame: &Frame) -> Result<(), WireError> {
        match frame {
            Frame::Data(ch, element) => {
                let at = self.begin(KIND_DATA);
                put_channel(&mut self.buf, *ch);
                if let Err(e) = put_element(&mut self.buf, element) {
                    self.buf.truncate(at);
                    return Err(e);
                }
                self.finish(at)
            }
            Frame::Credit(ch, n) => {
                let at = self.begin(KIND_CREDIT);
                put_channel(&mut self.buf, *ch);
                self.buf.extend_from_slice(&n.to_le_bytes());
                self.finish(at)
            }
            Frame::Closed(ch) => {
                let at = self.begin(KIND_CLOSED);
                put_channel(&mut self.buf, *ch);
                self.finish(at)
            }
            Frame::Priority(ch, p) => {
                let at = self.begin(KIND_PRIORITY);
                put_channel(&mut self.buf, *ch);
                self.buf.extend_from_slice(&p.records_before.to_le_bytes());
                if let Err(e) = put_element(&mut self.buf, &StreamElement::Barrier(p.barrier.clone())) {
                    self.buf.truncate(at);
                    return Err(e);
                }
                self.finish(at)
            }
        }
    }

    /// Appends a handshake frame with a body the caller built.
    pub(crate) fn raw(&mut self, kind: u8, body: &[u8]) -> Result<(), WireError> {
        let at = self.begin(kind);
        self.buf.extend_from_slice(body);
        self.finish(at)
    }
}

/// Decodes a post-handshake frame from its kind byte and body (the length already stripped).
pub fn decode_frame(frame: &[u8]) -> Result<Frame, WireError> {
    let (&kind, body) = frame.split_first().ok_or(WireError::Empty)?;
    let mut r = Reader::new(body);
    let decoded = match kind {
        KIND_DATA => {
            let ch = r.channel()?;
            Frame::Data(ch, r.element()?)
        }
        KIND_CREDIT => {
            let ch = r.channel()?;
            Frame::Credit(ch, r.u32("credit")?)
        }
        KIND_CLOSED => Frame::Closed(r.channel()?),
        KIND_PRIORITY => {
            let ch = r.channel()?;
            let records_before = r.u64("records before the barrier")?;
            let StreamElement::Barrier(barrier) = r.element()? else {
                return Err(WireError::PriorityNotBarrier);
            };
            Frame::Priority(ch, PriorityBarrier { barrier, records_before })
        }
        other => return Err(WireError::UnknownKind(other)),
    };
    r.end()?;
    Ok(decoded)
}

fn put_channel(buf: &mut Vec<u8>, ch: ChannelId) {
    buf.extend_from_slice(&ch.edge.to_le_bytes());
    buf.extend_from_slice(&ch.from.to_le_bytes());
    buf.extend_from_slice(&ch.to.to_le_bytes());
}

pub(crate) fn put_str(buf: &mut Vec<u8>, what: &'static str, s: &[u8], max: usize) -> Result<(), WireError> {
    if s.len() > max {
        return Err(WireError::StringTooLong { what, len: s.len(), max });
    }
    buf.extend_from_slice(&(s.len() as u16).to_le_bytes());
    buf.extend_from_slice(s);
    Ok(())
}

/// Longest barrier target path carried, in bytes.
const MAX_PATH: usize = 4096;

fn put_element(buf: &mut Vec<u8>, element: &StreamElement) -> Result<(), WireError> {
    match element {
        StreamElement::Record(r) => {
            buf.push(EL_RECORD);
            buf.extend_from_slice(&r.key.to_le_bytes());
            buf.extend_from_slice(&r.value.to_le_bytes());
            buf.extend_from_slice(&r.seq.to_le_bytes());
        }
        StreamElement::Watermark(t) => {
            buf.push(EL_WATERMARK);
            buf.extend_from_slice(&t.to_le_bytes());
        }
        StreamElement::Barrier(b) => {
            buf.push(EL_BARRIER);
            buf.extend_from_slice(&b.checkpoint_id.to_le_bytes());
            buf.extend_from_slice(&b.timestamp_ms.to_le_bytes());
            buf.push(match b.options.kind {
                CheckpointKind::Checkpoint => 0,
                CheckpointKind::Savepoint => 1,
                CheckpointKind::SyncSavepoint => 2,
            });
            buf.push(u8::from(b.options.drain));
            match &b.options.target_location {
                None => buf.push(0),
                Some(path) => {
                    buf.push(1);
                    put_str(buf, "the barrier's target location", path.as_os_str().as_bytes(), MAX_PATH)?;
                }
            }
            match b.options.unaligned_after_ms {
                None => buf.push(0),
                Some(t) => {
                    buf.push(1);
                    buf.extend_from_slice(&t.to_le_bytes());
                }
            }
        }
        StreamElement::CancelMarker(id) => {
            buf.push(EL_CANCEL);
            buf.extend_from_slice(&id.to_le_bytes());
        }
        StreamElement::EndOfData => buf.push(EL_END_OF_DATA),
        StreamElement::EndOfInput => buf.push(EL_END_OF_INPUT),
    }
    Ok(())
}

/// A bounds-checked cursor over a frame body.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Self { buf }
    }

    pub(crate) fn take(&mut self, what: &'static str, n: usize) -> Result<&'a [u8], WireError> {
        if self.buf.len() < n {
            return Err(WireError::Truncated { what, needed: n - self.buf.len() });
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    pub(crate) fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], WireError> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(what, N)?);
        Ok(out)
    }

    pub(crate) fn u8(&mut self, what: &'static str) -> Result<u8, WireError> {
        Ok(self.array::<1>(what)?[0])
    }

    pub(crate) fn u16(&mut self, what: &'static str) -> Result<u16, WireError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn u32(&mut self, what: &'static str) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn u64(&mut self, what: &'static str) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn bytes(&mut self, what: &'static str, max: usize) -> Result<&'a [u8], WireError> {
        let len = self.u16(what)? as usize;
        if len > max {
            return Err(WireError::StringTooLong { what, len, max });
        }
        self.take(what, len)
    }

    pub(crate) fn string(&mut self, what: &'static str, max: usize) -> Result<String, WireError> {
        let raw = self.bytes(what, max)?;
        std::str::from_utf8(raw).map(str::to_owned).map_err(|_| WireError::NotUtf8(what))
    }

    pub(crate) fn end(&self) -> Result<(), WireError> {
        if self.buf.is_empty() { Ok(()) } else { Err(WireError::Trailing(self.buf.len())) }
    }

    fn channel(&mut self) -> Result<ChannelId, WireError> {
        Ok(ChannelId {
            edge: self.u32("channel edge")?,
            from: self.u32("channel from")?,
            to: self.u32("channel to")?,
        })
    }

    fn element(&mut self) -> Result<StreamElement, WireError> {
        Ok(match self.u8("element tag")? {
            EL_RECORD => StreamElement::Record(Record {
                key: self.u64("record key")?,
                value: self.u64("record value")?,
                seq: self.u64("record seq")?,
            }),
            EL_WATERMARK => StreamElement::Watermark(self.u64("watermark")?),
            EL_BARRIER => {
                let checkpoint_id = self.u64("barrier checkpoint id")?;
                let timestamp_ms = self.u64("barrier timestamp")?;
                let kind = match self.u8("barrier kind")? {
                    0 => CheckpointKind::Checkpoint,
                    1 => CheckpointKind::Savepoint,
                    2 => CheckpointKind::SyncSavepoint,
                    other => return Err(WireError::UnknownCheckpointKind(other)),
                };
                let drain = self.u8("barrier drain flag")? != 0;
                let target_location = match self.u8("barrier target flag")? {
                    0 => None,
                    _ => Some(PathBuf::from(std::ffi::OsString::from_vec(
                        self.bytes("the barrier's target location", MAX_PATH)?.to_vec(),
                    ))),
                };
                let unaligned_after_ms = match self.u8("barrier unaligned flag")? {
                    0 => None,
                    _ => Some(self.u64("barrier alignment timeout")?),
                };
                StreamElement::Barrier(Barrier {
                    checkpoint_id,
                    timestamp_ms,
                    options: CheckpointOptions { kind, drain, target_location, unaligned_after_ms },
                })
            }
            EL_CANCEL => StreamElement::CancelMarker(self.u64("cancel marker")?),
            EL_END_OF_DATA => StreamElement::EndOfData,
            EL_END_OF_INPUT => StreamElement::EndOfInput,
            other => return Err(WireError::UnknownElement(other)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames() -> Vec<Frame> {
        let ch = ChannelId { edge: 1, from: 2, to: 3 };
        vec![
            Frame::Data(ch, StreamElement::Record(Record { key: u64::MAX, value: 7, seq: 9 })),
            Frame::Data(ch, StreamElement::Watermark(5)),
            Frame::Data(
                ch,
                StreamElement::Barrier(Barrier {
                    checkpoint_id: 42,
                    timestamp_ms: 1_700_000_000_000,
                    options: CheckpointOptions {
                        kind: CheckpointKind::SyncSavepoint,
                        drain: true,
                        target_location: Some(PathBuf::from("/tmp/sp-1")),
                        unaligned_after_ms: None,
                    },
                }),
            ),
            Frame::Priority(
                ch,
                PriorityBarrier {
                    barrier: Barrier {
                        checkpoint_id: 45,
                        timestamp_ms: 9,
                        options: CheckpointOptions {
                            unaligned_after_ms: Some(0),
                            ..CheckpointOptions::checkpoint()
                        },
                    },
                    records_before: u64::MAX,
                },
            ),
            Frame::Priority(
                ch,
                PriorityBarrier {
                    barrier: Barrier {
                        checkpoint_id: 46,
                        timestamp_ms: 9,
                        options: CheckpointOptions {
                            unaligned_after_ms: Some(1500),
                            ..CheckpointOptions::checkpoint()
                        },
                    },
                    records_before: 3,
                },
            ),
            Frame::Data(
                ch,
                StreamElement::Barrier(Barrier {
                    checkpoint_id: 43,
                    timestamp_ms: 0,
                    options: CheckpointOptions::checkpoint(),
                }),
            ),
            Frame::Data(ch, StreamElement::CancelMarker(44)),
            Frame::Data(ch, StreamElement::EndOfData),
            Frame::Data(ch, StreamElement::EndOfInput),
            Frame::Credit(ch, 64),
            Frame::Closed(ch),
        ]
    }

    #[test]
    fn every_frame_round_trips() {
        let mut w = FrameWriter::default();
        for f in frames() {
            w.clear();
            w.frame(&f).unwrap();
            let buf = w.buffer();
            let len = u32::from_le_bytes(buf[..4].try_into().unwrap()) as usize;
            assert_eq!(len, buf.len() - 4);
            assert_eq!(decode_frame(&buf[4..]).unwrap(), f);
        }
    }

    #[test]
    fn every_truncation_and_extension_is_an_error_not_a_panic() {
        let mut w = FrameWriter::default();
        for f in frames() {
            w.clear();
            w.frame(&f).unwrap();
            let body = &w.buffer()[4..];
            for cut in 0..body.len() {
                assert!(decode_frame(&body[..cut]).is_err(), "{f:?} cut at {cut}");
            }
            let mut longer = body.to_vec();
            longer.push(0);
            assert_eq!(decode_frame(&longer), Err(WireError::Trailing(1)));
        }
    }

    #[test]
    fn unknown_kinds_and_tags_are_named() {
        assert_eq!(decode_frame(&[99]), Err(WireError::UnknownKind(99)));
        let mut body = vec![KIND_DATA];
        body.extend_from_slice(&[0; 12]);
        body.push(77);
        assert_eq!(decode_frame(&body), Err(WireError::UnknownElement(77)));
    }

    #[test]
    fn an_oversized_target_path_is_refused_and_leaves_the_buffer_as_it_was() {
        let mut w = FrameWriter::default();
        w.frame(&Frame::Credit(ChannelId { edge: 0, from: 0, to: 0 }, 1)).unwrap();
        let before = w.len();
        let huge = Frame::Data(
            ChannelId { edge: 0, from: 0, to: 0 },
            StreamElement::Barrier(Barrier {
                checkpoint_id: 1,
                timestamp_ms: 1,
                options: CheckpointOptions {
                    kind: CheckpointKind::Savepoint,
                    drain: false,
                    target_location: Some(PathBuf::from("x".repeat(MAX_PATH + 1))),
                    unaligned_after_ms: None,
                },
            }),
        );
        assert!(matches!(w.frame(&huge), Err(WireError::StringTooLong { .. })));
        assert_eq!(w.len(), before);
    }
}
