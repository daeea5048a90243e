"""Every request's URL from the base URL the user gave, and when two base URLs reach one
server (backends/urls.py; issue 49, item 3): the inputs that tell a slip apart (a path
ending in a letter the strip must not take, two hosts, a port no request could go to, a
fragment, a password)."""

from __future__ import annotations

import pytest

from phasechat.backends.remote.urls import endpoint, root_of, server_key, trimmed


def test_a_path_ending_in_any_other_character_keeps_it() -> None:
    assert endpoint("http://h/apiX", "/models") == "http://h/apiX/models"
    assert endpoint("http://h/apiX/", "/models") == "http://h/apiX/models"
    assert root_of("http://h/apiX/v1") == "http://h/apiX"
    assert root_of("http://h/v1X") == "http://h/v1X"


def test_trimmed_drops_only_a_final_slash_and_the_fragment() -> None:
    assert trimmed("http://h:8/v1/?api-version=2#top") == "http://h:8/v1?api-version=2"
    assert trimmed("http://h:8/v1") == "http://h:8/v1"


def test_the_root_sends_no_fragment_and_drops_a_v1_with_its_final_slash() -> None:
    assert root_of("http://h:8/v1#part") == "http://h:8"
    assert root_of("http://h:8/v1/") == "http://h:8"


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (" http://h/v1 ", "http://h/v1"),  # spaces around a pasted URL
        ("http://user:pw@h/v1", "http://h/v1"),  # credentials name no other server
        ("http://h/v1#a", "http://h/v1#b"),  # nor does a fragment
        ("http://h//v1", "http://h"),  # a doubled slash before v1
        ("http://localhost:80/v1", "http://127.0.0.1/v1"),
        ("https://h/v1", "https://h:443"),  # each scheme's default port
        ("http://h/v1/", "http://h"),
        ("http://h/a//v1", "http://h/a/v1"),
    ],
)
def test_one_server_whatever_else_the_url_holds(a: str, b: str) -> None:
    assert server_key(a) == server_key(b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("http://a.example/v1", "http://b.example/v1"),  # two hosts
        ("http://h/aX/v1", "http://h/a/v1"),  # a path that ends in a letter
        ("http://h/v1", "http://h/v2"),
        # a port no request could go to: only the same text is the same server
        ("http://h:99999/v1", "http://h:99998/v1"),
        ("http://h:99999/v1", "http://h/v1"),
        ("http://localhost/v1", "http://localhost:8080/v1"),
        ("https://h/v1", "https://h:444/v1"),
        ("http://h/a/v1X", "http://h/a"),  # not a final /v1
        ("http:///v1", "http://xxxx/v1"),  # no host is no host named anything
    ],
)
def test_another_server_whatever_the_url_shares(a: str, b: str) -> None:
    assert server_key(a) != server_key(b)


def test_a_port_no_request_could_go_to_is_its_own_text() -> None:
    assert server_key("http://h:99999/v1") == server_key("http://h:99999/v1")
