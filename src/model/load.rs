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

/// A tensor's values, dequantized to f32 (exact), row after row.
fn values(t: &QTensor, name: &str) -> Result<Vec<f32>, ModelError> {
    t.dequantize(&Device::Cpu)
        .and_then(|v| v.flatten_all())
        .and_then(|v| v.to_vec1::<f32>())
        .map_err(|e| ModelError::Metadata(format!("tensor {name}: {e}")))
}

/// A 2-D tensor as a matrix: in its blocks when it has a format the
/// engine multiplies, else (or when `dequantize`) as f32.
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
        _ => Matrix::dense(rows, cols, values(t, name)?),
    };
    m.map_err(|e| bad(e.to_string()))
}

/// Read the model's tensors from `file` into an engine of `threads`
/// threads (0: one per core). [`Engine::new`] checks every shape.
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
    let mut mat = |name: &str| matrix(&read(name)?, name, dequantize);
    let embed = mat("token_embd.weight")?;
    let output = if content.tensor_infos.contains_key("output.weight") {
        Some(mat("output.weight")?)
    } else {
        None
    };
    let mut layers = Vec::with_capacity(shape.layers);
    for i in 0..shape.layers {
        let mut m = |part: &str| mat(&format!("blk.{i}.{part}.weight"));
        layers.push(Layer {
            q: m("attn_q")?,
            k: m("attn_k")?,
            v: m("attn_v")?,
            o: m("attn_output")?,
            gate: m("ffn_gate")?,
            up: m("ffn_up")?,
            down: m("ffn_down")?,
            attn_norm: Vec::new(),
            ffn_norm: Vec::new(),
        });
    }
    // The norms are vectors, read once the matrices' reader is done.
    let mut vector = |name: &str| values(&read(name)?, name);
    for (i, layer) in layers.iter_mut().enumerate() {
        layer.attn_norm = vector(&format!("blk.{i}.attn_norm.weight"))?;
        layer.ffn_norm = vector(&format!("blk.{i}.ffn_norm.weight"))?;
    }
    let norm = vector("output_norm.weight")?;
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
