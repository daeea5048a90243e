"""docs/layout.md's table of modules is written from the code (scripts/layout_doc.py):
the committed file is what the script writes now, so it cannot drift."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def load_script() -> ModuleType:
    """scripts/layout_doc.py as a module (scripts/ is not a package; its own imports,
    scripts/package_map.py, are found as when it runs as a script)."""
    if str(ROOT / "scripts") not in sys.path:
        sys.path.append(str(ROOT / "scripts"))
    spec = importlib.util.spec_from_file_location("layout_doc", ROOT / "scripts" / "layout_doc.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["layout_doc"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


layout_doc = load_script()


def write_tree(root: Path, files: dict[str, str]) -> None:
    """Each file of `files` (path: text) written under `root`, its folders made."""
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text + "\n")


def test_the_committed_layout_is_what_the_code_says() -> None:
    committed = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    assert layout_doc.rewritten(committed, layout_doc.table(ROOT)) == committed, (
        "docs/layout.md is stale: run .venv/bin/python scripts/layout_doc.py"
    )
    # the prose around the table is the file's own, kept
    assert committed.startswith("# Layout\n") and "A send, end to end:" in committed
    assert "| 2 | `tui/palette.py` |" in committed  # a module of this change, listed


def test_a_summary_is_the_first_sentence_of_the_first_paragraph() -> None:
    summary = layout_doc.summary
    # the first physical line would stop at "runs its"
    wrapped = "The app: it draws a `Workspace` and runs its\nworkers; the state lives there. Next."
    assert (
        summary(wrapped)
        == "The app: it draws a `Workspace` and runs its workers; the state lives there."
    )
    # not cut at an abbreviation, a version or a path; a table's bar escaped
    assert summary("Pinned, e.g. 0.3.36 in pyproject.toml. More") == (
        "Pinned, e.g. 0.3.36 in pyproject.toml."
    )
    assert summary("a | b.\n\nThe rest.") == "a \\| b."
    assert summary("Ends (`x`). `Code` next.") == "Ends (`x`)."
    assert summary(None) == "" and summary("") == ""


def test_the_table_follows_the_layers_and_the_inner_contracts(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        "[[tool.importlinter.contracts]]\n"
        'name = "top"\ntype = "layers"\nlayers = ["pkg.ui", "pkg.core | pkg.extra"]\n'
        "[[tool.importlinter.contracts]]\n"
        'name = "inside core"\ntype = "layers"\nlayers = ["pkg.core.zed", "pkg.core.alpha"]\n'
        "[[tool.importlinter.contracts]]\n"
        'name = "other"\ntype = "forbidden"\n'
    )
    files = {
        "pkg/__init__.py": '"""The package: not in a layer."""',
        "pkg/ui.py": '"""The screen.\n\nDetails."""',
        "pkg/core/__init__.py": "",  # no docstring: no row
        "pkg/core/alpha.py": '"""Alpha, below zed."""',
        "pkg/core/zed.py": '"""Zed, on top."""',
        "pkg/core/middle.py": '"""In no inner layer: last."""',
        "pkg/extra/__init__.py": '"""Extra things."""',
        "bench/speed.py": '"""How fast. Measured."""',
    }
    write_tree(tmp_path, files)
    # by the inner contract: zed, alpha, then the rest (alphabetically alpha would lead)
    assert layout_doc.table(tmp_path).splitlines() == [
        "| floor | module | what |",
        "|---|---|---|",
        "| 1 | `pkg/ui.py` | The screen. |",
        "| 2 | `pkg/core/zed.py` | Zed, on top. |",
        "| 2 | `pkg/core/alpha.py` | Alpha, below zed. |",
        "| 2 | `pkg/core/middle.py` | In no inner layer: last. |",
        "| 2 | `pkg/extra/` | Extra things. |",
        "",
        "Outside the package, `bench/` (`python -m bench.<name>`):",
        "",
        "| module | what |",
        "|---|---|",
        "| `bench/speed.py` | How fast. |",
    ]


def test_only_the_part_between_the_markers_is_written() -> None:
    text = f"# Title\nprose\n{layout_doc.BEGIN}\nold table\n{layout_doc.END}\nmore prose\n"
    assert layout_doc.rewritten(text, "new") == (
        f"# Title\nprose\n{layout_doc.BEGIN}\nnew\n{layout_doc.END}\nmore prose\n"
    )
