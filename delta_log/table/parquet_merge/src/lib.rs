//! `delta_log.table.parquet_merge._native`: several parquet files of one schema merged into one by copying
//! their encoded column chunks (parquet-rs `append_column`), with no decompression, decoding or
//! encoding. The roll-up (`delta_log/maintenance/rollup.py`) is the only caller.
//!
//! - `merge(inputs, output, stats_columns)` writes `output` (which must not exist) with every row
//!   group of every input, in order, and the first input's key-value metadata (pyarrow's
//!   `ARROW:schema`, so the Arrow types read back the same). It returns `(size, rows, stats)`:
//!   per name in `stats_columns`, `(min, max, null_count)` of that INT32/INT64 column over every
//!   row group, min and max None when no row group has a value.
//! - It refuses with `ValueError`, before anything is written, and the caller then merges by
//!   decoding: inputs whose schemas differ; an input without the key-value metadata
//!   `required_key` = `required_value` (the writer's mark that its rows ascend by offset: chunks
//!   are copied in order, never sorted); row groups whose `order_column` ranges do not ascend
//!   across the inputs; a row group without statistics for a stats column; an input footer that
//!   does not parse; row groups smaller on average than both `min_group_rows` and
//!   `min_group_bytes` (copying keeps row groups as they are, and many small ones make every
//!   reader slower: the decoding path rewrites them full).
//! - Runs with the GIL released. On any failure, a panic included, the partial output is removed.

use std::fs::{self, File};
use std::sync::Arc;

use parquet::column::writer::ColumnCloseResult;
use parquet::file::metadata::ParquetMetaData;
use parquet::file::properties::WriterProperties;
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::file::statistics::Statistics;
use parquet::file::writer::SerializedFileWriter;
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;

type ColumnStats = (Option<i64>, Option<i64>, u64);

enum Failure {
    Refused(String),
    Io(String),
}

impl From<parquet::errors::ParquetError> for Failure {
    fn from(e: parquet::errors::ParquetError) -> Self {
        Failure::Io(e.to_string())
    }
}

fn refused(e: impl std::fmt::Display) -> Failure {
    Failure::Refused(e.to_string())
}

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Self {
        Failure::Io(e.to_string())
    }
}

fn column_index(meta: &ParquetMetaData, name: &str) -> Result<usize, Failure> {
    let schema = meta.file_metadata().schema_descr();
    (0..schema.num_columns())
        .find(|&i| schema.column(i).path().string() == name)
        .ok_or_else(|| refused(format!("no column {name}")))
}

fn stats_of(metas: &[Arc<ParquetMetaData>], name: &str) -> Result<ColumnStats, Failure> {
    let (mut min, mut max, mut nulls): (Option<i64>, Option<i64>, u64) = (None, None, 0);
    for meta in metas {
        let index = column_index(meta, name)?;
        for rg in meta.row_groups() {
            let stats = rg.column(index).statistics().ok_or_else(|| {
                Failure::Refused(format!("a row group has no statistics for {name}"))
            })?;
            let (lo, hi) = match stats {
                Statistics::Int64(s) => (s.min_opt().copied(), s.max_opt().copied()),
                Statistics::Int32(s) => (
                    s.min_opt().map(|v| *v as i64),
                    s.max_opt().map(|v| *v as i64),
                ),
                _ => return Err(Failure::Refused(format!("{name} is not an integer column"))),
            };
            let n = stats.null_count_opt().ok_or_else(|| {
                Failure::Refused(format!("a row group has no null count for {name}"))
            })?;
            if rg.num_rows() > n as i64 && (lo.is_none() || hi.is_none()) {
                return Err(Failure::Refused(format!(
                    "a row group has values but no min/max for {name}"
                )));
            }
            nulls += n;
            min = match (min, lo) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            max = match (max, hi) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            };
        }
    }
    Ok((min, max, nulls))
}

/// What the caller asks of the inputs before they are copied.
struct Rules<'a> {
    required: (&'a str, &'a str),
    order_column: &'a str,
    min_group_rows: i64,
    min_group_bytes: i64,
}

fn check_order(metas: &[Arc<ParquetMetaData>], name: &str) -> Result<(), Failure> {
    let mut last: Option<i64> = None;
    for meta in metas {
        let index = column_index(meta, name)?;
        for rg in meta.row_groups() {
            let (lo, hi) = match rg.column(index).statistics() {
                Some(Statistics::Int64(s)) => (s.min_opt().copied(), s.max_opt().copied()),
                _ => {
                    return Err(refused(format!(
                        "a row group has no INT64 range for {name}"
                    )))
                }
            };
            let (Some(lo), Some(hi)) = (lo, hi) else {
                return Err(refused(format!("a row group has no range for {name}")));
            };
            if last.is_some_and(|prev| lo <= prev) {
                return Err(refused(format!(
                    "{name} does not ascend across the inputs' row groups"
                )));
            }
            last = Some(hi);
        }
    }
    Ok(())
}

fn merge_files(
    inputs: &[String],
    output: &str,
    stats_columns: &[String],
    rules: &Rules,
) -> Result<(u64, i64, Vec<ColumnStats>), Failure> {
    if inputs.is_empty() {
        return Err(refused("nothing to merge"));
    }
    let mut files = Vec::with_capacity(inputs.len());
    let mut metas = Vec::with_capacity(inputs.len());
    for path in inputs {
        let file = File::open(path)?;
        let reader = SerializedFileReader::new(file.try_clone()?).map_err(refused)?;
        metas.push(Arc::new(reader.metadata().clone()));
        files.push(file);
    }
    let groups: i64 = metas.iter().map(|m| m.num_row_groups() as i64).sum();
    let rows: i64 = metas
        .iter()
        .flat_map(|m| m.row_groups())
        .map(|rg| rg.num_rows())
        .sum();
    let bytes: i64 = metas
        .iter()
        .flat_map(|m| m.row_groups())
        .map(|rg| rg.total_byte_size())
        .sum();
    if groups > 0 && rows / groups < rules.min_group_rows && bytes / groups < rules.min_group_bytes
    {
        return Err(refused(format!(
            "row groups of {} rows and {} bytes on average: small enough to rewrite",
            rows / groups,
            bytes / groups
        )));
    }
    let required = rules.required;
    let first = metas[0].file_metadata();
    let marked = first.key_value_metadata().is_some_and(|kv| {
        kv.iter()
            .any(|e| e.key == required.0 && e.value.as_deref() == Some(required.1))
    });
    if !marked {
        return Err(Failure::Refused(format!(
            "an input lacks {}={}",
            required.0, required.1
        )));
    }
    for meta in &metas[1..] {
        if meta.file_metadata().schema_descr().root_schema() != first.schema_descr().root_schema()
            || meta.file_metadata().key_value_metadata() != first.key_value_metadata()
        {
            return Err(Failure::Refused("the inputs' schemas differ".into()));
        }
    }
    check_order(&metas, rules.order_column)?;
    let stats = stats_columns
        .iter()
        .map(|name| stats_of(&metas, name))
        .collect::<Result<Vec<_>, _>>()?;
    let props = WriterProperties::builder()
        .set_key_value_metadata(first.key_value_metadata().cloned())
        .build();
    let out = File::create_new(output)?;
    let written = (|| -> Result<i64, Failure> {
        let mut writer = SerializedFileWriter::new(
            out,
            first.schema_descr().root_schema_ptr(),
            Arc::new(props),
        )?;
        let mut rows = 0i64;
        for (file, meta) in files.iter().zip(&metas) {
            for rg in meta.row_groups() {
                let mut group = writer.next_row_group()?;
                for column in rg.columns() {
                    let close = ColumnCloseResult {
                        bytes_written: column.compressed_size() as u64,
                        rows_written: rg.num_rows() as u64,
                        metadata: column.clone(),
                        bloom_filter: None,
                        column_index: None,
                        offset_index: None,
                    };
                    group.append_column(file, close)?;
                }
                group.close()?;
                rows += rg.num_rows();
            }
        }
        writer.close()?;
        Ok(rows)
    })();
    match written {
        Ok(rows) => Ok((fs::metadata(output)?.len(), rows, stats)),
        Err(e) => {
            let _ = fs::remove_file(output);
            Err(e)
        }
    }
}

/// Merge `inputs` (each marked `required_key`=`required_value`) into the new file `output`;
/// returns (size, rows, stats per `stats_columns`).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn merge(
    py: Python<'_>,
    inputs: Vec<String>,
    output: String,
    stats_columns: Vec<String>,
    required_key: String,
    required_value: String,
    order_column: String,
    min_group_rows: i64,
    min_group_bytes: i64,
) -> PyResult<(u64, i64, Vec<ColumnStats>)> {
    let rules = Rules {
        required: (&required_key, &required_value),
        order_column: &order_column,
        min_group_rows,
        min_group_bytes,
    };
    let outcome = py.detach(|| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            merge_files(&inputs, &output, &stats_columns, &rules)
        }))
        .unwrap_or_else(|_| {
            let _ = fs::remove_file(&output);
            Err(Failure::Io("the merge panicked".into()))
        })
    });
    outcome.map_err(|e| match e {
        Failure::Refused(m) => PyValueError::new_err(m),
        Failure::Io(m) => PyOSError::new_err(m),
    })
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(merge, m)?)?;
    Ok(())
}
