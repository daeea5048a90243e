"""docs/layout.md's table of modules, written from the code: the layers of the
import-linter contracts in pyproject.toml, each module under its layer with the first
sentence of its docstring.

    .venv/bin/python scripts/layout_doc.py           # rewrite the table in docs/layout.md
    .venv/bin/python scripts/layout_doc.py --check   # exit 1 if it is not what the code says

Only the part between the two marker comments is written; the prose around it is the
file's own. tests/test_layout_doc.py fails when the committed table is not what this
writes, so the table cannot drift from the code. Nothing is imported: the docstrings are
read with `ast`, so writing the table loads neither Textual nor llama.cpp.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from package_map import module_file, modules_of  # scripts/ is on the path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "layout.md"
BEGIN = "<!-- scripts/layout_doc.py writes this table from the code: edit the docstrings -->"
END = "<!-- end of the generated table -->"
#: Outside the package, listed after the layers: the benchmarks.
BENCH = "bench"
#: The end of a docstring's first sentence: a full stop before a space and a capital
#: letter, a backtick or a bracket (not "e.g. the", not a version "0.3.36").
_SENTENCE_END = re.compile(r"\.(?=\s+[A-Z`(\[])")


@dataclass(frozen=True)
class Module:
    """One module as the table shows it: its path in the repository and its summary."""

    path: str
    summary: str


def summary(docstring: str | None) -> str:
    """The first sentence of `docstring`'s first paragraph, on one line ("" if none).

    A docstring's first physical line is often cut mid-sentence (it wraps at the line
    length), so the paragraph's lines are joined first."""
    if not docstring:
        return ""
    paragraph = " ".join(docstring.strip().split("\n\n")[0].split())
    end = _SENTENCE_END.search(paragraph)
    sentence = paragraph[: end.start() + 1] if end else paragraph
    return sentence.replace("|", "\\|")


def layers_of(pyproject: dict[str, object]) -> list[list[list[str]]]:
    """Each `layers` contract's layers, from the top: each layer its module names (the
    `|` and `:` separated siblings of one layer, each under each of the contract's
    `containers` where it names any)."""
    tool = pyproject.get("tool", {})
    assert isinstance(tool, dict)
    contracts = tool.get("importlinter", {}).get("contracts", [])
    out = []
    for contract in contracts:
        if contract.get("type") == "layers":
            layers = [[n.strip() for n in re.split(r"[|:]", layer)] for layer in contract["layers"]]
            containers = contract.get("containers", [])
            if containers:
                layers = [[f"{c}.{n}" for c in containers for n in layer] for layer in layers]
            out.append(layers)
    return out


def read_module(root: Path, path: Path) -> Module | None:
    """`path` as a table row, None for a package's `__init__.py` with no docstring."""
    docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    shown = path.resolve().relative_to(root.resolve())
    if path.name == "__init__.py":
        if not docstring:
            return None
        return Module(f"{shown.parent.as_posix()}/", summary(docstring))
    return Module(shown.as_posix(), summary(docstring))


def _rank(name: str, inner: Sequence[Sequence[Sequence[str]]]) -> tuple[int, str]:
    """Where module `name` sits in a contract about the inside of its package: the
    index of its layer there (after all of them when none names it), then its name."""
    for layers in inner:
        for index, layer in enumerate(layers):
            if any(name == n or name.startswith(n + ".") for n in layer):
                return index, name
    return len(max(inner, key=len, default=())), name


def modules_under(
    root: Path, name: str, claimed: set[str], inner: Sequence[Sequence[Sequence[str]]]
) -> list[Module]:
    """The modules of layer entry `name` (a module, or a package and everything in it
    that no other entry names), ordered by the contracts about their package's inside."""
    path = module_file(root, name)
    if path is None:
        raise SystemExit(f"layout_doc: {name} (in pyproject.toml's layers) has no file")
    if path.name != "__init__.py":
        module = read_module(root, path)
        return [module] if module else []
    found = []
    for dotted, file in modules_of(root, name).items():
        if any(dotted == c or dotted.startswith(c + ".") for c in claimed - {name}):
            continue
        # the package's own row (its __init__.py) before its modules
        found.append(((-1, dotted) if dotted == name else _rank(dotted, inner), file))
    rows = [read_module(root, file) for _, file in sorted(found)]
    return [row for row in rows if row is not None]


def table(root: Path) -> str:
    """The generated part of docs/layout.md for the repository at `root`."""
    pyproject = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = layers_of(pyproject)
    if not contracts:
        return ""
    top, inner = contracts[0], contracts[1:]
    claimed = {n for layer in top for n in layer}
    lines = ["| floor | module | what |", "|---|---|---|"]
    for floor, layer in enumerate(top, 1):
        for name in layer:
            within = [c for c in inner if all(n.startswith(name + ".") for x in c for n in x)]
            for m in modules_under(root, name, claimed, within):
                lines.append(f"| {floor} | `{m.path}` | {m.summary} |")
    bench = sorted((root / BENCH).glob("*.py")) if (root / BENCH).is_dir() else []
    rows = [m for m in (read_module(root, file) for file in bench) if m is not None]
    if rows:
        lines += ["", f"Outside the package, `{BENCH}/` (`python -m {BENCH}.<name>`):", ""]
        lines += ["| module | what |", "|---|---|"]
        lines += [f"| `{m.path}` | {m.summary} |" for m in rows]
    return "\n".join(lines)


def rewritten(text: str, generated: str) -> str:
    """`text` (docs/layout.md) with the part between the markers replaced by `generated`."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"layout_doc: docs/layout.md has no {BEGIN!r} ... {END!r} markers")
    return text[: start + len(BEGIN)] + "\n" + generated + "\n" + text[end:]


def main(argv: Sequence[str] | None = None) -> int:
    """Rewrite docs/layout.md's table, or with --check say whether it is current."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the table is stale")
    args = parser.parse_args(argv)
    text = DOC.read_text(encoding="utf-8")
    new = rewritten(text, table(ROOT))
    if args.check:
        if new != text:
            print("docs/layout.md is stale: run scripts/layout_doc.py", file=sys.stderr)
            return 1
        return 0
    if new != text:
        DOC.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
