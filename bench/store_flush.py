"""What saving a streaming answer costs the UI's loop: one flush of its text (every
FLUSH_S while it streams, chat/turns.py) into the chat database, as the answer grows,
with schema 3's full-text index (every row re-indexed whole at each update) and with
schema 4's (an answer indexed once, when it stops streaming), side by side in one run.

    .venv/bin/python -m bench.store_flush [--tokens 20000] [--every 2000] [--reps 3] [--rate 50]

The answer is `tok0 tok1 ...`: every word new, as in bench.tmux_ui's one-paragraph
flood (the index's worst case: each word a term of its own). Each figure is the median
of `--reps` flushes of the same text, the two stores alternated at each size. The last
line adds them up for an answer streamed at `--rate` tokens a second: a flush every
FLUSH_S, each costing what the measured size at the end of its step cost (an upper bound).
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from phasechat.chat.conversation import ChatMessage
from phasechat.chat.store.database import ChatStore
from phasechat.chat.turns import FLUSH_S

#: Schema 4's index taken out and schema 3's put back (phasechat before schema 4): the
#: index over the table itself, every update of a row's text re-indexing it whole.
SCHEMA_3_INDEX = """
DROP TRIGGER messages_ai; DROP TRIGGER messages_ad; DROP TRIGGER messages_au;
DROP TABLE messages_fts; DROP VIEW messages_said; DROP INDEX messages_streaming;
CREATE VIRTUAL TABLE messages_fts USING fts5(content, content='messages', content_rowid='id');
CREATE TRIGGER messages_ai AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
END;
CREATE TRIGGER messages_ad AFTER DELETE ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
END;
CREATE TRIGGER messages_au AFTER UPDATE OF content ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
    INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
END;
INSERT INTO messages_fts(messages_fts) VALUES ('rebuild');
"""


def as_schema_3(db: sqlite3.Connection) -> None:
    """Give the open database `db` schema 3's index (its user_version is left alone)."""
    db.executescript(SCHEMA_3_INDEX)


class Answer:
    """A chat whose answer streams into `store`."""

    def __init__(self, store: ChatStore) -> None:
        self.store = store
        self.chat = store.create_chat()
        question = ChatMessage("user", "go")
        above = store.add_message(self.chat, question, None)
        self.message = ChatMessage("assistant", "", status="streaming", parent=question.id)
        self.row = store.add_message(self.chat, self.message, above)

    def flush_ms(self, text: str, final: bool = False) -> float:
        self.message.content = text
        if final:
            self.message.status = "complete"
        began = time.perf_counter_ns()
        self.store.update_message(self.chat, self.row, self.message, final)
        return (time.perf_counter_ns() - began) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=20_000)
    parser.add_argument("--every", type=int, default=2_000, help="a flush every N tokens")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--rate", type=float, default=50.0, help="tokens a second (the total)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        three = ChatStore(Path(folder) / "three.db")
        four = ChatStore(Path(folder) / "four.db")
        as_schema_3(three._db)
        answers = {"schema 3": Answer(three), "schema 4": Answer(four)}
        print(f"load {os.getloadavg()[0]:.2f}; ms per flush of the streaming answer's text")
        print(f"{'tokens':>7} {'chars':>8} {'schema 3':>9} {'schema 4':>9} {'3 / 4':>7}")
        text = ""
        total = dict.fromkeys(answers, 0.0)  # ms of flushes over the whole answer
        per_step = args.every / (args.rate * FLUSH_S)  # flushes while it grows a step
        for n in range(args.every, args.tokens + 1, args.every):
            text += "".join(f"tok{i} " for i in range(n - args.every, n))
            ms: dict[str, list[float]] = {name: [] for name in answers}
            for _ in range(args.reps):
                for name, answer in answers.items():
                    ms[name].append(answer.flush_ms(text + f"r{len(ms[name])}"))
            a, b = (statistics.median(ms[name]) for name in answers)
            for name, value in zip(answers, (a, b), strict=True):
                total[name] += value * per_step
            print(f"{n:>7,} {len(text):>8,} {a:>9.2f} {b:>9.2f} {a / b:>7.1f}")
        print(
            f"{args.tokens:,} tokens at {args.rate:g} tok/s, a flush every {FLUSH_S:g} s: "
            + ", ".join(f"{name} {value / 1000:.2f} s" for name, value in total.items())
            + " of the UI's loop in all"
        )
        final = {name: answer.flush_ms(text, final=True) for name, answer in answers.items()}
        print(
            "the last write (status complete, the answer indexed): "
            + ", ".join(f"{name} {value:.1f} ms" for name, value in final.items())
        )
        three.close()
        four.close()


if __name__ == "__main__":
    main()
