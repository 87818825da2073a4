//! `--trainer verl`: `OUT/verl/sft-00000.parquet`, …, messages and tools
//! as native nested columns whose Arrow types read back exactly, one file
//! per distinct (messages, tools) type (verl's MultiTurnSFTDataset).

use super::generic::{batch_with, schema_with};
use super::{Arguments, SftCounts, SftSample};
use crate::export::native;
use crate::export::parquet_out::ParquetOut;
use crate::export::{write_err, ExportError};
use arrow::datatypes::{DataType, Field, SchemaRef};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// A row for verl: its messages and tools as JSON whose native Arrow
/// types read back exactly.
pub(super) struct VerlRow {
    sample: SftSample,
    pub(super) messages: Value,
    tools: Value,
}

/// The native form of a sample for verl, or `None` (left out). Returns
/// whether its arguments had to be written as strings.
pub(super) fn verl_row(
    s: SftSample,
    args: Arguments,
) -> Option<((DataType, DataType), VerlRow, bool)> {
    let as_json = |a| {
        Value::Array(
            s.messages
                .iter()
                .map(|m| m.to_value_with(true, a))
                .collect(),
        )
    };
    let (messages, m_ty, as_string) = match native::exact(&as_json(args)) {
        Ok((t, _)) => (as_json(args), t, false),
        Err(_) if args == Arguments::Object => {
            let m = as_json(Arguments::String);
            let (t, _) = native::exact(&m).ok()?;
            (m, t, true)
        }
        Err(_) => return None,
    };
    // No tools is an empty list, not null: pandas reads a null as `pd.NA`,
    // which `apply_chat_template(tools=...)` would try to iterate; an empty
    // list renders no tools block.
    let tools = s.tools.clone().unwrap_or_else(|| Value::Array(vec![]));
    let t_ty = native::exact(&tools).ok()?.0;
    Some((
        (m_ty, t_ty),
        VerlRow {
            sample: s,
            messages,
            tools,
        },
        as_string,
    ))
}

struct VerlFile {
    key: (DataType, DataType),
    out: ParquetOut,
    pending: Vec<VerlRow>,
}

impl VerlFile {
    fn schema(key: &(DataType, DataType)) -> SchemaRef {
        schema_with(key.0.clone(), Field::new("tools", key.1.clone(), true))
    }

    fn flush(&mut self) -> Result<(), ExportError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let err = |e: native::NotNative| write_err(&self.out.path, e);
        let m: Vec<Option<&Value>> = self.pending.iter().map(|r| Some(&r.messages)).collect();
        let t: Vec<Option<&Value>> = self.pending.iter().map(|r| Some(&r.tools)).collect();
        let messages = native::build(&self.key.0, &m).map_err(err)?;
        let tools = native::build(&self.key.1, &t).map_err(err)?;
        let rows: Vec<&SftSample> = self.pending.iter().map(|r| &r.sample).collect();
        let b = batch_with(Self::schema(&self.key), &rows, messages, tools)
            .map_err(|e| write_err(&self.out.path, e))?;
        self.pending.clear();
        self.out.write(&b)
    }
}

/// Writes SFT samples for verl: `verl/sft-00000.parquet`, …, one file per
/// distinct (messages, tools) Arrow type, numbered in order of first use.
pub struct VerlWriter {
    dir: PathBuf,
    files: Vec<VerlFile>,
    args: Arguments,
}

/// Is `name` one of the files [`VerlWriter`] writes?
pub(super) fn is_verl_part(name: &str) -> bool {
    name.strip_prefix("sft-")
        .and_then(|n| n.strip_suffix(".parquet"))
        .is_some_and(|n| n.len() == 5 && n.bytes().all(|b| b.is_ascii_digit()))
}

impl VerlWriter {
    /// Create `OUT/verl/`, removing the parts an earlier export left there.
    pub fn create(out: &Path, args: Arguments) -> Result<VerlWriter, ExportError> {
        let dir = out.join("verl");
        std::fs::create_dir_all(&dir).map_err(|e| write_err(&dir, e))?;
        for e in std::fs::read_dir(&dir).map_err(|e| write_err(&dir, e))? {
            let p = e.map_err(|e| write_err(&dir, e))?.path();
            if p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(is_verl_part)
            {
                std::fs::remove_file(&p).map_err(|e| write_err(&p, e))?;
            }
        }
        Ok(VerlWriter {
            dir,
            files: vec![],
            args,
        })
    }

    /// Write `s`, counting into `c`.
    pub fn push(&mut self, s: SftSample, c: &mut SftCounts) -> Result<(), ExportError> {
        let Some((key, row, as_string)) = verl_row(s, self.args) else {
            c.verl_skipped += 1;
            return Ok(());
        };
        c.verl_samples += 1;
        c.verl_arguments_as_string += usize::from(as_string);
        let i = match self.files.iter().position(|f| f.key == key) {
            Some(i) => i,
            None => {
                let path = self
                    .dir
                    .join(format!("sft-{:05}.parquet", self.files.len()));
                let out = ParquetOut::create(path, VerlFile::schema(&key))?;
                self.files.push(VerlFile {
                    key,
                    out,
                    pending: vec![],
                });
                self.files.len() - 1
            }
        };
        let f = &mut self.files[i];
        f.pending.push(row);
        if f.pending.len() >= 256 {
            f.flush()?;
        }
        Ok(())
    }

    pub fn finish(self) -> Result<Vec<String>, ExportError> {
        let mut names = vec![];
        for (i, mut f) in self.files.into_iter().enumerate() {
            f.flush()?;
            f.out.close()?;
            names.push(format!("verl/sft-{i:05}.parquet"));
        }
        Ok(names)
    }
}
