//! Grading a test log as swebench 4.1.0's `harness/grading.py` does:
//! `get_logs_eval` (is the log gradable, and the status map),
//! `get_eval_tests_report` (each gold list split into success and
//! failure), `get_resolution_status`, and `get_eval_report`'s verdict.

use super::instance::Instance;
use super::parse::{ParseCrash, Parser, StatusMap, TestStatus};
use super::specs::specs;
use serde::{Deserialize, Serialize};

/// Printed when the model patch does not apply (a bad code: the log is
/// not graded).
pub const APPLY_PATCH_FAIL: &str = ">>>>> Patch Apply Failed";
/// Printed when the model patch applied.
pub const APPLY_PATCH_PASS: &str = ">>>>> Applied Patch";
/// A bad code: resetting the repo failed.
pub const RESET_FAILED: &str = ">>>>> Reset Failed";
/// A bad code: the tests errored.
pub const TESTS_ERROR: &str = ">>>>> Tests Errored";
/// A bad code: the tests ran out of time. A runner that kills the eval
/// script should append it to the log (swebench's run_instance stops
/// before grading instead).
pub const TESTS_TIMEOUT: &str = ">>>>> Tests Timed Out";
/// Before the test command's output.
pub const START_TEST_OUTPUT: &str = ">>>>> Start Test Output";
/// After the test command's output.
pub const END_TEST_OUTPUT: &str = ">>>>> End Test Output";

/// One gold list, split by the outcome of its tests.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Split {
    pub success: Vec<String>,
    pub failure: Vec<String>,
}

/// `get_eval_tests_report`'s result (swebench's `tests_status`). The
/// "to fail" lists are always empty: get_eval_report does not ask for them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Report {
    #[serde(rename = "FAIL_TO_PASS")]
    pub fail_to_pass: Split,
    #[serde(rename = "PASS_TO_PASS")]
    pub pass_to_pass: Split,
    #[serde(rename = "FAIL_TO_FAIL")]
    pub fail_to_fail: Split,
    #[serde(rename = "PASS_TO_FAIL")]
    pub pass_to_fail: Split,
}

/// `ResolvedStatus`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Resolution {
    #[serde(rename = "RESOLVED_FULL")]
    Full,
    #[serde(rename = "RESOLVED_PARTIAL")]
    Partial,
    #[serde(rename = "RESOLVED_NO")]
    No,
}

/// `EvalType`: how a test's status counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvalType {
    /// PASSED/XFAIL succeed, FAILED/ERROR or absent fail, others neither.
    PassAndFail,
    /// Only FAILED fails (swebench's FAIL_ONLY_REPOS, JavaScript repos).
    FailOnly,
}

/// Why a log got no report although it could be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GradeError {
    /// {0}
    #[error("{0}")]
    Instance(#[from] super::instance::InstanceError),
    /// {0}
    #[error("{0}")]
    Crash(#[from] ParseCrash),
}

/// A graded log: `get_eval_report`'s verdict for the instance with its
/// `tests_status` (here `report`), the status map `get_logs_eval` read and
/// the resolution status. `report` is null where swebench writes none (a
/// bad code or a missing marker in the log: the patch counts as not
/// applied), and where the log cannot be graded (`error` says why: a
/// parser that raises in swebench, or an instance without a Python
/// parser); `resolution` is then `RESOLVED_NO`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Grade {
    pub instance_id: String,
    pub status_map: StatusMap,
    pub patch_successfully_applied: bool,
    pub report: Option<Report>,
    pub resolution: Resolution,
    pub resolved: bool,
    #[serde(serialize_with = "error_text")]
    pub error: Option<GradeError>,
}

fn error_text<S: serde::Serializer>(e: &Option<GradeError>, s: S) -> Result<S::Ok, S::Error> {
    match e {
        Some(e) => s.serialize_some(&e.to_string()),
        None => s.serialize_none(),
    }
}

/// `test_passed`: PASSED or XFAIL.
pub fn test_passed(case: &str, map: &StatusMap) -> bool {
    matches!(map.get(case), Some(TestStatus::Passed | TestStatus::Xfail))
}

/// `test_failed`: absent, FAILED or ERROR.
pub fn test_failed(case: &str, map: &StatusMap) -> bool {
    matches!(
        map.get(case),
        None | Some(TestStatus::Failed | TestStatus::Error)
    )
}

/// Python's universal newlines, as `open(log_fp)` reads the log:
/// `\r\n` and a lone `\r` become `\n`.
pub fn universal_newlines(log: &str) -> String {
    log.replace("\r\n", "\n").replace('\r', "\n")
}

/// `get_logs_eval` on a log's text (already with universal newlines): an
/// empty map and false on a bad code anywhere in the log or without both
/// markers; else the parse of the text between the first start marker and
/// the end marker after it (up to a second start marker), or of the whole
/// log when that finds no test.
pub fn logs_eval(parser: Parser, content: &str) -> Result<(StatusMap, bool), ParseCrash> {
    let bad = [APPLY_PATCH_FAIL, RESET_FAILED, TESTS_ERROR, TESTS_TIMEOUT];
    if bad.iter().any(|b| content.contains(b)) {
        return Ok((StatusMap::new(), false));
    }
    if !(content.contains(START_TEST_OUTPUT) && content.contains(END_TEST_OUTPUT)) {
        return Ok((StatusMap::new(), false));
    }
    // content.split(START)[1].split(END)[0]
    let after = content.split(START_TEST_OUTPUT).nth(1).unwrap_or_default();
    let between = after.split(END_TEST_OUTPUT).next().unwrap_or_default();
    let map = parser.parse(between)?;
    if !map.is_empty() {
        return Ok((map, true));
    }
    Ok((parser.parse(content)?, true))
}

/// `get_eval_tests_report` as get_eval_report calls it: each FAIL_TO_PASS
/// and PASS_TO_PASS test into success or failure, or neither (SKIPPED, or
/// a token that is no status, under `PassAndFail`).
pub fn tests_report(
    map: &StatusMap,
    fail_to_pass: &[String],
    pass_to_pass: &[String],
    eval_type: EvalType,
) -> Report {
    let split = |tests: &[String]| {
        let mut s = Split::default();
        for t in tests {
            match eval_type {
                EvalType::PassAndFail => {
                    if test_passed(t, map) {
                        s.success.push(t.clone());
                    } else if test_failed(t, map) {
                        s.failure.push(t.clone());
                    }
                }
                EvalType::FailOnly => {
                    if map.get(t.as_str()) == Some(&TestStatus::Failed) {
                        s.failure.push(t.clone());
                    } else {
                        s.success.push(t.clone());
                    }
                }
            }
        }
        s
    };
    Report {
        fail_to_pass: split(fail_to_pass),
        pass_to_pass: split(pass_to_pass),
        fail_to_fail: Split::default(),
        pass_to_fail: Split::default(),
    }
}

/// `compute_fail_to_pass` / `compute_pass_to_pass` as a fraction's two
/// facts: is it 1 (all counted tests succeeded, or none was counted), and
/// is it above 0.
fn ratio(s: &Split) -> (bool, bool) {
    let total = s.success.len() + s.failure.len();
    (
        total == 0 || s.failure.is_empty(),
        total == 0 || !s.success.is_empty(),
    )
}

/// `get_resolution_status`: FULL when both ratios are 1 (an empty list
/// counts 1), PARTIAL when FAIL_TO_PASS is strictly between 0 and 1 and
/// PASS_TO_PASS is 1, else NO.
pub fn resolution_status(report: &Report) -> Resolution {
    let (f2p_one, f2p_above_zero) = ratio(&report.fail_to_pass);
    let (p2p_one, _) = ratio(&report.pass_to_pass);
    if f2p_one && p2p_one {
        Resolution::Full
    } else if !f2p_one && f2p_above_zero && p2p_one {
        Resolution::Partial
    } else {
        Resolution::No
    }
}

/// Grade a test log (the eval script's output, as one text; `\r\n` and
/// `\r` are read as line ends, as swebench reads the log file) for an
/// instance, as swebench's get_eval_report does for a prediction with a
/// patch.
pub fn grade(instance: &Instance, log: &str) -> Grade {
    let ungraded = |applied: bool, map: StatusMap, error: Option<GradeError>| Grade {
        instance_id: instance.instance_id.clone(),
        status_map: map,
        patch_successfully_applied: applied,
        report: None,
        resolution: Resolution::No,
        resolved: false,
        error,
    };
    let parser = match instance.log_parser() {
        Ok(p) => p,
        Err(e) => return ungraded(false, StatusMap::new(), Some(e.into())),
    };
    let content = universal_newlines(log);
    let (map, applied) = match logs_eval(parser, &content) {
        Ok(r) => r,
        Err(e) => return ungraded(false, StatusMap::new(), Some(e.into())),
    };
    if !applied {
        return ungraded(false, map, None);
    }
    let eval_type = if specs().fail_only_repos.contains(&instance.repo) {
        EvalType::FailOnly
    } else {
        EvalType::PassAndFail
    };
    let report = tests_report(
        &map,
        &instance.fail_to_pass,
        &instance.pass_to_pass,
        eval_type,
    );
    let resolution = resolution_status(&report);
    Grade {
        instance_id: instance.instance_id.clone(),
        status_map: map,
        patch_successfully_applied: true,
        report: Some(report),
        resolution,
        resolved: resolution == Resolution::Full,
        error: None,
    }
}

/// The unbiased pass@k estimate from `n` graded samples with `c` right
/// (Chen et al. 2021): 1 - C(n-c, k) / C(n, k), with k capped at n.
pub fn pass_at_k(n: usize, c: usize, k: usize) -> f64 {
    let k = k.min(n);
    if n == 0 || k == 0 {
        return 0.0;
    }
    if n - c < k {
        return 1.0;
    }
    let mut miss = 1.0;
    for i in (n - c + 1)..=n {
        miss *= 1.0 - k as f64 / i as f64;
    }
    1.0 - miss
}
