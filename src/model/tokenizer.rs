//! The tokenizer of a GGUF model, built from the vocabulary stored in the
//! file (`tokenizer.ggml.*`), the way llama.cpp and `transformers`
//! (`gguf_file=`) read it: a byte-level BPE over `tokens` and `merges`, with
//! the control and user-defined tokens matched whole as special tokens.

use super::ModelError;
use candle_core::quantized::gguf_file::Value;
use std::collections::HashMap;
use std::path::Path;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer};

/// GGUF `token_type` values (llama.cpp `llama_token_type`).
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;

/// A tokenizer and what the chat template and sampler need to know of it.
pub struct Vocab {
    pub tokenizer: Tokenizer,
    /// Each token's raw bytes (byte-level BPE pieces mapped back), for
    /// logprob entries of tokens that are not whole UTF-8 characters.
    pub bytes: Vec<Vec<u8>>,
    pub bos: Option<(u32, String)>,
    pub eos: Option<(u32, String)>,
    /// Tokens that end generation: `eos` and `eot` when the file names them.
    pub stop_ids: Vec<u32>,
    pub add_bos: bool,
}

fn get<'a>(md: &'a HashMap<String, Value>, key: &str) -> Option<&'a Value> {
    md.get(key)
}

fn strings(md: &HashMap<String, Value>, key: &str) -> Result<Vec<String>, ModelError> {
    let v = get(md, key).ok_or_else(|| ModelError::Metadata(format!("{key} is missing")))?;
    let list = v
        .to_vec()
        .map_err(|e| ModelError::Metadata(format!("{key}: {e}")))?;
    list.iter()
        .map(|x| {
            x.to_string()
                .cloned()
                .map_err(|e| ModelError::Metadata(format!("{key}: {e}")))
        })
        .collect()
}

fn id(md: &HashMap<String, Value>, key: &str) -> Option<u32> {
    get(md, key).and_then(|v| v.to_u32().ok())
}

/// Build the tokenizer from GGUF metadata. Only `gpt2` (byte-level BPE)
/// vocabularies are supported, which covers llama-3, Qwen, SmolLM and most
/// recent llama-architecture models.
pub fn from_gguf(md: &HashMap<String, Value>) -> Result<Vocab, ModelError> {
    let model = get(md, "tokenizer.ggml.model")
        .and_then(|v| v.to_string().ok())
        .map(String::as_str)
        .unwrap_or("");
    if model != "gpt2" {
        return Err(ModelError::Unsupported(format!(
            "tokenizer.ggml.model {model:?}: only byte-level BPE (\"gpt2\") vocabularies are supported"
        )));
    }
    let tokens = strings(md, "tokenizer.ggml.tokens")?;
    let merges = strings(md, "tokenizer.ggml.merges")?
        .into_iter()
        .map(|m| match m.split_once(' ') {
            Some((a, b)) => Ok((a.to_owned(), b.to_owned())),
            None => Err(ModelError::Metadata(format!("merge {m:?} has no space"))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let types: Vec<i32> = match get(md, "tokenizer.ggml.token_type").map(|v| v.to_vec()) {
        Some(Ok(list)) => list.iter().map(|t| t.to_i32().unwrap_or(1)).collect(),
        _ => vec![1; tokens.len()],
    };
    let vocab: tokenizers::models::bpe::Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(|e| ModelError::Metadata(format!("BPE vocabulary: {e}")))?;
    let mut tokenizer = Tokenizer::new(bpe);
    let add_prefix_space = get(md, "tokenizer.ggml.add_space_prefix")
        .and_then(|v| v.to_bool().ok())
        .unwrap_or(false);
    tokenizer.with_pre_tokenizer(Some(ByteLevel::new(add_prefix_space, true, true)));
    tokenizer.with_decoder(Some(ByteLevelDecoder::default()));
    let special: Vec<AddedToken> = tokens
        .iter()
        .zip(&types)
        .filter(|(_, t)| matches!(**t, CONTROL | USER_DEFINED))
        .map(|(s, _)| AddedToken::from(s.clone(), true).normalized(false))
        .collect();
    tokenizer.add_special_tokens(&special);

    let bytes = token_bytes(
        tokens
            .iter()
            .zip(&types)
            .map(|(t, ty)| (t.as_str(), matches!(*ty, CONTROL | USER_DEFINED))),
    );
    let named =
        |key: &str| id(md, key).and_then(|i| tokens.get(i as usize).map(|t| (i, t.clone())));
    let bos = named("tokenizer.ggml.bos_token_id");
    let eos = named("tokenizer.ggml.eos_token_id");
    let mut stop_ids: Vec<u32> = eos.iter().map(|(i, _)| *i).collect();
    stop_ids.extend(id(md, "tokenizer.ggml.eot_token_id"));
    stop_ids.dedup();
    let add_bos = get(md, "tokenizer.ggml.add_bos_token")
        .and_then(|v| v.to_bool().ok())
        .unwrap_or(false);
    Ok(Vocab {
        tokenizer,
        bytes,
        bos,
        eos,
        stop_ids,
        add_bos,
    })
}

/// Each token's raw bytes: byte-level BPE pieces mapped back, special
/// tokens (`true`) as they are written.
fn token_bytes<'a>(tokens: impl Iterator<Item = (&'a str, bool)>) -> Vec<Vec<u8>> {
    let table = unicode_to_byte();
    tokens
        .map(|(t, special)| {
            if special {
                return t.as_bytes().to_vec();
            }
            t.chars()
                .map(|c| table.get(&c).copied())
                .collect::<Option<Vec<u8>>>()
                .unwrap_or_else(|| t.as_bytes().to_vec())
        })
        .collect()
}

/// The tokenizer of a Hugging Face checkpoint directory (`tokenizer.json`,
/// read by the same `tokenizers` library `transformers` uses), with its
/// BOS and EOS tokens from `tokenizer_config.json` and the turn-ending ids
/// `eos_ids` (from the model's generation config).
pub fn from_hf(
    dir: &Path,
    config: &serde_json::Value,
    eos_ids: &[u32],
) -> Result<Vocab, ModelError> {
    let path = dir.join("tokenizer.json");
    let tokenizer = Tokenizer::from_file(&path).map_err(|e| ModelError::Read {
        path: path.clone(),
        message: format!("not a tokenizers file ({e})"),
    })?;
    let special: HashMap<u32, bool> = tokenizer
        .get_added_tokens_decoder()
        .into_iter()
        .map(|(id, t)| (id, t.special))
        .collect();
    let len = tokenizer.get_vocab_size(true) as u32;
    let names: Vec<String> = (0..len)
        .map(|id| tokenizer.id_to_token(id).unwrap_or_default())
        .collect();
    let bytes = token_bytes(names.iter().enumerate().map(|(id, t)| {
        (
            t.as_str(),
            special.get(&(id as u32)).copied().unwrap_or(false),
        )
    }));
    let named = |key: &str| {
        let content = match config.get(key) {
            Some(serde_json::Value::String(s)) => Some(s.as_str()),
            Some(v) => v.get("content").and_then(serde_json::Value::as_str),
            None => None,
        }?;
        tokenizer
            .token_to_id(content)
            .map(|id| (id, content.to_owned()))
    };
    let bos = named("bos_token");
    let eos = named("eos_token");
    let mut stop_ids: Vec<u32> = eos.iter().map(|(i, _)| *i).collect();
    stop_ids.extend(eos_ids.iter().filter(|&&i| i < len));
    stop_ids.sort_unstable();
    stop_ids.dedup();
    let add_bos = config
        .get("add_bos_token")
        .and_then(serde_json::Value::as_bool)
        .unwrap_or(false);
    Ok(Vocab {
        tokenizer,
        bytes,
        bos,
        eos,
        stop_ids,
        add_bos,
    })
}

impl Vocab {
    /// What token-exactness rests on, one hash per part: each id's token,
    /// the BPE merges, the added tokens (and which are special), and
    /// whether a BOS token is put first. Two tokenizers with the same
    /// signature turn every text into the same ids.
    pub fn signature(&self) -> Vec<(&'static str, u64)> {
        use std::hash::{DefaultHasher, Hash, Hasher};
        let hash = |f: &dyn Fn(&mut DefaultHasher)| {
            let mut h = DefaultHasher::new();
            f(&mut h);
            h.finish()
        };
        let model = serde_json::to_value(self.tokenizer.get_model()).unwrap_or_default();
        let merges: Vec<String> = model
            .get("merges")
            .and_then(serde_json::Value::as_array)
            .map(|m| {
                m.iter()
                    .map(|x| match x {
                        serde_json::Value::String(s) => s.clone(),
                        other => other
                            .as_array()
                            .map(|p| {
                                p.iter()
                                    .filter_map(|s| s.as_str())
                                    .collect::<Vec<_>>()
                                    .join(" ")
                            })
                            .unwrap_or_default(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        let mut added: Vec<(u32, String, bool)> = self
            .tokenizer
            .get_added_tokens_decoder()
            .into_iter()
            .map(|(id, t)| (id, t.content, t.special))
            .collect();
        added.sort();
        let n = self.tokenizer.get_vocab_size(true) as u32;
        vec![
            (
                "vocabulary",
                hash(&|h| (0..n).for_each(|i| self.tokenizer.id_to_token(i).hash(h))),
            ),
            ("merges", hash(&|h| merges.hash(h))),
            ("special tokens", hash(&|h| added.hash(h))),
            (
                "BOS token",
                hash(&|h| (self.add_bos, self.bos.as_ref().map(|b| b.0)).hash(h)),
            ),
        ]
    }

    /// Token ids of `text`, special tokens matched whole, a BOS token first
    /// when the model asks for one and `add_special` is set.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, ModelError> {
        let enc = self
            .tokenizer
            .encode(text, false)
            .map_err(|e| ModelError::Tokenize(e.to_string()))?;
        let mut ids = Vec::with_capacity(enc.len() + 1);
        if add_special && self.add_bos {
            if let Some((bos, _)) = &self.bos {
                ids.push(*bos);
            }
        }
        ids.extend_from_slice(enc.get_ids());
        Ok(ids)
    }

    /// Text of `ids`; special tokens are left out when `skip_special`.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, ModelError> {
        self.tokenizer
            .decode(ids, skip_special)
            .map_err(|e| ModelError::Tokenize(e.to_string()))
    }

    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

/// GPT-2's byte-level alphabet, reversed: the printable character standing
/// for each byte → the byte.
fn unicode_to_byte() -> HashMap<char, u8> {
    let mut printable: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut chars = printable.clone();
    let mut n = 0;
    for b in 0..=255u32 {
        if !printable.contains(&b) {
            printable.push(b);
            chars.push(256 + n);
            n += 1;
        }
    }
    printable
        .into_iter()
        .zip(chars)
        .filter_map(|(b, c)| Some((char::from_u32(c)?, b as u8)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn md(tokens: &[&str], merges: &[&str], types: &[i32]) -> HashMap<String, Value> {
        let s = |v: &[&str]| Value::Array(v.iter().map(|t| Value::String(t.to_string())).collect());
        HashMap::from([
            ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
            ("tokenizer.ggml.tokens".into(), s(tokens)),
            ("tokenizer.ggml.merges".into(), s(merges)),
            (
                "tokenizer.ggml.token_type".into(),
                Value::Array(types.iter().map(|t| Value::I32(*t)).collect()),
            ),
            ("tokenizer.ggml.eos_token_id".into(), Value::U32(0)),
        ])
    }

    #[test]
    fn byte_level_bpe_with_special_tokens() {
        let v = from_gguf(&md(
            &["<|end|>", "h", "i", "Ġ", "hi", "Ġhi", "é"],
            &["h i", "Ġ hi"],
            &[3, 1, 1, 1, 1, 1, 1],
        ))
        .unwrap();
        assert_eq!(v.encode("hi hi<|end|>", true).unwrap(), vec![4, 5, 0]);
        assert_eq!(v.decode(&[4, 5, 0], true).unwrap(), "hi hi");
        assert_eq!(v.decode(&[4, 5, 0], false).unwrap(), "hi hi<|end|>");
        assert_eq!(v.bytes[3], vec![b' ']);
        assert_eq!(v.stop_ids, vec![0]);
    }

    #[test]
    fn refuses_other_vocabularies() {
        let mut m = md(&["a"], &[], &[1]);
        m.insert("tokenizer.ggml.model".into(), Value::String("llama".into()));
        let err = from_gguf(&m).err().unwrap().to_string();
        assert!(err.contains("only byte-level BPE"), "{err}");
    }

    #[test]
    fn byte_table_covers_every_byte() {
        let t = unicode_to_byte();
        assert_eq!(t.len(), 256);
        assert_eq!(t[&'Ġ'], b' ');
        assert_eq!(t[&'Ċ'], b'\n');
    }
}
