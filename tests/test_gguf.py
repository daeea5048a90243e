"""A GGUF file's header read without the model (backends/gguf.py): every value type, the
bounds of a damaged or truncated file, the vocabulary's digest, the tensor table's sizes,
and the KV geometry derived from it. Files are built here byte by byte from the GGUF
spec (ggml/docs/gguf.md: little-endian; a string is a u64 length and its bytes; a
key/value is a string, a u32 type and the value; a tensor is a string, a u32 dimension
count, u64 dimensions, a u32 type and a u64 offset), never with the module's own reader."""

from __future__ import annotations

import hashlib
import os
import socket
import struct
from collections.abc import Sequence
from pathlib import Path

import pytest

from phasechat.backends.local.gguf import (
    GGUFError,
    LayerBytes,
    check_model,
    geometry,
    layer_bytes,
    read_header,
    read_metadata,
    swa_cache_cells,
    vocabulary,
)

U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)


def s(text: str | bytes) -> bytes:
    data = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(data)) + data


def kv(key: str, vtype: int, payload: bytes) -> bytes:
    return s(key) + struct.pack("<I", vtype) + payload


def u32(key: str, n: int) -> bytes:
    return kv(key, U32, struct.pack("<I", n))


def text(key: str, value: str) -> bytes:
    return kv(key, STRING, s(value))


def strings(key: str, items: list[bytes]) -> bytes:
    return kv(key, ARRAY, struct.pack("<IQ", STRING, len(items)) + b"".join(map(s, items)))


def tensor(name: str, dims: tuple[int, ...], ttype: int, offset: int) -> bytes:
    shape = b"".join(struct.pack("<Q", d) for d in dims)
    return s(name) + struct.pack("<I", len(dims)) + shape + struct.pack("<IQ", ttype, offset)


def gguf(kvs: Sequence[bytes], tensors: Sequence[bytes] = (), version: int = 3) -> bytes:
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    return head + b"".join(kvs) + b"".join(tensors)


def aligned(data: bytes, align: int = 32) -> bytes:
    return data + b"\0" * (-len(data) % align)


def write(tmp_path: Path, data: bytes, name: str = "m.gguf") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def refused(path: Path, whole: bool = False) -> str:
    """The one-line message for `path`, which names it."""
    with pytest.raises(GGUFError) as caught:
        read_header(path, whole)
    message = str(caught.value)
    assert message.endswith(f": {path}") and "\n" not in message
    return message.removesuffix(f": {path}")


# -- every value type ---------------------------------------------------------------


def test_every_scalar_and_string_is_read_as_written(tmp_path: Path) -> None:
    kvs = [
        kv("u8", U8, struct.pack("<B", 200)),
        kv("i8", I8, struct.pack("<b", -5)),
        kv("u16", U16, struct.pack("<H", 60000)),
        kv("i16", I16, struct.pack("<h", -300)),
        kv("u32", U32, struct.pack("<I", 4_000_000_000)),
        kv("i32", I32, struct.pack("<i", -70000)),
        kv("f32", F32, struct.pack("<f", 1.5)),
        kv("bool", BOOL, struct.pack("<?", True)),
        kv("u64", U64, struct.pack("<Q", 2**40 + 3)),
        kv("i64", I64, struct.pack("<q", -(2**40))),
        kv("f64", F64, struct.pack("<d", 0.1)),
        text("str", "héllo"),
        kv("bad", STRING, s(b"a\xffb")),
    ]
    data = gguf(kvs)
    meta = read_metadata(write(tmp_path, data))
    assert meta == {
        "__file_bytes__": len(data),
        "u8": 200,
        "i8": -5,
        "u16": 60000,
        "i16": -300,
        "u32": 4_000_000_000,
        "i32": -70000,
        "f32": 1.5,
        "bool": True,
        "u64": 2**40 + 3,
        "i64": -(2**40),
        "f64": 0.1,
        "str": "héllo",
        "bad": "a\ufffdb",
    }


def test_arrays_up_to_4096_are_lists_longer_ones_a_summary_and_what_follows_is_read(
    tmp_path: Path,
) -> None:
    nested = struct.pack("<IQ", ARRAY, 2)  # an array of 2 arrays: [[1, 2], [3]]
    nested += struct.pack("<IQ", U8, 2) + bytes([1, 2]) + struct.pack("<IQ", U8, 1) + bytes([3])
    kvs = [
        kv("u16s", ARRAY, struct.pack("<IQ", U16, 3) + struct.pack("<3H", 1, 2, 65535)),
        kv("i8s", ARRAY, struct.pack("<IQ", I8, 2) + struct.pack("<2b", -1, 7)),
        kv("n4096", ARRAY, struct.pack("<IQ", U8, 4096) + bytes(range(256)) * 16),
        kv("n4097", ARRAY, struct.pack("<IQ", U16, 4097) + b"\1\0" * 4097),
        strings("merges", [b"a b", b"", b"cd e"]),
        kv("nested", ARRAY, nested),
        u32("after", 42),
    ]
    meta = read_metadata(write(tmp_path, gguf(kvs)))
    assert meta["u16s"] == [1, 2, 65535]
    assert meta["i8s"] == [-1, 7]
    assert meta["n4096"] == list(range(256)) * 16
    assert meta["n4097"] == "<array of 4097>"
    assert meta["merges"] == "<array of 3>"
    assert meta["nested"] == "<array of 2>"
    assert meta["after"] == 42  # each skip ended where the next key begins


@pytest.mark.parametrize("version", [2, 3])
def test_versions_2_and_3_are_read(tmp_path: Path, version: int) -> None:
    assert read_metadata(write(tmp_path, gguf([u32("k", 1)], version=version)))["k"] == 1


@pytest.mark.parametrize("version", [1, 4])
def test_other_versions_are_refused(tmp_path: Path, version: int) -> None:
    path = write(tmp_path, gguf([u32("k", 1)], version=version))
    assert refused(path) == f"unsupported GGUF version {version}"


def test_a_file_that_is_not_gguf_names_what_it_starts_with(tmp_path: Path) -> None:
    path = write(tmp_path, b"GGML" + gguf([u32("k", 1)])[4:])
    assert refused(path) == "not a GGUF model file (starts with b'GGML', expected b'GGUF')"


def test_an_unknown_value_type_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, gguf([kv("k", 13, b"\0" * 8)]))
    assert refused(path) == "unknown GGUF value type 13"


# -- damaged and truncated headers ----------------------------------------------------


def test_a_file_ending_inside_its_header_is_truncated(tmp_path: Path) -> None:
    data = gguf([u32("k", 1), u32("j", 2)])
    for cut in (6, 10, len(data) - 2):
        path = write(tmp_path, data[:cut], f"cut{cut}.gguf")
        assert refused(path) == "model file is truncated (ends inside its header)"


def test_a_string_up_to_the_file_s_end_is_read_and_one_byte_more_is_damaged(
    tmp_path: Path,
) -> None:
    head = b"GGUF" + struct.pack("<IQQ", 3, 0, 1)
    exact = write(tmp_path, head + struct.pack("<Q", 5) + b"abcde", "exact.gguf")
    with pytest.raises(GGUFError, match="truncated"):  # the key was whole: its type is not
        read_header(exact)
    over = write(tmp_path, head + struct.pack("<Q", 6) + b"abcde", "over.gguf")
    assert refused(over) == "model file is damaged (a string of 6 bytes with 5 left in the file)"


def test_a_scalar_array_up_to_the_file_s_end_is_read_and_one_more_is_damaged(
    tmp_path: Path,
) -> None:
    exact = gguf([kv("k", ARRAY, struct.pack("<IQ", U32, 4) + struct.pack("<4I", 1, 2, 3, 4))])
    assert read_metadata(write(tmp_path, exact))["k"] == [1, 2, 3, 4]
    over = gguf([kv("k", ARRAY, struct.pack("<IQ", U32, 5) + struct.pack("<4I", 1, 2, 3, 4))])
    message = refused(write(tmp_path, over, "over.gguf"))
    assert message == "model file is damaged (an array of 5 values with 16 bytes left)"
    huge = gguf([kv("k", ARRAY, struct.pack("<IQ", U8, 2**40))])  # no allocation, no seek
    message = refused(write(tmp_path, huge, "huge.gguf"))
    assert message == f"model file is damaged (an array of {2**40:,} values with 0 bytes left)"


def test_a_string_array_is_bounded_by_the_file_s_end(tmp_path: Path) -> None:
    exact = gguf([strings("k", [b"ab", b"c"])])
    assert read_metadata(write(tmp_path, exact))["k"] == "<array of 2>"
    # three lengths of 8 bytes cannot fit in 19 bytes
    few = gguf([kv("k", ARRAY, struct.pack("<IQ", STRING, 3) + s(b"ab") + s(b"c"))])
    message = refused(write(tmp_path, few, "few.gguf"))
    assert message == "model file is damaged (an array of 3 values with 19 bytes left)"
    # the second string claims one byte more than is left
    past = gguf([kv("k", ARRAY, struct.pack("<IQ", STRING, 2) + s(b"ab") + struct.pack("<Q", 2))])
    message = refused(write(tmp_path, past + b"c", "past.gguf"))
    assert message == "model file is damaged (a string of 2 bytes past the file's end)"


def test_an_array_of_arrays_is_bounded_by_the_file_s_end(tmp_path: Path) -> None:
    # 4 arrays need 32 bytes at least (each at least a length); 2 empty ones are 24
    nested = struct.pack("<IQ", ARRAY, 4) + struct.pack("<IQ", U8, 0) * 2
    message = refused(write(tmp_path, gguf([kv("k", ARRAY, nested)])))
    assert message == "model file is damaged (an array of 4 values with 24 bytes left)"


# -- the vocabulary -------------------------------------------------------------------


def digest(tokens: list[bytes]) -> str:
    h = hashlib.sha256()
    for t in tokens:
        h.update(struct.pack("<Q", len(t)) + t)
    return f"<{len(tokens)} tokens, sha256 {h.hexdigest()[:16]}>"


def test_the_vocabulary_is_its_count_and_a_digest_of_every_token_in_order(
    tmp_path: Path,
) -> None:
    abc = write(tmp_path, gguf([strings("tokenizer.ggml.tokens", [b"a", b"b", b"c"])]), "a.gguf")
    assert vocabulary(abc) == "<3 tokens, sha256 3d10f2e96612f828>" == digest([b"a", b"b", b"c"])
    acb = write(tmp_path, gguf([strings("tokenizer.ggml.tokens", [b"a", b"c", b"b"])]), "b.gguf")
    assert vocabulary(acb) == digest([b"a", b"c", b"b"]) != vocabulary(abc)
    # a length is part of the digest: "ab","c" is not "a","bc"
    one = write(tmp_path, gguf([strings("tokenizer.ggml.tokens", [b"ab", b"c"])]), "c.gguf")
    two = write(tmp_path, gguf([strings("tokenizer.ggml.tokens", [b"a", b"bc"])]), "d.gguf")
    assert vocabulary(one) != vocabulary(two)
    none = write(tmp_path, gguf([strings("tokenizer.ggml.merges", [b"a b"])]), "e.gguf")
    assert vocabulary(none) == ""


def test_empty_tokens_may_repeat_and_fill_the_file_to_its_end(tmp_path: Path) -> None:
    """llama.cpp renames empty tokens, so two are no collision; 2 empty tokens are 16
    bytes, exactly what is left."""
    path = write(tmp_path, gguf([strings("tokenizer.ggml.tokens", [b"", b""])]))
    assert vocabulary(path) == digest([b"", b""])


def test_a_token_twice_is_damaged_and_named(tmp_path: Path) -> None:
    long = b"x" * 50
    path = write(tmp_path, gguf([strings("tokenizer.ggml.tokens", [b"a", long, b"b", long])]))
    assert refused(path) == (
        f"model file is damaged (token 3 {long[:40]!r} is in its vocabulary twice)"
    )


def test_a_vocabulary_longer_than_the_file_is_damaged(tmp_path: Path) -> None:
    # 3 tokens need 24 bytes of lengths at least; 2 tokens of 1 byte leave 18
    few = kv("tokenizer.ggml.tokens", ARRAY, struct.pack("<IQ", STRING, 3) + s(b"a") + s(b"b"))
    message = refused(write(tmp_path, gguf([few])))
    assert (
        message == "model file is damaged (a vocabulary of 3 tokens with 18 bytes left in the file)"
    )


def test_a_token_past_the_file_s_end_is_damaged_and_one_up_to_it_is_read(
    tmp_path: Path,
) -> None:
    key = s("tokenizer.ggml.tokens") + struct.pack("<IIQ", ARRAY, STRING, 2) + s(b"ab")
    head = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + key
    up_to = write(tmp_path, head + struct.pack("<Q", 3) + b"xyz", "up_to.gguf")
    assert vocabulary(up_to) == digest([b"ab", b"xyz"])
    past = write(tmp_path, head + struct.pack("<Q", 4) + b"xyz", "past.gguf")
    assert refused(past) == "model file is damaged (token 1 of 4 bytes with 3 left in the file)"


def test_a_vocabulary_of_numbers_is_refused(tmp_path: Path) -> None:
    ids = kv("tokenizer.ggml.tokens", ARRAY, struct.pack("<IQ", U32, 2) + struct.pack("<2I", 1, 2))
    assert (
        refused(write(tmp_path, gguf([ids]))) == "tokenizer.ggml.tokens is not an array of strings"
    )


# -- the tensor table -----------------------------------------------------------------


def with_tensors(
    tensors: Sequence[bytes], data: int, kvs: Sequence[bytes] = (), align: int = 32
) -> bytes:
    return aligned(gguf(kvs, tensors), align) + b"\1" * data


@pytest.mark.parametrize(
    ("dims", "ttype", "nbytes"),
    [
        ((10,), 0, 40),  # f32
        ((3, 5), 1, 30),  # f16: the dimensions multiplied
        ((7,), 30, 14),  # bf16
        ((64,), 2, 36),  # q4_0: 2 blocks of 18
        ((33,), 2, 36),  # q4_0: a partial block is a whole one
        ((32,), 3, 20),  # q4_1
        ((32,), 6, 22),  # q5_0
        ((32,), 7, 24),  # q5_1
        ((32,), 8, 34),  # q8_0
        ((256,), 10, 84),  # q2_K
        ((256,), 11, 110),  # q3_K
        ((256,), 12, 144),  # q4_K
        ((256,), 13, 176),  # q5_K
        ((256, 2), 14, 420),  # q6_K
        ((16,), 99, 1),  # a type not sized here: at least its first byte
        ((), 0, 1),  # no dimensions: not sized either
    ],
)
def test_a_tensor_is_whole_at_its_last_byte_and_truncated_one_byte_short(
    tmp_path: Path, dims: tuple[int, ...], ttype: int, nbytes: int
) -> None:
    table = [tensor("w", dims, ttype, 8)]
    whole = write(tmp_path, with_tensors(table, 8 + nbytes), "whole.gguf")
    check_model(whole)
    short_data = with_tensors(table, 8 + nbytes - 1)
    short = write(tmp_path, short_data, "short.gguf")
    read_header(short)  # read without `whole`: the sizes are a guess, not a refusal
    assert refused(short, whole=True) == (
        f"model file is truncated: its tensors need {len(short_data) + 1:,} bytes, "
        f"it has {len(short_data):,} (a download not finished?)"
    )


def test_the_last_tensor_to_end_decides_not_the_last_listed(tmp_path: Path) -> None:
    table = [tensor("late", (4,), 0, 100), tensor("early", (4,), 0, 0)]
    check_model(write(tmp_path, with_tensors(table, 116), "whole.gguf"))
    with pytest.raises(GGUFError, match="its tensors need"):
        check_model(write(tmp_path, with_tensors(table, 115), "short.gguf"))


def test_eight_dimensions_are_a_tensor_nine_are_not(tmp_path: Path) -> None:
    eight = [tensor("w", (1,) * 8, 0, 0)]
    check_model(write(tmp_path, with_tensors(eight, 4), "eight.gguf"))
    nine = write(tmp_path, with_tensors([tensor("w", (1,) * 9, 0, 0)], 4), "nine.gguf")
    assert refused(nine) == "tensor 'w' has 9 dimensions: not a GGUF tensor table"


def test_tensor_sizes_are_the_distances_between_sorted_offsets(tmp_path: Path) -> None:
    table = [tensor("b", (4,), 0, 64), tensor("a", (4,), 0, 0), tensor("c", (4,), 0, 96)]
    _, sizes = read_header(write(tmp_path, with_tensors(table, 100)))
    assert sizes == {"a": 64, "b": 32, "c": 4}
    # a tensor of one byte (a scalar of type i8) is a size, not "does not add up"
    table = [tensor("a", (4,), 0, 0), tensor("one", (1,), 24, 4)]
    _, sizes = read_header(write(tmp_path, with_tensors(table, 5), "one.gguf"))
    assert sizes == {"a": 4, "one": 1}


def test_tensor_sizes_that_do_not_add_up_are_unknown(tmp_path: Path) -> None:
    same = [tensor("a", (4,), 0, 0), tensor("b", (4,), 0, 0), tensor("c", (4,), 0, 32)]
    assert read_header(write(tmp_path, with_tensors(same, 64), "same.gguf"))[1] == {}
    past = [tensor("a", (4,), 0, 0), tensor("b", (4,), 0, 64)]
    assert read_header(write(tmp_path, with_tensors(past, 60), "past.gguf"))[1] == {}
    at_end = [tensor("a", (4,), 0, 0), tensor("b", (4,), 0, 64)]
    assert read_header(write(tmp_path, with_tensors(at_end, 64), "end.gguf"))[1] == {}
    assert read_header(write(tmp_path, gguf([u32("k", 1)]), "none.gguf"))[1] == {}


@pytest.mark.parametrize(("alignment", "align"), [(64, 64), (1, 1), (0, 32), (None, 32)])
def test_the_data_section_starts_at_the_file_s_alignment(
    tmp_path: Path, alignment: int | None, align: int
) -> None:
    """The one tensor's size is the data section's: the file less its aligned header."""
    kvs = [u32("general.alignment", alignment)] if alignment is not None else []
    kvs.append(text("pad", "x" * 5))  # a header of 97 bytes, then 104 with the alignment
    table = [tensor("w", (4,), 0, 0)]
    data = with_tensors(table, 200, kvs, align)
    assert len(gguf(kvs, table)) % 32  # each alignment gives its own start
    _, sizes = read_header(write(tmp_path, data))
    assert sizes == {"w": 200}


def test_an_alignment_that_is_no_number_is_32(tmp_path: Path) -> None:
    kvs = [text("general.alignment", "64"), text("pad", "x" * 30)]
    table = [tensor("w", (4,), 0, 0)]
    assert len(gguf(kvs, table)) % 64 < 32
    _, sizes = read_header(write(tmp_path, with_tensors(table, 200, kvs, 32)))
    assert sizes == {"w": 200}


# -- what is not a file ---------------------------------------------------------------


def test_what_is_not_a_regular_file_is_named(tmp_path: Path) -> None:
    assert refused(tmp_path / "none.gguf") == "model file not found"
    assert refused(tmp_path) == "model path is a directory, not a GGUF file"
    assert refused(Path("/dev/null")) == "model path is not a regular file (a device)"
    fifo = tmp_path / "fifo.gguf"
    os.mkfifo(fifo)  # opened without blocking: no writer is waited for
    assert refused(fifo) == "model path is not a regular file (a FIFO)"
    sock = tmp_path / "s.gguf"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(sock))
        assert refused(sock) == "model file cannot be opened (No such device or address)"


# -- the geometry ---------------------------------------------------------------------


def model(tmp_path: Path, arch: str, *extra: bytes, name: str = "m.gguf") -> Path:
    kvs = [
        text("general.architecture", arch),
        u32(f"{arch}.block_count", 4),
        u32(f"{arch}.attention.head_count", 8),
        u32(f"{arch}.embedding_length", 256),
        *extra,
    ]
    return write(tmp_path, gguf(kvs), name)


def test_the_geometry_of_a_model_and_its_defaults(tmp_path: Path) -> None:
    path = model(tmp_path, "llama", name="tiny-model.gguf")
    g = geometry(path)
    assert (g.architecture, g.name, g.n_layers, g.n_heads) == ("llama", "tiny-model", 4, 8)
    # no KV heads: as many as the heads; no head size: the embedding over the heads
    assert (g.n_kv_heads, g.head_dim_k, g.head_dim_v) == (8, 32, 32)
    assert (g.n_ctx_train, g.sliding_window, g.n_swa_layers) == (0, None, 0)
    assert g.file_bytes == path.stat().st_size and g.weights is None


def test_the_geometry_reads_each_key_it_is_given(tmp_path: Path) -> None:
    path = model(
        tmp_path,
        "qwen2",
        text("general.name", "Tiny"),
        u32("qwen2.attention.head_count_kv", 2),
        u32("qwen2.attention.key_length", 48),
        u32("qwen2.attention.value_length", 16),
        u32("qwen2.context_length", 2048),
    )
    g = geometry(path)
    assert (g.name, g.n_kv_heads, g.head_dim_k, g.head_dim_v, g.n_ctx_train) == (
        "Tiny",
        2,
        48,
        16,
        2048,
    )
    # a key size alone: the value size follows it
    g = geometry(model(tmp_path, "qwen2", u32("qwen2.attention.key_length", 48), name="k.gguf"))
    assert (g.head_dim_k, g.head_dim_v) == (48, 48)


def test_a_model_without_its_counts_is_refused_by_name(tmp_path: Path) -> None:
    path = write(tmp_path, gguf([text("general.architecture", "llama")]))
    with pytest.raises(GGUFError, match=r"^model metadata lacks llama\.block_count$"):
        geometry(path)
    path = write(tmp_path, gguf([u32("unknown.block_count", 2)]), "noarch.gguf")
    with pytest.raises(GGUFError, match=r"^model metadata lacks unknown\.attention\.head_count$"):
        geometry(path)
    odd = model(tmp_path, "llama", text("llama.context_length", "2048"), name="odd.gguf")
    with pytest.raises(GGUFError, match=r"^model metadata lacks llama\.context_length$"):
        geometry(odd)


def test_kv_bytes_are_layers_times_heads_times_head_sizes_times_tokens(tmp_path: Path) -> None:
    g = geometry(
        model(
            tmp_path,
            "llama",
            u32("llama.attention.head_count_kv", 2),
            u32("llama.attention.key_length", 40),
            u32("llama.attention.value_length", 24),
        )
    )
    # 4 layers x 2 heads x (40 + 24) x 2 bytes = 1024 a token
    assert g.kv_bytes(100, 2048) == 102_400
    assert g.kv_bytes(5000, 2048) == 1024 * 2048  # no more cells than the context
    assert g.kv_bytes(100, 2048, type_bytes=34 / 32) == 4 * 2 * 64 * 34 // 32 * 100
    assert g.kv_bytes(0, 2048) == 0


def gemma(tmp_path: Path, arch: str, *extra: bytes) -> Path:
    kvs = [
        text("general.architecture", arch),
        u32(f"{arch}.block_count", 12),
        u32(f"{arch}.attention.head_count", 4),
        u32(f"{arch}.attention.head_count_kv", 1),
        u32(f"{arch}.embedding_length", 64),
        *extra,
    ]
    return write(tmp_path, gguf(kvs), f"{arch}.gguf")


def test_sliding_window_layers_by_architecture(tmp_path: Path) -> None:
    window = "attention.sliding_window"
    g3 = geometry(gemma(tmp_path, "gemma3", u32(f"gemma3.{window}", 512)))
    assert (g3.sliding_window, g3.n_swa_layers) == (512, 10)  # every 6th layer global
    assert geometry(gemma(tmp_path, "gemma2", u32(f"gemma2.{window}", 512))).n_swa_layers == 6
    pattern = u32("other.attention.sliding_window_pattern", 4)
    assert (
        geometry(gemma(tmp_path, "other", u32(f"other.{window}", 512), pattern)).n_swa_layers == 9
    )
    none = u32("other.attention.sliding_window_pattern", 0)
    assert geometry(gemma(tmp_path, "other", u32(f"other.{window}", 512), none)).n_swa_layers == 0
    assert geometry(gemma(tmp_path, "other", u32(f"other.{window}", 512))).n_swa_layers == 0
    # no window (or 0): no layer slides, whatever the architecture
    assert geometry(gemma(tmp_path, "gemma3")).n_swa_layers == 0
    g = geometry(gemma(tmp_path, "gemma3", u32(f"gemma3.{window}", 0)))
    assert (g.sliding_window, g.n_swa_layers) == (None, 0)


def test_sliding_layers_hold_at_most_their_window_when_swa_full_is_off(tmp_path: Path) -> None:
    g = geometry(gemma(tmp_path, "gemma3", u32("gemma3.attention.sliding_window", 512)))
    per = 1 * (16 + 16) * 2  # bytes a token a layer
    # 2 global layers hold 3000 cells, 10 sliding ones 512 + 512 (a ubatch), padded: 1024
    assert g.kv_bytes(3000, 4096, swa_full=False) == 2 * per * 3000 + 10 * per * 1024
    assert g.kv_bytes(3000, 4096) == 12 * per * 3000
    assert g.kv_bytes(800, 4096, swa_full=False) == 12 * per * 800  # under the window


def test_the_sliding_cache_is_window_and_ubatch_padded_to_256_within_the_context() -> None:
    assert swa_cache_cells(100, 4096) == 768  # 612 -> 768
    assert swa_cache_cells(100, 700) == 700  # the context bounds it
    assert swa_cache_cells(100, 600) == 600
    assert swa_cache_cells(100, 4096, n_seq=2) == 768  # 712
    assert swa_cache_cells(300, 4096, n_seq=2) == 1280  # 1112
    assert swa_cache_cells(100, 4096, n_ubatch=256) == 512  # 356
    assert swa_cache_cells(256, 4096, n_ubatch=256) == 512  # exactly 512 stays
    assert swa_cache_cells(1, 4096) == 768  # 513: one past two pages is three


def test_the_geometry_sizes_the_layers_from_the_tensor_table(tmp_path: Path) -> None:
    kvs = [
        text("general.architecture", "llama"),
        u32("llama.block_count", 2),
        u32("llama.attention.head_count", 4),
        u32("llama.embedding_length", 64),
    ]
    table = [
        tensor("token_embd.weight", (16,), 0, 0),
        tensor("blk.0.attn_q.weight", (8,), 0, 64),
        tensor("blk.1.attn_q.weight", (8,), 0, 96),
        tensor("output_norm.weight", (4,), 0, 128),
    ]
    path = write(tmp_path, with_tensors(table, 144, kvs))
    assert geometry(path).weights == LayerBytes((32, 32), 64 + 16)
    short = write(tmp_path, with_tensors(table, 143, kvs), "short.gguf")
    assert geometry(short).weights is not None  # not asked to be whole
    with pytest.raises(GGUFError, match="its tensors need"):
        geometry(short, whole=True)


def test_what_cannot_be_opened_or_read_says_why(tmp_path: Path) -> None:
    loop = tmp_path / "loop.gguf"
    loop.symlink_to(tmp_path / "back.gguf")
    (tmp_path / "back.gguf").symlink_to(loop)
    assert refused(loop) == "model file cannot be opened (Too many levels of symbolic links)"
    # a regular file whose first read fails (the kernel refuses address 0 of this one)
    assert refused(Path("/proc/self/mem")) == "model file cannot be read (Input/output error)"


@pytest.mark.parametrize(
    ("error", "why"),
    [
        # what this machine's root user never meets: a file it may not read; a directory
        # refused by open itself (as some systems do); an error without its text
        (PermissionError(13, "Permission denied"), "model file is not readable"),
        (IsADirectoryError(21, "Is a directory"), "model path is a directory, not a GGUF file"),
        (OSError("no text"), "model file cannot be opened (no text)"),
    ],
)
def test_an_open_refused_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: OSError, why: str
) -> None:
    path = write(tmp_path, gguf([u32("k", 1)]))

    def refuse(*_: object) -> int:
        raise error

    monkeypatch.setattr(os, "open", refuse)
    assert refused(path) == why


def test_no_descriptor_is_left_open_by_a_read_or_a_refusal(tmp_path: Path) -> None:
    good = write(tmp_path, gguf([u32("k", 1)]), "good.gguf")
    bad = write(tmp_path, gguf([kv("k", 13, b"")]), "bad.gguf")
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(5):
        read_header(good)
        with pytest.raises(GGUFError):
            read_header(bad)
        with pytest.raises(GGUFError):
            read_header(tmp_path)
    assert len(os.listdir("/proc/self/fd")) == before


def test_a_file_of_metadata_alone_has_no_tensor_to_be_cut(tmp_path: Path) -> None:
    """A vocabulary-only GGUF (llama.cpp's ggml-vocab-*.gguf): its header ends short of
    the next 32-byte boundary, and no tensor needs what is not there."""
    data = gguf([strings("tokenizer.ggml.tokens", [b"a", b"b"]), u32("k", 1)])
    assert len(data) % 32
    path = write(tmp_path, data)
    assert read_header(path, whole=True)[1] == {}
    check_model(path)


def test_a_one_byte_tensor_and_a_window_of_one_are_kept() -> None:
    assert layer_bytes({"blk.0.a": 1, "blk.1.a": 3}, 2) == LayerBytes((1, 3), 0)
    # neither an output matrix nor an embedding: the output layer is its norm alone
    assert layer_bytes({"blk.0.a": 5, "output_norm.weight": 2}, 1) == LayerBytes((5,), 2)


def test_a_sliding_window_of_one_token_is_a_window(tmp_path: Path) -> None:
    g = geometry(gemma(tmp_path, "gemma3", u32("gemma3.attention.sliding_window", 1)))
    assert (g.sliding_window, g.n_swa_layers) == (1, 10)


def test_a_vocabulary_that_is_no_array_is_none(tmp_path: Path) -> None:
    path = write(tmp_path, gguf([u32("tokenizer.ggml.tokens", 3)]))
    assert vocabulary(path) == ""


def test_a_block_device_is_named_a_device() -> None:
    disk = next((d for d in sorted(Path("/dev").glob("*")) if d.is_block_device()), None)
    if disk is None or not os.access(disk, os.R_OK):
        pytest.skip("no block device this user may open")
    try:
        os.close(os.open(disk, os.O_RDONLY | os.O_NONBLOCK))
    except OSError:
        pytest.skip(f"{disk} cannot be opened here")
    assert refused(disk) == "model path is not a regular file (a device)"


@pytest.mark.parametrize(
    ("arch", "pattern", "sliding"),
    [("gemma3", None, 11), ("gemma2", None, 7), ("other", 4, 10)],
)
def test_sliding_layers_are_counted_in_whole_layers(
    tmp_path: Path, arch: str, pattern: int | None, sliding: int
) -> None:
    """13 layers: gemma3's every 6th global (2), gemma2's every other (6 of 13 slide,
    7 global: 13 - 6 = 7 slide as llama.cpp counts), a pattern of 4: 3 global."""
    extra = [u32(f"{arch}.attention.sliding_window_pattern", pattern)] if pattern else []
    kvs = [
        text("general.architecture", arch),
        u32(f"{arch}.block_count", 13),
        u32(f"{arch}.attention.head_count", 4),
        u32(f"{arch}.embedding_length", 64),
        u32(f"{arch}.attention.sliding_window", 512),
        *extra,
    ]
    g = geometry(write(tmp_path, gguf(kvs)))
    assert g.n_swa_layers == sliding and isinstance(g.n_swa_layers, int)


def test_a_vocabulary_count_past_2_to_the_63_is_damaged_not_negative(tmp_path: Path) -> None:
    huge = kv("tokenizer.ggml.tokens", ARRAY, struct.pack("<IQ", STRING, 2**64 - 1))
    assert refused(write(tmp_path, gguf([huge]))) == (
        f"model file is damaged (a vocabulary of {2**64 - 1:,} tokens with 0 bytes left "
        "in the file)"
    )


def test_lengths_and_counts_past_2_to_the_63_are_damaged_not_negative(tmp_path: Path) -> None:
    """Every u64 of the header is read unsigned: a length or a count of 2**64 - 1 (a
    damaged file) is past the file's end, never -1 (which would read backwards or nothing)."""
    most = 2**64 - 1
    token = kv("tokenizer.ggml.tokens", ARRAY, struct.pack("<IQ", STRING, 1))
    token += struct.pack("<Q", most)
    assert refused(write(tmp_path, gguf([token]), "token.gguf")) == (
        f"model file is damaged (token 0 of {most:,} bytes with 0 left in the file)"
    )
    merges = kv("k", ARRAY, struct.pack("<IQ", STRING, 1) + struct.pack("<Q", most))
    assert refused(write(tmp_path, gguf([merges]), "merges.gguf")) == (
        f"model file is damaged (a string of {most:,} bytes past the file's end)"
    )
    many = kv("k", ARRAY, struct.pack("<IQ", STRING, most))
    assert refused(write(tmp_path, gguf([many]), "many.gguf")) == (
        f"model file is damaged (an array of {most:,} values with 0 bytes left)"
    )
    # an element type of 2**32 - 1 is no type, named as written
    odd = kv("k", ARRAY, struct.pack("<IQ", 2**32 - 1, 1) + struct.pack("<I", 0) * 2)
    assert refused(write(tmp_path, gguf([odd]), "odd.gguf")) == (
        f"unknown GGUF value type {2**32 - 1}"
    )


def test_an_array_of_empty_strings_that_ends_the_file_is_read(tmp_path: Path) -> None:
    """Each element takes its 8-byte length at least: two empty strings are exactly the 16
    bytes left, which is enough."""
    path = write(tmp_path, gguf([strings("k", [b"", b""])]))
    assert read_metadata(path)["k"] == "<array of 2>"


def test_every_header_integer_is_read_unsigned(tmp_path: Path) -> None:
    """The header's u32 and u64 fields at their largest (a damaged file) are named as
    written, or found past the file's end; never read as -1 (GGUF's integers are unsigned)."""
    u32_max, u64_max = 2**32 - 1, 2**64 - 1

    def said(data: bytes) -> str:
        return refused(write(tmp_path, data, f"{len(list(tmp_path.iterdir()))}.gguf"))

    version = b"GGUF" + struct.pack("<IQQ", u32_max, 0, 0)
    assert said(version) == f"unsupported GGUF version {u32_max}"
    many = b"GGUF" + struct.pack("<IQQ", 3, 0, u64_max)  # no key follows: past the end
    assert said(many) == "model file is truncated (ends inside its header)"
    tensors = b"GGUF" + struct.pack("<IQQ", 3, u64_max, 0)
    assert said(tensors) == "model file is truncated (ends inside its header)"
    assert said(gguf([kv("k", u32_max, b"")])) == f"unknown GGUF value type {u32_max}"
    key = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", u64_max) + b"abc"
    assert (
        said(key)
        == f"model file is damaged (a string of {u64_max:,} bytes with 3 left in the file)"
    )
    dims = s("w") + struct.pack("<I", u32_max)
    assert said(gguf([], [dims])) == f"tensor 'w' has {u32_max} dimensions: not a GGUF tensor table"
    # a tensor's offset past 2**63 is past the file's end, not before its start
    far = gguf([], [tensor("w", (4,), 0, 2**63)])
    start = len(aligned(far))
    with pytest.raises(GGUFError) as caught:
        check_model(write(tmp_path, aligned(far) + b"\1" * 16, "far.gguf"))
    assert str(caught.value).startswith(
        f"model file is truncated: its tensors need {start + 2**63 + 16:,} bytes, "
        f"it has {start + 16:,} (a download not finished?)"
    )
