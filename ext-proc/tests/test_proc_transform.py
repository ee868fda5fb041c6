"""JSON pointer edits on their own: set, remove, rename, arrays, escapes, absent targets."""

from __future__ import annotations

from stoa_proc.transform import Edit, Side, pointer


def side(*edits: tuple[str, str, object, str]) -> Side:
    return Side(
        (),
        (),
        tuple(Edit(op, pointer(path), value, pointer(to) if to else ()) for op, path, value, to in edits),
    )


def test_set_remove_rename_in_order_on_a_copy() -> None:
    document = {"a": {"b": 1}, "list": [1, 2], "x~y/z": 0}
    edited = side(
        ("set", "/a/c", {"deep": True}, ""),
        ("remove", "/a/b", None, ""),
        ("rename", "/list", None, "/items"),
        ("set", "/items/-", 3, ""),
        ("set", "/items/0", 9, ""),
        ("remove", "/x~0y~1z", None, ""),
    ).edit(document)
    assert edited == {"a": {"c": {"deep": True}}, "items": [9, 2, 3]}
    assert document == {"a": {"b": 1}, "list": [1, 2], "x~y/z": 0}


def test_absent_targets_are_skipped() -> None:
    document = {"a": 1}
    assert side(
        ("set", "/missing/b", 1, ""), ("remove", "/nope", None, ""), ("rename", "/nope", None, "/x")
    ).edit(document) == {"a": 1}
