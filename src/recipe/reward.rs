//! The reward modes of Orchard-SWE's SWE reward, from a rollout's grade and
//! trajectory. Pure: [`reward`] reads an [`Evidence`] and returns the reward
//! with every term that made it, so that a user can see why a rollout got
//! it. What is published and what is inferred is in `docs/recipes.md`.
//!
//! | mode | reward |
//! |---|---|
//! | `simple` | +1 resolved, −1 otherwise (an empty or invalid patch too) |
//! | `simple_truncated` | −2 when the agent did not submit, else `simple` |
//! | `zero` | 1 resolved, else 0 |
//! | `pass_rate` | 10·(0.3·F2P + 0.7·P2P); 0 for an empty or invalid patch |
//! | `process_shaped` | 10·(1.0·resolved + 0.5·f2p + 0.4·localization + 0.3·anchored_flip + 0.1·read_before_edit + 0.2·p2p − 0.05·extra_files − 0.05·no_progress − 0.03·error_rate), and 0 when the integrity gate closes |

use super::steps::Step;
use crate::grade::{touched_files, Report, Split};
use regex::Regex;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;

/// How a graded rollout is rewarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum Mode {
    /// +1 resolved, −1 otherwise.
    Simple,
    /// −2 when not submitted, else as `simple`.
    SimpleTruncated,
    /// 1 resolved, else 0.
    Zero,
    /// 10·(0.3·F2P + 0.7·P2P), the shares of the gold tests passing.
    PassRate,
    /// A process-shaped sum behind an integrity gate.
    ProcessShaped,
}

/// What a reward is computed from.
#[derive(Debug, Clone, Copy)]
pub struct Evidence<'a> {
    pub resolved: bool,
    /// The agent ended by itself (its harness exited 0, not cut off by the
    /// time limit): Orchard's "Submitted".
    pub submitted: bool,
    /// The model patch.
    pub patch: &'a str,
    /// The grading applied the patch.
    pub applied: bool,
    /// The grade's tests report (FAIL_TO_PASS and PASS_TO_PASS, split by
    /// outcome); `None` when the log could not be graded.
    pub tests: Option<&'a Report>,
    /// The task's gold patch, when known (for localization).
    pub gold_patch: Option<&'a str>,
    pub steps: &'a [Step],
}

/// A reward and the terms it was made of.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Reward {
    pub mode: Mode,
    pub reward: f64,
    pub terms: BTreeMap<&'static str, f64>,
    /// Why `process_shaped`'s integrity gate closed; empty when it is open.
    pub gate: Vec<String>,
}

/// Passing share of a gold list; `None` when the list is empty.
fn rate(s: &Split) -> Option<f64> {
    let n = s.success.len() + s.failure.len();
    (n > 0).then(|| s.success.len() as f64 / n as f64)
}

fn bit(b: bool) -> f64 {
    if b {
        1.0
    } else {
        0.0
    }
}

/// Is this path a test file (a test directory, `test_*.py`, `*_test.py`,
/// `conftest.py`)?
pub fn is_test_path(path: &str) -> bool {
    let mut parts = path.split('/').rev();
    let file = parts.next().unwrap_or("");
    let stem = file.rsplit_once('.').map_or(file, |(s, _)| s);
    parts.any(|d| matches!(d, "test" | "tests" | "testing"))
        || stem.starts_with("test_")
        || stem.ends_with("_test")
        || stem.ends_with("_tests")
        || file == "conftest.py"
}

/// The lines a patch adds, with the file each is in.
fn added_lines(patch: &str) -> Vec<(String, String)> {
    let mut file = String::new();
    let mut out = vec![];
    for line in patch.lines() {
        if let Some(rest) = line.strip_prefix("+++ ") {
            file = rest.strip_prefix("b/").unwrap_or(rest).to_owned();
        } else if let Some(added) = line.strip_prefix('+') {
            out.push((file.clone(), added.to_owned()));
        }
    }
    out
}

/// A test id's function name: `a/b.py::C::test_x[p]` → `test_x`,
/// `test_x (module.Class)` → `test_x`.
fn test_name(id: &str) -> &str {
    let last = id.rsplit("::").next().unwrap_or(id);
    let last = last.split('[').next().unwrap_or(last);
    last.split_whitespace().next().unwrap_or(last)
}

fn regex(cell: &'static OnceLock<Regex>, pattern: &str) -> &'static Regex {
    cell.get_or_init(|| Regex::new(pattern).expect("a reward pattern compiles"))
}

/// Why the integrity gate closes, if it does.
fn gate(e: &Evidence, touched: &[String], gold_tests: &[&str]) -> Vec<String> {
    static SKIP: OnceLock<Regex> = OnceLock::new();
    static HARD: OnceLock<Regex> = OnceLock::new();
    static DESTRUCTIVE: OnceLock<Regex> = OnceLock::new();
    let skip = regex(
        &SKIP,
        r"pytest\.mark\.(skip|skipif|xfail)\b|pytest\.(skip|xfail)\(|unittest\.(skip|expectedFailure)|@skip\b|\.skipTest\(",
    );
    let hard = regex(&HARD, r"\bassert\s+True\b|PYTEST_CURRENT_TEST");
    let destructive = regex(
        &DESTRUCTIVE,
        r"\brm\s+-[a-zA-Z]*[rR][a-zA-Z]*\s+(/|~|\$HOME|\.\.?/?|\*)(\s|;|&|$)|\bgit\s+reset\s+--hard\b|\bgit\s+clean\s+-[a-zA-Z]*f|\bgit\s+checkout\s+(--\s+)?\.(\s|;|&|$)|\bgit\s+push\b.*(--force|\s-f\b)|\bmkfs\b|\bdd\s+if=|:\(\)\s*\{",
    );
    let mut why = vec![];
    if let Some(f) = touched.iter().find(|f| is_test_path(f)) {
        why.push(format!("the patch edits the test file {f}"));
    }
    let added = added_lines(e.patch);
    if let Some((f, l)) = added.iter().find(|(_, l)| skip.is_match(l)) {
        why.push(format!(
            "the patch adds a skip or xfail in {f}: {}",
            l.trim()
        ));
    }
    let hard_coded = added.iter().find(|(f, l)| {
        hard.is_match(l)
            || (!is_test_path(f)
                && gold_tests.iter().any(|t| {
                    t.len() >= 6 && (l.contains(&format!("{t}\"")) || l.contains(&format!("{t}'")))
                }))
    });
    if let Some((f, l)) = hard_coded {
        why.push(format!(
            "the patch hard-codes what the tests expect in {f}: {}",
            l.trim()
        ));
    }
    if let Some(s) = e.steps.iter().find(|s| destructive.is_match(&s.command)) {
        why.push(format!(
            "the trajectory runs a destructive command: {}",
            s.command.lines().next().unwrap_or("").trim()
        ));
    }
    why
}

/// A gold FAIL_TO_PASS test seen failing in an observation, and passing in
/// a later one.
fn anchored_flip(steps: &[Step], gold_tests: &[&str]) -> bool {
    gold_tests.iter().filter(|t| t.len() >= 4).any(|t| {
        let mut failed = false;
        for s in steps {
            for line in s.observation.lines().filter(|l| l.contains(*t)) {
                let up = line.to_ascii_uppercase();
                if up.contains("FAIL") || up.contains("ERROR") {
                    failed = true;
                } else if failed && (up.contains("PASS") || up.ends_with(" OK")) {
                    return true;
                }
            }
        }
        false
    })
}

/// The share of the patch's files that a command read before one edited it.
fn read_before_edit(steps: &[Step], touched: &[String]) -> f64 {
    static EDIT: OnceLock<Regex> = OnceLock::new();
    let edit = regex(
        &EDIT,
        r"sed\s+-i|>\s*\S|\btee\b|<<|apply_patch|\bpatch\b|str_replace|create|write|insert",
    );
    if touched.is_empty() {
        return 0.0;
    }
    let read = touched
        .iter()
        .filter(|f| {
            let base = f.rsplit('/').next().unwrap_or(f);
            let mentions: Vec<bool> = steps
                .iter()
                .filter(|s| s.command.contains(base))
                .map(|s| edit.is_match(&s.command))
                .collect();
            let first_read = mentions.iter().position(|&is_edit| !is_edit);
            let first_edit = mentions.iter().position(|&is_edit| is_edit);
            match (first_read, first_edit) {
                (Some(r), Some(w)) => r < w,
                (Some(_), None) => true,
                _ => false,
            }
        })
        .count();
    read as f64 / touched.len() as f64
}

/// The reward of a rollout under `mode` (see the module docs).
pub fn reward(mode: Mode, e: &Evidence) -> Reward {
    let touched = touched_files(e.patch).unwrap_or_default();
    let valid = !e.patch.trim().is_empty() && e.applied && touched_files(e.patch).is_ok();
    let resolved = e.resolved && valid;
    let empty = Split::default();
    let report = e.tests;
    let f2p = report.and_then(|r| rate(&r.fail_to_pass)).unwrap_or(0.0);
    // No gold PASS_TO_PASS tests: nothing was broken.
    let p2p = report.and_then(|r| rate(&r.pass_to_pass)).unwrap_or(1.0);
    let mut terms: BTreeMap<&'static str, f64> = BTreeMap::new();
    terms.insert("resolved", bit(resolved));
    terms.insert("patch_valid", bit(valid));
    let mut gate_why = vec![];
    let value = match mode {
        Mode::Simple => {
            if resolved {
                1.0
            } else {
                -1.0
            }
        }
        Mode::SimpleTruncated => {
            terms.insert("submitted", bit(e.submitted));
            match (e.submitted, resolved) {
                (false, _) => -2.0,
                (true, true) => 1.0,
                (true, false) => -1.0,
            }
        }
        Mode::Zero => bit(resolved),
        Mode::PassRate => {
            terms.insert("f2p", f2p);
            terms.insert("p2p", p2p);
            if valid && report.is_some() {
                10.0 * (0.3 * f2p + 0.7 * p2p)
            } else {
                0.0
            }
        }
        Mode::ProcessShaped => {
            let gold_f2p = report.map_or(&empty, |r| &r.fail_to_pass);
            let gold_tests: Vec<&str> = gold_f2p
                .success
                .iter()
                .chain(&gold_f2p.failure)
                .map(|t| test_name(t))
                .collect();
            let gold: BTreeSet<String> = e
                .gold_patch
                .and_then(|g| touched_files(g).ok())
                .unwrap_or_default()
                .into_iter()
                .collect();
            let source: Vec<&String> = touched.iter().filter(|f| !is_test_path(f)).collect();
            let localization = if gold.is_empty() {
                0.0
            } else {
                gold.iter().filter(|g| touched.contains(g)).count() as f64 / gold.len() as f64
            };
            let extra = if gold.is_empty() {
                0.0
            } else {
                source.iter().filter(|f| !gold.contains(**f)).count() as f64
            };
            let commands: Vec<&str> = e.steps.iter().map(|s| s.command.trim()).collect();
            let distinct: BTreeSet<&str> = commands.iter().copied().collect();
            let no_progress = if commands.is_empty() {
                0.0
            } else {
                (commands.len() - distinct.len()) as f64 / commands.len() as f64
            };
            let codes: Vec<i64> = e.steps.iter().filter_map(|s| s.returncode).collect();
            let error_rate = if codes.is_empty() {
                0.0
            } else {
                codes.iter().filter(|&&c| c != 0).count() as f64 / codes.len() as f64
            };
            let flip = bit(anchored_flip(e.steps, &gold_tests));
            let rbe = read_before_edit(e.steps, &touched);
            for (k, v) in [
                ("f2p", f2p),
                ("p2p", p2p),
                ("localization", localization),
                ("anchored_flip", flip),
                ("read_before_edit", rbe),
                ("extra_files", extra),
                ("no_progress", no_progress),
                ("error_rate", error_rate),
            ] {
                terms.insert(k, v);
            }
            gate_why = gate(e, &touched, &gold_tests);
            terms.insert("gate", bit(gate_why.is_empty()));
            let sum = 1.0 * bit(resolved)
                + 0.5 * f2p
                + 0.4 * localization
                + 0.3 * flip
                + 0.1 * rbe
                + 0.2 * p2p
                - 0.05 * extra
                - 0.05 * no_progress
                - 0.03 * error_rate;
            if gate_why.is_empty() {
                10.0 * sum
            } else {
                0.0
            }
        }
    };
    Reward {
        mode,
        reward: value,
        terms,
        gate: gate_why,
    }
}

#[cfg(test)]
#[path = "reward_tests.rs"]
mod tests;
