"""Mutation testing with mutmut 3 on the modules a change touched, with the tests that cover them.

mutmut puts each small bug it can make (an operator, a boundary, a constant, a dropped
argument, a `None` for a value...) into a copy of the module, one at a time, and runs the
tests that reached the mutated function; a mutant no test fails on survives. Each
survivor is reviewed before a change is called done: a test is written for it, or it is
marked equivalent (no user could see it) in `scripts/mutants_equivalent.txt`, with the
reason. The score is the caught mutants over all but the equivalent ones; 90% at least
for a module added or changed (issue 49).

    .venv/bin/python scripts/mutants.py                      # modules changed since main
    .venv/bin/python scripts/mutants.py --base HEAD~3
    .venv/bin/python scripts/mutants.py chat/trips/diverge.py backends/local/teacher.py
    .venv/bin/python scripts/mutants.py telemetry/otel.py --tests tests/test_otel.py
    .venv/bin/python scripts/mutants.py backends/local/teacher.py --only '*forced_logits__mutmut_7*'

It works in a copy (`.mutants/`, the package laid out as a wheel lays it out, its mapped
folders real folders inside it, since mutmut names a mutant by its file's path and the
tests import `phasechat.<...>`: scripts/package_map.py), so the work
tree is never edited and may be used meanwhile. The tests for a module are the test
files that import it, less the UI and snapshot files (`--ui` keeps them), run with
`-m "not server"` (`--marks` to change; a real llama-server needs PHASECHAT_LLAMA_SERVER).
mutmut's own commands work in the copy afterwards:
`cd .mutants && ../.venv/bin/python -m mutmut show NAME` (or `browse`).

The marks file: one mutant a line, `name | changed lines | why`, the changed lines as
this script prints them. A mark whose mutant is not a survivor any more, or whose lines
changed (the code moved), is listed as stale: check it and remove or rewrite it.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass

import tomlkit
from package_map import copy_package  # scripts/ is on the path when run as a script

ROOT = pathlib.Path(__file__).resolve().parent.parent
MARKS = ROOT / "scripts" / "mutants_equivalent.txt"
#: the folders whose modules are product code (those mapped into phasechat/ and its own)
PRODUCT = ("backends/", "chat/", "telemetry/", "tui/", "themes/", "phasechat/")
#: test files that draw the UI: slow, and they reach the module through the screens
UI_TESTS = re.compile(r"tui|snapshot|pty|markdown|ui_pace|odd_input|compare_tables")
#: the folders copied beside the package: the tests, and what they read (a test holds
#: docs/backends.md's table against the families)
COPIED = ("tests", "scripts", "bench", "examples", "docs")
#: test files of the project's own shape (its folders, its layers): they read the work
#: tree's top-level folders, which the copy has only under phasechat/, and test no behaviour
TREE_TESTS = re.compile(r"test_(family_packages|layers|layout|layout_doc|packaging)\.py$")
#: what `mutmut run` says (and exits 1) when no selected test reaches a mutated function
UNREACHED = "could not find any test case for any mutant"
CAUGHT = {"killed", "timeout", "segfault", "caught by type check", "suspicious"}


@dataclass(frozen=True)
class Mark:
    name: str
    lines: str
    why: str


def product_path(path: str) -> str | None:
    """`chat/trips/diverge.py` -> `phasechat/chat/trips/diverge.py`; None for non-product."""
    if not path.endswith(".py") or not path.startswith(PRODUCT):
        return None
    return path if path.startswith("phasechat/") else f"phasechat/{path}"


def changed_modules(base: str) -> list[str]:
    """The product modules that differ from `base`'s merge base (committed or not)."""
    fork = subprocess.run(
        ["git", "merge-base", base, "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    names = subprocess.run(
        ["git", "diff", "--name-only", "--diff-filter=AM", fork],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return sorted({p for n in names if (p := product_path(n)) and (ROOT / n).exists()})


def dotted_name(module: str) -> str:
    """`phasechat/backends/remote/servers/sglang/__init__.py` is named
    `phasechat.backends.remote.servers.sglang`
    (a package's own module is named by its package, in imports and in mutmut's names)."""
    return module.removesuffix(".py").replace("/", ".").removesuffix(".__init__")


def test_files(module: str, ui: bool) -> list[str]:
    """The test files that import `module` (by its dotted name or from its package);
    `ui`: the UI and snapshot files too."""
    dotted = dotted_name(module).removeprefix("phasechat.")
    pkg, _, name = dotted.rpartition(".")
    rx = re.compile(rf"{re.escape(dotted)}\b|{re.escape(pkg)} import [^\n]*\b{name}\b")
    found = sorted(f.name for f in (ROOT / "tests").glob("test_*.py") if rx.search(f.read_text()))
    found = [f for f in found if not TREE_TESTS.search(f)]
    return [f"tests/{f}" for f in found if ui or not UI_TESTS.search(f)]


def stage(where: pathlib.Path) -> None:
    """A copy of the package as a wheel lays it out, the tests and the scripts."""
    shutil.rmtree(where, ignore_errors=True)
    junk = shutil.ignore_patterns("__pycache__", "*.pyc", "snapshot_report.html")
    copy_package(ROOT, "phasechat", where)
    for name in COPIED:
        if (ROOT / name).exists():
            shutil.copytree(ROOT / name, where / name, ignore=junk)
    shutil.copy2(ROOT / "pyproject.toml", where / "pyproject.toml")


def configure(where: pathlib.Path, modules: list[str], tests: list[str], marks: str) -> None:
    """The copy's [tool.mutmut]: the project's settings, these modules and these tests."""
    path = where / "pyproject.toml"
    doc = tomlkit.parse(path.read_text())
    cfg = doc["tool"]["mutmut"]
    cfg["only_mutate"] = modules
    cfg["also_copy"] = [*COPIED[1:]]
    cfg["pytest_add_cli_args_test_selection"] = tests
    if marks:
        cfg["pytest_add_cli_args"] = [*cfg["pytest_add_cli_args"], "-m", marks]
    path.write_text(tomlkit.dumps(doc))


def copy_env() -> dict[str, str]:
    """The environment for a run in the copy: the work tree must not shadow it (the
    copy's mutants/ come first by mutmut's own doing; nothing of the work tree is on the
    path at all)."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    path = env.get("PYTHONPATH", "").split(os.pathsep)
    env["PYTHONPATH"] = os.pathsep.join(p for p in path if p and pathlib.Path(p).resolve() != ROOT)
    return env


def mutmut(where: pathlib.Path, *args: str, check: bool = True) -> str:
    run = subprocess.run(
        [sys.executable, "-m", "mutmut", *args],
        cwd=where,
        env=copy_env(),
        capture_output=True,
        text=True,
    )
    if check and run.returncode != 0:
        said = run.stdout[-4000:] + run.stderr[-4000:]
        sys.exit(f"mutmut {' '.join(args)} failed ({run.returncode}):\n{said}")
    return run.stdout


def run_shown(where: pathlib.Path, jobs: int, only: list[str]) -> str:
    """`mutmut run`, its progress shown as it goes; the last of what it said. A run that
    fails (its clean tests fail, mutmut is not installed) ends this script with its tail:
    it would leave no results, and a module without results is no score."""
    cmd = [sys.executable, "-m", "mutmut", "run", "--max-children", str(jobs), *only]
    proc = subprocess.Popen(
        cmd, cwd=where, env=copy_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    assert proc.stdout is not None
    tail = b""
    while chunk := os.read(proc.stdout.fileno(), 4096):
        sys.stdout.buffer.write(chunk)
        sys.stdout.flush()
        tail = (tail + chunk)[-65536:]
    said = tail.decode("utf-8", "replace")
    if proc.wait() != 0 and UNREACHED not in said:  # that one: every mutant unreached
        sys.exit(f"mutmut run failed ({proc.returncode}):\n{said[-4000:]}")
    return said


def known_bugs(where: pathlib.Path, modules: list[str]) -> int:
    """scripts/known_bugs.py for `modules`, in the copy: the hand-made bugs of earlier
    reviews (a swapped side, a wrong field) that mutmut does not make."""
    names = [m.removeprefix("phasechat/") for m in modules]
    print("\nknown bugs of", *names, flush=True)
    cmd = [sys.executable, str(where / "scripts" / "known_bugs.py"), *names]
    return subprocess.run(cmd, cwd=where, env=copy_env()).returncode


#: each named mutant's diff, in one process (a `mutmut show` each took a second apiece)
DIFFS = """
import json, sys
from mutmut.mutation.diff_apply import find_mutant, get_diff_for_mutant
names = json.load(sys.stdin)
print(json.dumps({n: get_diff_for_mutant(n, path=find_mutant(n).path) for n in names}))
"""


def diffs(where: pathlib.Path, names: list[str]) -> dict[str, str]:
    if not names:
        return {}
    run = subprocess.run(
        [sys.executable, "-c", DIFFS],
        cwd=where,
        env=copy_env(),
        input=json.dumps(names),
        capture_output=True,
        text=True,
        check=True,
    )
    said: dict[str, str] = json.loads(run.stdout)
    return said


def changed_lines(diff: str) -> str:
    """A mutant's diff as one line: its changed lines, spaces squeezed."""
    lines = [
        " ".join(line.split())
        for line in diff.splitlines()
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    return " / ".join(lines)


def read_marks() -> list[Mark]:
    marks = []
    for line in MARKS.read_text().splitlines() if MARKS.exists() else []:
        if line.strip() and not line.startswith("#"):
            # the changed lines may hold " | " themselves (`float | None`): the name is
            # before the first, the reason after the last
            name, rest = line.split(" | ", 1)
            lines, why = rest.rsplit(" | ", 1)
            name, lines, why = name.strip(), lines.strip(), why.strip()
            marks.append(Mark(name, lines, why))
    return marks


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "modules", nargs="*", help="files to mutate (default: those changed since --base)"
    )
    p.add_argument("--base", default="main", help="the ref a change is measured from (main)")
    p.add_argument(
        "--tests", nargs="*", help="test files to run (default: those importing a module)"
    )
    p.add_argument("--marks", default="not server", help='pytest -m ("not server"; "" for all)')
    p.add_argument("--ui", action="store_true", help="also the UI and snapshot test files")
    p.add_argument("--jobs", type=int, default=2, help="mutants run at once (2)")
    p.add_argument("--min", type=float, default=90.0, help="the score (%%) each module needs (90)")
    p.add_argument("--where", default=str(ROOT / ".mutants"), help="the copy (.mutants/)")
    p.add_argument(
        "--no-known", action="store_true", help="skip scripts/known_bugs.py for the modules"
    )
    p.add_argument(
        "--only",
        nargs="*",
        default=[],
        help="only these mutants (names or fnmatch patterns, e.g. an earlier run's "
        "survivors); the scores count only them",
    )
    args = p.parse_args()

    raw = args.modules or changed_modules(args.base)
    modules = [m for n in raw if (m := product_path(n.removeprefix("./")))]
    if not modules:
        print("no product module to mutate")
        return 0
    tests = args.tests or sorted({t for m in modules for t in test_files(m, args.ui)})
    if not tests:
        sys.exit(f"no test file imports {', '.join(modules)}: name some with --tests")
    print("mutating:", *modules, "\nwith:", *tests, flush=True)

    where = pathlib.Path(args.where)
    stage(where)
    configure(where, modules, tests, args.marks)
    said = run_shown(where, args.jobs, args.only)
    if "failed to collect stats" in said:
        # a selected test fails on the unmutated code: every mutant would read as unreached
        sys.exit("the tests fail before any mutant: run them in the copy and fix that first")
    if UNREACHED in said:
        print("no selected test reaches a mutated function: all mutants are reached by no test")
    status = {}
    for line in mutmut(where, "results", "--all", "true").splitlines():
        name, sep, what = line.strip().rpartition(": ")
        if sep:
            status[name] = what

    marks = {m.name: m for m in read_marks()}
    used: set[str] = set()
    worst = 100.0
    for module in modules:
        dotted = dotted_name(module)
        mine = {
            n: s
            for n, s in status.items()
            if n.startswith(dotted + ".x")
            and (not args.only or any(fnmatch.fnmatch(n, o) for o in args.only))
        }
        counts = Counter(mine.values())
        caught = sum(n for s, n in counts.items() if s in CAUGHT)
        equivalent, open_ = [], []
        left = sorted(n for n, s in mine.items() if s not in CAUGHT)
        shown = diffs(where, left)
        for name in left:
            lines = changed_lines(shown[name])
            mark = marks.get(name)
            if mark and mark.lines == lines:
                equivalent.append(name)
                used.add(name)
            else:
                open_.append(f"  {name} ({mine[name]}): {lines}")
        if not mine:  # mutmut made none, or said nothing of them: not a score of 100%
            print(f"\n{module}: no mutant results (nothing to mutate, or mutmut failed)")
            worst = 0.0
            continue
        judged = len(mine) - len(equivalent)
        unreached = counts.get("no tests", 0) + counts.get("not checked", 0)
        score = 100.0 * caught / judged if judged else 100.0
        worst = min(worst, score)
        print(
            f"\n{module}: {score:.1f}% caught ({caught} of {judged}; {len(mine)} mutants, "
            f"{len(equivalent)} marked equivalent, {unreached} reached by no test)"
        )
        print("\n".join(open_))
    prefixes = tuple(dotted_name(m) + ".x" for m in modules)
    stale = [
        mark
        for n, mark in marks.items()
        if n not in used
        and n.startswith(prefixes)
        and (not args.only or any(fnmatch.fnmatch(n, o) for o in args.only))  # run, not left
    ]
    for mark in stale:
        print(f"stale mark (not a survivor, or its lines changed): {mark.name} | {mark.lines}")
    missed = 0 if args.no_known else known_bugs(where, modules)
    return 0 if worst >= args.min and not stale and not missed else 1


if __name__ == "__main__":
    raise SystemExit(main())
