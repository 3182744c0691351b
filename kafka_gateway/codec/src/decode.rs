//! Record batch v2 decoding into Arrow-layout buffers (no Python here: runs without the GIL).
//!
//! Validation, all before any record is handed out (the whole input is refused or accepted):
//! - framing: empty input, truncation anywhere, a batch length below the v2 header size or past
//!   the bytes present, trailing bytes that are no whole batch: CORRUPT_MESSAGE;
//! - magic other than 2: UNSUPPORTED_FOR_MESSAGE_FORMAT; CRC-32C mismatch: CORRUPT_MESSAGE;
//! - codec ids 5-7: UNSUPPORTED_COMPRESSION_TYPE;
//! - the declared record count summed over batches above `max_records`: RECORD_LIST_TOO_LARGE
//!   (checked before decompressing);
//! - the records sections (after decompression) adding up to more than `max_bytes`:
//!   MESSAGE_TOO_LARGE, detected while decompressing with a bounded output;
//! - record structure: negative record count, lastOffsetDelta != recordCount - 1 and offset deltas
//!   other than 0..n-1 (strict mode; otherwise deltas strictly increasing within
//!   0..=lastOffsetDelta), fewer records than declared, bytes left after the declared count, a
//!   record whose length disagrees with its fields, overlong varints, negative lengths other
//!   than -1 (and -1 for a header key), header keys that are not UTF-8: INVALID_RECORD.
//!
//! Allocation sizes come from bytes actually present (or the decompressed output, itself
//! bounded), never from a declared length or count alone.

use crate::compression::{decompress, Codec};
use crate::error::{corrupt, invalid, too_large, Code, CodecError, Result};
use crate::varint::{Cursor, ReadError};

/// Bytes before `batchLength` counts: baseOffset and batchLength.
pub const LOG_OVERHEAD: usize = 12;
/// The v2 batch header, from baseOffset through recordCount.
pub const HEADER_LEN: usize = 61;
const MAGIC_AT: usize = 16;
const CRC_AT: usize = 17;
const ATTRIBUTES_AT: usize = 21;
/// The smallest encoded record: length, attributes, timestampDelta, offsetDelta, keyLength,
/// valueLength, headersCount, one byte each.
const MIN_RECORD_LEN: usize = 7;

pub const TIMESTAMP_TYPE_BIT: i16 = 0x08;

/// An Arrow variable-size binary column under construction (int32 offsets, validity bitmap).
pub struct BinaryColumn {
    pub offsets: Vec<i32>,
    pub data: Vec<u8>,
    pub validity: Vec<u8>,
    pub null_count: usize,
    len: usize,
}

impl BinaryColumn {
    pub fn with_capacity(items: usize, bytes: usize) -> Self {
        let mut offsets = Vec::with_capacity(items + 1);
        offsets.push(0);
        BinaryColumn {
            offsets,
            data: Vec::with_capacity(bytes),
            validity: Vec::with_capacity(items.div_ceil(8)),
            null_count: 0,
            len: 0,
        }
    }

    #[inline]
    pub fn push(&mut self, item: Option<&[u8]>) -> Result<()> {
        if self.len.is_multiple_of(8) {
            self.validity.push(0);
        }
        match item {
            Some(bytes) => {
                if let Some(last) = self.validity.last_mut() {
                    *last |= 1 << (self.len % 8);
                }
                self.data.extend_from_slice(bytes);
            }
            None => self.null_count += 1,
        }
        let end = i32::try_from(self.data.len())
            .map_err(|_| too_large("a column holds more than 2 GiB of bytes"))?;
        self.offsets.push(end);
        self.len += 1;
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.len
    }
}

/// What a batch header says, reported once per batch.
#[derive(Debug, Clone)]
pub struct BatchInfo {
    pub base_offset: i64,
    pub partition_leader_epoch: i32,
    pub attributes: i16,
    pub last_offset_delta: i32,
    pub base_timestamp: i64,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub record_count: i32,
    pub codec: Codec,
    pub size_bytes: usize,
}

/// Every record of every batch, as Arrow buffers.
pub struct Decoded {
    pub key: BinaryColumn,
    pub value: BinaryColumn,
    pub timestamp: Vec<i64>,
    pub offset: Vec<i64>,
    /// List offsets into the header columns, one more than there are records.
    pub header_offsets: Vec<i32>,
    pub header_key: BinaryColumn,
    pub header_value: BinaryColumn,
    pub batches: Vec<BatchInfo>,
}

#[derive(Clone, Copy)]
pub struct Limits {
    pub max_records: usize,
    pub max_bytes: usize,
    /// Produce-request rules: offset deltas exactly 0..n-1, lastOffsetDelta = n - 1, n > 0.
    pub strict_offsets: bool,
}

#[inline]
fn be_i16(b: &[u8], at: usize) -> Result<i16> {
    b.get(at..at + 2)
        .and_then(|s| s.try_into().ok())
        .map(i16::from_be_bytes)
        .ok_or_else(|| corrupt("truncated batch header"))
}

#[inline]
fn be_i32(b: &[u8], at: usize) -> Result<i32> {
    b.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map(i32::from_be_bytes)
        .ok_or_else(|| corrupt("truncated batch header"))
}

#[inline]
fn be_i64(b: &[u8], at: usize) -> Result<i64> {
    b.get(at..at + 8)
        .and_then(|s| s.try_into().ok())
        .map(i64::from_be_bytes)
        .ok_or_else(|| corrupt("truncated batch header"))
}

/// Decodes one or more concatenated v2 batches.
pub fn decode(data: &[u8], limits: Limits) -> Result<Decoded> {
    if data.is_empty() {
        return Err(corrupt("no record batch in an empty records field"));
    }
    let mut out = Decoded {
        key: BinaryColumn::with_capacity(0, 0),
        value: BinaryColumn::with_capacity(0, 0),
        timestamp: Vec::new(),
        offset: Vec::new(),
        header_offsets: vec![0],
        header_key: BinaryColumn::with_capacity(0, 0),
        header_value: BinaryColumn::with_capacity(0, 0),
        batches: Vec::new(),
    };
    let mut pos = 0usize;
    let mut declared_records = 0usize;
    let mut budget = limits.max_bytes;
    let mut first = true;
    while pos < data.len() {
        let rest = data.get(pos..).unwrap_or_default();
        let index = out.batches.len();
        let batch_len =
            frame_batch(rest).map_err(|e| e.context(format!("batch {index} at byte {pos}")))?;
        let batch = rest.get(..batch_len).unwrap_or_default();
        let info = read_header(batch).map_err(|e| e.context(format!("batch {index}")))?;
        declared_records =
            declared_records.saturating_add(usize::try_from(info.record_count).unwrap_or(0));
        if declared_records > limits.max_records {
            return Err(CodecError::new(
                Code::RecordListTooLarge,
                format!("more than the {} records allowed", limits.max_records),
            ));
        }
        let section = batch.get(HEADER_LEN..).unwrap_or_default();
        let decompressed;
        let records: &[u8] = if info.codec == Codec::None {
            if section.len() > budget {
                return Err(too_large(format!(
                    "records take more than the {} bytes allowed",
                    limits.max_bytes
                )));
            }
            section
        } else {
            decompressed = decompress(info.codec, section, budget).map_err(|e| {
                let e = if e.code == Code::MessageTooLarge {
                    too_large(format!(
                        "records decompress to more than the {} bytes allowed",
                        limits.max_bytes
                    ))
                } else {
                    e
                };
                e.context(format!("batch {index}"))
            })?;
            &decompressed
        };
        budget -= records.len();
        if first {
            reserve(&mut out, &info, records.len());
            first = false;
        }
        decode_records(records, &info, limits.strict_offsets, &mut out)
            .map_err(|e| e.context(format!("batch {index}")))?;
        out.batches.push(info);
        pos += batch_len;
    }
    Ok(out)
}

/// Checks the framing of the batch at the start of `rest` and returns its size in bytes.
fn frame_batch(rest: &[u8]) -> Result<usize> {
    if rest.len() < LOG_OVERHEAD {
        return Err(corrupt(format!(
            "truncated batch: {} bytes left, a batch header takes {HEADER_LEN}",
            rest.len()
        )));
    }
    let batch_length = be_i32(rest, 8)?;
    if let Some(&magic) = rest.get(MAGIC_AT) {
        if magic != 2 {
            return Err(CodecError::new(
                Code::UnsupportedForMessageFormat,
                format!("magic {magic}: only record batch v2 (magic 2) is supported"),
            ));
        }
    }
    let min_length = (HEADER_LEN - LOG_OVERHEAD) as i32;
    if batch_length < min_length {
        return Err(corrupt(format!(
            "batchLength {batch_length} is below the v2 minimum of {min_length}"
        )));
    }
    let available = rest.len() - LOG_OVERHEAD;
    let declared = batch_length as usize;
    if declared > available {
        return Err(corrupt(format!(
            "batchLength {batch_length} but only {available} bytes follow it"
        )));
    }
    Ok(LOG_OVERHEAD + declared)
}

/// Reads and checks the header of a framed batch (CRC, codec, counts).
fn read_header(batch: &[u8]) -> Result<BatchInfo> {
    let stored_crc = be_i32(batch, CRC_AT)? as u32;
    let computed = crc32c::crc32c(batch.get(ATTRIBUTES_AT..).unwrap_or_default());
    if stored_crc != computed {
        return Err(corrupt(format!(
            "CRC-32C mismatch: batch says {stored_crc:#010x}, bytes give {computed:#010x}"
        )));
    }
    let attributes = be_i16(batch, ATTRIBUTES_AT)?;
    let codec_id = (attributes & 0x07) as u8;
    let codec = Codec::from_id(codec_id).ok_or_else(|| {
        CodecError::new(
            Code::UnsupportedCompressionType,
            format!("unknown compression codec id {codec_id}"),
        )
    })?;
    let info = BatchInfo {
        base_offset: be_i64(batch, 0)?,
        partition_leader_epoch: be_i32(batch, 12)?,
        attributes,
        last_offset_delta: be_i32(batch, 23)?,
        base_timestamp: be_i64(batch, 27)?,
        max_timestamp: be_i64(batch, 35)?,
        producer_id: be_i64(batch, 43)?,
        producer_epoch: be_i16(batch, 51)?,
        base_sequence: be_i32(batch, 53)?,
        record_count: be_i32(batch, 57)?,
        codec,
        size_bytes: batch.len(),
    };
    if info.record_count < 0 {
        return Err(invalid(format!(
            "negative record count {}",
            info.record_count
        )));
    }
    Ok(info)
}

/// Reserves output room for the first batch from what its bytes can hold at most.
fn reserve(out: &mut Decoded, info: &BatchInfo, records_len: usize) {
    let n = (info.record_count as usize).min(records_len / MIN_RECORD_LEN);
    out.key.offsets.reserve(n);
    out.key.validity.reserve(n.div_ceil(8));
    out.value.offsets.reserve(n);
    out.value.validity.reserve(n.div_ceil(8));
    out.value.data.reserve(records_len);
    out.timestamp.reserve(n);
    out.offset.reserve(n);
    out.header_offsets.reserve(n);
}

#[inline]
fn rec_err(e: ReadError, what: &str) -> CodecError {
    match e {
        ReadError::Truncated => invalid(format!("record truncated in its {what}")),
        ReadError::Overflow => invalid(format!("varint overflow in the record's {what}")),
    }
}

/// A length-prefixed byte field: -1 is null, other negatives are refused.
#[inline]
fn nullable_bytes<'a>(c: &mut Cursor<'a>, what: &str) -> Result<Option<&'a [u8]>> {
    let len = c.varint().map_err(|e| rec_err(e, what))?;
    if len == -1 {
        return Ok(None);
    }
    if len < 0 {
        return Err(invalid(format!("negative {what} length {len}")));
    }
    c.take(len as usize).map(Some).map_err(|e| rec_err(e, what))
}

fn decode_records(records: &[u8], info: &BatchInfo, strict: bool, out: &mut Decoded) -> Result<()> {
    let count = info.record_count;
    if strict {
        if count == 0 {
            return Err(invalid("a batch with no records"));
        }
        if info.last_offset_delta != count - 1 {
            return Err(invalid(format!(
                "lastOffsetDelta {} disagrees with recordCount {count}",
                info.last_offset_delta
            )));
        }
    } else if count > 0 && info.last_offset_delta < count - 1 {
        return Err(invalid(format!(
            "lastOffsetDelta {} is too small for recordCount {count}",
            info.last_offset_delta
        )));
    }
    let log_append = info.attributes & TIMESTAMP_TYPE_BIT != 0;
    let mut cursor = Cursor::new(records);
    let mut previous_delta: i64 = -1;
    for i in 0..count {
        if cursor.remaining() == 0 {
            return Err(invalid(format!(
                "recordCount says {count} records but the bytes hold only {i}"
            )));
        }
        decode_record(
            &mut cursor,
            info,
            strict,
            log_append,
            i,
            &mut previous_delta,
            out,
        )
        .map_err(|e| e.context(format!("record {i}")))?;
    }
    if cursor.remaining() != 0 {
        return Err(invalid(format!(
            "{} bytes left after the {count} records recordCount declares",
            cursor.remaining()
        )));
    }
    Ok(())
}

#[inline]
fn decode_record(
    cursor: &mut Cursor<'_>,
    info: &BatchInfo,
    strict: bool,
    log_append: bool,
    index: i32,
    previous_delta: &mut i64,
    out: &mut Decoded,
) -> Result<()> {
    let length = cursor.varint().map_err(|e| rec_err(e, "length"))?;
    if length < 0 {
        return Err(invalid(format!("negative record length {length}")));
    }
    let body = cursor.take(length as usize).map_err(|_| {
        invalid(format!(
            "record length {length} but only {} bytes left",
            cursor.remaining()
        ))
    })?;
    let mut c = Cursor::new(body);
    c.u8().map_err(|e| rec_err(e, "attributes"))?;
    let timestamp_delta = c.varlong().map_err(|e| rec_err(e, "timestampDelta"))?;
    let offset_delta = c.varint().map_err(|e| rec_err(e, "offsetDelta"))?;
    if strict {
        if offset_delta != index {
            return Err(invalid(format!(
                "offsetDelta {offset_delta} where {index} was expected"
            )));
        }
    } else if (offset_delta as i64) <= *previous_delta || offset_delta > info.last_offset_delta {
        return Err(invalid(format!(
            "offsetDelta {offset_delta} after {} (lastOffsetDelta {})",
            *previous_delta, info.last_offset_delta
        )));
    }
    *previous_delta = offset_delta as i64;
    let key = nullable_bytes(&mut c, "key")?;
    let value = nullable_bytes(&mut c, "value")?;
    let header_count = c.varint().map_err(|e| rec_err(e, "headersCount"))?;
    if header_count < 0 {
        return Err(invalid(format!("negative header count {header_count}")));
    }
    for _ in 0..header_count {
        let hkey =
            nullable_bytes(&mut c, "header key")?.ok_or_else(|| invalid("a null header key"))?;
        if std::str::from_utf8(hkey).is_err() {
            return Err(invalid("a header key that is not valid UTF-8"));
        }
        let hvalue = nullable_bytes(&mut c, "header value")?;
        out.header_key.push(Some(hkey))?;
        out.header_value.push(hvalue)?;
    }
    if c.remaining() != 0 {
        return Err(invalid(format!(
            "record length {length} but its fields end {} bytes earlier",
            c.remaining()
        )));
    }
    let header_end =
        i32::try_from(out.header_key.len()).map_err(|_| too_large("more than 2^31 headers"))?;
    out.header_offsets.push(header_end);
    out.key.push(key)?;
    out.value.push(value)?;
    out.timestamp.push(if log_append {
        info.max_timestamp
    } else {
        info.base_timestamp.wrapping_add(timestamp_delta)
    });
    out.offset
        .push(info.base_offset.wrapping_add(offset_delta as i64));
    Ok(())
}
