"""llama-server's token pieces (`/tokenize` with `with_pieces`), as bytes: one reading
for the prompt's sections (render.py) and for teacher forcing (teacher.py)."""

from __future__ import annotations

from phasechat.backends.untrusted import as_text


def llama_piece(piece: object) -> bytes | None:
    """One token's bytes from llama-server's `/tokenize` (`with_pieces`): its text, or a
    list of byte values for a piece that is part of a character; None: neither."""
    if isinstance(piece, str):
        return as_text(piece).encode("utf-8")  # a lone surrogate cannot be encoded
    if isinstance(piece, list) and all(
        isinstance(b, int) and not isinstance(b, bool) and 0 <= b < 256 for b in piece
    ):
        return bytes(piece)
    return None
