"""What the app's dialogs and screens may ask of the app: its workspace and the few
operations that redraw the chat. `PhasechatApp` implements it; the modules that open
dialogs take a `ChatHost`, so none of them imports the app (no import circle)."""

from __future__ import annotations

from phasechat.backends.base import Backend
from phasechat.chat.conversation import Conversation
from phasechat.chat.turns import TurnController
from phasechat.chat.workspace import Workspace
from phasechat.tui.plain import PlainTextApp

#: what an action that would change the chat says while an answer is under way
BUSY = "still answering: press Esc to stop it first"


class ChatHost(PlainTextApp):
    """The app as its dialogs see it (implemented by `tui.app.PhasechatApp`)."""

    workspace: Workspace

    @property
    def turns(self) -> TurnController:
        """The chat's turns (read it; change the chat only through its methods)."""
        return self.workspace.turns

    @property
    def backend(self) -> Backend:
        return self.workspace.backend

    @property
    def generating(self) -> bool:
        """An answer is being sent, streamed or drawn."""
        raise NotImplementedError

    def refused_while_answering(self) -> bool:
        """True, and says so once, while an answer is being sent, streamed or drawn: the
        one place an action that changes the chat is refused for it."""
        if self.generating:
            self.notify(BUSY, severity="warning")
            return True
        return False

    async def switch_to(self, name: str) -> None:
        """Answer with backend profile `name` from now on (the chat carries over)."""
        raise NotImplementedError

    def reload_backend(self) -> None:
        """Start the active backend again (a new one: its model changed), off the UI."""
        raise NotImplementedError

    async def stop_and_wait(self) -> None:
        """Stop a streaming answer; return once it is saved and final on screen."""
        raise NotImplementedError

    async def show_conversation(self, conversation: Conversation) -> None:
        """Replace the chat on screen with `conversation`."""
        raise NotImplementedError
