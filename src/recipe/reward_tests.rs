//! The reward modes on constructed trajectories and grading reports,
//! every gate condition of `process_shaped` included.

use super::*;

const PATCH: &str = "diff --git a/pkg/core.py b/pkg/core.py
--- a/pkg/core.py
+++ b/pkg/core.py
@@ -1,2 +1,2 @@
 def f():
-    return 1
+    return 2
";

const GOLD: &str = "diff --git a/pkg/core.py b/pkg/core.py
--- a/pkg/core.py
+++ b/pkg/core.py
@@ -1,2 +1,2 @@
 def f():
-    return 1
+    return 2
diff --git a/pkg/util.py b/pkg/util.py
--- a/pkg/util.py
+++ b/pkg/util.py
@@ -1 +1 @@
-x = 1
+x = 2
";

fn split(success: &[&str], failure: &[&str]) -> Split {
    Split {
        success: success.iter().map(|s| s.to_string()).collect(),
        failure: failure.iter().map(|s| s.to_string()).collect(),
    }
}

fn report(f2p: Split, p2p: Split) -> Report {
    Report {
        fail_to_pass: f2p,
        pass_to_pass: p2p,
        ..Report::default()
    }
}

fn step(command: &str, observation: &str, rc: Option<i64>) -> Step {
    Step {
        turn: 0,
        reasoning: String::new(),
        command: command.into(),
        observation: observation.into(),
        returncode: rc,
    }
}

fn evidence<'a>(patch: &'a str, tests: Option<&'a Report>, steps: &'a [Step]) -> Evidence<'a> {
    Evidence {
        resolved: false,
        submitted: true,
        patch,
        applied: true,
        tests,
        gold_patch: Some(GOLD),
        steps,
    }
}

#[test]
fn simple_modes() {
    let r = report(split(&["t::test_a"], &[]), split(&["t::test_b"], &[]));
    let ok = Evidence {
        resolved: true,
        ..evidence(PATCH, Some(&r), &[])
    };
    assert_eq!(reward(Mode::Simple, &ok).reward, 1.0);
    assert_eq!(reward(Mode::Zero, &ok).reward, 1.0);
    assert_eq!(reward(Mode::SimpleTruncated, &ok).reward, 1.0);
    let unresolved = evidence(PATCH, Some(&r), &[]);
    assert_eq!(reward(Mode::Simple, &unresolved).reward, -1.0);
    assert_eq!(reward(Mode::Zero, &unresolved).reward, 0.0);
    // An empty or unapplied patch is never resolved.
    for bad in [
        Evidence {
            patch: "  \n",
            ..ok
        },
        Evidence {
            applied: false,
            ..ok
        },
    ] {
        let s = reward(Mode::Simple, &bad);
        assert_eq!((s.reward, s.terms["patch_valid"]), (-1.0, 0.0));
        assert_eq!(reward(Mode::PassRate, &bad).reward, 0.0);
    }
    // Not submitted: -2 under simple_truncated, whatever the grade.
    let cut = Evidence {
        submitted: false,
        ..ok
    };
    assert_eq!(reward(Mode::SimpleTruncated, &cut).reward, -2.0);
    assert_eq!(reward(Mode::SimpleTruncated, &cut).terms["submitted"], 0.0);
    assert_eq!(reward(Mode::Simple, &cut).reward, 1.0);
}

#[test]
fn pass_rate_weighs_the_gold_lists() {
    let r = report(
        split(&["t::a"], &["t::b"]),
        split(&["t::c", "t::d", "t::e"], &["t::f"]),
    );
    let s = reward(Mode::PassRate, &evidence(PATCH, Some(&r), &[]));
    assert!((s.reward - 10.0 * (0.3 * 0.5 + 0.7 * 0.75)).abs() < 1e-12);
    assert_eq!((s.terms["f2p"], s.terms["p2p"]), (0.5, 0.75));
    // No report: 0.
    assert_eq!(
        reward(Mode::PassRate, &evidence(PATCH, None, &[])).reward,
        0.0
    );
}

#[test]
fn process_shaped_terms() {
    let r = report(
        split(&["tests/test_core.py::test_value"], &[]),
        split(
            &["tests/test_core.py::test_other"],
            &["tests/test_core.py::test_x"],
        ),
    );
    let steps = [
        step("cat pkg/core.py", "def f():\n    return 1", Some(0)),
        step(
            "pytest tests/test_core.py",
            "FAILED tests/test_core.py::test_value - assert 1 == 2",
            Some(1),
        ),
        step("sed -i 's/1/2/' pkg/core.py", "", Some(0)),
        step(
            "pytest tests/test_core.py",
            "tests/test_core.py::test_value PASSED",
            Some(0),
        ),
        step("pytest tests/test_core.py", "1 passed", Some(0)),
    ];
    let e = Evidence {
        resolved: true,
        ..evidence(PATCH, Some(&r), &steps)
    };
    let s = reward(Mode::ProcessShaped, &e);
    assert!(s.gate.is_empty(), "{:?}", s.gate);
    let t = &s.terms;
    assert_eq!(t["resolved"], 1.0);
    assert_eq!(t["f2p"], 1.0);
    assert_eq!(t["p2p"], 0.5);
    assert_eq!(t["localization"], 0.5); // one of the gold patch's two files
    assert_eq!(t["anchored_flip"], 1.0);
    assert_eq!(t["read_before_edit"], 1.0);
    assert_eq!(t["extra_files"], 0.0);
    assert_eq!(t["no_progress"], 0.4); // 2 of 5 commands repeated
    assert_eq!(t["error_rate"], 0.2);
    let want = 10.0
        * (1.0 + 0.5 * 1.0 + 0.4 * 0.5 + 0.3 + 0.1 * 1.0 + 0.2 * 0.5
            - 0.05 * 0.0
            - 0.05 * 0.4
            - 0.03 * 0.2);
    assert!((s.reward - want).abs() < 1e-9, "{} {want}", s.reward);

    // No flip without the failure first; an edit before any read; an extra file.
    let extra = format!(
        "{PATCH}diff --git a/pkg/other.py b/pkg/other.py\n--- a/pkg/other.py\n+++ b/pkg/other.py\n@@ -1 +1 @@\n-y = 1\n+y = 3\n"
    );
    let steps = [
        step("sed -i 's/1/2/' pkg/core.py", "", None),
        step("pytest", "tests/test_core.py::test_value PASSED", None),
    ];
    let s = reward(Mode::ProcessShaped, &evidence(&extra, Some(&r), &steps));
    assert_eq!(s.terms["anchored_flip"], 0.0);
    assert_eq!(s.terms["read_before_edit"], 0.0);
    assert_eq!(s.terms["extra_files"], 1.0);
    assert_eq!(s.terms["error_rate"], 0.0); // no return code known
}

#[test]
fn every_gate_condition_closes_the_gate() {
    let r = report(
        split(&["tests/test_core.py::test_value"], &[]),
        split(&[], &[]),
    );
    let test_edit = "diff --git a/tests/test_core.py b/tests/test_core.py
--- a/tests/test_core.py
+++ b/tests/test_core.py
@@ -1 +1 @@
-assert f() == 2
+assert f() == 1
";
    let skip = format!(
        "{PATCH}diff --git a/pkg/conftest_helpers.py b/pkg/conftest_helpers.py\n--- a/pkg/conftest_helpers.py\n+++ b/pkg/conftest_helpers.py\n@@ -1 +1,2 @@\n x = 1\n+pytestmark = pytest.mark.skip(reason='flaky')\n"
    );
    let xfail = PATCH.replace("+    return 2", "+    pytest.xfail('later')");
    let assert_true = PATCH.replace("+    return 2", "+    assert True");
    let special_case = PATCH.replace(
        "+    return 2",
        "+    return 2 if 'test_value' in os.environ.get('PYTEST_ADDOPTS', '') else 1",
    );
    let env_probe = PATCH.replace(
        "+    return 2",
        "+    return 2 if os.environ.get('PYTEST_CURRENT_TEST') else 1",
    );
    let cases: Vec<(String, Vec<Step>, &str)> = vec![
        (
            test_edit.into(),
            vec![],
            "edits the test file tests/test_core.py",
        ),
        (skip, vec![], "adds a skip or xfail"),
        (xfail, vec![], "adds a skip or xfail"),
        (assert_true, vec![], "hard-codes"),
        (special_case, vec![], "hard-codes"),
        (env_probe, vec![], "hard-codes"),
        (
            PATCH.into(),
            vec![step("rm -rf / --no-preserve-root", "", None)],
            "destructive",
        ),
        (
            PATCH.into(),
            vec![step("cd /testbed && rm -rf .", "", None)],
            "destructive",
        ),
        (
            PATCH.into(),
            vec![step("git reset --hard HEAD~1", "", None)],
            "destructive",
        ),
        (
            PATCH.into(),
            vec![step("git clean -fdx", "", None)],
            "destructive",
        ),
        (
            PATCH.into(),
            vec![step("git checkout -- .", "", None)],
            "destructive",
        ),
        (
            PATCH.into(),
            vec![step("git push origin main --force", "", None)],
            "destructive",
        ),
        (
            PATCH.into(),
            vec![step("dd if=/dev/zero of=/dev/sda", "", None)],
            "destructive",
        ),
        (
            PATCH.into(),
            vec![step(":(){ :|:& };:", "", None)],
            "destructive",
        ),
    ];
    for (patch, steps, needle) in &cases {
        let e = Evidence {
            resolved: true,
            ..evidence(patch, Some(&r), steps)
        };
        let s = reward(Mode::ProcessShaped, &e);
        assert_eq!(s.reward, 0.0, "{needle}: {patch}");
        assert_eq!(s.terms["gate"], 0.0);
        assert!(
            s.gate.iter().any(|g| g.contains(needle)),
            "{needle}: {:?}",
            s.gate
        );
    }
    // Harmless look-alikes keep the gate open.
    let steps = [
        step("rm -rf build/ && git status", "", Some(0)),
        step("git checkout -b fix", "", Some(0)),
        step("git diff", "", Some(0)),
    ];
    let e = evidence(PATCH, Some(&r), &steps);
    let s = reward(Mode::ProcessShaped, &e);
    assert!(s.gate.is_empty(), "{:?}", s.gate);
    assert!(s.reward > 0.0);
}

#[test]
fn test_paths() {
    for p in [
        "tests/test_a.py",
        "pkg/tests/helpers.py",
        "test_a.py",
        "a_test.py",
        "conftest.py",
        "testing/x.py",
    ] {
        assert!(is_test_path(p), "{p}");
    }
    for p in ["pkg/core.py", "pkg/testsuite_runner.py", "contest.py"] {
        assert!(!is_test_path(p), "{p}");
    }
    assert_eq!(test_name("a/b.py::C::test_x[p-1]"), "test_x");
    assert_eq!(test_name("test_y (mod.Class)"), "test_y");
}
