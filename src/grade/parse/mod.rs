//! SWE-bench 4.1.0's Python log parsers (`swebench/harness/log_parsers/
//! python.py`), ported line for line: each turns the test output of one
//! repo's test runner into a map from test name to status.
//!
//! Python's string operations are reproduced where they differ from Rust's:
//! `str.split()` and `str.strip()` treat U+001C..U+001F as whitespace too
//! ([`py_split`], [`py_strip`]), and regexes use the same leftmost-first
//! semantics (the `regex` crate's) with `\s` widened the same way.

mod django;
mod pytest;
mod sympy;
#[cfg(test)]
mod tests;

use serde::{Serialize, Serializer};
use std::collections::BTreeMap;

/// A test's status in a status map. SWE-bench's `TestStatus` has the five
/// named values; its parsers store whatever token the log has where the
/// status stands (`ERROR:` from pytest's `ERROR: not found: …` line, a
/// second word of a line ending in a status), and grading treats such a
/// token as neither passed nor failed: [`TestStatus::Other`] keeps it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TestStatus {
    Passed,
    Failed,
    Skipped,
    Error,
    Xfail,
    /// A token that is none of the five (kept verbatim).
    Other(String),
}

impl TestStatus {
    /// The status a token names (`"PASSED"` → `Passed`), else `Other`.
    pub fn from_token(token: &str) -> TestStatus {
        match token {
            "PASSED" => TestStatus::Passed,
            "FAILED" => TestStatus::Failed,
            "SKIPPED" => TestStatus::Skipped,
            "ERROR" => TestStatus::Error,
            "XFAIL" => TestStatus::Xfail,
            other => TestStatus::Other(other.to_owned()),
        }
    }

    /// The string SWE-bench stores.
    pub fn as_str(&self) -> &str {
        match self {
            TestStatus::Passed => "PASSED",
            TestStatus::Failed => "FAILED",
            TestStatus::Skipped => "SKIPPED",
            TestStatus::Error => "ERROR",
            TestStatus::Xfail => "XFAIL",
            TestStatus::Other(s) => s,
        }
    }
}

impl Serialize for TestStatus {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// Test name → status, as a parser leaves it (a later line for the same
/// test overwrites an earlier one, as in the Python dict).
pub type StatusMap = BTreeMap<String, TestStatus>;

/// Where swebench's parser raises on the log (an `IndexError` from
/// `line.split()[1]`), so that swebench grades nothing for it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseCrash {
    /// {parser} raises IndexError on the log line {line:?} (swebench grades nothing then)
    #[error("{parser} raises IndexError on the log line {line:?} (swebench grades nothing then)")]
    IndexError { parser: &'static str, line: String },
}

/// One of swebench's Python log parsers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Parser {
    /// `parse_log_pytest` (also astroid, flask, marshmallow, pvlib,
    /// pyvista, sqlfluff, xarray, pytest).
    Pytest,
    /// `parse_log_pytest_options` (pydicom, requests, pylint).
    PytestOptions,
    /// `parse_log_django`.
    Django,
    /// `parse_log_pytest_v2` (astropy, scikit-learn, sphinx).
    PytestV2,
    /// `parse_log_seaborn`.
    Seaborn,
    /// `parse_log_sympy`.
    Sympy,
    /// `parse_log_matplotlib`.
    Matplotlib,
}

impl Parser {
    /// The parser's function name in swebench.
    pub fn name(self) -> &'static str {
        match self {
            Parser::Pytest => "parse_log_pytest",
            Parser::PytestOptions => "parse_log_pytest_options",
            Parser::Django => "parse_log_django",
            Parser::PytestV2 => "parse_log_pytest_v2",
            Parser::Seaborn => "parse_log_seaborn",
            Parser::Sympy => "parse_log_sympy",
            Parser::Matplotlib => "parse_log_matplotlib",
        }
    }

    /// The parser a name denotes: a function name, or one of the aliases
    /// log_parsers/python.py defines (`parse_log_astroid`, …). None for any
    /// other name (other languages' parsers are not ported).
    pub fn from_name(name: &str) -> Option<Parser> {
        let function = super::specs::specs()
            .parser_names
            .get(name)
            .map_or(name, String::as_str);
        [
            Parser::Pytest,
            Parser::PytestOptions,
            Parser::Django,
            Parser::PytestV2,
            Parser::Seaborn,
            Parser::Sympy,
            Parser::Matplotlib,
        ]
        .into_iter()
        .find(|p| p.name() == function)
    }

    /// Parse a log (already with `\n` line ends; see [`super::grade`]).
    pub fn parse(self, log: &str) -> Result<StatusMap, ParseCrash> {
        match self {
            Parser::Pytest => Ok(pytest::parse_log_pytest(log)),
            Parser::PytestOptions => Ok(pytest::parse_log_pytest_options(log)),
            Parser::Django => django::parse_log_django(log),
            Parser::PytestV2 => Ok(pytest::parse_log_pytest_v2(log)),
            Parser::Seaborn => pytest::parse_log_seaborn(log),
            Parser::Sympy => Ok(sympy::parse_log_sympy(log)),
            Parser::Matplotlib => Ok(pytest::parse_log_matplotlib(log)),
        }
    }
}

/// The five values of swebench's `TestStatus`, in its order.
const STATUSES: [&str; 5] = ["FAILED", "PASSED", "SKIPPED", "ERROR", "XFAIL"];

/// `any(line.startswith(x.value) for x in TestStatus)`.
fn starts_with_status(line: &str) -> bool {
    STATUSES.iter().any(|s| line.starts_with(s))
}

/// `any(line.endswith(x.value) for x in TestStatus)`.
fn ends_with_status(line: &str) -> bool {
    STATUSES.iter().any(|s| line.ends_with(s))
}

/// Whitespace as Python's `str.isspace()` has it: Unicode White_Space plus
/// the separators U+001C..U+001F.
pub(crate) fn py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's `s.split()`: runs of whitespace separate, none at the ends.
pub(crate) fn py_split(s: &str) -> Vec<&str> {
    s.split(py_space).filter(|w| !w.is_empty()).collect()
}

/// Python's `s.strip()`.
pub(crate) fn py_strip(s: &str) -> &str {
    s.trim_matches(py_space)
}

/// The character class Python's `\s` is, for patterns ported from swebench.
pub(crate) const PY_S: &str = r"[\s\x1C-\x1F]";
