"""spectui/documents.py on real files: the chat's `/file PATH` lines and how a document is read."""

from __future__ import annotations

import pytest

from spectui.documents import MAX_BYTES, DocumentError, expand_file_commands, read_document


def test_each_file_line_becomes_its_text_and_other_lines_stay(tmp_path):
    (tmp_path / "a.txt").write_text("alpha\n\n", encoding="utf-8")
    (tmp_path / "my notes.txt").write_bytes(b"beta \xfe\n")
    message = f"Compare\n/file {tmp_path / 'a.txt'}\nwith\n/file \"{tmp_path / 'my notes.txt'}\"\n/filesystem stays\n /file stays too"
    assert expand_file_commands(message) == "Compare\nalpha\nwith\nbeta \ufffd\n/filesystem stays\n /file stays too"
    assert expand_file_commands("no command here") == "no command here"


def test_home_folder_and_relative_paths(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "doc.txt").write_text("from home", encoding="utf-8")
    assert expand_file_commands("/file ~/doc.txt") == "from home"
    assert expand_file_commands("/file doc.txt") == "from home"


def test_a_path_with_the_question_on_the_same_line_gets_a_hint(tmp_path):
    (tmp_path / "doc.txt").write_text("text", encoding="utf-8")
    with pytest.raises(DocumentError) as caught:
        expand_file_commands(f"/file {tmp_path / 'doc.txt'} summarise it")
    assert str(caught.value).endswith("(a question goes on the next line: ctrl+j)")


def test_a_document_over_the_limit_is_refused(tmp_path):
    big = tmp_path / "big.txt"
    big.write_bytes(b"x" * (MAX_BYTES + 1))
    with pytest.raises(DocumentError, match="larger than 1 MiB"):
        read_document(big)
    with pytest.raises(DocumentError, match="larger than 1 MiB"):
        read_document("/dev/zero")  # an endless file is read only up to the limit
