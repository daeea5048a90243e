"""The trimmer holds outside a roomy window: a tight context, strict chat templates, a
failed turn, a server that refuses a long prompt, an unusable summary, and the trim
turn's re-prefill paid in the background."""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from phasechat.backends.base import PromptRefused
from phasechat.backends.events import Message
from phasechat.backends.local.backend import LocalBackend, LocalConfig
from phasechat.backends.local.models import default_model_path
from phasechat.chat.config.settings import Settings
from phasechat.chat.trim.summarize import extractive, unusable
from phasechat.chat.trips.replay import Script, replay
from phasechat.chat.turns import InputError, TurnController
from tests.scripted import ScriptedBackend
from tests.shaped import Shaped, answer, too_long

QUESTIONS = [
    "What is rain?", "Why is the sky blue?", "What is a cloud?", "How does snow form?",
    "What is thunder?", "What is fog?", "Why is the sea salty?", "What is wind?",
    "What is a rainbow?", "What is hail?", "What is dew?", "What is a storm?",
]  # fmt: skip

# Strict in the way Mistral's and Gemma's templates (and servers running them with
# --jinja) are: one system message, first; then user and assistant strictly alternating.
STRICT = (
    "{% for m in messages %}"
    "{% if m['role'] == 'system' and not loop.first %}"
    "{{ raise_exception('System role not supported after the first message') }}{% endif %}"
    "{% if m['role'] != 'system' %}"
    "{% set first_turn = 1 if messages[0]['role'] == 'system' else 0 %}"
    "{% if (m['role'] == 'user') != ((loop.index0 - first_turn) % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant') }}{% endif %}"
    "{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}<|im_start|>assistant\n"
)


def roles_alternate(messages: tuple[Message, ...] | list[dict[str, Any]]) -> bool:
    roles = [m.role if isinstance(m, Message) else m["role"] for m in messages]
    if roles.count("system") > 1 or ("system" in roles and roles[0] != "system"):
        return False
    turns = [r for r in roles if r != "system"]
    return turns[:1] == ["user"] and all(a != b for a, b in itertools.pairwise(turns))


# -- 1. a tight window: a trim buys calm turns --------------------------------------------


@pytest.mark.model
async def test_a_tight_window_trims_rarely_not_every_turn() -> None:
    backend = LocalBackend(LocalConfig(model_path=default_model_path(), n_ctx=512))
    await backend.start()
    try:
        script = Script("Answer briefly.", tuple(QUESTIONS))
        result = await replay(backend, script, Settings(max_tokens=48, temperature=0))
    finally:
        await backend.aclose()
    rows = result.rows
    assert [r.error for r in rows] == [None] * 12  # no turn overflowed the 512 window
    trims = sum(r.trimmed for r in rows)
    assert 1 <= trims <= 3, [r.trimmed for r in rows]  # was 7 in 7 turns
    # after each trim, the following turns reuse the prefix (no re-read of it)
    for i, r in enumerate(rows[:-1]):
        if r.trimmed and not rows[i + 1].trimmed:
            nxt = rows[i + 1]
            t = nxt.tokens
            assert t.cached_tokens is not None and t.prompt_tokens is not None
            assert t.cached_tokens >= 0.6 * t.prompt_tokens


# -- 2. strict templates ----------------------------------------------------------------


@pytest.mark.model
async def test_a_trimmed_chat_passes_a_strict_template() -> None:
    config = LocalConfig(model_path=default_model_path(), n_ctx=1024, chat_template=STRICT)
    backend = LocalBackend(config)
    await backend.start()
    try:
        turns = TurnController(backend, Settings(system="Be brief.", max_tokens=24, temperature=0))
        turns.trimmer.budget, turns.trimmer.keep_last = 200, 1
        for q in QUESTIONS[:8]:
            async for _ in turns.send(q):
                pass
        exchanges = turns.exchanges
        assert [e.answer.status for e in exchanges] == ["complete"] * 8
        assert any(e.trimmed for e in exchanges)  # the summary was in the prompt ...
        for e in exchanges:  # ... inside the one system message, never a second one
            assert e.request is not None and roles_alternate(e.request.messages)
        # what the template refuses is one line, before anything is sent, and the chat
        # goes on
        bad = (Message("user", "a"), Message("user", "b"))
        with pytest.raises(PromptRefused, match="roles must alternate"):
            backend.count_tokens(bad)
    finally:
        await backend.aclose()


async def test_a_template_refusal_is_one_line_and_the_chat_goes_on() -> None:
    class Refusing(ScriptedBackend):
        refuse = True

        def count_tokens(self, messages: tuple[Message, ...]) -> Any:
            if self.refuse:
                raise PromptRefused("the model's chat template refused this conversation: x")
            return super().count_tokens(messages)

    backend = Refusing()
    turns = TurnController(backend, Settings(max_tokens=8))
    with pytest.raises(InputError, match="template refused"):
        turns.begin("hello")
    user = turns.conversation.messages[-1]
    assert user.status == "error" and not user.in_prompt  # kept, not sent again
    backend.refuse = False
    async for _ in turns.send("hello again"):
        pass
    assert turns.exchanges[-1].answer.status == "complete"


# -- 3. one failed turn does not poison the chat ------------------------------------------


async def test_a_failed_turn_is_kept_but_not_sent_again_to_a_strict_server() -> None:
    seen: list[list[dict[str, Any]]] = []

    def strict(request: dict[str, Any]) -> bytes | httpx.Response:
        seen.append(request["messages"])
        if not roles_alternate(request["messages"]):
            error = {"message": "Conversation roles must alternate user/assistant"}
            return httpx.Response(400, json={"error": error})
        return answer(3, {"prompt_tokens": 10, "completion_tokens": 3})

    server = Shaped([{"id": "m", "object": "model", "owned_by": "vllm"}], strict)
    backend = server.backend()
    await backend.start()
    turns = TurnController(backend, Settings(system="S", max_tokens=8))
    async for _ in turns.send("first"):
        pass
    # the second turn fails (a 400 from the server, any cause)
    server.fail_next = 400
    async for _ in turns.send("this one fails"):
        pass
    failed = turns.exchanges[-1]
    assert failed.answer.status == "error"
    assert failed.user.status == "error" and failed.user.content == "this one fails"
    for text in ("third", "fourth"):
        async for _ in turns.send(text):
            pass
        assert turns.exchanges[-1].answer.status == "complete"
    assert all(roles_alternate(m) for m in seen)
    assert all("this one fails" not in json.dumps(m) for m in seen[-2:])
    await backend.aclose()


# -- 4. a server that refuses a prompt as too long -----------------------------------------


async def test_a_refusal_as_too_long_trims_and_retries_once() -> None:
    window = 300

    def reply(request: dict[str, Any]) -> bytes | httpx.Response:
        words = sum(len(str(m["content"]).split()) for m in request["messages"])
        if words > window:
            return too_long(words, window)
        return answer(4, {"prompt_tokens": words, "completion_tokens": 4})

    server = Shaped([{"id": "m", "object": "model", "owned_by": "someone"}], reply)
    backend = server.backend(context_window=8192)  # the client assumes far more
    await backend.start()
    turns = TurnController(backend, Settings(max_tokens=16))
    turns.trimmer.keep_last = 1
    for i in range(6):
        async for _ in turns.send(f"Turn {i}: " + "many words here " * 20):
            pass
    statuses = [e.answer.status for e in turns.exchanges]
    assert statuses == ["complete"] * 6, [e.answer.error for e in turns.exchanges]
    retried = [e for e in turns.exchanges if any("refused" in n for n in e.trace.notices)]
    assert retried and all(e.trimmed for e in retried)
    assert turns.trimmer.windows[backend.name] == window  # learned from the refusal
    await backend.aclose()


# -- 6. the trim turn's re-prefill is paid in the background -----------------------------


@pytest.mark.model
async def test_the_trimmed_prompt_is_prefilled_before_the_user_sends(
    local_backend: LocalBackend,
) -> None:
    turns = TurnController(
        local_backend, Settings(system="Be brief.", max_tokens=24, temperature=0)
    )
    trimmer = turns.trimmer
    trimmer.budget, trimmer.keep_last, trimmer.lookahead = 260, 1, 2
    trimmed = None
    for q in QUESTIONS:
        async for _ in turns.send(q):
            pass
        if trimmer.pending or trimmer._warming is not None:
            # the user reads and types: the summary and its pre-fill finish meanwhile
            if trimmer._task is not None:
                await asyncio.wait([trimmer._task])
            await asyncio.sleep(0)  # the done-callback starts the pre-fill
            if trimmer._warming is not None:
                await trimmer._warming
            async for _ in turns.send("And then?"):
                pass
            trimmed = turns.exchanges[-1]
            break
    assert trimmed is not None and trimmed.trimmed and trimmed.metrics is not None
    m = trimmed.metrics
    assert m.prompt_tokens is not None and m.cached_tokens is not None
    # only the new turn is read at send time: the summary and kept turns were prefilled
    assert m.evaluated_prompt_tokens is not None and m.evaluated_prompt_tokens <= 20
    assert m.cached_tokens >= m.prompt_tokens - 20
    await turns.aclose()


# -- 7. summaries that say nothing -------------------------------------------------------


def test_unusable_summaries_are_recognised() -> None:
    assert unusable("", "stop") == "the model's summary was empty"
    assert unusable("Rosa keeps bees in Porto.", "length") is not None
    loop = "the bees the bees the bees the bees the bees the bees the bees the bees"
    assert unusable(loop, "stop") == "the model's summary repeated itself"
    assert unusable("Rosa keeps six hives in Porto; varroa is a worry.", "stop") is None


def test_an_extractive_summary_is_the_first_sentence_of_each_turn() -> None:
    turns = [
        Message("user", "My name is Rosa. I keep bees in Porto."),
        Message("assistant", "Nice to meet you, Rosa! Bees are wonderful."),
        Message("user", "How many hives? I have two."),
    ]
    text = extractive(turns, max_chars=400)
    assert text.splitlines() == [
        "- user: My name is Rosa.",
        "- assistant: Nice to meet you, Rosa!",
        "- user: How many hives?",
    ]
    short = extractive(turns, max_chars=60)  # the newest turns first when it is tight
    assert short.splitlines()[-1] == "- user: How many hives?" and len(short) <= 60


async def test_a_repeating_summary_is_replaced_by_an_extractive_one() -> None:
    chat = ScriptedBackend("chat", text="A short answer here.")
    looping = ScriptedBackend("summarizer", text="bees bees bees bees " * 10)
    turns = TurnController(chat, Settings(system="S", max_tokens=64))
    turns.trimmer.budget, turns.trimmer.keep_last = 80, 1
    turns.trimmer.summarizer = looping
    for q in QUESTIONS[:8]:
        async for _ in turns.send(q):
            pass
        if turns.trimmer.pending:
            await asyncio.sleep(0.05)
    summary = turns.trimmer.summary
    assert summary is not None and summary.kind == "extractive"
    assert summary.why == "the model's summary repeated itself"
    lines = summary.text.splitlines()
    assert lines and all(line.startswith(("- user: ", "- assistant: ")) for line in lines)
    assert any(q in summary.text for q in QUESTIONS[:8])
    assert len(summary.text) <= turns.trimmer.summary_budget(80) * 4
    assert turns.trim_stats().summary_kind == "extractive"
    await turns.aclose()


def test_think_time_is_an_option_of_bench(tmp_path: Path) -> None:
    from phasechat.cli.main import build_parser

    args = build_parser().parse_args(["bench", "--think-time", "2", "s.json"])
    assert args.think_time == 2.0


# -- a real llama-server: a strict --jinja template, and a window it enforces ------------


@pytest.mark.server
async def test_a_real_strict_llama_server_with_a_smaller_window_than_assumed(
    start_llama_server: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from phasechat.backends.remote.backend import RemoteBackend, RemoteConfig

    template = tmp_path_factory.mktemp("template") / "strict.jinja"
    template.write_text(STRICT)
    base = start_llama_server("--jinja", "--chat-template-file", str(template), "-c", "1024")
    # the user told phasechat the window is 8,192: the server will refuse long prompts
    backend = RemoteBackend(RemoteConfig(base_url=base, context_window=8192))
    await backend.start()
    turns = TurnController(backend, Settings(system="Be brief.", max_tokens=24, temperature=0))
    turns.trimmer.keep_last = 1
    long_question = "Tell me about the weather in spring. " * 25  # ~200 tokens a turn
    for i in range(6):
        async for _ in turns.send(f"{i}. {long_question}"):
            pass
    await backend.aclose()
    statuses = [(e.answer.status, e.answer.error) for e in turns.exchanges]
    assert [s for s, _ in statuses] == ["complete"] * 6, statuses
    refused = [e for e in turns.exchanges if any("refused" in n for n in e.trace.notices)]
    assert refused, "the server should have refused one prompt as too long"
    assert turns.trimmer.windows[backend.name] == 1024  # its own window, from its error
    for e in turns.exchanges:  # every request the strict template accepted
        assert e.request is not None and roles_alternate(e.request.messages)
