//! The embedded model: a small instruct model run in-process on the CPU
//! by rollcall's own engine (`crates/engine`), from a GGUF file or a
//! Hugging Face checkpoint directory, so that rollcall needs no model
//! server to show what it does (route kind `embedded`, `make demo`).
//!
//! - [`checkpoint`] reads a checkpoint: GGUF tensors through [`load`],
//!   a safetensors directory through [`hf`];
//! - [`tokenizer`] builds the tokenizer from the file's vocabulary, or
//!   reads the directory's `tokenizer.json`;
//! - [`template`] renders the chat template;
//! - [`sample`] picks tokens and computes their logprobs;
//! - [`tools`] reads tool calls out of the answer;
//! - [`serve`] answers Chat Completions over HTTP in vLLM's shape, token
//!   ids and logprobs included, so token capture treats it as vLLM, and
//!   takes new weights (SGLang's `/update_weights_from_disk`);
//! - [`fetch`] downloads the default model (`rollcall model fetch`).
//!
//! One worker thread owns the engine. Generations run together, one KV
//! cache (slot) each, and decode in one batch per step; calls beyond the
//! slots queue in arrival order. A call whose prompt extends what a slot
//! holds (the next turn of the same conversation) only computes the new
//! tokens. New weights reach the worker through the same queue
//! ([`Model::reload`]).

pub mod checkpoint;
pub mod fetch;
pub mod hf;
pub mod load;
pub mod sample;
pub mod serve;
pub mod template;
pub mod tokenizer;
pub mod tools;
mod worker;

use candle_core::quantized::gguf_file;
use checkpoint::Text;
use rollcall_engine as engine;
use sample::{Sampler, Sampling};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, RwLock};
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
    /// the new checkpoint's tokenizer differs from the one in use ({0}): token ids recorded before and after the update would not compare; load it with force to accept that
    #[error("the new checkpoint's tokenizer differs from the one in use ({0}): token ids recorded before and after the update would not compare; load it with force to accept that")]
    TokenizerChanged(String),
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
    /// The logprob of every prompt token after the first under the model
    /// (asked for with `prompt_logprobs`), before the first `Token`.
    Prompt(Vec<PromptLogprob>),
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

/// A prompt token's logprob given the tokens before it.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptLogprob {
    pub token: u32,
    pub logprob: f32,
    /// 1 for the most likely token.
    pub rank: usize,
    /// The most likely tokens there, most likely first.
    pub top: Vec<(u32, f32)>,
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
    /// Score the prompt: every token's logprob, with this many of the most
    /// likely alternatives. The prompt is then computed whole, with no KV
    /// cache reused.
    pub prompt_logprobs: Option<usize>,
    steps: UnboundedSender<Step>,
    /// Its place among the generations taken, given back when the job is
    /// dropped: finished, failed or cancelled.
    _place: Place,
}

/// One of the places that [`Model::generate`] admits against: the KV
/// slots (generations running) and the queue (generations waiting). Counted
/// apart from the channel to the worker, whose free capacity also depends
/// on how soon the worker took the last job: six calls at once to an idle
/// model with one slot and a queue of one could find the channel full
/// behind the first, and refuse the second.
struct Place(Arc<AtomicUsize>);

impl Drop for Place {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A loaded model and the worker thread that runs it.
pub struct Model {
    pub name: String,
    pub options: EmbeddedConfig,
    /// What requests read; a reload replaces it.
    text: RwLock<Arc<Text>>,
    threads: usize,
    jobs: mpsc::SyncSender<Work>,
    /// Generations taken and not yet dropped, running or waiting.
    taken: Arc<AtomicUsize>,
    /// How many may be: `kv_slots` running and `queue` waiting.
    places: usize,
    /// One reload at a time.
    reloading: Mutex<()>,
}

/// What the worker thread takes, in arrival order.
enum Work {
    Job(Job),
    /// New weights: the generations running finish on the old ones, then
    /// every KV cache is emptied and the next job runs on these.
    Swap(Box<Swap>),
}

struct Swap {
    engine: engine::Engine,
    stop_ids: Vec<u32>,
    done: mpsc::Sender<()>,
}

/// What a reload did.
#[derive(Debug)]
pub struct Reloaded {
    pub source: PathBuf,
    /// Tokenizer parts that changed, accepted with `force`.
    pub changed: Vec<&'static str>,
    pub load_ms: u64,
    pub swap_ms: u64,
}

/// Positions a sequence may reach (prompt and answer together), at most.
pub const MAX_CONTEXT: usize = 4096;

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

pub(crate) fn md_str<'a>(
    md: &'a std::collections::HashMap<String, gguf_file::Value>,
    key: &str,
) -> Option<&'a str> {
    md.get(key)
        .and_then(|v| v.to_string().ok())
        .map(String::as_str)
}

impl Model {
    /// Threads the engine computes on.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// What requests read now: tokenizer, chat template, context.
    pub fn text(&self) -> Arc<Text> {
        self.text
            .read()
            .map_or_else(|p| p.into_inner().clone(), |t| t.clone())
    }

    /// Load a llama-architecture GGUF file or Hugging Face checkpoint
    /// directory and start its worker.
    pub fn load(path: &Path, options: EmbeddedConfig) -> Result<Arc<Model>, ModelError> {
        let checkpoint::Checkpoint {
            engine,
            text,
            stop_ids,
        } = checkpoint::read(path, &options)?;
        let name = options.name.clone().unwrap_or_else(|| {
            path.file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "embedded".into())
        });
        let places = options.kv_slots.max(1) + options.queue.max(1);
        // Room for every admitted job before the worker takes any, and for
        // a swap beside them.
        let (jobs, rx) = mpsc::sync_channel(places + 1);
        let threads = engine.threads();
        let worker = worker::Worker::new(engine, options.kv_slots, stop_ids);
        std::thread::Builder::new()
            .name("rollcall-model".into())
            .spawn(move || worker.run(rx))
            .map_err(|e| ModelError::Compute(format!("cannot start the model thread: {e}")))?;
        Ok(Arc::new(Model {
            name,
            options,
            text: RwLock::new(Arc::new(text)),
            threads,
            jobs,
            taken: Arc::new(AtomicUsize::new(0)),
            places,
            reloading: Mutex::new(()),
        }))
    }

    /// Replace the weights with the checkpoint at `path` (a GGUF file or a
    /// Hugging Face directory) while serving: it is read beside the
    /// running model, the generations running finish on the old weights,
    /// and the next ones run on the new. A tokenizer, chat template or
    /// context that differs from the one in use is refused unless `force`,
    /// since token ids recorded before and after would not compare. On an
    /// error the old weights stay. Blocks; one reload runs at a time.
    pub fn reload(&self, path: &Path, force: bool) -> Result<Reloaded, ModelError> {
        let _one = self.reloading.lock().unwrap_or_else(|p| p.into_inner());
        let started = std::time::Instant::now();
        let new = checkpoint::read(path, &self.options)?;
        let changed = self.text().differences(&new.text);
        if !changed.is_empty() && !force {
            return Err(ModelError::TokenizerChanged(changed.join(", ")));
        }
        let load_ms = started.elapsed().as_millis() as u64;
        let (done, swapped) = mpsc::channel();
        let swap = Swap {
            engine: new.engine,
            stop_ids: new.stop_ids,
            done,
        };
        self.jobs
            .send(Work::Swap(Box::new(swap)))
            .map_err(|_| ModelError::Compute("the model thread has stopped".into()))?;
        swapped
            .recv()
            .map_err(|_| ModelError::Compute("the model thread stopped during the swap".into()))?;
        *self.text.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(new.text);
        Ok(Reloaded {
            source: path.into(),
            changed,
            load_ms,
            swap_ms: started.elapsed().as_millis() as u64 - load_ms,
        })
    }

    /// Queue a generation; its steps arrive on the receiver. Dropping the
    /// receiver cancels the generation. A full queue (every KV slot
    /// running, `queue` generations waiting) is refused at once.
    pub fn generate(
        &self,
        prompt: Vec<u32>,
        checkpoint: Option<usize>,
        max_tokens: usize,
        sampling: Sampling,
        top_logprobs: usize,
        prompt_logprobs: Option<usize>,
    ) -> Result<UnboundedReceiver<Step>, Busy> {
        let place = Place(self.taken.clone());
        if self.taken.fetch_add(1, Ordering::AcqRel) >= self.places {
            return Err(Busy::Full(self.options.queue));
        }
        let (steps, rx) = unbounded_channel();
        let job = Job {
            prompt,
            checkpoint,
            max_tokens,
            sampling,
            top_logprobs,
            prompt_logprobs,
            steps,
            _place: place,
        };
        match self.jobs.try_send(Work::Job(job)) {
            Ok(()) => Ok(rx),
            Err(mpsc::TrySendError::Full(_)) => Err(Busy::Full(self.options.queue)),
            Err(mpsc::TrySendError::Disconnected(_)) => Err(Busy::Stopped),
        }
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
    let text = model.text();
    tracing::info!(model = %model.name, file = %text.source.display(),
        context = text.context, load_ms = started.elapsed().as_millis() as u64, "embedded model loaded");
    Ok(format!("http://{addr}/v1"))
}
