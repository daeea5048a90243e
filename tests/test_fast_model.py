"""bench/fast_model.py: the bundled model's tokenizer and template on 2 narrow layers of
random weights (GPU token rates on this CPU, for bench.tui_share and bench.engine).
It must load through the real local backend, tokenize exactly as the bundled model does,
and stream every token asked for (no timing here: the rates are the benchmarks')."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import fast_model
from phasechat.backends.events import (
    Finished,
    GenerationRequest,
    Message,
    PromptEvaluated,
    TextDelta,
)
from phasechat.backends.local.backend import LocalBackend, LocalConfig
from phasechat.backends.local.gguf import geometry, read_metadata

pytestmark = pytest.mark.model

MSGS = (Message("system", "You are a helpful assistant."), Message("user", "Name three colors."))


@pytest.fixture(scope="module")
def fast_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fast_model.cached(tmp_path_factory.mktemp("fast"))


def test_the_file_has_the_bundled_vocabulary_and_template_on_two_narrow_layers(
    fast_path: Path, model_path: Path
) -> None:
    fast, real = read_metadata(fast_path), read_metadata(model_path)
    assert fast["tokenizer.ggml.tokens"] == real["tokenizer.ggml.tokens"]
    assert fast["tokenizer.chat_template"] == real["tokenizer.chat_template"]
    g = geometry(fast_path)
    assert (g.n_layers, g.n_heads, g.n_kv_heads) == (2, 2, 1)
    assert g.head_dim_k == g.head_dim_v == 32
    assert g.n_ctx_train == geometry(model_path).n_ctx_train
    # 49,152 x 64 embedding at f16 plus the small layers: a few MiB, not the real 98 MB
    assert 6 * 2**20 < g.file_bytes < 8 * 2**20
    # written once: a second call hands back the same file untouched
    mtime = fast_path.stat().st_mtime_ns
    assert fast_model.cached(fast_path.parent) == fast_path
    assert fast_path.stat().st_mtime_ns == mtime


async def test_it_loads_tokenizes_as_the_bundled_model_and_streams_every_token(
    fast_path: Path, local_backend: LocalBackend
) -> None:
    # flash attention set: no measurement at load (this test is about streaming)
    config = LocalConfig(model_path=fast_path, n_ctx=512, threads=1, flash_attn=True)
    backend = LocalBackend(config)
    await backend.start()
    try:
        assert backend.state == "ready", backend.state_detail
        assert backend.format_prompt(MSGS) == local_backend.format_prompt(MSGS)
        events = [e async for e in backend.stream(GenerationRequest(MSGS, 200, 0.0))]
    finally:
        await backend.aclose()
    assert isinstance(events[0], PromptEvaluated)
    deltas = [e for e in events if isinstance(e, TextDelta)]
    # random weights never pick an end-of-turn token: the answer runs to max_tokens
    assert sum(d.tokens or 0 for d in deltas) == 200
    assert events[-1] == Finished("length")
