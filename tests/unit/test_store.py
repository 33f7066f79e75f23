"""The SQLite history: conversations, messages, the last one reopening, and a corrupt file set aside."""

from __future__ import annotations

import sqlite3

from spectui.store import Store, export_markdown


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
    assert store.notice and "moved to" in store.notice
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
