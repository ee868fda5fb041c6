"""The translation preview: what a gateway's Link would publish for its desired state, computed by
the Link's own translator (`stoa_translate`) with the settings the Link last reported.

Translation only: the Link's guard (generation order, routes lost without a tombstone) depends on
what that Link applied before and is not part of a preview.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from stoa_proto import inventory_pb2
from stoa_translate import TranslateOptions, Translator
from stoa_translate.refusal import FailureReason, Refusal
from stoa_translate.snapshot import ENVOY_TYPES, SITE_SERVICE_TYPES, Snapshot
from stoa_translate.static import static_bootstrap, validate_command

from stoa_cp.problems import Problem
from stoa_cp.schemas import Preview, PreviewRefusal, PreviewValidation

ENVOY_VALIDATE_TIMEOUT_S = 60.0


def options_from(reported: dict[str, Any] | None) -> TranslateOptions:
    """The options the Link reported, or TranslateOptions' documented defaults before any report."""
    if reported is None:
        return TranslateOptions()
    settings = json_format.ParseDict(reported, inventory_pb2.TranslateSettings(), ignore_unknown_fields=True)
    try:
        return TranslateOptions.from_settings(settings)
    except ValueError as exc:
        raise Problem(
            409, "Conflict", [("settings", f"the Link reported unusable settings: {exc}")]
        ) from None


def _doc(resource: Any) -> dict[str, Any]:
    return json_format.MessageToDict(resource, preserving_proto_field_name=True)


def tenant_part(inventory: inventory_pb2.Inventory, tenant_id: str) -> inventory_pb2.Inventory:
    """The part of a gateway's inventory that is one tenant's: its routes, its issuers, and the
    policies as they apply to its routes (a gateway policy's reach narrowed to them). Tombstones do
    not say whose route they end, and a translation does not read them: none is kept."""
    part = inventory_pb2.Inventory(
        schema_version=inventory.schema_version,
        gateway_id=inventory.gateway_id,
        generation=inventory.generation,
    )
    part.routes.extend(r for r in inventory.routes if r.tenant_id == tenant_id)
    own = {r.route_id for r in part.routes}
    for policy in inventory.policies:
        if policy.tenant_id == tenant_id or own.intersection(policy.applicable):
            kept = part.policies.add()
            kept.CopyFrom(policy)
            del kept.applicable[:]
            kept.applicable.extend(r for r in policy.applicable if r in own)
    part.issuers.extend(i for i in inventory.issuers if i.tenant_id == tenant_id)
    return part


def render(
    gateway_id: str, inventory_json: str, reported: dict[str, Any] | None, tenant_id: str | None = None
) -> tuple[Preview, Snapshot | None]:
    """The preview of one inventory document (as the gateway's Link receives it), and the snapshot;
    with `tenant_id`, of that tenant's part only."""
    options = options_from(reported)
    inventory = json_format.Parse(inventory_json, inventory_pb2.Inventory())
    if tenant_id is not None:
        inventory = tenant_part(inventory, tenant_id)
    preview = Preview(
        gateway_id=gateway_id,
        tenant_id=tenant_id,
        generation=inventory.generation,
        settings=_doc(options.to_settings()),
        settings_reported=reported is not None,
    )
    try:
        snapshot = Translator(options).translate(inventory)
    except Refusal as refusal:
        preview.refusal = PreviewRefusal(reason=FailureReason.Name(refusal.reason), detail=refusal.detail)
        return preview, None
    # The Link reports the whole snapshot's hash: a part's own hash would match nothing it reports.
    preview.snapshot_version = snapshot.version if tenant_id is None else None
    preview.resources = {t: [_doc(r) for r in snapshot.of(t)] for t in ENVOY_TYPES}
    preview.policy_sets = {t: [_doc(r) for r in snapshot.of(t)] for t in SITE_SERVICE_TYPES}
    return preview, snapshot


def envoy_binary(configured: str) -> str:
    """The Envoy binary to validate with; 503 when the CP has none."""
    found = configured or shutil.which("envoy")
    if not found or not Path(found).exists():
        raise Problem(
            503,
            "Service Unavailable",
            [("validate", "no Envoy binary is available to the CP (set STOA_CP_ENVOY_BINARY)")],
        )
    return found


async def validate(binary: str, snapshot: Snapshot) -> PreviewValidation:
    """`envoy --mode validate` on the snapshot as a static bootstrap (routes inlined)."""
    with tempfile.TemporaryDirectory(prefix="stoa-preview-") as tmp:
        path = Path(tmp) / "bootstrap.json"
        path.write_text(json.dumps(static_bootstrap({"preview": (snapshot, 10000)})))
        process = await asyncio.create_subprocess_exec(
            *validate_command(binary, str(path), abs(hash(tmp)) % 59999 + 1),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(process.communicate(), ENVOY_VALIDATE_TIMEOUT_S)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise Problem(
                503, "Service Unavailable", [("validate", "envoy --mode validate timed out")]
            ) from None
    detail = (err or out).decode(errors="replace").strip()[-4000:]
    return PreviewValidation(valid=process.returncode == 0, detail="" if process.returncode == 0 else detail)
