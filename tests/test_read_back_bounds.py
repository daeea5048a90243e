"""Issue 49: a stored metric set read back (telemetry/read_back.py), each figure at its
bound and one past it: a share at 1 and above it (a draft acceptance of 1.5 is not
150%), a byte count of 4 GB in a field whose name does not end in "bytes", and a
petabyte."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import pytest

from phasechat.backends.remote.wire_numbers import MAX_MS, MAX_RATE
from phasechat.telemetry import read_back
from phasechat.telemetry.anatomy import Anatomy, CacheBreak, Section
from phasechat.telemetry.read_back import (
    MAX_BYTES,
    MAX_CHARS_PER_TOKEN,
    MAX_GB_S,
    Unreadable,
    anatomy_read_back,
    metrics_read_back,
)

BASE = {"output_tokens": 5, "chars": 20}


@pytest.fixture(autouse=True)
def _fresh_checks() -> None:
    """Each test builds the checks again (they are cached once a process): so that a
    mutation tool that runs only the tests it saw reach a function sees every test here
    reach the one that builds them (scripts/mutants.py)."""
    read_back._checks.cache_clear()


def read(**figures: Any) -> Any:
    return metrics_read_back({**BASE, **figures})


@pytest.mark.parametrize("name", ["draft_acceptance", "prefill_share", "server_kv_hit_share"])
def test_a_share_is_believed_up_to_one_and_not_past_it(name: str) -> None:
    for value in (0.0, 1.0):
        m = read(**{name: value})
        assert getattr(m, name) == value and m.ignored == ()
    m = read(**{name: 1.5})
    assert getattr(m, name) is None and m.ignored == (f"{name} (1.5)",)
    assert read(**{name: -0.01}).ignored == (f"{name} (-0.01)",)


@pytest.mark.parametrize("name", ["gpu_bytes_per_token", "cpu_bytes_per_token", "kv_bytes"])
def test_a_byte_count_is_bounded_by_a_petabyte_wherever_bytes_is_in_its_name(name: str) -> None:
    four_gb = 4 * 1024**3  # more than a token count may be (16 Mi)
    assert getattr(read(**{name: four_gb}), name) == four_gb
    assert getattr(read(**{name: MAX_BYTES}), name) == MAX_BYTES
    past = read(**{name: MAX_BYTES + 1})
    assert getattr(past, name) is None and past.ignored == (f"{name} (a number too large)",)


def test_a_token_count_is_bounded_by_a_token_count() -> None:
    m = read(prompt_tokens=4 * 1024**3)
    assert m.prompt_tokens is None and len(m.ignored) == 1


@pytest.mark.parametrize(
    ("name", "top"),
    [
        ("ttft_ms", MAX_MS),  # a time: a week at most
        ("itl_ms_max", MAX_MS),
        ("decode_tok_s", MAX_RATE),  # a rate: belief's limit
        ("chars_per_s", MAX_RATE),
        ("implied_bandwidth_gb_s", MAX_GB_S),
        ("chars_per_token", MAX_CHARS_PER_TOKEN),
    ],
)
def test_each_kind_of_float_is_bounded_by_what_it_measures(name: str, top: float) -> None:
    assert getattr(read(**{name: top}), name) == top
    assert getattr(read(**{name: 0}), name) == 0.0
    for bad in (top * 1.01, -1.0, "1.0", True):
        m = read(**{name: bad})
        assert getattr(m, name) is None and len(m.ignored) == 1 and m.ignored[0].startswith(name)


def test_flags_text_and_warnings_are_what_they_say_or_unknown() -> None:
    m = read(cache_reported=True, backend="b", warnings=["slow", "hot"], finish=None)
    assert (m.cache_reported, m.backend, m.warnings, m.finish) == (True, "b", ("slow", "hot"), None)
    bad = read(cache_reported=1, backend=7, warnings=["ok", 3])
    # named in the fields' order
    assert bad.ignored == ("backend (7)", "cache_reported (1)", "warnings (a list)")
    assert bad.backend == "" and bad.warnings == ()
    # a required figure that is null is unknown; an optional one's null is None, kept
    assert read(output_tokens=3, prompt_tokens=None).ignored == ()
    with pytest.raises(Unreadable, match="output_tokens is None, not a count"):
        read(output_tokens=None)
    with pytest.raises(Unreadable, match=r"chars is 2\.5, not a count"):
        read(chars=2.5)
    with pytest.raises(Unreadable, match="not an object"):
        metrics_read_back([1, 2])
    assert read(unknown_field=5).ignored == ()  # another version's field: left out


SECTIONS = (
    Section("template", None, 3, 3, 0, None),
    Section("system", 0, 10, 10, 0, 0.0),
    Section("new", 1, 7, None, 7, 12.5),
)
BREAK = CacheBreak(1, 4, "héld", "sent", 7, False, "retokenized", True, 16)


def test_an_anatomy_reads_back_as_it_was_written() -> None:
    anatomy = Anatomy(SECTIONS, "tokenizer", BREAK)
    assert anatomy_read_back(anatomy.as_dict()) == anatomy
    assert anatomy_read_back(Anatomy(SECTIONS, "estimate", None).as_dict()).cache_break is None


def stored(section: int = 1, brk: Any = None, **changes: Any) -> dict[str, Any]:
    """The stored anatomy with one section's or the break's fields changed."""
    data = Anatomy(SECTIONS, "tokenizer", BREAK).as_dict()
    if brk is None:
        data["prompt_sections"][section].update(changes)
    else:
        data["cache_break"] = brk
    return data


@pytest.mark.parametrize(
    ("data", "why"),
    [
        ([1], "its prompt anatomy is a list, not an object"),
        (
            {"prompt_sections": "x", "sections_source": "t"},
            "its prompt sections are 'x', not a list",
        ),
        ({"prompt_sections": [], "sections_source": 3}, "its prompt anatomy's source is 3"),
        ({"prompt_sections": [7], "sections_source": "t"}, "a prompt section is 7, not an object"),
        (stored(cached_tokens=11), r"a prompt section's cached_tokens \(11\) exceed its tokens"),
        (stored(evaluated_tokens=11), r"a prompt section's evaluated_tokens \(11\) exceed"),
        (stored(cached_tokens=-1), "its prompt anatomy's cached_tokens is -1, not a count"),
        (stored(evaluated_tokens=1.5), "evaluated_tokens is 1.5, not a count"),
        (stored(tokens=None), "its prompt anatomy's tokens is None, not a count"),
        (stored(kind="speech"), "a prompt section's kind is 'speech'"),
        (stored(prefill_ms=-1.0), "a prompt section's prefill_ms is -1.0"),
        (stored(message_index="0"), "message_index is '0', not a count"),
        (stored(brk=[1]), "its cache break is a list, not an object"),
        (stored(brk={**asdict(BREAK), "held": 5}), "its cache break's text or kind"),
        (stored(brk={**asdict(BREAK), "kind": "typo"}), "its cache break's text or kind"),
        (stored(brk={**asdict(BREAK), "estimated": 1}), "flags are not true or false"),
        (stored(brk={**asdict(BREAK), "in_answer": None}), "flags are not true or false"),
        (stored(brk={**asdict(BREAK), "grain": 0}), "its cache break's block size is 0"),
        (
            stored(brk={**asdict(BREAK), "char_offset": 2**40 + 1}),
            "char_offset is a number too large",
        ),
    ],
)
def test_an_implausible_anatomy_is_unreadable_whole_and_says_why(data: Any, why: str) -> None:
    with pytest.raises(Unreadable, match=why):
        anatomy_read_back(data)


def test_a_section_s_counts_at_their_bounds_are_believed() -> None:
    # cached and evaluated equal to the section's tokens; the optional ones null
    at = anatomy_read_back(stored(cached_tokens=10, evaluated_tokens=10, prefill_ms=None))
    assert at.sections[1] == Section("system", 0, 10, 10, 10, None)
    old = stored(brk={**asdict(BREAK), "grain": None, "kind": "edit", "message_index": None})
    back = anatomy_read_back(old).cache_break
    assert back is not None and back.grain == 1 and back.message_index is None
    assert anatomy_read_back(stored(brk={**asdict(BREAK), "char_offset": 2**40})).cache_break


def test_a_break_s_optional_fields_read_back_as_their_defaults() -> None:
    """A break stored by an older phasechat: no kind, no in_answer, no count of tokens
    read again, a block of 1; its estimated flag kept as it was (True here)."""
    old = {**asdict(BREAK), "estimated": True, "grain": 1, "tokens_read_again": None}
    for name in ("kind", "in_answer"):
        del old[name]
    back = anatomy_read_back(stored(brk=old)).cache_break
    assert back == CacheBreak(1, 4, "héld", "sent", None, True, "edit", False, 1)
    section = anatomy_read_back(stored(evaluated_tokens=None, cached_tokens=None)).sections[1]
    assert (section.cached_tokens, section.evaluated_tokens) == (None, None)


@pytest.mark.parametrize(
    ("brk", "why"),
    [
        ({"held": 5}, "its cache break's text or kind is not plausible"),
        ({"estimated": 1}, "its cache break's flags are not true or false"),
        ({"grain": 0}, "its cache break's block size is 0"),
    ],
)
def test_a_bad_break_says_so_in_these_words(brk: dict[str, Any], why: str) -> None:
    with pytest.raises(Unreadable) as raised:
        anatomy_read_back(stored(brk={**asdict(BREAK), **brk}))
    assert str(raised.value) == why


def test_a_flag_is_read_back_as_stored_and_a_non_object_is_named() -> None:
    m = read(cache_reported=False, output_tokens_estimated=True)
    assert (m.cache_reported, m.output_tokens_estimated, m.ignored) == (False, True, ())
    with pytest.raises(Unreadable) as raised:
        metrics_read_back([1, 2])
    assert str(raised.value) == "its metrics are a list, not an object"
