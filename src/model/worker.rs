//! The worker thread that owns the engine: its slots (one KV cache per
//! generation in flight), the batch it decodes each step, and the queue of
//! calls and weight swaps it takes work from.

use super::*;

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

/// The engine's owner (see the module's doc).
pub(super) struct Worker {
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
    /// A worker with `kv_slots` empty slots (at least one).
    pub(super) fn new(engine: engine::Engine, kv_slots: usize, stop_ids: Vec<u32>) -> Worker {
        Worker {
            engine,
            slots: (0..kv_slots.max(1))
                .map(|_| Slot {
                    cache: engine::Cache::default(),
                    tokens: Vec::new(),
                    checkpoint: None,
                    used: 0,
                })
                .collect(),
            stop_ids,
            clock: 0,
        }
    }

    /// Generations run together, one slot each: every step feeds each of
    /// them its last token in one batch (continuous batching), and a new
    /// call starts, with its prompt read alone, as soon as a slot is free.
    /// Calls beyond the slots wait in the queue, in arrival order.
    /// New weights wait for the generations running to finish.
    pub(super) fn run(mut self, jobs: mpsc::Receiver<Work>) {
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
