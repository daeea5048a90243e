"""The decode thread policy (backends/local/threads.py), fed synthetic gap series.

Each series is what the llama thread would see: the gap between two tokens depends on
the thread count and on whether a busy neighbour shares the cores. Two cores, numbers
shaped like bench/contention.py's: quiet, 2 threads 7 ms and 1 thread 9 ms a token;
with one busy neighbour, 2 threads 22 ms (the spinning barrier) and 1 thread 9.5 ms.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from phasechat.backends.local.threads import EARLY, Change, ThreadPolicy

MS = 1_000_000
QUIET = {2: 7.0, 1: 9.0}
BUSY = {2: 22.0, 1: 9.5}


def run(
    policy: ThreadPolicy, gaps_ms: Callable[[int], float], tokens: int, seed: int = 1
) -> tuple[list[int], list[Change]]:
    """Feed `tokens` gaps, each drawn for the policy's current thread count (with +-10%
    jitter and an occasional preempted token 5x long); returns the count after each
    token and the changes made."""
    rng = random.Random(seed)
    counts: list[int] = []
    changes: list[Change] = []
    for _ in range(tokens):
        gap = gaps_ms(policy.threads) * rng.uniform(0.9, 1.1)
        if rng.random() < 0.03:
            gap *= 5
        change = policy.observe(int(gap * MS))
        if change is not None:
            assert change.threads == policy.threads
            changes.append(change)
        counts.append(policy.threads)
    return counts, changes


def share(counts: list[int], threads: int) -> float:
    return sum(1 for c in counts if c == threads) / len(counts)


def test_quiet_machine_stays_at_all_cores() -> None:
    policy = ThreadPolicy(max_threads=2)
    counts, changes = run(policy, lambda n: QUIET[n], 3000)
    assert counts[-1] == 2
    # Probes downward cost a window each, and lose: never more than 3% of the tokens.
    assert share(counts, 2) > 0.97
    assert all(c.threads == 2 for c in changes if c.reason.startswith("back to"))


def test_a_busy_neighbour_arriving_mid_answer_drops_a_thread_within_two_windows() -> None:
    policy = ThreadPolicy(max_threads=2)
    counts, _ = run(policy, lambda n: QUIET[n], 200)
    assert counts[-1] == 2
    counts, changes = run(policy, lambda n: BUSY[n], 1000, seed=2)
    first_one = counts.index(1)
    assert first_one < 2 * policy.window
    assert "best" in changes[0].reason
    # ... and stays there: probes upward lose and back off.
    assert share(counts[first_one:], 1) > 0.9
    assert counts[-1] == 1


def test_contention_from_the_start_is_found_by_the_downward_probe() -> None:
    policy = ThreadPolicy(max_threads=2)
    counts, changes = run(policy, lambda n: BUSY[n], 2000)
    assert counts[-1] == 1
    assert share(counts[policy.probe_every + 2 * policy.window :], 1) > 0.9
    assert any("faster" in c.reason for c in changes)


def test_comes_back_to_all_cores_when_the_neighbour_leaves() -> None:
    policy = ThreadPolicy(max_threads=2)
    run(policy, lambda n: BUSY[n], 3000)  # long enough for the probe interval to back off
    assert policy.threads == 1
    counts, _ = run(policy, lambda n: QUIET[n], 3000, seed=3)
    back = counts.index(2)
    assert back <= policy.max_probe + policy.window
    assert share(counts[back:], 2) > 0.97
    assert counts[-1] == 2


def test_noise_alone_does_not_flap() -> None:
    """Equal speed at both counts (a memory-bound model): it keeps what it has, and its
    probes become rarer as they keep losing."""
    policy = ThreadPolicy(max_threads=2)
    _, changes = run(policy, lambda n: 8.0, 20_000)
    # Every probe is a pair of changes (try, back); backed off to one per max_probe.
    assert len(changes) <= 2 * (20_000 // policy.max_probe + 6)
    late = [c for c in changes if c.reason.startswith("trying")]
    assert len(late) >= 2  # but it never stops checking


def test_one_core_never_changes() -> None:
    single = ThreadPolicy(max_threads=1)
    counts, changes = run(single, lambda n: BUSY[min(n, 2)], 3000)
    assert changes == [] and set(counts) == {1}


def test_more_cores_step_down_one_at_a_time() -> None:
    """Four cores, two of them taken by neighbours: each thread above two doubles the gap."""
    gaps = {4: 30.0, 3: 20.0, 2: 8.0, 1: 12.0}
    policy = ThreadPolicy(max_threads=4)
    run(policy, lambda n: 7.0 if n == 4 else 9.0, 100)
    counts, changes = run(policy, lambda n: gaps[n], 4000)
    assert counts[-1] == 2
    # A trial that wins is confirmed with the same count (a new reason, no change).
    steps = [c.threads for c in changes]
    assert all(abs(a - b) <= 1 for a, b in zip([4, *steps], steps, strict=False))
    assert {c.threads for c in changes} == {1, 2, 3, 4}


def test_a_badly_contended_machine_is_judged_in_a_few_tokens() -> None:
    """A build on both cores: 300 ms a token at 2 threads, 20 ms at 1. The policy does
    not wait for 16 such tokens (5 s) before it acts, and probes back up cost little."""
    policy = ThreadPolicy(max_threads=2)
    run(policy, lambda n: QUIET[n], 100)
    counts, _ = run(policy, lambda n: {2: 300.0, 1: 20.0}[n], 2000)
    assert counts.index(1) <= 2 * EARLY
    # Time spent at 2 threads (probes that lose) stays a small share of the total.
    at_two = sum(300.0 for c in counts if c == 2)
    assert at_two / (at_two + sum(20.0 for c in counts if c == 1)) < 0.1


def test_the_idle_share_counts_other_processes_not_this_one() -> None:
    """A busy child takes a CPU from what is idle; a span under 0.3 s says nothing."""
    import os
    import subprocess
    import sys
    import time

    from phasechat.backends.local.threads import CpuShare

    cpus = len(os.sched_getaffinity(0))
    share = CpuShare()
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.6)
        busy_beside = share.idle_share()
    finally:
        child.kill()
        child.wait()
    assert busy_beside is not None
    assert busy_beside <= (cpus - 1) / cpus + 0.1
    assert share.idle_share() is None  # too short a span since the last call


def test_an_answer_starts_on_the_cores_others_left_idle() -> None:
    policy = ThreadPolicy(max_threads=2)
    assert policy.begin(None) is None and policy.threads == 2  # unknown: as it was
    change = policy.begin(0.8)  # a neighbour kept one core and a bit busy
    assert change is not None and change.threads == policy.threads == 1
    assert "0.8 cores free" in change.reason
    assert policy.begin(0.9) is None  # still one
    back = policy.begin(1.9)
    assert back is not None and back.threads == 2
    # Whatever the start, the gaps still decide: a neighbour that left during the
    # answer is found by the probe upward.
    policy.begin(0.2)
    counts, _ = run(policy, lambda n: QUIET[n], 600)
    assert counts[0] == 1 and counts[-1] == 2
    assert counts.index(2) <= policy.window  # tried after the answer's first window


def test_an_answer_s_busy_cpus_are_the_others_work_from_its_begin_to_its_end() -> None:
    """The figure the verdict weighs (issue 48): busy CPU time of the CPUs less this
    process's own, over the answer alone (fixed threads too), in CPUs' worth; None for a
    span too short to tell. Samples are (wall s, busy s of our CPUs, our CPU s)."""
    from phasechat.backends.events import CpuBusy
    from phasechat.backends.local.threads import CpuShare, DecodeThreads

    class Scripted(CpuShare):
        def __init__(self, samples: list[tuple[float, float, float]]) -> None:
            self.samples = samples
            super().__init__()
            self._cpus = {"cpu0", "cpu1"}

        def _sample(self) -> tuple[float, float, float] | None:
            return self.samples.pop(0)

    # made at 0; the answer from 5 s to 6 s: 2.2 s of busy CPU time, 0.6 s of it ours
    cpu = Scripted([(0.0, 0.0, 0.0), (5.0, 10.0, 1.0), (6.0, 12.2, 1.6)])
    threads = DecodeThreads(2, adaptive=False, apply=lambda n: None, cpu=cpu)
    threads.begin()
    assert threads.end() == CpuBusy(1.6, 2)
    # more than all the CPUs (ticks counted late) is all of them; 0.2 s is too short
    cpu = Scripted([(0.0, 0.0, 0.0), (1.0, 0.0, 0.0), (2.0, 3.0, 0.1), (2.2, 3.1, 0.1)])
    threads = DecodeThreads(2, adaptive=True, apply=lambda n: None, cpu=cpu)
    threads.begin()
    assert threads.end() == CpuBusy(2.0, 2)
    assert threads.end() is None
