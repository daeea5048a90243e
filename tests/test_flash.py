"""Flash attention chosen by measurement on the real model, and cached (backends/local/flash.py)."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from phasechat.backends.local import flash, flash_cache


@pytest.mark.model
def test_measured_once_then_cached_per_model_build_and_threads(
    model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert flash.cache_file().is_relative_to(tmp_path)
    assert flash.cached(model_path, 1) is None

    def quiet(model: Path, threads: int) -> flash.Measured:
        """The real measurement, read as if nothing ran beside it (this test checks the
        caching; the load reading is faked in the tests below)."""
        return replace(flash.measure_model(model, threads), others=0.0)

    first, notice = flash.choose(model_path, 1, quiet)
    assert notice is None
    assert not first.cached and first.on_ms > 0 and first.off_ms > 0
    # The rule: on (llama.cpp's own choice) unless off measured at least MARGIN faster.
    if not first.flash_attn:
        assert first.off_ms < first.on_ms * (1 - flash.MARGIN)
    again, _ = flash.choose(model_path, 1, lambda m, t: pytest.fail("measured again"))
    assert again.cached and again.flash_attn == first.flash_attn
    assert again.on_ms == first.on_ms
    assert "measurement" in again.summary and "measured at load" in first.summary
    assert flash.cached(model_path, 2) is None  # another thread count: not measured yet
    (key,) = json.loads(flash.cache_file().read_text())
    assert str(model_path.resolve()) in key and key.endswith("|1")


@pytest.mark.model
def test_a_setting_or_a_gpu_skips_the_measurement(
    model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert flash.decide(False, False, model_path, 2) == flash.Decision(
        False, "flash attention off (set)"
    )
    assert flash.decide(None, True, model_path, 2).flash_attn is True
    assert not flash.cache_file().exists()


def test_a_changed_model_file_is_measured_again(tmp_path: Path) -> None:
    """The key follows the file: the same path rewritten (another size or mtime) is a
    new model as far as the cache is concerned."""
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF" * 10)
    key = flash.cache_key(model, 1)
    assert flash.cache_key(model, 1) == key
    os.utime(model, ns=(1, 1))
    touched = flash.cache_key(model, 1)
    model.write_bytes(b"GGUF" * 11)
    os.utime(model, ns=(1, 1))
    assert len({key, touched, flash.cache_key(model, 1)}) == 3


def test_the_measurement_is_the_median_step_and_the_rounds_off_won() -> None:
    """Step timers that return set times, as a fake clock: on takes 10, 10, 10, 16 ms over
    and over (median 10, mean 11.5); off takes 9 ms for three rounds, then 20 ms for one
    (median 9, mean 11.75, faster in 3 of the 4 rounds)."""
    assert (flash.ROUNDS, flash.STEPS) == (4, 16)
    on_times = iter([10.0, 10.0, 10.0, 16.0] * 16)
    off_times = iter([9.0] * 48 + [20.0] * 16)
    on_ms, off_ms, off_wins = flash.measure(lambda: next(on_times), lambda: next(off_times))
    assert (on_ms, off_ms, off_wins) == (10.0, 9.0, 3)


def test_a_busy_machine_ends_the_measurement_after_its_budget() -> None:
    """Steps of 400 ms on and 300 off (a machine at load 7 took 173-277): 4 steps on
    (1,600 ms: with as long again off, 3,200 would pass the 3,000 ms budget), then 4 off
    (2,800 ms in all); a second round of 4 a side (2,800 more) would pass it: 8 steps,
    not 128 (45 s). Off measured faster, but in 1 round of the 3 that choosing it needs."""
    calls = {"on": 0, "off": 0}

    def on() -> float:
        calls["on"] += 1
        return 400.0

    def off() -> float:
        calls["off"] += 1
        return 300.0

    assert (flash.BUDGET_MS, flash.MIN_EACH) == (3000.0, 4)
    assert flash.measure(on, off) == (400.0, 300.0, 1)
    assert calls == {"on": 4, "off": 4}
    # on at 150 ms: 11 steps (2 x 1,650 passes 3,000), then as many off, never 16
    # against 11; at 8 ms a step (a quiet machine) all 4 rounds of 16 are taken
    on_times, off_times = iter([150.0] * 64), iter([400.0] * 64)
    assert flash.measure(lambda: next(on_times), lambda: next(off_times)) == (150.0, 400.0, 0)
    assert (len(list(on_times)), len(list(off_times))) == (64 - 11, 64 - 11)
    on_times, off_times = iter([8.0] * 64), iter([9.0] * 64)
    assert flash.measure(lambda: next(on_times), lambda: next(off_times)) == (8.0, 9.0, 0)
    assert (list(on_times), list(off_times)) == ([], [])


def test_a_cached_choice_comes_back_with_its_own_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF" * 10)
    choice = flash.FlashChoice(False, 10.25, 9.5, "2026-01-02T03:04:05Z", others=0.0)
    flash_cache.store(flash.cache_key(model, 2), choice)
    assert flash.cached(model, 2) == flash.FlashChoice(
        False, 10.25, 9.5, "2026-01-02T03:04:05Z", cached=True, others=0.0
    )
    assert flash.cached(model, 1) is None
