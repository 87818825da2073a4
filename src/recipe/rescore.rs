//! `rollcall reward`: every graded rollout re-scored under a reward mode,
//! each as a new reward revision with its terms (see [`super::reward`]).
//!
//! What a mode reads comes from the rollout's finish metadata, as
//! `rollcall batch` writes it (`report`: the grade, `resolved`,
//! `model_patch`, `outcome`, `harness_exit`), its recorded calls (the
//! steps, for `process_shaped`), and the task file (the gold patch, for
//! localization). A rollout without a grade is left as it is, and counted.

use super::revision::{revise, write};
use super::reward::{reward, Evidence, Mode};
use super::steps::{history, steps};
use super::RecipeError;
use crate::export::read::{read_rollouts, CallRec, RolloutInfo};
use crate::export::{each_rollout, Pass};
use crate::grade::{Instance, Report};
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// What a re-scoring did.
#[derive(Debug, Default, Clone, Serialize)]
pub struct RescoreReport {
    pub mode: String,
    pub rollouts: usize,
    pub revised: usize,
    /// Finished without a grade (`rollcall run`, infrastructure faults).
    pub ungraded: usize,
    pub mean_reward: Option<f64>,
    /// Rollouts whose `process_shaped` gate closed.
    pub gated: usize,
    pub file: Option<String>,
}

/// The evidence a finish row's metadata gives.
pub(super) struct Graded {
    pub(super) resolved: bool,
    pub(super) submitted: bool,
    pub(super) patch: String,
    pub(super) applied: bool,
    pub(super) tests: Option<Report>,
    pub(super) task: Option<String>,
}

/// What a graded rollout's finish metadata says; `None` without a grade.
pub(super) fn graded(info: &RolloutInfo) -> Option<Graded> {
    let m: Value = serde_json::from_str(info.metadata.as_deref()?).ok()?;
    let grade = m.get("report").filter(|g| g.is_object())?;
    let outcome = m
        .get("outcome")
        .and_then(Value::as_str)
        .unwrap_or(&info.status);
    Some(Graded {
        resolved: m
            .get("resolved")
            .or_else(|| grade.get("resolved"))
            .and_then(Value::as_bool)
            .unwrap_or(false),
        submitted: !matches!(outcome, "timeout" | "cancelled" | "infra_error")
            && m.get("harness_exit").and_then(Value::as_i64) == Some(0),
        patch: m
            .get("model_patch")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned(),
        applied: grade
            .get("patch_successfully_applied")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        tests: grade
            .get("report")
            .and_then(|r| serde_json::from_value(r.clone()).ok()),
        task: m.get("task").and_then(Value::as_str).map(str::to_owned),
    })
}

/// Re-score every graded rollout of `shards` under `mode`.
pub fn rescore(
    shards: &Path,
    mode: Mode,
    tasks: &[Instance],
) -> Result<RescoreReport, RecipeError> {
    let rollouts = read_rollouts(shards)?;
    let gold: HashMap<&str, &str> = tasks
        .iter()
        .filter_map(|t| Some((t.instance_id.as_str(), t.patch.as_deref()?)))
        .collect();
    let mode_name = serde_json::to_value(mode)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    let mut report = RescoreReport {
        mode: mode_name.clone(),
        rollouts: rollouts.len(),
        ..RescoreReport::default()
    };
    let mut rows = vec![];
    let mut sum = 0.0;
    let mut one = |id: &str, info: &RolloutInfo, calls: &[CallRec]| {
        let Some(g) = graded(info) else {
            report.ungraded += 1;
            return;
        };
        let steps = if mode == Mode::ProcessShaped {
            steps(&history(calls))
        } else {
            vec![]
        };
        let r = reward(
            mode,
            &Evidence {
                resolved: g.resolved,
                submitted: g.submitted,
                patch: &g.patch,
                applied: g.applied,
                tests: g.tests.as_ref(),
                gold_patch: g.task.as_deref().and_then(|t| gold.get(t).copied()),
                steps: &steps,
            },
        );
        if !r.gate.is_empty() {
            report.gated += 1;
        }
        sum += r.reward;
        report.revised += 1;
        rows.push(revise(
            id,
            info,
            r.reward,
            json!({"source": "reward", "mode": mode_name, "terms": r.terms, "gate": r.gate,
                "steps": steps.len()}),
        ));
    };
    let mut seen: BTreeMap<String, ()> = BTreeMap::new();
    if mode == Mode::ProcessShaped {
        let pass = Pass {
            label: "reward",
            group_by: None,
            tokens_only: false,
            keep_side_calls: false,
        };
        each_rollout(shards, shards, &rollouts, &pass, |calls, info| {
            if let (Some(first), Some(info)) = (calls.first(), info) {
                seen.insert(first.rollout_id.clone(), ());
                one(&first.rollout_id, info, calls);
            }
            Ok(())
        })?;
    }
    for (id, info) in &rollouts {
        if !seen.contains_key(id) {
            one(id, info, &[]);
        }
    }
    if report.revised > 0 {
        report.mean_reward = Some(sum / report.revised as f64);
    }
    report.file = write(shards, rows)?.map(|p| p.display().to_string());
    Ok(report)
}
