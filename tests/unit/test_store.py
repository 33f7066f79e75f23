"""The SQLite history: conversations, messages, the last one reopening, a damaged file set aside,
an unwritable one left alone, WAL and the schema version, private files."""

from __future__ import annotations

import os
import signal
import sqlite3
import stat
import subprocess
import sys

import pytest

from spectui.store import SCHEMA_VERSION, Store, export_file, export_markdown


def test_conversations_and_messages_survive_reopening(tmp_path):
    path = tmp_path / "history.sqlite3"
    store = Store(path)
    first = store.create("first")
    store.add_message(first.id, "user", "What is the capital of France?")
    store.add_message(first.id, "assistant", "Paris.", [["Paris", "ngram"], [".", "verifier"]])
    second = store.create("second", system="be brief")
    store.add_message(second.id, "user", "hi")
    store.set_last(first.id)
    store.close()

    again = Store(path)
    assert again.notice is None
    assert again.last().id == first.id
    assert [m.content for m in again.messages(first.id)] == ["What is the capital of France?", "Paris."]
    assert again.messages(first.id)[1].origins == [("Paris", "ngram"), (".", "verifier")]
    assert again.get(second.id).system == "be brief"
    assert {r.title for r in again.list()} == {"first", "second"}


def test_rename_delete_and_last_falls_back(tmp_path):
    store = Store(tmp_path / "h.sqlite3")
    a = store.create("a")
    b = store.create("b")
    store.add_message(b.id, "user", "x")
    store.rename(a.id, "renamed")
    assert store.get(a.id).title == "renamed"
    store.delete(b.id)
    assert store.get(b.id) is None
    assert store.messages(b.id) == []
    assert store.last().id == a.id  # the last-opened one is gone: the newest remaining reopens
    store.set_system(a.id, "sys")
    assert store.get(a.id).system == "sys"


def test_corrupt_database_is_set_aside_not_fatal(tmp_path):
    path = tmp_path / "history.sqlite3"
    path.write_bytes(b"this is not a database" * 100)
    store = Store(path)
    assert store.notice and "moved to" in store.notice and store.persistent
    aside = list(tmp_path.glob("history.sqlite3.broken-*"))
    assert len(aside) == 1 and aside[0].read_bytes().startswith(b"this is not")
    record = store.create("fresh")
    store.add_message(record.id, "user", "still works")
    assert store.messages(record.id)[0].content == "still works"


def test_wrong_schema_is_set_aside(tmp_path):
    path = tmp_path / "history.sqlite3"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE conversations (something TEXT)")
    db.commit()
    db.close()
    store = Store(path)
    assert store.notice is not None
    assert store.list() == []


def test_export_markdown(tmp_path):
    store = Store(tmp_path / "h.sqlite3")
    record = store.create("France", system="answer briefly")
    store.add_message(record.id, "user", "What is the capital of France?")
    store.add_message(record.id, "assistant", "Paris.")
    text = export_markdown(store.get(record.id), store.messages(record.id))
    assert text.startswith("# France")
    assert "**System:** answer briefly" in text
    assert text.index("## User") < text.index("What is the capital") < text.index("## Assistant") < text.index("Paris.")


def snapshot(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def fill(path, conversations=1, messages=2):
    store = Store(path)
    for c in range(conversations):
        record = store.create(f"conversation {c} " + "x" * 200)
        for m in range(messages):
            store.add_message(record.id, "user" if m % 2 == 0 else "assistant", f"message {m} of {c}")
    store.close()
    return record.id


def test_new_history_is_wal_versioned_and_private(tmp_path):
    path = tmp_path / "home" / "data" / "history.sqlite3"
    store = Store(path)
    record = store.create("t")
    store.add_message(record.id, "user", "hi")
    assert store.notice is None and store.persistent and store.schema_version == SCHEMA_VERSION
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.with_name("history.sqlite3-wal").stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == stat.S_IMODE(path.parent.parent.stat().st_mode) == 0o700
    store.close()
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_unversioned_history_is_migrated(tmp_path):
    path = tmp_path / "history.sqlite3"
    db = sqlite3.connect(path)  # the schema spectui wrote before it had a version
    db.executescript("""
        CREATE TABLE conversations (id INTEGER PRIMARY KEY AUTOINCREMENT, title TEXT NOT NULL, system TEXT,
                                    created REAL NOT NULL, updated REAL NOT NULL);
        CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT,
                               conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
                               role TEXT NOT NULL, content TEXT NOT NULL, origins TEXT, created REAL NOT NULL);
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);
        INSERT INTO conversations VALUES (7, 'old chat', 'be brief', 1.0, 2.0);
        INSERT INTO messages VALUES (1, 7, 'user', 'kept?', NULL, 1.0);
        INSERT INTO meta VALUES ('last', '7');
    """)
    db.close()
    store = Store(path)
    assert store.notice is None and store.schema_version == SCHEMA_VERSION
    assert store.last().title == "old chat" and store.messages(7)[0].content == "kept?"
    indexes = {row[1] for row in store.db.execute("PRAGMA index_list(messages)")}
    assert "messages_by_conversation" in indexes
    assert not list(tmp_path.glob("*.broken-*"))
    assert store.messages(7)[0].speculators == []  # the old rows: no speculators recorded
    store.add_message(7, "assistant", "Yes.", [["Yes", "ssm-b"], [".", "verifier"]], ["ssm-a", "ssm-b"])
    assert store.messages(7)[1].speculators == ["ssm-a", "ssm-b"]  # the column the migration added


def test_answers_keep_their_origins_and_speculators(tmp_path):
    store = Store(tmp_path / "history.sqlite3")
    record = store.create("t")
    store.add_message(record.id, "assistant", "Paris.", [["Paris", "b-2"], [".", "verifier"]], ["b-1", "b-2"])
    store.add_message(record.id, "assistant", "no origins")
    store.db.execute("UPDATE messages SET origins = '[[1, 2, 3]]', speculators = '{}' WHERE content = 'no origins'")
    store.close()
    answer, odd = Store(tmp_path / "history.sqlite3").messages(record.id)
    assert answer.origins == [("Paris", "b-2"), (".", "verifier")] and answer.speculators == ["b-1", "b-2"]
    assert odd.origins == [] and odd.speculators == []  # not what spectui writes: shown uncoloured


def test_newer_schema_is_left_untouched(tmp_path):
    path = tmp_path / "history.sqlite3"
    fill(path)
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version = 99")
    db.close()
    before = snapshot(tmp_path)
    store = Store(path)
    assert "newer spectui" in store.notice and not store.persistent
    record = store.create("this session only")
    store.add_message(record.id, "user", "in memory")
    assert store.messages(record.id)[0].content == "in memory"
    store.close()
    assert snapshot(tmp_path) == before


def test_malformed_page_is_moved_aside(tmp_path):
    path = tmp_path / "history.sqlite3"
    fill(path, conversations=200)
    db = sqlite3.connect(path)
    root = db.execute("SELECT rootpage FROM sqlite_master WHERE name = 'conversations'").fetchone()[0]
    page = db.execute("PRAGMA page_size").fetchone()[0]
    db.close()
    data = bytearray(path.read_bytes())
    data[(root - 1) * page:(root - 1) * page + 64] = b"\xff" * 64  # the conversations table's root page
    path.write_bytes(bytes(data))
    store = Store(path)
    assert store.notice and "moved to" in store.notice and store.persistent
    aside = list(tmp_path.glob("history.sqlite3.broken-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == bytes(data)  # kept as it was
    assert store.list() == []
    record = store.create("fresh")
    store.add_message(record.id, "user", "works")
    assert store.messages(record.id)[0].content == "works"


@pytest.mark.parametrize("locked", ["file", "folder"])
def test_unwritable_history_is_shown_and_left_alone(tmp_path, locked, read_only):
    path = tmp_path / "history.sqlite3"
    conversation = fill(path)
    before = snapshot(tmp_path)
    with read_only(path if locked == "file" else tmp_path):
        store = Store(path)
        assert "cannot be written" in store.notice and not store.persistent
        assert [m.content for m in store.messages(conversation)] == ["message 0 of 0", "message 1 of 0"]
        store.add_message(conversation, "user", "this session only")
        assert len(store.messages(conversation)) == 3
        store.close()
    after = snapshot(tmp_path)
    assert after[path.name] == before[path.name]  # SQLite may leave an empty -wal/-shm beside a read-only file
    assert set(after) <= set(before) | {f"{path.name}-wal", f"{path.name}-shm"}
    assert not after.get(f"{path.name}-wal")


KILLED = """
import sys, time
from spectui.store import Store
store = Store(sys.argv[1])
record = store.create("killed mid-answer")
for i in range(20):
    store.add_message(record.id, "user" if i % 2 == 0 else "assistant", f"message {i}")
store.db.execute("BEGIN IMMEDIATE")  # the next message, half written when the process dies
store.db.execute("INSERT INTO messages (conversation_id, role, content, created) VALUES (?, 'assistant', 'half', 0)", (record.id,))
print(record.id, flush=True)
time.sleep(120)
"""


def test_kill_9_keeps_every_committed_message(tmp_path):
    path = tmp_path / "history.sqlite3"
    child = subprocess.Popen([sys.executable, "-c", KILLED, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        conversation = int(child.stdout.readline())
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        child.stdout.close()
    assert child.returncode == -signal.SIGKILL
    assert path.with_name("history.sqlite3-wal").exists()  # the commits were in the WAL, not yet checkpointed
    store = Store(path)
    assert store.notice is None
    assert [m.content for m in store.messages(conversation)] == [f"message {i}" for i in range(20)]
    assert store.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_export_file_is_private(tmp_path):
    store = Store(tmp_path / "h.sqlite3")
    record = store.create("France?")
    store.add_message(record.id, "assistant", "Paris.")
    target = export_file(tmp_path / "data" / "exports", record, store.messages(record.id))
    assert target.name == f"{record.id}-France.md" and "Paris." in target.read_text()
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert stat.S_IMODE(target.parent.stat().st_mode) == stat.S_IMODE(target.parent.parent.stat().st_mode) == 0o700


def test_conversation_dates_read_like_a_chat_client():
    import datetime as dt

    from spectui.screens.dialogs import when

    now = dt.datetime(2026, 11, 25, 15, 30).timestamp()
    assert when(dt.datetime(2026, 11, 25, 9, 5).timestamp(), now) == "today 09:05"
    assert when(dt.datetime(2026, 11, 24, 23, 59).timestamp(), now) == "yesterday 23:59"
    assert when(dt.datetime(2026, 3, 2, 18, 40).timestamp(), now) == "2 Mar 18:40"
    assert when(dt.datetime(2025, 11, 3, 8, 0).timestamp(), now) == "3 Nov 2025"


def test_a_fork_copies_the_first_messages_and_leaves_the_original(tmp_path):
    store = Store(tmp_path / "h.sqlite3")
    source = store.create("rivers", system="be brief")
    store.add_message(source.id, "user", "Name a river.")
    store.add_message(source.id, "assistant", "Rhine.", [["Rhine", "ssm"], [".", "verifier"]], ["a"])
    store.add_message(source.id, "user", "Another?")
    before = store.messages(source.id)
    fork = store.fork(source.id, 2, "rivers · edited")
    copied = store.messages(fork.id)
    assert fork.title == "rivers · edited" and store.get(fork.id).system == "be brief"
    assert [(m.role, m.content, m.origins, m.speculators, m.created) for m in copied] == [
        (m.role, m.content, m.origins, m.speculators, m.created) for m in before[:2]]
    assert {m.id for m in copied}.isdisjoint(m.id for m in before)
    assert store.messages(source.id) == before


def test_a_continued_answer_grows_in_place_with_origins_only_when_both_parts_have_them(tmp_path):
    store = Store(tmp_path / "h.sqlite3")
    chat = store.create("c")
    store.add_message(chat.id, "user", "Count.")
    store.add_message(chat.id, "assistant", "one", [["one", "ssm"]])
    answer = store.messages(chat.id)[1]
    store.extend_message(answer.id, " two", [[" two", "verifier"]])
    assert store.messages(chat.id)[1].content == "one two"
    assert store.messages(chat.id)[1].origins == [("one", "ssm"), (" two", "verifier")]
    store.extend_message(answer.id, " three")  # no origins for this part: none describe the whole
    grown = store.messages(chat.id)
    assert len(grown) == 2 and grown[1].id == answer.id
    assert grown[1].content == "one two three" and grown[1].origins == []
    store.extend_message(10_000, "lost?")  # a message that is not there: nothing happens
    assert store.messages(chat.id) == grown
