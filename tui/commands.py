"""The chat's commands, each declared once: its id, its key (with the footer's label and
place), its title and help in the command palette, the action that does it and when it
is enabled. The bindings, the footer and the palette (tui/palette.py) are all built
from `COMMANDS`, as harlequin builds its keymaps over `HARLEQUIN_ACTIONS`.

An action is a Textual action name, run on the chat screen (`ChatScreen.action_<name>`,
which may hand over to the module that opens the dialog: tui/dialogs.py,
tui/servers.py, ...) or, named `app.<name>`, on the app; a key and a palette entry run
the same call by construction."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial

from textual.actions import parse
from textual.app import SystemCommand
from textual.binding import Binding
from textual.dom import DOMNode

from phasechat.tui import compare_picker


@dataclass(frozen=True)
class Key:
    """A command's key: `label` in the footer (unless hidden), at place `slot` there."""

    keys: str
    label: str
    slot: int
    show: bool = True
    #: checked before the focused widget's own keys (Ctrl+Q quits from anywhere)
    priority: bool = False


@dataclass(frozen=True)
class Command:
    """One thing the user can ask of the chat, by key, by palette or both."""

    id: str
    #: the palette's title; "" keeps it out of the palette (a key alone)
    title: str
    help: str
    #: the Textual action run on the chat: `action_<action>` (arguments allowed)
    action: str
    key: Key | None = None
    #: when the command may run (a key dimmed in the footer, gone from the palette);
    #: None: always
    enabled: Callable[[DOMNode], bool] | None = None


#: The palette lists them in this order, the most used first; keys-only ones last.
COMMANDS: tuple[Command, ...] = (
    Command(
        "stop", "Stop answer", "Stop the answer being generated", "stop", Key("escape", "Stop", 2)
    ),
    Command(
        "retry",
        "Retry",
        "Answer the last question again (the old answer stays, a sibling)",
        "retry",
        Key("ctrl+r", "Retry", 3),
    ),
    Command(
        "select-message",
        "Select a message",
        "The newest message: ←/→ its siblings' branches, e edits a question (Ctrl+Up)",
        "select_message",
        Key("ctrl+up", "Messages", 12),
    ),
    Command(
        "edit-system",
        "Edit the system prompt",
        "Enter answers the last question with it, on a new branch",
        "edit_system",
    ),
    Command(
        "prompt-view",
        "Show the prompt",
        "What the engine read for the selected answer: sections, cache break, exact text (F8)",
        "prompt_view",
        Key("f8", "Prompt", 9),
    ),
    Command(
        "ablate",
        "What each part of the prompt is worth",
        "The last turn again without each section, cold: TTFT, decode, e2e saved (ablation)",
        "ablate",
    ),
    Command(
        "compare",
        compare_picker.TITLE[0],
        "The same conversation on another backend or settings, side by side (F5)",
        "compare",
        Key("f5", "Compare", 8),
    ),
    Command(
        "history",
        "Request history",
        "Every answer's metrics; export JSONL/CSV",
        "history",
        Key("f2", "History", 5),
    ),
    Command("new-chat", "New chat", "Start an empty chat", "new_chat"),
    Command(
        "toggle-telemetry",
        "Toggle telemetry",
        "Show or hide the live telemetry panel",
        "toggle_telemetry",
        Key("ctrl+t", "Telemetry", 10),
    ),
    Command(
        "switch-backend",
        "Switch backend",
        "Answer with another model or endpoint; add a server, pick its model (Ctrl+B)",
        "switch_backend",
        Key("ctrl+b", "Backend", 4),
    ),
    Command(
        "chats",
        "Chats",
        "Open, search, rename, delete, export",
        "chats",
        Key("f3", "Chats", 6),
    ),
    Command(
        "toggle-trimming",
        "Toggle history trimming",
        "Summarize old turns to bound prefill",
        "toggle_trimming",
    ),
    Command(
        "settings",
        "Engine settings",
        "System prompt, temperature, max tokens, stop",
        "settings",
        Key("f4", "Settings", 7),
    ),
    Command(
        "export-chat",
        "Export this chat",
        "Write the chat on screen to .md/.json (even unsaved)",
        "export_chat",
    ),
    Command(
        "sweep",
        "Concurrency sweep",
        "Throughput and per-user speed at 1, 2, 4, 8 concurrent requests (remote backends)",
        "sweep",
    ),
    Command("quit", "", "Quit the app", "app.quit", Key("ctrl+q", "Quit", 1, priority=True)),
    Command(
        "toggle-thinking",
        "",
        "Fold or unfold the newest answer's thinking",
        "toggle_thinking",
        Key("ctrl+o", "Thinking", 11),
    ),
    Command(
        "focus-prompt",
        "",
        "Back to the prompt box",
        "focus_prompt",
        Key("ctrl+l", "Prompt", 13, show=False),
    ),
)


def bindings(commands: Sequence[Command] = COMMANDS) -> list[Binding]:
    """The keys of `commands`, in their footer order, each with the command's id: the
    app's BINDINGS, so a key works over every screen that does not take it itself (the
    compare view's footer lists them, as it always did). Each runs its action on the
    chat screen (`chat('<action>')`: `PhasechatApp.action_chat`), or, named
    `app.<name>`, on the app."""
    keyed = sorted((c.key.slot, c.key, c) for c in commands if c.key is not None)
    return [
        Binding(k.keys, routed(c.action), k.label, show=k.show, priority=k.priority, id=c.id)
        for _slot, k, c in keyed
    ]


def routed(action: str) -> str:
    """`action` as the app's binding names it: on the app itself, or through `chat`."""
    if action.startswith("app."):
        return action.removeprefix("app.")
    return f"chat({action!r})"


def by_action(commands: Sequence[Command] = COMMANDS) -> dict[str, Command]:
    """Each command under the name of its action (what `check_action` is asked about)."""
    return {c.action.partition("(")[0]: c for c in commands}


def palette_entries(
    target: DOMNode, commands: Sequence[Command] = COMMANDS
) -> Iterable[SystemCommand]:
    """The palette's entries of `commands` enabled now, in the table's order; each runs
    its action on `target` (the chat) as its key does."""
    for command in commands:
        if command.title and (command.enabled is None or command.enabled(target)):
            yield SystemCommand(command.title, command.help, _runner(target, command.action))


def _runner(target: DOMNode, action: str) -> Callable[[], object]:
    """The call of `action` on `target`: its `action_<name>` with the action's arguments,
    the method a key runs (called at once, so a caller sees its effect)."""
    namespace, name, arguments = parse(action)
    owner = target.app if namespace == "app" else target
    method: Callable[..., object] = getattr(owner, f"action_{name}")
    return partial(method, *arguments)
