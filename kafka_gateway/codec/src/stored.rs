//! The fetch path from stored topic files: row groups of a topic's parquet file decoded to Arrow
//! (arrow-rs) and encoded as Kafka record batches in one call, with no Python in between (no
//! pyarrow table, record sizes, slices or per-batch calls; measured as most of the listener's
//! CPU per MB fetched).
//!
//! Limits are the reader's (`delta_log.log.reader.TopicReader._fetch`): records with offset >=
//! `start`, at most `max_records`, while their sizes (key + value + header bytes) sum to at most
//! `max_bytes`, and the first record of a fetch even when larger. Anything this path does not
//! know as the topic schema's layout (other column types, nulls where ours have none, offsets that
//! do not ascend, a file parquet cannot read) is `Outcome::Unsupported`: the caller then reads
//! the file the general way, which sorts, casts or raises as it always has.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::{BufReader, Read};
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex, MutexGuard};

use arrow_array::cast::AsArray;
use arrow_array::types::ByteArrayType;
use arrow_array::types::{Int32Type, Int64Type};
use arrow_array::{Array, GenericByteArray, ListArray, RecordBatch};
use arrow_buffer::NullBuffer;
use arrow_schema::{DataType, Schema, TimeUnit};
use bytes::Bytes;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder, RowSelection,
    RowSelector,
};
use parquet::arrow::ProjectionMask;
use parquet::file::reader::{ChunkReader, Length};

use crate::compression::Codec;
use crate::encode::{encode_into, BatchParams, BinaryIn, HeadersIn, Int64In, RecordsIn, Validity};

const TIMESTAMP_LOG_APPEND_TIME: i32 = 1;

/// One read: which row groups of which file, and the fetch's limits.
pub struct Request<'a> {
    pub path: &'a str,
    pub row_groups: &'a [usize],
    /// rows of the first row group known to lie before `start` (0 when unknown)
    pub skip_rows: usize,
    pub start: i64,
    pub max_records: usize,
    pub max_bytes: i64,
    /// the first record is taken even when larger than `max_bytes` (the fetch has none yet)
    pub take_one: bool,
    /// rows decoded at a time (about what the limits allow: a fetch that stops early decodes
    /// little past its last record)
    pub batch_rows: usize,
    pub partition_leader_epoch: i32,
    /// how the batches' records are compressed (the topic's compression.type); None: as the
    /// file's producers compressed theirs (its `CODEC_KEY` metadata; none when it has none)
    pub codec: Option<Codec>,
}

/// The parquet key-value metadata naming the codec a segment file's producers compressed their
/// batches with (delta_log.table.segment_files.CODEC_KEY).
pub const CODEC_KEY: &str = "topiclake.codec";

/// The codec a file's metadata names (none when it names none, or one this codec does not know).
fn file_codec(meta: &ArrowReaderMetadata) -> Codec {
    meta.metadata()
        .file_metadata()
        .key_value_metadata()
        .and_then(|kv| kv.iter().find(|e| e.key == CODEC_KEY))
        .and_then(|e| e.value.as_deref())
        .and_then(Codec::from_name)
        .unwrap_or(Codec::None)
}

/// What a read returned: the batches, their record count, last offset and record bytes, and
/// whether it stopped because the next record did not fit `max_bytes`.
pub struct Fetched {
    pub data: Vec<u8>,
    pub count: usize,
    pub last_offset: i64,
    pub size: i64,
    pub full: bool,
}

pub enum Outcome {
    Fetched(Fetched),
    Unsupported(String),
}

/// An open segment file read by position (`pread`), so threads reading it at once never share
/// a seek offset (parquet's own `File` reader seeks a duplicated descriptor, which shares one).
#[derive(Clone)]
struct SharedFile(Arc<File>);

impl Length for SharedFile {
    fn len(&self) -> u64 {
        self.0.metadata().map(|m| m.len()).unwrap_or(0)
    }
}

/// `Read` from a position of a `SharedFile`.
struct FileAt {
    file: Arc<File>,
    pos: u64,
}

impl Read for FileAt {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.file.read_at(buf, self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl ChunkReader for SharedFile {
    type T = BufReader<FileAt>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        Ok(BufReader::new(FileAt {
            file: Arc::clone(&self.0),
            pos: start,
        }))
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        let mut buf = vec![0u8; length];
        self.0.read_exact_at(&mut buf, start)?;
        Ok(buf.into())
    }
}

/// A file's parsed footer, and whether each row group's offsets ascend (None: not looked yet).
/// Our writers, roll-up and compaction keep every group sorted; another engine's rewrite (a
/// delta-rs DELETE, a plain Spark OPTIMIZE) may not, and its statistics cannot tell.
#[derive(Clone)]
struct Footer {
    file: SharedFile,
    meta: ArrowReaderMetadata,
    ascending: Arc<Mutex<Vec<Option<bool>>>>,
}

#[derive(Default)]
struct FooterMap {
    by_path: HashMap<String, (Footer, usize)>,
    order: VecDeque<String>,
    bytes: usize,
}

/// The files read, open, with their parsed footers, by path (topic files are immutable and
/// never reuse a name): at most `max_files`, and while the footers' memory stays under
/// `max_bytes` (a merged file of many row groups has a large footer); the least recently read
/// goes first, and the last one read always stays. A file deleted meanwhile (a vacuum after
/// the reader's snapshot) stays readable through its handle while it is held.
pub struct Footers {
    max_files: usize,
    max_bytes: usize,
    inner: Mutex<FooterMap>,
}

/// What opening a file for a read gave: its footer, or why this path does not read it.
type Opened = Result<Footer, String>;

impl Footers {
    pub fn new(max_files: usize, max_bytes: usize) -> Self {
        Footers {
            max_files: max_files.max(1),
            max_bytes,
            inner: Mutex::new(FooterMap::default()),
        }
    }

    /// The file at `path`, held or opened now. Err: it cannot be opened.
    fn get(&self, path: &str) -> std::io::Result<Opened> {
        {
            let mut held = self.lock();
            if let Some((footer, _)) = held.by_path.get(path) {
                let footer = footer.clone();
                if held.order.back().map(String::as_str) != Some(path) {
                    held.order.retain(|p| p != path); // most recently read last (a few hundred at most)
                    held.order.push_back(path.to_owned());
                }
                return Ok(Ok(footer));
            }
        }
        let file = SharedFile(Arc::new(File::open(path)?));
        // the parquet types alone, not the Arrow schema a writer embedded: delta-rs's files ask
        // for binary and string views, which decode to the same bytes as plain binary and string
        let options = ArrowReaderOptions::new().with_skip_arrow_metadata(true);
        let meta = match ArrowReaderMetadata::load(&file, options) {
            Ok(m) => m,
            Err(e) => return Ok(Err(e.to_string())),
        };
        let groups = meta.metadata().num_row_groups();
        let size = meta.metadata().memory_size() + groups + path.len();
        let footer = Footer {
            file,
            meta,
            ascending: Arc::new(Mutex::new(vec![None; groups])),
        };
        let mut guard = self.lock();
        let held = &mut *guard;
        if let Some((_, old)) = held.by_path.insert(path.to_owned(), (footer.clone(), size)) {
            held.bytes -= old; // another thread parsed it meanwhile: counted once
        } else {
            held.order.push_back(path.to_owned());
        }
        held.bytes += size;
        while (held.bytes > self.max_bytes || held.order.len() > self.max_files)
            && held.order.len() > 1
        {
            if let Some(old) = held.order.pop_front() {
                if let Some((_, freed)) = held.by_path.remove(&old) {
                    held.bytes -= freed;
                }
            }
        }
        Ok(Ok(footer))
    }

    fn lock(&self) -> MutexGuard<'_, FooterMap> {
        // a panic while holding it leaves a usable map (inserts and removes are whole)
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Footers held, and their bytes.
    pub fn held(&self) -> (usize, usize) {
        let held = self.lock();
        (held.by_path.len(), held.bytes)
    }
}

/// Root column indices of the topic columns in a file's Arrow schema, when their types are the
/// ones this path encodes.
struct Columns {
    key: usize,
    value: usize,
    offset: usize,
    timestamp: usize,
    timestamp_type: usize,
    headers: usize,
}

fn is_binary(t: &DataType) -> bool {
    matches!(t, DataType::Binary | DataType::Utf8)
}

impl Columns {
    fn of(schema: &Schema) -> Result<Columns, String> {
        let find = |name: &str| {
            schema
                .index_of(name)
                .map_err(|_| format!("no {name} column"))
        };
        let cols = Columns {
            key: find("key")?,
            value: find("value")?,
            offset: find("offset")?,
            timestamp: find("timestamp")?,
            timestamp_type: find("timestampType")?,
            headers: find("headers")?,
        };
        let ty = |i: usize| schema.field(i).data_type();
        if !is_binary(ty(cols.key)) || !is_binary(ty(cols.value)) {
            return Err("key or value is not binary or string".into());
        }
        if ty(cols.offset) != &DataType::Int64 || ty(cols.timestamp_type) != &DataType::Int32 {
            return Err("offset or timestampType of another type".into());
        }
        if !matches!(ty(cols.timestamp), DataType::Timestamp(_, _)) {
            return Err("timestamp is not a timestamp".into());
        }
        match ty(cols.headers) {
            DataType::List(item) => match item.data_type() {
                DataType::Struct(fields)
                    if fields.len() == 2
                        && fields[0].name() == "key"
                        && fields[1].name() == "value"
                        && is_binary(fields[0].data_type())
                        && is_binary(fields[1].data_type()) => {}
                _ => return Err("headers are not list<struct<key, value>>".into()),
            },
            _ => return Err("headers are not a list".into()),
        }
        Ok(cols)
    }

    fn roots(&self) -> [usize; 6] {
        [
            self.key,
            self.value,
            self.offset,
            self.timestamp,
            self.timestamp_type,
            self.headers,
        ]
    }
}

fn byte_view<T: ByteArrayType<Offset = i32>>(arr: &GenericByteArray<T>) -> BinaryIn<'_> {
    BinaryIn {
        validity: validity(arr.nulls()),
        offsets: arr.offsets().inner().inner().as_slice(),
        data: arr.values().as_slice(),
        offset: 0,
        len: arr.len(),
    }
}

fn validity(nulls: Option<&NullBuffer>) -> Validity<'_> {
    match nulls {
        Some(n) if n.null_count() > 0 => Validity {
            bits: Some(n.buffer().as_slice()),
            offset: n.offset(),
        },
        _ => Validity {
            bits: None,
            offset: 0,
        },
    }
}

fn binary_view(arr: &dyn Array) -> Option<BinaryIn<'_>> {
    match arr.data_type() {
        DataType::Binary => Some(byte_view(arr.as_binary::<i32>())),
        DataType::Utf8 => Some(byte_view(arr.as_string::<i32>())),
        _ => None,
    }
}

/// A view that starts `at` items in (the encoder reads `len` items from there).
fn shifted(mut view: BinaryIn<'_>, at: usize, len: usize) -> BinaryIn<'_> {
    view.offset += at;
    view.validity.offset += at;
    view.len = len;
    view
}

/// Epoch milliseconds of a timestamp column (truncated toward zero, as Arrow's cast and the
/// general path's `_millis` do; -1 for a null).
fn millis(arr: &dyn Array, unit: TimeUnit) -> Vec<i64> {
    let values = arr.to_data();
    let raw: &[i64] = values.buffers()[0].typed_data::<i64>();
    let raw = &raw[values.offset()..values.offset() + arr.len()];
    let mut out: Vec<i64> = match unit {
        TimeUnit::Second => raw.iter().map(|v| v.saturating_mul(1000)).collect(),
        TimeUnit::Millisecond => raw.to_vec(),
        TimeUnit::Microsecond => raw.iter().map(|v| v / 1000).collect(),
        TimeUnit::Nanosecond => raw.iter().map(|v| v / 1_000_000).collect(),
    };
    if let Some(nulls) = arr.nulls() {
        for (i, ms) in out.iter_mut().enumerate() {
            if nulls.is_null(i) {
                *ms = -1;
            }
        }
    }
    out
}

fn le_bytes(values: &[i64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * 8);
    for v in values {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

#[inline]
fn item_len(view: &BinaryIn<'_>, i: usize) -> i64 {
    if !view.validity.is_valid(i) {
        return 0;
    }
    let at = |k: usize| {
        view.offsets
            .get(k * 4..k * 4 + 4)
            .map(|s| i32::from_le_bytes([s[0], s[1], s[2], s[3]]))
            .unwrap_or(0)
    };
    i64::from(at(view.offset + i + 1) - at(view.offset + i)).max(0)
}

struct State {
    first_batch: bool,
    /// the last offset decoded: offsets must ascend across the whole read
    previous: i64,
    out: Vec<u8>,
    count: usize,
    size: i64,
    last_offset: i64,
    full: bool,
}

/// Reads the request's row groups and encodes the records its limits take.
pub fn fetch(footers: &Footers, req: &Request<'_>) -> Result<Outcome, std::io::Error> {
    let footer = match footers.get(req.path)? {
        Ok(f) => f,
        Err(e) => return Ok(Outcome::Unsupported(e)),
    };
    let meta = &footer.meta;
    let resolved = Request {
        codec: Some(req.codec.unwrap_or_else(|| file_codec(meta))),
        ..*req
    };
    let req = &resolved;
    let cols = match Columns::of(meta.schema()) {
        Ok(c) => c,
        Err(e) => return Ok(Outcome::Unsupported(e)),
    };
    let groups = meta.metadata().row_groups();
    if req.row_groups.iter().any(|&g| g >= groups.len()) {
        return Ok(Outcome::Unsupported("no such row group".into()));
    }
    for &g in req.row_groups {
        match ascends(&footer, cols.offset, g) {
            Ok(true) => {}
            Ok(false) => {
                return Ok(Outcome::Unsupported(format!(
                    "row group {g} is not sorted by offset"
                )))
            }
            Err(e) => return Ok(Outcome::Unsupported(e)),
        }
    }
    let rows: usize = req
        .row_groups
        .iter()
        .map(|&g| usize::try_from(groups[g].num_rows()).unwrap_or(0))
        .sum();
    let mask = ProjectionMask::roots(meta.parquet_schema(), cols.roots());
    let mut builder =
        ParquetRecordBatchReaderBuilder::new_with_metadata(footer.file.clone(), meta.clone())
            .with_projection(mask)
            .with_row_groups(req.row_groups.to_vec())
            .with_batch_size(req.batch_rows.clamp(64, 65_536));
    let skip = req.skip_rows.min(rows);
    if skip > 0 {
        builder = builder.with_row_selection(RowSelection::from(vec![
            RowSelector::skip(skip),
            RowSelector::select(rows - skip),
        ]));
    }
    let reader = match builder.build() {
        Ok(r) => r,
        Err(e) => return Ok(Outcome::Unsupported(e.to_string())),
    };
    let mut state = State {
        first_batch: true,
        previous: i64::MIN,
        out: Vec::with_capacity(usize::try_from(req.max_bytes).unwrap_or(0).min(64 << 20) + 4096),
        count: 0,
        size: 0,
        last_offset: i64::MIN,
        full: false,
    };
    for batch in reader {
        let batch = match batch {
            Ok(b) => b,
            Err(e) => return Ok(Outcome::Unsupported(e.to_string())),
        };
        match take(&batch, req, &mut state) {
            Ok(true) => {}
            Ok(false) => break, // a limit was reached
            Err(why) => return Ok(Outcome::Unsupported(why)),
        }
    }
    Ok(Outcome::Fetched(Fetched {
        data: state.out,
        count: state.count,
        last_offset: state.last_offset,
        size: state.size,
        full: state.full,
    }))
}

/// Whether row group `g`'s offsets strictly ascend, without nulls: its offset column alone read
/// once per process (a few bytes a record), then remembered with the footer.
fn ascends(footer: &Footer, offset_root: usize, g: usize) -> Result<bool, String> {
    let known = footer.ascending.lock().unwrap_or_else(|e| e.into_inner())[g];
    if let Some(verdict) = known {
        return Ok(verdict);
    }
    let mask = ProjectionMask::roots(footer.meta.parquet_schema(), [offset_root]);
    let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(
        footer.file.clone(),
        footer.meta.clone(),
    )
    .with_projection(mask)
    .with_row_groups(vec![g])
    .with_batch_size(65_536)
    .build()
    .map_err(|e| e.to_string())?;
    let mut previous = i64::MIN;
    let mut verdict = true;
    'batches: for batch in reader {
        let batch = batch.map_err(|e| e.to_string())?;
        let col = batch.column(0);
        if col.null_count() > 0 || col.data_type() != &DataType::Int64 {
            verdict = false;
            break;
        }
        for &o in col.as_primitive::<Int64Type>().values().iter() {
            if o <= previous {
                verdict = false;
                break 'batches;
            }
            previous = o;
        }
    }
    footer.ascending.lock().unwrap_or_else(|e| e.into_inner())[g] = Some(verdict);
    Ok(verdict)
}

/// Takes the records of `batch` the limits allow into `state`; false once a limit is reached.
fn take(batch: &RecordBatch, req: &Request<'_>, state: &mut State) -> Result<bool, String> {
    let schema = batch.schema();
    let col = |name: &str| -> Result<&dyn Array, String> {
        schema
            .index_of(name)
            .map(|i| batch.column(i).as_ref())
            .map_err(|_| format!("no {name} column"))
    };
    let offsets_col = col("offset")?;
    let types_col = col("timestampType")?;
    if offsets_col.null_count() > 0 || types_col.null_count() > 0 {
        return Err("null offsets or timestamp types".into());
    }
    let offsets = offsets_col.as_primitive::<Int64Type>().values();
    let types = types_col.as_primitive::<Int32Type>().values();
    let n = offsets.len();
    for &o in offsets.iter() {
        if o <= state.previous {
            return Err("offsets do not ascend".into());
        }
        state.previous = o;
    }
    if req.skip_rows > 0 && state.first_batch && offsets.first() != Some(&req.start) {
        // the row skip relied on the group being dense (row i holds its lowest offset + i)
        return Err("the skipped rows did not end at the fetch's offset".into());
    }
    state.first_batch = false;
    let from = offsets.partition_point(|&o| o < req.start);
    if from == n {
        return Ok(true);
    }
    let key = binary_view(col("key")?).ok_or("key type")?;
    let value = binary_view(col("value")?).ok_or("value type")?;
    let headers_col = col("headers")?;
    let headers: &ListArray = headers_col.as_list::<i32>();
    let header_struct = headers.values().as_struct();
    let header_key = binary_view(header_struct.column(0).as_ref()).ok_or("header key type")?;
    let header_value = binary_view(header_struct.column(1).as_ref()).ok_or("header value type")?;
    let list_offsets = headers.offsets();
    let header_validity = validity(headers.nulls());

    // how many records the limits take from `from` on
    let mut end = from;
    let mut stop = false;
    while end < n {
        if state.count + (end - from) >= req.max_records {
            stop = true;
            break;
        }
        let mut size = item_len(&key, end) + item_len(&value, end);
        if header_validity.is_valid(end) {
            let (a, b) = (list_offsets[end] as usize, list_offsets[end + 1] as usize);
            for h in a..b.min(header_key.len) {
                size += item_len(&header_key, h) + item_len(&header_value, h);
            }
        }
        let first = state.count == 0 && end == from;
        if state.size + size > req.max_bytes && !(first && req.take_one) {
            state.full = true;
            stop = true;
            break;
        }
        state.size += size;
        end += 1;
    }
    if end > from {
        let ts_col = col("timestamp")?;
        let unit = match ts_col.data_type() {
            DataType::Timestamp(unit, _) => *unit,
            _ => return Err("timestamp type".into()),
        };
        let times = millis(ts_col, unit);
        let ms = le_bytes(&times);
        let offsets_bytes = offsets.inner().as_slice();
        let mut a = from;
        while a < end {
            // a batch per run of one timestamp type, and for LogAppendTime of one time (a client
            // gives every record of such a batch the batch's time)
            let log_append_time = types[a] == TIMESTAMP_LOG_APPEND_TIME;
            let mut b = a + 1;
            while b < end && types[b] == types[a] && !(log_append_time && times[b] != times[a]) {
                b += 1;
            }
            let records = RecordsIn {
                len: b - a,
                offsets: Int64In {
                    data: offsets_bytes,
                    offset: a,
                },
                timestamps: Int64In {
                    data: &ms,
                    offset: a,
                },
                key: shifted(key, a, b - a),
                value: shifted(value, a, b - a),
                headers: HeadersIn {
                    validity: Validity {
                        bits: header_validity.bits,
                        offset: header_validity.offset + a,
                    },
                    list_offsets: list_offsets.inner().inner().as_slice(),
                    offset: a,
                    key: header_key,
                    value: header_value,
                },
            };
            let params = BatchParams {
                base_offset: offsets[a],
                partition_leader_epoch: req.partition_leader_epoch,
                producer_id: -1,
                producer_epoch: -1,
                base_sequence: -1,
                log_append_time,
                codec: req.codec.unwrap_or(Codec::None),
            };
            encode_into(&records, &params, &mut state.out).map_err(|e| e.0)?;
            a = b;
        }
        state.count += end - from;
        state.last_offset = offsets[end - 1];
    }
    Ok(!stop && state.count < req.max_records)
}
