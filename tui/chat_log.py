"""The scrolling chat: one `MessageView` per message, answers streamed into them."""

from __future__ import annotations

from textual.containers import VerticalScroll
from textual.content import Content

from phasechat.chat.conversation import ChatMessage, Conversation
from phasechat.chat.session import Exchange
from phasechat.chat.text import visible_controls
from phasechat.tui.telemetry_view import answer_footer
from phasechat.tui.widgets import MessageView


def footer_of(message: ChatMessage, footer: Content) -> Content:
    """An answer's footer, with its error (if it failed) on a line of its own."""
    if message.error:
        # The error quotes a server: drawn as inert text.
        return Content.assemble(footer, (f"\n{visible_controls(message.error)}", "$error"))
    return footer


class ChatLog(VerticalScroll):
    """The messages of the conversation, oldest first, anchored to the newest."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._marked = 0  # messages shown as summarized

    async def show(self, conversation: Conversation) -> None:
        """Replace what is shown with `conversation` (a saved chat, or a new one)."""
        await self.remove_children()
        views = [MessageView(m) for m in conversation.messages]
        await self.mount_all(views)
        for view in views:
            m = view.message
            if m.role == "assistant" and m.metrics is not None:
                view.set_footer(footer_of(m, answer_footer(m.metrics)))
        self._marked = 0
        self.anchor()

    async def add_exchange(self, exchange: Exchange) -> MessageView:
        """Show a new user turn and its (empty, streaming) answer; returns the answer."""
        answer = MessageView(exchange.answer)
        await self.mount_all([MessageView(exchange.user), answer])
        return answer

    def toggle_thinking(self) -> bool:
        """Fold or unfold the newest answer's thinking; False when no answer has any."""
        return any(view.toggle_thinking() for view in reversed(self.query(MessageView)))

    def mark_summarized(self, covered: frozenset[int]) -> None:
        """Dim the messages a history summary replaces, when that set changes."""
        if len(covered) == self._marked:
            return
        self._marked = len(covered)
        for view in self.query(MessageView):
            view.mark_summarized(view.message.id in covered)
