"""The flash-attention choice on disk is a claim, checked before it is believed
(backends/local/flash.py, backends/local/flash_cache.py): a busy measurement is not kept, a tampered
entry is ignored with a notice naming the file, and a choice the answers disagree with
is measured again. Fake measurements with set figures and load readings: no timing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phasechat.backends.events import GenerationRequest, Message, Notice
from phasechat.backends.local import flash, flash_cache
from phasechat.backends.local.backend import LocalBackend, LocalConfig
from phasechat.backends.local.flash import FlashChoice, Measured
from phasechat.backends.local.measured import write_entries

STAMP = "2026-01-02T03:04:05Z"


@pytest.fixture
def model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in model file (the key follows its path, size and mtime), in a cache
    directory of its own, with no measurement left from another test."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF" * 10)
    return path


class Fake:
    """A measurement that returns set figures and counts its calls."""

    def __init__(self, *seen: Measured) -> None:
        self.seen = list(seen)
        self.calls = 0

    def __call__(self, model: Path, threads: int) -> Measured:
        self.calls += 1
        return self.seen.pop(0)


QUIET_ON = Measured(on_ms=10.0, off_ms=12.0, off_wins=0, others=0.02)


def entries() -> dict[str, dict[str, object]]:
    data: dict[str, dict[str, object]] = json.loads(flash.cache_file().read_text())
    return data


def test_a_busy_measurement_is_provisional_and_measured_again_when_quiet(model: Path) -> None:
    """The defect: beside a compiler, on 62 ms and off 49 ms a step chose off, for good.
    Others using 60% of the CPUs: kept as provisional (labelled), used while the machine
    stays busy (not measured at every load), measured again by the first quiet load,
    and never written over a quiet measurement."""
    key = flash.cache_key(model, 2)
    busy = Fake(Measured(on_ms=62.0, off_ms=49.0, off_wins=4, others=0.6))
    choice, notice = flash.choose(model, 2, busy, quiet=lambda: False)
    assert (choice.flash_attn, choice.busy, notice) == (False, True, None)
    said = "other processes used 60% of the CPUs: provisional, measured again when quiet"
    assert said in choice.summary
    assert entries()[key]["others"] == 0.6
    again, _ = flash.choose(model, 2, Fake(), quiet=lambda: False)  # still busy
    assert (again.flash_attn, again.busy, again.cached) == (False, True, True)
    quiet = Fake(QUIET_ON)
    later, _ = flash.choose(model, 2, quiet, quiet=lambda: True)
    assert (later.flash_attn, later.busy, quiet.calls) == (True, False, 1)
    assert entries()[key]["others"] == 0.02
    flash_cache.store(key, FlashChoice(False, 62.0, 49.0, STAMP, others=0.9))
    assert entries()[key]["others"] == 0.02  # contention does not replace the fact
    kept, _ = flash.choose(model, 2, Fake(), quiet=lambda: False)
    assert kept.cached and kept.flash_attn and not kept.busy


class Share:
    def __init__(self, idle: float | None) -> None:
        self.idle = idle

    def idle_share(self) -> float | None:
        return self.idle


@pytest.mark.parametrize(
    ("idle", "quiet"), [(0.9, True), (0.76, True), (0.7, False), (None, False)]
)
def test_quiet_now_is_others_below_the_busy_share(idle: float | None, quiet: bool) -> None:
    assert flash.quiet_now(lambda: Share(idle)) is quiet  # type: ignore[arg-type,return-value]


GOOD = {"flash_attn": False, "on_ms": 12.0, "off_ms": 10.0, "measured_at": STAMP, "others": 0.0}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("off_ms", 0),  # was: "float division by zero", the model failed to load
        ("off_ms", -5),
        ("on_ms", float("nan")),
        ("on_ms", 1e308),
        ("off_ms", "fast"),
        ("measured_at", 12345),  # was: "'int' object is not subscriptable"
        ("measured_at", "yesterday"),
        ("flash_attn", "no"),
        ("others", 7),
        ("on_ms", 9.0),  # off chosen, though on measured faster
    ],
)
def test_a_tampered_entry_is_ignored_with_a_notice_naming_the_file(
    model: Path, field: str, value: object
) -> None:
    key = flash.cache_key(model, 2)
    flash.cache_file().parent.mkdir(parents=True)
    flash.cache_file().write_text(json.dumps({key: {**GOOD, field: value}}))
    fake = Fake(QUIET_ON)
    choice, notice = flash.choose(model, 2, fake)
    assert fake.calls == 1 and not choice.cached  # measured again
    assert notice is not None and str(flash.cache_file()) in notice and field in notice
    assert notice.startswith("ignored ") and "measured again" in notice
    assert entries()[key]["on_ms"] == 10.0  # and the entry replaced


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("[1, 2]", "a JSON list"),
        ('{"a": {"flash_attn": tr', "not JSON"),
        ("null", "a JSON NoneType"),
        ("\udcff", "not JSON"),
    ],
)
def test_a_damaged_file_is_ignored_with_a_notice_naming_it(
    model: Path, text: str, why: str
) -> None:
    flash.cache_file().parent.mkdir(parents=True)
    flash.cache_file().write_text(text, errors="surrogateescape")
    _, notice = flash.choose(model, 2, Fake(QUIET_ON))
    assert notice is not None and str(flash.cache_file()) in notice and why in notice
    assert list(entries()) == [flash.cache_key(model, 2)]  # the file written anew


def test_an_entry_from_before_the_share_was_noted_is_measured_again_silently(
    model: Path,
) -> None:
    """The entry this machine held (on 62, off 49, no load noted): not damaged, only not
    trusted: measured once more, no notice."""
    key = flash.cache_key(model, 2)
    legacy = {"flash_attn": False, "on_ms": 62.0, "off_ms": 49.0, "measured_at": STAMP}
    write_entries(flash.cache_file(), {key: legacy, "other|key": {"x": 1}})
    fake = Fake(QUIET_ON)
    choice, notice = flash.choose(model, 2, fake)
    assert (choice.flash_attn, notice, fake.calls) == (True, None, 1)
    assert entries()["other|key"] == {"x": 1}  # other models' entries are left alone


def test_a_choice_the_answers_disagree_with_is_marked_stale_and_measured_again(
    model: Path,
) -> None:
    """Kept: off at 49 ms a step. An answer that decodes at 11.5 ms a token (more than
    `DISAGREE` = 1.5 times faster) marks it stale; the next load measures again."""
    assert flash.DISAGREE == 1.5 and flash.MIN_STEPS == 16
    key = flash.cache_key(model, 2)
    kept = FlashChoice(False, 62.0, 49.0, STAMP, others=0.1)
    flash_cache.store(key, kept)
    choice, _ = flash.choose(model, 2, Fake())
    assert choice.cached and choice.ms == 49.0
    assert flash.recheck(model, 2, choice, decode_ms=40.0, steps=64) is None  # within 1.5x
    assert flash.recheck(model, 2, choice, decode_ms=90.0, steps=64) is None  # slower: busy now
    assert flash.recheck(model, 2, choice, decode_ms=11.5, steps=8) is None  # too few steps
    unkept = FlashChoice(False, 62.0, 49.0, STAMP, others=0.6)  # measured again anyway
    assert flash.recheck(model, 2, unkept, decode_ms=11.5, steps=64) is None
    assert flash.cached(model, 2) is not None
    line = flash.recheck(model, 2, choice, decode_ms=11.5, steps=64)
    assert line is not None and "11.5 ms" in line and "49.0 ms" in line
    assert str(flash.cache_file()) in line
    assert entries()[key]["stale"] is True and flash.cached(model, 2) is None
    fake = Fake(QUIET_ON)
    again, notice = flash.choose(model, 2, fake)
    assert (fake.calls, again.flash_attn, notice) == (1, True, None)
    assert "stale" not in entries()[key]


@pytest.mark.model
async def test_the_model_loads_beside_a_tampered_entry_and_says_so(
    model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`off_ms: 0` made the local model fail to load ("float division by zero"). Now it
    loads, measures again, and its first answer carries the notice naming the file."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    key = flash.cache_key(model_path, 1)
    write_entries(flash.cache_file(), {key: {**GOOD, "off_ms": 0}})
    backend = LocalBackend(LocalConfig(model_path=model_path, n_ctx=512, threads=1))
    try:
        await backend.start()
        assert backend.state == "ready", backend.state_detail
        request = GenerationRequest((Message("user", "Hi"),), max_tokens=2, temperature=0.0)
        events = [e async for e in backend.stream(request)]
    finally:
        await backend.aclose()
    notices = [e.text for e in events if isinstance(e, Notice)]
    assert notices and str(flash.cache_file()) in notices[0] and "off_ms 0" in notices[0]


@pytest.mark.model
async def test_an_answer_far_faster_than_the_kept_choice_marks_it_stale(
    model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kept choice claiming 1,000 ms a step (no real decode of this model takes 667):
    the first answer of at least `MIN_STEPS` tokens says so, and marks the entry stale."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    key = flash.cache_key(model_path, 1)
    slow = {**GOOD, "flash_attn": True, "on_ms": 1000.0, "off_ms": 1100.0}
    write_entries(flash.cache_file(), {key: slow})
    backend = LocalBackend(LocalConfig(model_path=model_path, n_ctx=512, threads=1))
    try:
        await backend.start()
        assert "cached measurement" in backend.state_detail
        ask = Message("user", "Count from 1 to 40, separated by commas.")
        request = GenerationRequest((ask,), max_tokens=40, temperature=0.0)
        events = [e async for e in backend.stream(request)]
    finally:
        await backend.aclose()
    notices = [e.text for e in events if isinstance(e, Notice)]
    assert len(notices) == 1 and "1000.0 ms" in notices[0] and "next load" in notices[0]
    assert entries()[key]["stale"] is True and flash.cached(model_path, 1) is None
