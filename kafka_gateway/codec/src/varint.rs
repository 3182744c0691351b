//! Kafka's zigzag varints (`ByteUtils.readVarint`/`readVarlong`) over a bounds-checked cursor.
//!
//! Reading never indexes past the slice: every read returns `None` when the bytes run out or a
//! varint is longer than its type allows (5 bytes for 32 bits, 10 for 64 bits, with no bits set
//! above the type's width in the last byte).

/// A read position in a byte slice.
pub struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

/// Why a read failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadError {
    /// The slice ended first.
    Truncated,
    /// More continuation bytes than the type holds, or bits above its width.
    Overflow,
}

impl<'a> Cursor<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Cursor { buf, pos: 0 }
    }

    #[inline]
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    #[inline]
    pub fn u8(&mut self) -> Result<u8, ReadError> {
        let b = *self.buf.get(self.pos).ok_or(ReadError::Truncated)?;
        self.pos += 1;
        Ok(b)
    }

    /// The next `n` bytes, or `Truncated` when fewer are left.
    #[inline]
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], ReadError> {
        let end = self.pos.checked_add(n).ok_or(ReadError::Truncated)?;
        let out = self.buf.get(self.pos..end).ok_or(ReadError::Truncated)?;
        self.pos = end;
        Ok(out)
    }

    /// A zigzag-encoded 32-bit varint.
    #[inline]
    pub fn varint(&mut self) -> Result<i32, ReadError> {
        let first = self.u8()?;
        if first & 0x80 == 0 {
            return Ok(unzigzag32(first as u32));
        }
        let mut value = (first & 0x7f) as u32;
        for i in 1..5u32 {
            let b = self.u8()?;
            if i == 4 && b > 0x0f {
                return Err(ReadError::Overflow);
            }
            value |= ((b & 0x7f) as u32) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(unzigzag32(value));
            }
        }
        Err(ReadError::Overflow)
    }

    /// A zigzag-encoded 64-bit varlong.
    #[inline]
    pub fn varlong(&mut self) -> Result<i64, ReadError> {
        let first = self.u8()?;
        if first & 0x80 == 0 {
            return Ok(unzigzag64(first as u64));
        }
        let mut value = (first & 0x7f) as u64;
        for i in 1..10u32 {
            let b = self.u8()?;
            if i == 9 && b > 0x01 {
                return Err(ReadError::Overflow);
            }
            value |= ((b & 0x7f) as u64) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(unzigzag64(value));
            }
        }
        Err(ReadError::Overflow)
    }
}

#[inline]
fn unzigzag32(v: u32) -> i32 {
    ((v >> 1) as i32) ^ -((v & 1) as i32)
}

#[inline]
fn unzigzag64(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// Appends `value` as a zigzag varint.
#[inline]
pub fn put_varint(out: &mut Vec<u8>, value: i32) {
    put_unsigned(out, ((value << 1) ^ (value >> 31)) as u32 as u64);
}

/// Appends `value` as a zigzag varlong.
#[inline]
pub fn put_varlong(out: &mut Vec<u8>, value: i64) {
    put_unsigned(out, ((value << 1) ^ (value >> 63)) as u64);
}

#[inline]
fn put_unsigned(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// The encoded size of `value` as a zigzag varint.
#[inline]
pub fn varint_size(value: i32) -> usize {
    let v = ((value << 1) ^ (value >> 31)) as u32;
    let bits = 32 - (v | 1).leading_zeros() as usize;
    bits.div_ceil(7)
}

/// The encoded size of `value` as a zigzag varlong.
#[inline]
pub fn varlong_size(value: i64) -> usize {
    let v = ((value << 1) ^ (value >> 63)) as u64;
    let bits = 64 - (v | 1).leading_zeros() as usize;
    bits.div_ceil(7)
}
