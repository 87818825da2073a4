//! SWE-bench grading (swebench 4.1.0's Python harness), without Python:
//! the task instance format and task files ([`Instance`], [`load_tasks`]),
//! the shell scripts a grading container runs ([`apply_patch_script`],
//! [`eval_script`]), the repos' log parsers ([`Parser`]) and the grading of
//! a log ([`grade`]). SWE-bench's tables (test commands per repo and
//! version, parsers per repo) are generated from the package into
//! `specs.json` by `tests/python/gen_grade_specs.py`.
//!
//! Pure: it imports nothing of the crate, runs nothing, and reads only the
//! task files it is given.

mod diff;
mod instance;
mod load;
#[cfg(test)]
mod load_tests;
mod parse;
mod report;
#[cfg(test)]
mod report_tests;
mod script;
mod specs;

pub use diff::{touched_files, DiffError};
pub use instance::{
    default_image, FieldError, Instance, InstanceError, DEFAULT_TEST_CMD, DEFAULT_WORKDIR,
    SWEBENCH_CONDA_ENV,
};
pub use load::{load_tasks, tasks_from_json, LoadError};
pub use parse::{ParseCrash, Parser, StatusMap, TestStatus};
pub use report::{
    grade, logs_eval, pass_at_k, resolution_status, test_failed, test_passed, tests_report,
    universal_newlines, EvalType, Grade, GradeError, Report, Resolution, Split, APPLY_PATCH_FAIL,
    APPLY_PATCH_PASS, END_TEST_OUTPUT, RESET_FAILED, START_TEST_OUTPUT, TESTS_ERROR, TESTS_TIMEOUT,
};
pub use script::{apply_patch_script, eval_script, shell_quote, DOCKER_PATCH, GIT_APPLY_CMDS};
pub use specs::{swebench_version, Spec};
