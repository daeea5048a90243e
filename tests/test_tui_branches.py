"""Branches in the chat UI, driven by keys: Ctrl+R keeps the old answer as a sibling,
←/→ on a message move between siblings (‹1/2›), `e` edits a question (or the system
prompt) in the prompt box and Enter sends it as a new branch; Esc gives the draft back.
The backend is scripted: these tests are about what the keys do to the chat."""

from __future__ import annotations

from collections.abc import AsyncIterator

from phasechat.backends.events import Event, Finished, GenerationRequest, TextDelta
from phasechat.chat.config.settings import Settings
from phasechat.chat.conversation import ChatMessage, Conversation
from phasechat.tui.app import PhasechatApp
from phasechat.tui.widgets.chat_log import shown_messages
from phasechat.tui.widgets.chat_widgets import MessageView, PromptInput
from tests.helpers import settled, stored_messages
from tests.scripted import ScriptedBackend


class Numbered(ScriptedBackend):
    """Answers "answer 1", "answer 2", ... and keeps the requests."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[GenerationRequest] = []

    async def stream(
        self, request: GenerationRequest, *, every_s: float | None = None
    ) -> AsyncIterator[Event]:
        self.requests.append(request)
        yield TextDelta(f"answer {len(self.requests)}")
        yield Finished("stop")


def shown(app: PhasechatApp) -> list[str]:
    """Each message on screen: its text, with its ‹i/n› when it has siblings."""
    out = []
    for view in app.query(MessageView):
        index, count = view.branch
        out.append(view.message.content + (f" ‹{index}/{count}›" if count > 1 else ""))
    return out


def focused(app: PhasechatApp) -> MessageView:
    view = app.focused
    assert isinstance(view, MessageView)
    return view


async def test_retry_edit_and_switch_branches_with_keys() -> None:
    backend = Numbered()
    app = PhasechatApp(settings=Settings(system="Be brief."), backend=backend)
    async with app.run_test(size=(100, 40)) as pilot:
        app.chat.send("q1")
        await settled(pilot, app, 1)
        app.chat.send("q2")
        await settled(pilot, app, 2)
        await pilot.press("ctrl+r")  # the old answer stays, as a sibling
        await settled(pilot, app, 3)
        assert shown(app) == ["Be brief.", "q1", "answer 1", "q2", "answer 3 ‹2/2›"]
        header = str(list(app.query(MessageView))[-1].query_one(".header").render())
        assert "‹2/2›" in header

        await pilot.press("ctrl+up")  # the newest message
        assert focused(app).message.content == "answer 3"
        await pilot.press("left")
        assert shown(app)[-1] == "answer 2 ‹1/2›"
        assert focused(app).message.content == "answer 2"
        await pilot.press("left")  # none before the first: nothing changes
        assert shown(app)[-1] == "answer 2 ‹1/2›"

        # Edit question 2: the prompt box takes it; Enter sends it as a new branch.
        prompt = app.query_one(PromptInput)
        prompt.text = "a draft"
        prompt.focus()
        await pilot.press("ctrl+up", "up", "e")
        assert prompt.text == "q2" and "editing question 2" in str(prompt.border_title)
        prompt.text = "q2, edited"
        await pilot.press("enter")
        await settled(pilot, app, 4)
        assert shown(app) == ["Be brief.", "q1", "answer 1", "q2, edited ‹2/2›", "answer 4"]
        assert prompt.border_title is None and prompt.text == ""
        # the edit was asked over the first turn only
        assert [m.content for m in backend.requests[-1].messages] == [
            "Be brief.",
            "q1",
            "answer 1",
            "q2, edited",
        ]

        # Back to the old question: its branch comes back as it was left (answer 2).
        await pilot.press("ctrl+up", "up", "left")
        assert shown(app)[3:] == ["q2 ‹1/2›", "answer 2 ‹1/2›"]
        app.chat.send("q3")  # the chat goes on from the branch shown
        await settled(pilot, app, 5)
        assert [m.content for m in backend.requests[-1].messages][-3:] == [
            "q2",
            "answer 2",
            "q3",
        ]

        # Esc while editing: the draft typed before comes back, nothing is sent.
        prompt.text = "half a thought"
        await pilot.press("ctrl+up", "up", "e")
        assert prompt.text == "q3"
        await pilot.press("escape")
        assert prompt.text == "half a thought" and prompt.border_title is None
        assert len(backend.requests) == 5

    # Every branch was saved as it happened.
    contents = [r["content"] for r in stored_messages()]
    for text in ("answer 2", "answer 3", "q2, edited", "answer 4", "q3", "answer 5"):
        assert text in contents


async def test_editing_the_system_prompt_answers_the_last_question_on_a_new_root() -> None:
    backend = Numbered()
    app = PhasechatApp(settings=Settings(system="Be brief."), backend=backend)
    async with app.run_test(size=(100, 40)) as pilot:
        app.chat.send("q1")
        await settled(pilot, app, 1)
        views = list(app.query(MessageView))
        views[0].focus()
        await pilot.press("e")
        prompt = app.query_one(PromptInput)
        assert prompt.text == "Be brief." and "system prompt" in str(prompt.border_title)
        prompt.text = "Answer in French."
        await pilot.press("enter")
        await settled(pilot, app, 2)
        assert shown(app) == ["Answer in French. ‹2/2›", "q1", "answer 2"]
        assert backend.requests[-1].messages[0].content == "Answer in French."
        assert app.turns.settings.system == "Answer in French."
        app.query(MessageView).first().focus()
        await pilot.press("left")  # the first root: its own system prompt and answer
        assert shown(app) == ["Be brief. ‹1/2›", "q1", "answer 1"]
        assert app.turns.settings.system == "Be brief."
        app.chat.action_edit_system()  # the palette's "Edit the system prompt"
        await pilot.pause()
        assert prompt.text == "Be brief." and "system prompt" in str(prompt.border_title)


def test_an_empty_system_prompt_is_shown_where_another_branch_has_one() -> None:
    """Issue 49: the branch shown has no system prompt, another has one: its empty root
    is drawn, so that the other's ‹2/2› can be reached; alone, it is not drawn."""
    chat = Conversation("Be brief.")
    chat.add(ChatMessage("user", "first"))
    chat.rewind(None)
    empty = chat.add(ChatMessage("system", ""))
    question = chat.add(ChatMessage("user", "second"))
    assert len(chat.siblings(empty)) == 2
    assert shown_messages(chat) == [empty, question]
    alone = Conversation("")
    asked = alone.add(ChatMessage("user", "only"))
    assert shown_messages(alone) == [asked]
    kept = Conversation("Be brief.")
    assert [m.content for m in shown_messages(kept)] == ["Be brief."]
