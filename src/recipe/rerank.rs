//! `rollcall rerank`: value reranking. Of the k rollouts of each task (a
//! group, as `rollcall batch` groups them), a scorer picks one, and the run
//! reports, side by side, resolved@1 of the pick, of a random pick (its
//! expectation: the share of each group resolved) and pass@k (the oracle:
//! any of the k resolved).
//!
//! Scorers:
//! - `value`: a model asked a fixed value prompt over the rendered
//!   trajectory, answering a probability in [0, 1];
//! - `yes`: the same model's probability of answering `yes` (the summed
//!   probabilities of the yes tokens among its top logprobs);
//! - `judge`: the J of each rollout's latest `rollcall judge` revision.
//!
//! A candidate the scorer could not score ranks last; ties go to the first
//! rollout id. Every graded rollout's rendered trajectory is held while the
//! candidates are scored (each bounded by the render's limits).

use super::client::Server;
use super::render::trajectory;
use super::rescore::graded;
use super::steps::{history, steps, text_of};
use super::RecipeError;
use crate::export::read::{read_rollouts, CallRec, RolloutInfo};
use crate::export::{each_rollout, group_of, Pass};
use futures_util::StreamExt;
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;

/// How candidates are scored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Scorer {
    /// A value model's stated probability of success.
    Value,
    /// A value model's probability of the answer `yes`.
    Yes,
    /// The J of the rollout's latest judge revision.
    Judge,
}

/// The value prompt: fixed, so that runs compare.
pub const VALUE_PROMPT: &str =
    "You estimate whether a software engineering agent solved its task. \
You see the task, the agent's trajectory and its final patch. Hidden tests will decide; you do not \
see them.";

/// One candidate's outcome and score.
#[derive(Debug, Clone, Serialize)]
pub struct Candidate {
    pub rollout_id: String,
    pub resolved: bool,
    pub score: Option<f64>,
    pub error: Option<String>,
}

/// One task's candidates and the pick.
#[derive(Debug, Clone, Serialize)]
pub struct TaskPick {
    pub group: String,
    pub candidates: Vec<Candidate>,
    pub pick: String,
    pub pick_resolved: bool,
}

/// The side-by-side figures.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RerankReport {
    pub scorer: String,
    pub tasks: usize,
    pub candidates: usize,
    /// Largest and smallest k.
    pub k_max: usize,
    pub k_min: usize,
    pub pick_resolved_at_1: f64,
    pub random_resolved_at_1: f64,
    pub pass_at_k: f64,
    pub unscored: usize,
    pub picks: Vec<TaskPick>,
}

/// The first number of an answer, when it is a probability.
pub fn value_of(answer: &str) -> Result<f64, String> {
    let t = answer.trim();
    let start = t
        .find(|c: char| c.is_ascii_digit() || c == '.')
        .ok_or_else(|| {
            format!(
                "no number in the answer: {}",
                t.chars().take(120).collect::<String>()
            )
        })?;
    let num: String = t[start..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let v: f64 = num
        .parse()
        .map_err(|_| format!("{num:?} is not a number"))?;
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{v} is not a probability"))
    }
}

/// The probability of `yes` among an answer's first token's top logprobs.
pub fn yes_of(answer: &Value) -> Result<f64, String> {
    let top = answer
        .pointer("/choices/0/logprobs/content/0/top_logprobs")
        .and_then(Value::as_array)
        .ok_or("the answer has no top_logprobs for its first token")?;
    Ok(top
        .iter()
        .filter(|t| {
            t.get("token")
                .and_then(Value::as_str)
                .is_some_and(|s| s.trim().eq_ignore_ascii_case("yes"))
        })
        .filter_map(|t| t.get("logprob").and_then(Value::as_f64))
        .map(f64::exp)
        .sum::<f64>()
        .min(1.0))
}

/// What each rollout is, for scoring: its group, outcome, and prompt.
struct Entry {
    rollout_id: String,
    group: String,
    resolved: bool,
    prompt: String,
    judge_j: Option<f64>,
}

fn entry(id: &str, info: &RolloutInfo, calls: &[CallRec]) -> Option<Entry> {
    let g = graded(info)?;
    let conversation = history(calls);
    let task = conversation
        .iter()
        .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))
        .map(|m| text_of(m.get("content")))
        .unwrap_or_default();
    let judge_j = info
        .metadata
        .as_deref()
        .and_then(|m| serde_json::from_str::<Value>(m).ok())
        .filter(|m| m.pointer("/revision/source").and_then(Value::as_str) == Some("judge"))
        .and_then(|m| m.pointer("/revision/j").and_then(Value::as_f64));
    Some(Entry {
        rollout_id: id.to_owned(),
        group: group_of(id, Some(info), None),
        resolved: g.resolved,
        prompt: trajectory(&task, &steps(&conversation), &g.patch, None),
        judge_j,
    })
}

async fn score(
    server: Option<&Server>,
    scorer: Scorer,
    model: Option<&str>,
    e: &Entry,
) -> Result<f64, String> {
    let server = match (scorer, server) {
        (Scorer::Judge, _) => return e.judge_j.ok_or_else(|| "no judge revision".to_owned()),
        (_, Some(s)) => s,
        (_, None) => return Err("no value model".into()),
    };
    let ask = match scorer {
        Scorer::Yes => "Did the agent solve the task? Answer yes or no.",
        _ => "What is the probability that the final patch solves the task? Answer with one number between 0 and 1.",
    };
    let mut body = json!({"messages": [{"role": "system", "content": VALUE_PROMPT},
        {"role": "user", "content": format!("{}\n\n{ask}", e.prompt)}],
        "temperature": 0.0, "max_tokens": if scorer == Scorer::Yes { 1 } else { 16 }});
    if scorer == Scorer::Yes {
        body["logprobs"] = json!(true);
        body["top_logprobs"] = json!(20);
    }
    if let Some(m) = model {
        body["model"] = json!(m);
    }
    let v = server
        .post("/chat/completions", &body)
        .await
        .map_err(|e| e.to_string())?;
    match scorer {
        Scorer::Yes => yes_of(&v),
        _ => value_of(
            v.pointer("/choices/0/message/content")
                .and_then(Value::as_str)
                .unwrap_or(""),
        ),
    }
}

/// Rerank the graded rollouts of `shards` (see the module docs).
pub async fn rerank(
    shards: &Path,
    server: Option<&Server>,
    scorer: Scorer,
    model: Option<&str>,
    concurrency: usize,
) -> Result<RerankReport, RecipeError> {
    let rollouts = read_rollouts(shards)?;
    let pass = Pass {
        label: "rerank",
        group_by: None,
        tokens_only: false,
        keep_side_calls: false,
    };
    let mut entries: Vec<Entry> = vec![];
    let mut seen = std::collections::BTreeSet::new();
    each_rollout(shards, shards, &rollouts, &pass, |calls, info| {
        if let (Some(first), Some(info)) = (calls.first(), info) {
            seen.insert(first.rollout_id.clone());
            entries.extend(entry(&first.rollout_id, info, calls));
        }
        Ok(())
    })?;
    for (id, info) in rollouts.iter().filter(|(id, _)| !seen.contains(*id)) {
        entries.extend(entry(id, info, &[]));
    }
    let scored: Vec<(Entry, Result<f64, String>)> =
        futures_util::stream::iter(entries.into_iter().map(|e| async move {
            let s = score(server, scorer, model, &e).await;
            (e, s)
        }))
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await;
    let mut groups: BTreeMap<String, Vec<Candidate>> = BTreeMap::new();
    for (e, s) in scored {
        groups.entry(e.group).or_default().push(Candidate {
            rollout_id: e.rollout_id,
            resolved: e.resolved,
            score: s.as_ref().ok().copied(),
            error: s.err(),
        });
    }
    let mut r = RerankReport {
        scorer: serde_json::to_value(scorer)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default(),
        k_min: usize::MAX,
        ..RerankReport::default()
    };
    for (group, mut cands) in groups {
        cands.sort_by(|a, b| a.rollout_id.cmp(&b.rollout_id));
        let k = cands.len();
        r.k_max = r.k_max.max(k);
        r.k_min = r.k_min.min(k);
        r.candidates += k;
        r.unscored += cands.iter().filter(|c| c.score.is_none()).count();
        let resolved = cands.iter().filter(|c| c.resolved).count();
        r.random_resolved_at_1 += resolved as f64 / k as f64;
        r.pass_at_k += if resolved > 0 { 1.0 } else { 0.0 };
        // The highest score; the first rollout id among equals.
        let best = cands
            .iter()
            .enumerate()
            .max_by(|(i, a), (j, b)| {
                let s = |c: &Candidate| c.score.unwrap_or(f64::NEG_INFINITY);
                s(a).total_cmp(&s(b)).then(j.cmp(i))
            })
            .map(|(i, _)| i)
            .unwrap_or(0);
        let pick = &cands[best];
        r.pick_resolved_at_1 += if pick.resolved { 1.0 } else { 0.0 };
        r.picks.push(TaskPick {
            group,
            pick: pick.rollout_id.clone(),
            pick_resolved: pick.resolved,
            candidates: cands,
        });
    }
    r.tasks = r.picks.len();
    if r.tasks > 0 {
        let n = r.tasks as f64;
        r.pick_resolved_at_1 /= n;
        r.random_resolved_at_1 /= n;
        r.pass_at_k /= n;
    } else {
        r.k_min = 0;
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_and_yes_probabilities_are_read() {
        assert_eq!(value_of("0.75"), Ok(0.75));
        assert_eq!(value_of("Probability: 0.2 (low)"), Ok(0.2));
        assert!(value_of("7").unwrap_err().contains("not a probability"));
        assert!(value_of("no idea").unwrap_err().contains("no number"));
        let a = json!({"choices": [{"logprobs": {"content": [{"token": "Yes", "logprob": -0.5,
            "top_logprobs": [{"token": "Yes", "logprob": -0.5}, {"token": " yes", "logprob": -2.0},
                             {"token": "No", "logprob": -1.2}]}]}}]});
        let want = (-0.5f64).exp() + (-2.0f64).exp();
        assert!((yes_of(&a).unwrap() - want).abs() < 1e-12);
        assert!(yes_of(&json!({})).is_err());
    }
}
