"""Per token, what phasechat does beside `llama_decode`, against a bare decode loop.

Run: .venv/bin/python -m bench.token_split [--threads 2] [--rounds 3] [--tokens 128]
     [--model PATH|fast]

llama-bench's tg test decodes one token after another and never samples; phasechat, per
token, reads the logits and samples, detokenizes, holds back stop strings and think
tags, stamps the token and hands it to the event loop, which records it. This prints,
for greedy and for seeded sampling (temperature 0.7), the mean wall time per token of
each part on the llama thread, the event loop's own CPU time per token (it runs beside
the engine's threads, on the same cores), and the decode rate of the real stream beside
a bare loop (`llama_decode` of one token and `llama_synchronize`, as llama-bench's tg
does) at the same depth, in the same process on the same context, interleaved, so a
neighbour's load hits both alike. The split comes from a run of its own (each part
timed by a wrapper, which costs a little); the rates from runs without wrappers.

Parts, on the llama thread, from the end of one `llama_decode` to the start of the next:
- sample: until `token_loop` yields the token (the logits' read, `llama_get_logits_ith`,
  and the argmax, or llama.cpp's sampler chain; `llama_sampler_sample`);
- detokenize: the token's bytes to text (incremental UTF-8);
- stops + think: stop strings held back, the think block split, the events built;
- hand-over: `Handoff.put` (the event queued, the loop woken at most every 25 ms);
- rest: the end-of-generation test, the stamp, the thread policy, the generator.

Last, each sampler alone on one token's logits, in thread CPU time (which a busy
machine's preemptions leave out): phasechat's greedy argmax, llama.cpp's own greedy
sampler (it copies all n_vocab logits into a candidate array first), and the sampled
chain.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from bench import fast_model
from phasechat.backends.events import GenerationRequest, Message
from phasechat.backends.llama_glue import llama_thread, physical_cores, reuse_prefix
from phasechat.backends.local import LocalBackend, LocalConfig, handoff, sampling
from phasechat.backends.local import backend as local
from phasechat.backends.stops import StopMatcher
from phasechat.backends.think import ThinkSplitter
from phasechat.telemetry.metrics import compute
from phasechat.telemetry.recorder import Trace, record

PROMPT = "Write a long story about a dragon who learns to fly."
SEED = 1234
TEMPERATURE = 0.7  # ask's default
PARTS = ("decode", "sample", "detokenize", "stops + think", "hand-over", "rest")


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.2f} (1 min) {five:.2f} (5 min)"


@dataclass
class Split:
    """Wall ns per part over a stream's decode steps, and the steps counted."""

    ns: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PARTS, 0))
    steps: int = 0
    loop_cpu_ns: int = 0
    tokens: int = 0

    def per_token_us(self, part: str) -> float:
        return self.ns[part] / max(1, self.steps) / 1e3

    def beside_us(self) -> float:
        """Everything on the llama thread but `llama_decode`, per token."""
        return sum(self.per_token_us(p) for p in PARTS[1:])

    def step_us(self) -> float:
        return sum(self.per_token_us(p) for p in PARTS) or 1.0

    def loop_us(self) -> float:
        """The event loop's CPU time per token."""
        return self.loop_cpu_ns / max(1, self.tokens) / 1e3


class Stamps:
    """Wrappers that add each call's wall time to a part of `split` (llama thread only)."""

    def __init__(self, split: Split) -> None:
        self.split = split
        self.decode_end = 0  # when the last token's llama_decode returned
        self.started = False  # the first token was made: decodes are tokens' steps now
        self.inner = 0  # time of wrapped parts inside the current consumer step

    def add(self, part: str, ns: int) -> None:
        self.split.ns[part] += ns

    def timed(self, part: str, func: Callable[..., Any]) -> Callable[..., Any]:
        clock = time.perf_counter_ns

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            try:
                return func(*args, **kwargs)
            finally:
                spent = clock() - start
                self.add(part, spent)
                self.inner += spent

        return wrapper


@contextmanager
def instrumented(split: Split) -> Iterator[None]:
    """Wrap the calls of one answer's decode loop; each part's time goes into `split`."""
    import llama_cpp.llama_cpp as lib

    stamps = Stamps(split)
    clock = time.perf_counter_ns
    saved: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, name: str, value: Any) -> None:
        saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    orig_decode = lib.llama_decode

    def decode(*args: Any) -> int:
        start = clock()
        rc: int = orig_decode(*args)
        end = clock()
        if stamps.started:  # a token's step, not the prompt's
            stamps.add("decode", end - start)
            stamps.decode_end = end
            split.steps += 1
        return rc

    orig_loop = local.token_loop  # type: ignore[attr-defined]

    def token_loop(*args: Any, **kwargs: Any) -> Generator[int, None, None]:
        gen = orig_loop(*args, **kwargs)
        try:
            while True:
                try:
                    token = next(gen)
                except StopIteration:
                    return
                got = clock()
                if stamps.decode_end:
                    stamps.add("sample", got - stamps.decode_end)
                stamps.started, stamps.inner = True, 0
                yield token
                # the consumer's step ended when it asked for the next token: what the
                # wrapped parts did not take is the rest
                back = clock()
                stamps.add("rest", back - got - stamps.inner)
        finally:
            gen.close()

    orig_decoder = LocalBackend.token_decoder

    def token_decoder(self: LocalBackend) -> Callable[[int | None], str]:
        return stamps.timed("detokenize", orig_decoder(self))

    patch(lib, "llama_decode", decode)
    patch(local, "token_loop", token_loop)
    patch(LocalBackend, "token_decoder", token_decoder)
    patch(StopMatcher, "feed", stamps.timed("stops + think", StopMatcher.feed))
    patch(ThinkSplitter, "token_events", stamps.timed("stops + think", ThinkSplitter.token_events))
    patch(handoff.Handoff, "put", stamps.timed("hand-over", handoff.Handoff.put))
    try:
        yield
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


def request(tokens: int, sampled: bool) -> GenerationRequest:
    temp = TEMPERATURE if sampled else 0.0
    seed = SEED if sampled else None
    return GenerationRequest((Message("user", PROMPT),), tokens + 1, temp, seed=seed)


async def stream(backend: LocalBackend, req: GenerationRequest, split: Split | None) -> float:
    """One answer through the recorder, as `ask` measures it: its decode tok/s. With
    `split`, each part's time (and the event loop's CPU time) goes into it."""
    trace = Trace(backend="local", model=backend.model, max_tokens=req.max_tokens)
    cpu = time.thread_time_ns()
    if split is None:
        async for _ in record(backend.stream(req), trace):
            pass
    else:
        with instrumented(split):
            async for _ in record(backend.stream(req), trace):
                pass
    m = compute(trace)
    if split is not None:
        split.loop_cpu_ns += time.thread_time_ns() - cpu
        split.tokens += m.output_tokens
    assert m.decode_tok_s is not None, m
    return m.decode_tok_s


def bare_rate(backend: LocalBackend, tokens: int, depth: bool) -> float:
    """llama-bench's tg on this context: one token per `llama_decode`, synchronised, no
    sampling; tok/s. `depth`: after the answer's own prompt (the depth `ask` decodes
    at), else from an empty cache (llama-bench's `-d 0`). On the llama thread."""
    import llama_cpp.llama_cpp as lib

    llm = backend._llm
    prompt, _ = backend.format_prompt(request(tokens, False).messages)
    reuse_prefix(llm, [])  # forget the cache: the prompt is evaluated again
    llm._ctx.kv_cache_clear()
    if depth:
        llm.eval(prompt)
    ctx, decode, sync = llm.ctx, lib.llama_decode, lib.llama_synchronize
    slot = (lib.llama_token * 1)()
    slot[0] = prompt[-1]
    batch = lib.llama_batch_get_one(slot, 1)
    start = time.perf_counter_ns()
    for _ in range(tokens):
        if decode(ctx, batch):
            raise RuntimeError("llama_decode failed")
        sync(ctx)
    elapsed = time.perf_counter_ns() - start
    # what llama-cpp-python thinks the cache holds no longer matches it: start afresh
    llm.reset()
    llm._ctx.kv_cache_clear()
    return tokens / (elapsed / 1e9)


def sampler_cpu(backend: LocalBackend, calls: int, blocks: int) -> dict[str, float]:
    """Each sampler alone on one token's logits (after the answer's prompt), called
    `calls` times in each of `blocks` interleaved blocks: thread CPU time per call, us
    (median over blocks; CPU time, not wall, so a busy machine's preemptions stay out).
    On the llama thread."""
    llm = backend._llm
    prompt, _ = backend.format_prompt(request(1, False).messages)
    reuse_prefix(llm, [])
    llm._ctx.kv_cache_clear()
    llm.eval(prompt)
    made = {
        "greedy: numpy argmax (phasechat)": sampling.greedy(llm),
        "greedy: llama.cpp's greedy sampler": sampling.chain(llm, 0.0),
        f"sampled: llama.cpp's chain, temp {TEMPERATURE}": sampling.chain(llm, TEMPERATURE),
    }
    times: dict[str, list[float]] = {name: [] for name in made}
    for _ in range(blocks):
        for name, sample in made.items():
            start = time.thread_time_ns()
            for _ in range(calls):
                sample()
            times[name].append((time.thread_time_ns() - start) / calls / 1e3)
    llm.reset()
    llm._ctx.kv_cache_clear()
    return {name: statistics.median(xs) for name, xs in times.items()}


#: the answers measured: (label, sampled)
SIDES: tuple[tuple[str, bool], ...] = (("greedy", False), (f"sampled (temp {TEMPERATURE})", True))


async def run(args: argparse.Namespace) -> int:
    model = fast_model.resolve(args.model)
    threads = args.threads or physical_cores()
    backend = LocalBackend(LocalConfig(model_path=model, threads=threads))
    await backend.start()
    if backend.state != "ready":
        print(f"model failed to load: {backend.state_detail}")
        return 1
    loop = asyncio.get_running_loop()
    print(f"{model.name} · {threads} threads · {backend.flash_note} · {load()}")
    print(f"sampled: temperature {TEMPERATURE}, seed {SEED}; {args.tokens} tokens an answer")
    names = [name for name, _ in SIDES]
    rates: dict[str, list[float]] = {"bare": [], "bare0": [], **{n: [] for n in names}}
    ratios: dict[str, list[float]] = {n: [] for n in names}
    splits = {n: Split() for n in names}
    for r in range(args.rounds):
        bare0 = await loop.run_in_executor(llama_thread(), bare_rate, backend, args.tokens, False)
        bare = await loop.run_in_executor(llama_thread(), bare_rate, backend, args.tokens, True)
        rates["bare"].append(bare)
        rates["bare0"].append(bare0)
        line = [f"round {r + 1}: bare {bare0:.1f} (depth 0), {bare:.1f}"]
        for name, is_sampled in SIDES:
            req = request(args.tokens, is_sampled)
            rate = await stream(backend, req, None)
            await stream(backend, req, splits[name])
            rates[name].append(rate)
            ratios[name].append(rate / bare)
            line.append(f"{name} {rate:.1f} ({rate / bare:.3f})")
        print(" · ".join(line) + f" · {load()}", flush=True)
    alone = await loop.run_in_executor(llama_thread(), sampler_cpu, backend, 200, 5)
    await backend.aclose()
    report(args.rounds, names, splits, rates, ratios)
    print("\none sampler call on the same logits, thread CPU us (median of 5 x 200 calls):")
    for name, us in alone.items():
        print(f"  {name:<34}{us:8.1f}")
    return 0


def report(
    rounds: int,
    names: list[str],
    splits: dict[str, Split],
    rates: dict[str, list[float]],
    ratios: dict[str, list[float]],
) -> None:
    """The split per token, then the rates and ratios."""
    width = 30
    print(f"\nper token, us (mean over {rounds} instrumented answers of each kind)")
    print(f"{'':<{width}}" + "".join(f"{n:>17}" for n in names))

    def line(label: str, cell: Callable[[Split], str]) -> None:
        print(f"{label:<{width}}" + "".join(f"{cell(splits[n]):>17}" for n in names))

    for part in PARTS:

        def cell(sp: Split, part: str = part) -> str:
            return f"{sp.per_token_us(part):.1f}"

        line(part, cell)
    line("beside llama_decode", lambda sp: f"{sp.beside_us():.1f}")
    line("  share of the step", lambda sp: f"{sp.beside_us() / sp.step_us():.1%}")
    line("event loop CPU (other thread)", lambda sp: f"{sp.loop_us():.1f}")
    depth0 = statistics.median(rates["bare0"])
    print("\ndecode tok/s (median), and stream / bare loop after the prompt, each round:")
    print(f"  bare loop from an empty cache (llama-bench tg128): {depth0:.1f}")
    print(f"  bare loop after the prompt (ask's depth): {statistics.median(rates['bare']):.1f}")
    for name in names:
        each = ", ".join(f"{x:.3f}" for x in ratios[name])
        med = statistics.median(rates[name])
        print(
            f"  {name}: {med:.1f}; ratios {each}; median {statistics.median(ratios[name]):.3f};"
            f" over the empty-cache loop {med / depth0:.3f}"
        )
    print(f"{load()} at the end")


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments and run."""
    doc = (__doc__ or "").split("\n")[0]
    p = argparse.ArgumentParser(prog="python -m bench.token_split", description=doc)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", type=int, default=128, help="decode steps per answer")
    p.add_argument("--threads", type=int, help="default: physical cores")
    p.add_argument("--model", help="GGUF path, or 'fast' (bench/fast_model.py)")
    return asyncio.run(run(p.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
