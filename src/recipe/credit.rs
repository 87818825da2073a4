//! `rollcall judge --steps`: credit assignment for SFT. The judge model
//! reads an unresolved trajectory, its steps numbered, and gives each step a
//! retrospective value (in hindsight, the chance the agent would still have
//! solved the task from right after that step) and names the first critical
//! mistake. The step-scores file it writes (JSONL of `{rollout_id,
//! sequence, score, …}`, what `rollcall export sft --step-scores` reads)
//! keeps the productive prefix and masks what follows:
//!
//! - the first critical mistake is the step the judge names, else the first
//!   step whose value is below the threshold (0.5 by default);
//! - each call whose answer holds steps before it gets score 1, the call of
//!   that step and every later one 0; a trajectory with no mistake keeps
//!   every call at 1.
//!
//! Every line says which rule gave its score (`rule`).

use super::rubric::Verdict;
use super::RecipeError;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// Where the step scores go, and the value below which a step is a mistake.
#[derive(Debug, Clone)]
pub struct StepsOut {
    pub path: PathBuf,
    pub threshold: f64,
}

/// The system prompt of step scoring.
pub const SYSTEM: &str = "You are a strict, calibrated reviewer of a software engineering agent's \
trajectory, which did not solve its task. For each numbered step, estimate in hindsight its value: \
the probability that the agent, continuing well from right after that step, would still have solved \
the task. Then name the first step that was a critical mistake (a wrong turn the rest of the \
trajectory did not recover from), or null if there was none.";

/// The user message: the rendered trajectory and what to answer.
pub fn prompt(rendered: &str, steps: usize) -> String {
    format!(
        "{rendered}\nAnswer with one JSON object and nothing else: {{\"reasoning\": \"<at most three \
         short sentences>\", \"values\": [<{steps} numbers between 0 and 1, one per step, in order>], \
         \"first_critical_mistake\": <a step number from 1 to {steps}, or null>}}."
    )
}

/// Read a step-scoring answer strictly (a Markdown fence around it is taken
/// off): `values` must have one number in [0, 1] per step.
pub fn verdict(answer: &str, steps: usize) -> Result<Verdict, String> {
    let v = super::rubric::json_answer(answer)?;
    let values = v
        .get("values")
        .and_then(Value::as_array)
        .ok_or("no `values` list")?;
    if values.len() != steps {
        return Err(format!(
            "`values` has {} numbers for {steps} steps",
            values.len()
        ));
    }
    let values = values
        .iter()
        .map(|x| x.as_f64().filter(|x| (0.0..=1.0).contains(x)))
        .collect::<Option<Vec<f64>>>()
        .ok_or("a value is not a number in [0, 1]")?;
    let first_mistake = match v.get("first_critical_mistake") {
        None | Some(Value::Null) => None,
        Some(x) => Some(
            x.as_u64()
                .map(|k| k as usize)
                .filter(|k| (1..=steps).contains(k))
                .ok_or_else(|| format!("`first_critical_mistake` {x} is not a step number"))?,
        ),
    };
    let mean = values.iter().sum::<f64>() / values.len().max(1) as f64;
    Ok(Verdict {
        reasoning: v
            .get("reasoning")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned(),
        scores: Default::default(),
        j: mean,
        step_values: values,
        first_mistake,
    })
}

/// The step-scores lines of one trajectory: one per call that holds steps.
pub fn lines(
    out: &StepsOut,
    rollout_id: &str,
    step_calls: &[Option<i64>],
    v: &Verdict,
) -> Vec<Value> {
    let (mistake, rule) = match v.first_mistake {
        Some(k) => (
            Some(k - 1),
            "judge_steps: after the first critical mistake the judge named".to_owned(),
        ),
        None => match v.step_values.iter().position(|&x| x < out.threshold) {
            Some(k) => (
                Some(k),
                format!(
                    "judge_steps: from the first step valued below {}",
                    out.threshold
                ),
            ),
            None => (None, "judge_steps: no critical mistake".to_owned()),
        },
    };
    let mut out_lines: Vec<Value> = vec![];
    for (i, (call, value)) in step_calls.iter().zip(&v.step_values).enumerate() {
        let Some(seq) = call else { continue };
        let score = if mistake.is_some_and(|m| i >= m) {
            0.0
        } else {
            1.0
        };
        // Steps of one call: the call's score is its lowest.
        match out_lines.last_mut() {
            Some(l) if l["sequence"] == json!(seq) => {
                if score < l["score"].as_f64().unwrap_or(1.0) {
                    l["score"] = json!(score);
                }
            }
            _ => out_lines.push(
                json!({"rollout_id": rollout_id, "sequence": seq, "score": score,
                "step": i + 1, "value": value, "first_critical_mistake": mistake.map(|m| m + 1),
                "rule": rule}),
            ),
        }
    }
    out_lines
}

/// Write the step-scores file.
pub fn write(path: &Path, lines: &[Value]) -> Result<(), RecipeError> {
    let mut text = String::new();
    for l in lines {
        text.push_str(&l.to_string());
        text.push('\n');
    }
    std::fs::write(path, text).map_err(|e| RecipeError::Write {
        path: path.display().to_string(),
        message: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out() -> StepsOut {
        StepsOut {
            path: "x".into(),
            threshold: 0.5,
        }
    }

    #[test]
    fn the_prefix_before_the_first_critical_mistake_is_kept() {
        let v = verdict(
            r#"{"reasoning": "r", "values": [0.9, 0.8, 0.3, 0.6], "first_critical_mistake": 3}"#,
            4,
        )
        .unwrap();
        // Steps 1 and 2 in call 0, step 3 in call 1, step 4 in call 2.
        let l = lines(&out(), "r1", &[Some(0), Some(0), Some(1), Some(2)], &v);
        let scores: Vec<(i64, f64)> = l
            .iter()
            .map(|l| {
                (
                    l["sequence"].as_i64().unwrap(),
                    l["score"].as_f64().unwrap(),
                )
            })
            .collect();
        assert_eq!(scores, vec![(0, 1.0), (1, 0.0), (2, 0.0)]);
        assert!(l[0]["rule"].as_str().unwrap().contains("the judge named"));
        // Without a named mistake: the first value below the threshold.
        let v = verdict(r#"{"values": [0.9, 0.4, 0.7]}"#, 3).unwrap();
        let l = lines(&out(), "r1", &[Some(0), Some(1), Some(2)], &v);
        assert_eq!(l[1]["score"], 0.0);
        assert!(l[1]["rule"].as_str().unwrap().contains("below 0.5"));
        let v = verdict(
            r#"{"values": [0.9, 0.9], "first_critical_mistake": null}"#,
            2,
        )
        .unwrap();
        assert!(lines(&out(), "r", &[Some(0), Some(1)], &v)
            .iter()
            .all(|l| l["score"] == 1.0));
    }

    #[test]
    fn step_answers_are_read_strictly() {
        for (bad, why) in [
            ("no", "not a JSON object"),
            (r#"{"values": [0.5]}"#, "1 numbers for 2 steps"),
            (r#"{"values": [0.5, 2]}"#, "in [0, 1]"),
            (
                r#"{"values": [0.5, 0.5], "first_critical_mistake": 3}"#,
                "not a step number",
            ),
        ] {
            assert!(verdict(bad, 2).unwrap_err().contains(why), "{bad}");
        }
    }
}
