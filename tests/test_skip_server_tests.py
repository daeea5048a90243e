"""PHASECHAT_SKIP_SERVER_TESTS=1, the quick edit loop: the tests against llama-server
skip, and the run ends saying how many and how to run them; CI refuses it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.dynamo_server import ENV as DYNAMO_ENV
from tests.llama_server import NO_BINARY, SKIPPED_ON_REQUEST, skipped_summary
from tests.llama_server import SKIP_ENV as SKIP

ROOT = Path(__file__).resolve().parent.parent


def pytest_run(**env: str) -> subprocess.CompletedProcess[str]:
    """A nested run of tests/test_llama_server.py (every test in it needs llama-server)."""
    base = {k: v for k, v in os.environ.items() if k not in {"CI", "PHASECHAT_LLAMA_SERVER"}}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/test_llama_server.py",
        ],
        cwd=ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_skipping_says_so_at_the_end_of_the_run() -> None:
    r = pytest_run(PHASECHAT_SKIP_SERVER_TESTS="1")
    assert r.returncode == 0, r.stdout + r.stderr
    *_, line, stats = r.stdout.strip().splitlines()
    found = re.fullmatch(r"(\d+) skipped in [\d.]+s", stats)
    assert found, stats
    n = int(found.group(1))  # every test of the file: all of them need llama-server
    assert n >= 2 and line == (
        f"{n} tests against llama-server skipped: PHASECHAT_SKIP_SERVER_TESTS=1 is set; "
        "without it scripts/test.sh runs every test"
    )


def test_ci_refuses_to_skip() -> None:
    r = pytest_run(PHASECHAT_SKIP_SERVER_TESTS="1", CI="true")
    assert r.returncode == 1
    assert "CI runs every test: PHASECHAT_SKIP_SERVER_TESTS=1 is for a quick edit loop" in r.stdout
    assert "skipped" not in r.stdout.strip().splitlines()[-1]


def test_the_summary_counts_only_llama_server_skips() -> None:
    other = "('tests/test_faults.py', 343, 'Skipped: openssl is needed')"
    assert skipped_summary([other]) is None
    asked = skipped_summary([SKIPPED_ON_REQUEST, other, SKIPPED_ON_REQUEST])
    assert asked is not None and asked.startswith("2 tests against llama-server skipped")
    missing = skipped_summary([NO_BINARY, other])
    assert missing is not None and missing.startswith("1 test against") and "no binary" in missing


def test_dynamo_s_tests_skip_only_in_the_edit_loop_without_a_set_up() -> None:
    # without PHASECHAT_DYNAMO they fail (they run against the real server or not at
    # all); with PHASECHAT_SKIP_SERVER_TESTS=1 too, they skip and the run says so
    def run(**env: str) -> subprocess.CompletedProcess[str]:
        base = {k: v for k, v in os.environ.items() if k not in {"CI", DYNAMO_ENV, SKIP}}
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "server",
             "tests/test_family_dynamo.py"],
            cwd=ROOT, env={**base, **env}, capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    missing = run()
    assert missing.returncode == 1, missing.stdout
    assert f"no Dynamo set up in {DYNAMO_ENV}" in missing.stdout
    skipped = run(**{SKIP: "1"})
    assert skipped.returncode == 0, skipped.stdout + skipped.stderr
    *_, line, stats = skipped.stdout.strip().splitlines()
    found = re.fullmatch(r"(\d+) skipped, \d+ deselected in [\d.]+s", stats)
    assert found, stats
    assert line == (
        f"{found.group(1)} tests against Dynamo skipped: {SKIP}=1 and no Dynamo set up in "
        f"{DYNAMO_ENV}; scripts/test.sh sets it up and runs them"
    )
