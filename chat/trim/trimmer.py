"""The history trimmer: old turns become one summary so the prompt stops growing.

The prompt a backend gets is `system, [summary], recent turns`. The system prompt stays
first and byte-identical; the summary (one message, written by a backend) replaces the
oldest turns; the newest turns stay verbatim. Nothing is deleted: summarized messages
stay in the conversation and are only left out of the prompt (`covered` holds their ids).

Prefix caches (llama.cpp, llama-server, vLLM) reuse the longest common token prefix of
consecutive prompts, so the trimmer changes the start of the prompt as rarely as it can:
a summary, once written, is reused as is, and each trim cuts deep (down to `target` of
the budget), so many turns pass between two trims and each of them reuses the prefix.

The summary is written in the background (an asyncio task) after an answer finishes,
once the history is near the budget, so it is usually ready before the send that needs
it. If it is not: a send that still fits goes out untrimmed; one that does not waits.
A local backend runs one request at a time, so a send behind a summary on that same
backend would wait for it anyway: it waits for the summary explicitly and says so.

The controller asks for a plan before each send (`plan`, a `SendPlan`) and tells what
happened after it (`tell`, one of `News`); the panel reads `TrimStats`. Those records are
here, beside the one class that makes and reads them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace

from phasechat.backends.base import Backend
from phasechat.backends.events import GenerationRequest, Message
from phasechat.chat.conversation import ChatMessage, Conversation
from phasechat.chat.trim.summarize import INSTRUCTION, Summary, fit, write_summary
from phasechat.telemetry.metrics import Metrics


@dataclass(frozen=True, slots=True)
class SendPlan:
    """How one send relates to the trimmer; copied onto the exchange for the UI.

    `trimmed`: this send is the first with a new summary (its prefix cache starts over
    after the system prompt). `wait`: the send must wait for the summary in flight.
    `note`: one line for the user when the trimmer did something unexpected.
    """

    trimmed: bool = False
    wait: bool = False
    note: str | None = None
    waited_ms: float | None = None
    serial: bool = False  # the summary runs on the chat's own local model, one at a time
    # What `Trimmer.plan` adds for the controller (the rest of a send, decided once):
    #: the messages to send (system, the summary in use, the turns it does not cover)
    messages: tuple[Message, ...] = ()
    #: our own count of them, and whether it is the model's tokenizer's (not an estimate)
    prompt_tokens: int | None = None
    exact: bool = False
    #: the window to measure against, and who said so
    window: int | None = None
    window_source: str | None = None
    #: prompt tokens the summary cut from this send (0 when it waits, or is sent again)
    tokens_cut: int = 0
    #: `wait`: await it for the plan to send once the summary in flight is written
    ready: Callable[[], Awaitable[SendPlan]] | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class Shown:
    """The chat shows another branch (an edit, a sibling, another chat)."""

    conversation: Conversation


@dataclass(frozen=True, slots=True)
class Answered:
    """An answer finished (not failed) on `backend`: the history grew."""

    backend: Backend
    conversation: Conversation
    max_tokens: int


@dataclass(frozen=True, slots=True)
class Refused:
    """The server refused the prompt as longer than its window (`n_ctx`, where it named
    one): trim to fit and send once more."""

    backend: Backend
    conversation: Conversation
    max_tokens: int
    n_ctx: int | None


#: What the controller tells the trimmer (`Trimmer.tell`).
News = Shown | Answered | Refused


@dataclass(frozen=True, slots=True)
class TrimStats:
    """What the telemetry panel shows about trimming."""

    enabled: bool
    budget: int
    estimated: bool  # token counts are tiktoken estimates, not the model's tokenizer
    summaries: int
    summarized_messages: int
    pending: bool
    tokens_cut: int  # the last prompt: full history minus what was sent
    tokens_cut_total: int  # summed over every send
    prefill_tok_s: float | None  # measured on this session's own answers
    prefill_s_saved: float | None  # tokens_cut_total / prefill_tok_s, as a cold prefill
    summary_ttft_ms: float | None  # the latest summary's own cost
    summary_e2e_ms: float | None
    summary_tokens: int | None
    summary_ms_total: float  # every summary's e2e, summed
    last_error: str | None
    summary_kind: str | None = None  # the one in use: "model" or "extractive"
    summary_why: str | None = None  # why the model's was not used


def measured_prefill_rate(answers: Sequence[Metrics | None]) -> float | None:
    """Evaluated prompt tokens per second over answers whose prefill was long enough to
    measure (a handful of tokens is dominated by fixed per-request overhead)."""
    tokens = seconds = 0.0
    for m in answers:
        ttft = m.ttft_ready_ms if m else None  # a wait for the model to load is not prefill
        if m and m.evaluated_prompt_tokens and ttft and m.evaluated_prompt_tokens >= 32:
            tokens += m.evaluated_prompt_tokens
            seconds += ttft / 1000
    return tokens / seconds if seconds else None


#: Context assumed for an endpoint that does not tell its window (most don't).
DEFAULT_CONTEXT = 8192
#: Tokens kept free beyond the answer (template framing of the next turn, count drift).
MARGIN = 64
#: Budget share kept back when counts are tiktoken estimates of another tokenizer.
ESTIMATE_SLACK = 0.10
#: Turns of the chat's own growth a trim leaves room for before the next one.
CALM_TURNS = 4


class Trimmer:
    """Keeps a chat's prompt under a token budget by summarizing its oldest turns.

    Settings are plain attributes the UI may change at any time: `enabled`, `budget`
    (None: derived from the context size and max_tokens), `keep_last` (recent turns
    kept verbatim), `summarizer` (None: the active backend), `target` (share of the
    budget a trim cuts down to), `lookahead` (turns of growth that start a summary: 1, when
    the next turn would not fit; the summary is written while the user reads and types),
    `summary_tokens` (None: an eighth of the budget, at most 256), `context` (None: the
    backend's n_ctx, else DEFAULT_CONTEXT).
    """

    def __init__(
        self,
        *,
        enabled: bool = True,
        budget: int | None = None,
        keep_last: int = 4,
        summarizer: Backend | None = None,
        target: float = 0.5,
        lookahead: int = 1,
        summary_tokens: int | None = None,
        context: int | None = None,
    ) -> None:
        self.enabled = enabled
        self.budget = budget
        self.keep_last = keep_last
        self.summarizer = summarizer
        self.target = target
        self.lookahead = lookahead
        self.summary_tokens = summary_tokens
        self.context = context
        self.instruction = INSTRUCTION
        self.summary: Summary | None = None  # the one in use
        self.summaries: list[Summary] = []  # every summary written, oldest first
        self.last_error: str | None = None
        self.tokens_cut_total = 0
        self.last_tokens_cut = 0
        self._task: asyncio.Task[Summary | None] | None = None
        self._task_backend: Backend | None = None
        self._task_covers: frozenset[int] = frozenset()  # what the summary in flight stands for
        self._growth: list[int] = []  # history tokens after each answer since the last trim
        self._estimated = False
        self._fresh = False  # a summary was taken into use and no send has used it yet
        #: windows servers named when they refused a prompt, by backend name
        self.windows: dict[str, int] = {}
        #: pre-fill the trimmed prompt once a background summary is written
        self.prefill = True
        self._warming: asyncio.Future[int] | None = None

    # -- what goes into the prompt ------------------------------------------------------
    @property
    def covered(self) -> frozenset[int]:
        """Ids of the messages the summary in use stands for."""
        return self.summary.covers if self.summary else frozenset()

    @property
    def in_use(self) -> Summary | None:
        """The summary a send uses now (None: none, or trimming is off)."""
        return self.summary if self.enabled else None

    def is_summarized(self, message: ChatMessage) -> bool:
        """Whether `message` is left out of the prompt, replaced by the summary."""
        return self.enabled and message.id in self.covered

    def prompt_messages(self, conversation: Conversation) -> tuple[Message, ...]:
        """System prompt, the summary in use, then every message it does not cover."""
        if not self.enabled or self.summary is None:
            return conversation.prompt_messages()
        out = [self.summary.system(conversation.system)]
        out.extend(m.as_message() for m in conversation.sendable(self.summary.covers))
        return tuple(out)

    def follow(self, conversation: Conversation) -> None:
        """The chat shows another branch (an edit, a sibling, another chat): a summary
        that stands for messages not on it no longer applies, and one being written
        (of the branch before) is dropped. A summary of the shared start stays."""
        on_branch = {m.id for m in conversation.messages}
        if self.summary is not None and not self.summary.covers <= on_branch:
            self.summary = None
            self._growth.clear()
        if self._task is not None and not self._task_covers <= on_branch:
            self._task.cancel()
            self._task = self._task_backend = None

    def context_for(self, backend: Backend) -> int:
        """The context window the budget is carved from."""
        if self.context:
            return self.context
        n_ctx = self.windows.get(backend.name) or backend.context_window
        return n_ctx if n_ctx is not None and n_ctx > 0 else DEFAULT_CONTEXT

    def budget_for(self, backend: Backend, max_tokens: int) -> int:
        """Prompt tokens allowed: the set budget, else n_ctx - max_tokens - MARGIN
        (less ESTIMATE_SLACK of the context when counts are estimates)."""
        if self.budget:
            return self.budget
        ctx = self.context_for(backend)
        slack = 0 if backend.exact_token_counts else int(ctx * ESTIMATE_SLACK)
        return max(1, ctx - max_tokens - MARGIN - slack)

    def summary_budget(self, budget: int) -> int:
        """Max tokens of a summary answer."""
        return self.summary_tokens or max(16, min(256, budget // 8))

    @property
    def pending(self) -> bool:
        """A summary is being written."""
        return self._task is not None and not self._task.done()

    # -- the controller's two calls ----------------------------------------------------
    def plan(self, backend: Backend, conversation: Conversation, max_tokens: int) -> SendPlan:
        """Everything about the next send of `conversation` (its new user turn in it) to
        `backend`: the messages, our count of them, the window, and whether it uses a new
        summary or must wait for one (then await `ready` for the plan to send).

        Raises `PromptRefused` where the backend cannot read the prompt at all."""
        self.follow(conversation)
        plan = self.prepare(backend, conversation, max_tokens)
        if plan.wait:
            waited = plan

            async def ready() -> SendPlan:
                return self._complete(
                    backend, conversation, await self.wait(waited), count_cut=True
                )

            return replace(self._complete(backend, conversation, plan), ready=ready)
        return self._complete(backend, conversation, plan, count_cut=True)

    def tell(self, news: News) -> SendPlan | None:
        """What happened since the last plan: the chat shows another branch (`Shown`), an
        answer finished (`Answered`: a summary may start in the background), or the
        server refused the prompt as too long (`Refused`: the window it named is kept,
        and a summary to fit it starts; the plan returned waits for it, and sends again
        where `trimmed` once `ready`). None where there is nothing to send again."""
        match news:
            case Shown(conversation):
                self.follow(conversation)
            case Answered(backend, conversation, max_tokens):
                self.after_answer(backend, conversation, max_tokens)
            case Refused(backend, conversation, max_tokens, n_ctx):
                return self._refused(backend, conversation, max_tokens, n_ctx)
        return None

    def _refused(
        self, backend: Backend, conversation: Conversation, max_tokens: int, n_ctx: int | None
    ) -> SendPlan | None:
        if not self.enabled:
            return None
        if n_ctx is not None and n_ctx > 0:
            self.windows[backend.name] = n_ctx
        self._collect()
        if self._task is None and not self.start(backend, conversation, max_tokens):
            return None
        waiting = SendPlan(wait=True, serial=self._serial(backend))

        async def ready() -> SendPlan:
            plan = await self.wait(waiting)
            return self._complete(backend, conversation, plan) if plan.trimmed else plan

        return replace(waiting, ready=ready)

    def _complete(
        self,
        backend: Backend,
        conversation: Conversation,
        plan: SendPlan,
        *,
        count_cut: bool = False,
    ) -> SendPlan:
        """`plan` with the messages it sends, their count and the window; `count_cut`:
        the send is final, so what the summary cut from it is counted."""
        messages = self.prompt_messages(conversation)
        count = backend.count_tokens(messages)
        learned = self.windows.get(backend.name)
        cut = self.sent(backend, conversation, count.tokens) if count_cut else 0
        return replace(
            plan,
            messages=messages,
            prompt_tokens=count.tokens,
            exact=not count.estimated,
            window=learned or backend.context_window,
            window_source="the server's refusal" if learned else backend.context_source,
            tokens_cut=cut,
        )

    # -- around a send ------------------------------------------------------------------
    def prepare(self, backend: Backend, conversation: Conversation, max_tokens: int) -> SendPlan:
        """Decide, before a send, whether it uses a new summary, waits, or goes out whole.

        Called with the new user turn already in `conversation`.
        """
        if not self.enabled:
            return SendPlan()
        failed = self._collect()
        note = f"{failed}; sent full history" if failed else None
        trimmed, self._fresh = self._fresh, False
        budget = self.budget_for(backend, max_tokens)
        tokens = self._count(backend, self.prompt_messages(conversation))
        if self._task is None and tokens > budget:
            # Over budget with no summary on the way (a long paste, the trimmer just
            # switched on, or the last summary failed): write one now and wait for it.
            if self.start(backend, conversation, max_tokens):
                return SendPlan(wait=True, note=note, serial=self._serial(backend))
            note = note or (
                f"over budget ({tokens:,} > {budget:,} tokens) with too few turns "
                f"to summarize (keeping the last {self.keep_last}): sent as is"
            )
            return SendPlan(trimmed=trimmed, note=note)
        if self._task is None:
            return SendPlan(trimmed=trimmed, note=note)
        serial = self._serial(backend)
        if tokens <= budget and not serial:
            return SendPlan(note="summary not ready: sent full history")
        return SendPlan(wait=True, serial=serial)

    def _serial(self, backend: Backend) -> bool:
        """The summary in flight holds the chat's own local model: a send queues behind it."""
        return self._task_backend is backend and backend.serial

    async def wait(self, plan: SendPlan) -> SendPlan:
        """Wait for the summary in flight, then use it (or say why not)."""
        task = self._task
        if task is None:
            return SendPlan(note=plan.note)
        t0 = time.perf_counter()
        await asyncio.shield(task)
        waited = (time.perf_counter() - t0) * 1000
        failed = self._collect()
        if failed is None and (task.cancelled() or task.result() is None):
            failed = f"summary failed: {self.last_error or 'cancelled'}"
        if failed is not None:
            return SendPlan(note=f"{failed}; sent full history", waited_ms=waited)
        self._fresh = False
        where = " (the local model runs one request at a time)" if plan.serial else ""
        return SendPlan(
            trimmed=True, note=f"waited {waited:,.0f} ms for the summary{where}", waited_ms=waited
        )

    def sent(self, backend: Backend, conversation: Conversation, prompt_tokens: int) -> int:
        """Record a send of `prompt_tokens`; returns the tokens the summary cut from it."""
        cut = 0
        if self.enabled and self.summary is not None:
            full = self._count(backend, conversation.prompt_messages())
            cut = max(0, full - prompt_tokens)
        self.last_tokens_cut = cut
        self.tokens_cut_total += cut
        return cut

    def after_answer(self, backend: Backend, conversation: Conversation, max_tokens: int) -> bool:
        """After an answer: start a summary in the background if the budget will be
        exceeded within `lookahead` turns. Returns whether one was started."""
        if not self.enabled or self._task is not None:
            return False
        budget = self.budget_for(backend, max_tokens)
        tokens = self._count(backend, self.prompt_messages(conversation))
        self._growth.append(tokens)
        recent = self._growth[-4:]
        diffs = [b - a for a, b in itertools.pairwise(recent) if b > a]
        per_turn = sum(diffs) / len(diffs) if diffs else max_tokens + 32
        if tokens + self.lookahead * per_turn <= budget:
            return False
        if not self.start(backend, conversation, max_tokens):
            return False
        assert self._task is not None
        self._task.add_done_callback(lambda task: self._written(task, backend, conversation))
        return True

    def _written(
        self, task: asyncio.Task[Summary | None], backend: Backend, conversation: Conversation
    ) -> None:
        """A background summary is ready: use it, and have the chat's backend read the
        trimmed prompt into its cache now, while the user reads and types, so the send
        that first uses the summary finds its prefix cached (a local model; a server that
        cannot be asked to prefill ignores it)."""
        if task.cancelled() or task.result() is None or task is not self._task:
            return  # a failure is reported by the next send, which sends the full history
        self._collect()
        if not self.prefill:
            return
        self._warming = asyncio.ensure_future(backend.warm(self.prompt_messages(conversation)))

    # -- writing a summary --------------------------------------------------------------
    def start(self, backend: Backend, conversation: Conversation, max_tokens: int) -> bool:
        """Start a background summary of the oldest turns; False if there is nothing
        to summarize (fewer than two turns not yet covered: the last is always kept)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # called from sync code with no loop: nothing can run it
            return False
        summarizer = self.summarizer or backend
        budget = self.budget_for(backend, max_tokens)
        cut = self._plan(backend, conversation, budget)
        if not cut:
            return False
        if self.summary is not None:
            head = [self.summary.system(conversation.system)]
        else:
            head = [Message("system", conversation.system)] if conversation.system else []
        body = [Message(m.role, m.content) for m in cut if m.in_prompt]
        limit = self.summary_budget(budget)
        ask = Message("user", self.instruction.format(words=max(10, limit * 3 // 5)))
        # The summary request starts with the chat's own prefix, so an engine with a
        # prefix cache (the local model right after the last answer) reuses it.
        room = self.context_for(summarizer) - limit - MARGIN // 2
        messages = fit(lambda m: self._count(summarizer, m), [*head, *body, ask], len(head), room)
        request = GenerationRequest(messages=messages, max_tokens=limit, temperature=0.0)
        covers = self.covered | {m.id for m in cut}
        self._task_backend, self._task_covers = summarizer, frozenset(covers)
        self._task = asyncio.create_task(
            self._write(summarizer, request, frozenset(covers), body), name="phasechat-summary"
        )
        return True

    def goal(self, budget: int) -> int:
        """Prompt tokens a trim cuts down to, summary included: `target` of the budget,
        and low enough that CALM_TURNS more turns of this chat's own growth fit after it
        (so a trim buys calm turns that reuse the prefix, instead of one per turn)."""
        grown = [b - a for a, b in itertools.pairwise(self._growth[-5:]) if b > a]
        per_turn = sum(grown) / len(grown) if grown else 0.0
        return int(min(budget * self.target, budget - CALM_TURNS * per_turn))

    def _plan(self, backend: Backend, conversation: Conversation, budget: int) -> list[ChatMessage]:
        """The oldest uncovered turns to summarize: as few as bring the prompt down to
        `goal`, found by binary search (the remaining prompt shrinks as the cut deepens).
        The fewest turns summarized keeps the most recent ones verbatim, so the last
        `keep_last` are kept whenever they fit the goal; `keep_last` only narrows the
        search (any value gives the same cut). When the last turns alone exceed the goal
        they yield, down to the last turn."""
        covered = self.covered
        rest = [m for m in conversation.messages if m.id not in covered]
        starts = [i for i, m in enumerate(rest) if m.role == "user"]
        last = len(starts) - 1  # the deepest cut keeps the last turn only
        if last < 1:
            return []
        system = [Message("system", conversation.system)] if conversation.system else []
        goal = self.goal(budget) - self.summary_budget(budget) - 16

        def tokens_after(j: int) -> int:
            kept = [Message(m.role, m.content) for m in rest[starts[j] :] if m.in_prompt]
            return self._count(backend, (*system, *kept))

        preferred = len(starts) - max(1, self.keep_last)  # keeps the last keep_last turns
        lo, hi = 1, last  # binary search: the remaining prompt shrinks as the cut deepens
        if preferred >= 1 and tokens_after(preferred) <= goal:
            hi = preferred  # the preferred cut reaches the goal: the best cut is within it
        elif tokens_after(last) > goal:
            return rest[: starts[last]]  # even the last turn alone is over: cut the rest
        while lo < hi:
            mid = (lo + hi) // 2
            if tokens_after(mid) <= goal:
                hi = mid
            else:
                lo = mid + 1
        return rest[: starts[lo]]

    async def _write(
        self,
        backend: Backend,
        request: GenerationRequest,
        covers: frozenset[int],
        turns: Sequence[Message],
    ) -> Summary | None:
        """Run the summary request (chat/summarize.py); keep the reason of a failure."""
        earlier = self.summary.text if self.summary is not None else ""
        summary, self.last_error = await write_summary(backend, request, covers, turns, earlier)
        return summary

    def _collect(self) -> str | None:
        """Take the result of a finished summary task: use it, or return why not."""
        task = self._task
        if task is None or not task.done():
            return None
        self._task = self._task_backend = None
        summary = None if task.cancelled() else task.result()
        if summary is None:
            return f"summary failed: {self.last_error or 'cancelled'}"
        self.summary = summary
        self.summaries.append(summary)
        self._growth.clear()
        self._fresh = True
        return None

    def _count(self, backend: Backend, messages: Sequence[Message]) -> int:
        count = backend.count_tokens(tuple(messages))
        self._estimated = count.estimated
        return count.tokens

    # -- reporting ----------------------------------------------------------------------
    def stats(
        self, backend: Backend, max_tokens: int, answers: Sequence[Metrics | None]
    ) -> TrimStats:
        """The panel's figures; `answers` are the session's own exchanges' metrics."""
        rate = measured_prefill_rate(answers)
        latest = self.summary.metrics if self.summary else None
        return TrimStats(
            enabled=self.enabled,
            budget=self.budget_for(backend, max_tokens),
            estimated=self._estimated or not backend.exact_token_counts,
            summaries=len(self.summaries),
            summarized_messages=len(self.covered),
            pending=self.pending,
            tokens_cut=self.last_tokens_cut,
            tokens_cut_total=self.tokens_cut_total,
            prefill_tok_s=rate,
            prefill_s_saved=self.tokens_cut_total / rate if rate else None,
            summary_ttft_ms=latest.ttft_ms if latest else None,
            summary_e2e_ms=latest.e2e_ms if latest else None,
            summary_tokens=latest.output_tokens if latest else None,
            summary_ms_total=sum(s.metrics.e2e_ms or 0.0 for s in self.summaries),
            last_error=self.last_error,
            summary_kind=self.summary.kind if self.summary else None,
            summary_why=self.summary.why if self.summary else None,
        )

    async def aclose(self) -> None:
        """Cancel a summary in flight (its backend request is closed), and a pre-fill."""
        for task in (self._task, self._warming):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._task = self._warming = None
