"""How many threads llama.cpp decodes with, adapted between tokens.

ggml's workers meet at a barrier after nearly every operation of a forward pass, and
with OpenMP that barrier spins. With as many threads as cores, one busy neighbour
process takes a core's time slices from one worker, and the other spins at the barrier
until the kernel gives them back. Issue 13 measured, on a 2-core Intel Xeon beside one
busy process, 44.8 tok/s at 2 threads and 114.5 at 1 (bench/contention.py re-measures).

`ThreadPolicy` reads only the gaps between tokens (the llama thread's own stamps), so it
is a pure function of a gap series and can be tested with synthetic ones:

- every `window` gaps it takes their median (sooner, after at least `EARLY` gaps, when
  they already took longer than a whole slow window would);
- a median `slow_factor` times the best recent one at this thread count means the cores
  are contended: it tries one thread fewer at once;
- every `probe_every` tokens (doubling after each probe that loses, up to `max_probe`)
  it tries a neighbouring count for one window: upward, so it comes back when the
  neighbour leaves, and downward, for contention that was there from the start;
- a tried count is kept only if its median beats the count it left by `margin`, so
  noise does not make it flap.

The decision is applied with `llama_set_n_threads` between two decodes (local.py); it
does not change the greedy output (ggml splits rows between threads, never a sum).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from phasechat.backends.events import CpuBusy, EngineThreads

#: gaps per judgement; the median of 16 ignores a few preempted tokens
WINDOW = 16
#: gaps enough to judge a window early, once it has taken longer than a whole one should
EARLY = 2


@dataclass(frozen=True, slots=True)
class Change:
    """The policy moved to `threads`; `reason` says why, in a few words."""

    threads: int
    reason: str


@dataclass
class ThreadPolicy:
    """Chooses the decode thread count from the inter-token gaps. One per backend: what
    it learned (the best gap at each count, the probe back-off) carries over requests."""

    max_threads: int
    threads: int = 0  # current; 0: start at max_threads
    min_threads: int = 1
    window: int = WINDOW
    slow_factor: float = 1.6
    margin: float = 0.08
    probe_every: int = 256
    max_probe: int = 1024
    #: how many windows a count's best median is remembered (the KV cache grows and
    #: the machine changes: an old best would make every later window look slow)
    memory: int = 12
    _gaps: list[int] = field(default_factory=list)
    _recent: dict[int, list[float]] = field(default_factory=dict)
    _since_probe: int = 0
    _interval: dict[int, int] = field(default_factory=dict)  # per direction: +1 / -1
    _trial: tuple[int, float] | None = None  # (count we left, its median) while probing

    def __post_init__(self) -> None:
        self.max_threads = max(1, self.max_threads)
        self.min_threads = min(max(1, self.min_threads), self.max_threads)
        if not self.min_threads <= self.threads <= self.max_threads:
            self.threads = self.max_threads
        # Nothing known yet: the first window is followed at once by one with a thread
        # fewer, so contention that was there before the first token is found in two
        # windows, not after `probe_every` tokens (a one-shot `ask` has no history).
        self._interval.setdefault(-1, self.window)

    def observe(self, gap_ns: int) -> Change | None:
        """One gap between two tokens; a `Change` when the thread count should change now."""
        self._gaps.append(gap_ns)
        self._since_probe += 1
        if len(self._gaps) < self.window and not self._overdue():
            return None
        gaps, self._gaps = sorted(self._gaps), []
        median = gaps[len(gaps) // 2] / 1e6
        if self._trial is not None:
            return self._judge_trial(median)
        recent = self._recent.setdefault(self.threads, [])
        best = min(recent) if recent else None
        recent.append(median)
        del recent[: -self.memory]
        slow = best is not None and median > self.slow_factor * best
        if slow and best is not None and self.threads > self.min_threads:
            ratio = median / best
            return self._try(self.threads - 1, median, f"gaps {ratio:.1f}x this count's best")
        due = self._since_probe >= self._interval.get(+1, self.probe_every)
        if due and self.threads < self.max_threads:
            return self._try(self.threads + 1, median, "probe: one thread more")
        due = self._since_probe >= self._interval.get(-1, self.probe_every)
        if due and self.threads > self.min_threads:
            return self._try(self.threads - 1, median, "probe: one thread fewer")
        return None

    def _overdue(self) -> bool:
        """Whether a short window already took longer than a whole window should: on a
        badly contended machine a token can take 300 ms, and 16 of them would be 5 s."""
        if len(self._gaps) < EARLY:
            return False
        if self._trial is not None:
            expected = self._trial[1]  # a trial that is no faster than what it left
        else:
            recent = self._recent.get(self.threads)
            if not recent:
                return False
            expected = self.slow_factor * min(recent)
        return sum(self._gaps) > self.window * expected * 1e6

    def _try(self, threads: int, median: float, reason: str) -> Change:
        self._trial = (self.threads, median)
        self.threads = threads
        self._since_probe = 0
        return Change(threads, f"trying {threads}: {reason}")

    def _judge_trial(self, median: float) -> Change | None:
        assert self._trial is not None
        left, before = self._trial
        self._trial = None
        step = +1 if self.threads > left else -1
        tried = self.threads
        if median < before * (1 - self.margin):
            self._interval[step] = self.probe_every  # a win: probe this way again soon
            self._interval[-step] = self.probe_every
            self._recent[tried] = [median]
            speed = before / median
            return Change(tried, f"{tried} {_threads(tried)} {speed:.2f}x faster than {left}")
        longer = max(self.probe_every, 2 * self._interval.get(step, self.probe_every))
        self._interval[step] = min(self.max_probe, longer)
        self.threads = left
        self._recent[left] = [before]  # the count we come back to: its last known median
        return Change(left, f"back to {left}: {tried} was not faster")

    def begin(self, free_cores: float | None = None) -> Change | None:
        """A new answer: its first gaps are not compared with the last answer's tail.
        `free_cores`: the cores other processes left idle since the last answer (None:
        unknown); the count starts there, and the gaps correct it."""
        self._gaps.clear()
        self._interval[+1] = self.probe_every
        change = None
        if free_cores is not None and self._trial is None:
            # Measured cores make the quick first probe downward unneeded.
            self._interval[-1] = max(self._interval[-1], self.probe_every)
            fit = min(self.max_threads, max(self.min_threads, int(free_cores + 0.5)))
            if fit != self.threads:
                self.threads = fit
                change = Change(fit, f"{free_cores:.1f} cores free: other processes use the rest")
        if self.threads < self.max_threads:
            # Below the maximum, an answer tries one more after its first window: the
            # neighbour may have left since, and one window is all it costs if not.
            self._since_probe = max(self._since_probe, self.probe_every)
        return change

    @property
    def probing(self) -> bool:
        """Whether the current count is on trial (for tests and the bench)."""
        return self._trial is not None


def _threads(n: int) -> str:
    return "thread" if n == 1 else "threads"


class DecodeThreads:
    """The backend's thread count: fixed (`--threads N`) or adaptive (the default), and
    the events that report it. `apply(n)` sets it on the llama.cpp context."""

    def __init__(
        self,
        threads: int,
        adaptive: bool,
        apply: Callable[[int], None],
        cpu: CpuShare | None = None,
    ) -> None:
        self.max_threads = threads
        self.policy = ThreadPolicy(threads) if adaptive and threads > 1 else None
        self._apply = apply
        self._cpu = cpu or CpuShare()
        self._reason = (
            f"adaptive, up to {threads} (physical cores)" if self.policy else "fixed (--threads)"
        )

    @classmethod
    def on_context(cls, ctx: Any, threads: int, adaptive: bool, cpu: CpuShare) -> DecodeThreads:
        """For a llama.cpp context: a change sets its decode and batch threads. `cpu`:
        sampled since the load began, so the first answer knows how busy the cores are."""
        import llama_cpp

        def apply(n: int) -> None:
            llama_cpp.llama_set_n_threads(ctx, n, n)

        return cls(threads, adaptive, apply, cpu)

    @property
    def current(self) -> int:
        return self.policy.threads if self.policy else self.max_threads

    @property
    def adaptive(self) -> bool:
        return self.policy is not None

    def begin(self) -> EngineThreads:
        """The event that opens an answer: the count it starts with, and why. From here
        to `end`, the others' use of the CPUs is measured (the answer's `CpuBusy`)."""
        idle = self._cpu.idle_share()
        if self.policy is not None:
            change = self.policy.begin(None if idle is None else idle * self.max_threads)
            if change is not None:
                self._apply(change.threads)
                self._reason = change.reason
        return EngineThreads(self.current, self.max_threads, self._reason, 0)

    def end(self) -> CpuBusy | None:
        """An answer ended: how busy the others kept the CPUs since `begin` (None: a span
        too short to tell). The next one's idle share counts from here, so it measures
        the others while this process is idle."""
        others = self._cpu.others()
        return None if others is None else CpuBusy(round(others, 2), self._cpu.cpus)

    def gap(self, gap_ns: int, at_token: int) -> EngineThreads | None:
        """One inter-token gap; an event (and the new count applied) when it changes."""
        if self.policy is None:
            return None
        change = self.policy.observe(gap_ns)
        if change is None:
            return None
        self._apply(change.threads)
        self._reason = change.reason
        return EngineThreads(change.threads, self.max_threads, change.reason, at_token)


class CpuShare:
    """How much of this process's CPUs other processes left idle since the last call,
    from /proc/stat (the busy time of the CPUs this process may run on) minus this
    process's own CPU time: a build, a browser or a test run beside the chat."""

    MIN_S = 0.3  # /proc/stat counts 10 ms ticks: shorter spans say nothing

    def __init__(self) -> None:
        try:
            self._cpus = {f"cpu{n}" for n in os.sched_getaffinity(0)}
        except AttributeError:  # pragma: no cover - not Linux
            self._cpus = set()
        self._last = self._sample()

    def _sample(self) -> tuple[float, float, float] | None:
        """(wall s, busy s of our CPUs, this process's CPU s); None off Linux."""
        busy = 0
        try:
            with open("/proc/stat", encoding="ascii") as f:
                for line in f:
                    name, _, rest = line.partition(" ")
                    if name in self._cpus:
                        ticks = [int(v) for v in rest.split()[:8]]
                        busy += sum(ticks) - ticks[3] - ticks[4]  # all but idle, iowait
        except (OSError, ValueError, IndexError):
            return None
        if not self._cpus:
            return None
        return time.monotonic(), busy / os.sysconf("SC_CLK_TCK"), time.process_time()

    @property
    def cpus(self) -> int:
        """How many CPUs this process may run on (0: unknown)."""
        return len(self._cpus)

    def others(self) -> float | None:
        """The CPUs' worth of work others did on our CPUs, on average since the last
        call to this or `idle_share` (None: unknown, or too short a span to say)."""
        now, last = self._sample(), self._last
        if now is None or last is None or now[0] - last[0] < self.MIN_S:
            return None
        self._last = now
        busy = max(0.0, (now[1] - last[1]) - (now[2] - last[2])) / (now[0] - last[0])
        return min(busy, float(len(self._cpus)))

    def idle_share(self) -> float | None:
        """The share (0-1) of our CPUs that others left idle, on average since the last
        call (None: unknown, or too short a span to say)."""
        others = self.others()
        return None if others is None else max(0.0, 1.0 - others / len(self._cpus))
