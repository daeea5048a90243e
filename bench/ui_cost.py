"""What the TUI itself costs per second of an answer, with no model beside it: a loopback
server streams prose at a local model's pace (default 150 tokens/s) into the app under
Textual's `run_test`, and we read the CPU time of the app's threads. On a 2-core machine
every CPU-second the UI takes is taken from llama.cpp's threads (issue 13 item 2).

    .venv/bin/python -m bench.ui_cost [--tokens 600] [--rate 150] [--history 0]

--history N first loads a chat of N earlier answers of 2,000 tokens, to show whether the
cost grows with the chat (item 6). CPU time is not wall time: a busy machine moves it
less than it moves latencies, but report the load anyway.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

from bench.tui_share import delta, thread_cpu
from phasechat.backends.remote.backend import RemoteBackend, RemoteConfig
from phasechat.chat.config.file import Config
from phasechat.chat.config.settings import Settings, TrimConfig
from phasechat.chat.conversation import ChatMessage, Conversation
from phasechat.tui.app import PhasechatApp
from tests.fault_server import fault_server_thread


def history(answers: int) -> Conversation:
    c = Conversation()
    for k in range(answers):
        c.add(ChatMessage("user", f"question {k}"))
        text = "".join(f"t{i}\n\n" if i % 60 == 59 else f"t{i} " for i in range(2000))
        c.add(ChatMessage("assistant", text, backend="openai", model="paced"))
    return c


async def run(tokens: int, rate: float, answers: int) -> None:
    with fault_server_thread() as server:
        backend = RemoteBackend(
            RemoteConfig(base_url=server.base_url, model=f"paced-{tokens}-{rate:g}")
        )
        # No trimming: this measures drawing, not the summaries a long chat would get.
        config = Config(trim=TrimConfig(enabled=False))
        app = PhasechatApp(
            settings=Settings(max_tokens=tokens + 10), backend=backend, config=config
        )
        async with app.run_test(size=(120, 40)) as pilot:
            while backend.state != "ready":  # noqa: ASYNC110 (polling)
                await asyncio.sleep(0.05)
            if answers:
                await app.chat.show_conversation(history(answers))
            await pilot.pause(1.0)
            idle0, t_idle = thread_cpu(), time.perf_counter()
            await asyncio.sleep(2.0)
            idle = delta(idle0, thread_cpu(), time.perf_counter() - t_idle)
            before, t0 = thread_cpu(), time.perf_counter()
            assert app.chat.send("go")
            while not app.turns.exchanges or app.chat.generating:  # noqa: ASYNC110 (polling)
                await asyncio.sleep(0.05)
            wall = time.perf_counter() - t0
            print(f"idle, per s:       {idle or 'nothing'}")
            print(f"streaming, per s:  {delta(before, thread_cpu(), wall)}  ({wall:.1f} s)")
            print(f"requests served: {len(server.requests)}")
        await backend.aclose()


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.ui_cost", description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=600)
    p.add_argument("--rate", type=float, default=150.0)
    p.add_argument("--history", type=int, default=0)
    args = p.parse_args()
    load = os.getloadavg()
    print(f"# bench.ui_cost · load {load[0]:.2f} {load[1]:.2f} on {os.cpu_count()} CPUs")
    asyncio.run(run(args.tokens, args.rate, args.history))


if __name__ == "__main__":
    main()
