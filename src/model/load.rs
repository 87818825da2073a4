//! Build the engine (`rollcall_engine::Engine`) from a GGUF file's tensors
//! and metadata.
//!
//! Q4_0, Q4_1 and Q8_0 matrices stay in their blocks; F32 tensors are read
//! as they are, and every other format (F16, BF16, the k-quants) is
//! dequantized to f32 by candle's reader at load, which is exact but four
//! bytes a weight. `dequantize` turns every matrix into f32.

use crate::model::ModelError;
use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::Device;
use rollcall_engine::quant::{Format, Matrix};
use rollcall_engine::{Engine, Layer, Shape};
use std::collections::HashMap;

fn md_u32(md: &HashMap<String, gguf_file::Value>, key: &str) -> Result<usize, ModelError> {
    md.get(key)
        .and_then(|v| v.to_u32().ok())
        .map(|v| v as usize)
        .ok_or_else(|| ModelError::Metadata(format!("{key} is missing or not an integer")))
}

fn md_f32(md: &HashMap<String, gguf_file::Value>, key: &str) -> Option<f32> {
    md.get(key).and_then(|v| v.to_f32().ok())
}

/// The model's shape from its `llama.*` metadata and its embedding's
/// rows (the vocabulary); `max_context` caps the rotary table.
pub fn shape(content: &gguf_file::Content, max_context: usize) -> Result<Shape, ModelError> {
    let md = &content.metadata;
    let vocab = content
        .tensor_infos
        .get("token_embd.weight")
        .and_then(|t| t.shape.dims2().ok())
        .map(|(rows, _)| rows)
        .ok_or_else(|| ModelError::Metadata("token_embd.weight is missing or not 2-D".into()))?;
    let dim = md_u32(md, "llama.embedding_length")?;
    let heads = md_u32(md, "llama.attention.head_count")?;
    let kv_heads = md_u32(md, "llama.attention.head_count_kv").unwrap_or(heads);
    if heads == 0 || kv_heads == 0 || dim % heads != 0 || heads % kv_heads != 0 {
        return Err(ModelError::Metadata(format!(
            "{heads} attention heads ({kv_heads} for keys and values) do not divide a width of {dim}"
        )));
    }
    let head_dim = dim / heads;
    let rope_dims = md_u32(md, "llama.rope.dimension_count").unwrap_or(head_dim);
    if rope_dims != head_dim || head_dim % 2 != 0 {
        return Err(ModelError::Unsupported(format!(
            "rotary embeddings over {rope_dims} of {head_dim} head dimensions"
        )));
    }
    if let Some(kind) = md
        .get("llama.rope.scaling.type")
        .and_then(|v| v.to_string().ok())
    {
        if kind != "none" {
            return Err(ModelError::Unsupported(format!("rope scaling {kind:?}")));
        }
    }
    let context = md_u32(md, "llama.context_length").map_or(max_context, |c| c.min(max_context));
    Ok(Shape {
        layers: md_u32(md, "llama.block_count")?,
        dim,
        heads,
        kv_heads,
        head_dim,
        ffn: md_u32(md, "llama.feed_forward_length")?,
        vocab,
        eps: md_f32(md, "llama.attention.layer_norm_rms_epsilon").unwrap_or(1e-5),
        rope_theta: md_f32(md, "llama.rope.freq_base").unwrap_or(10_000.0),
        context,
    })
}

/// A tensor as a matrix of `rows × cols`, checked.
pub fn matrix(t: &QTensor, name: &str, dequantize: bool) -> Result<Matrix, ModelError> {
    let bad = |m: String| ModelError::Metadata(format!("tensor {name}: {m}"));
    let (rows, cols) = t.shape().dims2().map_err(|e| bad(e.to_string()))?;
    let format = match t.dtype() {
        GgmlDType::Q4_0 => Some(Format::Q4_0),
        GgmlDType::Q4_1 => Some(Format::Q4_1),
        GgmlDType::Q8_0 => Some(Format::Q8_0),
        _ => None,
    };
    let m = match format {
        Some(f) if !dequantize => {
            let data = t.data().map_err(|e| bad(e.to_string()))?;
            Matrix::quantized(f, rows, cols, &data)
        }
        _ => {
            let values = t
                .dequantize(&Device::Cpu)
                .and_then(|v| v.flatten_all())
                .and_then(|v| v.to_vec1::<f32>())
                .map_err(|e| bad(e.to_string()))?;
            Matrix::dense(rows, cols, values)
        }
    };
    m.map_err(|e| bad(e.to_string()))
}

fn vector(t: &QTensor, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
    let v = t
        .dequantize(&Device::Cpu)
        .and_then(|v| v.flatten_all())
        .and_then(|v| v.to_vec1::<f32>())
        .map_err(|e| ModelError::Metadata(format!("tensor {name}: {e}")))?;
    if v.len() != len {
        return Err(ModelError::Metadata(format!(
            "tensor {name} holds {} values, not {len}",
            v.len()
        )));
    }
    Ok(v)
}

/// Read the model's tensors from `file` into an engine of `threads`
/// threads (0: one per core).
pub fn engine<R: std::io::Read + std::io::Seek>(
    content: &gguf_file::Content,
    file: &mut R,
    shape: Shape,
    threads: usize,
    dequantize: bool,
) -> Result<Engine, ModelError> {
    let mut read = |name: &str| -> Result<QTensor, ModelError> {
        content
            .tensor(file, name, &Device::Cpu)
            .map_err(|e| ModelError::Metadata(format!("tensor {name}: {e}")))
    };
    let mut mat = |name: &str, rows: usize, cols: usize| -> Result<Matrix, ModelError> {
        let m = matrix(&read(name)?, name, dequantize)?;
        if (m.rows(), m.cols()) != (rows, cols) {
            return Err(ModelError::Metadata(format!(
                "tensor {name} is {}x{}, not {rows}x{cols}",
                m.rows(),
                m.cols()
            )));
        }
        Ok(m)
    };
    let s = &shape;
    let kvw = s.kv_heads * s.head_dim;
    let embed = mat("token_embd.weight", s.vocab, s.dim)?;
    let output = if content.tensor_infos.contains_key("output.weight") {
        Some(mat("output.weight", s.vocab, s.dim)?)
    } else {
        None
    };
    let mut layers = Vec::with_capacity(s.layers);
    for i in 0..s.layers {
        let p = format!("blk.{i}");
        layers.push(Layer {
            q: mat(&format!("{p}.attn_q.weight"), s.dim, s.dim)?,
            k: mat(&format!("{p}.attn_k.weight"), kvw, s.dim)?,
            v: mat(&format!("{p}.attn_v.weight"), kvw, s.dim)?,
            o: mat(&format!("{p}.attn_output.weight"), s.dim, s.dim)?,
            gate: mat(&format!("{p}.ffn_gate.weight"), s.ffn, s.dim)?,
            up: mat(&format!("{p}.ffn_up.weight"), s.ffn, s.dim)?,
            down: mat(&format!("{p}.ffn_down.weight"), s.dim, s.ffn)?,
            attn_norm: Vec::new(),
            ffn_norm: Vec::new(),
        });
    }
    for (i, layer) in layers.iter_mut().enumerate() {
        let an = format!("blk.{i}.attn_norm.weight");
        layer.attn_norm = vector(&read(&an)?, &an, s.dim)?;
        let fname = format!("blk.{i}.ffn_norm.weight");
        layer.ffn_norm = vector(&read(&fname)?, &fname, s.dim)?;
    }
    let norm = vector(&read("output_norm.weight")?, "output_norm.weight", s.dim)?;
    Engine::new(shape, embed, layers, norm, output, threads)
        .map_err(|e| ModelError::Metadata(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Tensor;

    #[test]
    fn blocks_read_from_candle_dequantize_as_candle_does() {
        let values: Vec<f32> = (0..4 * 64)
            .map(|i| ((i * 29 % 61) as f32 - 30.0) / 13.0)
            .collect();
        let t = Tensor::from_vec(values, (4, 64), &Device::Cpu).unwrap();
        for dtype in [GgmlDType::Q4_0, GgmlDType::Q4_1, GgmlDType::Q8_0] {
            let q = QTensor::quantize(&t, dtype).unwrap();
            let want = q
                .dequantize(&Device::Cpu)
                .unwrap()
                .to_vec2::<f32>()
                .unwrap();
            let m = matrix(&q, "t", false).unwrap();
            let mut row = vec![0.0; 64];
            for (r, w) in want.iter().enumerate() {
                m.dequantize_row(r, &mut row);
                assert_eq!(&row, w, "{dtype:?} row {r}");
            }
        }
    }
}
