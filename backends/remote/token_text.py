"""A tokenizer's token strings as the bytes they stand for: what a server that names
its tokens by their vocabulary strings (vLLM's `/tokenize` with `return_token_strs`,
Hugging Face's `convert_ids_to_tokens`) means by each.

Two spellings cover the tokenizers a server meets: byte-level BPE (GPT-2, Llama 3,
Qwen, SmolLM: every byte is one printable character, a space `Ġ`, a newline `Ċ`) and
SentencePiece (Llama 2, Mistral: `▁` for a space, `<0x0A>` for a raw byte). Which one a
vocabulary uses cannot be told from a string alone, so the caller checks the bytes
against the server's own text of the same tokens (`/detokenize`) and believes neither
spelling that disagrees with it.

llama-server names a token by its piece instead: backends/remote/servers/llama_server/pieces.py.
"""

from __future__ import annotations

import re
from collections.abc import Sequence


def _byte_level_table() -> dict[str, int]:
    """GPT-2's `bytes_to_unicode`, inverted: the printable Latin-1 bytes stand for
    themselves, every other byte for the character 256 + its rank among them."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + extra)] = b
            extra += 1
    return table


_BYTE_LEVEL = _byte_level_table()
_SP_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def byte_level(strs: Sequence[str]) -> tuple[bytes, ...] | None:
    """Each token's bytes in byte-level BPE spelling (None: a character outside it)."""
    out = []
    for s in strs:
        try:
            out.append(bytes(_BYTE_LEVEL[c] for c in s))
        except KeyError:
            return None
    return tuple(out)


def sentencepiece(strs: Sequence[str]) -> tuple[bytes, ...]:
    """Each token's bytes in SentencePiece spelling: `▁` a space, `<0xNN>` one byte."""
    out = []
    for s in strs:
        if (raw := _SP_BYTE.fullmatch(s)) is not None:
            out.append(bytes([int(raw.group(1), 16)]))
        else:
            out.append(s.replace("\u2581", " ").encode("utf-8"))
    return tuple(out)


def pieces_of(strs: Sequence[str], text: str) -> tuple[bytes, ...] | None:
    """The tokens' bytes in the spelling whose bytes read as `text` (the server's own
    text of the same tokens), or None when neither does."""
    want = text.encode("utf-8")
    for pieces in (byte_level(strs), sentencepiece(strs)):
        if pieces is not None and b"".join(pieces) == want:
            return pieces
    return None
