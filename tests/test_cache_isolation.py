"""No test writes the user's own cache: the run's cache directory is set before any
fixture, whatever its scope (tests/conftest.py `_cache_home`)."""

from __future__ import annotations

from pathlib import Path

import platformdirs
import pytest

from phasechat.backends.local import flash
from phasechat.backends.local.backend import LocalBackend
from phasechat.chat.roofline import bandwidth_file


@pytest.fixture(scope="session")
def seen_by_a_session_fixture() -> list[Path]:
    """Where the caches are as a session fixture (like the loaded model) sees them: it
    is set up before any function-scoped fixture."""
    return [Path(platformdirs.user_cache_dir("phasechat")), flash.cache_file(), bandwidth_file()]


@pytest.fixture(scope="module")
def seen_by_a_module_fixture() -> list[Path]:
    return [Path(platformdirs.user_cache_dir("phasechat")), flash.cache_file(), bandwidth_file()]


def test_session_and_module_fixtures_see_the_runs_own_cache(
    seen_by_a_session_fixture: list[Path],
    seen_by_a_module_fixture: list[Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    base = tmp_path_factory.getbasetemp()
    user_cache = Path.home() / ".cache"
    for path in [*seen_by_a_session_fixture, *seen_by_a_module_fixture]:
        assert path.is_relative_to(base), path
        assert not path.is_relative_to(user_cache), path


def test_the_loaded_model_keeps_its_flash_choice_in_the_runs_cache(
    local_backend: LocalBackend, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The session's model fixture checks, before it loads (and measures or reads flash
    attention), that the cache it will write is the run's own; it loaded."""
    assert local_backend.state == "ready"
    assert flash.cache_file().is_relative_to(tmp_path_factory.getbasetemp())
