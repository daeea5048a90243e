"""One send, walked: which of phasechat's modules it passes, from the Enter key to the
answer on screen and in the store, and how often it comes back into a module it had left.

    .venv/bin/python scripts/send_walk.py            # the counts, and the walk's first steps
    .venv/bin/python scripts/send_walk.py --steps 0  # every step

The real app (`App.run_test`, headless) sends "Hi" to a real `RemoteBackend` pointed at the
tests' scripted OpenAI-compatible server (five tokens and their usage), with its config,
data and cache folders in a temporary folder. A profile hook notes the module of every
Python function called in `phasechat.*` while the send runs (every thread), from the key
press until the answer is final and drawn. The walk is that list with consecutive calls
in one module merged into one step. Counted:

- modules: the distinct modules the walk passes (and the layers they are in);
- returns: the steps that enter a module the walk had already left, each (from, to) pair
  once, so a loop run once per token counts as one return, not five;
- returns, every time: the same without merging pairs (grows with the answer's length).

docs/layout.md gives the counts before and after issue 50's redesign (the command above).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Walk:
    """The steps of one send (a module each, consecutive calls merged)."""

    steps: tuple[str, ...]

    @property
    def modules(self) -> list[str]:
        return sorted(set(self.steps))

    @property
    def layers(self) -> list[str]:
        return sorted({step.split(".")[1] for step in self.steps if step.count(".") >= 1})

    def returns(self, *, each_pair_once: bool = True) -> int:
        """Steps into a module already left earlier in the walk."""
        seen: set[str] = set()
        pairs: set[tuple[str, str]] = set()
        count = 0
        previous: str | None = None
        for step in self.steps:
            if step in seen and previous is not None:
                if not each_pair_once:
                    count += 1
                elif (previous, step) not in pairs:
                    pairs.add((previous, step))
                    count += 1
            seen.add(step)
            previous = step
        return count


def merged(calls: list[str]) -> tuple[str, ...]:
    """Consecutive calls in one module as one step."""
    steps: list[str] = []
    for module in calls:
        if not steps or steps[-1] != module:
            steps.append(module)
    return tuple(steps)


def recorder(calls: list[str]) -> Callable[[FrameType, str, Any], None]:
    def hook(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            name = frame.f_globals.get("__name__", "")
            if isinstance(name, str) and name.startswith("phasechat."):
                calls.append(name)

    return hook


def _on_app_or_screen(app: Any, name: str) -> Any:
    """`name` where the chat keeps it: on the app, or on its chat screen."""
    if hasattr(app, name):
        return getattr(app, name)
    return getattr(app.screen, name)


async def walk_one_send() -> Walk:
    from phasechat.backends.remote.backend import RemoteBackend, RemoteConfig
    from phasechat.chat.config.settings import Settings
    from phasechat.tui.app import PhasechatApp
    from tests.fault_server import fault_server_thread
    from tests.helpers import wait_for

    calls: list[str] = []
    hook = recorder(calls)
    with fault_server_thread() as server:
        backend = RemoteBackend(RemoteConfig(base_url=server.base_url, model="ok-5"))
        app = PhasechatApp(settings=Settings(max_tokens=16, temperature=0), backend=backend)
        async with app.run_test(size=(100, 40)) as pilot:
            await wait_for(pilot, lambda: backend.state == "ready")
            await pilot.click("#prompt")
            await pilot.press(*"Hi")
            await pilot.pause()
            threading.setprofile(hook)
            sys.setprofile(hook)
            try:
                await pilot.press("enter")
                await wait_for(
                    pilot,
                    lambda: (
                        len(_on_app_or_screen(app, "turns").exchanges) == 1
                        and not _on_app_or_screen(app, "generating")
                    ),
                )
                await pilot.pause()
            finally:
                sys.setprofile(None)
                threading.setprofile(None)
    return Walk(merged(calls))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40, help="steps to print (0: all)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory(prefix="send-walk-") as tmp:
        for var in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME"):
            os.environ[var] = str(Path(tmp) / var.lower())
        os.environ.pop("PHASECHAT_CONFIG", None)
        os.environ["NO_PROXY"] = "127.0.0.1"
        walk = asyncio.run(walk_one_send())
    shown = walk.steps if args.steps == 0 else walk.steps[: args.steps]
    for i, step in enumerate(shown, 1):
        print(f"{i:4d}  {step}")
    if len(shown) < len(walk.steps):
        print(f"      ... {len(walk.steps) - len(shown)} more steps (--steps 0: all)")
    print(
        f"modules: {len(walk.modules)} in {len(walk.layers)} layers "
        f"({', '.join(walk.layers)}); steps: {len(walk.steps)}; "
        f"returns: {walk.returns()} (each pair once), "
        f"{walk.returns(each_pair_once=False)} (every time)"
    )
    for module in walk.modules:
        print(f"      {module}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
