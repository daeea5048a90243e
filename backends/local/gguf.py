"""Read a GGUF file's metadata without loading the model, and derive its KV geometry
and the bytes of its weights by layer.

Used by `doctor`, by the KV-cache gauge, by the roofline's split between a GPU and the
CPU (backends/local/offload.py), and to reject a missing, truncated or not-GGUF file with a
clear message before llama.cpp sees it.
"""

from __future__ import annotations

import hashlib
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

GGUF_MAGIC = b"GGUF"
#: the metadata key of the vocabulary's token strings, read as a digest of them all
VOCAB_KEY = "tokenizer.ggml.tokens"

# GGUF value types (ggml/include/gguf.h)
_SCALARS: dict[int, str] = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING = 8
_ARRAY = 9

# Bytes per element of the KV-cache types llama.cpp accepts, by ggml_type value:
# f32, f16, bf16, q8_0 (34 bytes per block of 32), q4_0 (18 per 32).
KV_TYPE_BYTES: dict[int, float] = {0: 4.0, 1: 2.0, 30: 2.0, 8: 34 / 32, 2: 18 / 32}
#: the KV-cache types a user names (`kv=q8_0`), by their ggml_type value
KV_TYPE_NAMES: dict[str, int] = {"f16": 1, "q8_0": 8, "q4_0": 2}


class GGUFError(ValueError):
    """The file is not a readable GGUF model; the message says why, in one line."""


class _Damaged(Exception):
    """A header field that cannot be what it says (a length past the file's end)."""


class _NotModel(Exception):
    """A header that is not a GGUF model's (its magic, version, a type): the message,
    to which `read_header` adds the file's path."""


#: (elements a block, bytes a block) of the ggml tensor types whose layout is fixed and
#: known here (ggml/src/ggml.c `type_traits`); a tensor of another type is not sized
_TYPE_BLOCKS: dict[int, tuple[int, int]] = {
    0: (1, 4),  # f32
    1: (1, 2),  # f16
    2: (32, 18),  # q4_0
    3: (32, 20),  # q4_1
    6: (32, 22),  # q5_0
    7: (32, 24),  # q5_1
    8: (32, 34),  # q8_0
    10: (256, 84),  # q2_K
    11: (256, 110),  # q3_K
    12: (256, 144),  # q4_K
    13: (256, 176),  # q5_K
    14: (256, 210),  # q6_K
    30: (1, 2),  # bf16
}
#: opened this way, a FIFO with no writer does not block the open
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)


@dataclass(frozen=True, slots=True)
class LayerBytes:
    """The bytes a decode step reads from each part of the weights: each repeating
    layer (`blk.N.*`) and the output layer (the output matrix, or the token embedding
    it is tied to, with its norm). The token embedding's other use, the input, reads one
    row per token and is left out. Sizes come from the tensors' offsets in the file (a
    tensor's bytes, plus at most the file's alignment of padding)."""

    blocks: tuple[int, ...]
    output: int

    @property
    def total(self) -> int:
        return sum(self.blocks) + self.output


@dataclass(frozen=True, slots=True)
class Geometry:
    """What KV arithmetic needs from a model's metadata."""

    architecture: str
    name: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim_k: int
    head_dim_v: int
    n_ctx_train: int
    sliding_window: int | None
    n_swa_layers: int
    file_bytes: int
    #: None: the tensor table did not add up (sizes unknown)
    weights: LayerBytes | None = None

    def kv_bytes(
        self, n_tokens: int, n_ctx: int, type_bytes: float = 2.0, swa_full: bool = True
    ) -> int:
        """KV-cache bytes for `n_tokens` cells in a context of `n_ctx`
        (2 x layers x kv_heads x head_dim x bytes_per_value x tokens, with K and V
        head dims kept apart).

        Sliding-window layers hold every cell when llama.cpp's `swa_full` is on (its
        default, which keeps prefix reuse working); otherwise at most the window,
        padded as llama.cpp pads it.
        """
        per_token_layer = self.n_kv_heads * (self.head_dim_k + self.head_dim_v) * type_bytes
        full_layers = self.n_layers - self.n_swa_layers
        total = full_layers * per_token_layer * min(n_tokens, n_ctx)
        if self.n_swa_layers:
            cells = n_ctx if swa_full else swa_cache_cells(self.sliding_window or n_ctx, n_ctx)
            total += self.n_swa_layers * per_token_layer * min(n_tokens, cells)
        return int(total)


def swa_cache_cells(window: int, n_ctx: int, n_seq: int = 1, n_ubatch: int = 512) -> int:
    """Cells llama.cpp gives a sliding-window cache: window*n_seq + ubatch, padded to 256."""
    cells = min(n_ctx, window * n_seq + n_ubatch)
    return min(n_ctx, -(-cells // 256) * 256)


def read_metadata(path: Path) -> dict[str, object]:
    """All scalar and string metadata of a GGUF file (arrays are summarised by length)."""
    return read_header(path)[0]


def read_header(path: Path, whole: bool = False) -> tuple[dict[str, object], dict[str, int]]:
    """The metadata (as `read_metadata`) and each tensor's bytes, by name: the distance
    from its offset to the next tensor's (the last one's: to the end of the file; {}
    when they do not add up).

    Raises GGUFError, one line naming the file and what is wrong, for anything but a
    regular, readable GGUF file whose header fits in it: a FIFO or device (checked on
    the descriptor, opened without blocking), a length past the file's end (read as
    such, not allocated), a vocabulary with a token twice (llama.cpp asserts on it and
    aborts the process); with `whole`, also tensors that end past the file (a download
    cut off), which llama.cpp would be given to load.
    """
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        raise GGUFError(f"model file not found: {path}") from None
    except IsADirectoryError:
        raise GGUFError(f"model path is a directory, not a GGUF file: {path}") from None
    except PermissionError:
        raise GGUFError(f"model file is not readable: {path}") from None
    except OSError as exc:
        raise GGUFError(f"model file cannot be opened ({exc.strerror or exc}): {path}") from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise GGUFError(f"model path is a directory, not a GGUF file: {path}")
        if not stat.S_ISREG(mode):
            raise GGUFError(f"model path is not a regular file ({_kind(mode)}): {path}")
        with os.fdopen(os.dup(fd), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            meta, infos, data_start = _read(f, size)
    except (struct.error, EOFError):
        raise GGUFError(f"model file is truncated (ends inside its header): {path}") from None
    except _Damaged as exc:
        raise GGUFError(f"model file is damaged ({exc}): {path}") from None
    except _NotModel as exc:
        raise GGUFError(f"{exc}: {path}") from None
    except OSError as exc:  # (a directory was refused above, by its descriptor's mode)
        raise GGUFError(f"model file cannot be read ({exc.strerror or exc}): {path}") from None
    finally:
        os.close(fd)
    data_bytes = size - data_start
    if whole and infos:  # no tensors: none ends past the file
        need = max(offset + (nbytes or 1) for _, offset, nbytes in infos)
        if need > data_bytes:
            raise GGUFError(
                f"model file is truncated: its tensors need {data_start + need:,} bytes, "
                f"it has {size:,} (a download not finished?): {path}"
            )
    return meta, _tensor_sizes([(name, offset) for name, offset, _ in infos], data_bytes)


def check_model(path: Path) -> None:
    """Raise GGUFError (one line) unless `path` is a GGUF model llama.cpp can be given:
    everything `read_header` checks, its tensors whole, before anything loads it."""
    read_header(path, whole=True)


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a file"


def _read(
    f: BinaryIO, size: int
) -> tuple[dict[str, object], list[tuple[str, int, int | None]], int]:
    """The metadata, each tensor's (name, offset in the data section, bytes where its
    type is known), and where the data section starts."""
    magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise _NotModel(f"not a GGUF model file (starts with {magic!r}, expected b'GGUF')")
    (version,) = _unpack(f, "<I")
    if version not in (2, 3):
        raise _NotModel(f"unsupported GGUF version {version}")
    n_tensors, n_kv = _unpack(f, "<QQ")
    meta: dict[str, object] = {"__file_bytes__": size}
    for _ in range(n_kv):
        key = _string(f)
        (vtype,) = _unpack(f, "<I")
        meta[key] = _vocab(f) if key == VOCAB_KEY and vtype == _ARRAY else _value(f, vtype)
    infos: list[tuple[str, int, int | None]] = []
    for _ in range(n_tensors):
        name = _string(f)
        (n_dims,) = _unpack(f, "<I")
        if n_dims > 8:  # GGML_MAX_DIMS is 4: not a tensor table
            raise _NotModel(f"tensor {name!r} has {n_dims} dimensions: not a GGUF tensor table")
        dims = _unpack(f, f"<{n_dims}Q")
        (ttype, offset) = _unpack(f, "<IQ")
        infos.append((name, offset, _tensor_bytes(dims, ttype)))
    align = meta.get("general.alignment")
    align = align if isinstance(align, int) and align > 0 else 32
    return meta, infos, -(-f.tell() // align) * align


def _tensor_bytes(dims: tuple[int, ...], ttype: int) -> int | None:
    """A tensor's bytes from its shape and type (None: a type not sized here)."""
    block = _TYPE_BLOCKS.get(ttype)
    if block is None or not dims:
        return None
    elements = 1
    for d in dims:
        elements *= d
    return -(-elements // block[0]) * block[1]


def _left(f: BinaryIO) -> int:
    """Bytes from here to the end of the file."""
    here = f.tell()
    end = f.seek(0, os.SEEK_END)
    f.seek(here)
    return end - here


def _tensor_sizes(infos: list[tuple[str, int]], data_bytes: int) -> dict[str, int]:
    """Each tensor's bytes from the offsets (sorted: a tensor ends where the next one
    begins); {} when they do not add up (an offset past the end, two at one place)."""
    if not infos:  # a file of metadata alone
        return {}
    ordered = sorted(infos, key=lambda info: info[1])
    ends = [offset for _, offset in ordered[1:]] + [data_bytes]
    sizes = {name: end - offset for (name, offset), end in zip(ordered, ends, strict=True)}
    return sizes if all(size > 0 for size in sizes.values()) else {}


def _unpack(f: BinaryIO, fmt: str) -> tuple[int, ...]:
    """Integer fields (the header, lengths, types)."""
    return tuple(int(v) for v in _unpack_any(f, fmt))  # type: ignore[call-overload]


def _unpack_any(f: BinaryIO, fmt: str) -> tuple[object, ...]:
    n = struct.calcsize(fmt)
    data = f.read(n)
    if len(data) != n:
        raise EOFError
    return struct.unpack(fmt, data)


def _string(f: BinaryIO) -> str:
    (n,) = _unpack(f, "<Q")
    if n > (left := _left(f)):
        raise _Damaged(f"a string of {n:,} bytes with {left:,} left in the file")
    data = f.read(n)
    if len(data) != n:
        raise EOFError
    return data.decode("utf-8", errors="replace")


def _vocab(f: BinaryIO) -> str:
    """The vocabulary's token strings as one line: their count and a digest of every
    string in order (two models read the same token ids as the same text only when
    these are equal)."""
    (etype, count) = _unpack(f, "<IQ")
    if etype != _STRING:
        raise _NotModel(f"{VOCAB_KEY} is not an array of strings")
    left = _left(f)
    if count * 8 > left:
        raise _Damaged(f"a vocabulary of {count:,} tokens with {left:,} bytes left in the file")
    digest = hashlib.sha256()
    seen: set[bytes] = set()
    for i in range(count):
        (n,) = _unpack(f, "<Q")
        left -= 8
        if n > left:
            raise _Damaged(f"token {i:,} of {n:,} bytes with {left:,} left in the file")
        data = f.read(n)
        if len(data) != n:
            raise EOFError
        left -= n
        # llama.cpp maps each text to its id and asserts that no two ids share one
        # (llama-vocab.cpp, GGML_ASSERT(id_to_token.size() == token_to_id.size())): an
        # abort of the whole process. Empty ones it renames, so they never collide.
        if data and data in seen:
            raise _Damaged(f"token {i:,} {data[:40]!r} is in its vocabulary twice")
        seen.add(data)
        digest.update(struct.pack("<Q", n) + data)
    return f"<{count} tokens, sha256 {digest.hexdigest()[:16]}>"


def vocabulary(path: Path) -> str:
    """A model's vocabulary as `_vocab` writes it; "" when the file names none.
    Raises GGUFError for a file that is not a readable GGUF model."""
    value = read_metadata(path).get(VOCAB_KEY, "")
    return value if isinstance(value, str) else ""


def _value(f: BinaryIO, vtype: int) -> object:
    if vtype in _SCALARS:
        return _unpack_any(f, _SCALARS[vtype])[0]
    if vtype == _STRING:
        return _string(f)
    if vtype == _ARRAY:
        (etype, count) = _unpack(f, "<IQ")
        if etype in _SCALARS:
            fmt = _SCALARS[etype]
            if count * struct.calcsize(fmt) > (left := _left(f)):
                raise _Damaged(f"an array of {count:,} values with {left:,} bytes left")
            if count <= 4096:
                return list(
                    struct.unpack(f"<{count}{fmt[1]}", f.read(count * struct.calcsize(fmt)))
                )
            f.seek(count * struct.calcsize(fmt), 1)
        else:
            if count * 8 > (left := _left(f)):  # each at least a length or a scalar
                raise _Damaged(f"an array of {count:,} values with {left:,} bytes left")
            if etype == _STRING:  # merges: many short strings, bounded by one `left`
                for _ in range(count):
                    (n,) = _unpack(f, "<Q")
                    left -= 8 + n
                    if left < 0:
                        raise _Damaged(f"a string of {n:,} bytes past the file's end")
                    f.seek(n, 1)
            else:
                for _ in range(count):
                    _value(f, etype)
        return f"<array of {count}>"
    raise _NotModel(f"unknown GGUF value type {vtype}")


def geometry(path: Path, whole: bool = False) -> Geometry:
    """The KV geometry of a GGUF model and its weights by layer, from its header alone
    (`whole`: and raise GGUFError when its tensors end past the file, as `check_model`)."""
    meta, tensors = read_header(path, whole)
    arch = str(meta.get("general.architecture", "unknown"))

    def num(key: str, default: int | None = None) -> int:
        value = meta.get(f"{arch}.{key}", default)
        if isinstance(value, list):  # per-layer arrays: the KV heads of layer 0
            value = value[0]
        if not isinstance(value, int):
            raise GGUFError(f"model metadata lacks {arch}.{key}")
        return value

    n_layers = num("block_count")
    n_heads = num("attention.head_count")
    embd = num("embedding_length")
    head_k = num("attention.key_length", embd // n_heads)
    head_v = num("attention.value_length", head_k)
    window_raw = meta.get(f"{arch}.attention.sliding_window")
    window = window_raw if isinstance(window_raw, int) and window_raw > 0 else None
    return Geometry(
        architecture=arch,
        name=str(meta.get("general.name", path.stem)),
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=num("attention.head_count_kv", n_heads),
        head_dim_k=head_k,
        head_dim_v=head_v,
        n_ctx_train=num("context_length", 0),
        sliding_window=window,
        n_swa_layers=_swa_layers(arch, n_layers, meta) if window else 0,
        file_bytes=int(str(meta["__file_bytes__"])),
        weights=layer_bytes(tensors, n_layers),
    )


def layer_bytes(tensors: dict[str, int], n_layers: int) -> LayerBytes | None:
    """`tensors` (name -> bytes) as the bytes of each layer; None without them, or when a
    block's number is not one of the model's layers. llama.cpp's names: `blk.N.*` the
    repeating layers, `output.weight` (absent: tied to `token_embd.weight`) and
    `output_norm.*` the output layer; the rest (the input embedding, rope factors) are
    read a row at a time, or are tiny."""
    if not tensors:
        return None
    blocks = [0] * n_layers
    for name, size in tensors.items():
        head, _, rest = name.partition(".")
        if head != "blk":
            continue
        number = rest.partition(".")[0]
        if not (number.isascii() and number.isdigit()) or int(number) >= n_layers:
            return None
        blocks[int(number)] += size
    out = tensors.get("output.weight", tensors.get("token_embd.weight", 0))
    norms = sum(size for name, size in tensors.items() if name.startswith("output_norm."))
    return LayerBytes(tuple(blocks), out + norms)


def _swa_layers(arch: str, n_layers: int, meta: dict[str, object]) -> int:
    """How many layers use sliding-window attention (llama.cpp's per-arch patterns)."""
    if arch == "gemma3":
        # llama.cpp: every 6th layer is global, the other five slide (set_swa_pattern(6)).
        return n_layers - n_layers // 6
    if arch == "gemma2":
        # set_swa_pattern(2): the even layers slide (il % 2 < 1): 7 of 13, as n - n // 2
        return n_layers - n_layers // 2
    pattern = meta.get(f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, int) and pattern > 0:
        return n_layers - n_layers // pattern
    return 0
