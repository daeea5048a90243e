"""The TUI in a real terminal, as a user runs it: `phasechat` in tmux, read back with
`tmux capture-pane`, against a scripted loopback server that streams as fast as the
socket takes it (faster than any model). Not a test: it prints figures and ratios.

    .venv/bin/python -m bench.tmux_ui [--tokens 20000] [--turns 16] [--turn-tokens 2000]
    .venv/bin/python -m bench.tmux_ui --one-paragraph [--runs 3] [--size 200x50]

Rows (issue 13, items 4-6):
- cold start: from spawning the command to its first frame on screen;
- one answer of --tokens max-rate tokens: the server's last byte -> the last token on
  screen, and keys typed during the stream -> the key written to the terminal (from
  0.1 s, 50 ms apart); its text is prose in paragraphs of 60 tokens, or with
  --one-paragraph all in one paragraph (no newline: the worst case for the Markdown
  view, which can seal finished blocks but cannot cut a paragraph at a block boundary),
  and then only this row is measured, --runs times, at --size;
- a chat of --turns answers of --turn-tokens tokens: Enter -> that answer's last token on
  screen, per turn (turn 1 against the last four), with the app's RSS and CPU seconds;
  then the goal's figure measured side by side: two apps at once, turns 1-4 of a new
  chat alternated with the last four of a long one (this VM's speed drifts by tens of
  percent between minutes: a first-four against last-four within one chat moved between
  0.74x and 1.63x from run to run).
  History trimming is off (its summaries are extra requests that the fault server
  answers at full length); PHASECHAT_BENCH_TRIM=on keeps it.

The screen is polled every 5 ms; a figure is good to about that. The load is printed
first: on 2 cores, anything else running moves these figures.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.fault_server import FaultServer, fault_server_thread

ROOT = Path(__file__).resolve().parent.parent
_PANES = itertools.count()
POLL_S = float(os.environ.get("PHASECHAT_TMUX_POLL_S", "0.005"))
COLS, ROWS = 120, 40  # --size changes them


@dataclass
class Pane:
    """One tmux server (its own socket) running one command in a 120x40 window."""

    socket: str
    folder: Path  # the app's data and config, removed with the pane
    started_ns: int = 0
    pid: int = 0

    def tmux(self, *args: str) -> str:
        out = subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True)
        return out.stdout

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "bench")

    def keys(self, text: str, *, literal: bool = True) -> None:
        self.tmux("send-keys", "-t", "bench", *(["-l", text] if literal else [text]))

    def wait_for(self, test: Callable[[str], bool], timeout_s: float = 60.0) -> int:
        """perf_counter_ns of the first capture for which `test` holds."""
        deadline = time.perf_counter() + timeout_s
        while time.perf_counter() < deadline:
            now = time.perf_counter_ns()
            if test(self.screen()):
                return now
            time.sleep(POLL_S)
        raise TimeoutError(f"screen never matched; last:\n{self.screen()}")

    def output_to(self, path: Path) -> None:
        """Copy every byte the app writes to its terminal into `path` (tmux pipe-pane)."""
        self.tmux("pipe-pane", "-t", "bench", "-o", f"cat >> {shlex.quote(str(path))}")

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def phasechat_in_tmux(server: FaultServer, model: str, max_tokens: int) -> Iterator[Pane]:
    """`phasechat` against `server` in a fresh tmux, with its own data and config dirs."""
    with tempfile.TemporaryDirectory(prefix="phasechat-tmux-") as tmp:
        env = {
            "XDG_DATA_HOME": f"{tmp}/data",
            "XDG_CONFIG_HOME": f"{tmp}/config",
            "PHASECHAT_CONFIG": f"{tmp}/config.toml",
            "TERM": "xterm-256color",
        }
        # History trimming off unless asked for: its summaries are requests of their own.
        trim = os.environ.get("PHASECHAT_BENCH_TRIM", "off") == "on"
        Path(f"{tmp}/config.toml").write_text(f"[trim]\nenabled = {str(trim).lower()}\n")
        if os.environ.get("PYTHONPATH"):  # to measure another tree with this venv
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        argv = [
            str(ROOT / ".venv/bin/phasechat"),
            *("--backend", "openai", "--base-url", server.base_url, "--model", model),
            *("--max-tokens", str(max_tokens)),
        ]
        command = "exec env " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        command += " " + shlex.join(argv)
        pane = Pane(socket=f"phasechat-bench-{os.getpid()}-{next(_PANES)}", folder=Path(tmp))
        pane.started_ns = time.perf_counter_ns()
        subprocess.run(
            ["tmux", "-L", pane.socket, "-f", "/dev/null", "new-session", "-d", "-s", "bench",
             "-x", str(COLS), "-y", str(ROWS), command],
            check=True,
        )  # fmt: skip
        pane.pid = int(pane.tmux("display-message", "-p", "-t", "bench", "#{pane_pid}").strip())
        try:
            yield pane
        finally:
            pane.tmux("kill-server")


def ready(screen: str) -> bool:
    """The app has drawn and the backend has answered its model check."""
    return "ready" in screen or "no answers yet" in screen


def cold_starts(n: int) -> list[float]:
    """ms from spawning `phasechat` to its first frame, `n` launches (the first one of a
    run also pays for cold file caches: the median is the figure)."""
    out = []
    with fault_server_thread() as server:
        for _ in range(n):
            with phasechat_in_tmux(server, "fast-10", 20) as pane:
                first = pane.wait_for(lambda s: bool(s.strip()))
                out.append((first - pane.started_ns) / 1e6)
                pane.wait_for(ready)
    return out


@dataclass
class Ingest:
    last_token_after_ms: float = 0.0
    server_ms: float = 0.0
    key_ms: list[float] = field(default_factory=list)


def ingest(tokens: int, one_paragraph: bool = False) -> Ingest:
    """One answer of `tokens` max-rate tokens (`one_paragraph`: with no newline); keys
    typed while it streams."""
    result = Ingest()
    model = f"{'fastpara' if one_paragraph else 'fastend'}-{tokens}"
    with (
        fault_server_thread() as server,
        phasechat_in_tmux(server, model, tokens + 10) as pane,
    ):
        pane.wait_for(ready)
        time.sleep(1.0)  # let start-up work settle, as a user reads the screen first
        last = f"end{server.fast_requests + 1}"
        pane.keys("go")
        t_send = time.perf_counter_ns()
        pane.keys("Enter", literal=False)
        time.sleep(0.1)
        # A key is on screen when the app writes it to the terminal: read from the
        # terminal's output (pipe-pane), polled every 1 ms at the cost of a file read,
        # not a `capture-pane` process per poll (which took a core of its own).
        out = pane.folder / "terminal-output"
        out.touch()
        pane.output_to(out)
        time.sleep(0.05)
        deadline = time.perf_counter() + 120
        # Until the last token is in the app's output (not a `capture-pane` process per
        # key: on 2 cores the bench's own processes delayed the keys it timed).
        while last.encode() not in out.read_bytes() and time.perf_counter() < deadline:
            offset = out.stat().st_size
            t0 = time.perf_counter_ns()
            pane.keys("Z")
            with out.open("rb") as f:
                # Bounded: a key the app never echoes is a figure (10 s), not a hang.
                while time.perf_counter_ns() - t0 < 10e9:
                    f.seek(offset)
                    if b"Z" in f.read():
                        break
                    time.sleep(0.001)
            result.key_ms.append((time.perf_counter_ns() - t0) / 1e6)
            time.sleep(0.05)
        shown = pane.wait_for(lambda s: last in s)
        result.last_token_after_ms = (shown - server.last_byte_ns) / 1e6
        result.server_ms = (server.last_byte_ns - t_send) / 1e6
    return result


def last_answer(screen: str) -> int:
    """The highest k of the `end<k>` tokens on screen (0: none)."""
    return max((int(k) for k in re.findall(r"\bend(\d+)\b", screen)), default=0)


@dataclass
class Turn:
    ms: float
    rss_mb: float
    cpu_s: float


def take_turn(pane: Pane, seen: int) -> tuple[Turn, int]:
    """Send one prompt in `pane`: Enter -> that answer's last token on screen."""
    pane.keys("go")
    time.sleep(0.3)  # typing, then Enter (the draft's forecast has run)
    cpu0 = pane.cpu_s()
    t0 = time.perf_counter_ns()
    pane.keys("Enter", literal=False)
    # The app may also ask the server for a history summary: any newer answer.
    shown = pane.wait_for(lambda s: last_answer(s) > seen)
    turn = Turn((shown - t0) / 1e6, pane.rss_mb(), pane.cpu_s() - cpu0)
    time.sleep(0.5)  # the footer, the save
    return turn, last_answer(pane.screen())


def chat(turns: int, turn_tokens: int) -> list[Turn]:
    """A chat of `turns` answers of `turn_tokens` tokens: Enter -> last token on screen."""
    out: list[Turn] = []
    with (
        fault_server_thread() as server,
        phasechat_in_tmux(server, f"fastend-{turn_tokens}", turn_tokens + 10) as pane,
    ):
        pane.wait_for(ready)
        time.sleep(1.0)
        seen = 0
        for _ in range(turns):
            turn, seen = take_turn(pane, seen)
            out.append(turn)
    return out


def chat_side_by_side(turns: int, turn_tokens: int) -> tuple[list[Turn], list[Turn]]:
    """Turns 1-4 of a new chat and turns `turns`-3..`turns` of a long one, alternated in
    two apps at once, so both sides see the same minutes of this VM's drifting speed."""
    short: list[Turn] = []
    long: list[Turn] = []
    with (
        fault_server_thread() as server,
        phasechat_in_tmux(server, f"fastend-{turn_tokens}", turn_tokens + 10) as a,
        phasechat_in_tmux(server, f"fastend-{turn_tokens}", turn_tokens + 10) as b,
    ):
        a.wait_for(ready)
        b.wait_for(ready)
        seen_b = 0
        for _ in range(turns - 4):  # the long chat's history, not measured
            _, seen_b = take_turn(b, seen_b)
        for _ in range(4):  # answers are numbered across both apps: the newest is the highest
            turn, seen = take_turn(a, seen_b)
            short.append(turn)
            turn, seen_b = take_turn(b, seen)
            long.append(turn)
    return short, long


def growth(early: list[Turn], late: list[Turn]) -> tuple[float, float]:
    """Mean wall time and app CPU of the `late` turns over the `early` ones."""
    ms = statistics.mean(t.ms for t in late) / statistics.mean(t.ms for t in early)
    return ms, statistics.mean(t.cpu_s for t in late) / statistics.mean(t.cpu_s for t in early)


def set_size(size: str) -> None:
    """The terminal's size for the panes made from now on ("120x40")."""
    global COLS, ROWS
    cols, _, rows = size.partition("x")
    COLS, ROWS = int(cols), int(rows)


def one_paragraph(tokens: int, runs: int) -> None:
    """The ingest row, its answer in one paragraph, `runs` times (with the load each)."""
    for run in range(1, runs + 1):
        load = os.getloadavg()[0]
        r = ingest(tokens, one_paragraph=True)
        keys = sorted(r.key_ms)
        over = sum(k > 100 for k in keys)
        print(
            f"run {run} at {COLS}x{ROWS} (load {load:.2f}): {tokens:,} max-rate tokens in one "
            f"paragraph, sent in {r.server_ms:.0f} ms; last token on screen "
            f"{r.last_token_after_ms:.0f} ms after the server's last byte (goal <= 1000); "
            + (
                f"{len(keys)} keys, p50 {statistics.median(keys):.0f} ms, max {keys[-1]:.0f} "
                f"ms, {over} over 100 (goal <= 100)"
                if keys
                else "no keys"
            )
        )
        sys.stdout.flush()


def main() -> None:
    # The app hanging up on a summary request it no longer needs is not news here.
    logging.getLogger("asyncio").setLevel(logging.ERROR)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=20000)
    parser.add_argument("--turns", type=int, default=16)
    parser.add_argument("--turn-tokens", type=int, default=2000)
    parser.add_argument(
        "--one-paragraph",
        action="store_true",
        help="only the max-rate answer, all in one paragraph, --runs times",
    )
    parser.add_argument("--runs", type=int, default=3, help="with --one-paragraph")
    parser.add_argument("--size", default=f"{COLS}x{ROWS}", help="the terminal, COLSxROWS")
    args = parser.parse_args()
    set_size(args.size)
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs")
    if args.one_paragraph:
        one_paragraph(args.tokens, args.runs)
        return
    starts = cold_starts(5)
    print(
        f"cold start: first frame after spawn, median {statistics.median(starts):.0f} ms "
        f"of {', '.join(f'{x:.0f}' for x in starts)} (goal <= 500)"
    )
    r = ingest(args.tokens)
    keys = sorted(r.key_ms)
    print(
        f"{args.tokens:,} max-rate tokens: the server sent them in {r.server_ms:.0f} ms; "
        f"last token on screen {r.last_token_after_ms:.0f} ms after its last byte (goal <= 1000)"
    )
    if keys:
        print(
            f"keys typed during the stream: {len(keys)}, on screen after p50 "
            f"{statistics.median(keys):.0f} ms, max {keys[-1]:.0f} ms (goal <= 100)"
        )
    turns = chat(args.turns, args.turn_tokens)
    print(f"\nchat of {args.turns} answers of {args.turn_tokens:,} max-rate tokens:")
    print("turn  Enter->last token (ms)  app CPU (s)  RSS (MB)")
    for i, t in enumerate(turns, 1):
        print(f"{i:>4}  {t.ms:>22.0f}  {t.cpu_s:>11.2f}  {t.rss_mb:>8.0f}")
    head, tail = turns[:4], turns[-4:]
    ms, cpu = growth(head, tail)
    print(
        f"last {len(tail)} turns vs turn 1: {tail[-1].ms / turns[0].ms:.2f}x; mean of the last "
        f"{len(tail)} vs the first {len(head)}: {ms:.2f}x wall, {cpu:.2f}x app CPU "
        f"(goal <= 1.2); RSS {turns[0].rss_mb:.0f} -> {turns[-1].rss_mb:.0f} MB"
    )
    short, long = chat_side_by_side(args.turns, args.turn_tokens)
    ms, cpu = growth(short, long)
    print(
        f"side by side, alternated in two apps: turns 1-4 of a new chat "
        f"{', '.join(f'{t.ms:.0f}' for t in short)} ms; turns {args.turns - 3}-{args.turns} "
        f"of a long one {', '.join(f'{t.ms:.0f}' for t in long)} ms: {ms:.2f}x wall, "
        f"{cpu:.2f}x app CPU (goal <= 1.2)"
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
