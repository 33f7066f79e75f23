"""Chat history in SQLite: conversations, their messages and which one was open last.

One file (`paths.history_db()`, 0600 in a 0700 folder), WAL journal, one transaction per write
(a message and its conversation's timestamp together), so a killed app keeps every message it
committed. An answer keeps its (piece, origin) per token and the names of the speculators that
drafted it, so a reopened chat colours it as it was drawn. `PRAGMA user_version` is the schema
version; `MIGRATIONS` brings an older file up to date, one transaction per step. The app never stops over its history:
- damaged (not SQLite, a malformed page, wrong tables): renamed aside to
  `history.sqlite3.broken-<time>` (never deleted) and a fresh one started;
- cannot be written (read-only file or folder), or made by a newer spectui: left untouched;
  the session runs on an in-memory copy and nothing new is saved.
`Store.notice` says which, in one line, and the app shows it.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from .paths import private_file, write_private

MIGRATIONS = {  # version -> statements that bring version-1 to it; version 0 files of old spectui have the v1 tables
    1: [
        """CREATE TABLE IF NOT EXISTS conversations (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            title TEXT NOT NULL,
            system TEXT,
            created REAL NOT NULL,
            updated REAL NOT NULL)""",
        """CREATE TABLE IF NOT EXISTS messages (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
            role TEXT NOT NULL,
            content TEXT NOT NULL,
            origins TEXT,
            created REAL NOT NULL)""",
        "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)",
    ],
    2: ["CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages (conversation_id, id)"],
    3: ["ALTER TABLE messages ADD COLUMN speculators TEXT"],  # an answer's speculator names, in the engine's order
}
SCHEMA_VERSION = max(MIGRATIONS)
REQUIRED = {"conversations": {"id", "title", "system", "updated"}, "messages": {"conversation_id", "role", "content", "origins"}}
DAMAGED_CODES = {11, 26}  # SQLITE_CORRUPT, SQLITE_NOTADB


class Damaged(sqlite3.DatabaseError):
    """The file is not a usable history: set it aside."""


class TooNew(sqlite3.DatabaseError):
    """Written by a newer spectui: leave it alone."""


@dataclass
class StoredMessage:
    role: str
    content: str
    origins: list[tuple[str, str]] = field(default_factory=list)  # (text piece, origin) per token
    speculators: list[str] = field(default_factory=list)  # the answer's speculators, in order (SSM 1, SSM 2, ...)
    created: float = 0.0  # when it was saved (time.time())
    id: int = 0


@dataclass
class ConversationRecord:
    id: int
    title: str
    system: str | None = None
    updated: float = 0.0


def _damaged(exc: Exception) -> bool:
    if isinstance(exc, Damaged):
        return True
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in DAMAGED_CODES
    return isinstance(exc, sqlite3.DatabaseError) and any(s in str(exc) for s in ("malformed", "not a database"))


def _pieces(text: str | None) -> list[tuple[str, str]]:
    """Stored origins -> [(piece, origin)]; [] when absent or not what spectui wrote (shown uncoloured)."""
    try:
        pieces = [tuple(p) for p in json.loads(text)] if text else []
    except (ValueError, TypeError):
        return []
    return pieces if all(len(p) == 2 and all(isinstance(x, str) for x in p) for p in pieces) else []


def _names(text: str | None) -> list[str]:
    try:
        names = json.loads(text) if text else []
    except ValueError:
        return []
    return names if isinstance(names, list) and all(isinstance(n, str) for n in names) else []


def _reason(exc: Exception) -> str:
    return (getattr(exc, "strerror", None) or str(exc) or type(exc).__name__).splitlines()[0]


def _prepare(db: sqlite3.Connection) -> None:
    """Check the file and migrate it to SCHEMA_VERSION (Damaged, TooNew, or sqlite3 errors)."""
    problems = [row[0] for row in db.execute("PRAGMA quick_check")]
    if problems != ["ok"]:
        raise Damaged(f"integrity check: {problems[0]}")
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise TooNew(f"schema {version}, this spectui knows up to {SCHEMA_VERSION}")
    for table, columns in REQUIRED.items():
        have = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        if have and not columns <= have:
            raise Damaged(f"table {table} lacks columns {sorted(columns - have)}")
    for step in range(version + 1, SCHEMA_VERSION + 1):
        with _transaction(db):
            for statement in MIGRATIONS[step]:
                db.execute(statement)
            db.execute(f"PRAGMA user_version = {step}")


@contextlib.contextmanager
def _transaction(db: sqlite3.Connection):
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _connect(target: str, uri: bool = False) -> sqlite3.Connection:
    db = sqlite3.connect(target, uri=uri, isolation_level=None, check_same_thread=False)  # transactions are explicit
    db.execute("PRAGMA busy_timeout = 5000")
    db.execute("PRAGMA foreign_keys = ON")
    return db


class Store:
    """The history database; every write is one committed transaction."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.notice: str | None = None
        self.persistent = True  # False: an in-memory stand-in, nothing reaches the file
        try:
            self.db = self._open_file()
        except (sqlite3.Error, OSError) as exc:  # every failure ends in a working store and one line
            self.db = self._recover(exc)

    def _open_file(self) -> sqlite3.Connection:
        private_file(self.path)
        db = _connect(str(self.path))
        try:
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA synchronous = FULL")
            _prepare(db)
            db.execute("BEGIN IMMEDIATE")  # a write, rolled back: read-only files and folders fail here
            try:
                db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('probe', '')")
            finally:
                if db.in_transaction:
                    db.execute("ROLLBACK")
        except BaseException:
            db.close()
            raise
        return db

    def _recover(self, exc: Exception) -> sqlite3.Connection:
        name = self.path
        if isinstance(exc, TooNew):
            self.notice = f"chat history {name} was written by a newer spectui ({exc}): it is left untouched and this session's chats are not saved"
            return self._in_memory(copy=False)
        if not _damaged(exc):
            shown = "shown as it is, but " if self.path.exists() else ""
            self.notice = f"chat history {name} cannot be written ({_reason(exc)}): {shown}this session's chats are not saved"
            return self._in_memory(copy=True)
        try:
            aside = self._aside_name()
            for suffix in ("", "-wal", "-shm"):
                sidecar = Path(f"{self.path}{suffix}")
                if sidecar.exists():
                    sidecar.rename(f"{aside}{suffix}")
            db = self._open_file()
        except (sqlite3.Error, OSError) as again:
            self.notice = f"chat history {name} is damaged ({_reason(exc)}) and could not be replaced ({_reason(again)}): this session's chats are not saved"
            return self._in_memory(copy=False)
        self.notice = f"chat history {name} was damaged ({_reason(exc)}): it was moved to {aside} and a new one started"
        return db

    def _aside_name(self) -> Path:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for n in range(1000):
            aside = self.path.with_name(f"{self.path.name}.broken-{stamp}" + (f"-{n}" if n else ""))
            if not any(Path(f"{aside}{s}").exists() for s in ("", "-wal", "-shm")):
                return aside
        raise OSError(f"too many {self.path.name}.broken-{stamp} files")

    def _in_memory(self, copy: bool) -> sqlite3.Connection:
        """A fresh in-memory history, holding a read-only copy of the file when it can be read."""
        self.persistent = False
        for query in ("mode=ro", "immutable=1") if copy and self.path.exists() else ():
            db = _connect(":memory:")
            try:
                source = sqlite3.connect(f"file:{quote(str(self.path))}?{query}", uri=True)
                try:
                    source.backup(db)
                finally:
                    source.close()
                _prepare(db)
                return db
            except sqlite3.Error:
                db.close()
        db = _connect(":memory:")
        _prepare(db)
        return db

    def close(self) -> None:
        self.db.close()

    @property
    def schema_version(self) -> int:
        return self.db.execute("PRAGMA user_version").fetchone()[0]

    # conversations
    def create(self, title: str = "New chat", system: str | None = None) -> ConversationRecord:
        now = time.time()
        with _transaction(self.db) as db:
            cur = db.execute(
                "INSERT INTO conversations (title, system, created, updated) VALUES (?, ?, ?, ?)", (title, system, now, now)
            )
            db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('last', ?)", (str(cur.lastrowid),))
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
        with _transaction(self.db) as db:
            db.execute("UPDATE conversations SET title = ? WHERE id = ?", (title, conversation_id))

    def set_system(self, conversation_id: int, system: str | None) -> None:
        with _transaction(self.db) as db:
            db.execute("UPDATE conversations SET system = ? WHERE id = ?", (system or None, conversation_id))

    def delete(self, conversation_id: int) -> None:
        with _transaction(self.db) as db:
            db.execute("DELETE FROM messages WHERE conversation_id = ?", (conversation_id,))
            db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    # messages
    def add_message(self, conversation_id: int, role: str, content: str, origins=None, speculators=None) -> None:
        """One message; an answer may carry its (piece, origin) per token and its speculators' names."""
        now = time.time()
        with _transaction(self.db) as db:
            db.execute(
                "INSERT INTO messages (conversation_id, role, content, origins, speculators, created) VALUES (?, ?, ?, ?, ?, ?)",
                (conversation_id, role, content, json.dumps(origins) if origins else None,
                 json.dumps(list(speculators)) if speculators else None, now),
            )
            db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (now, conversation_id))

    def messages(self, conversation_id: int) -> list[StoredMessage]:
        rows = self.db.execute(
            "SELECT role, content, origins, speculators, created, id FROM messages WHERE conversation_id = ? ORDER BY id",
            (conversation_id,),
        )
        return [StoredMessage(role, content, _pieces(origins), _names(names), created, row_id)
                for role, content, origins, names, created, row_id in rows]

    def extend_message(self, message_id: int, text: str, origins=None) -> None:
        """Append a continuation to a saved answer; its origins are kept only if both parts have them."""
        row = self.db.execute("SELECT conversation_id, content, origins FROM messages WHERE id = ?", (message_id,)).fetchone()
        if row is None:
            return
        conversation_id, content, old = row
        pieces = _pieces(old) + list(origins or []) if old and origins else None
        with _transaction(self.db) as db:
            db.execute("UPDATE messages SET content = ?, origins = ? WHERE id = ?",
                       (content + text, json.dumps(pieces) if pieces else None, message_id))
            db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (time.time(), conversation_id))

    def fork(self, conversation_id: int, keep: int, title: str) -> ConversationRecord:
        """A new conversation holding copies of another's first `keep` messages (the original is not
        touched): where an edited message is resent or an answer regenerated."""
        source = self.get(conversation_id)
        record = self.create(title, source.system if source else None)
        with _transaction(self.db) as db:
            for m in self.messages(conversation_id)[:keep]:
                db.execute(
                    "INSERT INTO messages (conversation_id, role, content, origins, speculators, created) VALUES (?, ?, ?, ?, ?, ?)",
                    (record.id, m.role, m.content, json.dumps(m.origins) if m.origins else None,
                     json.dumps(m.speculators) if m.speculators else None, m.created),
                )
        return record

    # the conversation that reopens at start
    def user_prompts(self, limit: int = 500) -> list[str]:
        """The newest `limit` messages the user sent, in every conversation, oldest first, without
        a message repeating the one before it (prompt history: Up/Down and ctrl+r)."""
        rows = self.db.execute("SELECT content FROM messages WHERE role = 'user' ORDER BY id DESC LIMIT ?", (limit,))
        prompts: list[str] = []
        for (content,) in reversed(list(rows)):
            if not prompts or prompts[-1] != content:
                prompts.append(content)
        return prompts

    def set_last(self, conversation_id: int | None) -> None:
        with _transaction(self.db) as db:
            db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('last', ?)", (str(conversation_id or ""),))

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


def export_file(folder: Path, record: ConversationRecord, messages: list[StoredMessage]) -> Path:
    """Write the conversation as Markdown into `folder` (0700), the file 0600; its path."""
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in record.title)[:40].strip("-") or "chat"
    return write_private(folder / f"{record.id}-{safe}.md", export_markdown(record, messages))
