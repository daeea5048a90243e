"""The first screen of a chat, until its first answer: which model answers, what the
panel will show and why (prefill, then decode), the keys that matter, and prompts that
show each phase.

The model's name and a server's details come from outside: drawn as text, one line each.
"""

from __future__ import annotations

import re
from pathlib import Path

from textual.content import Content
from textual.widgets import Static

from phasechat.backends.base import Backend
from phasechat.backends.local.capability import LocalEngine
from phasechat.chat.text import one_line

#: a llama.cpp quantization in a GGUF file's name: Q4_1, Q4_K_M, IQ3_XXS, F16, BF16
QUANT = re.compile(r"(?<![A-Za-z0-9])(I?Q\d+(?:_[A-Z0-9]+)*|BF16|F16|F32)(?![A-Za-z0-9])")

KEYS = (
    ("Enter", "send"),
    ("Esc", "stop"),
    ("Ctrl+R", "answer again"),
    ("Ctrl+B", "switch or add a server"),
    ("F5", "compare"),
    ("F8", "the prompt, by section"),
    ("Ctrl+Up", "select a message (e edits)"),
    ("Ctrl+P", "everything else"),
)
EXAMPLES = (
    ("Write a long story about a lighthouse keeper.", "decode: watch tok/s"),
    ("(paste a long article) Summarize this in three lines.", "prefill: watch TTFT"),
    ("Explain the KV cache in one paragraph.", "both, and the cache fill"),
)


def model_line(backend: Backend) -> str:
    """The backend and its model: file, size, quantization, context, GPU layers."""
    model = one_line(backend.model)
    parts = [f"{one_line(backend.name)} · {model}"]
    local = backend if isinstance(backend, LocalEngine) else None
    if local is not None and (geometry := local.geometry) is not None:
        size = geometry.file_bytes / 1e6
        parts.append(f"{geometry.architecture}, {geometry.n_layers} layers, {size:,.0f} MB")
    elif local is not None and (size_bytes := file_size(local.model_path)) is not None:
        parts.append(f"{size_bytes / 1e6:,.0f} MB")  # before the load reads its header
    if quant := QUANT.search(model.upper()):
        parts.append(quant.group(1))
    if backend.context_window:
        parts.append(f"context {backend.context_window:,} tokens")
    if local is not None:
        layers = local.gpu_layers
        parts.append(
            "CPU only"
            if layers == 0
            else "all layers on the GPU"
            if layers < 0
            else f"{layers} layers on the GPU"
        )
    if backend.state != "ready":
        parts.append(one_line(backend.state_detail or backend.state))
    return " · ".join(parts)


def file_size(path: object) -> int | None:
    """The size of the model file at `path` (None: not a local file, or unreadable)."""
    if not isinstance(path, Path):
        return None
    try:
        return path.stat().st_size
    except OSError:
        return None


def welcome_content(backend: Backend) -> Content:
    rows: list[Content] = [
        Content.assemble(
            ("phasechat", "bold $accent"), ("  where the time of an answer goes", "dim")
        ),
        Content.assemble(("model  ", "bold"), model_line(backend)),
        Content(""),
        Content.assemble(
            "Each answer has two phases. ",
            ("Prefill", "bold $phase-prefill"),
            " reads the whole prompt in one parallel pass: the silence before the first token "
            "(TTFT), longer with a longer prompt unless the engine kept it cached. ",
            ("Decode", "bold $phase-decode"),
            " then writes one token per pass, as fast as memory can feed the weights (tok/s). "
            "The panel below shows both live: TTFT, prefill and decode rates, the gaps between "
            "tokens, the KV cache, and what the prompt's parts cost.",
        ),
        Content(""),
        Content.assemble(
            ("keys   ", "bold"),
            *(
                part
                for i, (key, what) in enumerate(KEYS)
                for part in ((" · " if i else "", "dim"), (key, "bold $accent"), (f" {what}", ""))
            ),
        ),
        Content.styled("try", "bold"),
    ]
    for prompt, shows in EXAMPLES:
        rows.append(Content.assemble(f"  {prompt}", (f"   {shows}", "dim")))
    return Content("\n").join(rows)


class Welcome(Static):
    """The first screen, drawn again only when what it says changes."""

    DEFAULT_CSS = "Welcome { padding: 1 2; height: auto; }"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._shown = Content("")

    def show_for(self, backend: Backend) -> None:
        content = welcome_content(backend)
        if content != self._shown:
            self._shown = content
            self.update(content)
