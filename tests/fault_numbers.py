"""The fault server's hostile numbers: a stream whose usage, timings or progress say
something no engine could (`numbers-<case>`), and metadata endpoints that lie about the
context window or drip it a byte at a time (a base URL under `/window-<case>/`).

Each body is raw bytes, as a careless or hostile server would send them: JSON's `NaN`,
integers of thousands of digits, a lone surrogate escape, 200,000 `[`.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from tests.fault_think import DONE, SSE_HEAD, Conn

#: A count of 4,000 digits: still JSON Python will read (its limit is 4,300), but no float.
DIGITS_4000 = "9" * 4000


def _event(raw: str) -> bytes:
    return b"data: " + raw.encode() + b"\n\n"


#: `numbers-<case>`: the last event of an otherwise normal 3-token answer, and the field
#: a notice must name (None: nothing is ignored, the case is about text).
STREAMS: dict[str, tuple[str, str | None]] = {
    "usage_nan": (
        '{"choices":[],"usage":{"prompt_tokens":NaN,"completion_tokens":3}}',
        "usage.prompt_tokens",
    ),
    "usage_text": (
        '{"choices":[],"usage":{"prompt_tokens":"ten","completion_tokens":3}}',
        "usage.prompt_tokens",
    ),
    "usage_negative": (
        '{"choices":[],"usage":{"prompt_tokens":-100,"completion_tokens":3,'
        '"prompt_tokens_details":{"cached_tokens":-50}}}',
        "usage.prompt_tokens",
    ),
    "usage_trillion": (
        '{"choices":[],"usage":{"prompt_tokens":1000000000000,"completion_tokens":3}}',
        "usage.prompt_tokens",
    ),
    "cached_over_prompt": (
        '{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,'
        '"prompt_tokens_details":{"cached_tokens":9}}}',
        "cached_tokens",
    ),
    "reasoning_over_completion": (
        '{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,'
        '"completion_tokens_details":{"reasoning_tokens":50}}}',
        "reasoning_tokens",
    ),
    "timings_text": (
        '{"choices":[],"timings":{"prompt_n":"ten","prompt_ms":2.0,"predicted_n":3,'
        '"predicted_ms":3.0}}',
        "timings.prompt_n",
    ),
    "timings_nan": (
        '{"choices":[],"timings":{"prompt_n":5,"prompt_ms":NaN,"predicted_n":3,'
        '"predicted_ms":3.0}}',
        "timings.prompt_ms",
    ),
    "cache_huge": (
        '{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3},'
        '"timings":{"prompt_n":5,"prompt_ms":2.0,"predicted_n":3,"predicted_ms":3.0,'
        '"cache_n":99999999}}',
        "timings.cache_n",
    ),
    "cache_over_prompt": (
        '{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3},'
        '"timings":{"prompt_n":5,"prompt_ms":2.0,"predicted_n":3,"predicted_ms":3.0,'
        '"cache_n":4000}}',
        "timings.cache_n",
    ),
    "drafts": (
        '{"choices":[],"timings":{"prompt_n":5,"prompt_ms":2.0,"predicted_n":3,'
        '"predicted_ms":3.0,"draft_n":3,"draft_n_accepted":9}}',
        "draft_n_accepted",
    ),
    "tiny_time": (  # 16Mi tokens in a nanosecond: a rate beyond belief, never shown
        '{"choices":[],"timings":{"prompt_n":16000000,"prompt_ms":0.000001,"predicted_n":3,'
        '"predicted_ms":3.0}}',
        None,
    ),
    "progress_text": (
        '{"choices":[],"prompt_progress":{"total":"ten","cache":0,"processed":1,"time_ms":1}}',
        "prompt_progress.total",
    ),
    "choices_text": ('{"choices":"abc"}', "choices"),
    "choices_int": ('{"choices":7}', "choices"),
    "choice_int": ('{"choices":[7]}', "choices[]"),
    "digits": (
        '{"choices":[],"usage":{"prompt_tokens":' + DIGITS_4000 + ',"completion_tokens":3}}',
        "usage.prompt_tokens",
    ),
    "surrogate": ('{"choices":[{"index":0,"delta":{"content":"\\ud800!"}}]}', None),
}

#: fields a backend names where the parser alone cannot: it holds them against the
#: prompt it sent ("hi": 16M prompt tokens are more than it can be)
BY_THE_PROMPT = {"tiny_time": "timings.prompt_n"}


class NumberBehaviours:
    """Mixed into `FaultServer`."""

    #: set when a client cut a drip short (it gave up, as it should)
    drip_cut: asyncio.Event

    async def _b_numbers(self, arg: str, req: dict[str, Any], c: Conn) -> None:
        """`numbers-<case>`: three tokens, then the case's event from STREAMS."""
        raw, _field = STREAMS[arg]
        tok = b'data: {"choices":[{"index":0,"delta":{"content":"tok "}}]}\n\n'
        finish = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
        c.w.write(SSE_HEAD + tok * 3 + finish + _event(raw) + DONE)

    async def _b_deep(self, arg: str, req: dict[str, Any], c: Conn) -> None:
        """200,000 `[`: as a 500's body (`deep-status`), as a reply that did not stream
        (`deep-whole`), or as one event of a stream (`deep-event`)."""
        deep = b"[" * 200_000
        if arg == "event":
            c.w.write(SSE_HEAD + b"data: " + deep + b"\n\n" + DONE)
            return
        status = b"500 Error" if arg == "status" else b"200 OK"
        c.w.write(
            b"HTTP/1.1 "
            + status
            + b"\r\ncontent-type: application/json\r\n"
            + f"content-length: {len(deep)}\r\nconnection: close\r\n\r\n".encode()
            + deep
        )

    async def _window(self, case: str, path: str, c: Conn) -> None:
        """The metadata endpoints under `/window-<case>/`."""
        server, _, how = case.partition("_")
        owner = {"props": "llamacpp", "ollama": "library", "show": "library"}.get(server, "x")
        if path.endswith("/v1/models"):
            if server == "models" and how in ("drip", "headdrip"):
                await self._drip(c, head=how == "headdrip")
                return
            entry = f'{{"id":"scripted","owned_by":"{owner}"'
            if server == "vllm":
                entry += f',"max_model_len":{"1" * 400 if how == "digits" else 10**18}'
            await self._send(c, entry + "}", listing=True)
        elif path.endswith("/props"):
            if how == "drip":
                await self._drip(c)
            elif how == "deep":
                await self._send(c, "[" * 200_000)
            else:
                n = DIGITS_4000 if how == "digits" else str(10**18)
                await self._send(c, f'{{"default_generation_settings":{{"n_ctx":{n}}}}}')
        elif path.endswith("/api/version") and server in ("ollama", "show"):
            await self._send(c, '{"version":"0.0.0"}')  # what only Ollama answers
        elif path.endswith("/api/chat"):  # Ollama's own chat: three pieces, then the end
            piece = '{"message":{"role":"assistant","content":"tok "},"done":false}\n'
            end = '{"message":{"role":"assistant","content":""},"done":true,"eval_count":3}\n'
            await self._send(c, piece * 3 + end, ctype="application/x-ndjson")
        elif path.endswith("/api/ps"):
            await self._send(c, '{"models":[]}')
        elif path.endswith("/api/show"):
            if how == "drip":
                await self._drip(c)
            else:
                said = json.dumps({"parameters": "num_ctx " + "7" * 5000})
                await self._send(c, said)
        else:  # llama-server's /apply-template and /tokenize: not this server's
            c.w.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")

    async def _send(
        self, c: Conn, body: str, listing: bool = False, ctype: str = "application/json"
    ) -> None:
        data = ('{"object":"list","data":[' + body + "]}" if listing else body).encode()
        c.w.write(
            f"HTTP/1.1 200 OK\r\ncontent-type: {ctype}\r\n".encode()
            + f"content-length: {len(data)}\r\nconnection: close\r\n\r\n".encode()
            + data
        )

    async def _drip(self, c: Conn, head: bool = False) -> None:
        """A 200 with a valid body sent one byte every 0.5 s (a minute in all; `head`:
        the headers too), ended at once when the client leaves."""
        body = b'{"object":"list","data":[]' + b" " * 120 + b"}"
        start = (
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            + f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
        )
        if not head:
            c.w.write(start)
            start = b""
        sent = start + body
        for i in range(len(sent)):
            c.w.write(sent[i : i + 1])
            try:
                await c.w.drain()
            except ConnectionError:
                break
            await c.idle(0.5)
            if c.r.at_eof():
                break
        else:
            return
        self.drip_cut.set()
