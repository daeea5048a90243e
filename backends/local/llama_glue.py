"""llama-cpp-python glue for the local backend: chat templates, token pieces, the
decode loop and warm-up. Everything here runs on the llama thread (`llama_thread`)."""

from __future__ import annotations

import codecs
import os
from collections.abc import Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from phasechat.backends.events import KVStats, ServerTimings, StreamError
from phasechat.backends.local import sampling
from phasechat.backends.local.gguf import KV_TYPE_BYTES, Geometry
from phasechat.backends.local.offload import split

# Chat formats for GGUFs without a template, by architecture (llama-cpp-python names).
FORMAT_BY_ARCH = {"gemma": "gemma", "gemma2": "gemma", "gemma3": "gemma", "llama": "llama-2"}
#: Formats whose template has no system role: the system prompt joins the first user turn.
NO_SYSTEM_ROLE = {"gemma"}


_LLAMA_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llama")  # no thread yet


def llama_thread() -> ThreadPoolExecutor:
    """The one thread that runs llama.cpp in this process, for every local backend.

    With an OpenMP build, ggml's workers belong to the thread that starts them, and every
    op ends at an OpenMP barrier. A second thread that ever decodes brings a second team;
    libgomp then manages more threads than there are cores and its barriers sleep instead
    of spinning: decode measured 57-75 instead of 130-140 tok/s on 2 cores (bench/README,
    "One llama thread per process"). Local requests are serial anyway.
    """
    return _LLAMA_THREAD


def fold_system(msgs: list[dict[str, str]]) -> list[dict[str, str]]:
    """Formats without a system role get the system prompt prepended to the first user turn."""
    system = "\n\n".join(m["content"] for m in msgs if m["role"] == "system")
    rest = [dict(m) for m in msgs if m["role"] != "system"]
    if system and rest and rest[0]["role"] == "user":
        rest[0]["content"] = f"{system}\n\n{rest[0]['content']}"
    elif system:
        rest.insert(0, {"role": "user", "content": system})
    return rest


def chat_formatter(
    llm: Any, chat_format: str | None, geo: Geometry, chat_template: str | None = None
) -> tuple[Callable[..., Any], str]:
    """The prompt formatter: `chat_template` (Jinja) if given, else the GGUF's own
    template, else a named format."""
    from llama_cpp import llama_chat_format as lcf

    template = chat_template or llm.metadata.get("tokenizer.chat_template")
    if chat_format is None and template:
        eos_id, bos_id = llm.token_eos(), llm.token_bos()
        eos = llm._model.token_get_text(eos_id) if eos_id != -1 else ""
        bos = llm._model.token_get_text(bos_id) if bos_id != -1 else ""
        formatter = lcf.Jinja2ChatFormatter(
            template=template, eos_token=eos, bos_token=bos, stop_token_ids=[eos_id]
        )
        return formatter, "custom template" if chat_template else "gguf template"
    name = chat_format or FORMAT_BY_ARCH.get(geo.architecture, "chatml")
    func = getattr(lcf, "format_" + name.replace("-", "").replace(".", "_"), None)
    if func is None:
        raise ValueError(f"unknown chat format {name!r}")
    return func, name


def piece_function(llm: Any, special: bool = False) -> Callable[[int], bytes]:
    """Token id -> its bytes, memoised (a vocabulary's pieces never change); `special`:
    control tokens (`<|im_start|>`) as their text, as a chat template writes them."""
    import ctypes

    import llama_cpp

    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    buf = ctypes.create_string_buffer(256)
    cache: dict[int, bytes] = {}

    def piece(token: int) -> bytes:
        out = cache.get(token)
        if out is None:
            n = llama_cpp.llama_token_to_piece(vocab, token, buf, len(buf), 0, special)
            if n < 0:  # a longer piece than the buffer: never for real vocabularies
                big = ctypes.create_string_buffer(-n)
                n = llama_cpp.llama_token_to_piece(vocab, token, big, -n, 0, special)
                out = big.raw[:n]
            else:
                out = buf.raw[:n]
            cache[token] = out
        return out

    return piece


def eog_check(llm: Any) -> Callable[[int], bool]:
    """End-of-generation test for this model's vocabulary (EOS, EOT, <end_of_turn>...)."""
    import llama_cpp

    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    return lambda token: bool(llama_cpp.llama_vocab_is_eog(vocab, token))


def token_loop(
    llm: Any,
    tokens: list[int],
    temp: float,
    on_prompt: Callable[[int, int], None],
    on_batch: Callable[[int], None],
) -> Generator[int, None, None]:
    """`Llama.generate` without its per-token Python: one C decode per token, and the
    token chosen by backends/local/sampling.py (greedy by numpy argmax over the logits buffer;
    other temperatures by the chain `Llama.generate` builds).

    The prompt still goes through `llm.eval`, so `n_tokens` / `input_ids` stay Llama's
    record of the KV cache for the next request. `on_prompt(cached, evaluated)` is called
    once the prefix reuse is known; the rest is evaluated one `n_batch` at a time (as
    `Llama.eval` does inside) with `on_batch(evaluated so far)` after each batch.
    """
    import llama_cpp.llama_cpp as lib

    read_prompt(llm, tokens, on_prompt, on_batch)
    ctx, decode, ids = llm.ctx, lib.llama_decode, llm.input_ids
    sample = sampling.greedy(llm) if temp == 0.0 else sampling.chain(llm, temp)
    slot = (lib.llama_token * 1)()
    batch = lib.llama_batch_get_one(slot, 1)  # no positions: they follow the KV cache
    while True:
        token = sample()
        yield token
        slot[0] = token
        if rc := decode(ctx, batch):
            raise RuntimeError(f"llama_decode returned {rc}")
        ids[llm.n_tokens] = token
        llm.n_tokens += 1


def read_prompt(
    llm: Any,
    tokens: list[int],
    on_prompt: Callable[[int, int], None],
    on_batch: Callable[[int], None],
) -> None:
    """Evaluate the part of `tokens` the KV cache does not hold, one `n_batch` at a time
    (`token_loop` says what the callbacks are told)."""
    start = reuse_prefix(llm, tokens)
    on_prompt(start, len(tokens) - start)
    step = int(llm.n_batch)
    for i in range(start, len(tokens), step):
        llm.eval(tokens[i : i + step])
        on_batch(min(len(tokens), i + step) - start)


def usable_ctx(llm: Any) -> int:
    """The tokens a context holds: llama.cpp's n_ctx, but no more than llama-cpp-python's
    record of the cache (`input_ids`, sized by the n_ctx asked for). llama.cpp pads a
    small n_ctx up (16 becomes 256), so a prompt that fits its n_ctx could overrun that
    record: "could not broadcast input array from shape (5,) into shape (0,)"."""
    return min(int(llm.n_ctx()), len(llm.input_ids))


def reuse_prefix(llm: Any, tokens: list[int]) -> int:
    """Trim the KV cache to its common prefix with `tokens`; return that length. Same rule
    as `Llama.generate`: a prompt held whole replays its last token to refresh the logits,
    unless the cache holds exactly this prompt and the logits are live."""
    import numpy as np

    held = int(llm.n_tokens)
    m = min(held, len(tokens))
    diff = np.flatnonzero(llm.input_ids[:m] != np.asarray(tokens[:m]))
    common = int(diff[0]) if diff.size else m
    if common == len(tokens):
        if held == common and not llm._requires_eval:
            return common
        common -= 1
    if common > 0 and llm._ctx.kv_cache_seq_rm(-1, common, -1):
        llm.n_tokens = common
        llm._requires_eval = True
        return common
    llm.reset()
    return 0


def kv_common_prefix(llm: Any, tokens: list[int]) -> int:
    """How many of `tokens` the KV cache holds now (its common prefix with them)."""
    held = llm.input_ids[: llm.n_tokens]
    cached = 0
    for a, b in zip(held, tokens, strict=False):
        if a != b:
            break
        cached += 1
    return cached


def warm_up(llm: Any) -> None:
    """Pay the first-request cost (graph allocation, grows with n_ctx) during load:
    one prompt-sized batch and one single-token decode, then forget them."""
    bos = llm.token_bos()
    seed = [bos if bos >= 0 else 0] * 8
    llm.eval(seed)
    llm.eval(seed[:1])
    llm.reset()
    llm._ctx.kv_cache_clear() if hasattr(llm._ctx, "kv_cache_clear") else None


def physical_cores() -> int:
    """Physical cores available to this process (llama.cpp's best thread count)."""
    try:
        cpus = os.sched_getaffinity(0)
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, (os.cpu_count() or 2) // 2)
    siblings: set[str] = set()
    for cpu in cpus:
        path = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
        try:
            siblings.add(path.read_text().strip())
        except OSError:
            return len(cpus)
    return max(1, len(siblings))


def perf_counters(llm: Any) -> tuple[float, float, int, int]:
    """llama.cpp's cumulative perf counters: (prompt ms, decode ms, prompt n, decode n)."""
    import llama_cpp

    # The counters are updated when llama.cpp synchronises with the last batch; without
    # this, a request's delta would include the previous request's final batch.
    llama_cpp.llama_synchronize(llm.ctx)
    d = llama_cpp.llama_perf_context(llm.ctx)
    # llama_perf_context reports a count of 0 as 1 (std::max(1, n)): a kind of eval that
    # has not run yet has taken no time, so its count is 0. (Without this, the first
    # answer after a load counts one decode too few.)
    n_p_eval = int(d.n_p_eval) if d.t_p_eval_ms > 0 else 0
    n_eval = int(d.n_eval) if d.t_eval_ms > 0 else 0
    return float(d.t_p_eval_ms), float(d.t_eval_ms), n_p_eval, n_eval


def engine_timings(llm: Any, before: tuple[float, float, int, int], cached: int) -> ServerTimings:
    """This request's share of llama.cpp's own counters, in llama-server's shape, with
    `cache_n` the prompt tokens reused from the KV cache (as llama-server reports it).

    The counters are cumulative, so we report deltas. llama.cpp counts any 1-token
    batch as decode, so a one-token prompt batch shows up in predicted_n.
    """
    after = perf_counters(llm)
    return ServerTimings(
        prompt_n=after[2] - before[2],
        prompt_ms=after[0] - before[0],
        predicted_n=after[3] - before[3],
        predicted_ms=after[1] - before[1],
        cache_n=cached,
    )


def load_error(message: str, n_ctx: int, path: Path | None, g: Geometry | None) -> str:
    """llama.cpp's terse load failures, with their usual cause (memory) and the way out.

    llama.cpp returns NULL without saying why; short of a damaged file, the reason is
    an allocation that failed: the weights, or the KV cache and compute buffers,
    which grow with n_ctx.
    """
    name = path.name if path else "the model"
    if message in ("out of memory", "Failed to create llama_context"):
        kv = g.kv_bytes(n_ctx, n_ctx) / 2**20 if g else 0.0
        cache = f" (KV cache ≈ {kv:,.0f} MiB)" if kv else ""
        return (
            f"not enough memory for {name} with n_ctx {n_ctx:,}{cache}: "
            "use a smaller --n-ctx or free memory"
        )
    if message.startswith("Failed to load model from file") and path is not None:
        size = path.stat().st_size / 2**20 if path.exists() else 0.0
        return (
            f"llama.cpp could not load {name} ({size:,.0f} MiB): "
            "not enough memory, or a damaged file"
        )
    return message


def token_decoder(piece: Callable[[int], bytes]) -> Callable[[int | None], str]:
    """Token id -> the text it completes. A character whose UTF-8 bytes span several
    tokens comes out once, whole, with the token that completes it. None ends the
    answer: the bytes of a character the answer stopped inside (max_tokens in the
    middle of a Japanese character) are dropped, never shown as U+FFFD."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def decode(token: int | None) -> str:
        if token is None:
            decoder.reset()  # an incomplete character: not text
            return ""
        return decoder.decode(piece(token))

    return decode


def kv_stats(llm: Any, g: Geometry | None, model_bytes: int) -> KVStats:
    """KV fill from the context, bytes from the GGUF geometry and the cache type, and
    with layers on a GPU, the bytes a decode step reads on each side."""
    import llama_cpp

    used, cap = int(llm.n_tokens), int(llm.n_ctx())
    if g is None:
        return KVStats(used, cap, 0, 0)
    type_bytes = KV_TYPE_BYTES.get(int(llm.context_params.type_k), 2.0)
    swa_full = bool(llm.context_params.swa_full)
    used_bytes = g.kv_bytes(used, cap, type_bytes, swa_full)
    where = None
    if g.weights is not None and llama_cpp.llama_supports_gpu_offload():
        where = split(g.weights, int(llm.model_params.n_gpu_layers), used_bytes)
    return KVStats(
        used,
        cap,
        used_bytes,
        g.kv_bytes(cap, cap, type_bytes, swa_full),
        model_bytes,
        where.gpu_bytes if where else None,
        where.cpu_bytes if where else None,
    )


def overflow_error(prompt_tokens: int, n_ctx: int) -> StreamError:
    """The error for a prompt that does not fit the context."""
    return StreamError(
        "context_overflow",
        f"the prompt is {prompt_tokens:,} tokens; the context holds {n_ctx:,}. "
        "Trim the history or raise --n-ctx.",
        detail={"prompt_tokens": prompt_tokens, "n_ctx": n_ctx},
    )


def error_line(exc: BaseException) -> str:
    """An exception's first line (its type's name when it has no message)."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
