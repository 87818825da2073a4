//! Each parser on lines that exercise its edge cases; the expected maps are
//! what swebench 4.1.0's functions return for the same text
//! (tests/python/test_grade.py compares them on real runs).

use super::*;

fn map(pairs: &[(&str, &str)]) -> StatusMap {
    pairs
        .iter()
        .map(|(t, s)| ((*t).to_owned(), TestStatus::from_token(s)))
        .collect()
}

#[test]
fn pytest_reads_the_short_summary_words_as_swebench_does() {
    let log = "PASSED a.py::t1\nFAILED a.py::t2 - AssertionError: x - y\nERROR: not found: /x.py::nope\nSKIPPED [1] a.py:3: why\nXFAIL a.py::t3 - reason\nXPASS a.py::t4\nPASSED\nPASSEDa.py::t5 extra\n  PASSED a.py::indented\nFAILED a.py::t1\nPASSED a.py::t6\r\nPASSED\u{1f}a.py::sep";
    assert_eq!(
        Parser::Pytest.parse(log).unwrap(),
        map(&[
            ("[1]", "SKIPPED"),
            ("a.py::sep", "PASSED"),
            ("a.py::t1", "FAILED"),
            ("a.py::t2", "FAILED"),
            ("a.py::t3", "XFAIL"),
            ("a.py::t6", "PASSED"),
            ("extra", "PASSEDa.py::t5"),
            ("not", "ERROR:"),
        ])
    );
    assert_eq!(
        Parser::Pytest.parse("PASSEDa.py::t5 extra").unwrap()["extra"],
        TestStatus::Other("PASSEDa.py::t5".into())
    );
}

#[test]
fn pytest_options_shortens_absolute_path_options_and_drops_what_follows() {
    let log = "PASSED a.py::t[/tmp/x/y.txt]\nPASSED a.py::t[//net/share]\nPASSED a.py::t[/a/*/b]\nFAILED a.py::t[x[1]]tail - boom\nPASSED a.py::plain\nPASSED a.py::t[unclosed\nPASSED a.py::t[a]b[c]";
    assert_eq!(
        Parser::PytestOptions.parse(log).unwrap(),
        map(&[
            ("a.py::plain", "PASSED"),
            ("a.py::t[//net/share]", "PASSED"),
            ("a.py::t[/a/*/b]", "PASSED"),
            ("a.py::t[/y.txt]", "PASSED"),
            ("a.py::t[a]b[c]", "PASSED"),
            ("a.py::t[unclosed", "PASSED"),
            ("a.py::t[x[1]]", "FAILED"),
        ])
    );
}

#[test]
fn pytest_v2_strips_colours_and_control_characters_and_reads_trailing_statuses() {
    let log = "\u{1b}[32mPASSED\u{1b}[0m a.py::t1\na.py::t2 PASSED\na.py::t3 FAILED\nsome words here ERROR\nPASSED\ta.py::t4\nFAILED a.py::t5 - x\nlonely PASSED\nXFAIL\n[1m[31mFAILED[0m a.py::t6";
    assert_eq!(
        Parser::PytestV2.parse(log).unwrap(),
        map(&[
            ("a.py::t1", "PASSED"),
            ("a.py::t2", "PASSED"),
            ("a.py::t3", "FAILED"),
            ("a.py::t5", "FAILED"),
            ("a.py::t6", "FAILED"),
            ("lonely", "PASSED"),
            ("some", "words"),
        ])
    );
}

#[test]
fn matplotlib_writes_mouse_buttons_as_numbers() {
    let log =
        "PASSED lib/t.py::test_x[MouseButton.LEFT]\nFAILED lib/t.py::test_x[MouseButton.RIGHT] - e";
    assert_eq!(
        Parser::Matplotlib.parse(log).unwrap(),
        map(&[
            ("lib/t.py::test_x[1]", "PASSED"),
            ("lib/t.py::test_x[3]", "FAILED")
        ])
    );
    // The plain pytest parser keeps the names.
    assert!(Parser::Pytest
        .parse(log)
        .unwrap()
        .contains_key("lib/t.py::test_x[MouseButton.LEFT]"));
}

#[test]
fn seaborn_reads_verbose_and_summary_lines_and_crashes_where_swebench_does() {
    let log =
        "FAILED t.py::a - x\nt.py::b PASSED [50%]\nPASSED t.py::c\nx PASSED y\nPASSED t.py::d";
    assert_eq!(
        Parser::Seaborn.parse(log).unwrap(),
        map(&[
            ("t.py::a", "FAILED"),
            ("t.py::b", "PASSED"),
            ("t.py::c", "PASSED"),
            ("t.py::d", "PASSED"),
            ("x", "PASSED"),
        ])
    );
    for bad in ["FAILED", " PASSED ", "PASSED", "ok\nFAILED\nPASSED t.py::c"] {
        assert!(
            matches!(
                Parser::Seaborn.parse(bad),
                Err(ParseCrash::IndexError {
                    parser: "parse_log_seaborn",
                    ..
                })
            ),
            "{bad:?}"
        );
    }
}

#[test]
fn sympy_reads_verbose_lines_and_failure_headers() {
    let log = "test_a ok\ntest_b F\ntest_c E\n  test_d ok  \ntest_e f\nnot_test ok\n____ sympy/core/tests/test_x.py:test_b ____\n___ sympy/a.py:test_c ___\nx sympy/b.py:y z\n";
    assert_eq!(
        Parser::Sympy.parse(log).unwrap(),
        map(&[
            ("sympy/a.py:test_c", "FAILED"),
            ("sympy/b.py:y", "FAILED"),
            ("sympy/core/tests/test_x.py:test_b", "FAILED"),
            ("test_a", "PASSED"),
            ("test_b", "FAILED"),
            ("test_c", "ERROR"),
            ("test_d", "PASSED"),
        ])
    );
}

#[test]
fn django_reads_every_shape_swebench_knows() {
    let log = "test_a (m.T.test_a) ... ok\ntest_b (m.T.test_b) ... FAIL\ntest_c (m.T.test_c) ... ERROR\ntest_d (m.T.test_d) ... skipped 'x'\ntest_e (m.T.test_e) ... some output\nok\ntest_f (m.T) ... OK\ntest_g (m.T) ...  OK\nFAIL: test_h (m.T.test_h)\nERROR: setUpClass (m.B)\n--version is equivalent to version\nApplying sites.0002_alter_domain_unique...test_no_migrations (m.T) ... ok\nok_test ... FAIL\ntest_i (m.T) ... Internal Server Error: /boom/\nok\ntest_j (m.T) ... Testing against Django installed in '/x'\nSystem check identified no issues (0 silenced).\nok\ntest_k (m.T) ... System check identified no issues (0 silenced)\nok\n   test_l (m.T) ... ok   ";
    assert_eq!(
        Parser::Django.parse(log).unwrap(),
        map(&[
            ("--version is equivalent to version", "PASSED"),
            ("ok_test", "PASSED"),
            ("setUpClass", "ERROR"),
            ("test_a (m.T.test_a)", "PASSED"),
            ("test_b (m.T.test_b)", "FAILED"),
            ("test_c (m.T.test_c)", "ERROR"),
            ("test_d (m.T.test_d)", "SKIPPED"),
            ("test_e (m.T.test_e)", "PASSED"),
            ("test_f (m.T)", "PASSED"),
            ("test_g (m.T)", "PASSED"),
            ("test_h", "FAILED"),
            ("test_i (m.T)", "PASSED"),
            ("test_j (m.T)", "PASSED"),
            ("test_k (m.T)", "PASSED"),
            ("test_l (m.T)", "PASSED"),
            ("test_no_migrations (m.T)", "PASSED"),
        ])
    );
    for bad in ["FAIL:", "ERROR:x", "  FAIL:  "] {
        assert!(Parser::Django.parse(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn python_whitespace_includes_the_information_separators() {
    assert_eq!(py_split(" a\u{1c}b\u{a0}c\td "), ["a", "b", "c", "d"]);
    assert_eq!(py_strip("\u{1f} x \u{3000}"), "x");
    assert_eq!(py_split(""), Vec::<&str>::new());
}

#[test]
fn parser_names_resolve_aliases_and_refuse_other_languages() {
    assert_eq!(Parser::from_name("parse_log_astroid"), Some(Parser::Pytest));
    assert_eq!(
        Parser::from_name("parse_log_requests"),
        Some(Parser::PytestOptions)
    );
    assert_eq!(
        Parser::from_name("parse_log_sphinx"),
        Some(Parser::PytestV2)
    );
    assert_eq!(Parser::from_name("parse_log_gotest"), None);
    assert_eq!(Parser::from_name("pytest"), None);
    assert_eq!(
        serde_json::to_value(TestStatus::Other("ERROR:".into())).unwrap(),
        serde_json::json!("ERROR:")
    );
}
