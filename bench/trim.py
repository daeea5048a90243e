"""The history trimmer on the bundled model: the 30-turn script, trimmed vs untrimmed.

Run: .venv/bin/python bench/trim.py [--n-ctx 2048] [--script examples/chat-30-turns.json]

Both runs share one loaded model (n_ctx 2048, greedy decoding) and are measured in the
same process, so the ratios compare like with like. Printed: one line per turn of each
run, then the figures the trimmer is judged on:

- overflows: turns whose prompt did not fit the context (the trimmer should have none);
- evaluated prompt tokens per turn (what prefill actually ran): max and mean, trimmed;
- total evaluated prompt tokens, trimmed / untrimmed, over the turns the untrimmed run
  could still fit, with and without the summaries' own prefill; and the same against the
  untrimmed run's *prompt* tokens, which is what a server without a prefix cache (or a
  cache lost to another chat) prefills;
- cached / prompt tokens on the trimmed run's turns that did not trim.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from phasechat.backends.local.backend import LocalBackend, LocalConfig  # noqa: E402
from phasechat.backends.local.models import default_model_path  # noqa: E402
from phasechat.chat.config.settings import Settings  # noqa: E402
from phasechat.chat.trips.replay import BenchResult, TurnRow, load_script, replay  # noqa: E402


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.1%}" if b else "n/a"


async def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n-ctx", type=int, default=2048)
    p.add_argument("--script", default=str(ROOT / "examples" / "chat-30-turns.json"))
    args = p.parse_args()
    script = load_script(Path(args.script))
    backend = LocalBackend(LocalConfig(model_path=default_model_path(), n_ctx=args.n_ctx))
    await backend.start()
    if backend.state != "ready":
        print(f"model failed to load: {backend.state_detail}", file=sys.stderr)
        return 2
    settings = Settings(max_tokens=script.max_tokens or 64, temperature=0.0, seed=1)
    runs: dict[str, BenchResult] = {}
    try:
        for name, trim in (("untrimmed", False), ("trimmed", True)):
            print(f"-- {name} (n_ctx {args.n_ctx}, max_tokens {settings.max_tokens})")
            runs[name] = await replay(
                backend, script, settings, trim=trim, on_row=lambda r: print(r.line())
            )
            print(runs[name].summary_line())
    finally:
        await backend.aclose()
    report(runs["untrimmed"], runs["trimmed"])
    return 0


def report(full: BenchResult, trimmed: BenchResult) -> None:
    """Print the figures the trimmer is judged on."""

    def overflows(rows: list[TurnRow]) -> int:
        return sum(1 for r in rows if r.error and "context holds" in r.error)

    fits = {r.turn for r in full.rows if r.error is None}
    t_rows = [r for r in trimmed.rows if r.turn in fits]
    f_rows = [r for r in full.rows if r.turn in fits]
    t_eval = sum(r.tokens.evaluated_prompt_tokens or 0 for r in t_rows)
    f_eval = sum(r.tokens.evaluated_prompt_tokens or 0 for r in f_rows)
    f_prompt = sum(r.tokens.prompt_tokens or 0 for r in f_rows)
    last_fit = max(fits) if fits else 0
    # every summary's own prefill (all of them, also those after the untrimmed run's end)
    s_eval = sum(s.metrics.evaluated_prompt_tokens or 0 for s in trimmed.summaries)
    per_turn = [r.tokens.evaluated_prompt_tokens or 0 for r in trimmed.rows if r.error is None]
    plain = [r for r in trimmed.rows if not r.trimmed and r.error is None]
    cached = sum(r.tokens.cached_tokens or 0 for r in plain)
    prompt = sum(r.tokens.prompt_tokens or 0 for r in plain)
    t_ttft = [r.timing.ttft_ms for r in t_rows if r.timing.ttft_ms]
    f_ttft = [r.timing.ttft_ms for r in f_rows if r.timing.ttft_ms]
    print()
    print("== trimmer figures ==")
    print(f"overflows: untrimmed {overflows(full.rows)}, trimmed {overflows(trimmed.rows)}")
    print(
        f"errors (any): untrimmed {len(full.rows) - len(fits)}, trimmed "
        f"{sum(1 for r in trimmed.rows if r.error)}"
    )
    print(f"untrimmed run fits turns 1..{last_fit} ({len(fits)} turns)")
    print(
        f"trimmed: evaluated prompt tokens per turn max {max(per_turn, default=0)}, mean "
        f"{sum(per_turn) / max(1, len(per_turn)):.0f}; prompt tokens max "
        f"{max((r.tokens.prompt_tokens or 0 for r in trimmed.rows), default=0)}"
    )
    print(
        f"trims: {sum(r.trimmed for r in trimmed.rows)} (turns "
        f"{[r.turn for r in trimmed.rows if r.trimmed]}), summaries {len(trimmed.summaries)}, "
        f"their prefill {s_eval} tokens, their e2e "
        f"{sum(s.metrics.e2e_ms or 0 for s in trimmed.summaries) / 1000:.1f} s, waited "
        f"{sum(r.trim_wait_ms or 0 for r in trimmed.rows) / 1000:.1f} s"
    )
    print(
        f"turns 1..{last_fit}: evaluated prompt tokens trimmed {t_eval} / untrimmed {f_eval}"
        f" = {_ratio(t_eval, f_eval)} (with the summaries' prefill: "
        f"{_ratio(t_eval + s_eval, f_eval)})"
    )
    print(
        f"turns 1..{last_fit}: evaluated trimmed {t_eval} / untrimmed prompt tokens "
        f"{f_prompt} (cold-cache prefill) = {_ratio(t_eval, f_prompt)}"
    )
    print(
        f"trimmed, turns that did not trim: cached / prompt tokens {cached} / {prompt} = "
        f"{_ratio(cached, prompt)}"
    )
    if t_ttft and f_ttft:
        print(
            f"turns 1..{last_fit}: mean ttft trimmed {sum(t_ttft) / len(t_ttft):.0f} ms, "
            f"untrimmed {sum(f_ttft) / len(f_ttft):.0f} ms"
        )


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
