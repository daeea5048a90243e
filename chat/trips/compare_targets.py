"""What a comparison can be run against: a backend profile, or a profile with other
settings (a derived profile: threads, n_ctx, flash attention, temperature...), or with
another prompt (`system=TEXT`, `system=@FILE`, `prompt=TEXT`, `prompt=@FILE`: prompt
variants on one backend).

On the command line a derived profile is written `NAME:key=value,key=value`
(`local:threads=1`, `local:flash_attn=off`, `local:kv=q4_0`, `server:temperature=0`); the
replay picker in the UI offers a few of them for the active backend. Engine keys (temperature,
max_tokens, seed) apply to any backend and keep the same backend instance; load keys
(threads, n_ctx, flash_attn, gpu_layers, kv: the KV cache's type, model: another GGUF file,
draft: speculative decoding with a draft GGUF or `lookup`) apply to a local model and load
another copy.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from phasechat.backends.local.backend import DRAFT_LOOKUP
from phasechat.backends.local.gguf import KV_TYPE_NAMES, GGUFError, check_model
from phasechat.chat.config.profiles import BackendSpec
from phasechat.chat.config.settings import Settings, load_problems
from phasechat.chat.user_file import read_user_file

#: keys that change a request, on any backend
ENGINE_KEYS = {"temperature": float, "max_tokens": int, "seed": int}
#: keys that change how a local model is loaded (another instance of it)
LOCAL_KEYS = {
    "threads": int,
    "n_ctx": int,
    "gpu_layers": int,
    "flash_attn": bool,
    "kv": str,
    "model": Path,
    "draft": str,
}
#: load keys whose value is a file
FILE_KEYS = ("model", "draft")
#: keys that change the prompt: the system prompt, or the message being compared; TEXT
#: or @FILE (UTF-8; a text with a comma needs a file: commas separate the keys)
PROMPT_KEYS = ("system", "prompt")
#: the most characters of a prompt read from a file
MAX_PROMPT_CHARS = 1_000_000

_TRUE, _FALSE = {"on", "true", "1", "yes"}, {"off", "false", "0", "no"}


@dataclass(frozen=True, slots=True)
class Target:
    """A profile, maybe with overrides: what to build and what to send with."""

    name: str  # shown: "local", "local(threads=1)"
    spec: BackendSpec
    settings: Settings
    profile: str  # the profile it derives from
    #: whether it needs a backend of its own (load keys), else the profile's is used
    own_backend: bool = False
    #: the message compared instead of the one given to all (`prompt=`), None: that one
    prompt: str | None = None


def split_name(text: str) -> tuple[str, dict[str, str]]:
    """`NAME:key=value,...` -> (NAME, {key: value}); a plain name has no overrides.
    Raises ValueError for an override that is not `key=value`."""
    name, sep, rest = text.partition(":")
    overrides: dict[str, str] = {}
    if sep:
        for part in rest.split(","):
            key, eq, value = part.partition("=")
            if not eq or not key.strip() or not value.strip():
                raise ValueError(f"{text!r}: expected NAME:key=value[,key=value...]")
            overrides[key.strip()] = value.strip()
    return name.strip(), overrides


def _value(key: str, text: str) -> object:
    kind = ENGINE_KEYS.get(key) or LOCAL_KEYS[key]
    if key == "kv":
        if text not in KV_TYPE_NAMES:
            raise ValueError(f"kv={text!r}: expected one of {', '.join(KV_TYPE_NAMES)}")
        return text
    if key == "model":
        return gguf_file(key, text)
    if key == "draft":
        return text if text == DRAFT_LOOKUP else str(gguf_file(key, text))
    if kind is bool:
        low = text.lower()
        if low not in _TRUE | _FALSE:
            raise ValueError(f"{key}={text!r}: expected on or off")
        return low in _TRUE
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"{key}={text!r}: expected a number") from None


def gguf_file(key: str, text: str) -> Path:
    """A `model=` or `draft=` path: a regular, readable GGUF model whose header fits the
    file (backends/local/gguf.py `check_model`), checked before anything loads it. Raises
    ValueError, one line."""
    path = Path(text).expanduser()
    try:
        check_model(path)
    except GGUFError as exc:
        raise ValueError(f"{key}={text}: {exc}") from None
    return path


def prompt_text(key: str, text: str) -> str:
    """A `system=` or `prompt=` value: TEXT, or the contents of @FILE. Raises ValueError
    for a file that cannot be read, is not UTF-8 text, or is too long."""
    if not text.startswith("@"):
        return text
    path = Path(text[1:]).expanduser()
    try:
        raw = read_user_file(path, MAX_PROMPT_CHARS * 4)  # 4 bytes: the widest character
    except OSError as exc:
        raise ValueError(f"{key}={text}: {exc}") from None
    try:
        value = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{key}={text}: not UTF-8 text") from None
    if len(value) > MAX_PROMPT_CHARS:
        raise ValueError(f"{key}={text}: longer than {MAX_PROMPT_CHARS:,} characters")
    if key == "prompt" and not value.strip():
        raise ValueError(f"{key}={text}: the prompt is empty")
    return value.rstrip("\n") if key == "system" else value


def _short(value: str) -> str:
    """An override as a side's name shows it: @FILE by its file's name, a long TEXT cut."""
    if value.startswith("@"):
        return "@" + Path(value[1:]).name
    return value if len(value) <= 24 else value[:23] + "…"


def derive(
    profile: str, spec: BackendSpec, settings: Settings, overrides: dict[str, str]
) -> Target:
    """Profile `profile` (its `spec` and `settings`) with `overrides`. Raises ValueError
    for an unknown key, a load key on a remote backend, or a value out of bounds."""
    if not overrides:
        return Target(profile, spec, settings, profile)
    engine: dict[str, object] = {}
    local: dict[str, object] = {}
    prompt: str | None = None
    for key, text in overrides.items():
        if key == "system":
            engine["system"] = prompt_text(key, text)
        elif key == "prompt":
            prompt = prompt_text(key, text)
        elif key in ENGINE_KEYS:
            engine[key] = _value(key, text)
        elif key in LOCAL_KEYS:
            if not spec.is_local:
                raise ValueError(f"{key} applies to a local model, not to {profile!r}")
            local[key] = _value(key, text)
        else:
            known = ", ".join([*ENGINE_KEYS, *LOCAL_KEYS, *PROMPT_KEYS])
            raise ValueError(f"unknown setting {key!r}: expected one of {known}")
    settings = replace(settings, **engine)  # type: ignore[arg-type]
    problems = settings.problems()
    if problems:
        raise ValueError(f"{problems[0][0]}: {problems[0][1]}")
    # a model's path by its file's name
    shown = {k: Path(v).name if k in FILE_KEYS else _short(v) for k, v in overrides.items()}
    name = f"{profile}({','.join(f'{k}={v}' for k, v in shown.items())})"
    if local:
        renamed = {"kv_type": local.pop("kv")} if "kv" in local else {}
        if "model" in local:
            renamed["model_path"] = local.pop("model")
        config = replace(spec.local, **local, **renamed)  # type: ignore[arg-type]
        for key, problem in load_problems(config.n_ctx, config.gpu_layers, config.threads):
            raise ValueError(f"{name}: {key}: {problem}")
        return Target(
            name, replace(spec, local=config, local_name=name), settings, profile, True, prompt
        )
    return Target(name, spec, settings, profile, prompt=prompt)


def variants(spec: BackendSpec, settings: Settings) -> list[dict[str, str]]:
    """A few derived profiles of `spec` worth comparing against (the replay picker's):
    another temperature; on a local model other threads, flash attention, a context half
    as long and each other KV type."""
    out = [{"temperature": "0.8" if settings.temperature == 0 else "0"}]
    if spec.is_local:
        threads = spec.local.threads
        out.append({"threads": "2" if threads == 1 else "1"})
        flash = (
            spec.local.flash_attn
        )  # None: chosen by measurement at load (backends/local/flash.py)
        if flash is None:
            out += [{"flash_attn": "off"}, {"flash_attn": "on"}]
        else:
            out.append({"flash_attn": "off" if flash else "on"})
        out.append({"n_ctx": str(max(512, spec.local.n_ctx // 2))})
        # the KV cache's other types: memory against the answer (the view's divergence)
        out += [{"kv": kv} for kv in KV_TYPE_NAMES if kv != spec.local.kv_type]
    return out
