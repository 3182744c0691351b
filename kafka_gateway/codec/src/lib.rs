//! `kafka_gateway._codec`: Kafka record batch v2 <-> Arrow buffers, with no Python object per
//! record. The Python side (`kafka_gateway/records.py`) is the only caller; it builds pyarrow
//! arrays over the buffers returned here and passes `Array.buffers()` back in for encoding.
//!
//! - `decode(data, max_records, max_bytes, strict_offsets)` returns read-only `Buffer` objects
//!   (Rust-owned memory exported through the buffer protocol, so pyarrow wraps them without a
//!   copy) and one tuple per batch; refusals raise `CodecError(kafka_error_name, message)`.
//! - `encode(...)` returns one batch as `bytes`; bad inputs raise `ValueError`.
//!
//! Inputs of more than `DETACH_THRESHOLD` bytes are decoded/encoded with the GIL released.
//! Input buffers are read in place: the caller must not mutate them during a call.
//! Nothing here panics on any input (all reads are bounds-checked); a panic would still surface
//! as a Python exception, never an abort.

mod compression;
mod decode;
mod encode;
mod error;
mod stored;
mod varint;

use std::ffi::{c_int, c_void};

use pyo3::buffer::PyUntypedBuffer;
use pyo3::create_exception;
use pyo3::exceptions::{PyBufferError, PyException, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyList, PyString, PyTuple};

use crate::compression::Codec;
use crate::decode::{BinaryColumn, Decoded, Limits, TIMESTAMP_TYPE_BIT};

const TRANSACTIONAL_BIT: i16 = 0x10;
const CONTROL_BIT: i16 = 0x20;
use crate::encode::{BatchParams, BinaryIn, HeadersIn, Int64In, RecordsIn, Validity};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Work on inputs this large runs with the GIL released; smaller ones keep it (re-taking a
/// contended GIL can cost more than the work).
const DETACH_THRESHOLD: usize = 64 * 1024;

create_exception!(
    _codec,
    CodecError,
    PyException,
    "A record batch the codec refuses: args are (Kafka error name, message)."
);

/// Memory owned by Rust, exported read-only through the buffer protocol.
enum Storage {
    U8(Vec<u8>),
    I32(Vec<i32>),
    I64(Vec<i64>),
}

/// A read-only byte buffer (an Arrow buffer's memory) that pyarrow can wrap without copying.
#[pyclass(frozen, module = "kafka_gateway._codec", name = "Buffer")]
struct Buf {
    storage: Storage,
}

impl Buf {
    fn raw(&self) -> (*const u8, usize) {
        match &self.storage {
            Storage::U8(v) => (v.as_ptr(), v.len()),
            Storage::I32(v) => (v.as_ptr().cast(), std::mem::size_of_val(v.as_slice())),
            Storage::I64(v) => (v.as_ptr().cast(), std::mem::size_of_val(v.as_slice())),
        }
    }
}

#[pymethods]
impl Buf {
    /// # Safety
    /// Called by CPython with a valid `view`; the memory stays valid while `view.obj` (this
    /// object) is referenced, and is never written after construction.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("null view"));
        }
        let (ptr, len) = slf.get().raw();
        let len = ffi::Py_ssize_t::try_from(len)
            .map_err(|_| PyBufferError::new_err("buffer too large"))?;
        // SAFETY: `view` is non-null and CPython-provided; PyBuffer_FillInfo takes a new reference
        // to `slf` and refuses a writable request for this read-only memory.
        let rc = unsafe {
            ffi::PyBuffer_FillInfo(view, slf.as_ptr(), ptr as *mut c_void, len, 1, flags)
        };
        if rc != 0 {
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }

    fn __len__(&self) -> usize {
        self.raw().1
    }
}

fn buf<'py>(py: Python<'py>, storage: Storage) -> PyResult<Bound<'py, Buf>> {
    Bound::new(py, Buf { storage })
}

/// The bytes of a buffer-protocol object (or none for `None`), held for one call.
struct InBuf {
    buf: Option<PyUntypedBuffer>,
}

impl InBuf {
    fn get(obj: Option<&Bound<'_, PyAny>>) -> PyResult<InBuf> {
        let obj = match obj {
            Some(o) if !o.is_none() => o,
            _ => return Ok(InBuf { buf: None }),
        };
        let b = PyUntypedBuffer::get(obj)?;
        if !b.is_c_contiguous() {
            return Err(PyBufferError::new_err("a contiguous buffer is required"));
        }
        Ok(InBuf { buf: Some(b) })
    }

    fn slice(&self) -> &[u8] {
        match &self.buf {
            Some(b) if b.len_bytes() > 0 && !b.buf_ptr().is_null() => {
                // SAFETY: a C-contiguous exported buffer of len_bytes() bytes, kept alive (and by
                // contract unmodified) while `self` lives.
                unsafe { std::slice::from_raw_parts(b.buf_ptr() as *const u8, b.len_bytes()) }
            }
            _ => &[],
        }
    }
}

fn column_tuple<'py>(py: Python<'py>, col: BinaryColumn) -> PyResult<Bound<'py, PyTuple>> {
    let validity: Bound<'py, PyAny> = if col.null_count > 0 {
        buf(py, Storage::U8(col.validity))?.into_any()
    } else {
        py.None().into_bound(py)
    };
    PyTuple::new(
        py,
        [
            validity,
            col.null_count.into_pyobject(py)?.into_any(),
            buf(py, Storage::I32(col.offsets))?.into_any(),
            buf(py, Storage::U8(col.data))?.into_any(),
        ],
    )
}

/// Decodes the concatenated v2 batches in `data`.
///
/// Returns `(n, key, value, timestamp, offset, header_offsets, n_headers, header_key,
/// header_value, batches)`: each column is `(validity | None, null_count, offsets, data)`,
/// `timestamp` and `offset` are int64 buffers, `header_offsets` an int32 buffer, `batches` a list
/// of `(base_offset, partition_leader_epoch, attributes, last_offset_delta, base_timestamp,
/// max_timestamp, producer_id, producer_epoch, base_sequence, record_count, compression,
/// timestamp_type, is_transactional, is_control, size_bytes)` (the fields of
/// `records.BatchInfo`, in order).
#[pyfunction]
#[pyo3(name = "decode", signature = (data, max_records, max_bytes, strict_offsets = true))]
fn py_decode<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyAny>,
    max_records: usize,
    max_bytes: usize,
    strict_offsets: bool,
) -> PyResult<Bound<'py, PyTuple>> {
    let input = InBuf::get(Some(data))?;
    let bytes = input.slice();
    let limits = Limits {
        max_records,
        max_bytes,
        strict_offsets,
    };
    let result = if bytes.len() >= DETACH_THRESHOLD {
        py.detach(|| decode::decode(bytes, limits))
    } else {
        decode::decode(bytes, limits)
    };
    drop(input);
    let d: Decoded = result.map_err(|e| CodecError::new_err((e.code.name(), e.message)))?;
    let n = d.timestamp.len();
    let n_headers = d.header_key.len();
    let batches = PyList::empty(py);
    for b in &d.batches {
        let log_append_time = b.attributes & TIMESTAMP_TYPE_BIT != 0;
        let fields: [Bound<'py, PyAny>; 15] = [
            b.base_offset.into_pyobject(py)?.into_any(),
            b.partition_leader_epoch.into_pyobject(py)?.into_any(),
            b.attributes.into_pyobject(py)?.into_any(),
            b.last_offset_delta.into_pyobject(py)?.into_any(),
            b.base_timestamp.into_pyobject(py)?.into_any(),
            b.max_timestamp.into_pyobject(py)?.into_any(),
            b.producer_id.into_pyobject(py)?.into_any(),
            b.producer_epoch.into_pyobject(py)?.into_any(),
            b.base_sequence.into_pyobject(py)?.into_any(),
            b.record_count.into_pyobject(py)?.into_any(),
            PyString::new(py, b.codec.name()).into_any(),
            i32::from(log_append_time).into_pyobject(py)?.into_any(),
            PyBool::new(py, b.attributes & TRANSACTIONAL_BIT != 0)
                .to_owned()
                .into_any(),
            PyBool::new(py, b.attributes & CONTROL_BIT != 0)
                .to_owned()
                .into_any(),
            b.size_bytes.into_pyobject(py)?.into_any(),
        ];
        batches.append(PyTuple::new(py, fields)?)?;
    }
    PyTuple::new(
        py,
        [
            n.into_pyobject(py)?.into_any(),
            column_tuple(py, d.key)?.into_any(),
            column_tuple(py, d.value)?.into_any(),
            buf(py, Storage::I64(d.timestamp))?.into_any(),
            buf(py, Storage::I64(d.offset))?.into_any(),
            buf(py, Storage::I32(d.header_offsets))?.into_any(),
            n_headers.into_pyobject(py)?.into_any(),
            column_tuple(py, d.header_key)?.into_any(),
            column_tuple(py, d.header_value)?.into_any(),
            batches.into_any(),
        ],
    )
}

/// `(validity | None, offsets | None, data | None, array offset, length)` of a binary array.
type BinarySpec<'py> = (
    Option<Bound<'py, PyAny>>,
    Option<Bound<'py, PyAny>>,
    Option<Bound<'py, PyAny>>,
    usize,
    usize,
);

struct BinaryBufs {
    validity: InBuf,
    offsets: InBuf,
    data: InBuf,
    offset: usize,
    len: usize,
}

impl BinaryBufs {
    fn get(spec: &BinarySpec<'_>) -> PyResult<Self> {
        Ok(BinaryBufs {
            validity: InBuf::get(spec.0.as_ref())?,
            offsets: InBuf::get(spec.1.as_ref())?,
            data: InBuf::get(spec.2.as_ref())?,
            offset: spec.3,
            len: spec.4,
        })
    }

    fn view(&self) -> BinaryIn<'_> {
        BinaryIn {
            validity: Validity {
                bits: self.validity.buf.as_ref().map(|_| self.validity.slice()),
                offset: self.offset,
            },
            offsets: self.offsets.slice(),
            data: self.data.slice(),
            offset: self.offset,
            len: self.len,
        }
    }
}

/// Encodes one v2 batch from Arrow buffers and returns its bytes.
///
/// `offsets`/`timestamps` are `(int64 data buffer, array offset)` without nulls; `key`/`value`
/// are binary specs; `headers` is `(validity | None, list offsets, array offset, key spec, value
/// spec)` with the struct fields' specs already carrying the struct's offset.
#[pyfunction]
#[pyo3(name = "encode", signature = (*, length, base_offset, offsets, timestamps, key, value, headers, log_append_time,
                    compression, partition_leader_epoch, producer_id, producer_epoch, base_sequence))]
#[allow(clippy::too_many_arguments)]
fn py_encode<'py>(
    py: Python<'py>,
    length: usize,
    base_offset: i64,
    offsets: (Bound<'py, PyAny>, usize),
    timestamps: (Bound<'py, PyAny>, usize),
    key: BinarySpec<'py>,
    value: BinarySpec<'py>,
    headers: (
        Option<Bound<'py, PyAny>>,
        Option<Bound<'py, PyAny>>,
        usize,
        BinarySpec<'py>,
        BinarySpec<'py>,
    ),
    log_append_time: bool,
    compression: &str,
    partition_leader_epoch: i32,
    producer_id: i64,
    producer_epoch: i16,
    base_sequence: i32,
) -> PyResult<Bound<'py, PyBytes>> {
    let codec = Codec::from_name(compression)
        .ok_or_else(|| PyValueError::new_err(format!("unknown compression {compression:?}")))?;
    let offsets_buf = InBuf::get(Some(&offsets.0))?;
    let timestamps_buf = InBuf::get(Some(&timestamps.0))?;
    let key_bufs = BinaryBufs::get(&key)?;
    let value_bufs = BinaryBufs::get(&value)?;
    let header_validity = InBuf::get(headers.0.as_ref())?;
    let header_offsets = InBuf::get(headers.1.as_ref())?;
    let header_key = BinaryBufs::get(&headers.3)?;
    let header_value = BinaryBufs::get(&headers.4)?;
    let records = RecordsIn {
        len: length,
        offsets: Int64In {
            data: offsets_buf.slice(),
            offset: offsets.1,
        },
        timestamps: Int64In {
            data: timestamps_buf.slice(),
            offset: timestamps.1,
        },
        key: key_bufs.view(),
        value: value_bufs.view(),
        headers: HeadersIn {
            validity: Validity {
                bits: header_validity
                    .buf
                    .as_ref()
                    .map(|_| header_validity.slice()),
                offset: headers.2,
            },
            list_offsets: header_offsets.slice(),
            offset: headers.2,
            key: header_key.view(),
            value: header_value.view(),
        },
    };
    let params = BatchParams {
        base_offset,
        partition_leader_epoch,
        producer_id,
        producer_epoch,
        base_sequence,
        log_append_time,
        codec,
    };
    let result = if records.estimate() >= DETACH_THRESHOLD {
        py.detach(|| encode::encode(&records, &params))
    } else {
        encode::encode(&records, &params)
    };
    let batch = result.map_err(|e| PyValueError::new_err(e.0))?;
    Ok(PyBytes::new(py, &batch))
}

/// Kafka record batches straight from a topic's stored parquet files (`stored.rs`), with the
/// files kept open with their parsed footers between calls (at most `max_files`, and
/// `max_footer_bytes` of footers).
#[pyclass(frozen, module = "kafka_gateway._codec", name = "StoredBatches")]
struct StoredBatches {
    footers: stored::Footers,
}

#[pymethods]
impl StoredBatches {
    #[new]
    #[pyo3(signature = (max_files = 128, max_footer_bytes = 64 << 20))]
    fn new(max_files: usize, max_footer_bytes: usize) -> Self {
        StoredBatches {
            footers: stored::Footers::new(max_files, max_footer_bytes),
        }
    }

    /// The records of `row_groups` of the local parquet file at `path` with offset >= `start`,
    /// within `max_records` and `max_bytes` (key + value + header bytes; the first record even
    /// when larger if `take_one`), as record batches compressed with `compression` ("none",
    /// "gzip", "snappy", "lz4", "zstd"; "producer": the codec the file's metadata names):
    /// `(data, count, last_offset, size, full)`, `full` when the
    /// next record did not fit; or, as a str, why the file is not in the layout this path encodes
    /// (the caller reads it the general way). The GIL is released for the whole read. Raises
    /// OSError when the file cannot be opened, ValueError for an unknown compression.
    #[pyo3(signature = (path, row_groups, *, skip_rows, start, max_records, max_bytes, take_one, batch_rows, partition_leader_epoch = -1, compression = "none"))]
    #[allow(clippy::too_many_arguments)]
    fn read<'py>(
        &self,
        py: Python<'py>,
        path: &str,
        row_groups: Vec<usize>,
        skip_rows: usize,
        start: i64,
        max_records: usize,
        max_bytes: i64,
        take_one: bool,
        batch_rows: usize,
        partition_leader_epoch: i32,
        compression: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let codec = match compression {
            "producer" => None,
            name => Some(Codec::from_name(name).ok_or_else(|| {
                PyValueError::new_err(format!("unknown compression {name:?}"))
            })?),
        };
        let req = stored::Request {
            path,
            row_groups: &row_groups,
            skip_rows,
            start,
            max_records,
            max_bytes,
            take_one,
            batch_rows,
            partition_leader_epoch,
            codec,
        };
        // a panic in the parquet reader (a file it cannot make sense of) is a refusal: the
        // general read then meets the file and says what is wrong with it
        let outcome = py
            .detach(|| {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    stored::fetch(&self.footers, &req)
                }))
            })
            .unwrap_or_else(|_| {
                Ok(stored::Outcome::Unsupported(
                    "the parquet reader panicked".into(),
                ))
            })?;
        match outcome {
            stored::Outcome::Unsupported(why) => Ok(PyString::new(py, &why).into_any()),
            stored::Outcome::Fetched(f) => Ok(PyTuple::new(
                py,
                [
                    PyBytes::new(py, &f.data).into_any(),
                    f.count.into_pyobject(py)?.into_any(),
                    f.last_offset.into_pyobject(py)?.into_any(),
                    f.size.into_pyobject(py)?.into_any(),
                    PyBool::new(py, f.full).to_owned().into_any(),
                ],
            )?
            .into_any()),
        }
    }

    /// `(files, bytes)`: the files held open, and their footers' bytes.
    fn footers(&self) -> (usize, usize) {
        self.footers.held()
    }
}

#[pymodule]
#[pyo3(name = "_codec")]
fn codec_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("CodecError", m.py().get_type::<CodecError>())?;
    m.add_class::<Buf>()?;
    m.add_function(wrap_pyfunction!(py_decode, m)?)?;
    m.add_function(wrap_pyfunction!(py_encode, m)?)?;
    m.add_class::<StoredBatches>()?;
    Ok(())
}
