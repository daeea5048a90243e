"""The settings a user controls, and their bounds, in one place.

`Settings` is the engine section (`[engine]` in config.toml, the F4 form, the command
line); `TrimConfig` is the trimmer's (`[trim]`). The config reader and the settings form
both check values here, so a bound is written once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

TEMPERATURE_MAX = 5.0
TRIM_BUDGET_MIN = 64


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
        if not 0 <= self.temperature <= TEMPERATURE_MAX:
            out.append(("temperature", f"expected 0 to {TEMPERATURE_MAX:g}"))
        if self.max_tokens < 1:
            out.append(("max_tokens", "expected 1 or more"))
        if not all(self.stop):
            out.append(("stop", "expected non-empty strings"))
        return out


@dataclass(frozen=True, slots=True)
class TrimConfig:
    """`[trim]`: the history trimmer (see chat/trimmer.py)."""

    enabled: bool = True
    budget: int | None = None  # None: n_ctx - max_tokens - a margin
    keep_last: int = 4  # recent turns always sent verbatim
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
