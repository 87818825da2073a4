//! `rollcall inspect`: a summary of a shards directory, or one rollout as a
//! readable transcript.

use super::read::{self, CallRec};
use super::trajectory::{self, compare::content_text};
use super::ExportError;
use serde::Serialize;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::Path;

/// What `inspect` reports.
#[derive(Debug, Default, Clone, Serialize, PartialEq)]
pub struct Summary {
    /// Rollouts with at least one call.
    pub rollouts: usize,
    /// Rollouts with a finish row.
    pub finished: usize,
    pub calls: usize,
    pub calls_by_status: BTreeMap<String, usize>,
    pub failures_by_class: BTreeMap<String, usize>,
    pub calls_by_wire_api: BTreeMap<String, usize>,
    /// Usage as the upstream reported it.
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    /// Calls with captured token ids, and the ids they hold.
    pub calls_with_token_ids: usize,
    pub captured_prompt_ids: usize,
    pub captured_completion_ids: usize,
    pub rollout_status: BTreeMap<String, usize>,
    pub rewards: RewardStats,
    pub segments: usize,
    pub mismatches: usize,
}

/// The distribution of finished rollouts' rewards.
#[derive(Debug, Default, Clone, Serialize, PartialEq)]
pub struct RewardStats {
    pub count: usize,
    pub missing: usize,
    pub min: Option<f64>,
    pub mean: Option<f64>,
    pub median: Option<f64>,
    pub max: Option<f64>,
    /// Count per reward value, when there are at most 10 distinct values.
    pub values: BTreeMap<String, usize>,
}

fn reward_stats(rewards: &[Option<f64>]) -> RewardStats {
    let mut v: Vec<f64> = rewards
        .iter()
        .flatten()
        .copied()
        .filter(|r| !r.is_nan())
        .collect();
    v.sort_by(f64::total_cmp);
    let mut s = RewardStats {
        count: v.len(),
        missing: rewards.len() - v.len(),
        ..Default::default()
    };
    if !v.is_empty() {
        s.min = v.first().copied();
        s.max = v.last().copied();
        s.mean = Some(v.iter().sum::<f64>() / v.len() as f64);
        s.median = Some(v[v.len() / 2]);
        let mut vals: BTreeMap<String, usize> = BTreeMap::new();
        for r in &v {
            *vals.entry(format!("{r}")).or_default() += 1;
        }
        if vals.len() <= 10 {
            s.values = vals;
        }
    }
    s
}

/// Summarize a shards directory (calls streamed in bounded memory).
pub fn summarize(shards: &Path, scratch: &Path) -> Result<Summary, ExportError> {
    let rollouts = read::read_rollouts(shards)?;
    let mut s = Summary {
        finished: rollouts.len(),
        ..Default::default()
    };
    for info in rollouts.values() {
        *s.rollout_status.entry(info.status.clone()).or_default() += 1;
    }
    s.rewards = reward_stats(&rollouts.values().map(|i| i.reward).collect::<Vec<_>>());
    let mut mm = vec![];
    let pass = super::Pass {
        label: "inspect",
        group_by: None,
        tokens_only: false,
        keep_side_calls: true,
    };
    s.calls = super::each_rollout(shards, scratch, &rollouts, &pass, |calls, _| {
        s.rollouts += 1;
        for c in calls {
            *s.calls_by_status.entry(c.status.clone()).or_default() += 1;
            *s.calls_by_wire_api.entry(c.wire_api.clone()).or_default() += 1;
            if let Some(f) = &c.failure_class {
                *s.failures_by_class.entry(f.clone()).or_default() += 1;
            }
            s.prompt_tokens += c.prompt_tokens.unwrap_or(0);
            s.completion_tokens += c.completion_tokens.unwrap_or(0);
            if c.prompt_ids.is_some() || c.completion_ids.is_some() {
                s.calls_with_token_ids += 1;
                s.captured_prompt_ids += c.prompt_ids.as_ref().map_or(0, Vec::len);
                s.captured_completion_ids += c.completion_ids.as_ref().map_or(0, Vec::len);
            }
        }
        let ok: Vec<&CallRec> = calls.iter().filter(|c| c.status == "ok").collect();
        s.segments += trajectory::rebuild(&ok, false, &mut mm).1.len();
        s.mismatches += mm.len();
        mm.clear();
        Ok(())
    })?;
    Ok(s)
}

fn map_line(m: &BTreeMap<String, usize>) -> String {
    if m.is_empty() {
        return "none".into();
    }
    m.iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl Summary {
    pub fn text(&self) -> String {
        let f = |x: Option<f64>| x.map_or("-".to_owned(), |x| format!("{x:.4}"));
        let r = &self.rewards;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "rollouts     {} with calls, {} finished ({})",
            self.rollouts,
            self.finished,
            map_line(&self.rollout_status)
        );
        let _ = writeln!(
            out,
            "calls        {} ({})",
            self.calls,
            map_line(&self.calls_by_status)
        );
        let _ = writeln!(out, "wire APIs    {}", map_line(&self.calls_by_wire_api));
        let _ = writeln!(out, "failures     {}", map_line(&self.failures_by_class));
        let _ = writeln!(
            out,
            "tokens       {} prompt, {} completion (usage)",
            self.prompt_tokens, self.completion_tokens
        );
        let _ = writeln!(
            out,
            "token ids    {} calls, {} prompt ids, {} completion ids",
            self.calls_with_token_ids, self.captured_prompt_ids, self.captured_completion_ids
        );
        let _ = writeln!(
            out,
            "rewards      {} given, {} missing; min {} mean {} median {} max {}",
            r.count,
            r.missing,
            f(r.min),
            f(r.mean),
            f(r.median),
            f(r.max)
        );
        if !r.values.is_empty() {
            let _ = writeln!(out, "             values: {}", map_line(&r.values));
        }
        let _ = writeln!(
            out,
            "segments     {} ({} mismatches)",
            self.segments, self.mismatches
        );
        out
    }
}

fn clip(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        return s.to_owned();
    }
    let head: String = s.chars().take(n).collect();
    format!("{head}… ({} chars)", s.chars().count())
}

fn render_message(out: &mut String, i: usize, m: &Value, origin: Option<i64>) {
    let role = m.get("role").and_then(Value::as_str).unwrap_or("?");
    let tag = match (role, origin, m.get("tool_call_id").and_then(Value::as_str)) {
        ("assistant", Some(seq), _) => format!("assistant (call {seq})"),
        ("tool", _, Some(id)) => format!("tool {id}"),
        (r, _, _) => r.to_owned(),
    };
    let text = content_text(m.get("content"));
    let _ = writeln!(
        out,
        "  {i:>3} [{tag}] {}",
        clip(text.trim(), 600).replace('\n', "\n        ")
    );
    if let Some(r) = m
        .get("reasoning_content")
        .and_then(Value::as_str)
        .filter(|r| !r.is_empty())
    {
        let _ = writeln!(
            out,
            "        (reasoning) {}",
            clip(r.trim(), 300).replace('\n', " ")
        );
    }
    for c in m
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let f = c.get("function").unwrap_or(c);
        let _ = writeln!(
            out,
            "        → {}({}) [{}]",
            f.get("name").and_then(Value::as_str).unwrap_or("?"),
            clip(
                f.get("arguments").and_then(Value::as_str).unwrap_or(""),
                300
            ),
            c.get("id").and_then(Value::as_str).unwrap_or("")
        );
    }
}

/// One rollout as a readable transcript.
pub fn transcript(shards: &Path, rollout_id: &str) -> Result<String, ExportError> {
    let rollouts = read::read_rollouts(shards)?;
    let mut calls = vec![];
    let progress = super::progress::Progress::new("inspect");
    read::for_each_call(shards, |c| {
        progress.call();
        if c.rollout_id == rollout_id {
            calls.push(c);
        }
        Ok(())
    })?;
    progress.finish();
    calls.sort_by_key(|c| c.sequence);
    calls.dedup_by_key(|c| c.sequence);
    let info = rollouts.get(rollout_id);
    if calls.is_empty() && info.is_none() {
        return Err(ExportError::Arg {
            what: "--rollout".into(),
            why: format!("no rollout {rollout_id:?} in {}", shards.display()),
        });
    }
    let mut out = String::new();
    let _ = writeln!(out, "rollout {rollout_id}");
    match info {
        Some(i) => {
            let _ = writeln!(
                out,
                "finished     {} status={} reward={} metadata={}",
                super::time::format_micros(i.finished_at),
                i.status,
                i.reward.map_or("-".into(), |r| r.to_string()),
                i.metadata.as_deref().unwrap_or("-")
            );
        }
        None => {
            let _ = writeln!(out, "finished     no (no finish row)");
        }
    }
    let _ = writeln!(out, "calls        {}", calls.len());
    for c in calls.iter().filter(|c| c.status != "ok") {
        let _ = writeln!(
            out,
            "  call {} {}: {}",
            c.sequence,
            c.status,
            c.failure_class.as_deref().unwrap_or("-")
        );
    }
    let ok: Vec<&CallRec> = calls.iter().filter(|c| c.status == "ok").collect();
    let mut mm = vec![];
    let (turns, segs) = trajectory::rebuild(&ok, true, &mut mm);
    let why: HashMap<i64, &trajectory::Mismatch> = mm.iter().map(|m| (m.sequence, m)).collect();
    for seg in &segs {
        let seqs: Vec<String> = seg
            .turns
            .iter()
            .map(|&k| turns[k].call.sequence.to_string())
            .collect();
        let Some(first) = seg
            .turns
            .first()
            .and_then(|&k| turns.get(k))
            .map(|t| t.call)
        else {
            continue;
        };
        let _ = writeln!(
            out,
            "\n── segment {} (calls {}; model {}; {} {})",
            seg.index,
            seqs.join(", "),
            first.model.as_deref().unwrap_or("-"),
            first.wire_api,
            super::time::format_micros(first.received_at)
        );
        if let Some(m) = why.get(&first.sequence) {
            let at = match (m.message_index, m.token_index) {
                (Some(i), _) => format!("message {i}"),
                (_, Some(t)) => format!("token {t}"),
                _ => "start".into(),
            };
            let _ = writeln!(
                out,
                "   (new segment: differs from call {} at {at}: {})",
                m.previous_sequence, m.reason
            );
        }
        let (msgs, origin) = trajectory::conversation(&turns, seg);
        for (i, m) in msgs.iter().enumerate() {
            render_message(&mut out, i, m, origin[i]);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reward_distribution() {
        let s = reward_stats(&[Some(1.0), Some(0.0), None, Some(1.0)]);
        assert_eq!((s.count, s.missing), (3, 1));
        assert_eq!(s.mean, Some(2.0 / 3.0));
        assert_eq!(s.values.get("1"), Some(&2));
    }
}
