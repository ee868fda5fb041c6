"""The committed generated modules must match what the .proto files compile to."""

import sys
from pathlib import Path

import pytest

PROTO_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROTO_DIR))
from generate import generate  # noqa: E402


def test_generated_code_is_current(tmp_path: Path) -> None:
    generate(tmp_path)
    fresh = sorted(p.relative_to(tmp_path) for p in (tmp_path / "stoa_proto").iterdir())
    assert fresh, "protoc produced nothing"
    for rel in fresh:
        committed = PROTO_DIR / rel
        assert committed.exists(), f"{rel} is not committed: run `uv run python proto/generate.py`"
        if committed.read_bytes() != (tmp_path / rel).read_bytes():
            pytest.fail(f"{rel} is stale: run `uv run python proto/generate.py`")


def test_inventory_round_trips_as_proto3_json() -> None:
    from google.protobuf import json_format
    from stoa_proto import inventory_pb2

    inv = inventory_pb2.Inventory(gateway_id="gw", generation=7)
    inv.routes.add(route_id="a", tenant_id="t", api_id="a", path_prefix="/apis/a", methods=["GET"])
    text = json_format.MessageToJson(inv)
    back = json_format.Parse(text, inventory_pb2.Inventory())
    assert back == inv
