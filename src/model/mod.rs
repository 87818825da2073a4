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

use candle_core::quantized::gguf_file;
use checkpoint::Text;
use rollcall_engine as engine;
use sample::{Sampler, Sampling};
use std::path::{Path, PathBuf};
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
}

/// A loaded model and the worker thread that runs it.
pub struct Model {
    pub name: String,
    pub options: EmbeddedConfig,
    /// What requests read; a reload replaces it.
    text: RwLock<Arc<Text>>,
    threads: usize,
    jobs: mpsc::SyncSender<Work>,
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
        let (jobs, rx) = mpsc::sync_channel(options.queue.max(1));
        let threads = engine.threads();
        let worker = Worker {
            engine,
            slots: (0..options.kv_slots.max(1))
                .map(|_| Slot {
                    cache: engine::Cache::default(),
                    tokens: Vec::new(),
                    checkpoint: None,
                    used: 0,
                })
                .collect(),
            stop_ids,
            clock: 0,
        };
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
    /// receiver cancels the generation. A full queue is refused at once.
    pub fn generate(
        &self,
        prompt: Vec<u32>,
        checkpoint: Option<usize>,
        max_tokens: usize,
        sampling: Sampling,
        top_logprobs: usize,
        prompt_logprobs: Option<usize>,
    ) -> Result<UnboundedReceiver<Step>, Busy> {
        let (steps, rx) = unbounded_channel();
        let job = Job {
            prompt,
            checkpoint,
            max_tokens,
            sampling,
            top_logprobs,
            prompt_logprobs,
            steps,
        };
        match self.jobs.try_send(Work::Job(job)) {
            Ok(()) => Ok(rx),
            Err(mpsc::TrySendError::Full(_)) => Err(Busy::Full(self.options.queue)),
            Err(mpsc::TrySendError::Disconnected(_)) => Err(Busy::Stopped),
        }
    }
}

/// One KV cache in use and the tokens it holds, with a checkpoint: the
/// length of the conversation before the assistant's turn opened, a prefix
/// of those tokens. The next turn usually extends all of them; harnesses
/// that drop a failed answer from the history (mini-swe-agent on a format
/// error) extend only the checkpoint's prefix, and the cache is cut back
/// to it.
struct Slot {
    cache: engine::Cache,
    tokens: Vec<u32>,
    checkpoint: Option<usize>,
    used: u64,
}

impl Slot {
    /// How many of `prompt`'s tokens this slot saves computing (0: none),
    /// and whether that takes cutting the cache back to the checkpoint.
    fn reuse(&self, prompt: &[u32]) -> (usize, bool) {
        let extends = |n: usize| n > 0 && n < prompt.len() && prompt.starts_with(&self.tokens[..n]);
        if extends(self.tokens.len()) {
            (self.tokens.len(), false)
        } else {
            match self
                .checkpoint
                .filter(|&cp| cp <= self.tokens.len() && extends(cp))
            {
                Some(cp) => (cp, true),
                None => (0, false),
            }
        }
    }

    fn clear(&mut self, shape: &engine::Shape) {
        self.cache.truncate(0, shape);
        self.tokens.clear();
        self.checkpoint = None;
    }

    /// Run `tokens` through the model into this slot's cache (the caller
    /// books them in `tokens`); the hidden states `want` names.
    fn read(
        &mut self,
        engine: &engine::Engine,
        tokens: &[u32],
        want: engine::Want,
    ) -> Result<Vec<f32>, ModelError> {
        let mut batch = [engine::Seq {
            cache: &mut self.cache,
            tokens,
            want,
        }];
        let hidden = engine
            .forward(&mut batch)
            .map_err(|e| ModelError::Compute(e.to_string()))?;
        Ok(hidden.into_iter().next().unwrap_or_default())
    }
}

struct Worker {
    engine: engine::Engine,
    slots: Vec<Slot>,
    stop_ids: Vec<u32>,
    clock: u64,
}

/// A generation decoding on a slot of its own.
struct Active {
    job: Job,
    slot: usize,
    sampler: Sampler,
    /// Tokens sent so far.
    sent: usize,
    /// The token sent last, which the next step feeds in.
    last: u32,
}

/// What became of a sampled token.
enum Next {
    /// Sent; generation goes on from it.
    Feed(u32),
    /// Sent, and the generation is done (or its caller went away).
    Over,
}

/// A job whose prompt could not be read, and why.
type Refused = (Job, ModelError);

impl Worker {
    /// Generations run together, one slot each: every step feeds each of
    /// them its last token in one batch (continuous batching), and a new
    /// call starts, with its prompt read alone, as soon as a slot is free.
    /// Calls beyond the slots wait in the queue, in arrival order.
    /// New weights wait for the generations running to finish.
    fn run(mut self, jobs: mpsc::Receiver<Work>) {
        let mut active: Vec<Active> = Vec::new();
        loop {
            while active.len() < self.slots.len() {
                let work = if active.is_empty() {
                    match jobs.recv() {
                        Ok(w) => w,
                        Err(_) => return,
                    }
                } else {
                    match jobs.try_recv() {
                        Ok(w) => w,
                        Err(_) => break,
                    }
                };
                let job = match work {
                    Work::Job(job) => job,
                    Work::Swap(swap) => {
                        while !active.is_empty() {
                            self.step(&mut active);
                        }
                        self.swap(*swap);
                        continue;
                    }
                };
                let busy: Vec<usize> = active.iter().map(|a| a.slot).collect();
                let fresh = job.prompt_logprobs.is_some();
                let Some(i) = self.pick(&job.prompt, &busy, fresh) else {
                    let _ = job.steps.send(Step::Failed("no KV cache is free".into()));
                    continue;
                };
                match self.start(i, job) {
                    Ok(Some(a)) => active.push(a),
                    Ok(None) => {}
                    Err(refused) => {
                        let (job, e) = *refused;
                        self.slots[i].clear(&self.engine.shape);
                        let _ = job.steps.send(Step::Failed(e.to_string()));
                    }
                }
            }
            if !active.is_empty() {
                self.step(&mut active);
            }
        }
    }

    /// Take new weights; every KV cache is emptied.
    fn swap(&mut self, swap: Swap) {
        self.engine = swap.engine;
        self.stop_ids = swap.stop_ids;
        for slot in &mut self.slots {
            slot.cache = engine::Cache::default();
            slot.tokens.clear();
            slot.checkpoint = None;
        }
        let _ = swap.done.send(());
    }

    /// The free slot holding the longest prefix of `prompt`, else the
    /// least recently used free one, made ready for it (emptied when
    /// `fresh`).
    fn pick(&mut self, prompt: &[u32], busy: &[usize], fresh: bool) -> Option<usize> {
        self.clock += 1;
        let free = || (0..self.slots.len()).filter(|i| !busy.contains(i));
        let reused = free()
            .filter(|_| !fresh)
            .map(|i| (i, self.slots[i].reuse(prompt)))
            .filter(|(_, (n, _))| *n > 0)
            .max_by_key(|(_, (n, _))| *n);
        let shape = &self.engine.shape;
        let i = match reused {
            Some((i, (cp, true))) => {
                let slot = &mut self.slots[i];
                slot.cache.truncate(cp, shape);
                slot.tokens.truncate(cp);
                i
            }
            Some((i, (_, false))) => i,
            None => {
                let i = free().min_by_key(|&i| self.slots[i].used)?;
                self.slots[i].clear(shape);
                i
            }
        };
        self.slots[i].used = self.clock;
        Some(i)
    }

    /// Read a job's prompt on slot `i` and send its first token; `None`
    /// when it is already over.
    fn start(&mut self, i: usize, job: Job) -> Result<Option<Active>, Box<Refused>> {
        let cached = self.slots[i].tokens.len();
        if job.steps.send(Step::Started { cached }).is_err() {
            return Ok(None);
        }
        let logits = match job.prompt_logprobs {
            Some(k) => self.score(i, &job, k),
            None => self.prefill(i, &job, cached),
        };
        match logits {
            Ok(logits) => Ok(self.first(i, job, &logits)),
            Err(e) => Err(Box::new((job, e))),
        }
    }

    /// Read what slot `i` does not hold of the job's prompt (snapshotting
    /// the checkpoint on the way), and return the logits after it.
    fn prefill(&mut self, i: usize, job: &Job, cached: usize) -> Result<Vec<f32>, ModelError> {
        use engine::Want;
        let engine = &self.engine;
        let slot = &mut self.slots[i];
        let mut pos = cached;
        if let Some(cp) = job
            .checkpoint
            .filter(|&cp| cp > cached && cp < job.prompt.len())
        {
            slot.read(engine, &job.prompt[cached..cp], Want::Nothing)?;
            slot.tokens.extend_from_slice(&job.prompt[cached..cp]);
            slot.checkpoint = Some(cp);
            pos = cp;
        } else if job.checkpoint.is_none() {
            slot.checkpoint = None;
        }
        let hidden = slot.read(engine, &job.prompt[pos..], Want::Last)?;
        slot.tokens.clone_from(&job.prompt);
        Ok(engine.logits(&hidden))
    }

    /// Read the whole prompt on slot `i` (emptied), send every token's
    /// logprob with the `k` most likely alternatives, and return the
    /// logits after the last one.
    fn score(&mut self, i: usize, job: &Job, k: usize) -> Result<Vec<f32>, ModelError> {
        /// Rows whose logits are held at once (each is a vocabulary wide).
        const ROWS: usize = 16;
        let engine = &self.engine;
        let slot = &mut self.slots[i];
        let hidden = slot.read(engine, &job.prompt, engine::Want::All)?;
        slot.tokens.clone_from(&job.prompt);
        slot.checkpoint = job.checkpoint.filter(|&cp| cp < job.prompt.len());
        let (dim, vocab) = (engine.shape.dim, engine.shape.vocab);
        let mut scored = Vec::with_capacity(job.prompt.len().saturating_sub(1));
        let mut last = Vec::new();
        for (c, rows) in hidden.chunks(ROWS * dim).enumerate() {
            let logits = engine.logits(rows);
            for (r, row) in logits.chunks_exact(vocab).enumerate() {
                match job.prompt.get(c * ROWS + r + 1) {
                    Some(&token) => {
                        let lp = sample::log_softmax(row);
                        let logprob = lp.get(token as usize).copied().unwrap_or(f32::NEG_INFINITY);
                        scored.push(PromptLogprob {
                            token,
                            logprob,
                            rank: 1 + lp.iter().filter(|&&l| l > logprob).count(),
                            top: sample::top(&lp, k),
                        });
                    }
                    None => last = row.to_vec(),
                }
            }
        }
        if scored.len() + 1 != job.prompt.len() || last.len() != vocab {
            return Err(ModelError::Compute(
                "the prompt was not scored whole".into(),
            ));
        }
        let _ = job.steps.send(Step::Prompt(scored));
        Ok(last)
    }

    /// Send the first token of a job whose prompt slot `i` has read;
    /// `None` when the generation is already over.
    fn first(&mut self, i: usize, job: Job, logits: &[f32]) -> Option<Active> {
        if job.max_tokens == 0 {
            let _ = job.steps.send(Step::Done(Finish::Length));
            return None;
        }
        let mut sampler = Sampler::new(job.sampling.clone());
        let tokens = self.slots[i].tokens.len();
        match self.emit(&job, &mut sampler, logits, 0, tokens) {
            Next::Feed(last) => Some(Active {
                job,
                slot: i,
                sampler,
                sent: 1,
                last,
            }),
            Next::Over => None,
        }
    }

    /// Sample the `n`th token from `logits` and send it, with `Done` when
    /// it ends the generation (`tokens`: what the cache holds).
    fn emit(
        &self,
        job: &Job,
        sampler: &mut Sampler,
        logits: &[f32],
        n: usize,
        tokens: usize,
    ) -> Next {
        if logits.len() != self.engine.shape.vocab {
            let _ = job
                .steps
                .send(Step::Failed("the model returned no logits".into()));
            return Next::Over;
        }
        let lp = sample::log_softmax(logits);
        let id = sampler.next(&lp);
        let top = if job.top_logprobs > 0 {
            sample::top(&lp, job.top_logprobs)
        } else {
            Vec::new()
        };
        let step = Step::Token {
            id,
            logprob: lp.get(id as usize).copied().unwrap_or(f32::NEG_INFINITY),
            top,
        };
        if job.steps.send(step).is_err() {
            return Next::Over; // the caller went away
        }
        let finish = if self.stop_ids.contains(&id) {
            Some(Finish::Stop)
        } else if n + 1 >= job.max_tokens || tokens + 1 >= self.engine.shape.context {
            Some(Finish::Length)
        } else {
            None
        };
        match finish {
            Some(f) => {
                let _ = job.steps.send(Step::Done(f));
                Next::Over
            }
            None => Next::Feed(id),
        }
    }

    /// One decoding step for every active generation, in one batch.
    fn step(&mut self, active: &mut Vec<Active>) {
        use engine::{Seq, Want};
        let mut free: Vec<Option<&mut Slot>> = self.slots.iter_mut().map(Some).collect();
        let mut batch = Vec::with_capacity(active.len());
        for a in active.iter() {
            if let Some(slot) = free.get_mut(a.slot).and_then(Option::take) {
                batch.push(Seq {
                    cache: &mut slot.cache,
                    tokens: std::slice::from_ref(&a.last),
                    want: Want::Last,
                });
            }
        }
        let fed = batch.len() == active.len();
        let result = self.engine.forward(&mut batch);
        drop(batch);
        let hidden = match result {
            Ok(h) if fed => h,
            other => {
                let why = match other {
                    Err(e) => e.to_string(),
                    Ok(_) => "two generations shared a KV cache".into(),
                };
                for a in active.drain(..) {
                    self.slots[a.slot].clear(&self.engine.shape);
                    let _ = a.job.steps.send(Step::Failed(why.clone()));
                }
                return;
            }
        };
        let logits = self.engine.logits(&hidden.concat());
        let vocab = self.engine.shape.vocab;
        let mut keep = Vec::with_capacity(active.len());
        for (k, mut a) in active.drain(..).enumerate() {
            self.slots[a.slot].tokens.push(a.last);
            let tokens = self.slots[a.slot].tokens.len();
            let l = logits.get(k * vocab..(k + 1) * vocab).unwrap_or(&[]);
            if let Next::Feed(id) = self.emit(&a.job, &mut a.sampler, l, a.sent, tokens) {
                a.last = id;
                a.sent += 1;
                keep.push(a);
            }
        }
        *active = keep;
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
