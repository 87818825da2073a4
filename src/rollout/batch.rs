//! The batch: every task's group of samples, at most `concurrency`
//! containers at a time, resumed from the shards, with a live progress bar.

use super::backend::Backend;
use super::bar::{Bar, Decision, Sample};
use super::sample::{rollout_id, Attempt, Context, Status};
use super::summary::{GroupResult, SampleResult, Summary};
use super::RolloutError;
use crate::grade::Instance;
use futures_util::future::join_all;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::Semaphore;

/// How to sample each task.
#[derive(Debug, Clone, Copy)]
pub enum Sampling {
    /// K samples per task, all kept.
    Fixed(usize),
    /// Balanced Adaptive Rollout.
    Adaptive(Bar),
}

/// A sample finished by an earlier run of the same batch.
#[derive(Debug, Clone)]
struct Earlier {
    status: Status,
    reward: Option<f64>,
    metadata: Value,
    /// The highest attempt number used.
    attempt: usize,
    rollout: String,
}

/// What the shards say about this run: per (task, sample), the latest
/// attempt and whether it is finished for good (not an infrastructure
/// fault, not cancelled).
fn earlier(shards: &Path, run: &str) -> Result<BTreeMap<(String, usize), Earlier>, RolloutError> {
    let mut out: BTreeMap<(String, usize), Earlier> = BTreeMap::new();
    if !shards.exists() {
        return Ok(out);
    }
    let prefix = format!("{run}.");
    for (id, info) in crate::export::read::read_rollouts(shards)? {
        let Some(rest) = id.strip_prefix(&prefix) else {
            continue;
        };
        // <task>.s<k>.a<j>, where the task id may itself hold dots.
        let mut parts = rest.rsplitn(3, '.');
        let (Some(a), Some(s), Some(task)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let (Some(a), Some(s)) = (
            a.strip_prefix('a').and_then(|x| x.parse::<usize>().ok()),
            s.strip_prefix('s').and_then(|x| x.parse::<usize>().ok()),
        ) else {
            continue;
        };
        let Some(status) = Status::parse(&info.status) else {
            continue;
        };
        let metadata = info
            .metadata
            .as_deref()
            .and_then(|m| serde_json::from_str(m).ok())
            .unwrap_or(Value::Null);
        let e = Earlier {
            status,
            reward: info.reward,
            metadata,
            attempt: a,
            rollout: id.clone(),
        };
        match out.get(&(task.to_owned(), s)) {
            Some(old) if old.attempt > a => {}
            _ => {
                out.insert((task.to_owned(), s), e);
            }
        }
    }
    Ok(out)
}

/// Counters behind the progress bar.
#[derive(Default)]
struct Counts {
    done: AtomicUsize,
    running: AtomicUsize,
    failed: AtomicUsize,
    resolved: AtomicUsize,
}

struct Shared<B> {
    ctx: Arc<Context<B>>,
    slots: Semaphore,
    earlier: BTreeMap<(String, usize), Earlier>,
    counts: Counts,
    bar: ProgressBar,
}

impl<B: Backend> Shared<B> {
    fn show(&self) {
        let c = &self.counts;
        self.bar.set_message(format!(
            "running {} · failed {} · resolved {}",
            c.running.load(Ordering::Relaxed),
            c.failed.load(Ordering::Relaxed),
            c.resolved.load(Ordering::Relaxed),
        ));
    }

    /// Sample `k` of `task`: the earlier run's when it finished for good,
    /// else a new one, run when a slot frees.
    async fn sample(&self, task: &Instance, k: usize) -> SampleResult {
        let key = (task.instance_id.clone(), k);
        let first_attempt = match self.earlier.get(&key) {
            Some(e) if !matches!(e.status, Status::InfraError | Status::Cancelled) => {
                let r =
                    SampleResult::resumed(k, &e.rollout, e.status, e.reward, e.metadata.clone());
                self.tally(&r);
                return r;
            }
            Some(e) => e.attempt + 1,
            None => 0,
        };
        let Ok(_slot) = self.slots.acquire().await else {
            return SampleResult::not_run(
                k,
                rollout_id(&self.ctx.run, &task.instance_id, k, first_attempt),
            );
        };
        if self.ctx.cancel.is_cancelled() {
            return SampleResult::not_run(
                k,
                rollout_id(&self.ctx.run, &task.instance_id, k, first_attempt),
            );
        }
        self.counts.running.fetch_add(1, Ordering::Relaxed);
        self.show();
        let a: Attempt = self.ctx.sample(task, k, first_attempt).await;
        self.counts.running.fetch_sub(1, Ordering::Relaxed);
        let r = SampleResult::of(k, a);
        self.tally(&r);
        r
    }

    fn tally(&self, r: &SampleResult) {
        if r.status == Some(Status::Cancelled) || r.status.is_none() {
            return;
        }
        self.counts.done.fetch_add(1, Ordering::Relaxed);
        if r.status == Some(Status::InfraError) {
            self.counts.failed.fetch_add(1, Ordering::Relaxed);
        }
        if r.reward == Some(1.0) {
            self.counts.resolved.fetch_add(1, Ordering::Relaxed);
        }
        self.bar.inc(1);
        self.show();
    }

    async fn samples(&self, task: &Instance, range: std::ops::Range<usize>) -> Vec<SampleResult> {
        join_all(range.map(|k| self.sample(task, k))).await
    }

    async fn group(&self, task: &Instance, sampling: Sampling) -> GroupResult {
        let group = super::sample::group_id(&self.ctx.run, &task.instance_id);
        match sampling {
            Sampling::Fixed(k) => GroupResult::fixed(task, group, self.samples(task, 0..k).await),
            Sampling::Adaptive(bar) => {
                let mut samples = self.samples(task, 0..bar.first()).await;
                loop {
                    if samples
                        .iter()
                        .any(|s| s.status.is_none() || s.status == Some(Status::Cancelled))
                    {
                        return GroupResult::unsettled(task, group, samples);
                    }
                    let seen: Vec<Sample> = samples.iter().map(SampleResult::bar_sample).collect();
                    match bar.decide(&seen) {
                        Decision::More(m) => {
                            self.bar.inc_length(m as u64);
                            let from = samples.len();
                            samples.extend(self.samples(task, from..from + m).await);
                        }
                        Decision::Settled {
                            verdicts,
                            positives,
                            relaxed,
                            dropped,
                        } => {
                            for (s, why) in samples.iter_mut().zip(&verdicts) {
                                s.bar = Some(json!({
                                    "kept": *why == super::bar::Why::Kept,
                                    "why": why,
                                    "group_positives": positives,
                                    "relaxed": relaxed,
                                    "group_dropped": dropped,
                                    "n": bar.n,
                                    "n_max": bar.n_max,
                                }));
                                self.refinish(s).await;
                            }
                            return GroupResult::adaptive(
                                task, group, samples, positives, relaxed, dropped,
                            );
                        }
                    }
                }
            }
        }
    }

    /// Finish a sample again with BAR's verdict in its metadata (the
    /// latest finish is the one datasets read).
    async fn refinish(&self, s: &SampleResult) {
        let (Some(status), Some(bar)) = (s.status, &s.bar) else {
            return;
        };
        let mut metadata = s.metadata.clone();
        if !metadata.is_object() {
            metadata = json!({});
        }
        metadata["bar"] = bar.clone();
        let mut body = json!({"status": status.as_str(), "metadata": metadata});
        if let Some(r) = s.reward {
            body["reward"] = json!(r);
        }
        if let Err(e) = self.ctx.finish(&s.rollout, &body).await {
            tracing::error!(error = %e, "could not record Balanced Adaptive Rollout's verdict");
        }
    }
}

/// Run every task's group; returns the summary.
pub async fn run<B: Backend>(
    ctx: Arc<Context<B>>,
    tasks: &[Instance],
    sampling: Sampling,
    concurrency: usize,
    shards: &Path,
) -> Result<Summary, RolloutError> {
    let earlier = earlier(shards, &ctx.run)?;
    let per_task = match sampling {
        Sampling::Fixed(k) => k,
        Sampling::Adaptive(b) => b.first(),
    };
    let bar = ProgressBar::new((tasks.len() * per_task) as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} done · {msg} · ETA {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    if std::env::var_os("ROLLCALL_PROGRESS").is_some_and(|v| v == "0") {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    bar.enable_steady_tick(std::time::Duration::from_millis(250));
    let shared = Shared {
        ctx: ctx.clone(),
        slots: Semaphore::new(concurrency.max(1)),
        earlier,
        counts: Counts::default(),
        bar,
    };
    let started = std::time::Instant::now();
    let groups = join_all(tasks.iter().map(|t| shared.group(t, sampling))).await;
    shared.bar.finish_and_clear();
    Ok(Summary::new(
        &ctx.run,
        groups,
        per_task_k(sampling),
        started.elapsed().as_secs_f64(),
        ctx.cancel.is_cancelled(),
    ))
}

fn per_task_k(sampling: Sampling) -> usize {
    match sampling {
        Sampling::Fixed(k) => k,
        Sampling::Adaptive(b) => b.n,
    }
}
