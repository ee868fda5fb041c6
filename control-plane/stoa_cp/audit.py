"""The audit log: every write on the CP API, recorded with who made it, what it named, when, its
outcome and the generations it produced.

A write's record is collected while the request runs (the access checks name the object's tenant,
publication adds the generations it assigned) and stored before the response leaves, so a caller
that has its answer can already read the record (`stoa_cp.access` does this; `stoa_cp.store.audit`
stores and reads records). Only ids go in: never a body, a token or a key.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field


@dataclass
class Draft:
    """What one write request has touched so far."""

    tenant_id: str | None = None
    object_ids: dict[str, str] = field(default_factory=dict)
    generations: dict[str, int] = field(default_factory=dict)


_current: contextvars.ContextVar[Draft | None] = contextvars.ContextVar("stoa_cp_audit", default=None)


def begin() -> tuple[Draft, contextvars.Token[Draft | None]]:
    draft = Draft()
    return draft, _current.set(draft)


def end(token: contextvars.Token[Draft | None]) -> None:
    _current.reset(token)


def note_tenant(tenant_id: str) -> None:
    draft = _current.get()
    if draft is not None and draft.tenant_id is None:
        draft.tenant_id = tenant_id


def note_objects(ids: dict[str, str]) -> None:
    """Ids a write names other than in its path and its answer's `*_id` fields (a bulk request's
    APIs, say): several of one kind as one comma-separated value."""
    draft = _current.get()
    if draft is not None:
        draft.object_ids.update(ids)


def note_generations(generations: dict[str, int]) -> None:
    draft = _current.get()
    if draft is not None:
        draft.generations.update(generations)


def ids_in(value: object) -> dict[str, str]:
    """The `*_id` members of a JSON object (a created object's ids); nothing else is kept."""
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if k.endswith("_id") and isinstance(v, str)}
