//! A checkpoint read from disk: a llama-architecture GGUF file, or a
//! Hugging Face checkpoint directory ([`super::hf`]). Either gives the
//! engine and the [`Text`] requests read (tokenizer, chat template,
//! context); a reload compares the new text with the one in use.

use super::hf;
use super::template::ChatTemplate;
use super::tokenizer::{self, Vocab};
use super::{md_str, ModelError, MAX_CONTEXT};
use crate::config::EmbeddedConfig;
use candle_core::quantized::gguf_file;
use rollcall_engine::Engine;
use std::path::{Path, PathBuf};

/// What a request reads of the model: its tokenizer, chat template and
/// context. A reload replaces it whole.
pub struct Text {
    pub vocab: Vocab,
    pub template: ChatTemplate,
    template_source: String,
    /// Tokens of prompt and answer together the model can attend to.
    pub context: usize,
    /// The file or directory it was read from.
    pub source: PathBuf,
}

impl Text {
    fn new(
        vocab: Vocab,
        template_source: &str,
        context: usize,
        source: &Path,
    ) -> Result<Text, ModelError> {
        let name_of =
            |t: &Option<(u32, String)>| t.as_ref().map(|t| t.1.clone()).unwrap_or_default();
        let template =
            ChatTemplate::new(template_source, &name_of(&vocab.bos), &name_of(&vocab.eos))?;
        Ok(Text {
            vocab,
            template,
            template_source: template_source.to_owned(),
            context,
            source: source.into(),
        })
    }

    /// What differs between this text and `other` that would change the
    /// token ids of a conversation: parts of the tokenizer, the chat
    /// template, the context. Empty when they tokenize alike.
    pub fn differences(&self, other: &Text) -> Vec<&'static str> {
        let mut d: Vec<&'static str> = self
            .vocab
            .signature()
            .into_iter()
            .zip(other.vocab.signature())
            .filter(|(a, b)| a != b)
            .map(|(a, _)| a.0)
            .collect();
        if self.template_source != other.template_source {
            d.push("chat template");
        }
        if self.context != other.context {
            d.push("context length");
        }
        d
    }
}

/// A checkpoint's engine, its text, and the token ids that end a turn.
pub struct Checkpoint {
    pub engine: Engine,
    pub text: Text,
    pub stop_ids: Vec<u32>,
}

/// Read `path`: a Hugging Face checkpoint directory when it is a
/// directory, else a GGUF file. The engine computes on `options.threads`.
pub fn read(path: &Path, options: &EmbeddedConfig) -> Result<Checkpoint, ModelError> {
    if path.is_dir() {
        read_hf(path, options)
    } else {
        read_gguf(path, options)
    }
}

fn read_gguf(path: &Path, options: &EmbeddedConfig) -> Result<Checkpoint, ModelError> {
    let read_err = |message: String| ModelError::Read {
        path: path.into(),
        message,
    };
    let mut file = std::fs::File::open(path).map_err(|e| read_err(e.to_string()))?;
    let content = gguf_file::Content::read(&mut file)
        .map_err(|e| read_err(format!("not a GGUF file ({e})")))?;
    let md = &content.metadata;
    let arch = md_str(md, "general.architecture").unwrap_or("?");
    if arch != "llama" {
        return Err(ModelError::Unsupported(format!(
            "architecture {arch:?}; the embedded upstream runs llama-architecture GGUF files"
        )));
    }
    let vocab = tokenizer::from_gguf(md)?;
    let source = md_str(md, "tokenizer.chat_template").ok_or_else(|| {
        ModelError::Metadata("tokenizer.chat_template is missing: not a chat model".into())
    })?;
    let shape = super::load::shape(&content, MAX_CONTEXT)?;
    let text = Text::new(vocab, source, shape.context, path)?;
    let engine = super::load::engine(
        &content,
        &mut file,
        shape,
        options.threads,
        options.dequantize,
    )?;
    Ok(Checkpoint {
        engine,
        stop_ids: text.vocab.stop_ids.clone(),
        text,
    })
}

fn read_hf(dir: &Path, options: &EmbeddedConfig) -> Result<Checkpoint, ModelError> {
    let config = hf::Config::read(dir, MAX_CONTEXT)?;
    let vocab = tokenizer::from_hf(dir, &hf::tokenizer_config(dir), &config.eos_ids(dir))?;
    let text = Text::new(vocab, &hf::chat_template(dir)?, config.shape.context, dir)?;
    let engine = hf::engine(dir, &config, options.threads)?;
    Ok(Checkpoint {
        engine,
        stop_ids: text.vocab.stop_ids.clone(),
        text,
    })
}
