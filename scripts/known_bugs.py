"""Every bug the suite was once shown to miss or was tried on, put back one at a time.

`scripts/known_bugs.json` holds realistic bugs written for issue 24 (its table, and the
blind rounds 3 and 4, made by sessions that had not read the tests) and issue 49 (the
blind round that survived, 26 of them): the file, the exact text replaced, the bug's
text and what it does, and (`tests`, where no test file imports the module by name)
which tests guard it. These are the bugs mutmut does not make (a swapped side, the
wrong field, a dropped clause): `scripts/mutants.py` runs this for the modules it
mutates, after mutmut. Each is applied alone, the test files that import its module run
(`-m 'not server'`, `-x`, so the bundled model's tests too), and the file is restored
(also on Ctrl-C or SIGTERM). Every bug must be caught: a miss means a test that once
guarded it was weakened or removed. A bug whose text no longer occurs (the code was
rewritten) is reported, to be written again for the new code.

    .venv/bin/python scripts/known_bugs.py            # all (25 minutes on 2 cores)
    .venv/bin/python scripts/known_bugs.py windows    # the bugs whose file names match

Run it alone in its own worktree (or in mutants.py's copy, as that does): it edits
product files while it runs.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
from typing import Any

from mutants import test_files as importing  # scripts/ is on the path when run as a script

ROOT = pathlib.Path(__file__).resolve().parent.parent
#: model- and UI-heavy files run last, so that -x stops early on a cheap failure
HEAVY = re.compile(r"local|tui|snapshot|trimmer|ablate|draft|flash|cli|store|markdown|pty")


def test_files(bug: dict[str, Any]) -> list[str]:
    """The bug's own tests, else the test files that import its module, heavy ones last."""
    found = bug.get("tests") or importing(bug["file"], ui=True)
    return sorted(found, key=lambda f: (bool(HEAVY.search(f)), f))


def source(name: str) -> pathlib.Path:
    """A module's file: `chat/x.py` in the work tree, `phasechat/chat/x.py` in a copy
    laid out as a wheel (scripts/mutants.py's)."""
    path = ROOT / name
    return path if path.exists() else ROOT / "phasechat" / name


def run_with(path: pathlib.Path, text: str, cmd: list[str], timeout: float) -> tuple[int, str]:
    """Run `cmd` (pytest) with `path` holding `text`, then put its own text back (also
    on Ctrl-C or SIGTERM): (exit status, output). A run past `timeout` is a failure
    the suite shows (124)."""
    src = path.read_text()
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    try:
        path.write_text(text)
        _clear_bytecode(path)
        run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        return run.returncode, run.stdout
    except subprocess.TimeoutExpired:
        return 124, "ERROR (timed out)"
    finally:
        path.write_text(src)
        _clear_bytecode(path)


def _clear_bytecode(path: pathlib.Path) -> None:
    """So that Python reads the source just written, not a .pyc of the same size and
    second."""
    for pyc in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):
        pyc.unlink()


def main() -> int:
    bugs = json.loads((ROOT / "scripts" / "known_bugs.json").read_text())
    if len(sys.argv) > 1:
        bugs = [b for b in bugs if any(a in b["file"] for a in sys.argv[1:])]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    pytest = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider"]

    def cmd(bug: dict[str, Any]) -> list[str]:
        tests = test_files(bug)
        if not tests:  # pytest would run every test: name the bug's own instead
            sys.exit(f"no test file imports {bug['file']}: give the bug its 'tests'")
        return [*pytest, "-m", "not server", *tests]

    missed, stale = [], []
    for i, bug in enumerate(bugs, 1):
        path = source(bug["file"])
        src = path.read_text()
        where = f"[{i}/{len(bugs)}] {bug['file']}: {bug['bug']}"
        if src.count(bug["old"]) != 1:
            stale.append(where)
            print(f"{where}: its text is gone (write it again)", flush=True)
            continue
        rc, out = run_with(path, src.replace(bug["old"], bug["new"]), cmd(bug), 1800)
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
