//! The Parquet files the exports write: their writer properties, a file
//! written batch by batch ([`ParquetOut`]), and the list type their
//! schemas use for every list column ([`list_of`]).

use super::{write_err, ExportError};
use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Field, SchemaRef};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use std::path::PathBuf;
use std::sync::Arc;

/// Parquet writer properties for exports: zstd, no per-run metadata.
pub(crate) fn writer_props() -> WriterProperties {
    WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .set_max_row_group_row_count(Some(8192))
        .set_max_row_group_bytes(Some(64 << 20))
        .build()
}

/// A Parquet file written batch by batch.
pub(crate) struct ParquetOut {
    pub path: PathBuf,
    w: ArrowWriter<std::fs::File>,
}

impl ParquetOut {
    pub fn create(path: PathBuf, schema: SchemaRef) -> Result<ParquetOut, ExportError> {
        let f = std::fs::File::create(&path).map_err(|e| write_err(&path, e))?;
        let w = ArrowWriter::try_new(f, schema, Some(writer_props()))
            .map_err(|e| write_err(&path, e))?;
        Ok(ParquetOut { path, w })
    }

    pub fn write(&mut self, b: &RecordBatch) -> Result<(), ExportError> {
        self.w.write(b).map_err(|e| write_err(&self.path, e))
    }

    pub fn close(self) -> Result<(), ExportError> {
        self.w.close().map_err(|e| write_err(&self.path, e))?;
        Ok(())
    }
}

/// A list of `t` (nullable items named `item`, as Arrow writes them).
pub(crate) fn list_of(t: DataType) -> DataType {
    DataType::List(Arc::new(Field::new("item", t, true)))
}
