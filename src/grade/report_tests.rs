//! grading.py's functions on the edge cases its code has: bad codes,
//! missing markers, the fallback to the whole log, skipped and absent
//! tests, empty gold lists.

use super::parse::{Parser, StatusMap, TestStatus};
use super::report::*;
use super::Instance;

fn sm(pairs: &[(&str, TestStatus)]) -> StatusMap {
    pairs
        .iter()
        .map(|(t, s)| ((*t).to_owned(), s.clone()))
        .collect()
}

fn names(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

fn instance(f2p: &[&str], p2p: &[&str]) -> Instance {
    Instance::from_json(&serde_json::json!({
        "instance_id": "pytest-dev__pytest-1",
        "repo": "pytest-dev/pytest",
        "version": "8.0",
        "base_commit": "abc",
        "test_patch": "",
        "FAIL_TO_PASS": f2p,
        "PASS_TO_PASS": p2p,
    }))
    .unwrap()
}

const START: &str = START_TEST_OUTPUT;
const END: &str = END_TEST_OUTPUT;

#[test]
fn a_bad_code_or_a_missing_marker_leaves_the_log_ungraded() {
    let body = format!("+ : '{START}'\nPASSED a.py::t\n+ : '{END}'\n");
    let p = Parser::Pytest;
    assert!(logs_eval(p, &body).unwrap().1);
    for bad in [APPLY_PATCH_FAIL, RESET_FAILED, TESTS_ERROR, TESTS_TIMEOUT] {
        assert_eq!(
            logs_eval(p, &format!("{body}{bad}\n")).unwrap(),
            (StatusMap::new(), false)
        );
    }
    let no_end = body.replace(END, "");
    let no_start = body.replace(START, "");
    for text in [no_end.as_str(), no_start.as_str(), "PASSED a.py::t\n"] {
        assert_eq!(logs_eval(p, text).unwrap(), (StatusMap::new(), false));
    }
    // APPLY_PATCH_PASS is not a bad code.
    assert!(
        logs_eval(p, &format!("{APPLY_PATCH_PASS}:\n{body}"))
            .unwrap()
            .1
    );
}

#[test]
fn the_map_comes_from_between_the_markers_else_from_the_whole_log() {
    let p = Parser::Pytest;
    let log = format!("PASSED out::before\n{START}\nPASSED in::t\n{END}\nPASSED out::after\n");
    assert_eq!(
        logs_eval(p, &log).unwrap().0,
        sm(&[("in::t", TestStatus::Passed)])
    );
    // Nothing between them: the whole log is parsed.
    let log = format!("PASSED out::before\n{START}\nno tests\n{END}\nFAILED out::after\n");
    assert_eq!(
        logs_eval(p, &log).unwrap(),
        (
            sm(&[
                ("out::before", TestStatus::Passed),
                ("out::after", TestStatus::Failed)
            ]),
            true
        )
    );
    // The text ends at a second start marker; an end marker before the
    // start marker counts for presence only.
    let log = format!("{END}\n{START}\nPASSED a::t\n{START}\nPASSED b::t\n");
    assert_eq!(
        logs_eval(p, &log).unwrap().0,
        sm(&[("a::t", TestStatus::Passed)])
    );
}

#[test]
fn passed_and_xfail_succeed_failed_error_and_absent_fail_the_rest_count_nowhere() {
    let map = sm(&[
        ("p", TestStatus::Passed),
        ("x", TestStatus::Xfail),
        ("f", TestStatus::Failed),
        ("e", TestStatus::Error),
        ("s", TestStatus::Skipped),
        ("o", TestStatus::Other("ERROR:".into())),
    ]);
    let all = names(&["p", "x", "f", "e", "s", "o", "absent"]);
    let r = tests_report(&map, &all, &all, EvalType::PassAndFail);
    assert_eq!(r.fail_to_pass.success, names(&["p", "x"]));
    assert_eq!(r.fail_to_pass.failure, names(&["f", "e", "absent"]));
    assert_eq!(r.pass_to_pass, r.fail_to_pass);
    assert_eq!(r.fail_to_fail, Split::default());
    assert_eq!(r.pass_to_fail, Split::default());
    let r = tests_report(&map, &all, &[], EvalType::FailOnly);
    assert_eq!(r.fail_to_pass.failure, names(&["f"]));
    assert_eq!(
        r.fail_to_pass.success,
        names(&["p", "x", "e", "s", "o", "absent"])
    );
}

#[test]
fn resolution_follows_the_two_ratios_with_empty_lists_counting_one() {
    let split = |s: &[&str], f: &[&str]| Split {
        success: names(s),
        failure: names(f),
    };
    let report = |f2p: Split, p2p: Split| Report {
        fail_to_pass: f2p,
        pass_to_pass: p2p,
        ..Report::default()
    };
    use Resolution::*;
    for (f2p, p2p, want) in [
        (split(&[], &[]), split(&[], &[]), Full),
        (split(&["a"], &[]), split(&[], &[]), Full),
        (split(&["a"], &[]), split(&["b"], &[]), Full),
        (split(&["a"], &["c"]), split(&["b"], &[]), Partial),
        (split(&["a"], &["c"]), split(&[], &[]), Partial),
        (split(&["a"], &["c"]), split(&["b"], &["d"]), No),
        (split(&[], &["c"]), split(&["b"], &[]), No),
        (split(&["a"], &[]), split(&[], &["d"]), No),
        (split(&[], &[]), split(&[], &["d"]), No),
    ] {
        assert_eq!(
            resolution_status(&report(f2p.clone(), p2p.clone())),
            want,
            "{f2p:?} {p2p:?}"
        );
    }
}

#[test]
fn grade_reports_like_get_eval_report() {
    let log = format!(
        "x\r\n+ : '{START}'\r\nPASSED t::a\r\nFAILED t::b - no\rSKIPPED t::c\n+ : '{END}'\n"
    );
    let g = grade(&instance(&["t::a", "t::c"], &["t::b"]), &log);
    assert!(g.patch_successfully_applied);
    assert_eq!(g.status_map.len(), 3, "{:?}", g.status_map);
    let r = g.report.clone().unwrap();
    assert_eq!(r.fail_to_pass.success, names(&["t::a"]));
    assert_eq!(r.pass_to_pass.failure, names(&["t::b"]));
    assert_eq!((g.resolution, g.resolved), (Resolution::No, false));
    let v = serde_json::to_value(&g).unwrap();
    for key in [
        "instance_id",
        "status_map",
        "patch_successfully_applied",
        "report",
        "resolution",
        "resolved",
        "error",
    ] {
        assert!(v.get(key).is_some(), "{key}");
    }
    assert_eq!(v["report"]["FAIL_TO_PASS"]["success"][0], "t::a");
    assert_eq!(v["resolution"], "RESOLVED_NO");

    // All FAIL_TO_PASS tests skipped and no PASS_TO_PASS: resolved.
    let g = grade(&instance(&["t::c"], &[]), &log);
    assert_eq!((g.resolution, g.resolved), (Resolution::Full, true));

    let timed_out = format!("{log}{TESTS_TIMEOUT}\n");
    let g = grade(&instance(&[], &[]), &timed_out);
    assert!(!g.patch_successfully_applied && !g.resolved && g.report.is_none());
    assert_eq!(g.resolution, Resolution::No);
    assert!(g.error.is_none());
}

#[test]
fn a_parser_crash_or_an_unported_parser_grades_nothing_and_says_why() {
    let mut i = instance(&[], &[]);
    i.repo = "mwaskom/seaborn".into();
    i.version = "0.12".into();
    let g = grade(&i, &format!("{START}\nFAILED\n{END}\n"));
    assert!(!g.resolved && g.report.is_none());
    let v = serde_json::to_value(&g).unwrap();
    assert!(v["error"].as_str().unwrap().contains("IndexError"), "{v}");
    i.repo = "redis/redis".into();
    let g = grade(&i, &format!("{START}\n{END}\n"));
    assert!(!g.resolved);
    assert!(g.error.unwrap().to_string().contains("c repo"));
}
