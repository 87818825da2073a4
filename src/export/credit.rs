//! Credit assignment: per-step weights from a step-scores file, and the
//! built-in rule that truncates unresolved trajectories at a failure signal.

use super::read::RolloutInfo;
use super::trajectory::compare::content_text;
use super::ExportError;
use serde_json::Value;
use std::collections::HashMap;
use std::io::BufRead;
use std::path::Path;

/// A failure signal for `--truncate-failed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Signal {
    /// A tool result whose text shows an error (see [`tool_error`]).
    ToolError,
    /// A call of the rollout that failed (status `failed`).
    FailedCall,
}

impl Signal {
    pub fn name(self) -> &'static str {
        match self {
            Signal::ToolError => "tool_error",
            Signal::FailedCall => "failed_call",
        }
    }
}

/// Substrings that mark a tool result as an error.
pub const ERROR_MARKERS: &[&str] = &[
    "Traceback (most recent call last)",
    "error:",
    "Error:",
    "ERROR:",
    "command not found",
    "Permission denied",
];

/// Keys after which a non-zero integer means a failed command, e.g.
/// `exit code 2`, `"exit_code": 1`, `Exit status: 127`, `<returncode>1</returncode>`.
pub const EXIT_KEYS: &[&str] = &[
    "exit code",
    "exit_code",
    "exitcode",
    "exit status",
    "exit_status",
    "returncode",
    "return code",
];

/// Which error pattern a tool result's text shows, if any.
pub fn tool_error(text: &str) -> Option<&'static str> {
    if let Some(m) = ERROR_MARKERS.iter().find(|m| text.contains(**m)) {
        return Some(m);
    }
    let lower = text.to_ascii_lowercase();
    for key in EXIT_KEYS {
        let mut from = 0;
        while let Some(p) = lower[from..].find(key) {
            let rest = &lower[from + p + key.len()..];
            let rest = rest.trim_start_matches([' ', ':', '=', '"', '\'', '>', '\t']);
            let digits: String = rest
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '-')
                .collect();
            if digits.parse::<i64>().is_ok_and(|n| n != 0) {
                return Some("non-zero exit code");
            }
            from += p + key.len();
        }
    }
    None
}

/// Unresolved: reward missing or <= 0, or status not `completed`/`success`.
pub fn unresolved(info: Option<&RolloutInfo>) -> bool {
    match info {
        None => true,
        Some(i) => {
            i.reward.is_none_or(|r| r <= 0.0 || r.is_nan())
                || !matches!(i.status.as_str(), "completed" | "success")
        }
    }
}

/// Where to cut a conversation under `signal`: the number of messages to
/// keep (through the last assistant step before the first signal), or
/// `None` when the signal does not occur. `origin` gives, per message, the
/// sequence of the call that produced it; `failed` the sequences of the
/// rollout's failed calls, in ascending order.
pub fn truncation(
    msgs: &[Value],
    origin: &[Option<i64>],
    signal: Signal,
    failed: &[i64],
    first_sequence: i64,
) -> Option<usize> {
    let is_assistant = |m: &Value| m.get("role").and_then(Value::as_str) == Some("assistant");
    match signal {
        Signal::ToolError => {
            let at = msgs.iter().position(|m| {
                m.get("role").and_then(Value::as_str) == Some("tool")
                    && tool_error(&content_text(m.get("content"))).is_some()
            })?;
            Some(
                msgs[..at]
                    .iter()
                    .rposition(is_assistant)
                    .map_or(0, |i| i + 1),
            )
        }
        Signal::FailedCall => {
            // `failed` is sorted: the first failure after the segment's start.
            let f = *failed.get(failed.partition_point(|&s| s <= first_sequence))?;
            // Keep through the last step made before the failed call.
            let last_before = origin
                .iter()
                .enumerate()
                .filter(|(_, o)| o.is_some_and(|s| s < f))
                .map(|(i, _)| i)
                .next_back();
            let after = origin.iter().any(|o| o.is_some_and(|s| s > f));
            if !after {
                return None;
            }
            Some(last_before.map_or(0, |i| i + 1))
        }
    }
}

/// Step scores: (rollout, sequence) → weight of the assistant message that call produced.
#[derive(Debug, Default, Clone)]
pub struct StepScores(HashMap<(String, i64), f64>);

impl StepScores {
    /// Read a JSONL file of `{"rollout_id", "sequence", "score"}` lines.
    pub fn load(path: &Path) -> Result<StepScores, ExportError> {
        let f = std::fs::File::open(path)
            .map_err(|e| ExportError::Io(format!("{}: {e}", path.display())))?;
        Self::read(std::io::BufReader::new(f), &path.display().to_string())
    }

    pub fn read(r: impl BufRead, name: &str) -> Result<StepScores, ExportError> {
        let mut map = HashMap::new();
        for (i, line) in r.lines().enumerate() {
            let bad = |why: String| ExportError::StepScores {
                file: name.to_owned(),
                line: i + 1,
                why,
            };
            let line = line.map_err(|e| bad(e.to_string()))?;
            if line.trim().is_empty() {
                continue;
            }
            let v: Value = serde_json::from_str(&line).map_err(|e| bad(e.to_string()))?;
            let rid = v
                .get("rollout_id")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("no string rollout_id".into()))?;
            let seq = v
                .get("sequence")
                .and_then(Value::as_i64)
                .ok_or_else(|| bad("no integer sequence".into()))?;
            let score = v
                .get("score")
                .and_then(Value::as_f64)
                .ok_or_else(|| bad("no numeric score".into()))?;
            map.insert((rid.to_owned(), seq), score);
        }
        Ok(StepScores(map))
    }

    pub fn get(&self, rollout_id: &str, sequence: i64) -> Option<f64> {
        self.0.get(&(rollout_id.to_owned(), sequence)).copied()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Loss weights: 1 on assistant messages, 0 elsewhere, or the step score of
/// the call that produced an assistant message when one is given. Returns
/// the weights and whether any score was applied.
pub fn loss_weights(
    msgs: &[Value],
    origin: &[Option<i64>],
    rollout_id: &str,
    scores: Option<&StepScores>,
) -> (Vec<f32>, bool) {
    let mut used = false;
    let w = msgs
        .iter()
        .enumerate()
        .map(|(i, m)| {
            if m.get("role").and_then(Value::as_str) != Some("assistant") {
                return 0.0;
            }
            match (scores, origin.get(i).copied().flatten()) {
                (Some(s), Some(seq)) => match s.get(rollout_id, seq) {
                    Some(score) => {
                        used = true;
                        score as f32
                    }
                    None => 1.0,
                },
                _ => 1.0,
            }
        })
        .collect();
    (w, used)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tool_error_patterns() {
        assert!(tool_error("Traceback (most recent call last):\n  File x").is_some());
        assert!(tool_error("bash: foo: command not found").is_some());
        assert!(tool_error("{\"exit_code\": 2, \"output\": \"\"}").is_some());
        assert!(tool_error("<returncode>1</returncode>").is_some());
        assert!(tool_error("Process exited with exit code 127").is_some());
        assert!(tool_error("{\"exit_code\": 0, \"output\": \"ok\"}").is_none());
        assert!(tool_error("all 3 tests passed").is_none());
    }

    fn conv() -> (Vec<Value>, Vec<Option<i64>>) {
        let msgs = vec![
            json!({"role": "user", "content": "task"}),
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "a", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]}),
            json!({"role": "tool", "tool_call_id": "a", "content": "{\"exit_code\": 0, \"output\": \"x\"}"}),
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "b", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]}),
            json!({"role": "tool", "tool_call_id": "b", "content": "Traceback (most recent call last):"}),
            json!({"role": "assistant", "content": "flailing"}),
        ];
        (msgs, vec![None, Some(0), None, Some(1), None, Some(2)])
    }

    #[test]
    fn truncation_at_tool_error_keeps_the_step_before_it() {
        let (msgs, origin) = conv();
        assert_eq!(
            truncation(&msgs, &origin, Signal::ToolError, &[], 0),
            Some(4)
        );
        let clean = &msgs[..3];
        assert_eq!(
            truncation(clean, &origin[..3], Signal::ToolError, &[], 0),
            None
        );
    }

    #[test]
    fn truncation_at_failed_call() {
        let (msgs, origin) = conv();
        // Call 2 failed once (sequence 2 was retried as sequence 3 → here the
        // last step has sequence 2, so treat a failure at 1.5 via sequence 2).
        let origin2 = vec![None, Some(0), None, Some(1), None, Some(3)];
        assert_eq!(
            truncation(&msgs, &origin2, Signal::FailedCall, &[2], 0),
            Some(4)
        );
        // A failure after the last step drops nothing.
        assert_eq!(
            truncation(&msgs, &origin, Signal::FailedCall, &[5], 0),
            None
        );
    }

    #[test]
    fn unresolved_rule() {
        let ok = RolloutInfo {
            status: "success".into(),
            reward: Some(1.0),
            ..Default::default()
        };
        assert!(!unresolved(Some(&ok)));
        assert!(unresolved(None));
        let zero = RolloutInfo {
            reward: Some(0.0),
            ..ok.clone()
        };
        assert!(unresolved(Some(&zero)));
        let failed = RolloutInfo {
            status: "failure".into(),
            ..ok
        };
        assert!(unresolved(Some(&failed)));
    }

    #[test]
    fn step_scores_weights_and_errors() {
        let s = StepScores::read(
            "{\"rollout_id\": \"r\", \"sequence\": 1, \"score\": 0.25}\n\n".as_bytes(),
            "s.jsonl",
        )
        .expect("reads");
        let (msgs, origin) = conv();
        let (w, used) = loss_weights(&msgs, &origin, "r", Some(&s));
        assert!(used);
        assert_eq!(w, vec![0.0, 1.0, 0.0, 0.25, 0.0, 1.0]);
        let (w, used) = loss_weights(&msgs, &origin, "r", None);
        assert!(!used);
        assert_eq!(w, vec![0.0, 1.0, 0.0, 1.0, 0.0, 1.0]);
        let err = StepScores::read(
            "{\"rollout_id\": \"r\", \"sequence\": 1, \"score\": 1}\n{\"rollout_id\": \"r\"}\n"
                .as_bytes(),
            "s.jsonl",
        )
        .expect_err("line 2 is bad");
        assert!(err.to_string().contains("s.jsonl line 2"), "{err}");
    }
}
