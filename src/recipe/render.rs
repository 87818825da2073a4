//! A trajectory rendered compactly for a judge: per step the reasoning
//! (≤ 600 characters), the command (≤ 400) and the observation in compact
//! form (an error's text ≤ 800; the test-summary lines; a big output as
//! `[output: N lines, M chars]` and its head); the task ≤ 4,000 and the
//! final patch ≤ 4,000. With a reference (the gold FAIL_TO_PASS tests, the
//! files the gold patch changes and the gold patch ≤ 3,000), the judge is
//! reference-guided. A cut keeps 70 % of its budget at the head, the rest
//! at the tail.

use super::steps::Step;
use regex::Regex;
use std::sync::OnceLock;

pub const TASK: usize = 4000;
pub const PATCH: usize = 4000;
pub const GOLD_PATCH: usize = 3000;
pub const REASONING: usize = 600;
pub const COMMAND: usize = 400;
pub const ERROR: usize = 800;
/// Observations longer than this are summarized.
pub const OBSERVATION: usize = 1200;
/// The head of a summarized observation.
pub const HEAD: usize = 400;
/// Test-summary lines kept of one observation.
pub const SUMMARY_LINES: usize = 12;

/// What a reference-guided judge is shown.
#[derive(Debug, Clone, Default)]
pub struct Reference {
    pub fail_to_pass: Vec<String>,
    pub changed_files: Vec<String>,
    pub gold_patch: String,
}

/// `s` within `max` characters: 70 % head, the rest tail, and what was cut.
pub fn truncate(s: &str, max: usize) -> String {
    let n = s.chars().count();
    if n <= max {
        return s.to_owned();
    }
    let marker = format!("\n[... {} chars cut ...]\n", n - max);
    let budget = max.saturating_sub(marker.chars().count());
    let head = budget * 7 / 10;
    let tail = budget - head;
    let h: String = s.chars().take(head).collect();
    let t: String = s.chars().skip(n - tail).collect();
    format!("{h}{marker}{t}")
}

fn summary_line(l: &str) -> bool {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(
            r"(?i)^=+ .*\b(passed|failed|error|errors|skipped|xfailed)\b.* =+$|^(FAILED|PASSED|ERROR) \S|\b\d+ (passed|failed|errors?)\b|^Ran \d+ tests?|^(OK|FAILED)( \(.*\))?$|Traceback \(most recent call last\)|^\w*(Error|Exception): ",
        )
        .expect("the summary pattern compiles")
    })
    .is_match(l.trim())
}

/// An observation in compact form.
pub fn observation(obs: &str, returncode: Option<i64>) -> String {
    let summary: Vec<&str> = obs
        .lines()
        .filter(|l| summary_line(l))
        .take(SUMMARY_LINES)
        .collect();
    if let Some(rc) = returncode.filter(|&rc| rc != 0) {
        let mut s = format!("[exit {rc}] {}", truncate(obs.trim(), ERROR));
        if obs.chars().count() > ERROR && !summary.is_empty() {
            s.push_str("\n[test summary]\n");
            s.push_str(&summary.join("\n"));
        }
        return s;
    }
    let n = obs.chars().count();
    if n <= OBSERVATION {
        return obs.trim().to_owned();
    }
    let head: String = obs.chars().take(HEAD).collect();
    let mut s = format!("[output: {} lines, {n} chars]\n{head}", obs.lines().count());
    if !summary.is_empty() {
        s.push_str("\n[test summary]\n");
        s.push_str(&summary.join("\n"));
    }
    s
}

/// The judge's user message.
pub fn trajectory(
    task: &str,
    steps: &[Step],
    patch: &str,
    reference: Option<&Reference>,
) -> String {
    let mut s = format!("## Task\n{}\n", truncate(task.trim(), TASK));
    if let Some(r) = reference {
        s.push_str("\n## Reference (for grading only; the agent did not see it)\n");
        s.push_str(&format!(
            "Tests that must go from failing to passing: {}\n",
            r.fail_to_pass.join(", ")
        ));
        s.push_str(&format!(
            "Files the gold patch changes: {}\n",
            r.changed_files.join(", ")
        ));
        s.push_str(&format!(
            "Gold patch:\n```diff\n{}\n```\n",
            truncate(r.gold_patch.trim(), GOLD_PATCH)
        ));
    }
    s.push_str(&format!("\n## Trajectory ({} steps)\n", steps.len()));
    for (i, st) in steps.iter().enumerate() {
        s.push_str(&format!("\n### Step {}\n", i + 1));
        if !st.reasoning.trim().is_empty() {
            s.push_str(&format!(
                "Reasoning: {}\n",
                truncate(st.reasoning.trim(), REASONING)
            ));
        }
        s.push_str(&format!(
            "Command: {}\n",
            truncate(st.command.trim(), COMMAND)
        ));
        s.push_str(&format!(
            "Observation: {}\n",
            observation(&st.observation, st.returncode)
        ));
    }
    let patch = if patch.trim().is_empty() {
        "(none: the agent left no changes)".to_owned()
    } else {
        format!("```diff\n{}\n```", truncate(patch.trim(), PATCH))
    };
    s.push_str(&format!("\n## Final patch\n{patch}\n"));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_keeps_head_and_tail_within_the_budget() {
        let s: String = (0..5000)
            .map(|i| char::from(b'a' + (i % 26) as u8))
            .collect();
        let t = truncate(&s, 1000);
        assert!(t.chars().count() <= 1000, "{}", t.chars().count());
        assert!(t.starts_with("abcdef") && t.ends_with(&s[s.len() - 20..]));
        assert!(t.contains("chars cut"));
        assert_eq!(truncate("short", 10), "short");
    }

    #[test]
    fn observations_are_compact() {
        let big: String = (0..500).map(|i| format!("line {i}\n")).collect::<String>()
            + "FAILED tests/test_a.py::test_x - assert 1 == 2\n===== 1 failed, 3 passed in 0.2s =====\n";
        let ok = observation(&big, Some(0));
        assert!(ok.starts_with("[output: 502 lines,"), "{ok}");
        assert!(ok.contains("1 failed, 3 passed") && ok.contains("FAILED tests/test_a.py::test_x"));
        assert!(ok.chars().count() < HEAD + 400);
        let err = observation(&big, Some(1));
        assert!(err.starts_with("[exit 1] line 0"));
        assert!(err.chars().count() < ERROR + 400);
        assert_eq!(observation("  fine \n", None), "fine");
    }

    #[test]
    fn a_trajectory_is_rendered_with_its_reference() {
        let steps = vec![Step {
            turn: 0,
            reasoning: "r".repeat(2000),
            command: "pytest -q".into(),
            observation: "1 passed".into(),
            returncode: Some(0),
        }];
        let r = Reference {
            fail_to_pass: vec!["t::test_a".into()],
            changed_files: vec!["pkg/a.py".into()],
            gold_patch: "diff --git a/pkg/a.py b/pkg/a.py".into(),
        };
        let s = trajectory(&"x".repeat(9000), &steps, "", Some(&r));
        assert!(s.contains("## Reference") && s.contains("t::test_a") && s.contains("pkg/a.py"));
        assert!(s.contains("### Step 1") && s.contains("Command: pytest -q"));
        assert!(s.contains("(none: the agent left no changes)"));
        assert!(s.chars().count() < TASK + REASONING + 1000);
        assert!(!trajectory("t", &steps, "p", None).contains("Reference"));
    }
}
