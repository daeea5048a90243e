"""The app's entries in Textual's command palette (Ctrl+P), as a command `Provider`.

Each entry is a command of the table in tui/commands.py, running the same action as
its key. A provider of its own, not
`App.get_system_commands`: Textual's `SystemCommandsProvider` sorts its entries by title,
and the chat's keep the order of the table (the most used first); Textual's own
(Theme, Keys, Quit) stay, from their provider."""

from __future__ import annotations

from textual.app import SystemCommand
from textual.command import DiscoveryHit, Hit, Hits, Provider

from phasechat.tui.chat_screen import ChatScreen
from phasechat.tui.commands import palette_entries


class ChatCommands(Provider):
    """The chat's commands: all of them shown when the palette opens, fuzzy-matched on
    their titles as the user types."""

    def _entries(self) -> list[SystemCommand]:
        """The entries for the chat screen (the first screen), over whichever screen the
        palette opened."""
        chat = next((s for s in self.app.screen_stack if isinstance(s, ChatScreen)), None)
        return list(palette_entries(chat)) if chat is not None else []

    async def discover(self) -> Hits:
        """Every entry, in the app's order (the palette before anything is typed)."""
        for entry in self._entries():
            yield DiscoveryHit(entry.title, entry.callback, help=entry.help)

    async def search(self, query: str) -> Hits:
        """The entries whose title matches `query`, scored by Textual's fuzzy matcher."""
        matcher = self.matcher(query)
        for entry in self._entries():
            if (score := matcher.match(entry.title)) > 0:
                yield Hit(score, matcher.highlight(entry.title), entry.callback, help=entry.help)
