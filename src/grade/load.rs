//! Task files: JSON lines, one JSON object (or an array of them), or
//! Parquet (string columns; the test lists as JSON strings, as Hugging Face
//! publishes SWE-bench Verified, or as list<string> columns).

use super::instance::{FieldError, Instance};
use arrow::array::{Array, AsArray};
use arrow::datatypes::DataType;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::path::Path;

/// Why a task file cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// cannot read {file}: {why}
    #[error("cannot read {file}: {why}")]
    Io { file: String, why: String },
    /// {file} line {line}: not JSON: {why}
    #[error("{file} line {line}: not JSON: {why}")]
    Json {
        file: String,
        line: usize,
        why: String,
    },
    /// {file} {at}: {source}
    #[error("{file} {at}: {source}")]
    Field {
        file: String,
        at: String,
        source: FieldError,
    },
    /// {file}: not a Parquet file SWE-bench tasks can be read from: {why}
    #[error("{file}: not a Parquet file SWE-bench tasks can be read from: {why}")]
    Parquet { file: String, why: String },
    /// {file}: column {column} is {found}, not a string or a list of strings
    #[error("{file}: column {column} is {found}, not a string or a list of strings")]
    Column {
        file: String,
        column: String,
        found: String,
    },
    /// {file}: instance {instance_id} appears twice ({first} and {second})
    #[error("{file}: instance {instance_id} appears twice ({first} and {second})")]
    Duplicate {
        file: String,
        instance_id: String,
        first: String,
        second: String,
    },
    /// {file} holds no instance
    #[error("{file} holds no instance")]
    Empty { file: String },
}

/// The instance fields read from Parquet columns (other columns are left
/// alone, whatever their type).
const FIELDS: &[&str] = &[
    "instance_id",
    "repo",
    "version",
    "base_commit",
    "problem_statement",
    "test_patch",
    "FAIL_TO_PASS",
    "PASS_TO_PASS",
    "image",
    "workdir",
    "test_cmd",
    "log_parser",
    "patch",
];

/// Read every instance of a task file: `.parquet` by its extension, else a
/// JSON value (an object, or an array of objects) if the whole file is
/// one, else JSON lines (blank lines skipped). Instance ids must be unique.
pub fn load_tasks(path: &Path) -> Result<Vec<Instance>, LoadError> {
    let file = path.display().to_string();
    let rows = if path.extension().is_some_and(|e| e == "parquet") {
        parquet_rows(path, &file)?
    } else {
        let text = std::fs::read_to_string(path).map_err(|e| LoadError::Io {
            file: file.clone(),
            why: e.to_string(),
        })?;
        json_rows(&text, &file)?
    };
    instances(rows, file)
}

/// The instances of task objects given inline (the job API's `tasks`
/// array), checked as a task file's are; `what` names them in errors.
pub fn tasks_from_json(items: Vec<Value>, what: &str) -> Result<Vec<Instance>, LoadError> {
    let rows = items
        .into_iter()
        .enumerate()
        .map(|(i, v)| (format!("item {}", i + 1), v))
        .collect();
    instances(rows, what.to_owned())
}

/// Instances from JSON values, each with where it is; ids must be unique.
fn instances(rows: Vec<(String, Value)>, file: String) -> Result<Vec<Instance>, LoadError> {
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    let mut out = Vec::with_capacity(rows.len());
    for (at, v) in rows {
        let i = Instance::from_json(&v).map_err(|source| LoadError::Field {
            file: file.clone(),
            at: at.clone(),
            source,
        })?;
        if let Some(first) = seen.insert(i.instance_id.clone(), at.clone()) {
            return Err(LoadError::Duplicate {
                file,
                instance_id: i.instance_id,
                first,
                second: at,
            });
        }
        out.push(i);
    }
    if out.is_empty() {
        return Err(LoadError::Empty { file });
    }
    Ok(out)
}

/// The JSON values of a text file, each with where it is ("line 3").
fn json_rows(text: &str, file: &str) -> Result<Vec<(String, Value)>, LoadError> {
    if let Ok(v) = serde_json::from_str::<Value>(text) {
        return Ok(match v {
            Value::Array(items) => items
                .into_iter()
                .enumerate()
                .map(|(i, v)| (format!("item {}", i + 1), v))
                .collect(),
            v => vec![("line 1".to_owned(), v)],
        });
    }
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v = serde_json::from_str(line).map_err(|e| LoadError::Json {
            file: file.to_owned(),
            line: i + 1,
            why: e.to_string(),
        })?;
        out.push((format!("line {}", i + 1), v));
    }
    Ok(out)
}

/// A string cell, or None for a column type that is not a string.
fn text_at(col: &dyn Array, i: usize) -> Option<String> {
    match col.data_type() {
        DataType::Utf8 => col.as_string_opt::<i32>().map(|a| a.value(i).to_owned()),
        DataType::LargeUtf8 => col.as_string_opt::<i64>().map(|a| a.value(i).to_owned()),
        DataType::Utf8View => col.as_string_view_opt().map(|a| a.value(i).to_owned()),
        _ => None,
    }
}

/// A cell as JSON: a string, an array of strings, or null. None for a
/// type that is neither.
fn cell(col: &dyn Array, i: usize) -> Option<Value> {
    if col.is_null(i) {
        return Some(Value::Null);
    }
    let items = match col.data_type() {
        DataType::List(_) => col.as_list_opt::<i32>().map(|l| l.value(i)),
        DataType::LargeList(_) => col.as_list_opt::<i64>().map(|l| l.value(i)),
        _ => return text_at(col, i).map(Value::String),
    }?;
    (0..items.len())
        .map(|j| {
            if items.is_null(j) {
                Some(Value::Null)
            } else {
                text_at(items.as_ref(), j).map(Value::String)
            }
        })
        .collect::<Option<Vec<Value>>>()
        .map(Value::Array)
}

fn parquet_rows(path: &Path, file: &str) -> Result<Vec<(String, Value)>, LoadError> {
    let bad = |why: String| LoadError::Parquet {
        file: file.to_owned(),
        why,
    };
    let f = std::fs::File::open(path).map_err(|e| LoadError::Io {
        file: file.to_owned(),
        why: e.to_string(),
    })?;
    let reader = ParquetRecordBatchReaderBuilder::try_new(f)
        .and_then(|b| b.with_batch_size(256).build())
        .map_err(|e| bad(e.to_string()))?;
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|e| bad(e.to_string()))?;
        let cols: Vec<(&str, &dyn Array)> = FIELDS
            .iter()
            .filter_map(|f| batch.column_by_name(f).map(|c| (*f, c.as_ref())))
            .collect();
        for i in 0..batch.num_rows() {
            let mut row = Map::new();
            for (name, col) in &cols {
                let v = cell(*col, i).ok_or_else(|| LoadError::Column {
                    file: file.to_owned(),
                    column: (*name).to_owned(),
                    found: col.data_type().to_string(),
                })?;
                if !v.is_null() {
                    row.insert((*name).to_owned(), v);
                }
            }
            out.push((format!("row {}", out.len() + 1), Value::Object(row)));
        }
    }
    Ok(out)
}
