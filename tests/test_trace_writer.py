"""Only the recorder writes a `Trace` (issue 50, item 2): no product module outside
telemetry/recorder.py assigns to a trace's field or appends to one; what the turn knows
(its wait for a summary, its prompt's count, a notice, its end) goes through the
recorder's methods. Read from the source (an assignment is a statement, not a value a
run could show)."""

from __future__ import annotations

import ast
from dataclasses import fields
from pathlib import Path

from phasechat.telemetry.recorder import Trace

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("backends", "telemetry", "chat", "tui", "phasechat/cli")
FIELDS = {f.name for f in fields(Trace)}
MUTATORS = {"append", "extend", "insert", "pop", "clear", "remove", "__setitem__"}


def _is_trace(node: ast.expr) -> bool:
    """`trace`, or `<anything>.trace` (an exchange's, an answer's)."""
    return (isinstance(node, ast.Name) and node.id == "trace") or (
        isinstance(node, ast.Attribute) and node.attr == "trace"
    )


def _field(node: ast.expr) -> str | None:
    """The trace field `node` names (`trace.t_sent`, `x.trace.notices[0]`), if any."""
    while isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Attribute) and node.attr in FIELDS and _is_trace(node.value):
        return node.attr
    return None


def writes(source: str) -> list[tuple[int, str]]:
    """Each line of `source` that writes a trace's field, with the field."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.stmt | ast.expr):
            continue
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = [t for tgt in node.targets for t in ast.walk(tgt) if isinstance(t, ast.expr)]
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in MUTATORS
        ):
            targets = [node.func.value]
        found += [(node.lineno, name) for t in targets if (name := _field(t))]
    return sorted(set(found))


def test_the_finder_sees_each_way_of_writing_a_trace() -> None:
    source = (
        "trace.t_sent = 1\n"
        "exchange.trace.t_queued = 2\n"
        "a, trace.prompt_estimate = 3, 4\n"
        "trace.deltas += 1\n"
        "x.trace.notices.append('n')\n"
        "trace.text_parts[0] = 'a'\n"
        "trace.observe(e, 5)\n"  # the recorder's own method: not a write from outside
        "t = trace.t_sent\n"
        "other.t_sent = 6\n"  # not a trace
    )
    assert writes(source) == [
        (1, "t_sent"),
        (2, "t_queued"),
        (3, "prompt_estimate"),
        (4, "deltas"),
        (5, "notices"),
        (6, "text_parts"),
    ]


def test_no_module_but_the_recorder_writes_a_trace() -> None:
    recorder = ROOT / "telemetry" / "recorder.py"
    found = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for folder in PRODUCT
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path != recorder
        for line, name in writes(path.read_text())
    ]
    assert found == []
