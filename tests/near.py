"""`near`: pytest.approx where the code under test expects a float."""

from __future__ import annotations

from typing import cast

import pytest


def near(expected: float, *, rel: float | None = None, abs: float | None = None) -> float:
    """`pytest.approx(expected, rel=rel, abs=abs)`, typed as the float it stands for, so
    that it can sit in a tuple or a dataclass compared with `==` (an ApproxBase there is
    a type error to mypy; at run time approx's own `__eq__` still compares the element)."""
    return cast(float, pytest.approx(expected, rel=rel, abs=abs))
