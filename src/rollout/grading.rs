//! Grading one model patch in its own fresh container, as SWE-bench's
//! harness does: the patch and the eval script go in, the script applies
//! the patch (SWE-bench's `git apply` / `patch` fallbacks and markers), then
//! applies the test patch and runs the tests between the markers; the log
//! comes out and [`crate::grade`] reads it.

use super::backend::{Backend, BackendError, Exec, FileIn};
use super::RolloutError;
use crate::grade::{self, Instance};
use serde_json::Value;
use std::time::Duration;

/// Where the patch goes in the grading container (SWE-bench's path).
const PATCH: &str = grade::DOCKER_PATCH;
/// Where the two scripts go.
const APPLY: &str = "/tmp/rollcall/apply.sh";
const EVAL: &str = "/tmp/rollcall/eval.sh";
/// Most log bytes kept.
const MAX_LOG: usize = 32 << 20;

/// The grade of one rollout.
#[derive(Debug, Clone)]
pub struct Graded {
    pub resolved: bool,
    pub resolution: Value,
    /// `rollcall grade`'s JSON.
    pub report: Value,
}

/// `s` as one shell word.
pub fn quote(s: &str) -> String {
    grade::shell_quote(s)
}

/// Run the grading in container `id`; returns the log: the patch's
/// application, then (when it applied) the eval script's output. A run
/// past `timeout` gives a log carrying SWE-bench's timeout marker.
pub async fn run<B: Backend>(
    backend: &B,
    id: &str,
    task: &Instance,
    patch: &str,
    timeout: Duration,
) -> Result<String, RolloutError> {
    let eval = grade::eval_script(task, task.conda_env())?;
    let file = |path: &str, content: Vec<u8>, mode| FileIn {
        path: path.into(),
        content,
        mode,
    };
    backend
        .put_files(
            id,
            &[
                file(PATCH, patch.as_bytes().to_vec(), 0o644),
                file(
                    APPLY,
                    grade::apply_patch_script(task, PATCH).into_bytes(),
                    0o755,
                ),
                file(EVAL, eval.into_bytes(), 0o755),
            ],
        )
        .await?;
    let exec = |script: &str| Exec {
        argv: vec!["bash".into(), script.into()],
        workdir: Some(task.workdir().to_owned()),
        timeout: Some(timeout),
        max_output: MAX_LOG,
        ..Exec::default()
    };
    let timed_out = |log: &str| {
        format!(
            "{log}{}: the grading ran past {} s\n",
            grade::TESTS_TIMEOUT,
            timeout.as_secs()
        )
    };
    let mut log = match backend.exec(id, exec(APPLY)).await {
        Ok(out) if out.exit_code == Some(0) => out.text(),
        // Not applied: the log says so, and nothing is run.
        Ok(out) => return Ok(out.text()),
        Err(BackendError::Timeout(..)) => return Ok(timed_out("")),
        Err(e) => return Err(e.into()),
    };
    match backend.exec(id, exec(EVAL)).await {
        Ok(out) => log.push_str(&out.text()),
        Err(BackendError::Timeout(..)) => log = timed_out(&log),
        Err(e) => return Err(e.into()),
    }
    Ok(log)
}

/// Grade a log.
pub fn grade(task: &Instance, log: &str) -> Graded {
    let g = grade::grade(task, log);
    Graded {
        resolved: g.resolved,
        resolution: serde_json::to_value(g.resolution).unwrap_or(Value::Null),
        report: serde_json::to_value(&g).unwrap_or(Value::Null),
    }
}
