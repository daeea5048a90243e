"""phasechat's built-in themes, as Textual `Theme` data.

Telemetry colours are app-specific theme variables (declared once, with defaults, in
`VARIABLE_DEFAULTS`); a theme may override any of them in its `variables`.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from textual.color import ColorParseError
from textual.theme import Theme

#: App-specific variables and their fallbacks (values may reference base colours).
VARIABLE_DEFAULTS: dict[str, str] = {
    "phase-prefill": "#e0a030",
    "phase-decode": "#3fb950",
    "phase-thinking": "#a371f7",
    "itl-spark": "#58a6ff",
    "stall": "#f85149",
    "kv-fill": "#a371f7",
}

PHASE_DARK = Theme(
    name="phasechat-dark",
    primary="#58a6ff",
    secondary="#a371f7",
    accent="#f0883e",
    warning="#e0a030",
    error="#f85149",
    success="#3fb950",
    foreground="#e6edf3",
    background="#0d1117",
    surface="#161b22",
    panel="#1f2630",
    dark=True,
)

PHASE_LIGHT = Theme(
    name="phasechat-light",
    primary="#0969da",
    secondary="#8250df",
    accent="#bc4c00",
    warning="#9a6700",
    error="#cf222e",
    success="#1a7f37",
    foreground="#1f2328",
    background="#ffffff",
    surface="#f6f8fa",
    panel="#eaeef2",
    dark=False,
    variables={
        "phase-prefill": "#9a6700",
        "phase-decode": "#1a7f37",
        "phase-thinking": "#8250df",
        "itl-spark": "#0969da",
        "stall": "#cf222e",
        "kv-fill": "#8250df",
    },
)

PHASE_HIGH_CONTRAST = Theme(
    name="phasechat-high-contrast",
    primary="#00ffff",
    secondary="#ff00ff",
    accent="#ffff00",
    warning="#ffff00",
    error="#ff3030",
    success="#00ff00",
    foreground="#ffffff",
    background="#000000",
    surface="#000000",
    panel="#101010",
    dark=True,
    variables={
        "phase-prefill": "#ffff00",
        "phase-decode": "#00ff00",
        "phase-thinking": "#ff00ff",
        "itl-spark": "#00ffff",
        "stall": "#ff3030",
        "kv-fill": "#ff00ff",
    },
)

BUILTIN_THEMES: tuple[Theme, ...] = (PHASE_DARK, PHASE_LIGHT, PHASE_HIGH_CONTRAST)
DEFAULT_THEME = PHASE_DARK.name

_THEME_KEYS = {
    "name", "primary", "secondary", "accent", "warning", "error", "success",
    "foreground", "background", "surface", "panel", "boost", "dark", "variables",
}  # fmt: skip


def load_user_themes(folder: Path) -> tuple[list[Theme], list[str]]:
    """Themes from `folder/*.toml` (one theme a file), and one message per broken file.

    A file is TOML with `name` and `primary` and any other `Theme` field; `[variables]`
    may override phasechat's own (`phase-prefill`, `phase-decode`, ...).
    """
    themes: list[Theme] = []
    errors: list[str] = []
    if not folder.is_dir():
        return themes, errors
    for path in sorted(folder.glob("*.toml")):
        try:
            if not path.is_file():  # a FIFO named *.toml would block every start
                raise ValueError("not a regular file")
            theme = _theme(tomllib.loads(path.read_text(encoding="utf-8")))
        except RecursionError:
            errors.append(f"theme {path.name} skipped: nested too deeply")
            continue
        except (OSError, ValueError, TypeError, ColorParseError) as exc:
            # The message quotes the file's own text: shown as data (markup off, controls
            # made visible) by the app.
            errors.append(f"theme {path.name} skipped: {exc}")
            continue
        themes.append(theme)
    return themes, errors


def _theme(data: dict[str, Any]) -> Theme:
    """A Theme from a user file's table, every value checked for its type first."""
    unknown = set(data) - _THEME_KEYS
    if unknown:
        raise ValueError(f"unknown key {sorted(unknown)[0]!r}")
    if not isinstance(data.get("name"), str) or not isinstance(data.get("primary"), str):
        raise ValueError("needs string keys 'name' and 'primary'")
    for key, value in data.items():
        if key == "dark":
            if not isinstance(value, bool):
                raise ValueError("'dark' must be true or false")
        elif key == "variables":
            if not isinstance(value, dict):
                raise ValueError("'variables' must be a table")
            for name, colour in value.items():
                if not isinstance(colour, str):
                    raise ValueError(f"variables.{name} must be a string")
        elif not isinstance(value, str):
            raise ValueError(f"{key!r} must be a string")
    theme = Theme(**data)
    theme.to_color_system()  # parses every colour: a bad one fails here
    return theme
