""" "Compare the last prompt on ..." (F5): pick a backend (the switcher's list, with its
re-prefill cost) or the active one with other settings, then open the compare view."""

from __future__ import annotations

from phasechat.backends.base import Backend
from phasechat.chat.config.profiles import BackendSpec, make_backend
from phasechat.chat.costs import switch_cost
from phasechat.chat.trips.compare import Comparison, Side
from phasechat.chat.trips.compare_targets import Target, derive, variants
from phasechat.chat.workspace import Workspace
from phasechat.tui.host import ChatHost
from phasechat.tui.screens.switch_screen import SwitchScreen
from phasechat.tui.widgets.telemetry_view import switch_line

TITLE = ("Compare the last prompt on ...", "  (side by side with the active backend)")


def targets(ws: Workspace) -> list[tuple[Target, str]]:
    """Every other profile, then the active one with other settings; each with the
    cost line the switcher shows."""
    turns, active = ws.turns, ws.backend
    out = []
    for name, spec in ws.profiles.items():
        if name != active.name:
            cost = switch_line(switch_cost(turns, name, ws.built(name)))
            out.append((Target(name, spec, turns.settings, name), cost))
    spec = ws.profiles[active.name]
    for overrides in variants(spec, turns.settings):
        target = derive(active.name, spec, turns.settings, overrides)
        if target.own_backend:
            cost = switch_line(switch_cost(turns, target.name, None))
            cost += " · loads a second copy of the model"
        else:
            size = switch_cost(turns, active.name, active)
            approx = "~" if size.estimated else ""
            cost = f"history {approx}{size.tokens:,} tokens · same backend and cache"
        out.append((target, cost))
    return out


def _shown(target: Target) -> BackendSpec:
    """The spec as the picker lists it: under the target's own name."""
    return target.spec.named(target.name)


def compare_last(chat: ChatHost) -> None:
    """Pick where to send the last prompt again, then compare the two answers."""
    if chat.refused_while_answering():
        return
    sent = [e for e in chat.turns.exchanges if e.request is not None and e.metrics is not None]
    if not sent:
        chat.notify("nothing to compare yet: send a message first", severity="warning")
        return
    assert sent[-1].request is not None
    messages = sent[-1].request.messages  # the conversation as the last prompt sent it
    ws = chat.workspace
    rows = targets(ws)
    by_name = {t.name: t for t, _ in rows}

    def chosen(name: str | None) -> None:
        target = by_name.get(name or "")
        if target is None:
            return
        owned: list[Backend] = []
        if target.own_backend:
            backend = make_backend(target.spec)
            owned.append(backend)
        else:
            backend = ws.backend_for(target.profile)
        a = Side(ws.backend.name, ws.backend, ws.turns.settings)
        b = Side(target.name, backend, target.settings)
        from phasechat.tui.screens.compare_screen import CompareScreen  # plotext: not at start-up

        chat.app.push_screen(CompareScreen(Comparison(a, b, messages), owned))

    shown = [(_shown(t), cost) for t, cost in rows]
    chat.app.push_screen(SwitchScreen(shown, ws.backend.name, TITLE), chosen)
