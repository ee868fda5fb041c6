"""Golden files per stage: each `golden/<case>/inventory.json` resolves to exactly `golden/<case>/ir/`
(the IR as JSON, `ir.json`) and that IR renders to exactly `golden/<case>/expected/` (one file per
resource, `<kind>.<name>.json`, proto3 JSON, sorted keys); with route scopes (an Envoy on delta xDS)
its listener, scopes and route tables are `golden/<case>/expected_scoped/` (the rest is the same). A
refusal is `refusal.json` (reason and detail) at the stage that refuses, and after it.
`STOA_UPDATE_GOLDEN=1 uv run pytest translator/tests/test_translate_golden.py` rewrites the files;
review the diff before committing it. Every rendered case, with and without scopes, also passes
`envoy --mode validate` (one Envoy run for all cases).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pytest
from google.protobuf import json_format
from stoa_harness.envoy import validate_config
from stoa_proto import inventory_pb2
from stoa_translate import TranslateOptions, Translator, ir, translate
from stoa_translate.policies import SUPPORTED_KINDS
from stoa_translate.refusal import FailureReason, Refusal
from stoa_translate.snapshot import (
    AUTHZ_POLICY_SET,
    CLUSTER,
    LISTENER,
    PROC_POLICY_SET,
    ROUTE,
    SCOPED_ROUTE,
    Snapshot,
)
from stoa_translate.static import static_bootstrap

GOLDEN = Path(__file__).parent / "golden"
CASES = sorted(p.name for p in GOLDEN.iterdir() if (p / "inventory.json").exists())
UPDATE = os.environ.get("STOA_UPDATE_GOLDEN") == "1"
OPTIONS = TranslateOptions(
    listener_address="127.0.0.1",
    listener_port=10000,
    ext_authz_address="127.0.0.1:9191",
    ext_authz_timeout_ms=250,
    default_route_timeout_ms=15000,
    xff_num_trusted_hops=0,
)
SCOPED = dataclasses.replace(OPTIONS, route_scopes=True)
KINDS = {
    CLUSTER: "cluster",
    LISTENER: "listener",
    ROUTE: "route",
    AUTHZ_POLICY_SET: "authz_policy_set",
    PROC_POLICY_SET: "proc_policy_set",
}
# What route scopes change.
SCOPED_KINDS = {LISTENER: "listener", SCOPED_ROUTE: "scoped_route", ROUTE: "route"}


def dumps(document: object) -> str:
    return json.dumps(document, indent=2, sort_keys=True) + "\n"


def load_inventory(case: str) -> inventory_pb2.Inventory:
    return json_format.Parse((GOLDEN / case / "inventory.json").read_text(), inventory_pb2.Inventory())


def refusal_file(refusal: Refusal) -> dict[str, str]:
    return {"refusal.json": dumps({"reason": FailureReason.Name(refusal.reason), "detail": refusal.detail})}


def stages(
    case: str, options: TranslateOptions = OPTIONS
) -> tuple[dict[str, str], dict[str, str], Snapshot | None]:
    """(inventory → IR files, IR → xDS files, the snapshot): each stage run on its own. A refusal is
    the last stage's file; a case refused at the IR stage has the same refusal as its xDS files."""
    translator = Translator(options)
    try:
        site = translator.resolve(load_inventory(case))
    except Refusal as refusal:
        return refusal_file(refusal), refusal_file(refusal), None
    ir_files = {"ir.json": dumps(ir.to_json(site))}
    try:
        snapshot = translator.render(site)
    except Refusal as refusal:
        return ir_files, refusal_file(refusal), None
    files = {}
    for type_url, kind in (SCOPED_KINDS if options.route_scopes else KINDS).items():
        for resource in snapshot.of(type_url):
            doc = json_format.MessageToDict(resource, preserving_proto_field_name=True)
            files[f"{kind}.{resource.name}.json"] = dumps(doc)
    return ir_files, files, snapshot


def check_stage(case: str, folder: str, rendered: dict[str, str]) -> None:
    expected_dir = GOLDEN / case / folder
    if UPDATE:
        shutil.rmtree(expected_dir, ignore_errors=True)
        expected_dir.mkdir()
        for name, text in rendered.items():
            (expected_dir / name).write_text(text)
    expected = {p.name: p.read_text() for p in sorted(expected_dir.glob("*.json"))}
    assert sorted(rendered) == sorted(expected), f"{case}/{folder}: rendered files differ from the golden set"
    for name, text in rendered.items():
        assert text == expected[name], f"{case}/{folder}/{name} differs from the golden file"


@pytest.mark.parametrize("case", CASES)
def test_inventory_to_ir(case: str) -> None:
    check_stage(case, "ir", stages(case)[0])


@pytest.mark.parametrize("case", CASES)
def test_ir_to_xds(case: str) -> None:
    check_stage(case, "expected", stages(case)[1])


@pytest.mark.parametrize("case", CASES)
def test_ir_to_xds_with_route_scopes(case: str) -> None:
    _, files, snapshot = stages(case, SCOPED)
    if snapshot is None:  # a refusal does not depend on how routes travel
        assert files == stages(case)[1]
    else:
        check_stage(case, "expected_scoped", files)


@pytest.mark.parametrize("case", CASES)
def test_one_translation_is_the_two_stages(case: str) -> None:
    _, _, snapshot = stages(case)
    if snapshot is None:
        with pytest.raises(Refusal):
            translate(load_inventory(case), OPTIONS)
    else:
        assert translate(load_inventory(case), OPTIONS) == snapshot


def test_refusal_cases_name_the_reason_expected_by_their_name() -> None:
    wanted = {
        "refuse_unsupported": FailureReason.UNSUPPORTED_POLICY,
        "refuse_duplicate_same_type": FailureReason.DUPLICATE_POLICY,
        "refuse_bad": FailureReason.INVALID_INVENTORY,
        "refuse_duplicate_route_id": FailureReason.INVALID_INVENTORY,
        "refuse_duplicate_path_prefix": FailureReason.INVALID_INVENTORY,
    }
    refusal_cases = [c for c in CASES if c.startswith("refuse_")]
    assert len(refusal_cases) >= 12
    for case in refusal_cases:
        with pytest.raises(Refusal) as caught:
            translate(load_inventory(case), OPTIONS)
        reason = next(r for prefix, r in wanted.items() if case.startswith(prefix))
        assert caught.value.reason == reason, (case, caught.value)


def kinds_of(case: str) -> set[str]:
    return {p["type"] for p in json.loads((GOLDEN / case / "inventory.json").read_text()).get("policies", [])}


@pytest.mark.parametrize("kind", SUPPORTED_KINDS)
def test_every_policy_kind_has_goldens_of_its_own(kind: str) -> None:
    """A kind comes with its goldens: a case named after it that renders it, and a refused config of
    that kind (`refuse_bad_*`), each through both stages."""
    rendered = [c for c in CASES if c.startswith(kind) and kind in kinds_of(c) and stages(c)[2] is not None]
    refused = [c for c in CASES if c.startswith("refuse_bad") and kind in kinds_of(c)]
    assert rendered, f"no golden case renders {kind}"
    assert refused, f"no golden case refuses a {kind} config"


def test_every_golden_case_passes_envoy_validate() -> None:
    snapshots = {}
    for case in CASES:
        for label, options in ((case, OPTIONS), (f"{case}-scoped", SCOPED)):
            _, _, snapshot = stages(case, options)
            if snapshot is not None:
                snapshots[label] = snapshot
    assert len(snapshots) >= 20
    # One Envoy run for every case: each case's listener on its own port, clusters shared by name.
    validate_config(
        static_bootstrap({case: (snap, 20000 + i) for i, (case, snap) in enumerate(snapshots.items())})
    )
