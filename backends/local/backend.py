"""The local backend: a GGUF model through llama-cpp-python, off the event loop.

All llama.cpp calls run on one dedicated thread, shared by every local backend of the
process (`llama_glue.llama_thread`), so a model loads in the background, generation
never blocks the UI, and requests are serialised without a lock. The thread talks to
the event loop only through `call_soon_threadsafe`.

We drive our own decode loop (`llama_glue.token_loop`) rather than
`create_chat_completion`, and do chat templating, detokenisation and stop strings here:
exact prompt/cached/evaluated token counts, one event per token, little Python per
token. The decode thread count adapts to a busy machine (backends/local/threads.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from phasechat.backends.base import LoadState, PromptRefused, RenderedPrompt, TokenCount
from phasechat.backends.events import (
    AnswerTokens,
    Event,
    Finished,
    FinishReason,
    GenerationRequest,
    Message,
    ModelLoaded,
    ModelLoading,
    Notice,
    PrefillProgress,
    PromptEvaluated,
    ReasoningDelta,
    ServerTimings,
    StreamError,
    TextDelta,
)
from phasechat.backends.local.flash import FlashChoice, decide, recheck
from phasechat.backends.local.gguf import KV_TYPE_NAMES, Geometry, GGUFError, geometry
from phasechat.backends.local.handoff import WAKE_S, Handoff
from phasechat.backends.local.llama_glue import (
    chat_formatter,
    engine_timings,
    eog_check,
    error_line,
    kv_common_prefix,
    kv_stats,
    llama_thread,
    load_error,
    overflow_error,
    perf_counters,
    physical_cores,
    piece_function,
    reuse_prefix,
    token_decoder,
    token_loop,
    usable_ctx,
    warm_up,
)
from phasechat.backends.local.llama_logs import quiet_llama, verbose
from phasechat.backends.local.models import ModelNotFound, default_model_path
from phasechat.backends.local.prompts import Prompts
from phasechat.backends.local.stops import StopMatcher
from phasechat.backends.local.think import ThinkSplitter
from phasechat.backends.local.threads import CpuShare, DecodeThreads

if TYPE_CHECKING:  # imported once llama.cpp is loaded: it subclasses llama.cpp's draft
    from phasechat.backends.local.draft import DraftCount


#: `draft=lookup`: prompt lookup, llama-cpp-python's draft without a model
DRAFT_LOOKUP = "lookup"
#: said when an answer with a draft is sampled: greedy verification keeps the answer the
#: model's own; sampled, it would need the draft's probabilities too
DRAFT_GREEDY_ONLY = "the draft speculates only at temperature 0: this answer decodes without it"


@dataclass(frozen=True, slots=True)
class LocalConfig:
    """How to load a local model. None means "choose the sensible default"."""

    model_path: Path | None = None
    n_ctx: int = 4096
    gpu_layers: int | None = None  # None: all layers when the build can offload, else 0
    # None: physical cores, fewer while a busy neighbour slows decode (backends/local/threads.py);
    # a number: exactly that many, always
    threads: int | None = None
    n_batch: int = 512
    chat_format: str | None = None  # None: the GGUF's template, else by architecture
    chat_template: str | None = None  # a Jinja chat template used instead of the GGUF's
    warmup: bool = True
    # None: whichever decodes faster here, measured once and cached (backends/local/flash.py)
    flash_attn: bool | None = None
    #: the KV cache's type for keys and values (gguf.KV_TYPE_NAMES): f16, q8_0, q4_0; a
    #: quantized V cache needs flash attention, which it then turns on
    kv_type: str = "f16"
    #: speculative decoding at temperature 0 (backends/local/draft.py): a draft GGUF with the
    #: model's vocabulary, or "lookup" (prompt lookup); None: none
    draft: str | None = None
    #: run the engine in a process of its own (backends/local/engine_process.py): the app's
    #: choice, so that its UI never holds the interpreter lock the engine needs
    own_process: bool = False


class LocalBackend:
    """A `Backend` over llama-cpp-python."""

    exact_token_counts = True
    serial = True  # one llama.cpp context: requests run one after the other

    def __init__(self, config: LocalConfig | None = None, name: str = "local") -> None:
        self.config = config or LocalConfig()
        self._name = name
        self._executor = llama_thread()
        self._llm: Any = None
        self._prompts: Prompts | None = None
        self._format_name = ""
        self._state: LoadState = "idle"
        self._detail = "not loaded"
        self._path: Path | None = config.model_path if config else None
        if self._path is None:
            # Named from the start (the first screen, the status line, the first answer's
            # label), not once loaded: finding the bundled file reads no code.
            with contextlib.suppress(ModelNotFound):
                self._path = default_model_path()
        self.geometry: Geometry | None = None
        self.gpu_layers = 0
        self.threads = 0
        self._threads: DecodeThreads | None = None
        # How busy other processes keep the cores from here to the first answer: begun
        # before the load, so even a quick load spans enough /proc/stat ticks to tell
        # (otherwise the first answer spends a window probing one thread fewer).
        self._cpu = CpuShare()
        self.flash_note = ""
        #: flash attention as loaded (None: not loaded yet)
        self.flash_attn: bool | None = None
        #: the measured flash-attention choice loaded with (None: set, a GPU, or rechecked)
        self._flash: FlashChoice | None = None
        #: notices from the load (a cache entry ignored), for the next answer
        self._pending: list[str] = []
        self.model_bytes = 0
        self._piece: Callable[[int], bytes] = lambda token: b""
        self._special_piece: Callable[[int], bytes] = lambda token: b""
        #: what this engine's token ids are valid for (`AnswerTokens.vocab`); "" unloaded
        self.vocab = ""
        self._load_task: asyncio.Future[None] | None = None
        #: when the load ended (`perf_counter_ns`, on the llama thread): the end of the
        #: wait of a request sent while it loaded
        self._ready_ns: int | None = None
        #: the draft it speculates with (backends/local/draft.py), and this answer's count
        self._draft: Any = None
        self._count: DraftCount | None = None

    # -- identity and state -------------------------------------------------------
    @property
    def name(self) -> str:
        return self._name

    @property
    def model(self) -> str:
        return self._path.name if self._path else "(default model)"

    @property
    def model_path(self) -> Path | None:
        return self._path

    @property
    def shares_cpu(self) -> bool:
        """Always, GPU or not: the engine runs in this process. With every layer on a GPU
        a step is about a millisecond, most of it the Python around `llama_decode`
        (sampling, detokenizing, stamping), which needs this process's interpreter lock;
        a UI drawing every frame beside it held the lock a fifth of the time and took a
        fifth of decode on an H200 (issue 35; `bench.tui_share --model fast --pace full`
        shows the same on a CPU)."""
        return True

    @property
    def state(self) -> LoadState:
        return self._state

    @property
    def ready_ns(self) -> int | None:
        """When the load ended (`perf_counter_ns`), stamped on the load's thread."""
        return self._ready_ns

    @property
    def state_detail(self) -> str:
        return self._detail

    @property
    def context_window(self) -> int | None:
        return usable_ctx(self._llm) if self._llm is not None else self.config.n_ctx

    @property
    def context_source(self) -> str | None:
        return "llama.cpp n_ctx"

    # -- loading -------------------------------------------------------------------
    async def start(self) -> None:
        """Load the model on the llama thread; safe to call more than once."""
        if self._load_task is None:
            self._state, self._detail = "loading", "loading model"
            loop = asyncio.get_running_loop()
            self._load_task = loop.run_in_executor(self._executor, self._load)
        await asyncio.shield(self._load_task)

    def _load(self) -> None:
        try:
            self._load_inner()
        except MemoryError:  # a buffer llama-cpp-python allocates with numpy
            self._state, self._detail = "failed", self._load_error("out of memory")
        except (GGUFError, ModelNotFound, ValueError, OSError) as exc:
            self._state, self._detail = "failed", self._load_error(error_line(exc))
        except Exception as exc:  # llama.cpp raises bare errors on bad files
            self._state, self._detail = "failed", f"model failed to load: {error_line(exc)}"

    def _load_error(self, message: str) -> str:
        return load_error(message, self.config.n_ctx, self._path, self.geometry)

    def _load_inner(self) -> None:
        quiet_llama()  # its log lines off (unless --verbose) before it is touched
        import llama_cpp

        path = self._path or default_model_path()
        self._path = path
        # rejects a missing, truncated, damaged or not-GGUF file, a FIFO: check_model's checks
        self.geometry = geometry(path, whole=True)
        g = self.geometry
        if g.n_ctx_train and self.config.n_ctx > g.n_ctx_train:
            raise ValueError(
                f"n_ctx {self.config.n_ctx} is larger than the model's trained context "
                f"({g.n_ctx_train} tokens); use --n-ctx {g.n_ctx_train} or less"
            )
        offload = bool(llama_cpp.llama_supports_gpu_offload())
        layers = self.config.gpu_layers
        self.gpu_layers = (-1 if offload else 0) if layers is None else layers
        self.threads = self.config.threads or physical_cores()
        self._detail = f"loading {path.name}"
        gpu = offload and self.gpu_layers != 0
        kv_type = KV_TYPE_NAMES.get(self.config.kv_type)
        if kv_type is None:
            raise ValueError(f"kv={self.config.kv_type!r}: one of {', '.join(KV_TYPE_NAMES)}")
        if self.config.kv_type != "f16" and self.config.flash_attn is False:
            raise ValueError(f"kv={self.config.kv_type} needs flash attention (llama.cpp)")
        setting = True if self.config.kv_type != "f16" else self.config.flash_attn
        flash = decide(setting, gpu, path, self.threads)
        self.flash_note, self._flash = flash.note, flash.choice
        self.flash_attn = flash.flash_attn
        if setting is not self.config.flash_attn:
            self.flash_note = f"flash attention on (the {self.config.kv_type} KV cache needs it)"
        if flash.notice is not None:
            self._pending.append(flash.notice)
        llm = llama_cpp.Llama(
            model_path=str(path),
            n_ctx=self.config.n_ctx,
            n_batch=self.config.n_batch,
            n_gpu_layers=self.gpu_layers,
            n_threads=self.threads,
            n_threads_batch=self.threads,
            chat_format=self.config.chat_format,
            flash_attn=flash.flash_attn,
            type_k=kv_type,
            type_v=kv_type,
            verbose=verbose(),
        )
        formatter, self._format_name = chat_formatter(
            llm, self.config.chat_format, g, self.config.chat_template
        )
        self._piece = piece_function(llm)
        self._special_piece = piece_function(llm, special=True)
        self.vocab = vocab_identity(path, int(llm.n_vocab()))
        self._prompts = Prompts(llm, formatter, self._format_name, self.vocab)
        self.model_bytes = int(llama_cpp.llama_model_size(llm.model))
        adaptive = self.config.threads is None
        self._threads = DecodeThreads.on_context(llm.ctx, self.threads, adaptive, self._cpu)
        if self.config.warmup:
            warm_up(llm)
        if self.config.draft is not None:
            from phasechat.backends.local.draft import make_draft  # subclasses llama.cpp's draft

            try:
                spec = self.config.draft
                draft = None if spec == DRAFT_LOOKUP else Path(spec).expanduser()
                self._draft = make_draft(
                    draft, path, self.config.n_ctx, self.threads, self.gpu_layers
                )
            except BaseException:
                llm.close()
                raise
        self._llm = llm
        self._ready_ns = time.perf_counter_ns()
        where = f"GPU ({self.gpu_layers} layers)" if gpu else "CPU"
        adapt = " (fewer when the cores are busy)" if self._threads.adaptive else ""
        self._state = "ready"
        self._detail = (
            f"{path.name} · {self._format_name} · {self.threads} threads{adapt} · {where}"
            f" · {self.flash_note}{self.draft_note}"
        )

    @property
    def draft_note(self) -> str:
        """The draft it speculates with, as the status detail ends ("" without one)."""
        spec = self.config.draft
        if spec is None:
            return ""
        return " · draft: prompt lookup" if spec == DRAFT_LOOKUP else f" · draft: {Path(spec).name}"

    async def aclose(self) -> None:
        llm, self._llm = self._llm, None
        draft, self._draft = self._draft, None
        loop = asyncio.get_running_loop()
        if llm is not None:
            await loop.run_in_executor(self._executor, llm.close)
        if draft is not None and hasattr(draft, "close"):
            await loop.run_in_executor(self._executor, draft.close)
        self._state, self._detail = "idle", "closed"

    # -- prompts -------------------------------------------------------------------
    def format_prompt(self, messages: Sequence[Message]) -> tuple[list[int], list[str]]:
        """Token ids of the chat-templated prompt, and the template's stop strings (the
        last one is kept: backends/local/prompts.py). Raises `PromptRefused`."""
        assert self._prompts is not None
        return self._prompts.tokens(messages)

    def prompt_opens_think(self, messages: Sequence[Message]) -> bool:
        """Whether the templated prompt ends inside an open `<think>` block."""
        assert self._prompts is not None
        return self._prompts.opens_think(messages)

    async def warm(self, messages: tuple[Message, ...]) -> int:
        """Evaluate the prompt of `messages` into the KV cache on the llama thread (after
        any request in flight); returns the tokens evaluated."""
        if self._state != "ready":
            return 0
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._warm, messages)

    def _warm(self, messages: tuple[Message, ...]) -> int:
        llm = self._llm
        if llm is None:
            return 0
        try:
            tokens, _ = self.format_prompt(messages)
        except PromptRefused:
            return 0
        if len(tokens) >= usable_ctx(llm):
            return 0
        start = reuse_prefix(llm, tokens)
        if start < len(tokens):
            llm.eval(tokens[start:])
        return len(tokens) - start

    async def render(self, messages: tuple[Message, ...]) -> RenderedPrompt | None:
        """The prompt through the model's template and tokenizer, on the llama thread
        (after any request in flight). None: not loaded, or the template refuses it."""
        if self._state != "ready":
            return None
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._render, messages)

    def _render(self, messages: tuple[Message, ...]) -> RenderedPrompt | None:
        if self._prompts is None:
            return None
        try:
            text, tokens = self._prompts.rendered(messages)
        except PromptRefused:
            return None
        return RenderedPrompt(text, tuple(self._special_piece(t) for t in tokens), "tokenizer")

    async def prompt_ids(self, messages: tuple[Message, ...]) -> list[int] | None:
        """The prompt's token ids through the model's template, on the llama thread
        (after any request in flight). None: not loaded, or the template refuses it."""
        if self._state != "ready":
            return None
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._prompt_ids, messages)

    def _prompt_ids(self, messages: tuple[Message, ...]) -> list[int] | None:
        try:
            return self.format_prompt(messages)[0]
        except PromptRefused:
            return None

    def cached_prefix(self, messages: tuple[Message, ...]) -> int | None:
        """Tokens of this prompt the KV cache already holds (None: not loaded).

        Call between requests: it reads the context's token history.
        """
        if self._llm is None:
            return None
        return kv_common_prefix(self._llm, self.format_prompt(messages)[0])

    def count_tokens(self, messages: tuple[Message, ...]) -> TokenCount:
        if self._llm is None:
            from phasechat.backends.tokens import estimate_messages

            return TokenCount(estimate_messages(messages), estimated=True)
        tokens, _ = self.format_prompt(messages)
        return TokenCount(len(tokens), estimated=False)

    # -- generation ------------------------------------------------------------------
    async def stream(
        self, request: GenerationRequest, *, every_s: float | None = None
    ) -> AsyncIterator[Event]:
        """Stream one answer; closing the iterator stops generation at the next token."""
        batches = self.batches(request, every_s=every_s)
        try:
            async for batch in batches:
                for event in batch:
                    yield event
        finally:
            # Leaving the loop does not close the inner generator: closed here, its own
            # `finally` stops the llama thread before this one returns.
            await batches.aclose()

    async def batches(
        self, request: GenerationRequest, *, every_s: float | None = None
    ) -> AsyncGenerator[list[Event], None]:
        """`stream`'s events as the llama thread hands them over, a batch at a time (for
        a consumer that forwards them: backends/local/engine_process.py)."""
        if self._state != "ready":
            if self._load_task is not None and self._state == "loading":
                # The wait for the model is its own phase: the recorder keeps it out of
                # the prefill (its rate, the verdict), inside the user's TTFT.
                yield [ModelLoading()]
                await asyncio.shield(self._load_task)
                if self.state == "ready":  # the property: the load thread set it
                    yield [ModelLoaded(self._ready_ns)]
            if self.state != "ready":
                yield [StreamError("model", f"local model not ready: {self._detail}")]
                return
        if self._pending:
            notices: list[Event] = [Notice(line) for line in self._pending]
            self._pending.clear()
            yield notices
        loop = asyncio.get_running_loop()
        handoff = Handoff(loop, every_s or WAKE_S)
        cancel = threading.Event()

        def emit(event: Event) -> None:
            handoff.put(event, urgent=not isinstance(event, TextDelta | ReasoningDelta))

        job = loop.run_in_executor(self._executor, self._generate, request, emit, cancel)
        try:
            done = False
            while not done:
                batch = await handoff.take()
                for i, event in enumerate(batch):
                    if isinstance(event, Finished | StreamError):
                        done, batch = True, batch[: i + 1]
                        break
                yield batch
        finally:
            cancel.set()
            # Wait for the thread to stop so the context is free for the next request.
            await asyncio.shield(job)

    def _generate(
        self, request: GenerationRequest, emit: Callable[[Event], None], cancel: threading.Event
    ) -> None:
        before = perf_counters(self._llm)
        answer_ids: list[int] = []
        try:
            reason, cached = self._generate_inner(request, emit, cancel, answer_ids)
        except _Handled:
            return
        except Exception as exc:  # a llama.cpp failure mid-generation
            emit(StreamError("model", f"generation failed: {error_line(exc)}"))
            return
        piece, ids = self._special_piece, tuple(answer_ids)
        emit(AnswerTokens(ids, tuple(piece(t) for t in ids), self.vocab))
        if self._count is None:
            timings = engine_timings(self._llm, before, cached)
        else:  # speculative: its batches are not prompt; what was drafted and kept
            timings = self._count.timings(before, perf_counters(self._llm), cached, len(ids))
        emit(timings)
        if (line := self._recheck_flash(timings)) is not None:
            emit(Notice(line))
        emit(kv_stats(self._llm, self.geometry, self.model_bytes))
        emit(Finished(reason))

    def _generate_inner(
        self,
        request: GenerationRequest,
        emit: Callable[[Event], None],
        cancel: threading.Event,
        answer_ids: list[int],
    ) -> tuple[FinishReason, int]:
        """Generate on the llama thread; returns how it ended and the cached prompt tokens.
        Each token is stamped here, as it is made (`TextDelta.t_ns`); each answer token's
        id is appended to `answer_ids` (the end-of-generation token is not the answer's)."""
        llm = self._llm
        try:
            tokens, template_stops = self.format_prompt(request.messages)
        except PromptRefused as exc:
            emit(StreamError("bad_request", str(exc)))
            raise _Handled from None
        n_ctx = usable_ctx(llm)
        if len(tokens) >= n_ctx:
            emit(overflow_error(len(tokens), n_ctx))
            raise _Handled
        prompt_tokens = len(tokens)
        clock = time.perf_counter_ns
        prefill = {"cached": 0, "t0": clock()}

        threads = self._threads
        assert threads is not None

        def on_prompt(cached: int, evaluated: int) -> None:
            prefill.update(cached=cached, t0=clock())
            emit(PromptEvaluated(prompt_tokens, cached, evaluated))
            emit(threads.begin())

        def on_batch(done: int) -> None:
            elapsed = (clock() - prefill["t0"]) / 1e6
            cached = prefill["cached"]
            emit(PrefillProgress(prompt_tokens, cached, cached + done, elapsed))

        stops = StopMatcher([*request.stop, *template_stops])
        think = ThinkSplitter(opened=self.prompt_opens_think(request.messages))
        decode = self.token_decoder()
        eog = eog_check(llm)
        limit = min(request.max_tokens, n_ctx - prompt_tokens)
        temp = max(0.0, request.temperature)
        if request.seed is not None:
            llm.set_seed(request.seed)
        n = 0
        reason: FinishReason = "length"
        self._count = None
        if self._draft is None or temp != 0.0:  # a draft speculates only when greedy
            if self._draft is not None:
                emit(Notice(DRAFT_GREEDY_ONLY))
            gen = token_loop(llm, tokens, temp, on_prompt, on_batch)
        else:
            from phasechat.backends.local.draft import DraftCount, speculative_loop

            self._count = DraftCount()
            gen = speculative_loop(llm, tokens, self._draft, self._count, on_prompt, on_batch)
        last = 0
        try:
            for token in gen:
                if cancel.is_set():
                    reason = "cancelled"
                    break
                if eog(token):
                    reason = "stop"
                    break
                answer_ids.append(token)
                n += 1
                made = clock()
                if last and (change := threads.gap(made - last, n)):
                    emit(change)
                last = made
                text, hit = stops.feed(decode(token))
                for event in think.token_events(text, made):
                    emit(event)
                if hit:
                    reason = "stop"
                    break
                if n >= limit:
                    break
        finally:
            gen.close()
            busy = threads.end()
        if busy is not None:
            emit(busy)
        tail = stops.flush(decode(None)) if reason != "stop" else ""
        for event in think.tail_events(tail):
            emit(event)
        return reason, prefill["cached"]

    def _recheck_flash(self, t: ServerTimings) -> str | None:
        """Whether this answer's decode rate disagrees with the flash-attention choice
        it loaded with (backends/local/flash.py `recheck`); a notice at most once a load."""
        choice = self._flash
        if choice is None or self._path is None or not t.predicted_n or not t.predicted_ms:
            return None
        steps = t.predicted_n
        line = recheck(self._path, self.threads, choice, t.predicted_ms / steps, steps)
        if line is not None:
            self._flash = None
        return line

    def token_decoder(self) -> Callable[[int | None], str]:
        """Token id -> the text it completes (llama_glue.token_decoder)."""
        return token_decoder(self._piece)


def vocab_identity(path: Path, n_vocab: int) -> str:
    """What a local model's token ids are valid for: its file (by path, size and change
    time, so a file replaced in place is another vocabulary) and its vocabulary size."""
    try:
        st = path.stat()
        stamp = f"{st.st_size}:{st.st_mtime_ns}"
    except OSError:
        stamp = "?"
    return f"llama.cpp:{path.resolve()}:{stamp}:{n_vocab}"


class _Handled(Exception):
    """Raised after an error event was already emitted."""
