"""Every bug the suite was once shown to miss or was tried on, put back one at a time.

`scripts/known_bugs.json` holds realistic bugs written for issue 24 (its table, and the
blind rounds 3 and 4, made by sessions that had not read the tests): the file, the exact
text replaced, the bug's text and what it does. Each is applied alone, the test files
that import its module run (`-m 'not server'`, `-x`, so the bundled model's tests
too), and the file is restored (also on Ctrl-C or SIGTERM). Every bug must be caught: a
miss means a test that once guarded it was weakened or removed. A bug whose text no
longer occurs (the code was rewritten) is reported, to be written again for the new code.

    .venv/bin/python scripts/known_bugs.py            # all (20 minutes on 2 cores)
    .venv/bin/python scripts/known_bugs.py windows    # the bugs whose file names match

Run it alone in its own worktree: it edits product files while it runs.
"""

from __future__ import annotations

import json
import pathlib
import re
import signal
import sys

from mutate import run_with  # scripts/ is on the path when run as a script

ROOT = pathlib.Path(__file__).resolve().parent.parent
#: model- and UI-heavy files run last, so that -x stops early on a cheap failure
HEAVY = re.compile(r"local|tui|snapshot|trimmer|ablate|draft|flash|cli|store|markdown|pty")


def test_files(module: str) -> list[str]:
    """The test files that import `module` (by its dotted name or from its package)."""
    dotted = module.removesuffix(".py").replace("/", ".")
    pkg, _, name = dotted.rpartition(".")
    rx = re.compile(rf"{re.escape(dotted)}\b|{re.escape(pkg)} import [^\n]*\b{name}\b")
    found = [f for f in sorted((ROOT / "tests").glob("test_*.py")) if rx.search(f.read_text())]
    return sorted((f"tests/{f.name}" for f in found), key=lambda f: (bool(HEAVY.search(f)), f))


def main() -> int:
    bugs = json.loads((ROOT / "scripts" / "known_bugs.json").read_text())
    if len(sys.argv) > 1:
        bugs = [b for b in bugs if any(a in b["file"] for a in sys.argv[1:])]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    pytest = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider"]

    def cmd(module: str) -> list[str]:
        return [*pytest, "-m", "not server", *test_files(module)]

    missed, stale = [], []
    for i, bug in enumerate(bugs, 1):
        path = ROOT / bug["file"]
        src = path.read_text()
        where = f"[{i}/{len(bugs)}] {bug['file']}: {bug['bug']}"
        if src.count(bug["old"]) != 1:
            stale.append(where)
            print(f"{where}: its text is gone (write it again)", flush=True)
            continue
        rc, out = run_with(path, src.replace(bug["old"], bug["new"]), cmd(bug["file"]), 1800)
        failed = [line for line in out.splitlines() if line.startswith(("FAILED", "ERROR"))]
        if rc == 0:
            missed.append(where)
        said = "MISSED" if rc == 0 else failed[0] if failed else f"caught (exit {rc})"
        print(f"{where}: {said}", flush=True)
    caught = len(bugs) - len(missed) - len(stale)
    print(f"\n{caught}/{len(bugs) - len(stale)} caught; {len(stale)} to write again")
    for where in missed:
        print(f"MISSED {where}")
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
