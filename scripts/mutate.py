"""Mutation check: put small operator bugs into one module, one at a time, and run tests.

Each mutant is a bug a careless edit makes: a comparison's boundary (`<` for `<=`), an
operator (`+` for `-`, `*` for `/`), `and` for `or`, a lost `not`, `abs`, `min`/`max` or
`round`, `min` for `max`, a constant one off, the first item for the last, a slice's
end. The module is rewritten in place and restored after each run (also on Ctrl-C);
its bytecode is removed so that Python reads the mutated source. A mutant the tests do
not fail on is a survivor: a bug they cannot see, or an equivalent change to judge.

    .venv/bin/python scripts/mutate.py telemetry/timeline.py tests/test_timeline.py
    .venv/bin/python scripts/mutate.py telemetry/metrics.py tests/test_metrics.py \\
        --lines 120-180 --marks 'not server and not model'
    .venv/bin/python scripts/mutate.py telemetry/metrics.py --list

Run it alone in its own worktree: it edits the module's file while it runs, and
nothing else (pytest, ruff) should read that file meanwhile.
"""

from __future__ import annotations

import argparse
import ast
import os
import pathlib
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

SWAP_CMP: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
}
SWAP_BIN: dict[type[ast.operator], type[ast.operator]] = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Div,
    ast.Div: ast.Mult,
    ast.FloorDiv: ast.Div,
}
DROP_CALLS = {"abs", "round", "min", "max", "int", "float", "sorted"}


@dataclass(frozen=True)
class Mutant:
    line: int
    start: int  # offsets into the source text
    end: int
    new: str
    what: str


def _offsets(src: str) -> list[int]:
    starts, n = [], 0
    for line in src.splitlines(keepends=True):
        starts.append(n)
        n += len(line.encode())
    return starts


def _span(node: ast.AST, starts: list[int], raw: bytes) -> tuple[int, int]:
    a = starts[node.lineno - 1] + node.col_offset  # type: ignore[attr-defined]
    b = starts[node.end_lineno - 1] + node.end_col_offset  # type: ignore[attr-defined]
    # back to character offsets
    return len(raw[:a].decode()), len(raw[:b].decode())


def _variants(node: ast.AST) -> Iterator[tuple[ast.AST, str]]:
    if isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            if type(op) in SWAP_CMP:
                ops = list(node.ops)
                ops[i] = SWAP_CMP[type(op)]()
                yield ast.Compare(node.left, ops, node.comparators), "boundary/compare"
    elif isinstance(node, ast.BinOp) and type(node.op) in SWAP_BIN:
        yield ast.BinOp(node.left, SWAP_BIN[type(node.op)](), node.right), "operator"
        if isinstance(node.op, ast.Add | ast.Sub):
            yield node.left, "dropped term"
    elif isinstance(node, ast.BoolOp):
        other = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        yield ast.BoolOp(other, node.values), "and/or"
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        yield node.operand, "lost not"
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        yield node.operand, "lost minus"
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        name = node.func.id
        if name in ("min", "max"):
            other = "max" if name == "min" else "min"
            yield ast.Call(ast.Name(other), node.args, node.keywords), "min/max"
        if name in DROP_CALLS and len(node.args) == 1 and not node.keywords:
            yield node.args[0], f"lost {name}()"
        if name in ("min", "max") and len(node.args) == 2 and not node.keywords:
            for arg in node.args:
                yield arg, f"lost {name}() clamp"
    elif isinstance(node, ast.Constant) and type(node.value) in (int, float):
        v = node.value
        if isinstance(v, bool):
            return
        yield ast.Constant(v + 1), "constant +1"
        if v not in (0, 1):
            yield ast.Constant(v - 1 if isinstance(v, int) else v * 0.9), "constant smaller"
    elif isinstance(node, ast.Subscript):
        s = node.slice
        if isinstance(s, ast.Constant) and s.value in (0, -1):
            flip = -1 if s.value == 0 else 0
            yield ast.Subscript(node.value, ast.Constant(flip)), "first/last"
        if isinstance(s, ast.UnaryOp) and isinstance(s.op, ast.USub):
            yield ast.Subscript(node.value, ast.Constant(0)), "first/last"
        if isinstance(s, ast.Slice):
            if s.lower is not None:
                yield ast.Subscript(node.value, ast.Slice(None, s.upper, s.step)), "slice start"
            if s.upper is not None:
                yield ast.Subscript(node.value, ast.Slice(s.lower, None, s.step)), "slice end"
    elif isinstance(node, ast.AugAssign) and type(node.op) in SWAP_BIN:
        yield ast.AugAssign(node.target, SWAP_BIN[type(node.op)](), node.value), "operator"


def mutants(src: str) -> list[Mutant]:
    tree = ast.parse(src)
    starts, raw = _offsets(src), src.encode()
    skip: set[int] = set()  # f-strings' parts and annotations: not figures
    for node in ast.walk(tree):
        roots: list[ast.AST | None] = []
        if isinstance(node, ast.JoinedStr):
            roots = [node]
        elif isinstance(node, ast.arg | ast.AnnAssign):
            roots = [node.annotation]
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            roots = [node.returns]
        for root in roots:
            if root is not None:
                skip.update(id(n) for n in ast.walk(root))
    out = []
    for node in ast.walk(tree):
        if not hasattr(node, "lineno") or id(node) in skip:
            continue
        for new, what in _variants(node):
            a, b = _span(node, starts, raw)
            text = ast.unparse(new)
            if not isinstance(node, ast.stmt):
                text = f"({text})"
            out.append(Mutant(node.lineno, a, b, text, what))  # type: ignore[attr-defined]
    return sorted(set(out), key=lambda m: (m.start, m.end, m.new))


def run_with(path: pathlib.Path, text: str, cmd: list[str], timeout: float) -> tuple[int, str]:
    """Run `cmd` (pytest) with `path` holding `text`, then put its own text back (also
    on Ctrl-C or SIGTERM): (exit status, output). A run past `timeout` is a failure
    the suite shows (124)."""
    src = path.read_text()
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    try:
        path.write_text(text)
        _clear_bytecode(path)
        run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        return run.returncode, run.stdout
    except subprocess.TimeoutExpired:
        return 124, "ERROR (timed out)"
    finally:
        path.write_text(src)
        _clear_bytecode(path)


def _clear_bytecode(path: pathlib.Path) -> None:
    """So that Python reads the source just written, not a .pyc of the same size and
    second."""
    for pyc in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):
        pyc.unlink()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("module", help="the file to mutate, e.g. telemetry/metrics.py")
    p.add_argument("tests", nargs="*", help="test files or node ids to run on each mutant")
    p.add_argument("--lines", help="only mutants on these lines, e.g. 40-90,120")
    p.add_argument("--marks", default="not server and not model", help="pytest -m")
    p.add_argument("--timeout", type=float, help="seconds a run may take (10x the clean run)")
    p.add_argument("--list", action="store_true", help="print the mutants, run nothing")
    a = p.parse_args()

    path = pathlib.Path(a.module)
    src = path.read_text()
    wanted: set[int] | None = None
    if a.lines:
        wanted = set()
        for part in a.lines.split(","):
            lo, _, hi = part.partition("-")
            wanted.update(range(int(lo), int(hi or lo) + 1))
    todo = [m for m in mutants(src) if wanted is None or m.line in wanted]
    lines = src.splitlines()

    def show(m: Mutant) -> str:
        return f"{path}:{m.line} [{m.what}] {src[m.start : m.end]!r} -> {m.new!r}"

    if a.list:
        for m in todo:
            print(show(m))
        print(f"{len(todo)} mutants")
        return 0
    if not a.tests:
        p.error("name the tests to run")

    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", a.marks]
    cmd += a.tests
    # SIGTERM (a `timeout` around this script) ends the run through `finally`, which
    # restores the module
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    t0 = time.monotonic()
    rc, out = run_with(path, src, cmd, timeout=3600)
    if rc != 0:
        print(f"the tests fail without a mutant:\n{out[-2000:]}")
        return 2
    timeout = a.timeout or max(30.0, 10 * (time.monotonic() - t0))  # a mutant's hang is a catch
    survivors: list[Mutant] = []
    t0 = time.monotonic()
    for i, m in enumerate(todo, 1):
        rc, _ = run_with(path, src[: m.start] + m.new + src[m.end :], cmd, timeout)
        if rc == 0:
            survivors.append(m)
        print(f"[{i}/{len(todo)}] {'SURVIVED' if rc == 0 else 'caught  '} {show(m)}", flush=True)
    took = time.monotonic() - t0
    print(f"\n{len(todo) - len(survivors)}/{len(todo)} caught in {took:.0f} s; survivors:")
    for m in survivors:
        print(f"  {show(m)}\n      line: {lines[m.line - 1].strip()}")
    return 1 if survivors else 0


if __name__ == "__main__":
    raise SystemExit(main())
