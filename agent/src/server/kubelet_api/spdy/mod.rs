//! SPDY/3.1 framing, the server side of what `kubectl port-forward` speaks
//! (`github.com/moby/spdystream`, the framer in its `spdy` package).
//!
//! ```text
//!  control frame  |1| version (3) 15 | type 16 | flags 8 | length 24 | payload
//!  data frame     |0| stream id 31            | flags 8 | length 24 | data
//!
//!  SYN_STREAM (1)    stream id, associated-to id, priority 3 bits, slot, header block
//!  SYN_REPLY (2)     stream id, header block          RST_STREAM (3)  stream id, status
//!  SETTINGS (4)      entries                          PING (6)        id
//!  GOAWAY (7)        last good stream id, status      HEADERS (8)     stream id, header block
//!  WINDOW_UPDATE (9) stream id, delta window size
//! ```
//!
//! A header block is `count, (name length, name, value length, value)*` (32-bit big-endian
//! lengths, lower-case names, several values joined by NUL), compressed with zlib primed with
//! [`dictionary::HEADER_DICTIONARY`]. Each direction of a connection keeps one compression
//! context for its whole life, every block ending on a sync flush: blocks must be encoded
//! (and decoded) in the order they travel. [`FrameReader`] and [`FrameWriter`] own the two
//! contexts.
//!
//! Frame types this module does not know are read as [`Frame::Unknown`] (the spec: ignore
//! them). Flow control is decoded but not enforced: spdystream, kubectl's side, sends no
//! WINDOW_UPDATE and ignores those it receives, so a sender waiting for window would stall.

pub mod dictionary;

use bytes::Bytes;
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};
use tokio::io::{AsyncRead, AsyncReadExt};

use dictionary::HEADER_DICTIONARY;

pub const VERSION: u16 = 3;

/// Control frame types.
pub const SYN_STREAM: u16 = 1;
pub const SYN_REPLY: u16 = 2;
pub const RST_STREAM: u16 = 3;
pub const SETTINGS: u16 = 4;
pub const PING: u16 = 6;
pub const GOAWAY: u16 = 7;
pub const HEADERS: u16 = 8;
pub const WINDOW_UPDATE: u16 = 9;

/// FLAG_FIN (control and data frames); FLAG_UNIDIRECTIONAL (SYN_STREAM).
pub const FLAG_FIN: u8 = 0x01;
pub const FLAG_UNIDIRECTIONAL: u8 = 0x02;

/// RST_STREAM status codes.
pub const PROTOCOL_ERROR: u32 = 1;
pub const INVALID_STREAM: u32 = 2;
pub const CANCEL: u32 = 5;

/// GOAWAY status codes.
pub const GOAWAY_OK: u32 = 0;
pub const GOAWAY_PROTOCOL_ERROR: u32 = 1;

/// The largest frame payload (24-bit length).
pub const MAX_FRAME_LENGTH: usize = (1 << 24) - 1;
/// A decompressed header block larger than this is refused (Go's framer: 16 MiB as well,
/// here less: port-forward headers are a few bytes).
const MAX_HEADER_BLOCK: usize = 1 << 20;
const STREAM_ID_MASK: u32 = 0x7fff_ffff;

/// Header names (lower-case) and values (several values joined by NUL), in block order.
pub type Headers = Vec<(String, String)>;

/// The value of header `name` (names are compared case-insensitively).
pub fn header<'a>(headers: &'a Headers, name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    SynStream {
        stream_id: u32,
        associated_to: u32,
        priority: u8,
        flags: u8,
        headers: Headers,
    },
    SynReply {
        stream_id: u32,
        flags: u8,
        headers: Headers,
    },
    RstStream {
        stream_id: u32,
        status: u32,
    },
    /// `(flags, id, value)` per entry.
    Settings {
        flags: u8,
        entries: Vec<(u8, u32, u32)>,
    },
    Ping {
        id: u32,
    },
    GoAway {
        last_good_stream_id: u32,
        status: u32,
    },
    Headers {
        stream_id: u32,
        flags: u8,
        headers: Headers,
    },
    WindowUpdate {
        stream_id: u32,
        delta: u32,
    },
    Data {
        stream_id: u32,
        flags: u8,
        data: Bytes,
    },
    /// A control frame of a type not listed above (its payload is skipped).
    Unknown {
        frame_type: u16,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum SpdyError {
    #[error("reading a frame: {0}")]
    Io(#[from] std::io::Error),
    #[error("unsupported SPDY version {0}")]
    Version(u16),
    #[error("control frame of type {frame_type} has an invalid length {length}")]
    Length { frame_type: u16, length: usize },
    #[error("header block: {0}")]
    HeaderBlock(&'static str),
    #[error("header compression: {0}")]
    Compression(String),
    #[error("frame payload of {0} bytes exceeds the 24-bit length")]
    TooLarge(usize),
}

/// Reads frames from a byte stream, decompressing header blocks in order.
pub struct FrameReader<R> {
    reader: R,
    inflate: Decompress,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub fn new(reader: R) -> Self {
        Self {
            reader,
            inflate: Decompress::new(true),
        }
    }

    /// The next frame; `None` when the stream ended cleanly between frames.
    pub async fn read_frame(&mut self) -> Result<Option<Frame>, SpdyError> {
        let mut head = [0u8; 8];
        match self.reader.read(&mut head[..1]).await? {
            0 => return Ok(None),
            _ => self.reader.read_exact(&mut head[1..]).await?,
        };
        let word = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
        let flags = head[4];
        let length = u32::from_be_bytes([0, head[5], head[6], head[7]]) as usize;
        let mut payload = vec![0u8; length];
        self.reader.read_exact(&mut payload).await?;
        if word & 0x8000_0000 == 0 {
            return Ok(Some(Frame::Data {
                stream_id: word & STREAM_ID_MASK,
                flags,
                data: Bytes::from(payload),
            }));
        }
        let version = ((word >> 16) & 0x7fff) as u16;
        if version != VERSION {
            return Err(SpdyError::Version(version));
        }
        let frame_type = (word & 0xffff) as u16;
        decode_control(frame_type, flags, &payload, &mut self.inflate).map(Some)
    }
}

fn be32(bytes: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

fn decode_control(
    frame_type: u16,
    flags: u8,
    payload: &[u8],
    inflate: &mut Decompress,
) -> Result<Frame, SpdyError> {
    let min = match frame_type {
        SYN_STREAM => 10,
        SYN_REPLY | HEADERS | SETTINGS | PING => 4,
        RST_STREAM | GOAWAY | WINDOW_UPDATE => 8,
        _ => 0,
    };
    if payload.len() < min {
        return Err(SpdyError::Length {
            frame_type,
            length: payload.len(),
        });
    }
    Ok(match frame_type {
        SYN_STREAM => Frame::SynStream {
            stream_id: be32(payload, 0) & STREAM_ID_MASK,
            associated_to: be32(payload, 4) & STREAM_ID_MASK,
            priority: payload[8] >> 5,
            flags,
            headers: decode_headers(inflate, &payload[10..])?,
        },
        SYN_REPLY => Frame::SynReply {
            stream_id: be32(payload, 0) & STREAM_ID_MASK,
            flags,
            headers: decode_headers(inflate, &payload[4..])?,
        },
        HEADERS => Frame::Headers {
            stream_id: be32(payload, 0) & STREAM_ID_MASK,
            flags,
            headers: decode_headers(inflate, &payload[4..])?,
        },
        RST_STREAM => Frame::RstStream {
            stream_id: be32(payload, 0) & STREAM_ID_MASK,
            status: be32(payload, 4),
        },
        SETTINGS => {
            let count = be32(payload, 0) as usize;
            if payload.len() != 4 + count.saturating_mul(8) {
                return Err(SpdyError::Length {
                    frame_type,
                    length: payload.len(),
                });
            }
            let entries = payload[4..]
                .chunks_exact(8)
                .map(|e| {
                    let id_word = be32(e, 0);
                    ((id_word >> 24) as u8, id_word & 0x00ff_ffff, be32(e, 4))
                })
                .collect();
            Frame::Settings { flags, entries }
        }
        PING => Frame::Ping {
            id: be32(payload, 0),
        },
        GOAWAY => Frame::GoAway {
            last_good_stream_id: be32(payload, 0) & STREAM_ID_MASK,
            status: be32(payload, 4),
        },
        WINDOW_UPDATE => Frame::WindowUpdate {
            stream_id: be32(payload, 0) & STREAM_ID_MASK,
            delta: be32(payload, 4) & STREAM_ID_MASK,
        },
        _ => Frame::Unknown { frame_type },
    })
}

/// Inflates one header block (continuing the connection's context) and parses it.
fn decode_headers(inflate: &mut Decompress, mut input: &[u8]) -> Result<Headers, SpdyError> {
    let mut block = Vec::with_capacity(256);
    let mut chunk = [0u8; 4096];
    loop {
        let (before_in, before_out) = (inflate.total_in(), inflate.total_out());
        let result = inflate.decompress(input, &mut chunk, FlushDecompress::Sync);
        let consumed = (inflate.total_in() - before_in) as usize;
        let produced = (inflate.total_out() - before_out) as usize;
        input = &input[consumed..];
        block.extend_from_slice(&chunk[..produced]);
        if block.len() > MAX_HEADER_BLOCK {
            return Err(SpdyError::HeaderBlock("too large"));
        }
        match result {
            Err(err) if err.needs_dictionary().is_some() => {
                inflate
                    .set_dictionary(HEADER_DICTIONARY)
                    .map_err(|e| SpdyError::Compression(e.to_string()))?;
            }
            Err(err) => return Err(SpdyError::Compression(err.to_string())),
            Ok(Status::StreamEnd) => break,
            Ok(_) if input.is_empty() && produced < chunk.len() => break,
            Ok(_) if consumed == 0 && produced == 0 => {
                return Err(SpdyError::Compression("no progress".into()))
            }
            Ok(_) => {}
        }
    }
    parse_header_block(&block)
}

/// Parses a decompressed header block.
pub fn parse_header_block(block: &[u8]) -> Result<Headers, SpdyError> {
    let mut at = 0usize;
    let mut take = |len: usize| -> Result<&[u8], SpdyError> {
        let end = at
            .checked_add(len)
            .filter(|end| *end <= block.len())
            .ok_or(SpdyError::HeaderBlock("truncated"))?;
        let out = &block[at..end];
        at = end;
        Ok(out)
    };
    let count = u32::from_be_bytes(take(4)?.try_into().unwrap_or_default());
    let mut headers = Headers::new();
    for _ in 0..count {
        let len = u32::from_be_bytes(take(4)?.try_into().unwrap_or_default()) as usize;
        let name = std::str::from_utf8(take(len)?)
            .map_err(|_| SpdyError::HeaderBlock("name is not UTF-8"))?;
        if name.is_empty() {
            return Err(SpdyError::HeaderBlock("empty name"));
        }
        let len = u32::from_be_bytes(take(4)?.try_into().unwrap_or_default()) as usize;
        let value = String::from_utf8_lossy(take(len)?).into_owned();
        headers.push((name.to_ascii_lowercase(), value));
    }
    Ok(headers)
}

/// Serializes a header block (names lower-cased), uncompressed.
pub fn header_block(headers: &Headers) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(headers.len() as u32).to_be_bytes());
    for (name, value) in headers {
        out.extend_from_slice(&(name.len() as u32).to_be_bytes());
        out.extend(name.bytes().map(|b| b.to_ascii_lowercase()));
        out.extend_from_slice(&(value.len() as u32).to_be_bytes());
        out.extend_from_slice(value.as_bytes());
    }
    out
}

/// Encodes frames, compressing header blocks in order.
pub struct FrameWriter {
    deflate: Compress,
}

impl Default for FrameWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl FrameWriter {
    pub fn new() -> Self {
        // Go's framer: zlib.BestCompression with the dictionary.
        let mut deflate = Compress::new(Compression::best(), true);
        // Infallible on a fresh stream: deflateSetDictionary before the first deflate.
        let _ = deflate.set_dictionary(HEADER_DICTIONARY);
        Self { deflate }
    }

    /// Appends `frame` to `out`.
    pub fn encode(&mut self, frame: &Frame, out: &mut Vec<u8>) -> Result<(), SpdyError> {
        match frame {
            Frame::Data {
                stream_id,
                flags,
                data,
            } => {
                if data.len() > MAX_FRAME_LENGTH {
                    return Err(SpdyError::TooLarge(data.len()));
                }
                out.extend_from_slice(&(stream_id & STREAM_ID_MASK).to_be_bytes());
                out.push(*flags);
                out.extend_from_slice(&(data.len() as u32).to_be_bytes()[1..]);
                out.extend_from_slice(data);
                Ok(())
            }
            Frame::SynStream {
                stream_id,
                associated_to,
                priority,
                flags,
                headers,
            } => {
                let mut payload = Vec::new();
                payload.extend_from_slice(&(stream_id & STREAM_ID_MASK).to_be_bytes());
                payload.extend_from_slice(&(associated_to & STREAM_ID_MASK).to_be_bytes());
                payload.extend_from_slice(&[(priority & 0x7) << 5, 0]);
                self.compress(headers, &mut payload)?;
                control(SYN_STREAM, *flags, &payload, out)
            }
            Frame::SynReply {
                stream_id,
                flags,
                headers,
            }
            | Frame::Headers {
                stream_id,
                flags,
                headers,
            } => {
                let mut payload = (stream_id & STREAM_ID_MASK).to_be_bytes().to_vec();
                self.compress(headers, &mut payload)?;
                let frame_type = match frame {
                    Frame::SynReply { .. } => SYN_REPLY,
                    _ => HEADERS,
                };
                control(frame_type, *flags, &payload, out)
            }
            Frame::RstStream { stream_id, status } => control(
                RST_STREAM,
                0,
                &pair(stream_id & STREAM_ID_MASK, *status),
                out,
            ),
            Frame::Settings { flags, entries } => {
                let mut payload = (entries.len() as u32).to_be_bytes().to_vec();
                for (entry_flags, id, value) in entries {
                    let word = (u32::from(*entry_flags) << 24) | (id & 0x00ff_ffff);
                    payload.extend_from_slice(&pair(word, *value));
                }
                control(SETTINGS, *flags, &payload, out)
            }
            Frame::Ping { id } => control(PING, 0, &id.to_be_bytes(), out),
            Frame::GoAway {
                last_good_stream_id,
                status,
            } => control(
                GOAWAY,
                0,
                &pair(last_good_stream_id & STREAM_ID_MASK, *status),
                out,
            ),
            Frame::WindowUpdate { stream_id, delta } => control(
                WINDOW_UPDATE,
                0,
                &pair(stream_id & STREAM_ID_MASK, delta & STREAM_ID_MASK),
                out,
            ),
            Frame::Unknown { frame_type } => control(*frame_type, 0, &[], out),
        }
    }

    /// Deflates a header block onto `out`, ending with a sync flush.
    fn compress(&mut self, headers: &Headers, out: &mut Vec<u8>) -> Result<(), SpdyError> {
        let block = header_block(headers);
        let mut input = block.as_slice();
        let mut chunk = [0u8; 4096];
        loop {
            let (before_in, before_out) = (self.deflate.total_in(), self.deflate.total_out());
            self.deflate
                .compress(input, &mut chunk, FlushCompress::Sync)
                .map_err(|e| SpdyError::Compression(e.to_string()))?;
            let consumed = (self.deflate.total_in() - before_in) as usize;
            let produced = (self.deflate.total_out() - before_out) as usize;
            input = &input[consumed..];
            out.extend_from_slice(&chunk[..produced]);
            // Done once all input is in and the flush left room to spare in the chunk.
            if input.is_empty() && produced < chunk.len() {
                return Ok(());
            }
        }
    }
}

fn pair(a: u32, b: u32) -> [u8; 8] {
    let mut out = [0u8; 8];
    out[..4].copy_from_slice(&a.to_be_bytes());
    out[4..].copy_from_slice(&b.to_be_bytes());
    out
}

fn control(frame_type: u16, flags: u8, payload: &[u8], out: &mut Vec<u8>) -> Result<(), SpdyError> {
    if payload.len() > MAX_FRAME_LENGTH {
        return Err(SpdyError::TooLarge(payload.len()));
    }
    out.extend_from_slice(&(0x8000 | VERSION).to_be_bytes());
    out.extend_from_slice(&frame_type.to_be_bytes());
    out.push(flags);
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    out.extend_from_slice(payload);
    Ok(())
}

/// Headers from `(name, value)` pairs (tests).
#[cfg(test)]
pub fn headers(pairs: &[(&str, &str)]) -> Headers {
    pairs
        .iter()
        .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
        .collect()
}

#[cfg(test)]
mod tests {
    //! Frames captured from Go's framer (`github.com/moby/spdystream/spdy` v0.5.1, the one
    //! kubectl and the API server use), written in this order by one `Framer`.

    use super::*;

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
            .collect()
    }

    /// SYN_STREAM 1 {streamType: error, port: 80, requestID: 0}, SYN_STREAM 3 (same with
    /// streamType data, compressed against the first), SYN_REPLY 1 {}.
    const GO_SYN_1: &str = "800300010000003d0000000100000000000078f9e3c6a7c202253a48f95b044aab4c16060c0c0c9c4590d8ca04a5624603703a2c294a4dcc851635aca9a08800000000ffff";
    const GO_SYN_3: &str = "800300010000001a00000003000000000000826a459502954289840c04000000ffff";
    const GO_REPLY_1: &str = "800300020000000e000000016260606000000000ffff";
    /// DATA 3 FIN "hi", RST_STREAM 3 CANCEL, PING 1, GOAWAY 3 OK, WINDOW_UPDATE 3 65536.
    const GO_MISC: &str = "00000003010000026869800300030000000800000003000000058003000600000004000000018003000700000008000000030000000080030009000000080000000300010000";

    async fn read_all(bytes: Vec<u8>) -> Vec<Frame> {
        let mut reader = FrameReader::new(std::io::Cursor::new(bytes));
        let mut frames = Vec::new();
        while let Some(frame) = reader.read_frame().await.expect("a valid frame") {
            frames.push(frame);
        }
        frames
    }

    #[tokio::test]
    async fn frames_written_by_go_decode_with_one_decompression_context() {
        let mut bytes = unhex(GO_SYN_1);
        bytes.extend(unhex(GO_SYN_3));
        bytes.extend(unhex(GO_REPLY_1));
        bytes.extend(unhex(GO_MISC));
        let frames = read_all(bytes).await;
        let sorted = |mut h: Headers| {
            h.sort();
            h
        };
        let expect = |stream_type| {
            sorted(headers(&[
                ("streamtype", stream_type),
                ("port", "80"),
                ("requestid", "0"),
            ]))
        };
        match &frames[..] {
            [Frame::SynStream {
                stream_id: 1,
                associated_to: 0,
                priority: 0,
                flags: 0,
                headers: h1,
            }, Frame::SynStream {
                stream_id: 3,
                headers: h3,
                ..
            }, Frame::SynReply {
                stream_id: 1,
                flags: 0,
                headers: reply,
            }, rest @ ..] => {
                assert_eq!(sorted(h1.clone()), expect("error"));
                assert_eq!(sorted(h3.clone()), expect("data"));
                assert!(reply.is_empty());
                assert_eq!(header(h1, "requestID"), Some("0"));
                assert_eq!(
                    rest,
                    [
                        Frame::Data {
                            stream_id: 3,
                            flags: FLAG_FIN,
                            data: Bytes::from_static(b"hi")
                        },
                        Frame::RstStream {
                            stream_id: 3,
                            status: CANCEL
                        },
                        Frame::Ping { id: 1 },
                        Frame::GoAway {
                            last_good_stream_id: 3,
                            status: GOAWAY_OK
                        },
                        Frame::WindowUpdate {
                            stream_id: 3,
                            delta: 65536
                        },
                    ]
                );
            }
            other => panic!("unexpected frames {other:?}"),
        }
    }

    #[test]
    fn frames_without_header_blocks_encode_to_the_bytes_go_writes() {
        let mut writer = FrameWriter::new();
        let mut out = Vec::new();
        for frame in [
            Frame::Data {
                stream_id: 3,
                flags: FLAG_FIN,
                data: Bytes::from_static(b"hi"),
            },
            Frame::RstStream {
                stream_id: 3,
                status: CANCEL,
            },
            Frame::Ping { id: 1 },
            Frame::GoAway {
                last_good_stream_id: 3,
                status: GOAWAY_OK,
            },
            Frame::WindowUpdate {
                stream_id: 3,
                delta: 65536,
            },
        ] {
            writer.encode(&frame, &mut out).expect("encode");
        }
        assert_eq!(out, unhex(GO_MISC));
    }

    #[tokio::test]
    async fn header_blocks_round_trip_across_frames_of_one_connection() {
        let mut writer = FrameWriter::new();
        let mut out = Vec::new();
        let many: Headers = (0..200)
            .map(|i| (format!("x-header-{i}"), "v".repeat(i)))
            .collect();
        let frames = vec![
            Frame::SynStream {
                stream_id: 1,
                associated_to: 0,
                priority: 2,
                flags: FLAG_FIN | FLAG_UNIDIRECTIONAL,
                headers: headers(&[("streamtype", "error"), ("port", "8080")]),
            },
            Frame::SynReply {
                stream_id: 1,
                flags: 0,
                headers: Headers::new(),
            },
            Frame::Headers {
                stream_id: 1,
                flags: FLAG_FIN,
                headers: many,
            },
            Frame::SynReply {
                stream_id: 3,
                flags: FLAG_FIN,
                headers: headers(&[("multi", "a\0b")]),
            },
            Frame::Settings {
                flags: 1,
                entries: vec![(1, 7, 65536), (0, 4, 100)],
            },
            Frame::Data {
                stream_id: 5,
                flags: 0,
                data: Bytes::from(vec![7u8; 100_000]),
            },
            Frame::Unknown { frame_type: 10 },
        ];
        for frame in &frames {
            writer.encode(frame, &mut out).expect("encode");
        }
        assert_eq!(read_all(out).await, frames);
    }

    #[tokio::test]
    async fn a_fresh_context_starts_with_the_zlib_header_and_dictionary_id_go_writes() {
        let mut writer = FrameWriter::new();
        let mut out = Vec::new();
        let syn = Frame::SynStream {
            stream_id: 1,
            associated_to: 0,
            priority: 0,
            flags: 0,
            headers: headers(&[("streamtype", "error"), ("port", "80"), ("requestid", "0")]),
        };
        writer.encode(&syn, &mut out).expect("encode");
        // Control header (8), ids and priority (10), then zlib: CMF/FLG with FDICT set and
        // the dictionary's Adler-32, the same bytes as Go's first block (the deflate data,
        // hence the length, may differ: Go's compressor is not zlib).
        let go = unhex(GO_SYN_1);
        assert_eq!(out[..5], go[..5]);
        assert_eq!(out[8..8 + 10 + 6], go[8..8 + 10 + 6]);
        let reply = Frame::SynReply {
            stream_id: 1,
            flags: 0,
            headers: Headers::new(),
        };
        writer.encode(&reply, &mut out).expect("encode");
        assert_eq!(read_all(out).await, [syn, reply]);
    }

    #[tokio::test]
    async fn malformed_input_is_an_error_not_a_panic() {
        // Version 2.
        let mut reader = FrameReader::new(std::io::Cursor::new(unhex("800200060000000400000001")));
        assert!(matches!(
            reader.read_frame().await,
            Err(SpdyError::Version(2))
        ));
        // A RST_STREAM with a 4-byte payload.
        let mut reader = FrameReader::new(std::io::Cursor::new(unhex("800300030000000400000001")));
        assert!(matches!(
            reader.read_frame().await,
            Err(SpdyError::Length { .. })
        ));
        // A SYN_STREAM whose header block is not zlib.
        let mut reader = FrameReader::new(std::io::Cursor::new(unhex(
            "800300010000000e0000000100000000000001020304",
        )));
        assert!(reader.read_frame().await.is_err());
        // A frame cut short.
        let mut reader = FrameReader::new(std::io::Cursor::new(unhex("0000000300000010aabb")));
        assert!(matches!(reader.read_frame().await, Err(SpdyError::Io(_))));
        // Header blocks that lie about lengths.
        assert!(parse_header_block(&unhex("00000001000000ff")).is_err());
        assert!(parse_header_block(&unhex("0000000200000001610000000162")).is_err());
        assert!(parse_header_block(&unhex("000000010000000000000000")).is_err());
    }
}
