"""Chat history in SQLite: conversations, their messages and which one was open last.

One file (`paths.history_db()`), two tables and a key/value `meta` table. Every write commits
at once, so a crash or a failed generation never loses what was already said. A database that
cannot be opened or read (corrupt, not SQLite, wrong schema) is renamed aside to
`history.sqlite3.broken-<time>` and a fresh one is started; `Store.notice` says so, and the app
shows it, instead of crashing.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    title TEXT NOT NULL,
    system TEXT,
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    origins TEXT,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
"""


@dataclass
class StoredMessage:
    role: str
    content: str
    origins: list[tuple[str, str]] = field(default_factory=list)  # (text piece, origin) per token


@dataclass
class ConversationRecord:
    id: int
    title: str
    system: str | None = None
    updated: float = 0.0


class Store:
    """The history database; every method commits."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.notice: str | None = None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.db = self._open()
        except sqlite3.DatabaseError as exc:
            aside = self.path.with_name(f"{self.path.name}.broken-{time.strftime('%Y%m%d-%H%M%S')}")
            self.path.rename(aside)
            self.notice = f"the chat history could not be read ({exc}); it was moved to {aside} and a new one started"
            self.db = self._open()

    def _open(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, check_same_thread=False)
        try:
            db.execute("PRAGMA foreign_keys = ON")
            db.executescript(SCHEMA)
            for table, columns in (("conversations", {"id", "title", "system"}), ("messages", {"role", "content"})):
                have = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
                if not columns <= have:
                    raise sqlite3.DatabaseError(f"table {table} lacks columns {sorted(columns - have)}")
            db.execute("SELECT count(*) FROM messages").fetchone()
        except sqlite3.DatabaseError:
            db.close()
            raise
        return db

    def close(self) -> None:
        self.db.close()

    # conversations
    def create(self, title: str = "New chat", system: str | None = None) -> ConversationRecord:
        now = time.time()
        cur = self.db.execute(
            "INSERT INTO conversations (title, system, created, updated) VALUES (?, ?, ?, ?)", (title, system, now, now)
        )
        self.db.commit()
        self.set_last(cur.lastrowid)
        return ConversationRecord(cur.lastrowid, title, system, now)

    def list(self) -> list[ConversationRecord]:
        rows = self.db.execute("SELECT id, title, system, updated FROM conversations ORDER BY updated DESC, id DESC")
        return [ConversationRecord(*row) for row in rows]

    def get(self, conversation_id: int) -> ConversationRecord | None:
        row = self.db.execute(
            "SELECT id, title, system, updated FROM conversations WHERE id = ?", (conversation_id,)
        ).fetchone()
        return ConversationRecord(*row) if row else None

    def rename(self, conversation_id: int, title: str) -> None:
        self.db.execute("UPDATE conversations SET title = ? WHERE id = ?", (title, conversation_id))
        self.db.commit()

    def set_system(self, conversation_id: int, system: str | None) -> None:
        self.db.execute("UPDATE conversations SET system = ? WHERE id = ?", (system or None, conversation_id))
        self.db.commit()

    def delete(self, conversation_id: int) -> None:
        self.db.execute("DELETE FROM messages WHERE conversation_id = ?", (conversation_id,))
        self.db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))
        self.db.commit()

    # messages
    def add_message(self, conversation_id: int, role: str, content: str, origins=None) -> None:
        now = time.time()
        self.db.execute(
            "INSERT INTO messages (conversation_id, role, content, origins, created) VALUES (?, ?, ?, ?, ?)",
            (conversation_id, role, content, json.dumps(origins) if origins else None, now),
        )
        self.db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (now, conversation_id))
        self.db.commit()

    def messages(self, conversation_id: int) -> list[StoredMessage]:
        rows = self.db.execute(
            "SELECT role, content, origins FROM messages WHERE conversation_id = ? ORDER BY id", (conversation_id,)
        )
        out = []
        for role, content, origins in rows:
            try:
                pieces = [tuple(p) for p in json.loads(origins)] if origins else []
            except (ValueError, TypeError):
                pieces = []
            out.append(StoredMessage(role, content, pieces))
        return out

    # the conversation that reopens at start
    def set_last(self, conversation_id: int | None) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('last', ?)", (str(conversation_id or ""),))
        self.db.commit()

    def last(self) -> ConversationRecord | None:
        row = self.db.execute("SELECT value FROM meta WHERE key = 'last'").fetchone()
        if row and row[0]:
            found = self.get(int(row[0]))
            if found:
                return found
        listed = self.list()
        return listed[0] if listed else None


def export_markdown(record: ConversationRecord, messages: list[StoredMessage]) -> str:
    """A conversation as a Markdown document."""
    lines = [f"# {record.title}", ""]
    if record.system:
        lines += ["**System:** " + record.system, ""]
    for message in messages:
        lines += [f"## {message.role.capitalize()}", "", message.content.strip(), ""]
    return "\n".join(lines)
