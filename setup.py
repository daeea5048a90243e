"""The packages of the one installed name, `phasechat.*`: what pyproject.toml cannot say.

The layers are top-level folders of the repository (the design card's layout), mapped
into the package by `[tool.setuptools.package-dir]` in pyproject.toml; setuptools'
`packages.find` cannot put a prefix on what it finds, so the packages under each mapped
folder are found here (a new subpackage is found without being listed)."""

import tomllib
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent
MAPPED = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"][
    "package-dir"
]

packages = find_packages(str(ROOT), include=["phasechat", "phasechat.*"])
for name, folder in MAPPED.items():
    packages += [name, *(f"{name}.{sub}" for sub in find_packages(str(ROOT / folder)))]

setup(packages=packages)
