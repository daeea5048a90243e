"""What the chat's dialogs may ask of the chat screen: its workspace and the few
operations that redraw the chat. `ChatScreen` (tui/chat_screen.py) has them; the
modules that open dialogs take a `ChatHost`, so none of them imports the screen (no
import circle)."""

from __future__ import annotations

from typing import Any, Protocol

from textual.app import App
from textual.notifications import SeverityLevel

from phasechat.backends.base import Backend
from phasechat.chat.conversation import Conversation
from phasechat.chat.turns import TurnController
from phasechat.chat.workspace import Workspace

#: what an action that would change the chat says while an answer is under way
BUSY = "still answering: press Esc to stop it first"


class ChatHost(Protocol):
    """The chat as its dialogs see it (implemented by `tui.chat_screen.ChatScreen`)."""

    workspace: Workspace

    @property
    def app(self) -> App[Any]:
        """The app, which shows the dialogs (`push_screen`) and runs their workers."""
        ...

    @property
    def turns(self) -> TurnController:
        """The chat's turns (read it; change the chat only through its methods)."""
        ...

    @property
    def backend(self) -> Backend:
        """The backend that answers next."""
        ...

    @property
    def generating(self) -> bool:
        """An answer is being sent, streamed or drawn."""
        ...

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = True,
    ) -> None:
        """Say `message` (as plain text: tui/plain.py)."""
        ...

    def refused_while_answering(self) -> bool:
        """True, and says so once, while an answer is being sent, streamed or drawn: the
        one place an action that changes the chat is refused for it."""
        ...

    async def switch_to(self, name: str) -> None:
        """Answer with backend profile `name` from now on (the chat carries over)."""
        ...

    def reload_backend(self) -> None:
        """Start the active backend again (a new one: its model changed), off the UI."""
        ...

    async def stop_and_wait(self) -> None:
        """Stop a streaming answer; return once it is saved and final on screen."""
        ...

    async def show_conversation(self, conversation: Conversation) -> None:
        """Replace the chat on screen with `conversation`."""
        ...
