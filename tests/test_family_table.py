"""The server families as data (backends/remote/servers/): the table itself, what reads it, and
docs/backends.md's table of them, which names every family (adding one without its row
fails here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phasechat.backends.remote.server_metrics import parse
from phasechat.backends.remote.servers import FAMILIES, GENERIC, by_name, detect
from phasechat.backends.remote.servers.family import ServerFamily
from tests.standins import sglang, tensorrt_llm, tgi
from tests.standins.prom import Page

ROOT = Path(__file__).resolve().parent.parent


def test_every_family_has_a_row_in_the_docs_table() -> None:
    doc = (ROOT / "docs" / "backends.md").read_text()
    rows = [ln.split("|")[1].strip() for ln in doc.splitlines() if ln.startswith("| ")]
    for family in FAMILIES:
        assert any(row.startswith(family.name) for row in rows), family.name


def test_names_owners_and_prometheus_prefixes_are_each_one_familys() -> None:
    names = [f.name for f in FAMILIES]
    owners = [o for f in FAMILIES for o in f.owned_by]
    prefixes = [f.metrics.prefix for f in FAMILIES if f.metrics is not None]
    assert len(set(names)) == len(names)
    assert len(set(owners)) == len(owners)
    assert len(set(prefixes)) == len(prefixes)
    assert all(by_name(n) is f for n, f in zip(names, FAMILIES, strict=True))


@pytest.mark.parametrize("family", [f for f in FAMILIES if f.owned_by], ids=lambda f: f.name)
def test_the_listing_s_owner_names_the_family(family: ServerFamily) -> None:
    for owner in family.owned_by:
        entries = [{"id": "m", "owned_by": "someone-else"}, {"id": "n", "owned_by": owner}]
        assert detect(entries) is family


def test_a_listing_no_family_claims_is_the_generic_server() -> None:
    assert detect([{"id": "m", "owned_by": "acme"}]) is GENERIC
    assert detect([]) is GENERIC and not GENERIC.request_extras and GENERIC.metrics is None


def test_only_llama_server_dynamo_and_sglang_add_fields_and_they_are_json() -> None:
    adding = {f.name: f.request_extras for f in FAMILIES if f.request_extras}
    assert set(adding) == {"llama-server", "Dynamo", "SGLang"}
    assert json.loads(json.dumps(adding["Dynamo"])) == {
        "nvext": {"extra_fields": ["worker_id", "timing"]}
    }
    assert json.loads(json.dumps(adding["SGLang"])) == {"return_cached_tokens_details": True}


@pytest.mark.parametrize(
    ("page", "family", "queue"),
    [
        (sglang.metrics_page("m"), "SGLang", "sglang:queue_time_seconds"),
        (tgi.metrics_page(), "TGI", "tgi_request_queue_duration"),
        (tensorrt_llm.metrics_page(), "TensorRT-LLM", "trtllm_request_queue_time_seconds"),
    ],
    ids=["SGLang", "TGI", "TensorRT-LLM"],
)
def test_a_familys_page_is_read_with_its_own_names(page: Page, family: str, queue: str) -> None:
    """Each stand-in's page as its server writes it (tests/standins/): empty before
    anything was counted (the server's page all the same, where its family is known),
    then with a request's queue."""
    names = by_name(family)
    assert names is not None and names.metrics is not None
    assert parse(page.text()) is None  # nothing written: no server's page by its names
    fresh = parse(page.text(), names.metrics)
    assert fresh is not None and fresh.engine == family and fresh.get("queue_s") is None
    page.observe(queue, 0.25)
    scrape = parse(page.text())
    assert scrape is not None and scrape.engine == family and scrape.get("queue_s") == 0.25
    assert scrape.source == f"{family} {names.metrics.path}"
