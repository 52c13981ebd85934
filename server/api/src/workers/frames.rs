//! The response body of a forwarded worker call (replica → replica): length-prefixed
//! frames, so that the requesting replica takes each item off the stream without looking
//! into it, and a file chunk's bytes cross as they are (no base64, no JSON).
//!
//! A frame is a 4-byte big-endian length (of what follows), a kind byte, and the kind's
//! payload: an item's JSON text, a chunk's offset (u64, big-endian) and raw bytes, the
//! answer's JSON, an error's JSON, or nothing (a keepalive). The length framing is
//! `tokio_util`'s [`LengthDelimitedCodec`] with its defaults.
//!
//! A replica that asks for frames names [`CONTENT_TYPE`] in its `accept` header and reads the
//! response by its `content-type`: an older replica on either side gets and sends JSON lines.
//! A run of chunks (a worker's chunk run) crosses as one frame (its offset, a flags byte and
//! its bytes) to a replica that sent [`RUNS_HEADER`]; an older one gets a frame per chunk.

use berth_protocol::RpcError;
use bytes::{Buf, Bytes, BytesMut};
use serde_json::{Value, value::RawValue};
use tokio_util::codec::{Decoder, LengthDelimitedCodec};

use super::calls::Item;

/// The media type of a framed response body.
pub const CONTENT_TYPE: &str = "application/x-berth-call-frames";
/// The largest frame accepted: a chunk is at most 32 KiB, an answer (a git diff, a file
/// listing page) a few MiB.
const MAX_FRAME: usize = 64 << 20;

const ITEM: u8 = 1;
const CHUNK: u8 = 2;
const RESULT: u8 = 3;
const ERROR: u8 = 4;
const KEEPALIVE: u8 = 5;
const CHUNK_RUN: u8 = 6;

/// The request header by which a replica says it reads chunk-run frames.
pub const RUNS_HEADER: &str = "x-berth-chunk-runs";

/// One event of a forwarded call.
#[derive(Debug)]
pub enum Line {
    Item(Item),
    Result(Value),
    Error(RpcError),
    Keepalive,
}

/// Why a framed body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("frame length: {0}")]
    Length(#[from] std::io::Error),
    #[error("unknown frame kind {0}")]
    Kind(u8),
    #[error("empty frame")]
    Empty,
    #[error("chunk frame without its offset and flags")]
    ShortChunk,
    #[error("frame payload: {0}")]
    Json(#[from] serde_json::Error),
}

/// `line` as frame bytes: one buffer, or for chunks a header and the chunk's data (passed on
/// as it is, not copied). A chunk run goes as one frame when `runs` (the reader takes them),
/// else as a frame per chunk.
pub fn encode(line: &Line, runs: bool) -> Vec<Bytes> {
    let whole = |kind: u8, payload: &[u8]| {
        let mut v = Vec::with_capacity(5 + payload.len());
        v.extend_from_slice(&(payload.len() as u32 + 1).to_be_bytes());
        v.push(kind);
        v.extend_from_slice(payload);
        Bytes::from(v)
    };
    let chunk = |offset: u64, data: &Bytes| {
        let mut head = Vec::with_capacity(13);
        head.extend_from_slice(&(data.len() as u32 + 9).to_be_bytes());
        head.push(CHUNK);
        head.extend_from_slice(&offset.to_be_bytes());
        [Bytes::from(head), data.clone()]
    };
    match line {
        Line::Item(Item::Json(item)) => vec![whole(ITEM, item.get().as_bytes())],
        Line::Item(Item::Chunk { offset, data, text }) if runs => {
            let mut head = Vec::with_capacity(14);
            head.extend_from_slice(&(data.len() as u32 + 10).to_be_bytes());
            head.push(CHUNK_RUN);
            head.extend_from_slice(&offset.to_be_bytes());
            head.push(u8::from(*text));
            vec![Bytes::from(head), data.clone()]
        }
        Line::Item(run @ Item::Chunk { .. }) => run.chunks().iter().flat_map(|(o, d)| chunk(*o, d)).collect(),
        Line::Result(v) => vec![whole(RESULT, &serde_json::to_vec(v).unwrap_or_default())],
        Line::Error(e) => vec![whole(ERROR, &serde_json::to_vec(e).unwrap_or_default())],
        Line::Keepalive => vec![whole(KEEPALIVE, b"")],
    }
}

/// Takes frames off the front of a received buffer.
pub struct FrameDecoder {
    codec: LengthDelimitedCodec,
}

impl Default for FrameDecoder {
    fn default() -> Self {
        FrameDecoder {
            codec: LengthDelimitedCodec::builder().max_frame_length(MAX_FRAME).new_codec(),
        }
    }
}

impl FrameDecoder {
    /// The next whole frame in `buf` (removed from it), or None until more bytes arrive.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Line>, FrameError> {
        let Some(frame) = self.codec.decode(buf)? else {
            return Ok(None);
        };
        let mut frame = frame.freeze();
        if frame.is_empty() {
            return Err(FrameError::Empty);
        }
        let kind = frame.get_u8();
        Ok(Some(match kind {
            ITEM => Line::Item(Item::Json(serde_json::from_slice::<Box<RawValue>>(&frame)?)),
            CHUNK => {
                if frame.len() < 8 {
                    return Err(FrameError::ShortChunk);
                }
                let offset = frame.get_u64();
                Line::Item(Item::Chunk {
                    offset,
                    data: frame,
                    text: false,
                })
            }
            CHUNK_RUN => {
                if frame.len() < 9 {
                    return Err(FrameError::ShortChunk);
                }
                let offset = frame.get_u64();
                let text = frame.get_u8() & 1 != 0;
                Line::Item(Item::Chunk {
                    offset,
                    data: frame,
                    text,
                })
            }
            RESULT => Line::Result(serde_json::from_slice(&frame)?),
            ERROR => Line::Error(serde_json::from_slice(&frame)?),
            KEEPALIVE => Line::Keepalive,
            other => return Err(FrameError::Kind(other)),
        }))
    }
}

#[cfg(test)]
mod tests {
    use berth_protocol::ErrorCode;

    use super::*;

    fn bytes(line: &Line) -> Vec<u8> {
        encode(line, true).concat()
    }

    /// A text run of 1- to 4-byte characters, longer than one chunk.
    fn run() -> Item {
        Item::Chunk {
            offset: 1 << 20,
            data: Bytes::from("aé✓😀".repeat(10_000)),
            text: true,
        }
    }

    fn sample() -> Vec<Line> {
        vec![
            Line::Item(Item::Json(
                RawValue::from_string(r#"{"type":"begin","size":3}"#.into()).unwrap(),
            )),
            Line::Item(Item::Chunk {
                offset: 1 << 40,
                data: Bytes::from_static(b"\x00\xff\n raw \xc3"),
                text: false,
            }),
            Line::Item(Item::Chunk {
                offset: 0,
                data: Bytes::new(),
                text: false,
            }),
            Line::Item(run()),
            Line::Keepalive,
            Line::Error(RpcError::new(ErrorCode::WorkspaceOffline)),
            Line::Result(serde_json::json!({"files": 2})),
        ]
    }

    fn same(a: &Line, b: &Line) -> bool {
        match (a, b) {
            (Line::Item(Item::Json(x)), Line::Item(Item::Json(y))) => x.get() == y.get(),
            (
                Line::Item(Item::Chunk {
                    offset: o1,
                    data: d1,
                    text: t1,
                }),
                Line::Item(Item::Chunk {
                    offset: o2,
                    data: d2,
                    text: t2,
                }),
            ) => o1 == o2 && d1 == d2 && t1 == t2,
            (Line::Result(x), Line::Result(y)) => x == y,
            (Line::Error(x), Line::Error(y)) => x.code == y.code,
            (Line::Keepalive, Line::Keepalive) => true,
            _ => false,
        }
    }

    #[test]
    fn frames_round_trip_however_the_stream_is_split() {
        let lines = sample();
        let stream: Vec<u8> = lines.iter().flat_map(bytes).collect();
        for piece in [1, 2, 5, 13, 64, stream.len()] {
            let mut dec = FrameDecoder::default();
            let mut buf = BytesMut::new();
            let mut back = Vec::new();
            for part in stream.chunks(piece) {
                buf.extend_from_slice(part);
                while let Some(line) = dec.decode(&mut buf).unwrap() {
                    back.push(line);
                }
            }
            assert!(buf.is_empty());
            assert_eq!(back.len(), lines.len(), "split every {piece} bytes");
            for (a, b) in lines.iter().zip(&back) {
                assert!(same(a, b), "{a:?} vs {b:?}");
            }
        }
    }

    #[test]
    fn a_run_goes_to_an_older_replica_as_its_chunks() {
        let run = run();
        let stream = encode(&Line::Item(run.clone()), false).concat();
        let mut dec = FrameDecoder::default();
        let mut buf = BytesMut::from(&stream[..]);
        let mut back = Vec::new();
        while let Some(line) = dec.decode(&mut buf).unwrap() {
            match line {
                Line::Item(Item::Chunk { offset, data, .. }) => back.push((offset, data)),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(back, run.chunks());
        assert_eq!(back.len(), 4);
        let Item::Chunk { data, .. } = &run else { unreachable!() };
        let mut at = 1 << 20;
        for (offset, piece) in &back {
            assert_eq!(*offset, at);
            assert!(piece.len() <= berth_protocol::FILES_READ_CHUNK);
            assert!(std::str::from_utf8(piece).is_ok());
            at += piece.len() as u64;
        }
        assert_eq!(back.iter().map(|(_, d)| &d[..]).collect::<Vec<_>>().concat(), &data[..]);
    }

    #[test]
    fn bad_frames_are_typed_errors() {
        let decode = |bytes: &[u8]| FrameDecoder::default().decode(&mut BytesMut::from(bytes));
        assert!(matches!(decode(b"\x00\x00\x00\x01\x09"), Err(FrameError::Kind(9))));
        assert!(matches!(decode(b"\x00\x00\x00\x00"), Err(FrameError::Empty)));
        assert!(matches!(
            decode(b"\x00\x00\x00\x03\x02\x00\x00"),
            Err(FrameError::ShortChunk)
        ));
        assert!(matches!(
            decode(b"\x00\x00\x00\x09\x06\x00\x00\x00\x00\x00\x00\x00\x00"),
            Err(FrameError::ShortChunk)
        ));
        assert!(matches!(decode(b"\x00\x00\x00\x03\x01{x"), Err(FrameError::Json(_))));
        assert!(matches!(decode(b"\x7f\xff\xff\xff\x01"), Err(FrameError::Length(_))));
        // An incomplete frame waits for more bytes.
        assert!(matches!(decode(b"\x00\x00\x00\x05\x01{}"), Ok(None)));
    }
}
