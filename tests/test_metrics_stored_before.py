"""A chat saved before issue 50 (tests/fixtures/store/metrics-before-50.db, written by
main at 86e8b92 with `write_metrics_db.py` beside it) reads back unchanged now that
each figure's bound is declared beside its field: every figure as stored (a 4 GB a
token read from the GPU included), none ignored, and its `as_dict()` (what `ask
--json` and the exports write) the stored object itself."""

from __future__ import annotations

import json
import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

from phasechat.chat.store.database import ChatStore

STORED = Path(__file__).parent / "fixtures" / "store" / "metrics-before-50.db"


def test_a_chat_saved_before_reads_back_every_figure_as_stored(tmp_path: Path) -> None:
    with closing(sqlite3.connect(f"file:{STORED}?mode=ro", uri=True)) as db:
        cells = [json.loads(r[0]) for r in db.execute(
            "SELECT metrics FROM messages WHERE metrics IS NOT NULL ORDER BY id"
        )]  # fmt: skip
    assert len(cells) == 2 and cells[0]["gpu_bytes_per_token"] == 4 * 1024**3 + 72
    assert all(v is not None for v in cells[0].values())  # every figure set
    path = tmp_path / "chats.db"
    shutil.copy(STORED, path)
    with ChatStore(path) as store:
        saved = store.load(store.list_chats()[0].id)
    answers = [m.metrics for m in saved.messages if m.role == "assistant"]
    assert [m.as_dict() if m else None for m in answers] == cells
    assert all(m is not None and m.ignored == () for m in answers)
