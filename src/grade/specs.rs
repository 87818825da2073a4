//! SWE-bench's tables, as `specs.json` holds them: generated from the
//! swebench package by `tests/python/gen_grade_specs.py` (which
//! `tests/python/test_grade.py` reruns to check the committed file), and
//! embedded in the binary.

use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;

/// What make_eval_script_list_py reads of one `MAP_REPO_VERSION_TO_SPECS`
/// entry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    /// The test command, before the test directives are appended (absent
    /// for `dbt-labs/dbt-core`, whose specs have none).
    pub test_cmd: Option<String>,
    /// Commands run after the first `cd` (locale exports for old Django).
    #[serde(default)]
    pub eval_commands: Vec<String>,
    /// The install command, which the eval script runs again.
    pub install: Option<String>,
}

/// The whole file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Specs {
    /// The swebench version the file was generated from.
    pub swebench: String,
    /// Repos graded with `EvalType.FAIL_ONLY`.
    pub fail_only_repos: BTreeSet<String>,
    /// Suffixes of files that are not test directives (`NON_TEST_EXTS`).
    pub non_test_exts: Vec<String>,
    /// Every `parse_log_*` name of swebench's Python log parsers → the
    /// function it is (`parse_log_astroid` → `parse_log_pytest`).
    pub parser_names: BTreeMap<String, String>,
    /// `MAP_REPO_TO_EXT`: each known repo's language (`py`, `js`, …).
    pub repo_language: BTreeMap<String, String>,
    /// `MAP_REPO_TO_PARSER`: each repo's log parser, by function name.
    pub repo_parser: BTreeMap<String, String>,
    /// Python repos → version → spec.
    pub specs: BTreeMap<String, BTreeMap<String, Spec>>,
}

const SPECS_JSON: &str = include_str!("specs.json");

/// The embedded tables (parsed once; the file is generated and checked by
/// the tests, so a parse failure is a build defect, not an input error).
pub fn specs() -> &'static Specs {
    static SPECS: OnceLock<Specs> = OnceLock::new();
    SPECS.get_or_init(|| {
        serde_json::from_str(SPECS_JSON).expect("src/grade/specs.json is generated and valid")
    })
}

/// The swebench version the tables come from.
pub fn swebench_version() -> &'static str {
    &specs().swebench
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grade::Parser;

    #[test]
    fn the_embedded_tables_parse_and_name_only_ported_python_parsers() {
        let s = specs();
        assert_eq!(s.swebench, "4.1.0");
        for (name, function) in &s.parser_names {
            assert!(
                Parser::from_name(name).is_some(),
                "{name} ({function}) has no port"
            );
            assert_eq!(Parser::from_name(name), Parser::from_name(function));
        }
        for (repo, parser) in &s.repo_parser {
            let python = s.repo_language.get(repo).map(String::as_str) == Some("py");
            assert_eq!(
                Parser::from_name(parser).is_some(),
                python,
                "{repo}: {parser}"
            );
        }
        assert_eq!(
            s.specs["django/django"]["1.9"].test_cmd.as_deref(),
            Some("./tests/runtests.py --verbosity 2")
        );
        assert!(s.specs["dbt-labs/dbt-core"]["1.7"].test_cmd.is_none());
        assert!(s.non_test_exts.iter().any(|e| e == "csv"));
    }
}
