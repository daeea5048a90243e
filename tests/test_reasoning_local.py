"""The local backend's think block: `<think>...</think>` split off as reasoning, as
llama-server splits it, on the splitter alone and on the bundled model with a scripted
chat template that opens the block (the model itself does not think)."""

from __future__ import annotations

from pathlib import Path

import pytest

from phasechat.backends.events import ReasoningDelta, TextDelta
from phasechat.backends.local.backend import LocalBackend, LocalConfig
from phasechat.backends.local.think import ThinkSplitter, opens_think
from phasechat.chat.config.settings import Settings
from phasechat.chat.conversation import ChatMessage
from phasechat.chat.turns import TurnController

#: ChatML (SmolLM2's own format) whose assistant turn opens a think block, as Qwen3's
#: template does in thinking mode.
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
)
SHOT = "<think>\nThe user says hi.\n</think>\nHello!"


def split(text: str, opened: bool, step: int) -> tuple[str, str]:
    """(reasoning, answer) of `text` fed `step` characters at a time."""
    s = ThinkSplitter(opened)
    pieces = [p for i in range(0, len(text), step) for p in s.feed(text[i : i + step])]
    pieces += s.flush()
    return "".join(t for r, t in pieces if r), "".join(t for r, t in pieces if not r)


@pytest.mark.parametrize("step", range(1, 10))
def test_tags_split_anywhere_across_tokens(step: int) -> None:
    assert split("<think>\nplan</think>\n\nHi <b>", False, step) == ("plan", "Hi <b>")
    assert split("\nplan </thin k</think>Hi", True, step) == ("plan </thin k", "Hi")
    # A tag that is not at the start of the output is text, as in llama-server.
    assert split("Hi <think>x</think>", False, step) == ("", "Hi <think>x</think>")
    assert split("cut off mid-thought </th", True, step) == ("cut off mid-thought </th", "")
    assert split("  <thin", False, step) == ("", "  <thin")
    assert split(" Hi", False, step) == ("", " Hi")  # no block: the text stays exact


def test_one_event_per_token_even_when_a_tag_is_held() -> None:
    s = ThinkSplitter(opened=True)
    events = [
        e for piece in ("plan", "</", "think", ">", "\n", "Hi") for e in s.token_events(piece)
    ]
    assert events == [
        ReasoningDelta("plan", 1),
        ReasoningDelta("", 1),
        ReasoningDelta("", 1),
        ReasoningDelta("", 1),  # the token that completes the tag belongs to the thinking
        TextDelta("", 1),  # the answer's leading newline, dropped
        TextDelta("Hi", 1),
    ]


def test_a_prompt_that_opens_the_block() -> None:
    assert opens_think("<|im_start|>assistant\n<think>\n")
    assert not opens_think("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # thinking off
    assert not opens_think("<|im_start|>assistant\n")


@pytest.mark.model
async def test_bundled_model_with_a_thinking_template(model_path: Path) -> None:
    backend = LocalBackend(
        LocalConfig(model_path=model_path, n_ctx=1024, chat_template=THINKING_TEMPLATE)
    )
    await backend.start()
    assert backend.state == "ready", backend.state_detail
    turns = TurnController(backend, Settings(max_tokens=32, temperature=0.0))
    # Two earlier turns show the pattern; the greedy model follows it and closes the block.
    for _ in range(2):
        turns.conversation.add(ChatMessage("user", "hi"))
        turns.conversation.add(ChatMessage("assistant", SHOT, "local", "m"))
    kinds: list[str] = []
    try:
        assert backend.prompt_opens_think(turns.request().messages)
        async for event in turns.send("hi"):
            if isinstance(event, ReasoningDelta | TextDelta):
                kinds.append(type(event).__name__)
    finally:
        await backend.aclose()
    ex = turns.exchanges[-1]
    m = ex.metrics
    assert m is not None and ex.answer.status == "complete"
    # Thinking first, then the answer; the tags are in neither.
    first_answer = kinds.index("TextDelta")
    assert set(kinds[:first_answer]) == {"ReasoningDelta"}
    assert set(kinds[first_answer:]) == {"TextDelta"}
    assert ex.answer.reasoning.strip() and ex.answer.content.strip()
    assert "think>" not in ex.answer.reasoning + ex.answer.content
    # Counted by the model's tokenizer, one event per token.
    assert m.reasoning_tokens_source == "tokenizer"
    assert m.reasoning_tokens == first_answer and m.answer_tokens == len(kinds) - first_answer
    assert m.output_tokens == len(kinds)
    assert m.ttft_ms is not None and m.ttfo_ms is not None and m.e2e_ms is not None
    assert m.ttft_ms < m.ttfo_ms <= m.e2e_ms
    # The next prompt carries the answer, not the thinking.
    sent = turns.request().messages
    assert sent[-1].content == ex.answer.content and ex.answer.reasoning not in sent[-1].content


@pytest.mark.model
def test_the_bundled_template_does_not_think(local_backend: LocalBackend) -> None:
    from phasechat.backends.events import Message

    assert not local_backend.prompt_opens_think((Message("user", "hi"),))
