"""The config's profiles changed (chat/config/edit.py; issue 49, item 3): names at their
bounds and one past them, the name a server gets when its own is taken, and each edit
leaving the other profiles, their order and the summarizer as they were."""

from __future__ import annotations

import re
from functools import partial

import pytest

from phasechat.chat.config import edit
from phasechat.chat.config.file import Config, EndpointProfile, LocalProfile
from phasechat.chat.config.settings import TrimConfig

A = EndpointProfile("a", "http://127.0.0.1:8080/v1")
B = EndpointProfile("b", "http://b.example/v1", model="m1")
LOCAL = LocalProfile("small")
CONFIG = Config(endpoints=(A, B), local=(LOCAL,), trim=TrimConfig(summarizer="b"))


@pytest.mark.parametrize("name", ["x", "a" * 64, "Lab.2_gpu:8080-b", "9lives", "A"])
def test_a_name_of_up_to_64_typeable_characters_is_taken(name: str) -> None:
    edit.check_name(CONFIG, name)


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("a" * 65, f"bad profile name {'a' * 64!r}: letters, digits and . _ : - (at most 64)"),
        ("-lab", "bad profile name '-lab': letters, digits and . _ : - (at most 64)"),
        ("my lab", "bad profile name 'my lab': letters, digits and . _ : - (at most 64)"),
        ("", "bad profile name '': letters, digits and . _ : - (at most 64)"),
        ("local", "'local' is a built-in backend's name: choose another"),
        ("openai", "'openai' is a built-in backend's name: choose another"),
        ("b", "a profile called 'b' exists already"),
        ("small", "a profile called 'small' exists already"),  # a local one's
    ],
)
def test_a_name_past_its_bounds_or_taken_is_refused_in_one_line(name: str, said: str) -> None:
    with pytest.raises(ValueError, match=re.escape(said)) as refused:
        edit.check_name(CONFIG, name)
    assert str(refused.value) == said


@pytest.mark.parametrize(
    ("base", "name"),
    [
        ("llama server/1", "llama-server-1"),  # what a name cannot hold becomes "-"
        ("LM Studio", "LM-Studio"),  # capitals kept
        ("Xbox:1.", "Xbox:1"),  # only - . _ : taken off the ends
        ("..lab-", "lab"),  # and none at either end
        ("///", "server"),  # nothing left: a name of its own
        ("x" * 60, "x" * 56),  # room for a "-2"
        ("a", "a-2"),  # taken: the first number free
        ("local", "local-2"),  # built in
    ],
)
def test_a_server_gets_a_free_name_from_its_own(base: str, name: str) -> None:
    assert edit.free_name(CONFIG, base) == name


def test_the_first_free_number_is_found_however_many_are_taken() -> None:
    taken = tuple(EndpointProfile(n, "http://h/v1") for n in ("s", "s-2", "s-3", "s-4"))
    assert edit.free_name(Config(endpoints=taken), "s") == "s-5"


def test_the_endpoint_at_a_url_is_the_one_that_reaches_that_server() -> None:
    assert edit.endpoint_at(CONFIG, "http://localhost:8080") == "a"
    assert edit.endpoint_at(CONFIG, "http://b.example/v1/") == "b"
    assert edit.endpoint_at(CONFIG, "http://c.example/v1") is None


def test_an_endpoint_is_added_last_and_a_url_no_request_could_go_to_is_refused() -> None:
    c = EndpointProfile("c", "http://c.example/v1")
    assert edit.add_endpoint(CONFIG, c).endpoints == (A, B, c)
    with pytest.raises(ValueError, match="port 99999 is not 1-65535"):
        edit.add_endpoint(CONFIG, EndpointProfile("d", "http://d.example:99999/v1"))
    with pytest.raises(ValueError, match="exists already"):
        edit.add_endpoint(CONFIG, EndpointProfile("a", "http://c.example/v1"))


def test_removing_the_summarizer_leaves_trimming_with_none() -> None:
    gone = edit.remove_profile(CONFIG, "b")
    assert gone.endpoints == (A,) and gone.local == (LOCAL,)
    assert gone.trim.summarizer is None and gone.trim.keep_last == CONFIG.trim.keep_last
    # another profile removed: the summarizer stays
    kept = edit.remove_profile(CONFIG, "small")
    assert kept.local == () and kept.endpoints == (A, B) and kept.trim.summarizer == "b"


def test_a_renamed_profile_stays_where_it_was_and_the_summarizer_follows() -> None:
    renamed = edit.rename_profile(CONFIG, "a", "lab")
    assert [e.name for e in renamed.endpoints] == ["lab", "b"]
    assert renamed.endpoints[0].base_url == A.base_url and renamed.trim.summarizer == "b"
    follows = edit.rename_profile(CONFIG, "b", "big")
    assert follows.endpoints == (A, EndpointProfile("big", B.base_url, model="m1"))
    assert follows.trim.summarizer == "big"
    local = edit.rename_profile(CONFIG, "small", "tiny")
    assert local.local == (LocalProfile("tiny"),) and local.endpoints == (A, B)


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("nope", "no profile called 'nope' in the config file"),
        (
            "local",
            "no profile called 'local' in the config file (built in, not in the config file)",
        ),
    ],
)
def test_a_profile_not_in_the_file_is_neither_removed_nor_renamed(name: str, said: str) -> None:
    removed = partial(edit.remove_profile, CONFIG, name)
    renamed = partial(edit.rename_profile, CONFIG, name, "other")
    for change in (removed, renamed):
        with pytest.raises(ValueError, match=re.escape(said)) as refused:
            change()
        assert str(refused.value) == said


def test_a_model_is_chosen_for_one_endpoint_only() -> None:
    chosen = edit.choose_model(CONFIG, "a", "qwen")
    assert chosen.endpoints == (EndpointProfile(A.name, A.base_url, model="qwen"), B)
    with pytest.raises(ValueError, match="no endpoint called") as refused:
        edit.choose_model(CONFIG, "small", "qwen")  # a local profile is no endpoint
    assert str(refused.value) == "no endpoint called 'small' in the config file"
