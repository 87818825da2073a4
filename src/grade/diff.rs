//! What swebench reads of a test patch: the files it modifies
//! (`get_modified_files`, which parses the patch with `unidiff` 1.0.1) and
//! the test directives (`get_test_directives`).
//!
//! [`modified_files`] follows unidiff's `PatchSet._parse` as far as the
//! source file names need: git headers, `new file mode`, `---`/`+++`
//! headers, hunks consumed by their line counts (so a hunk line such as
//! `--- a/x` is content, not a header), binary markers, and the same parse
//! errors where unidiff raises (swebench cannot build a test spec then).

use super::specs::specs;
use regex::Regex;
use std::sync::OnceLock;

/// Where unidiff raises `UnidiffParseError` on a patch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DiffError {
    /// the test patch does not parse (as unidiff reads it) at line {line}: {why}
    #[error("the test patch does not parse (as unidiff reads it) at line {line}: {why}")]
    Parse { line: usize, why: &'static str },
}

const DEV_NULL: &str = "/dev/null";

struct Res {
    git_header: [Regex; 3],
    new_file: Regex,
    deleted_file: Regex,
    old_mode: Regex,
    new_mode: Regex,
    index: Regex,
    source: Regex,
    target: Regex,
    hunk: Regex,
    binary: Regex,
    directive: Regex,
}

fn res() -> &'static Res {
    static RES: OnceLock<Res> = OnceLock::new();
    RES.get_or_init(|| {
        let re = |p: &str| Regex::new(p).expect("valid regex");
        Res {
            git_header: [
                re(r#"^diff --git (?P<source>"?a/[^\t\n]+"?) (?P<target>"?b/[^\t\n]+"?)"#),
                re(r"^diff --git (?P<source>.*://[^\t\n]+) (?P<target>.*://[^\t\n]+)"),
                re(r"^diff --git (?P<source>[^\t\n]+) (?P<target>[^\t\n]+)"),
            ],
            new_file: re(r"^new file mode \d+$"),
            deleted_file: re(r"^deleted file mode \d+$"),
            old_mode: re(r"^old mode \d+$"),
            new_mode: re(r"^new mode \d+$"),
            index: re(r"^index [0-9a-f]+\.\.[0-9a-f]+ \d+$"),
            source: re(r#"^--- (?P<filename>"?[^\t\n]*"?)"#),
            target: re(r#"^\+\+\+ (?P<filename>"?[^\t\n]*"?)"#),
            hunk: re(r"^@@ -([0-9]+)(?:,([0-9]+))? \+([0-9]+)(?:,([0-9]+))? @@"),
            binary: re(
                r"^Binary files? (?P<source>[^\t]+?)(?:\t[\s0-9:+-]+)?(?: and (?P<target>[^\t]+?)(?:\t[\s0-9:+-]+)?)? (differ|has changed)",
            ),
            directive: re(r"diff --git a/.* b/(.*)"),
        }
    })
}

/// One file of a patch: its source and target names as unidiff has them.
struct Patched {
    source: String,
    target: String,
    /// Hunks read so far (an empty line after a file with none is patch
    /// info, as in unidiff, whose file object is falsy without hunks).
    hunks: usize,
}

/// `get_modified_files`: the `a/`-prefixed source files of the patch that
/// are not `/dev/null` (new files), without the prefix, in patch order.
pub fn modified_files(patch: &str) -> Result<Vec<String>, DiffError> {
    Ok(parse(patch)?
        .into_iter()
        .filter(|f| f.source != DEV_NULL)
        .filter_map(|f| f.source.strip_prefix("a/").map(str::to_owned))
        .collect())
}

/// Every file the patch touches, without the `a/` / `b/` prefix, in patch
/// order: its target, or its source when it deletes the file.
pub fn touched_files(patch: &str) -> Result<Vec<String>, DiffError> {
    Ok(parse(patch)?
        .into_iter()
        .filter_map(|f| {
            let name = if f.target == DEV_NULL {
                f.source
            } else {
                f.target
            };
            let name = name
                .strip_prefix("b/")
                .or_else(|| name.strip_prefix("a/"))
                .map_or(name.clone(), str::to_owned);
            (name != DEV_NULL).then_some(name)
        })
        .collect())
}

fn parse(patch: &str) -> Result<Vec<Patched>, DiffError> {
    let r = res();
    let mut files: Vec<Patched> = Vec::new();
    let mut current: Option<usize> = None;
    let mut in_info = false; // unidiff's `patch_info is not None`
    let mut pending_source: Option<String> = None;
    // Lines as StringIO yields them: split after each '\n', kept.
    let mut lines = patch.split_inclusive('\n').enumerate();
    let err = |line: usize, why| DiffError::Parse {
        line: line + 1,
        why,
    };
    while let Some((no, full)) = lines.next() {
        let line = full.strip_suffix('\n').unwrap_or(full);
        let cap = |re: &Regex, name: &str| {
            re.captures(line)
                .and_then(|c| c.name(name).map(|m| m.as_str().to_owned()))
        };
        if let Some(c) = r.git_header.iter().find_map(|re| re.captures(line)) {
            let get = |n| c.name(n).map_or(String::new(), |m| m.as_str().to_owned());
            files.push(Patched {
                source: get("source"),
                target: get("target"),
                hunks: 0,
            });
            current = Some(files.len() - 1);
            in_info = true;
            pending_source = Some(get("source"));
            continue;
        }
        if r.new_file.is_match(line) {
            let i = current
                .filter(|_| in_info)
                .ok_or_else(|| err(no, "unexpected new file"))?;
            files[i].source = DEV_NULL.to_owned();
            continue;
        }
        if r.deleted_file.is_match(line) {
            let i = current
                .filter(|_| in_info)
                .ok_or_else(|| err(no, "unexpected deleted file"))?;
            files[i].target = DEV_NULL.to_owned();
            continue;
        }
        if current.is_some()
            && in_info
            && (r.old_mode.is_match(line) || r.new_mode.is_match(line) || r.index.is_match(line))
        {
            continue;
        }
        if let Some(name) = cap(&r.source, "filename") {
            pending_source = Some(name);
            if current.is_some() && !in_info {
                current = None;
            }
            continue;
        }
        if let Some(name) = cap(&r.target, "filename") {
            match current {
                Some(i) if files[i].target != name => return Err(err(no, "target without source")),
                Some(_) => {}
                None => {
                    let source = pending_source
                        .take()
                        .ok_or_else(|| err(no, "target without source"))?;
                    files.push(Patched {
                        source,
                        target: name,
                        hunks: 0,
                    });
                    current = Some(files.len() - 1);
                    in_info = false;
                }
            }
            continue;
        }
        if let Some(c) = r.hunk.captures(line) {
            in_info = false;
            let Some(i) = current else {
                return Err(err(no, "unexpected hunk"));
            };
            files[i].hunks += 1;
            let num = |i: usize, default: u64| {
                c.get(i)
                    .map_or(Some(default), |m| m.as_str().parse::<u64>().ok())
            };
            let (Some(ss), Some(sl), Some(ts), Some(tl)) =
                (num(1, 0), num(2, 1), num(3, 0), num(4, 1))
            else {
                return Err(err(no, "hunk header numbers out of range"));
            };
            skip_hunk(
                &mut lines,
                (ss, ss.saturating_add(sl)),
                (ts, ts.saturating_add(tl)),
            )
            .map_err(|(at, why)| err(at, why))?;
            continue;
        }
        if line.starts_with("\\ No newline at end of file") {
            if current.is_none() {
                return Err(err(no, "unexpected marker"));
            }
            continue;
        }
        if full == "\n" && current.is_some_and(|i| files[i].hunks > 0) {
            continue;
        }
        if !in_info {
            current = None;
            in_info = true;
        }
        if let Some(c) = r.binary.captures(line) {
            let source = c.name("source").map_or("", |m| m.as_str()).to_owned();
            let target = c
                .name("target")
                .map_or(source.clone(), |m| m.as_str().to_owned());
            if current.is_none() {
                files.push(Patched {
                    source,
                    target,
                    hunks: 0,
                });
            }
            in_info = false;
            current = None;
            continue;
        }
        if full == "GIT binary patch\n" {
            if current.is_none() {
                return Err(err(no, "unexpected binary patch marker"));
            }
            in_info = false;
            current = None;
            continue;
        }
    }
    Ok(files)
}

/// Consume a hunk's body as unidiff's `_parse_hunk` does: count source and
/// target lines until both reach their ends; fail on a line that is no
/// hunk line, on too many lines, or on too few before the patch ends.
fn skip_hunk<'a>(
    lines: &mut impl Iterator<Item = (usize, &'a str)>,
    (mut source, source_end): (u64, u64),
    (mut target, target_end): (u64, u64),
) -> Result<(), (usize, &'static str)> {
    let mut last = 0;
    for (no, line) in lines.by_ref() {
        last = no;
        let kind = match line.chars().next() {
            Some(c @ ('-' | ' ' | '+' | '\\')) => c,
            // An empty body line (`\n`, `\r\n`, or a type char then those)
            // is context.
            Some('\r' | '\n') => ' ',
            _ => return Err((no, "hunk diff line expected")),
        };
        match kind {
            '+' => target = target.saturating_add(1),
            '-' => source = source.saturating_add(1),
            ' ' => {
                source = source.saturating_add(1);
                target = target.saturating_add(1);
            }
            _ => {}
        }
        if source > source_end || target > target_end {
            return Err((no, "hunk is longer than expected"));
        }
        if source == source_end && target == target_end {
            return Ok(());
        }
    }
    if source < source_end || target < target_end {
        return Err((last, "hunk is shorter than expected"));
    }
    Ok(())
}

/// `get_test_directives`: the `b/` paths of every `diff --git a/… b/…` in
/// the test patch, without those ending in a `NON_TEST_EXTS` suffix; for
/// `django/django`, as modules (`tests/a/b.py` → `a.b`); for
/// `swe-bench/humaneval`, `test.py`. (swebench 4.1.0 transforms no other
/// repo's directives, sympy's included: its runner takes the paths.)
pub fn test_directives(repo: &str, test_patch: &str) -> Vec<String> {
    if repo == "swe-bench/humaneval" {
        return vec!["test.py".to_owned()];
    }
    let exts = &specs().non_test_exts;
    let found = res()
        .directive
        .captures_iter(test_patch)
        .filter_map(|c| c.get(1).map(|m| m.as_str()))
        .filter(|d| !exts.iter().any(|e| d.ends_with(e.as_str())));
    if repo != "django/django" {
        return found.map(str::to_owned).collect();
    }
    found
        .map(|d| {
            let d = d.strip_suffix(".py").unwrap_or(d);
            let d = d.strip_prefix("tests/").unwrap_or(d);
            d.replace('/', ".")
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Modified, new, deleted, data and binary files; a hunk whose lines
    /// look like file headers.
    const MIXED: &str = "diff --git a/tests/test_a.py b/tests/test_a.py
index 1111111..2222222 100644
--- a/tests/test_a.py
+++ b/tests/test_a.py
@@ -1,2 +1,3 @@
 x
--- a/not/a/header.py
+++ b/not/a/header.py
+added
diff --git a/tests/new_test.py b/tests/new_test.py
new file mode 100644
index 0000000..3333333
--- /dev/null
+++ b/tests/new_test.py
@@ -0,0 +1,2 @@
+a
+b
diff --git a/tests/gone.py b/tests/gone.py
deleted file mode 100644
index 4444444..0000000
--- a/tests/gone.py
+++ /dev/null
@@ -1 +0,0 @@
-z
diff --git a/tests/data/fixture.json b/tests/data/fixture.json
--- a/tests/data/fixture.json
+++ b/tests/data/fixture.json
@@ -1 +1 @@
-{}
+[]
diff --git a/tests/data.csv b/tests/data.csv
--- a/tests/data.csv
+++ b/tests/data.csv
@@ -1 +1 @@
-a
+b
diff --git a/img.png b/img.png
index 5555555..6666666 100644
Binary files a/img.png and b/img.png differ
";

    #[test]
    fn modified_files_are_the_a_side_files_that_existed() {
        assert_eq!(
            modified_files(MIXED).unwrap(),
            [
                "tests/test_a.py",
                "tests/gone.py",
                "tests/data/fixture.json",
                "tests/data.csv",
                "img.png"
            ]
        );
        let plain = "--- a/lib/x.py\t2020-01-01\n+++ b/lib/x.py\t2020-01-02\n@@ -1 +1 @@\n-a\n+b\n";
        assert_eq!(modified_files(plain).unwrap(), ["lib/x.py"]);
        let rename = "diff --git a/old/t.py b/new/t.py\nsimilarity index 100%\nrename from old/t.py\nrename to new/t.py\n";
        assert_eq!(modified_files(rename).unwrap(), ["old/t.py"]);
        assert_eq!(modified_files("").unwrap(), Vec::<String>::new());
    }

    #[test]
    fn patches_unidiff_refuses_are_refused() {
        let wrong_count = MIXED.replace("@@ -1,2 +1,3 @@", "@@ -1,3 +1,4 @@");
        let blank_before_hunk = "--- a/lib/x.py\n+++ b/lib/x.py\n\n@@ -1 +1 @@\n-a\n+b\n";
        let short = "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1,3 +1,3 @@\n a\n";
        for bad in [wrong_count.as_str(), blank_before_hunk, short] {
            assert!(modified_files(bad).is_err(), "{bad}");
        }
        // Line numbers near u64::MAX neither overflow nor panic.
        let huge = format!("--- a/x\n+++ b/x\n@@ -{m} +{m} @@\n a\n a\n", m = u64::MAX);
        assert!(modified_files(&huge).is_ok());
        assert_eq!(
            modified_files(short),
            Err(DiffError::Parse {
                line: 5,
                why: "hunk is shorter than expected"
            })
        );
    }

    #[test]
    fn directives_drop_data_files_and_become_modules_for_django() {
        assert_eq!(
            test_directives("sympy/sympy", MIXED),
            ["tests/test_a.py", "tests/new_test.py", "tests/gone.py"]
        );
        assert_eq!(
            test_directives("django/django", MIXED),
            ["test_a", "new_test", "gone"]
        );
        assert_eq!(
            test_directives(
                "django/django",
                "diff --git a/tests/auth_tests/test_views.py b/tests/auth_tests/test_views.py\n"
            ),
            ["auth_tests.test_views"]
        );
        assert_eq!(test_directives("swe-bench/humaneval", ""), ["test.py"]);
        // The last " b/" of the line wins, as with the greedy Python regex.
        assert_eq!(
            test_directives("x/y", "diff --git a/a b/c b/d.py\n"),
            ["d.py"]
        );
    }
}
