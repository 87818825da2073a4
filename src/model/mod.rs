//! The embedded model: a small instruct model run in-process on the CPU
//! with candle, from one GGUF file, so that rollcall needs no model server
//! to show what it does (route kind `embedded`, `make demo`).
//!
//! - [`tokenizer`] builds the tokenizer from the file's vocabulary;
//! - [`template`] renders the file's chat template;
//! - [`sample`] picks tokens and computes their logprobs;
//! - [`tools`] reads tool calls out of the answer;
//! - [`serve`] answers Chat Completions over HTTP in vLLM's shape, token
//!   ids and logprobs included, so token capture treats it as vLLM;
//! - [`fetch`] downloads the default model (`rollcall model fetch`).
//!
//! One worker thread owns the model and runs one generation at a time;
//! calls queue in arrival order. It keeps a few KV caches (slots): a call
//! whose prompt extends what a slot already holds (the next turn of the
//! same conversation) only computes the new tokens.

pub mod fetch;
pub mod sample;
pub mod serve;
pub mod template;
pub mod tokenizer;
pub mod tools;

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use candle_transformers::models::quantized_llama::{ModelWeights, MAX_SEQ_LEN};
use sample::{Sampler, Sampling};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

/// Why the embedded model cannot load or answer.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// cannot read the model file {path}: {message}
    #[error("cannot read the model file {path}: {message}")]
    Read { path: PathBuf, message: String },
    /// the model file's metadata is not usable: {0}
    #[error("the model file's metadata is not usable: {0}")]
    Metadata(String),
    /// unsupported model: {0}
    #[error("unsupported model: {0}")]
    Unsupported(String),
    /// the chat template failed: {0}
    #[error("the chat template failed: {0}")]
    Template(String),
    /// tokenization failed: {0}
    #[error("tokenization failed: {0}")]
    Tokenize(String),
    /// the model's computation failed: {0}
    #[error("the model's computation failed: {0}")]
    Compute(String),
    /// fetching the model failed: {0}
    #[error("fetching the model failed: {0}")]
    Fetch(String),
}

impl From<candle_core::Error> for ModelError {
    fn from(e: candle_core::Error) -> Self {
        Self::Compute(e.to_string())
    }
}

use crate::config::EmbeddedConfig;

/// One step of a generation, sent as soon as it is known.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// The prompt is read; `cached` of its tokens came from a KV cache.
    Started {
        cached: usize,
    },
    /// A sampled token, its logprob and the most likely alternatives.
    Token {
        id: u32,
        logprob: f32,
        top: Vec<(u32, f32)>,
    },
    /// Generation ended: an end-of-turn token (`Stop`) or the token limit.
    Done(Finish),
    Failed(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    Stop,
    Length,
}

/// What to generate.
pub struct Job {
    pub prompt: Vec<u32>,
    /// A prompt position to snapshot the KV cache at (the end of the
    /// conversation, before the assistant's turn opens), for the next turn.
    pub checkpoint: Option<usize>,
    pub max_tokens: usize,
    pub sampling: Sampling,
    pub top_logprobs: usize,
    steps: UnboundedSender<Step>,
}

/// A loaded model and the worker thread that runs it.
pub struct Model {
    pub name: String,
    pub path: PathBuf,
    pub vocab: tokenizer::Vocab,
    pub template: template::ChatTemplate,
    /// Tokens of prompt and answer together the model can attend to.
    pub context: usize,
    pub options: EmbeddedConfig,
    jobs: mpsc::SyncSender<Job>,
}

/// A generation the model could not take.
#[derive(Debug, thiserror::Error)]
pub enum Busy {
    /// the embedded model's queue is full ({0} generations waiting); retry shortly
    #[error("the embedded model's queue is full ({0} generations waiting); retry shortly")]
    Full(usize),
    /// the model thread has stopped
    #[error("the model thread has stopped")]
    Stopped,
}

fn md_str<'a>(
    md: &'a std::collections::HashMap<String, gguf_file::Value>,
    key: &str,
) -> Option<&'a str> {
    md.get(key)
        .and_then(|v| v.to_string().ok())
        .map(String::as_str)
}

impl Model {
    /// Load a llama-architecture GGUF file and start its worker.
    pub fn load(path: &Path, options: EmbeddedConfig) -> Result<Arc<Model>, ModelError> {
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
        let name_of =
            |t: &Option<(u32, String)>| t.as_ref().map(|t| t.1.clone()).unwrap_or_default();
        let template =
            template::ChatTemplate::new(source, &name_of(&vocab.bos), &name_of(&vocab.eos))?;
        let context = md
            .get("llama.context_length")
            .and_then(|v| v.to_u32().ok())
            .map_or(MAX_SEQ_LEN, |c| (c as usize).min(MAX_SEQ_LEN));
        let weights = if options.dequantize {
            dequantized(content, &mut file)?
        } else {
            ModelWeights::from_gguf(content, &mut file, &Device::Cpu)?
        };
        let name = options.name.clone().unwrap_or_else(|| {
            path.file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "embedded".into())
        });
        let (jobs, rx) = mpsc::sync_channel(options.queue.max(1));
        let worker = Worker {
            slots: (0..options.kv_slots.max(1))
                .map(|_| Slot {
                    current: State {
                        weights: weights.clone(),
                        tokens: Vec::new(),
                    },
                    after_prompt: None,
                    used: 0,
                })
                .collect(),
            stop_ids: vocab.stop_ids.clone(),
            context,
            clock: 0,
        };
        std::thread::Builder::new()
            .name("rollcall-model".into())
            .spawn(move || worker.run(rx))
            .map_err(|e| ModelError::Compute(format!("cannot start the model thread: {e}")))?;
        Ok(Arc::new(Model {
            name,
            path: path.into(),
            vocab,
            template,
            context,
            options,
            jobs,
        }))
    }

    /// Queue a generation; its steps arrive on the receiver. Dropping the
    /// receiver cancels the generation. A full queue is refused at once.
    pub fn generate(
        &self,
        prompt: Vec<u32>,
        checkpoint: Option<usize>,
        max_tokens: usize,
        sampling: Sampling,
        top_logprobs: usize,
    ) -> Result<UnboundedReceiver<Step>, Busy> {
        let (steps, rx) = unbounded_channel();
        let job = Job {
            prompt,
            checkpoint,
            max_tokens,
            sampling,
            top_logprobs,
            steps,
        };
        match self.jobs.try_send(job) {
            Ok(()) => Ok(rx),
            Err(mpsc::TrySendError::Full(_)) => Err(Busy::Full(self.options.queue)),
            Err(mpsc::TrySendError::Disconnected(_)) => Err(Busy::Stopped),
        }
    }
}

/// The model with every weight dequantized to f32: the file is rewritten in
/// memory with f32 tensors, which candle then multiplies unquantized.
fn dequantized(
    content: gguf_file::Content,
    file: &mut std::fs::File,
) -> Result<ModelWeights, ModelError> {
    let mut tensors = Vec::with_capacity(content.tensor_infos.len());
    for name in content.tensor_infos.keys() {
        let t = content
            .tensor(file, name, &Device::Cpu)?
            .dequantize(&Device::Cpu)?;
        tensors.push((name.clone(), QTensor::quantize(&t, GgmlDType::F32)?));
    }
    let md: Vec<(&str, &gguf_file::Value)> = content
        .metadata
        .iter()
        .map(|(k, v)| (k.as_str(), v))
        .collect();
    let refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut buf = std::io::Cursor::new(Vec::new());
    gguf_file::write(&mut buf, &md, &refs)?;
    drop(tensors);
    buf.set_position(0);
    let f32_content = gguf_file::Content::read(&mut buf)?;
    Ok(ModelWeights::from_gguf(
        f32_content,
        &mut buf,
        &Device::Cpu,
    )?)
}

/// A model state: KV caches and the tokens they hold.
#[derive(Clone)]
struct State {
    weights: ModelWeights,
    tokens: Vec<u32>,
}

impl State {
    /// How many tokens of `prompt` this state saves computing (0: none).
    fn reuse(&self, prompt: &[u32]) -> usize {
        let n = self.tokens.len();
        if n > 0 && n < prompt.len() && prompt.starts_with(&self.tokens) {
            n
        } else {
            0
        }
    }
}

/// One KV cache in use: its state after the last generation, and a
/// snapshot at that prompt's checkpoint (the conversation before the
/// assistant's turn opens). The next turn usually extends the first;
/// harnesses that drop a failed answer from the history (mini-swe-agent on
/// a format error) extend only the second. Both share their tensors, so the
/// snapshot costs only what was computed after it.
struct Slot {
    current: State,
    after_prompt: Option<State>,
    used: u64,
}

impl Slot {
    fn best_reuse(&self, prompt: &[u32]) -> usize {
        let snap = self.after_prompt.as_ref().map_or(0, |s| s.reuse(prompt));
        self.current.reuse(prompt).max(snap)
    }
}

struct Worker {
    slots: Vec<Slot>,
    stop_ids: Vec<u32>,
    context: usize,
    clock: u64,
}

fn logits(weights: &mut ModelWeights, ids: &[u32], pos: usize) -> candle_core::Result<Vec<f32>> {
    let x = Tensor::new(ids, &Device::Cpu)?.unsqueeze(0)?;
    weights
        .forward(&x, pos)?
        .squeeze(0)?
        .to_dtype(candle_core::DType::F32)?
        .to_vec1::<f32>()
}

impl Worker {
    fn run(mut self, jobs: mpsc::Receiver<Job>) {
        while let Ok(job) = jobs.recv() {
            self.clock += 1;
            // The slot holding the longest prefix of this prompt, else the
            // least recently used one.
            let i = (0..self.slots.len())
                .filter(|&i| self.slots[i].best_reuse(&job.prompt) > 0)
                .max_by_key(|&i| self.slots[i].best_reuse(&job.prompt))
                .or_else(|| (0..self.slots.len()).min_by_key(|&i| self.slots[i].used))
                .unwrap_or(0);
            let slot = &mut self.slots[i];
            slot.used = self.clock;
            if slot.current.reuse(&job.prompt) == 0 {
                match slot
                    .after_prompt
                    .as_ref()
                    .filter(|s| s.reuse(&job.prompt) > 0)
                {
                    Some(snap) => slot.current = snap.clone(),
                    None => slot.current.tokens.clear(),
                }
            }
            if let Err(e) = Self::generate(slot, &job, &self.stop_ids, self.context) {
                slot.current.tokens.clear();
                slot.after_prompt = None;
                let _ = job.steps.send(Step::Failed(e.to_string()));
            }
        }
    }

    fn generate(
        slot: &mut Slot,
        job: &Job,
        stop_ids: &[u32],
        context: usize,
    ) -> candle_core::Result<()> {
        let cached = slot.current.tokens.len();
        if job.steps.send(Step::Started { cached }).is_err() {
            return Ok(());
        }
        let state = &mut slot.current;
        let mut pos = cached;
        if let Some(cp) = job
            .checkpoint
            .filter(|&cp| cp > cached && cp < job.prompt.len())
        {
            logits(&mut state.weights, &job.prompt[cached..cp], cached)?;
            state.tokens.extend_from_slice(&job.prompt[cached..cp]);
            slot.after_prompt = Some(state.clone());
            pos = cp;
        } else if job.checkpoint.is_none() {
            slot.after_prompt = None;
        }
        let mut next = logits(&mut state.weights, &job.prompt[pos..], pos)?;
        state.tokens.clone_from(&job.prompt);
        let mut sampler = Sampler::new(job.sampling.clone());
        for n in 0..job.max_tokens {
            let lp = sample::log_softmax(&next);
            let id = sampler.next(&lp);
            let top = if job.top_logprobs > 0 {
                sample::top(&lp, job.top_logprobs)
            } else {
                Vec::new()
            };
            let step = Step::Token {
                id,
                logprob: lp[id as usize],
                top,
            };
            if job.steps.send(step).is_err() {
                return Ok(()); // the caller went away
            }
            let finish = if stop_ids.contains(&id) {
                Some(Finish::Stop)
            } else if n + 1 == job.max_tokens || state.tokens.len() + 1 >= context {
                Some(Finish::Length)
            } else {
                None
            };
            if let Some(f) = finish {
                let _ = job.steps.send(Step::Done(f));
                return Ok(());
            }
            next = logits(&mut state.weights, &[id], state.tokens.len())?;
            state.tokens.push(id);
        }
        let _ = job.steps.send(Step::Done(Finish::Length));
        Ok(())
    }
}

/// The GGUF file a route's options name, or the fetched default model.
pub fn model_path(options: &EmbeddedConfig) -> Result<PathBuf, ModelError> {
    match &options.model_file {
        Some(p) => Ok(p.clone()),
        None => {
            let p = fetch::default_model_path();
            if p.exists() {
                Ok(p)
            } else {
                Err(ModelError::Read {
                    path: p,
                    message: "no model file; run `rollcall model fetch` first, or give \
                              model_file (--model-file) for any llama-architecture GGUF"
                        .into(),
                })
            }
        }
    }
}

/// Load the model `options` name and serve it on a loopback port of this
/// process; returns the server's base URL (`http://127.0.0.1:PORT/v1`).
pub async fn start(options: &EmbeddedConfig) -> Result<String, ModelError> {
    let path = model_path(options)?;
    let options = options.clone();
    let started = std::time::Instant::now();
    let model = tokio::task::spawn_blocking(move || Model::load(&path, options))
        .await
        .map_err(|e| ModelError::Compute(e.to_string()))??;
    let (addr, serve) = serve::bind(model.clone(), ([127, 0, 0, 1], 0).into())
        .await
        .map_err(|e| ModelError::Compute(format!("cannot bind the model server: {e}")))?;
    tokio::spawn(serve);
    tracing::info!(model = %model.name, file = %model.path.display(),
        context = model.context, load_ms = started.elapsed().as_millis() as u64, "embedded model loaded");
    Ok(format!("http://{addr}/v1"))
}
