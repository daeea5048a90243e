"""import-linter's `lint-imports` over the package as installed (`phasechat.*`).

    .venv/bin/python scripts/lint_imports.py [lint-imports options]

grimp, which builds import-linter's graph, walks the folder of the package it finds and
names each module by its path under it; the layers live in top-level folders mapped
into the package (pyproject.toml's `[tool.setuptools.package-dir]`), which it cannot see
from the repository. So it walks a copy laid out as a wheel lays it out (real folders,
scripts/package_map.py), put first on the path. The contracts, the report and the exit
status are `lint-imports`' own; the report names modules, never the copy's paths.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import package_map

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "phasechat"


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="phasechat-lint-") as tmp:
        package_map.copy_package(ROOT, PACKAGE, Path(tmp))
        # lint-imports puts its working folder first on the path: the copy's, so that
        # the repository's phasechat/ (which holds no layers) is not the one found
        os.chdir(tmp)
        if not any(arg.endswith((".toml", ".cfg", ".importlinter")) for arg in sys.argv[1:]):
            sys.argv.append(str(ROOT / "pyproject.toml"))  # the config, found from here
        from importlinter.cli import lint_imports_command

        lint_imports_command()  # a click command: it exits with lint-imports' status


if __name__ == "__main__":
    main()
