//! `parse_log_sympy`: SymPy's own runner (`bin/test --verbose`) prints
//! `test_name ok|F|E` per test and a `___ path.py:test_name ___` header over
//! each failure's traceback.

use super::{py_split, py_strip, StatusMap, TestStatus};
use regex::Regex;
use std::sync::OnceLock;

/// `parse_log_sympy`.
pub fn parse_log_sympy(log: &str) -> StatusMap {
    static HEADER: OnceLock<Regex> = OnceLock::new();
    let header =
        HEADER.get_or_init(|| Regex::new(r"(_*) (.*)\.py:(.*) (_*)").expect("valid regex"));
    let mut map = StatusMap::new();
    for c in header.captures_iter(log) {
        let group = |i: usize| c.get(i).map_or("", |m| m.as_str());
        map.insert(format!("{}.py:{}", group(2), group(3)), TestStatus::Failed);
    }
    for line in log.split('\n') {
        let line = py_strip(line);
        if !line.starts_with("test_") {
            continue;
        }
        let Some(test) = py_split(line).first().map(|t| (*t).to_owned()) else {
            continue;
        };
        if line.ends_with(" E") {
            map.insert(test.clone(), TestStatus::Error);
        }
        if line.ends_with(" F") {
            map.insert(test.clone(), TestStatus::Failed);
        }
        if line.ends_with(" ok") {
            map.insert(test, TestStatus::Passed);
        }
    }
    map
}
