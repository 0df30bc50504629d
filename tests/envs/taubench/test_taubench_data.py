"""τ-bench tables: copies per episode, inserts, and a hash that sees content only."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest
from library_domain import DATA

from sessionrl.envs.taubench import DataMissing, TauData, TauDb, resolve_data_dir

TABLES = ("members", "books", "loans")


@pytest.fixture
def data() -> TauData:
    return TauData(DATA, TABLES)


def test_an_insert_is_private_to_its_copy_and_listed_after_the_originals(data: TauData) -> None:
    mine, other = TauDb(data), TauDb(data)
    stored = mine.insert("loans", "m1/b1", {"member_id": "m1", "book_id": "b1"})
    assert mine.get("loans", "m1/b1") == stored == {"member_id": "m1", "book_id": "b1"}
    assert other.get("loans", "m1/b1") is None
    assert data.tables["loans"] == {}
    mine.edit("loans", "m1/b1")["returned"] = True  # an inserted record is already the episode's own
    assert mine.get("loans", "m1/b1") == {"member_id": "m1", "book_id": "b1", "returned": True}
    assert [key for key, _ in mine.items("members")] == ["m1", "m2", "m3"]
    assert list(mine.items("loans")) == [("m1/b1", stored)]


def test_an_insert_never_overwrites(data: TauData) -> None:
    db = TauDb(data)
    db.insert("loans", "x", {})
    with pytest.raises(KeyError, match="loans already holds 'x'"):
        db.insert("loans", "x", {"other": 1})
    with pytest.raises(KeyError, match="members already holds 'm1'"):
        db.insert("members", "m1", {})


def test_an_inserted_record_hashes_as_if_it_had_always_been_there(data: TauData, tmp_path: Path) -> None:
    db = TauDb(data)
    fresh = db.state_hash()
    db.insert("members", "m0", {"name": "Zero", "email": "zero@example.org"})
    db.insert("members", "m9", {"email": "nine@example.org", "name": "Nine"})
    assert db.state_hash() != fresh
    folder = tmp_path / "library"
    shutil.copytree(DATA, folder)
    members = orjson.loads((folder / "members.json").read_bytes())
    members |= {
        "m9": {"name": "Nine", "email": "nine@example.org"},
        "m0": {"name": "Zero", "email": "zero@example.org"},
    }
    (folder / "members.json").write_bytes(orjson.dumps(members))
    assert TauDb(TauData(folder, TABLES)).state_hash() == db.state_hash()


def test_edits_back_to_the_original_hash_as_the_original(data: TauData) -> None:
    db = TauDb(data)
    fresh = db.state_hash()
    db.edit("books", "b1")["copies"] = 1
    assert db.state_hash() != fresh
    db.edit("books", "b1")["copies"] = 2
    assert db.state_hash() == fresh


def test_a_missing_folder_or_file_says_what_to_provide(tmp_path: Path) -> None:
    with pytest.raises(
        DataMissing, match=r"no library data folder given\. Pass --data DIR or set LIB=DIR"
    ) as e:
        resolve_data_dir("library", TABLES, None, variable="LIB", environ={})
    assert str(e.value).endswith(
        "holds members.json, books.json, loans.json, tools.json, wiki.md and a task file "
        "(tasks_train.json, tasks_dev.json or tasks_test.json; one is enough)."
    )
    assert resolve_data_dir("library", TABLES, None, variable="LIB", environ={"LIB": str(DATA)}) == DATA
    with pytest.raises(DataMissing, match=r"folder \S+nowhere does not exist\. Pass --data DIR\.$"):
        resolve_data_dir("library", TABLES, tmp_path / "nowhere")
    (tmp_path / "members.json").write_text("{}")
    with pytest.raises(
        DataMissing, match=r"lacks books\.json, loans\.json, tools\.json, wiki\.md and a task file \(tasks_"
    ):
        resolve_data_dir("library", TABLES, tmp_path)


def test_one_task_file_is_enough_and_only_what_lacks_is_named(tmp_path: Path) -> None:
    folder = tmp_path / "library"
    shutil.copytree(DATA, folder)
    for split in ("train", "dev"):
        (folder / f"tasks_{split}.json").unlink()
    assert resolve_data_dir("library", TABLES, folder) == folder
    (folder / "wiki.md").unlink()
    with pytest.raises(DataMissing) as e:
        resolve_data_dir("library", TABLES, folder, source="see the library's site")
    assert str(e.value) == f"library data folder {folder} lacks wiki.md: see the library's site"


def test_a_table_must_be_an_object_of_records(tmp_path: Path) -> None:
    folder = tmp_path / "library"
    shutil.copytree(DATA, folder)
    (folder / "loans.json").write_text("[]")
    with pytest.raises(
        DataMissing, match=r"loans\.json must be a JSON object mapping each key to its record"
    ):
        TauData(folder, TABLES)
