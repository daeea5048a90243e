"""Compare when a side fails or says hostile things (the scripted fault server: what a
real server won't do on demand)."""

from __future__ import annotations

import json

from phasechat.backends.events import Message
from phasechat.backends.remote.backend import RemoteBackend, RemoteConfig
from phasechat.chat.config.settings import Settings
from phasechat.chat.trips.compare import Comparison, Side
from tests.fault_server import FaultServer, fault_server_thread
from tests.test_cli import phasechat


async def test_a_failed_run_is_kept_but_left_out_of_the_figures() -> None:
    async with FaultServer() as server:
        a = RemoteBackend(RemoteConfig(base_url=server.base_url, model="ok-5", name="good"))
        b = RemoteBackend(RemoteConfig(base_url=server.base_url, model="errormid", name="bad"))
        settings = Settings(max_tokens=8)
        c = Comparison(Side("good", a, settings), Side("bad", b, settings), [Message("user", "x")])
        try:
            await c.run(2)
        finally:
            await a.aclose()
            await b.aclose()
    assert len(c.of(1)) == 2 and all(x.trace.error is not None for x in c.of(1))
    assert all(x.complete for x in c.of(0)) and not any(x.complete for x in c.of(1))
    rows = {row.key: row for row in c.rows()}
    assert rows["e2e_ms"].a.n == 2 and rows["e2e_ms"].b.n == 0  # not a failed run's e2e
    assert rows["e2e_ms"].ratio is None and rows["e2e_ms"].warning() is None


def test_cli_shows_hostile_answers_and_errors_as_text_and_fails() -> None:
    with fault_server_thread() as server:
        base = ["compare", "Hi", "--base-url", server.base_url, "--repeat", "1"]
        sides = ["--backend", "openai", "--backend", "openai:temperature=0"]
        said = phasechat(*base, *sides, "--model", "markup")
        failed = phasechat(*base, *sides, "--model", "errormid-markup")
        as_json = phasechat(*base, *sides, "--model", "errormid-markup", "--json")
    assert said.returncode == 0, said.stderr
    assert "\x1b" not in said.stdout and "\x07" not in said.stdout and "\x9b" not in said.stdout
    assert "A said (last run): [bold red]not bold[/]" in said.stdout  # text, not markup
    assert failed.returncode == 1
    assert (
        "\x1b" not in failed.stdout
        and "A: error: server error: crashed ␛]0;pwned␇ [bold]" in failed.stdout
    )
    assert "A run 1 failed" in failed.stdout and "B run 1 failed" in failed.stdout
    out = json.loads(as_json.stdout)
    assert as_json.returncode == 1
    assert "crashed" in out["sides"][0]["runs"][0]["error"]
    assert out["sides"][0]["stats"]["e2e_ms"]["n"] == 0 and out["ratio"]["e2e_ms"] is None
