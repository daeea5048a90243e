"""What a backend profile is (chat/config/profiles.py `BackendSpec`): a model run here or
a server, said by its kind, whose old name for a server ("openai") is still read."""

from __future__ import annotations

import pytest

from phasechat.backends.local.backend import LocalBackend
from phasechat.backends.remote.backend import RemoteBackend
from phasechat.chat.config.profiles import BackendSpec, make_backend


def test_a_spec_of_the_old_remote_kind_is_read_as_remote() -> None:
    old, new = BackendSpec("openai"), BackendSpec("remote")
    assert (old.kind, old.is_local, new.kind, new.is_local) == ("remote", False, "remote", False)
    assert old == new and isinstance(make_backend(old), RemoteBackend)
    local = BackendSpec("local", local_name="mine")
    assert local.is_local and isinstance(make_backend(local), LocalBackend)
    assert (local.named("other").name, old.named("lab").name) == ("other", "lab")
    assert old.named("lab").remote.base_url == old.remote.base_url
    with pytest.raises(ValueError, match="unknown backend 'ollama'"):
        BackendSpec("ollama")
