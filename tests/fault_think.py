"""The fault server's thinking-model behaviours: chain of thought streamed apart from
the answer, in llama-server's and vLLM's exact shapes (see `ThinkBehaviours._b_think`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from typing import Any

DONE = b"data: [DONE]\n\n"
Writer = asyncio.StreamWriter
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"connection: close\r\n\r\n"
)


@dataclass
class Conn:
    """One client connection: its reader (to notice the client leaving) and writer."""

    r: asyncio.StreamReader
    w: Writer
    headers: dict[str, str]

    async def idle(self, seconds: float) -> None:
        """Wait `seconds`, or less if the client hangs up first."""
        with contextlib.suppress(TimeoutError, ConnectionError):
            await asyncio.wait_for(self.r.read(1), seconds)


class ThinkBehaviours:
    """Mixed into `FaultServer`: `model` = `think-...`, `thinkvllm-...`, `thinkslow-...`."""

    tokens_sent: int

    async def _b_think(self, arg: str, req: dict[str, Any], c: Conn) -> None:
        """`think-N-M-D`: N thinking tokens, then M answer tokens, D ms apart, shaped as
        llama-server streams them with its default reasoning format, deepseek
        (common/common.h:651). Paths under llama-cpp-python 0.3.36's vendor/llama.cpp/:

        - a first delta `{"role": "assistant", "content": null}`
          (tools/server/server-task.cpp:1133-1138, `to_json_oaicompat_chat`),
        - thinking in `delta.reasoning_content`, answer in `delta.content`
          (tools/server/server-chat.cpp:621-627, `server_chat_msg_diff_to_json_oaicompat`),
        - a finish chunk with an empty delta, then usage in a chunk with `choices: []`,
          `timings` on that last chunk (server-task.cpp:487-518), and no reasoning count
          in usage (server-task.cpp:365-371, `usage_json_oaicompat`).

        `thinkvllm-N-M-D`: the same in vLLM's shape (vllm 0.33.0 wheel, under
        vllm/entrypoints/): a first delta `{"role": "assistant", "content": ""}`
        (openai/chat_completion/serving.py:598-603),
        thinking in `delta.reasoning` (generate/base/protocol.py:356-360, `DeltaMessage`),
        and `usage.completion_tokens_details.reasoning_tokens`
        (serve/engine/protocol.py:131-140; openai/chat_completion/serving.py:864-874).
        `thinkslow-D-S`: one thinking token every D ms for S seconds, then an answer.
        """
        n, m, delay = (int(x) for x in (arg or "40-10-20").split("-"))
        await self._think(c, n, m, delay / 1000, vllm=False)

    async def _b_thinkvllm(self, arg: str, req: dict[str, Any], c: Conn) -> None:
        n, m, delay = (int(x) for x in (arg or "40-10-20").split("-"))
        await self._think(c, n, m, delay / 1000, vllm=True)

    async def _b_thinkslow(self, arg: str, req: dict[str, Any], c: Conn) -> None:
        delay_ms, seconds = (float(x) for x in (arg or "50-1").split("-"))
        await self._think(c, int(seconds * 1000 / delay_ms), 3, delay_ms / 1000, vllm=False)

    async def _think(self, c: Conn, n: int, m: int, delay: float, vllm: bool) -> None:
        key = "reasoning" if vllm else "reasoning_content"

        def delta(d: dict[str, Any], finish: str | None = None) -> bytes:
            obj = {
                "object": "chat.completion.chunk",
                "model": "thinker",
                "choices": [{"index": 0, "delta": d, "finish_reason": finish}],
            }
            return b"data: " + json.dumps(obj).encode() + b"\n\n"

        c.w.write(SSE_HEAD + delta({"role": "assistant", "content": "" if vllm else None}))
        for i in range(n + m):
            c.w.write(delta({key: f"think{i} "} if i < n else {"content": f"ans{i - n} "}))
            self.tokens_sent += 1
            await c.w.drain()
            await asyncio.sleep(delay)
        c.w.write(delta({}, "stop"))
        usage: dict[str, Any] = {
            "prompt_tokens": 5,
            "completion_tokens": n + m,
            "total_tokens": n + m + 5,
        }
        last: dict[str, Any] = {"object": "chat.completion.chunk", "choices": [], "usage": usage}
        if vllm:
            usage["completion_tokens_details"] = {"reasoning_tokens": n}
        else:
            usage["prompt_tokens_details"] = {"cached_tokens": 0}
            last["timings"] = {
                "prompt_n": 5,
                "prompt_ms": 1.0,
                "predicted_n": n + m,
                "predicted_ms": (n + m) * delay * 1000,
                "cache_n": 0,
            }
        c.w.write(b"data: " + json.dumps(last).encode() + b"\n\n" + DONE)
