//! The pytest-family parsers: `parse_log_pytest`, `parse_log_pytest_options`,
//! `parse_log_pytest_v2`, `parse_log_matplotlib` and `parse_log_seaborn`.
//! They read pytest's `-rA` short summary (`PASSED path::test`, `FAILED
//! path::test - message`); v2 also reads `-vv` lines that end in a status.

use super::{ends_with_status, py_split, starts_with_status, ParseCrash, StatusMap, TestStatus};
use regex::Regex;
use std::sync::OnceLock;

/// A summary line's first two words, as `parse_log_pytest` reads them:
/// for a line starting with a status (a `FAILED` line with `" - "` turned
/// into `" "` first), word 1 is the test and word 0 its status. None when
/// the line does not start with a status or has fewer than two words.
fn summary_words(line: &str) -> Option<(String, String)> {
    if !starts_with_status(line) {
        return None;
    }
    let line = if line.starts_with("FAILED") {
        line.replace(" - ", " ")
    } else {
        line.to_owned()
    };
    match py_split(&line)[..] {
        [status, test, ..] => Some((status.to_owned(), test.to_owned())),
        _ => None,
    }
}

/// `parse_log_pytest`.
pub fn parse_log_pytest(log: &str) -> StatusMap {
    let mut map = StatusMap::new();
    for line in log.split('\n') {
        if let Some((status, test)) = summary_words(line) {
            map.insert(test, TestStatus::from_token(&status));
        }
    }
    map
}

/// `parse_log_matplotlib`: `parse_log_pytest` after writing
/// `MouseButton.LEFT` as `1` and `MouseButton.RIGHT` as `3`.
pub fn parse_log_matplotlib(log: &str) -> StatusMap {
    let mut map = StatusMap::new();
    for line in log.split('\n') {
        let line = line
            .replace("MouseButton.LEFT", "1")
            .replace("MouseButton.RIGHT", "3");
        if let Some((status, test)) = summary_words(&line) {
            map.insert(test, TestStatus::from_token(&status));
        }
    }
    map
}

/// `parse_log_pytest_options`: a parametrized test's option that is an
/// absolute path (`/…`, not `//…`, no `*`) keeps only its last component,
/// and anything after the option's last `]` is dropped.
pub fn parse_log_pytest_options(log: &str) -> StatusMap {
    static OPTION: OnceLock<Regex> = OnceLock::new();
    let option = OPTION.get_or_init(|| Regex::new(r"(.*?)\[(.*)\]").expect("valid regex"));
    let mut map = StatusMap::new();
    for line in log.split('\n') {
        let Some((status, test)) = summary_words(line) else {
            continue;
        };
        let name = match option.captures(&test) {
            Some(c) => {
                let main = c.get(1).map_or("", |m| m.as_str());
                let mut opt = c.get(2).map_or("", |m| m.as_str()).to_owned();
                if opt.starts_with('/') && !opt.starts_with("//") && !opt.contains('*') {
                    let last = opt.rsplit('/').next().unwrap_or("").to_owned();
                    opt = format!("/{last}");
                }
                format!("{main}[{opt}]")
            }
            None => test,
        };
        map.insert(name, TestStatus::from_token(&status));
    }
    map
}

/// `parse_log_pytest_v2`: ANSI colour codes (`[<digits>m`) and the
/// control characters U+0001..U+001F are removed first; a line that does
/// not start with a status but ends with one maps its word 0 to its word 1.
pub fn parse_log_pytest_v2(log: &str) -> StatusMap {
    static COLOUR: OnceLock<Regex> = OnceLock::new();
    let colour = COLOUR.get_or_init(|| Regex::new(r"\[(\d+)m").expect("valid regex"));
    let mut map = StatusMap::new();
    for line in log.split('\n') {
        let line: String = colour
            .replace_all(line, "")
            .chars()
            .filter(|c| !('\u{1}'..='\u{1f}').contains(c))
            .collect();
        if starts_with_status(&line) {
            if let Some((status, test)) = summary_words(&line) {
                map.insert(test, TestStatus::from_token(&status));
            }
        } else if ends_with_status(&line) {
            if let [test, status, ..] = py_split(&line)[..] {
                map.insert(test.to_owned(), TestStatus::from_token(status));
            }
        }
    }
    map
}

/// `parse_log_seaborn`: `FAILED` lines, lines with ` PASSED ` as word 1,
/// and lines starting with `PASSED`. Raises (in swebench) on a line that is
/// `FAILED` or `PASSED` alone, or has ` PASSED ` and a single word.
pub fn parse_log_seaborn(log: &str) -> Result<StatusMap, ParseCrash> {
    let crash = |line: &str| ParseCrash::IndexError {
        parser: "parse_log_seaborn",
        line: line.to_owned(),
    };
    let mut map = StatusMap::new();
    for line in log.split('\n') {
        if line.starts_with("FAILED") {
            let words = py_split(line);
            let test = words.get(1).ok_or_else(|| crash(line))?;
            map.insert((*test).to_owned(), TestStatus::Failed);
        } else if line.contains(" PASSED ") {
            match py_split(line)[..] {
                [test, "PASSED", ..] => {
                    map.insert(test.to_owned(), TestStatus::Passed);
                }
                [_, _, ..] => {}
                _ => return Err(crash(line)),
            }
        } else if line.starts_with("PASSED") {
            let words = py_split(line);
            let test = words.get(1).ok_or_else(|| crash(line))?;
            map.insert((*test).to_owned(), TestStatus::Passed);
        }
    }
    Ok(map)
}
