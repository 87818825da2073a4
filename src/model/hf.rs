//! A Hugging Face checkpoint directory of a llama-architecture model, as
//! `transformers`' `save_pretrained` (and so TRL) writes it: `config.json`,
//! the tokenizer files and one or more `*.safetensors`.
//!
//! The weights are read as f32 (F32, F16 and BF16 tensors are exact in
//! f32) and kept dense. `transformers` rotates query and key pairs split
//! in halves (`rotate_half`) where GGUF files, and so the engine, rotate
//! adjacent pairs: llama.cpp's converter permutes each head's rows of
//! `q_proj` and `k_proj`, and so does this reader, so that both give the
//! same numbers.

use super::ModelError;
use candle_core::{DType, Device, Tensor};
use rollcall_engine::quant::Matrix;
use rollcall_engine::{Engine, Layer, Shape};
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

fn read_json(path: &Path) -> Result<Value, ModelError> {
    let text = std::fs::read_to_string(path).map_err(|e| ModelError::Read {
        path: path.into(),
        message: e.to_string(),
    })?;
    serde_json::from_str(&text).map_err(|e| ModelError::Read {
        path: path.into(),
        message: format!("not valid JSON: {e}"),
    })
}

/// `config.json`, checked to describe a model the engine runs.
pub struct Config {
    json: Value,
    pub shape: Shape,
    pub tied: bool,
}

fn field(json: &Value, key: &str) -> Result<usize, ModelError> {
    json.get(key)
        .and_then(Value::as_u64)
        .map(|v| v as usize)
        .ok_or_else(|| {
            ModelError::Metadata(format!("config.json: {key} is missing or not an integer"))
        })
}

impl Config {
    pub fn read(dir: &Path, max_context: usize) -> Result<Config, ModelError> {
        let json = read_json(&dir.join("config.json"))?;
        let kind = json
            .get("model_type")
            .and_then(Value::as_str)
            .unwrap_or("?");
        if kind != "llama" {
            return Err(ModelError::Unsupported(format!(
                "model_type {kind:?}; the embedded upstream runs llama-architecture models"
            )));
        }
        for bias in ["attention_bias", "mlp_bias"] {
            if json.get(bias).and_then(Value::as_bool) == Some(true) {
                return Err(ModelError::Unsupported(format!("{bias} = true")));
            }
        }
        // transformers 5 writes `rope_parameters` (theta and type
        // together); earlier versions `rope_theta` and `rope_scaling`.
        let rope = json.get("rope_parameters").filter(|r| r.is_object());
        if let Some(s) = rope.or(json.get("rope_scaling")).filter(|s| !s.is_null()) {
            let kind = s
                .get("rope_type")
                .or_else(|| s.get("type"))
                .and_then(Value::as_str)
                .unwrap_or("default");
            if kind != "default" {
                return Err(ModelError::Unsupported(format!("rope scaling {kind:?}")));
            }
        }
        let rope_theta = rope
            .and_then(|r| r.get("rope_theta"))
            .or(json.get("rope_theta"))
            .and_then(Value::as_f64)
            .unwrap_or(10_000.0) as f32;
        let dim = field(&json, "hidden_size")?;
        let heads = field(&json, "num_attention_heads")?;
        let kv_heads = field(&json, "num_key_value_heads").unwrap_or(heads);
        if heads == 0 || kv_heads == 0 || heads % kv_heads != 0 || dim % heads != 0 {
            return Err(ModelError::Metadata(format!(
                "config.json: {heads} attention heads ({kv_heads} for keys and values) do not divide a width of {dim}"
            )));
        }
        let head_dim = field(&json, "head_dim").unwrap_or(dim / heads);
        if head_dim * heads != dim || !head_dim.is_multiple_of(2) {
            return Err(ModelError::Unsupported(format!(
                "a head width of {head_dim} with {heads} heads over a width of {dim}"
            )));
        }
        let context =
            field(&json, "max_position_embeddings").map_or(max_context, |c| c.min(max_context));
        let shape = Shape {
            layers: field(&json, "num_hidden_layers")?,
            dim,
            heads,
            kv_heads,
            head_dim,
            ffn: field(&json, "intermediate_size")?,
            vocab: field(&json, "vocab_size")?,
            eps: json
                .get("rms_norm_eps")
                .and_then(Value::as_f64)
                .unwrap_or(1e-6) as f32,
            rope_theta,
            context,
        };
        let tied = json
            .get("tie_word_embeddings")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        Ok(Config { json, shape, tied })
    }

    /// The token ids that end a turn: `eos_token_id` (one or a list) of
    /// `generation_config.json`, else of `config.json`.
    pub fn eos_ids(&self, dir: &Path) -> Vec<u32> {
        let generation = read_json(&dir.join("generation_config.json")).ok();
        let ids = |v: &Value| -> Vec<u32> {
            match v.get("eos_token_id") {
                Some(Value::Number(n)) => n.as_u64().map(|n| n as u32).into_iter().collect(),
                Some(Value::Array(a)) => a
                    .iter()
                    .filter_map(|n| n.as_u64().map(|n| n as u32))
                    .collect(),
                _ => Vec::new(),
            }
        };
        let from_generation = generation.as_ref().map(ids).unwrap_or_default();
        if from_generation.is_empty() {
            ids(&self.json)
        } else {
            from_generation
        }
    }
}

/// The directory's safetensors files: those its index names, else every
/// `*.safetensors` in it.
fn shards(dir: &Path) -> Result<Vec<PathBuf>, ModelError> {
    let index = dir.join("model.safetensors.index.json");
    let mut files: Vec<PathBuf> = if index.exists() {
        let json = read_json(&index)?;
        let mut names: Vec<String> = json
            .get("weight_map")
            .and_then(Value::as_object)
            .map(|m| {
                m.values()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names.dedup();
        names.into_iter().map(|n| dir.join(n)).collect()
    } else {
        let entries = std::fs::read_dir(dir).map_err(|e| ModelError::Read {
            path: dir.into(),
            message: e.to_string(),
        })?;
        entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect()
    };
    files.sort();
    if files.is_empty() {
        return Err(ModelError::Read {
            path: dir.into(),
            message: "no *.safetensors file in the directory".into(),
        });
    }
    Ok(files)
}

/// Every tensor of the directory's safetensors files, by name.
fn tensors(dir: &Path) -> Result<HashMap<String, Tensor>, ModelError> {
    let mut all = HashMap::new();
    for file in shards(dir)? {
        let part =
            candle_core::safetensors::load(&file, &Device::Cpu).map_err(|e| ModelError::Read {
                path: file.clone(),
                message: format!("not a safetensors file ({e})"),
            })?;
        all.extend(part);
    }
    Ok(all)
}

/// A tensor's values as f32, row after row, with its dimensions.
fn values(t: &Tensor, name: &str) -> Result<(Vec<usize>, Vec<f32>), ModelError> {
    let bad = |e: candle_core::Error| ModelError::Metadata(format!("tensor {name}: {e}"));
    let dims = t.dims().to_vec();
    let v = t
        .to_dtype(DType::F32)
        .and_then(|t| t.flatten_all())
        .and_then(|t| t.to_vec1::<f32>())
        .map_err(bad)?;
    Ok((dims, v))
}

/// llama.cpp's permutation of a query or key projection: within each head,
/// row `j·half + i` (half `j` of pair `i`) moves to row `2i + j`.
fn interleave(values: Vec<f32>, rows: usize, cols: usize, heads: usize) -> Vec<f32> {
    let per_head = rows / heads.max(1);
    let half = per_head / 2;
    let mut out = vec![0.0; values.len()];
    for r in 0..rows {
        let (h, within) = (r / per_head, r % per_head);
        let (j, i) = (within / half, within % half);
        let to = h * per_head + 2 * i + j;
        out[to * cols..(to + 1) * cols].copy_from_slice(&values[r * cols..(r + 1) * cols]);
    }
    out
}

/// The engine over a checkpoint directory's weights.
pub fn engine(dir: &Path, config: &Config, threads: usize) -> Result<Engine, ModelError> {
    let mut all = tensors(dir)?;
    let shape = config.shape.clone();
    let mut take = |name: &str| -> Result<(Vec<usize>, Vec<f32>), ModelError> {
        let t = all
            .remove(name)
            .ok_or_else(|| ModelError::Metadata(format!("tensor {name} is missing")))?;
        values(&t, name)
    };
    let mut mat = |name: &str, heads: Option<usize>| -> Result<Matrix, ModelError> {
        let (dims, v) = take(name)?;
        let [rows, cols] = dims[..] else {
            return Err(ModelError::Metadata(format!(
                "tensor {name} is not 2-D: {dims:?}"
            )));
        };
        if rows * cols != v.len() || heads.is_some_and(|h| h == 0 || rows % (2 * h) != 0) {
            return Err(ModelError::Metadata(format!(
                "tensor {name} has shape {dims:?}"
            )));
        }
        let v = match heads {
            Some(h) => interleave(v, rows, cols, h),
            None => v,
        };
        Matrix::dense(rows, cols, v)
            .map_err(|e| ModelError::Metadata(format!("tensor {name}: {e}")))
    };
    let embed = mat("model.embed_tokens.weight", None)?;
    let output = if config.tied {
        None
    } else {
        Some(mat("lm_head.weight", None)?)
    };
    let mut layers = Vec::with_capacity(shape.layers);
    for i in 0..shape.layers {
        let p = format!("model.layers.{i}");
        layers.push(Layer {
            q: mat(&format!("{p}.self_attn.q_proj.weight"), Some(shape.heads))?,
            k: mat(
                &format!("{p}.self_attn.k_proj.weight"),
                Some(shape.kv_heads),
            )?,
            v: mat(&format!("{p}.self_attn.v_proj.weight"), None)?,
            o: mat(&format!("{p}.self_attn.o_proj.weight"), None)?,
            gate: mat(&format!("{p}.mlp.gate_proj.weight"), None)?,
            up: mat(&format!("{p}.mlp.up_proj.weight"), None)?,
            down: mat(&format!("{p}.mlp.down_proj.weight"), None)?,
            attn_norm: Vec::new(),
            ffn_norm: Vec::new(),
        });
    }
    let mut vector = |name: &str| take(name).map(|(_, v)| v);
    for (i, layer) in layers.iter_mut().enumerate() {
        layer.attn_norm = vector(&format!("model.layers.{i}.input_layernorm.weight"))?;
        layer.ffn_norm = vector(&format!("model.layers.{i}.post_attention_layernorm.weight"))?;
    }
    let norm = vector("model.norm.weight")?;
    Engine::new(shape, embed, layers, norm, output, threads)
        .map_err(|e| ModelError::Metadata(e.to_string()))
}

/// The chat template of a checkpoint directory: `chat_template.jinja`
/// (what recent `transformers` writes), else `tokenizer_config.json`'s
/// `chat_template` (a string, or a list of named templates: `default`).
pub fn chat_template(dir: &Path) -> Result<String, ModelError> {
    if let Ok(t) = std::fs::read_to_string(dir.join("chat_template.jinja")) {
        return Ok(t);
    }
    let config = read_json(&dir.join("tokenizer_config.json"))?;
    match config.get("chat_template") {
        Some(Value::String(t)) => Ok(t.clone()),
        Some(Value::Array(named)) => named
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|t| t.get("template"))
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| ModelError::Metadata("tokenizer_config.json has no default chat template".into())),
        _ => Err(ModelError::Metadata(
            "the directory has no chat template (chat_template.jinja or tokenizer_config.json's chat_template): not a chat model".into(),
        )),
    }
}

/// `tokenizer_config.json`, or an empty object.
pub fn tokenizer_config(dir: &Path) -> Value {
    read_json(&dir.join("tokenizer_config.json")).unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interleave_is_llama_cpps_permutation() {
        // 2 heads of 4 rows, 1 column: halves [a0 a1 | b0 b1] → a0 b0 a1 b1.
        let v: Vec<f32> = (0..8).map(|x| x as f32).collect();
        assert_eq!(interleave(v, 8, 1, 2), vec![0., 2., 1., 3., 4., 6., 5., 7.]);
    }

    #[test]
    fn a_directory_without_weights_or_config_is_a_clear_error() {
        let d = std::env::temp_dir().join(format!("rollcall-hf-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let e = Config::read(&d, 4096).err().unwrap().to_string();
        assert!(e.contains("config.json"), "{e}");
        std::fs::write(d.join("config.json"), r#"{"model_type": "qwen2"}"#).unwrap();
        let e = Config::read(&d, 4096).err().unwrap().to_string();
        assert!(e.contains("qwen2"), "{e}");
        let e = shards(&d).err().unwrap().to_string();
        assert!(e.contains("no *.safetensors"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
