"""Generate src/grade/specs.json, the SWE-bench data `rollcall grade` embeds,
from the installed `swebench` package (pinned in requirements.txt).

    python tests/python/gen_grade_specs.py          # rewrite the file
    python tests/python/gen_grade_specs.py --check  # fail if it is stale

What it takes, from swebench.harness:
- per Python repo and version, what make_eval_script_list_py reads of
  MAP_REPO_VERSION_TO_SPECS: `test_cmd` (absent for dbt-labs/dbt-core), `eval_commands` and
  `install`;
- MAP_REPO_TO_PARSER: the name of each repo's log parser (the function's own
  name, so aliases such as parse_log_astroid read parse_log_pytest);
- every `parse_log_*` name of log_parsers/python.py and the function it is;
- MAP_REPO_TO_EXT (each repo's language), NON_TEST_EXTS, FAIL_ONLY_REPOS.

test_grade.py runs `render()` and compares it with the committed file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[2] / "src" / "grade" / "specs.json"


def render() -> str:
    from importlib.metadata import version

    import swebench.harness.log_parsers.python as py_parsers
    from swebench.harness.constants import (
        FAIL_ONLY_REPOS,
        MAP_REPO_TO_EXT,
        MAP_REPO_VERSION_TO_SPECS_PY,
        NON_TEST_EXTS,
    )
    from swebench.harness.log_parsers import MAP_REPO_TO_PARSER

    specs: dict[str, dict[str, dict]] = {}
    for repo, versions in MAP_REPO_VERSION_TO_SPECS_PY.items():
        out = specs.setdefault(repo, {})
        for v, spec in versions.items():
            entry: dict = {}
            # dbt-labs/dbt-core's specs have no test_cmd (swebench cannot
            # build their eval script either): kept without one.
            if "test_cmd" in spec:
                if not isinstance(spec["test_cmd"], str):
                    raise SystemExit(f"{repo} {v}: test_cmd is not a str")
                entry["test_cmd"] = spec["test_cmd"]
            if "eval_commands" in spec:
                entry["eval_commands"] = list(spec["eval_commands"])
            if "install" in spec:
                entry["install"] = spec["install"]
            out[v] = entry
    data = {
        "swebench": version("swebench"),
        "fail_only_repos": sorted(FAIL_ONLY_REPOS),
        "non_test_exts": list(NON_TEST_EXTS),
        "parser_names": {
            name: getattr(py_parsers, name).__name__
            for name in sorted(dir(py_parsers))
            if name.startswith("parse_log_")
        },
        "repo_language": dict(sorted(MAP_REPO_TO_EXT.items())),
        "repo_parser": {repo: f.__name__ for repo, f in sorted(MAP_REPO_TO_PARSER.items())},
        "specs": specs,
    }
    return json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def main() -> int:
    text = render()
    if "--check" in sys.argv[1:]:
        if OUT.read_text(encoding="utf-8") != text:
            print(f"{OUT} is stale: run {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
