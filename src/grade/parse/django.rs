//! `parse_log_django`: Django's test runner at `--verbosity 2` prints
//! `test_name (module.Class[.test_name]) ... ok|FAIL|ERROR|skipped '…'`,
//! then `FAIL: …` / `ERROR: …` headers for the tracebacks.

use super::{py_split, py_strip, ParseCrash, StatusMap, TestStatus, PY_S};
use regex::Regex;
use std::sync::OnceLock;

/// The three multi-line shapes swebench matches over the whole log, where
/// a line printed during a test splits `… ... ` from its `ok`.
fn interrupted_passes() -> &'static [Regex; 3] {
    static RES: OnceLock<[Regex; 3]> = OnceLock::new();
    RES.get_or_init(|| {
        let s = PY_S;
        [
            format!(r"(?m)^(.*?){s}\.\.\.{s}Testing against Django installed in ((?s:.*?)) silenced\)\.\nok$"),
            format!(r"(?m)^(.*?){s}\.\.\.{s}Internal Server Error: /(.*)/\nok$"),
            format!(r"(?m)^(.*?){s}\.\.\.{s}System check identified no issues \(0 silenced\)\nok$"),
        ]
        .map(|p| Regex::new(&p).expect("valid regex"))
    })
}

/// `line.split(sep)[0]`: the text before the first `sep`.
fn before_first<'a>(line: &'a str, sep: &str) -> &'a str {
    line.find(sep).map_or(line, |i| &line[..i])
}

/// `line.rsplit(sep, 1)[0]`: the text before the last `sep`.
fn before_last<'a>(line: &'a str, sep: &str) -> &'a str {
    line.rfind(sep).map_or(line, |i| &line[..i])
}

/// `parse_log_django`.
pub fn parse_log_django(log: &str) -> Result<StatusMap, ParseCrash> {
    let mut map = StatusMap::new();
    let mut prev_test: Option<String> = None;
    let second_word = |line: &str| -> Result<String, ParseCrash> {
        match py_split(line)[..] {
            [_, word, ..] => Ok(py_strip(word).to_owned()),
            _ => Err(ParseCrash::IndexError {
                parser: "parse_log_django",
                line: line.to_owned(),
            }),
        }
    };
    for raw in log.split('\n') {
        let mut line = py_strip(raw).to_owned();

        if line.contains("--version is equivalent to version") {
            map.insert(
                "--version is equivalent to version".to_owned(),
                TestStatus::Passed,
            );
        }
        if line.contains(" ... ") {
            prev_test = Some(before_first(&line, " ... ").to_owned());
        }
        for suffix in [" ... ok", " ... OK", " ...  OK"] {
            if line.ends_with(suffix) {
                // swebench's special case for django__django-7188, where a
                // migration's output shares the test's line.
                if py_strip(&line)
                    .starts_with("Applying sites.0002_alter_domain_unique...test_no_migrations")
                {
                    let rest = line.split_once("...").map_or(line.as_str(), |(_, r)| r);
                    line = py_strip(rest).to_owned();
                }
                map.insert(before_last(&line, suffix).to_owned(), TestStatus::Passed);
                break;
            }
        }
        if line.contains(" ... skipped") {
            map.insert(
                before_first(&line, " ... skipped").to_owned(),
                TestStatus::Skipped,
            );
        }
        if line.ends_with(" ... FAIL") {
            map.insert(
                before_first(&line, " ... FAIL").to_owned(),
                TestStatus::Failed,
            );
        }
        if line.starts_with("FAIL:") {
            map.insert(second_word(&line)?, TestStatus::Failed);
        }
        if line.ends_with(" ... ERROR") {
            map.insert(
                before_first(&line, " ... ERROR").to_owned(),
                TestStatus::Error,
            );
        }
        if line.starts_with("ERROR:") {
            map.insert(second_word(&line)?, TestStatus::Error);
        }
        if line.trim_start_matches(super::py_space).starts_with("ok") {
            if let Some(prev) = &prev_test {
                map.insert(prev.clone(), TestStatus::Passed);
            }
        }
    }
    for re in interrupted_passes() {
        for c in re.captures_iter(log) {
            if let Some(name) = c.get(1) {
                map.insert(name.as_str().to_owned(), TestStatus::Passed);
            }
        }
    }
    Ok(map)
}
