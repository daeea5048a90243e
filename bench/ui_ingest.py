"""UI ingest benchmark: can the TUI keep up with a stream faster than any model?

A scripted loopback server (its own thread and event loop) sends N one-token chunks as
fast as the socket takes them; the app runs headless under `App.run_test()`. We measure
how long after the server's last byte the last token is on screen, and how fast the UI
answers key presses throughout (a character typed into the prompt box, timed until the
box shows it).

    .venv/bin/python -m bench.ui_ingest [--tokens 20000]

Goals: last token on screen within 1 s of the server's last byte; every key press
answered within 100 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from textual import events

from phasechat.backends.remote.backend import RemoteBackend, RemoteConfig
from phasechat.chat.config.settings import Settings
from phasechat.tui.app import PhasechatApp
from phasechat.tui.widgets.chat_widgets import MessageView, PromptInput
from tests.fault_server import fault_server_thread


async def run(tokens: int) -> dict[str, float]:
    with fault_server_thread() as server:
        backend = RemoteBackend(RemoteConfig(base_url=server.base_url, model=f"fast-{tokens}"))
        await backend.start()
        app = PhasechatApp(settings=Settings(max_tokens=tokens + 10), backend=backend)
        key_ms: list[float] = []
        async with app.run_test(size=(120, 40)) as pilot:
            while backend.state != "ready":
                await pilot.pause(0.05)
            await pilot.pause(0.5)  # let start-up work (tiktoken, first layout) finish
            prompt = app.query_one(PromptInput)
            t_send = time.perf_counter_ns()
            app.chat.send("go")
            await pilot.pause()
            typed = 0
            while app.chat.generating or not app.turns.exchanges:
                # A key press, timed until the prompt box holds the character. (Posted
                # directly: Pilot.press waits for the app to go idle, which a stream delays.)
                t0 = time.perf_counter_ns()
                app.post_message(events.Key("x", "x"))
                typed += 1
                while prompt.text.count("x") < typed:  # noqa: ASYNC110 (polling is the point)
                    await asyncio.sleep(0.001)
                key_ms.append((time.perf_counter_ns() - t0) / 1e6)
                await asyncio.sleep(0.05)
            # The answer is final: is its last token rendered?
            view = list(app.query(MessageView))[-1]
            expected = f"t{tokens - 1}"
            await pilot.pause()
            t_shown = time.perf_counter_ns()
            assert expected in view.markdown.source, "last token missing from the screen"
        await backend.aclose()
        trace = app.turns.exchanges[-1].trace
        return {
            "tokens": float(trace.deltas),
            "server_send_s": (server.last_byte_ns - t_send) / 1e9,
            "last_token_after_last_byte_s": (t_shown - server.last_byte_ns) / 1e9,
            "client_receive_s": ((trace.t_done or 0) - trace.t_sent) / 1e9,
            "key_presses": float(len(key_ms)),
            "key_ms_p50": statistics.median(key_ms) if key_ms else 0.0,
            "key_ms_max": max(key_ms) if key_ms else 0.0,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=20000)
    args = parser.parse_args()
    r = asyncio.run(run(args.tokens))
    print(f"tokens streamed                   {r['tokens']:,.0f}")
    print(f"server sent everything in         {r['server_send_s']:.3f} s")
    print(f"client received everything in     {r['client_receive_s']:.3f} s")
    print(
        f"last token on screen after the server's last byte: "
        f"{r['last_token_after_last_byte_s']:.3f} s (goal <= 1 s)"
    )
    print(
        f"key presses during the stream     {r['key_presses']:.0f}: p50 {r['key_ms_p50']:.1f} ms, "
        f"max {r['key_ms_max']:.1f} ms (goal <= 100 ms)"
    )
    print(
        f"UI throughput                     "
        f"{r['tokens'] / max(1e-9, r['client_receive_s']):,.0f} tokens/s"
    )


if __name__ == "__main__":
    main()
