"""phasechat: a terminal chat client for LLMs that shows, live, where the time goes."""

from __future__ import annotations

import os
import sys
from importlib.machinery import ModuleSpec, PathFinder
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence
    from types import ModuleType

__version__ = "0.1.0"

#: The layers: top-level folders of the repository (the design card's layout), each one
#: installed as `phasechat.<name>` (pyproject.toml's `[tool.setuptools.package-dir]`), the
#: only name they have.
LAYERS = ("backends", "chat", "telemetry", "tui", "themes")


class _SourceLayers:
    """`phasechat.<layer>` from the repository's top-level folder `<layer>/`, when this
    package runs from a source tree (a wheel holds the layers inside it). Only the five
    names: the rest of the repository (tests/, scripts/) is no part of the package. (A
    meta path finder by its one method: importlib.abc's base costs each start ~10 ms.)"""

    def __init__(self, root: str) -> None:
        self.root = root

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        package, _, layer = fullname.partition(".")
        if package != __name__ or layer not in LAYERS:
            return None
        # PathFinder names the spec `fullname` and looks for its last part under root
        return PathFinder.find_spec(fullname, [self.root])


def _find_source_layers() -> None:
    """From a source tree (an editable install, `PYTHONPATH=<checkout>`, a clone without
    symbolic links), the layers sit beside this folder, not in it: find them there, first,
    so that each checkout runs its own. (One stat call; an installed wheel skips it.)"""
    here = os.path.dirname(os.path.abspath(__file__))
    if os.path.isdir(os.path.join(here, LAYERS[0])):
        return
    root = os.path.dirname(here)
    if not any(isinstance(f, _SourceLayers) and f.root == root for f in sys.meta_path):
        sys.meta_path.insert(0, _SourceLayers(root))


_find_source_layers()
