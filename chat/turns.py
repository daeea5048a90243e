"""The turn controller: the one owner of a chat's turns.

Every change to a conversation goes through a `TurnController`: a new turn (`begin`), a
retry (a sibling answer), an edit of an earlier question or of the system prompt (a new
branch from that point), a switch to a sibling branch, stopping, and streaming the
answer (`run`). The UI, `ask`, `bench`, `compare` and the sweep all call it; they read
its state (`conversation`, `exchanges`, `current`) and never assign to it. Persistence
listens (`listen`: chat/store/writer.py), as any observer may.

A send, end to end: the caller `begin`s a turn (the user message and an empty answer are
added, the trimmer plans the prompt, a `Trace` is opened), then `run`s it: a `Turn`, one
asyncio task that streams the backend's events through the telemetry recorder into that
trace, tells each to the turn's subscribers, hands the streamed text to listeners every
FLUSH_S, and finishes the answer however the stream ends (complete, stopped, failed),
with its metrics and its prompt's anatomy, saved in one write. A caller that wants only
the end awaits the turn; the UI reads the exchange on its timer and subscribes to what
saving says (`SaveFailed`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Generator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from phasechat.backends.base import Backend, PromptRefused, RenderedPrompt
from phasechat.backends.events import (
    Event,
    GenerationRequest,
    KVStats,
    Message,
    Notice,
    ReasoningDelta,
    StreamError,
    TextDelta,
)
from phasechat.chat.config.settings import Settings
from phasechat.chat.conversation import ChatMessage, Conversation, sendable
from phasechat.chat.engine_held import RENDER_AGAIN, EngineHeld, Held, section_at
from phasechat.chat.text import is_text
from phasechat.chat.trim.trimmer import Answered, Refused, SendPlan, Shown, Trimmer, TrimStats
from phasechat.telemetry.anatomy import Anatomy
from phasechat.telemetry.live import Live, finished, snapshot
from phasechat.telemetry.metrics import Metrics, compute
from phasechat.telemetry.recorder import Trace, record
from phasechat.telemetry.records import answer_record


class InputError(ValueError):
    """The turn cannot be sent as asked; the message says why, in one line."""


@dataclass
class Exchange:
    """One request/answer pair as it happens: the live trace and the answer message."""

    user: ChatMessage
    answer: ChatMessage
    trace: Trace
    metrics: Metrics | None = None
    request: GenerationRequest | None = None
    #: this send is the first to use a new history summary (its prefix cache restarts)
    trimmed: bool = False
    #: one line about trimming the UI should show ("summary not ready: sent full history")
    trim_note: str | None = None
    #: time spent waiting for a summary before the request was sent (not in TTFT)
    trim_wait_ms: float | None = None
    #: prompt tokens the summary saved this send (full history minus what was sent)
    tokens_cut: int = 0
    trim_plan: SendPlan | None = None
    #: the prompt as the engine reads it (asked of the backend as the request starts;
    #: None where the backend cannot say) and, once the answer is done, its sections
    rendered: RenderedPrompt | None = None
    anatomy: Anatomy | None = None

    # What the UI reads while the answer streams (it never reads the recorder's Trace).
    @property
    def text(self) -> str:
        """The answer's text so far."""
        return self.trace.text

    @property
    def reasoning(self) -> str:
        """The thinking so far ('' for a model that does not think)."""
        return self.trace.reasoning

    @property
    def kv(self) -> KVStats | None:
        """The engine's KV-cache figures, where it reports them."""
        return self.trace.kv

    def live(self, now_ns: int | None = None) -> Live:
        """The live figures at `now_ns` (default: now); once the answer is finished, its
        final figures (the same numbers as its metrics)."""
        live = snapshot(self.trace, time.perf_counter_ns() if now_ns is None else now_ns)
        return finished(live, self.metrics) if self.metrics is not None else live

    def prefill_section(self) -> str:
        """The section of the prompt the prefill is reading now ("" when unknown)."""
        progress = self.trace.progress
        if progress is None or self.request is None:
            return ""
        return section_at(self.rendered, self.request.messages, progress.processed)

    def token_times_ms(self) -> list[float]:
        """When each token (or chunk) arrived, in ms on the process clock."""
        return [t / 1e6 for t in self.trace.times]

    def export_record(self, index: int) -> dict[str, object]:
        """The answer's history record (every metric and per-token times) for exports."""
        assert self.metrics is not None
        return answer_record(index, self.user.content, self.metrics, self.trace)


#: How often streamed text is handed to subscribers: a crash loses at most this much.
FLUSH_S = 0.5
#: A stream whose events are all ready at once never suspends the loop: the turn gives
#: the rest of the process (the UI's timer) a turn at least this often.
YIELD_EVERY_NS = 4_000_000


@dataclass(frozen=True, slots=True)
class MessageAdded:
    """A new message (a user turn, an answer that starts streaming, or a message copied
    onto a new branch); it is the leaf now (persistence saves it: chat/store/writer.py)."""

    message: ChatMessage


@dataclass(frozen=True, slots=True)
class MessageUpdated:
    """More streamed text (at most every FLUSH_S), or the final state (`final`)."""

    message: ChatMessage
    final: bool


@dataclass(frozen=True, slots=True)
class BranchShown:
    """The conversation shows another branch (no message was added)."""

    conversation: Conversation


@dataclass(frozen=True, slots=True)
class RequestSent:
    """`request` is about to go to `backend`; `trace` will record it (tracing opens its
    span here: telemetry/otel.py). A turn refused as too long and sent again trimmed is
    two requests."""

    trace: Trace
    request: GenerationRequest
    backend: Backend


@dataclass(frozen=True, slots=True)
class RequestEnded:
    """The request recorded in `trace` is over (answered, failed or stopped)."""

    trace: Trace
    metrics: Metrics


@dataclass(frozen=True, slots=True)
class Streamed:
    """One event of the answer's stream as the recorder took it (a token, the prefill's
    progress, the server's figures, ...)."""

    exchange: Exchange
    event: Event


@dataclass(frozen=True, slots=True)
class TurnFailed:
    """The answer ended in an error (told just before its `TurnEnded`)."""

    exchange: Exchange
    error: str


@dataclass(frozen=True, slots=True)
class TurnEnded:
    """The turn is over, however it ended (complete, stopped, failed): its answer is
    final, saved with its anatomy, and these are its metrics."""

    exchange: Exchange
    metrics: Metrics


@dataclass(frozen=True, slots=True)
class SaveFailed:
    """Saving the chat failed (`line` says why); the chat is kept in memory and the
    writes are tried again (chat/store/writer.py). Told once until `SaveRecovered`."""

    line: str


@dataclass(frozen=True, slots=True)
class SaveRecovered:
    """The writes that failed were written after all."""

    line: str


#: What the controller tells its subscribers (a turn's own, its `Streamed`, `TurnFailed`
#: and `TurnEnded`, go to the turn's subscribers too).
TurnEvent = (
    MessageAdded
    | MessageUpdated
    | BranchShown
    | RequestSent
    | RequestEnded
    | Streamed
    | TurnFailed
    | TurnEnded
    | SaveFailed
    | SaveRecovered
)
Subscriber = Callable[[TurnEvent], None]


class ConversationWatcher:
    """A subscriber that hears the conversation's changes as three methods (persistence
    is one: chat/store/writer.py); the other events pass it by."""

    def __call__(self, event: TurnEvent) -> None:
        match event:
            case MessageAdded(message):
                self.message_added(message)
            case MessageUpdated(message, final):
                self.message_updated(message, final)
            case BranchShown(conversation):
                self.branch_shown(conversation)

    def message_added(self, message: ChatMessage) -> None:
        """`MessageAdded`."""

    def message_updated(self, message: ChatMessage, final: bool) -> None:
        """`MessageUpdated`."""

    def branch_shown(self, conversation: Conversation) -> None:
        """`BranchShown`."""


class Turn:
    """A turn started: one asyncio task streaming one exchange (`TurnController.run`).

    Await it for its end: a turn stopped raises `CancelledError` there, as awaiting
    any cancelled task does, and a caller cancelled while it waits cancels the turn; in
    both, once its partial answer is saved. `subscribe` to its events; `cancel` stops
    it. Iterating it gives the stream's own events one at a time, the turn waiting
    between them as a generator would (leaving the loop early and closing the iterator
    stops it; a turn stopped raises `CancelledError` there too)."""

    def __init__(
        self,
        exchange: Exchange,
        body: Callable[[Turn], Coroutine[Any, Any, None]],
        ended: Callable[[Turn], None],
        also: Subscriber,
    ) -> None:
        self.exchange = exchange
        self._subscribers: list[Subscriber] = [also]
        self._readers: list[asyncio.Queue[Event | None]] = []
        self._ended = ended
        self._task = asyncio.create_task(body(self), name="phasechat-turn")
        # a done callback, not a `finally`: a task cancelled before its first step never
        # runs its body at all
        self._task.add_done_callback(self._done)

    def subscribe(self, subscriber: Subscriber) -> None:
        """Tell `subscriber` every event of this turn from now on."""
        self._subscribers.insert(-1, subscriber)

    @property
    def done(self) -> bool:
        """The turn is over."""
        return self._task.done()

    def cancel(self) -> None:
        """Stop the turn: its partial answer is kept, marked "cancelled"."""
        self._task.cancel()

    async def wait(self) -> None:
        """Return once the turn is over (see the class)."""
        try:
            await asyncio.shield(self._task)
        except asyncio.CancelledError:
            if not self._task.done():  # the caller was cancelled: the turn goes with it
                self._task.cancel()
                await asyncio.wait([self._task])
            raise

    def __await__(self) -> Generator[Any, None, None]:
        return self.wait().__await__()

    async def aclose(self) -> None:
        """Stop the turn and return once it is over (its partial answer saved)."""
        self.cancel()
        await asyncio.wait([self._task])

    def __aiter__(self) -> AsyncIterator[Event]:
        queue: asyncio.Queue[Event | None] = asyncio.Queue()
        if not self._task.done():
            self._readers.append(queue)
        else:
            queue.put_nowait(None)
        return self._read(queue)

    async def _read(self, queue: asyncio.Queue[Event | None]) -> AsyncIterator[Event]:
        try:
            while (event := await queue.get()) is not None:
                yield event
                queue.task_done()  # asked for the next: the turn goes on
            await self.wait()  # its end: a stop (or a failure) is raised here
        finally:
            if not self._task.done():  # left early (or cancelled): as closing a generator
                self._task.cancel()  # did, the turn ends, and is over when this returns
                await asyncio.wait([self._task])

    async def emit(self, event: TurnEvent) -> None:
        """Tell the subscribers `event`; a stream event also goes to each reader, and
        the turn waits until the reader asks for the next."""
        self._tell(event)
        if isinstance(event, Streamed):
            for queue in self._readers:
                queue.put_nowait(event.event)
            for queue in self._readers:
                await queue.join()

    def _tell(self, event: TurnEvent) -> None:
        for subscriber in self._subscribers:
            subscriber(event)

    def _done(self, _task: asyncio.Task[None]) -> None:
        self._ended(self)  # the controller finishes an answer the task never began
        exchange = self.exchange
        if exchange.answer.status == "error" and exchange.answer.error is not None:
            self._tell(TurnFailed(exchange, exchange.answer.error))
        if exchange.metrics is not None:
            self._tell(TurnEnded(exchange, exchange.metrics))
        for queue in self._readers:
            queue.put_nowait(None)


class TurnController:
    """A conversation, the backend that answers it, and every turn's telemetry."""

    def __init__(
        self,
        backend: Backend,
        settings: Settings | None = None,
        *,
        name: str | None = None,
        trim: bool = True,
    ) -> None:
        """`name`: how its answers are labelled (default: the backend's name; compare's
        sides are "local(threads=1)" and the like). `trim=False`: the messages as given,
        whatever their length (a side trip's one prompt); `set_trim` changes it later."""
        self._name = name
        self._backend = backend
        self._settings = settings or Settings()
        self._conversation = Conversation(system=self._settings.system)
        #: every request sent, oldest first (on any branch)
        self.exchanges: list[Exchange] = []
        self._current: Exchange | None = None
        self._turn: Turn | None = None  # the task streaming `_current`
        self._subscribers: list[Subscriber] = []
        #: read it; its settings are written only by `set_trim` (and the constructor)
        self.trimmer = Trimmer(enabled=trim)
        self._every_s: float | None = None
        #: what each backend's engine held after this controller's last request on it,
        #: and each answer's prompt anatomy against it
        self._engines = EngineHeld()

    def set_trim(
        self,
        enabled: bool,
        budget: int | None = None,
        keep_last: int = 4,
        summarizer: Backend | None = None,
    ) -> None:
        """The history trimmer's settings (chat/trim/trimmer.py), from the next turn on:
        the one place they are written (the config's `[trim]`, the settings form, a side
        trip that sends its messages as given)."""
        t = self.trimmer
        t.enabled, t.budget, t.keep_last, t.summarizer = enabled, budget, keep_last, summarizer

    # -- what others read --------------------------------------------------------------
    @property
    def backend(self) -> Backend:
        """The backend that answers the next turn."""
        return self._backend

    @property
    def settings(self) -> Settings:
        """The engine settings of the next turn (its system prompt included)."""
        return self._settings

    @property
    def conversation(self) -> Conversation:
        """The chat (read it; change it only through this controller)."""
        return self._conversation

    @property
    def current(self) -> Exchange | None:
        """The turn begun and not yet finished, if any."""
        return self._current

    @property
    def busy(self) -> bool:
        """A turn is under way: the next one must wait (or `stop` it)."""
        return self._current is not None

    @property
    def shares_cpu(self) -> bool:
        """Whether the answering engine competes with this process for the CPU (a local
        model, or a server on this machine: `Backend.shares_cpu`): a consumer then
        draws less often (every CPU-second it spends is taken from the engine)."""
        return self._backend.shares_cpu

    def deliver_every(self, seconds: float | None) -> None:
        """The consumer reads the stream about every `seconds` (None: as events come):
        a backend handing tokens across threads may batch them that long (each keeps
        the timestamp taken where it was made)."""
        self._every_s = seconds

    # -- subscribers -------------------------------------------------------------------
    def subscribe(self, subscriber: Subscriber) -> None:
        """Tell `subscriber` every change from now on: the conversation's (persistence
        saves them), each request's (tracing), every turn's events, and saving's."""
        self._subscribers.append(subscriber)

    def unsubscribe(self, subscriber: Subscriber) -> None:
        """Stop telling `subscriber`."""
        self._subscribers[:] = [x for x in self._subscribers if x is not subscriber]

    def report(self, event: SaveFailed | SaveRecovered) -> None:
        """Tell the subscribers how saving the chat goes (the store's writer reports here)."""
        self._publish(event)

    def _publish(self, event: TurnEvent) -> None:
        for subscriber in tuple(self._subscribers):
            subscriber(event)

    def _ended(self, trace: Trace, metrics: Metrics) -> None:
        self._publish(RequestEnded(trace, metrics))

    def _added(self, message: ChatMessage) -> ChatMessage:
        self._conversation.add(message)
        self._publish(MessageAdded(message))
        return message

    def _updated(self, message: ChatMessage, final: bool) -> None:
        self._publish(MessageUpdated(message, final))

    def _shown(self) -> None:
        self._publish(BranchShown(self._conversation))

    # -- settings, backend, chat -------------------------------------------------------
    def update_settings(self, settings: Settings | None = None, /, **changes: Any) -> None:
        """Use `settings` (default: the current ones) with `changes` from the next turn.

        A new system prompt replaces the empty chat's at once; in a chat with messages
        it takes effect at the next send or retry, which starts a new branch with it
        (the branch with the old system prompt stays)."""
        self._settings = replace(settings or self._settings, **changes)
        root = self._conversation.root
        if not self._conversation.messages and root.content != self._settings.system:
            root.content = self._settings.system
            self._updated(root, final=True)

    @property
    def system_changed(self) -> bool:
        """The next send starts a branch with a new system prompt (`update_settings`)."""
        return self._settings.system != self._conversation.system

    def switch_backend(self, backend: Backend) -> None:
        """Answer with `backend` from the next turn on; the conversation carries over."""
        self._refuse_busy()
        self._backend = backend

    def replace_conversation(self, conversation: Conversation) -> None:
        """Continue `conversation` (a saved chat, or a new one) with its own system prompt."""
        self._refuse_busy()
        self._conversation = conversation
        self._settings = replace(self._settings, system=conversation.system)
        self.trimmer.tell(Shown(conversation))
        last = self.last_request()
        self._engines.opened = (last[0], conversation.messages[-1]) if last else None

    def _refuse_busy(self) -> None:
        if self._current is not None:
            raise InputError("still answering: stop the answer first")

    # -- turns -------------------------------------------------------------------------
    def begin(self, prompt: str) -> Exchange:
        """Add `prompt` as a user turn after the leaf and an empty answer; `run` streams it.

        A prompt that cannot be sent raises `InputError` before anything is added."""
        self._check(prompt)
        self._on_system_branch(keep=len(self._conversation.messages))
        return self._answer(self._added(ChatMessage("user", prompt)))

    def retry(self) -> Exchange:
        """Answer the branch's last question again; the previous answer stays, a sibling
        of the new one (`branch_of` counts them)."""
        self._refuse_busy()
        path = self._conversation.messages
        last = next((i for i in range(len(path) - 1, -1, -1) if path[i].role == "user"), None)
        if last is None:
            raise InputError("nothing to retry: send a message first")
        if self._on_system_branch(keep=last + 1):
            user = self._conversation.node(self._conversation.leaf or 0)  # the copy
        else:
            user = path[last]
            self._conversation.rewind(user.id)
        if user.status == "error":  # refused before (too long): it is being sent again
            user.status, user.error = "complete", None
            self._updated(user, final=True)
        return self._answer(user)

    def edit(self, message_id: int, text: str) -> Exchange:
        """Ask `text` instead of user message `message_id` of the branch shown: a new
        branch from there (the old question stays, with its answers), answered now."""
        self._check(text)
        path = self._conversation.messages
        index = next((i for i, m in enumerate(path) if m.id == message_id), None)
        if index is None or path[index].role != "user":
            raise InputError("only a question on the branch shown can be edited")
        if not self._on_system_branch(keep=index):
            self._conversation.rewind(path[index].parent)
        return self._answer(self._added(ChatMessage("user", text)))

    def ask_over(self, messages: Sequence[Message]) -> Exchange:
        """Answer the last question of `messages`, sent as they are: the conversation
        becomes them (a side trip on a controller of its own: compare's rounds)."""
        head = messages[0] if messages and messages[0].role == "system" else None
        rest = messages[1:] if head is not None else messages
        system = head.content if head is not None else ""
        self.replace_conversation(
            Conversation(system, [ChatMessage(m.role, m.content, tokens=m.tokens) for m in rest])
        )
        return self.retry()

    def edit_system(self, text: str) -> Exchange | None:
        """Use system prompt `text`: in an empty chat at once; otherwise a new branch
        with it, whose last question is answered now (None: nothing to answer yet)."""
        self._refuse_busy()
        if not is_text(text):
            raise InputError("the system prompt is not valid UTF-8: not changed")
        self.update_settings(system=text)
        has_question = any(m.role == "user" for m in self._conversation.messages)
        return self.retry() if self.system_changed and has_question else None

    # -- what a turn would send, before it is sent --------------------------------------
    def preview(self, text: str, edit: int | None = None) -> tuple[Message, ...]:
        """The messages the next send would be, changing nothing: `text` after the leaf,
        or instead of question `edit` (a message id), or, when `edit` is the system
        prompt's, `text` as the system prompt with the last question answered again."""
        path = self._conversation.messages
        system = self._settings.system
        if edit is not None and edit == self._conversation.root.id:
            system = text
            last = max((i for i, m in enumerate(path) if m.role == "user"), default=-1)
            keep, new = path[: last + 1], []
        else:
            index = next((i for i, m in enumerate(path) if m.id == edit), len(path))
            keep, new = path[:index], [ChatMessage("user", text)]
        summary = self.trimmer.in_use
        on_branch = {m.id for m in keep}
        if (
            summary is None
            or system != self._conversation.system
            or not summary.covers <= on_branch
        ):
            summary = None
        kept = sendable([*keep, *new], summary.covers if summary is not None else frozenset())
        head = (
            [summary.system(system)] if summary else [Message("system", system)] if system else []
        )
        return (*head, *(m.as_message() for m in kept))

    def last_request(self) -> tuple[tuple[Message, ...], str] | None:
        """The messages the branch's last answer answered, and its text: what an engine
        that served this chat last still holds (None: no answer yet)."""
        path = self._conversation.messages
        if not path or path[-1].role != "assistant" or not path[-1].content:
            return None
        questions = [i for i, m in enumerate(path) if m.role == "user"]
        question = path[questions[-1]] if questions else None
        if question is None:
            return None
        return self.preview(question.content, question.id), path[-1].content

    def held(self, backend: str) -> Held | None:
        """What this controller's last request on `backend` left in its engine."""
        return self._engines.held(backend)

    def _check(self, prompt: str) -> None:
        self._refuse_busy()
        if not prompt.strip():
            raise InputError("empty prompt: type a message first")
        if not is_text(prompt):
            raise InputError("the prompt is not valid UTF-8: not sent")

    def _on_system_branch(self, keep: int) -> bool:
        """If the system prompt changed (`system_changed`): start a branch at a new root
        with it, holding copies of the first `keep` messages of the branch shown (the
        leaf is the last of them). False when it did not change: nothing was done."""
        if not self.system_changed:
            return False
        kept = self._conversation.messages[:keep]
        self._conversation.rewind(None)
        last = self._added(ChatMessage("system", self._settings.system))
        for message in kept:
            last = self._added(message.copy(parent=last.id))
        return True

    def _answer(self, user: ChatMessage) -> Exchange:
        """An empty answer to `user` (the leaf), its request planned, ready to `run`."""
        backend = self._backend
        try:
            plan = self.trimmer.plan(backend, self._conversation, self._settings.max_tokens)
        except PromptRefused as exc:  # kept and saved, not sent; the chat goes on
            user.status, user.error = "error", str(exc)
            self._updated(user, final=True)
            raise InputError(str(exc)) from None
        request = self._request(plan.messages)
        trace = self._trace_for(request, plan)
        answer = self._added(
            ChatMessage("assistant", "", backend.name, backend.model, status="streaming")
        )
        exchange = Exchange(user, answer, trace, request=request)
        self._planned(exchange, plan)
        self.exchanges.append(exchange)
        self._current = exchange
        return exchange

    def request(self) -> GenerationRequest:
        """The request the next answer would be, from the branch as it stands."""
        return self._request(self.trimmer.prompt_messages(self._conversation))

    def _request(self, messages: tuple[Message, ...]) -> GenerationRequest:
        s = self._settings
        return GenerationRequest(
            messages=messages,
            max_tokens=s.max_tokens,
            temperature=s.temperature,
            stop=s.stop,
            seed=s.seed,
        )

    def _trace_for(self, request: GenerationRequest, plan: SendPlan) -> Trace:
        """A new trace for sending `request` on the active backend, as `plan` counted
        its prompt and named the window (one a server named when it refused, if any)."""
        backend = self._backend
        return Trace(
            backend=self._name or backend.name,
            model=backend.model,
            max_tokens=request.max_tokens,
            prompt_estimate=plan.prompt_tokens,
            prompt_estimate_exact=plan.exact,
            window=plan.window,
            window_source=plan.window_source,
        )

    @staticmethod
    def _planned(exchange: Exchange, plan: SendPlan) -> None:
        exchange.trimmed, exchange.trim_note = plan.trimmed, plan.note
        exchange.trim_wait_ms = plan.waited_ms
        exchange.trim_plan = plan
        if not plan.wait:
            exchange.tokens_cut = plan.tokens_cut

    async def _settle(self, exchange: Exchange) -> None:
        """Wait for the summary this send needs (outside TTFT, recorded on the exchange)."""
        plan = exchange.trim_plan
        if plan is None or plan.ready is None:
            return
        exchange.trace.queue(time.perf_counter_ns())  # shown as its own phase
        plan = await plan.ready()
        exchange.request = self._request(plan.messages)
        assert plan.prompt_tokens is not None
        exchange.trace.estimate_prompt(plan.prompt_tokens, plan.exact)
        self._planned(exchange, plan)

    def run(self, exchange: Exchange) -> Turn:
        """Start streaming the answer of `exchange`'s request through the recorder: a
        `Turn`, one task (await it, subscribe to it, or iterate its events).

        `stop` (or cancelling the turn) ends the generation; the partial answer stays
        in the conversation marked "cancelled". A turn stopped before it ran tells
        nothing but its end."""
        turn = Turn(exchange, self._play, self._turn_over, self._publish)
        if exchange.metrics is None:
            self._turn = turn
        return turn

    async def _play(self, turn: Turn) -> None:
        exchange = turn.exchange
        if exchange.metrics is not None:  # stopped before it started
            return
        rendering: asyncio.Future[RenderedPrompt | None] | None = None
        finished = False
        try:
            await self._settle(exchange)
            rendering = self._render(exchange)
            await self._attempt(turn)
            if await self._refit(exchange):  # refused as too long: trimmed, sent once more
                rendering.cancel()
                rendering = self._render(exchange)
                await self._attempt(turn)
            finished = True
        finally:
            self._finish(exchange, write=not finished)
            if not finished:  # stopped: what the engine holds now is not known here
                self._engines.forget(self._backend.name)
                if rendering is not None:
                    rendering.cancel()
        try:
            if rendering is not None:
                await self._anatomize(exchange, rendering)
        finally:  # the answer's one final write, its anatomy with it
            self._updated(exchange.answer, final=True)

    def _turn_over(self, turn: Turn) -> None:
        """`turn`'s task is done: an answer whose task was cancelled before it began is
        finished here (as cancelled), so nothing is left "streaming"."""
        if turn.exchange.metrics is None:
            self._finish(turn.exchange)
        if self._turn is turn:
            self._turn = None

    def _render(self, exchange: Exchange) -> asyncio.Future[RenderedPrompt | None]:
        """Ask the backend for the prompt's rendering, beside the request."""
        assert exchange.request is not None
        messages = exchange.request.messages

        backend = self._backend

        async def render() -> RenderedPrompt | None:
            ready = backend.state == "ready"
            exchange.rendered = rendered = await backend.render(messages)
            if rendered is None and not ready:
                # still loading when asked (a first turn): asked again once it is done,
                # so this answer's prompt and what the engine holds after it are the
                # templated text, as the next turn's are (else the next turn's cache
                # break compares a plain text with a templated one)
                return RENDER_AGAIN
            return rendered

        return asyncio.ensure_future(render())

    async def _anatomize(
        self, exchange: Exchange, rendering: asyncio.Future[RenderedPrompt | None]
    ) -> None:
        """The answer's prompt sections and cache break, saved with it."""
        metrics, request = exchange.metrics, exchange.request
        if metrics is None or request is None:
            return
        answer = exchange.answer
        exchange.rendered, anatomy = await self._engines.anatomize(
            self._backend, request.messages, metrics, answer, rendering
        )
        exchange.anatomy = answer.anatomy = anatomy

    async def _attempt(self, turn: Turn) -> None:
        """One request of the turn's exchange through the recorder, its text saved as it
        streams, each event told to the turn's subscribers."""
        exchange = turn.exchange
        trace, answer = exchange.trace, exchange.answer
        assert exchange.request is not None
        flush_ns = int(FLUSH_S * 1e9)
        next_flush = time.perf_counter_ns() + flush_ns
        self._publish(RequestSent(trace, exchange.request, self._backend))
        stream = self._backend.stream(exchange.request, every_s=self._every_s)
        clock = time.perf_counter_ns
        next_yield = clock() + YIELD_EVERY_NS
        async for event in record(stream, trace):
            if (
                self._subscribers
                and isinstance(event, TextDelta | ReasoningDelta)
                and trace.t_last_token is not None
                and trace.t_last_token >= next_flush
            ):
                next_flush = trace.t_last_token + flush_ns
                answer.content = trace.text
                answer.reasoning = trace.reasoning
                self._updated(answer, final=False)
            await turn.emit(Streamed(exchange, event))
            if clock() > next_yield:
                await asyncio.sleep(0)
                next_yield = clock() + YIELD_EVERY_NS

    async def _refit(self, exchange: Exchange) -> bool:
        """After a server refused the prompt as longer than its window: tell the trimmer
        (it learns the window the server named and trims the history to fit it), and
        prepare one more request. False when there is nothing to trim (then the refusal
        stands)."""
        error = exchange.trace.error
        if error is None or error.kind != "context_overflow":
            return False
        n_ctx = error.detail.get("n_ctx")
        told = Refused(
            self._backend,
            self._conversation,
            self._settings.max_tokens,
            n_ctx if isinstance(n_ctx, int) else None,
        )
        plan = self.trimmer.tell(told)
        if plan is None or plan.ready is None:
            return False
        plan = await plan.ready()
        if not plan.trimmed:
            return False
        request = self._request(plan.messages)
        if self._subscribers:
            self._ended(exchange.trace, compute(exchange.trace))
        exchange.trace = self._trace_for(request, plan)  # the refused request's is replaced
        said = (
            f"the server refused the prompt as longer than its window: {error.message}; "
            "trimmed the history and sent it again"
        )
        exchange.trace.observe(Notice(said), time.perf_counter_ns())
        exchange.request = request
        exchange.trimmed, exchange.trim_note = True, plan.note
        return True

    def send(self, prompt: str) -> Turn:
        """`begin` + `run`: add `prompt` and start streaming the answer."""
        return self.run(self.begin(prompt))

    def stop(self) -> bool:
        """Stop the turn under way (its partial answer is kept); False if there is none.

        A turn that is streaming ends at once: its task is cancelled (the backend closes
        its request or stops its thread at the next token)."""
        exchange = self._current
        if exchange is None:
            return False
        if self._turn is not None and self._turn.exchange is exchange:
            self._turn.cancel()
        else:  # begun, never run: finished as cancelled, so nothing is left "streaming"
            self._finish(exchange)
        return True

    def abandon(self, exchange: Exchange) -> None:
        """Close an exchange whose `run` never started (cancelled before its first event):
        it is finished as cancelled, so nothing is left "streaming"."""
        if exchange.metrics is None:
            self._finish(exchange)

    def _finish(self, exchange: Exchange, *, write: bool = True) -> None:
        """The answer's final state and metrics; saved now unless `write` is False (the
        turn saves it once its anatomy is known)."""
        trace, answer = exchange.trace, exchange.answer
        now = time.perf_counter_ns()
        trace.cancel(now)  # no-op when a terminal event arrived
        answer.content = trace.text
        answer.reasoning = trace.reasoning
        answer.model = trace.model
        if isinstance(trace.error, StreamError):
            answer.status, answer.error = "error", trace.error.message
            if trace.error.kind == "context_overflow" or not answer.content:
                # Kept, shown and saved, but not sent again (in_prompt): a strict server
                # would refuse every later request with two user turns in a row, and a
                # prompt too long for the window would overflow again. Ctrl+R resends it.
                exchange.user.status, exchange.user.error = "error", trace.error.message
                self._updated(exchange.user, final=True)
        elif trace.finish == "cancelled":
            answer.status = "cancelled"
        else:
            answer.status = "complete"
        exchange.metrics = compute(trace)
        answer.metrics = exchange.metrics
        self._ended(trace, exchange.metrics)
        answer.tokens = trace.answer_tokens
        if self._current is exchange:
            self._current = None
        if write:
            self._updated(answer, final=True)
        if answer.status != "error":
            self.trimmer.tell(
                Answered(self._backend, self._conversation, self._settings.max_tokens)
            )

    # -- branches ----------------------------------------------------------------------
    def show_sibling(self, message_id: int, step: int) -> ChatMessage | None:
        """Show the branch of the sibling `step` places from message `message_id` (-1:
        the one before, 1: the one after); None when there is none that way. The chat
        continues on the branch shown, with its own system prompt."""
        self._refuse_busy()
        conversation = self._conversation
        siblings = conversation.siblings(conversation.node(message_id))
        index = next(i for i, m in enumerate(siblings) if m.id == message_id) + step
        if not 0 <= index < len(siblings):
            return None
        conversation.select(siblings[index].id)
        self._settings = replace(self._settings, system=conversation.system)
        self.trimmer.tell(Shown(conversation))
        self._shown()
        return siblings[index]

    # -- reporting, closing ------------------------------------------------------------
    def trim_stats(self) -> TrimStats:
        """The trimmer's figures for the telemetry panel."""
        answers = [e.metrics for e in self.exchanges]
        return self.trimmer.stats(self._backend, self._settings.max_tokens, answers)

    async def aclose(self) -> None:
        """Stop background work (a summary in flight); the backend stays open."""
        await self.trimmer.aclose()
