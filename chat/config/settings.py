"""The settings a user controls, and their bounds, in one place.

`Settings` is the engine section (`[engine]` in config.toml, the F4 form, the command
line); `TrimConfig` is the trimmer's (`[trim]`); `load_problems` bounds how a model is
loaded (`[[local]]`, an endpoint's `context`, `--n-ctx`, `--threads`, a compare side's
`local:threads=`). The config reader, the settings form, the command line and compare
all check values here, so a bound is written once.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace

from phasechat.backends.remote.wire_numbers import MAX_TOKENS

TEMPERATURE_MAX = 5.0
TRIM_BUDGET_MIN = 64
#: the smallest context a model is loaded with, or a server's window believed
N_CTX_MIN = 16
#: more layers than any model has (llama.cpp takes "all" as any count past the last)
GPU_LAYERS_MAX = 10_000
#: ggml's GGML_MAX_N_THREADS: llama.cpp does not run with more
GGML_MAX_THREADS = 512


def threads_max() -> int:
    """The most decode threads allowed: this machine's logical cores (more only wait for
    one another: 1,000 threads on 2 cores gave no token in a minute, and 100,000 crashed
    llama.cpp), and never past ggml's own limit."""
    return max(1, min(os.cpu_count() or 1, GGML_MAX_THREADS))


def load_problems(
    n_ctx: int | None = None,
    gpu_layers: int | None = None,
    threads: int | None = None,
    context: int | None = None,
) -> list[tuple[str, str]]:
    """(field, problem) for each way of loading a model that is out of bounds (None:
    not given); empty when all are fine."""
    out = []
    for key, value in (("n_ctx", n_ctx), ("context", context)):
        if value is not None and not N_CTX_MIN <= value <= MAX_TOKENS:
            out.append((key, f"expected {N_CTX_MIN} to {MAX_TOKENS:,} tokens"))
    if gpu_layers is not None and not -1 <= gpu_layers <= GPU_LAYERS_MAX:
        out.append(("gpu_layers", f"expected -1 (all) to {GPU_LAYERS_MAX:,}"))
    most = threads_max()
    if threads is not None and not 1 <= threads <= most:
        out.append(("threads", f"expected 1 to {most} (this machine's logical cores)"))
    return out


#: the largest seed: llama.cpp's are unsigned 32-bit (its 0xFFFFFFFF means "random")
SEED_MAX = 2**32 - 2


@dataclass(frozen=True, slots=True)
class Settings:
    """Engine parameters the user controls."""

    system: str = "You are a helpful assistant."
    max_tokens: int = 512
    temperature: float = 0.7
    stop: tuple[str, ...] = ()
    seed: int | None = None

    def problems(self) -> list[tuple[str, str]]:
        """(field, problem) for each value out of bounds; empty when all are fine."""
        out = []
        # NaN fails every comparison, so `not 0 <= nan <= 5` refuses it too
        if not 0 <= self.temperature <= TEMPERATURE_MAX:
            out.append(("temperature", f"expected 0 to {TEMPERATURE_MAX:g}"))
        if not 1 <= self.max_tokens <= MAX_TOKENS:
            out.append(("max_tokens", f"expected 1 to {MAX_TOKENS:,}"))
        if not all(self.stop):
            out.append(("stop", "expected non-empty strings"))
        if self.seed is not None and not 0 <= self.seed <= SEED_MAX:
            out.append(("seed", f"expected 0 to {SEED_MAX:,} (llama.cpp's seeds are 32-bit)"))
        return out


@dataclass(frozen=True, slots=True)
class TrimConfig:
    """`[trim]`: the history trimmer (see chat/trimmer.py)."""

    enabled: bool = True
    budget: int | None = None  # None: n_ctx - max_tokens - a margin
    keep_last: int = 4  # recent turns kept verbatim unless they alone exceed the goal
    summarizer: str | None = None  # a backend profile's name; None: the active backend

    def problems(self) -> list[tuple[str, str]]:
        """(field, problem) for each value out of bounds; empty when all are fine."""
        out = []
        if self.budget is not None and self.budget < TRIM_BUDGET_MIN:
            out.append(("budget", f"expected at least {TRIM_BUDGET_MIN} tokens"))
        if self.keep_last < 0:
            out.append(("keep_last", "expected 0 or more"))
        return out


def _first_problem(problems: list[tuple[str, str]]) -> None:
    if problems:
        key, problem = problems[0]
        raise ValueError(f"{key}: {problem}")


def parse_settings(
    base: Settings, system: str, temperature: str, max_tokens: str, stop: str
) -> Settings:
    """`base` with the form's text applied; ValueError names the field that is wrong."""
    try:
        temp = float(temperature)
    except ValueError:
        raise ValueError(f"temperature: expected a number, got {temperature!r}") from None
    try:
        tokens = int(max_tokens)
    except ValueError:
        raise ValueError(f"max_tokens: expected a whole number, got {max_tokens!r}") from None
    try:
        stops = json.loads(stop) if stop.strip() else []
    except ValueError:
        raise ValueError('stop: expected a JSON list of strings, e.g. ["\\n\\n"]') from None
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise ValueError("stop: expected a JSON list of non-empty strings")
    settings = replace(base, system=system, max_tokens=tokens, temperature=temp, stop=tuple(stops))
    _first_problem(settings.problems())
    return settings


def parse_trim(enabled: bool, budget: str, keep_last: str, summarizer: str | None) -> TrimConfig:
    """Trimmer settings from the form's text; ValueError names the field that is wrong."""
    value: int | None = None
    if budget.strip():
        try:
            value = int(budget)
        except ValueError:
            raise ValueError(f"budget: expected a whole number or blank, got {budget!r}") from None
    try:
        keep = int(keep_last)
    except ValueError:
        raise ValueError(f"keep_last: expected a whole number, got {keep_last!r}") from None
    trim = TrimConfig(enabled, value, keep, summarizer)
    _first_problem(trim.problems())
    return trim
