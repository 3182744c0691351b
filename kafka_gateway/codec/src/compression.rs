//! The four compression codecs of record batch v2, written and read as Kafka's clients do.
//!
//! Decompression is bounded: output never grows past `limit + 1` bytes (a stream that would is
//! refused with MESSAGE_TOO_LARGE as soon as it crosses the limit), so a compression bomb costs at
//! most about `limit` bytes of memory. Codec-internal buffers are bounded too: LZ4 blocks are at
//! most a few MiB by the frame format, zstd's window is capped (see `ZSTD_MIN_WINDOW_LOG`).
//!
//! - gzip: a gzip stream; concatenated members are read as one stream.
//! - snappy: xerial snappy-java framing (`\x82SNAPPY\x00`, version, compatible version, then
//!   blocks of `[int32 big-endian length][raw snappy block]`), as Java's client and librdkafka
//!   write it, or a single raw snappy block; written with the xerial framing, 32 KiB blocks.
//! - lz4: the LZ4 frame format, any checksum flags; written as Kafka's KafkaLZ4BlockOutputStream
//!   does (64 KiB independent blocks, no checksums, no content size).
//! - zstd: zstd frames, with or without content size; written at level 3 (Kafka's default).

use std::io::{self, Read, Write};

use crate::error::{corrupt, too_large, CodecError, Result};

/// Compression codec ids of the batch attributes (bits 0-2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    None = 0,
    Gzip = 1,
    Snappy = 2,
    Lz4 = 3,
    Zstd = 4,
}

impl Codec {
    pub fn from_id(id: u8) -> Option<Codec> {
        match id {
            0 => Some(Codec::None),
            1 => Some(Codec::Gzip),
            2 => Some(Codec::Snappy),
            3 => Some(Codec::Lz4),
            4 => Some(Codec::Zstd),
            _ => None,
        }
    }

    pub fn from_name(name: &str) -> Option<Codec> {
        match name {
            "none" => Some(Codec::None),
            "gzip" => Some(Codec::Gzip),
            "snappy" => Some(Codec::Snappy),
            "lz4" => Some(Codec::Lz4),
            "zstd" => Some(Codec::Zstd),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Codec::None => "none",
            Codec::Gzip => "gzip",
            Codec::Snappy => "snappy",
            Codec::Lz4 => "lz4",
            Codec::Zstd => "zstd",
        }
    }
}

/// snappy-java's stream header magic.
const XERIAL_MAGIC: [u8; 8] = [0x82, b'S', b'N', b'A', b'P', b'P', b'Y', 0];
/// The header: magic, then version and compatible version (both int32 1 as snappy-java writes).
const XERIAL_HEADER_LEN: usize = 16;
/// snappy-java's default block size, which Kafka's producer uses.
const XERIAL_BLOCK: usize = 32 * 1024;
/// Kafka's default gzip level (Deflater.DEFAULT_COMPRESSION).
const GZIP_LEVEL: u32 = 6;
/// Kafka's default zstd level.
const ZSTD_LEVEL: i32 = 3;
/// The smallest zstd window accepted whatever the limit: 8 MiB, above the windows that zstd's
/// levels up to 19 choose for streams (so every frame a client writes at normal levels decodes),
/// while a frame asking for more (up to zstd's 2 GiB) is refused before allocating it.
const ZSTD_MIN_WINDOW_LOG: u32 = 23;
/// zstd's default decoder window limit (128 MiB), the largest window ever accepted.
const ZSTD_MAX_WINDOW_LOG: u32 = 27;

/// Compresses `data` with `codec` (not `Codec::None`).
pub fn compress(codec: Codec, data: &[u8]) -> io::Result<Vec<u8>> {
    match codec {
        Codec::None => Ok(data.to_vec()),
        Codec::Gzip => {
            let out = Vec::with_capacity(data.len() / 2 + 64);
            let mut enc = flate2::write::GzEncoder::new(out, flate2::Compression::new(GZIP_LEVEL));
            enc.write_all(data)?;
            enc.finish()
        }
        Codec::Snappy => snappy_xerial_compress(data),
        Codec::Lz4 => {
            let info = lz4_flex::frame::FrameInfo::new()
                .block_size(lz4_flex::frame::BlockSize::Max64KB)
                .block_mode(lz4_flex::frame::BlockMode::Independent)
                .block_checksums(false)
                .content_checksum(false);
            let out = Vec::with_capacity(data.len() / 2 + 64);
            let mut enc = lz4_flex::frame::FrameEncoder::with_frame_info(info, out);
            enc.write_all(data)?;
            enc.finish().map_err(io::Error::other)
        }
        Codec::Zstd => zstd::bulk::compress(data, ZSTD_LEVEL),
    }
}

fn snappy_xerial_compress(data: &[u8]) -> io::Result<Vec<u8>> {
    let mut out =
        Vec::with_capacity(XERIAL_HEADER_LEN + snap::raw::max_compress_len(data.len()) + 64);
    out.extend_from_slice(&XERIAL_MAGIC);
    out.extend_from_slice(&1i32.to_be_bytes());
    out.extend_from_slice(&1i32.to_be_bytes());
    let mut encoder = snap::raw::Encoder::new();
    for chunk in data.chunks(XERIAL_BLOCK) {
        let len_at = out.len();
        out.extend_from_slice(&[0u8; 4]);
        let start = out.len();
        out.resize(start + snap::raw::max_compress_len(chunk.len()), 0);
        let n = encoder
            .compress(chunk, &mut out[start..])
            .map_err(io::Error::other)?;
        out.truncate(start + n);
        let n32 = i32::try_from(n).map_err(io::Error::other)?;
        out[len_at..start].copy_from_slice(&n32.to_be_bytes());
    }
    Ok(out)
}

/// Decompresses a batch's records section, refusing output over `limit` bytes.
pub fn decompress(codec: Codec, input: &[u8], limit: usize) -> Result<Vec<u8>> {
    let name = codec.name();
    let result = match codec {
        Codec::None => {
            if input.len() > limit {
                return Err(over_limit(limit));
            }
            return Ok(input.to_vec());
        }
        Codec::Gzip => read_bounded(
            flate2::read::MultiGzDecoder::new(input),
            limit,
            gzip_size_hint(input),
        ),
        Codec::Snappy => return snappy_decompress(input, limit),
        Codec::Lz4 => read_bounded(
            lz4_flex::frame::FrameDecoder::new(input),
            limit,
            input.len().saturating_mul(4),
        ),
        Codec::Zstd => {
            let mut dec = zstd::stream::read::Decoder::with_buffer(input)
                .map_err(|e| corrupt(format!("zstd: {e}")))?;
            dec.window_log_max(zstd_window_log(limit))
                .map_err(|e| corrupt(format!("zstd: {e}")))?;
            read_bounded(dec, limit, zstd_size_hint(input))
        }
    };
    result.map_err(|e| match e {
        Bounded::TooLarge => over_limit(limit),
        Bounded::Io(e) => corrupt(format!("{name} decompression failed: {e}")),
    })
}

fn zstd_window_log(limit: usize) -> u32 {
    let needed = usize::BITS - limit.max(1).leading_zeros();
    needed.clamp(ZSTD_MIN_WINDOW_LOG, ZSTD_MAX_WINDOW_LOG)
}

fn over_limit(limit: usize) -> CodecError {
    too_large(format!(
        "records decompress to more than the {limit} bytes allowed"
    ))
}

enum Bounded {
    TooLarge,
    Io(io::Error),
}

/// Reads `r` to its end into a vector that never holds more than `limit + 1` bytes.
///
/// `size_hint` (a size the stream declares, untrusted) only sets the first reservation, capped
/// at the limit; memory is zero-filled just ahead of what was read, so a stream that declares
/// much and delivers little touches little.
fn read_bounded<R: Read>(
    mut r: R,
    limit: usize,
    size_hint: usize,
) -> std::result::Result<Vec<u8>, Bounded> {
    let cap = limit.saturating_add(1);
    let mut out: Vec<u8> =
        Vec::with_capacity(size_hint.saturating_add(1).clamp(4096, 64 << 20).min(cap));
    let mut filled = 0usize;
    loop {
        if filled == out.len() {
            if filled >= cap {
                return Err(Bounded::TooLarge);
            }
            let step = (filled / 2).clamp(64 << 10, 4 << 20);
            let new_len = filled.saturating_add(step).min(cap);
            if out.capacity() < new_len {
                let target = out.capacity().saturating_mul(2).max(new_len).min(cap);
                out.reserve_exact(target - out.len());
            }
            out.resize(new_len, 0);
        }
        let dst = out.get_mut(filled..).unwrap_or_default();
        match r.read(dst) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Bounded::Io(e)),
        }
    }
    if filled > limit {
        return Err(Bounded::TooLarge);
    }
    out.truncate(filled);
    Ok(out)
}

/// The size a gzip stream's last member declares (ISIZE, the size modulo 2^32).
fn gzip_size_hint(input: &[u8]) -> usize {
    input
        .len()
        .checked_sub(4)
        .and_then(|at| input.get(at..))
        .and_then(|b| b.try_into().ok())
        .map(|b| u32::from_le_bytes(b) as usize)
        .unwrap_or(input.len().saturating_mul(4))
}

/// The content size a zstd frame header declares, if any.
fn zstd_size_hint(input: &[u8]) -> usize {
    match zstd::zstd_safe::get_frame_content_size(input) {
        Ok(Some(n)) => usize::try_from(n).unwrap_or(usize::MAX),
        _ => input.len().saturating_mul(4),
    }
}

/// Reads snappy-java's framing when the input starts with its magic, else one raw block.
fn snappy_decompress(input: &[u8], limit: usize) -> Result<Vec<u8>> {
    if input.len() >= XERIAL_MAGIC.len() && input[..XERIAL_MAGIC.len()] == XERIAL_MAGIC {
        let mut rest = input
            .get(XERIAL_HEADER_LEN..)
            .ok_or_else(|| corrupt("snappy: truncated xerial header"))?;
        let mut out: Vec<u8> = Vec::new();
        let mut decoder = snap::raw::Decoder::new();
        while !rest.is_empty() {
            let len_bytes: [u8; 4] = rest
                .get(..4)
                .and_then(|b| b.try_into().ok())
                .ok_or_else(|| corrupt("snappy: truncated xerial block length"))?;
            let len = i32::from_be_bytes(len_bytes);
            let block = usize::try_from(len)
                .ok()
                .and_then(|n| rest.get(4..4 + n))
                .ok_or_else(|| {
                    corrupt(format!("snappy: xerial block of {len} bytes past the end"))
                })?;
            rest = &rest[4 + block.len()..];
            snappy_block_into(&mut decoder, block, &mut out, limit)?;
        }
        Ok(out)
    } else {
        let mut out = Vec::new();
        snappy_block_into(&mut snap::raw::Decoder::new(), input, &mut out, limit)?;
        Ok(out)
    }
}

/// Appends one raw snappy block to `out`, checking its declared length against the limit first.
fn snappy_block_into(
    decoder: &mut snap::raw::Decoder,
    block: &[u8],
    out: &mut Vec<u8>,
    limit: usize,
) -> Result<()> {
    let n = snap::raw::decompress_len(block).map_err(|e| corrupt(format!("snappy: {e}")))?;
    let start = out.len();
    if n > limit.saturating_sub(start) {
        return Err(over_limit(limit));
    }
    out.resize(start + n, 0);
    let written = decoder
        .decompress(block, &mut out[start..])
        .map_err(|e| corrupt(format!("snappy: {e}")))?;
    if written != n {
        return Err(corrupt("snappy: block shorter than its declared length"));
    }
    Ok(())
}
