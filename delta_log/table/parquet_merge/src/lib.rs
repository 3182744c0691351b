//! `delta_log.table.parquet_merge._native`: several parquet files of one schema merged into one by copying
//! their encoded column chunks (parquet-rs `append_column`), with no decompression, decoding or
//! encoding. The roll-up (`delta_log/maintenance/rollup.py`) is the only caller.
//!
//! - `merge(inputs, output, stats_columns)` writes `output` (which must not exist) with every row
//!   group of every input, in order, and the first input's key-value metadata (pyarrow's
//!   `ARROW:schema`, so the Arrow types read back the same). It returns `(size, rows, stats)`:
//!   per name in `stats_columns`, `(min, max, null_count)` of that INT32/INT64 column over every
//!   row group, min and max None when no row group has a value.
//! - Inputs whose schemas differ, an input without the key-value metadata `required_key` =
//!   `required_value` (the writer's mark that its rows ascend by offset: chunks are copied in
//!   order, never sorted), or a row group without statistics for a stats column, raise
//!   `ValueError` before anything is written; the caller then merges by decoding.
//! - Runs with the GIL released. On any failure the partial output is removed.

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

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Self {
        Failure::Io(e.to_string())
    }
}

fn stats_of(metas: &[Arc<ParquetMetaData>], name: &str) -> Result<ColumnStats, Failure> {
    let (mut min, mut max, mut nulls): (Option<i64>, Option<i64>, u64) = (None, None, 0);
    for meta in metas {
        let schema = meta.file_metadata().schema_descr();
        let index = (0..schema.num_columns())
            .find(|&i| schema.column(i).path().string() == name)
            .ok_or_else(|| Failure::Refused(format!("no column {name}")))?;
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

fn merge_files(
    inputs: &[String],
    output: &str,
    stats_columns: &[String],
    required: (&str, &str),
) -> Result<(u64, i64, Vec<ColumnStats>), Failure> {
    if inputs.is_empty() {
        return Err(Failure::Refused("nothing to merge".into()));
    }
    let mut files = Vec::with_capacity(inputs.len());
    let mut metas = Vec::with_capacity(inputs.len());
    for path in inputs {
        let file = File::open(path)?;
        let reader = SerializedFileReader::new(file.try_clone()?)?;
        metas.push(Arc::new(reader.metadata().clone()));
        files.push(file);
    }
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
fn merge(
    py: Python<'_>,
    inputs: Vec<String>,
    output: String,
    stats_columns: Vec<String>,
    required_key: String,
    required_value: String,
) -> PyResult<(u64, i64, Vec<ColumnStats>)> {
    py.detach(|| {
        merge_files(
            &inputs,
            &output,
            &stats_columns,
            (&required_key, &required_value),
        )
    })
    .map_err(|e| match e {
        Failure::Refused(m) => PyValueError::new_err(m),
        Failure::Io(m) => PyOSError::new_err(m),
    })
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(merge, m)?)?;
    Ok(())
}
