"""mypy over the package under its installed names (`phasechat.*`), and the tests.

    .venv/bin/python scripts/mypy_package.py [mypy options]

The layers live in top-level folders mapped into the package (pyproject.toml's
`[tool.setuptools.package-dir]`), and mypy names a module by its folder: `backends/base.py`
would be `backends.base`, and it cannot follow an editable install's import hook to
`phasechat.backends`. So each file is given to mypy with its installed name
(scripts/package_map.py), every module checked once, its errors at its real path. The
settings are pyproject.toml's `[tool.mypy]` (strict); the output and exit status are
mypy's own.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import package_map
from mypy import util
from mypy.fscache import FileSystemCache
from mypy.main import process_options, run_build
from mypy.modulefinder import BuildSource

ROOT = Path(__file__).resolve().parent.parent
#: what is checked: the package, and the tests (under their own names)
CHECKED = ("phasechat", "tests")


def named_sources(root: Path) -> list[BuildSource]:
    """Each file of `CHECKED` with its module's installed name."""
    found: dict[str, Path] = {}
    for package in CHECKED:
        found.update(package_map.modules_of(root, package))
    return [
        BuildSource(str(path.relative_to(root)), name, base_dir=str(root))
        for name, path in sorted(found.items())
    ]


def main(argv: Sequence[str]) -> int:
    t0 = time.time()
    os.chdir(ROOT)  # mypy's config, cache and paths are the repository's
    sources = named_sources(ROOT)
    fscache = FileSystemCache()
    # the options from pyproject.toml and argv; the targets, found by mypy from the
    # files, are replaced with the same files under their installed names
    _, options = process_options([*argv, *(s.path for s in sources if s.path)], fscache=fscache)
    _, messages, blockers = run_build(sources, options, fscache, t0, sys.stdout, sys.stderr)
    formatter = util.FancyFormatter(sys.stdout, sys.stderr, options.hide_error_codes)
    n_errors, n_notes, n_files = util.count_stats(messages)
    if n_errors:
        print(formatter.format_error(n_errors, n_files, len(sources), blockers=blockers))
    elif n_notes == len(messages):
        print(formatter.format_success(len(sources), options.color_output))
    return 0 if n_notes == len(messages) else 2 if blockers else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
