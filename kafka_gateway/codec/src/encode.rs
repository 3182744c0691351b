//! Record batch v2 encoding from Arrow buffers (no Python here: runs without the GIL).
//!
//! The inputs are raw Arrow buffers with an array offset, as pyarrow hands them out: every
//! buffer is checked to be long enough for the slice it describes, and every binary offset to
//! stay inside its data buffer, before a byte is read. A bad input is an `EncodeError` (the
//! caller's bug, raised as ValueError), never a panic or an out-of-bounds read.

use std::fmt;

use crate::compression::{compress, Codec};
use crate::decode::{HEADER_LEN, LOG_OVERHEAD, TIMESTAMP_TYPE_BIT};
use crate::varint::{put_varint, put_varlong, varint_size, varlong_size};

#[derive(Debug)]
pub struct EncodeError(pub String);

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

type Result<T> = std::result::Result<T, EncodeError>;

fn fail<T>(message: impl Into<String>) -> Result<T> {
    Err(EncodeError(message.into()))
}

/// An Arrow validity bitmap at an array offset; `None` means all valid.
#[derive(Clone, Copy)]
pub struct Validity<'a> {
    pub bits: Option<&'a [u8]>,
    pub offset: usize,
}

impl Validity<'_> {
    fn check(&self, len: usize, what: &str) -> Result<()> {
        if let Some(bits) = self.bits {
            let needed = self.offset.saturating_add(len).div_ceil(8);
            if bits.len() < needed {
                return fail(format!(
                    "{what}: validity bitmap of {} bytes, {needed} needed",
                    bits.len()
                ));
            }
        }
        Ok(())
    }

    #[inline]
    pub(crate) fn is_valid(&self, i: usize) -> bool {
        match self.bits {
            None => true,
            Some(bits) => {
                let at = self.offset + i;
                bits.get(at / 8).is_some_and(|b| (b >> (at % 8)) & 1 == 1)
            }
        }
    }
}

#[inline]
fn le_i32(buf: &[u8], index: usize) -> i32 {
    buf.get(index * 4..index * 4 + 4)
        .and_then(|s| s.try_into().ok())
        .map(i32::from_le_bytes)
        .unwrap_or(-1)
}

#[inline]
fn le_i64(buf: &[u8], index: usize) -> i64 {
    buf.get(index * 8..index * 8 + 8)
        .and_then(|s| s.try_into().ok())
        .map(i64::from_le_bytes)
        .unwrap_or(0)
}

/// An Arrow int64 array without nulls.
pub struct Int64In<'a> {
    pub data: &'a [u8],
    pub offset: usize,
}

impl Int64In<'_> {
    fn check(&self, len: usize, what: &str) -> Result<()> {
        let needed = self.offset.saturating_add(len).saturating_mul(8);
        if self.data.len() < needed {
            return fail(format!(
                "{what}: data buffer of {} bytes, {needed} needed",
                self.data.len()
            ));
        }
        Ok(())
    }

    #[inline]
    fn get(&self, i: usize) -> i64 {
        le_i64(self.data, self.offset + i)
    }
}

/// An Arrow binary (or utf8) array: int32 offsets into a data buffer.
#[derive(Clone, Copy)]
pub struct BinaryIn<'a> {
    pub validity: Validity<'a>,
    pub offsets: &'a [u8],
    pub data: &'a [u8],
    pub offset: usize,
    pub len: usize,
}

impl<'a> BinaryIn<'a> {
    fn check(&self, what: &str) -> Result<()> {
        self.validity.check(self.len, what)?;
        if self.len > 0 {
            let needed = self
                .offset
                .saturating_add(self.len)
                .saturating_add(1)
                .saturating_mul(4);
            if self.offsets.len() < needed {
                return fail(format!(
                    "{what}: offsets buffer of {} bytes, {needed} needed",
                    self.offsets.len()
                ));
            }
        }
        Ok(())
    }

    /// Item `i` (`None` when null), its offsets checked against the data buffer.
    #[inline]
    fn get(&self, i: usize, what: &str) -> Result<Option<&'a [u8]>> {
        if i >= self.len {
            return fail(format!(
                "{what}: index {i} past the array's {} items",
                self.len
            ));
        }
        if !self.validity.is_valid(i) {
            return Ok(None);
        }
        let start = le_i32(self.offsets, self.offset + i);
        let end = le_i32(self.offsets, self.offset + i + 1);
        if start < 0 || end < start {
            return fail(format!("{what}: bad offsets {start}..{end} at item {i}"));
        }
        match self.data.get(start as usize..end as usize) {
            Some(bytes) => Ok(Some(bytes)),
            None => fail(format!(
                "{what}: offsets {start}..{end} past the {}-byte data buffer",
                self.data.len()
            )),
        }
    }

    /// The bytes the slice's offsets span, a bound for reserving output.
    fn span(&self) -> usize {
        if self.len == 0 {
            return 0;
        }
        let start = le_i32(self.offsets, self.offset);
        let end = le_i32(self.offsets, self.offset + self.len);
        usize::try_from(end.saturating_sub(start))
            .unwrap_or(0)
            .min(self.data.len())
    }
}

/// An Arrow list<struct<key: string, value: binary>> array; `key` and `value` are the struct's
/// fields with the struct's own offset applied, indexed by the list offsets.
pub struct HeadersIn<'a> {
    pub validity: Validity<'a>,
    pub list_offsets: &'a [u8],
    pub offset: usize,
    pub key: BinaryIn<'a>,
    pub value: BinaryIn<'a>,
}

impl HeadersIn<'_> {
    fn check(&self, len: usize) -> Result<()> {
        self.validity.check(len, "headers")?;
        if len > 0 {
            let needed = self
                .offset
                .saturating_add(len)
                .saturating_add(1)
                .saturating_mul(4);
            if self.list_offsets.len() < needed {
                return fail(format!(
                    "headers: offsets buffer of {} bytes, {needed} needed",
                    self.list_offsets.len()
                ));
            }
        }
        self.key.check("header keys")?;
        self.value.check("header values")
    }

    /// The range of header entries of record `i` (empty for a null list).
    #[inline]
    fn range(&self, i: usize) -> Result<std::ops::Range<usize>> {
        if !self.validity.is_valid(i) {
            return Ok(0..0);
        }
        let start = le_i32(self.list_offsets, self.offset + i);
        let end = le_i32(self.list_offsets, self.offset + i + 1);
        if start < 0 || end < start || end as usize > self.key.len || end as usize > self.value.len
        {
            return fail(format!(
                "headers: bad list offsets {start}..{end} at record {i}"
            ));
        }
        Ok(start as usize..end as usize)
    }
}

pub struct RecordsIn<'a> {
    pub len: usize,
    pub offsets: Int64In<'a>,
    pub timestamps: Int64In<'a>,
    pub key: BinaryIn<'a>,
    pub value: BinaryIn<'a>,
    pub headers: HeadersIn<'a>,
}

pub struct BatchParams {
    pub base_offset: i64,
    pub partition_leader_epoch: i32,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub log_append_time: bool,
    pub codec: Codec,
}

impl RecordsIn<'_> {
    fn check(&self) -> Result<()> {
        if self.len == 0 {
            return fail("a record batch needs at least one record");
        }
        if i32::try_from(self.len).is_err() {
            return fail("more than 2^31 records in one batch");
        }
        self.offsets.check(self.len, "offsets")?;
        self.timestamps.check(self.len, "timestamps")?;
        self.key.check("keys")?;
        self.value.check("values")?;
        if self.key.len != self.len || self.value.len != self.len {
            return fail("keys, values and offsets differ in length");
        }
        self.headers.check(self.len)
    }

    /// An upper bound of the encoded size of the records section.
    pub fn estimate(&self) -> usize {
        let fixed = 1 + 5 + 10 + 5 + 5 + 5 + 5;
        let header_bytes =
            self.headers.key.span() + self.headers.value.span() + 10 * self.headers.key.len;
        self.len * fixed + self.key.span() + self.value.span() + header_bytes
    }
}

/// Encodes one batch and returns its bytes, from baseOffset to the last record.
pub fn encode(records: &RecordsIn<'_>, params: &BatchParams) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    encode_into(records, params, &mut out)?;
    Ok(out)
}

/// Encodes one batch at the end of `out` (left as it was on an error).
pub fn encode_into(records: &RecordsIn<'_>, params: &BatchParams, out: &mut Vec<u8>) -> Result<()> {
    let start = out.len();
    let result = write_batch(records, params, out);
    if result.is_err() {
        out.truncate(start);
    }
    result
}

fn write_batch(records: &RecordsIn<'_>, params: &BatchParams, out: &mut Vec<u8>) -> Result<()> {
    records.check()?;
    let n = records.len;
    let base_timestamp = records.timestamps.get(0);
    let mut max_timestamp = i64::MIN;
    for i in 0..n {
        max_timestamp = max_timestamp.max(records.timestamps.get(i));
    }
    let last_offset_delta = records.offsets.get(n - 1).checked_sub(params.base_offset);
    let last_offset_delta = match last_offset_delta.and_then(|d| i32::try_from(d).ok()) {
        Some(d) => d,
        None => return fail("the last offset is more than 2^31 past base_offset"),
    };

    let estimate = records.estimate();
    let start = out.len();
    if params.codec == Codec::None {
        out.reserve(HEADER_LEN + estimate);
        out.resize(start + HEADER_LEN, 0);
        write_records(records, params.base_offset, base_timestamp, out)?;
    } else {
        let mut section = Vec::with_capacity(estimate);
        write_records(records, params.base_offset, base_timestamp, &mut section)?;
        let compressed = compress(params.codec, &section)
            .map_err(|e| EncodeError(format!("{} compression failed: {e}", params.codec.name())))?;
        drop(section);
        out.reserve(HEADER_LEN + compressed.len());
        out.resize(start + HEADER_LEN, 0);
        out.extend_from_slice(&compressed);
    }

    let batch_length = match i32::try_from(out.len() - start - LOG_OVERHEAD) {
        Ok(v) => v,
        Err(_) => return fail("the batch would exceed 2 GiB"),
    };
    let mut attributes = params.codec as i16;
    if params.log_append_time {
        attributes |= TIMESTAMP_TYPE_BIT;
    }
    let mut header = [0u8; HEADER_LEN];
    header[0..8].copy_from_slice(&params.base_offset.to_be_bytes());
    header[8..12].copy_from_slice(&batch_length.to_be_bytes());
    header[12..16].copy_from_slice(&params.partition_leader_epoch.to_be_bytes());
    header[16] = 2;
    header[21..23].copy_from_slice(&attributes.to_be_bytes());
    header[23..27].copy_from_slice(&last_offset_delta.to_be_bytes());
    header[27..35].copy_from_slice(&base_timestamp.to_be_bytes());
    header[35..43].copy_from_slice(&max_timestamp.to_be_bytes());
    header[43..51].copy_from_slice(&params.producer_id.to_be_bytes());
    header[51..53].copy_from_slice(&params.producer_epoch.to_be_bytes());
    header[53..57].copy_from_slice(&params.base_sequence.to_be_bytes());
    header[57..61].copy_from_slice(&(n as i32).to_be_bytes());
    out[start..start + HEADER_LEN].copy_from_slice(&header);
    let crc = crc32c::crc32c_append(crc32c::crc32c(&header[21..]), &out[start + HEADER_LEN..]);
    out[start + 17..start + 21].copy_from_slice(&crc.to_be_bytes());
    Ok(())
}

#[inline]
fn nullable_size(item: Option<&[u8]>) -> Result<(i32, usize)> {
    match item {
        None => Ok((-1, 1)),
        Some(b) => match i32::try_from(b.len()) {
            Ok(len) => Ok((len, varint_size(len) + b.len())),
            Err(_) => fail("a key, value or header over 2 GiB"),
        },
    }
}

#[inline]
fn put_nullable(out: &mut Vec<u8>, len: i32, item: Option<&[u8]>) {
    put_varint(out, len);
    if let Some(b) = item {
        out.extend_from_slice(b);
    }
}

fn write_records(
    records: &RecordsIn<'_>,
    base_offset: i64,
    base_timestamp: i64,
    out: &mut Vec<u8>,
) -> Result<()> {
    let mut previous_delta: i64 = -1;
    for i in 0..records.len {
        let offset_delta = match records.offsets.get(i).checked_sub(base_offset) {
            Some(d) if d > previous_delta && d <= i32::MAX as i64 => d,
            _ => {
                return fail(format!(
                    "offset {} at record {i}: offsets must increase from base_offset {base_offset}",
                    records.offsets.get(i)
                ))
            }
        };
        previous_delta = offset_delta;
        let offset_delta = offset_delta as i32;
        let timestamp_delta = match records.timestamps.get(i).checked_sub(base_timestamp) {
            Some(d) => d,
            None => return fail(format!("timestamp at record {i} overflows its delta")),
        };
        let key = records.key.get(i, "keys")?;
        let value = records.value.get(i, "values")?;
        let (key_len, key_size) = nullable_size(key)?;
        let (value_len, value_size) = nullable_size(value)?;
        let headers = records.headers.range(i)?;
        let header_count = headers.len() as i32;
        let mut headers_size = varint_size(header_count);
        for h in headers.clone() {
            let hk = records.headers.key.get(h, "header keys")?;
            match hk {
                None => return fail(format!("a null header key at record {i}")),
                Some(k) if std::str::from_utf8(k).is_err() => {
                    return fail(format!("a header key that is not UTF-8 at record {i}"))
                }
                Some(_) => {}
            }
            headers_size += nullable_size(hk)?.1
                + nullable_size(records.headers.value.get(h, "header values")?)?.1;
        }
        let body = 1
            + varlong_size(timestamp_delta)
            + varint_size(offset_delta)
            + key_size
            + value_size
            + headers_size;
        let body = match i32::try_from(body) {
            Ok(b) => b,
            Err(_) => return fail(format!("record {i} is over 2 GiB")),
        };
        out.reserve(5 + body as usize);
        put_varint(out, body);
        out.push(0);
        put_varlong(out, timestamp_delta);
        put_varint(out, offset_delta);
        put_nullable(out, key_len, key);
        put_nullable(out, value_len, value);
        put_varint(out, header_count);
        for h in headers {
            let hk = records.headers.key.get(h, "header keys")?;
            let hv = records.headers.value.get(h, "header values")?;
            put_nullable(out, nullable_size(hk)?.0, hk);
            put_nullable(out, nullable_size(hv)?.0, hv);
        }
    }
    Ok(())
}
