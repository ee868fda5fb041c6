"""The policy kinds the translator supports: one module each, registered in this one table.

Adding a kind is its module (parse → IR → listener filter → per-route config), its line here, its
position in `stoa_translate.filters.HTTP_FILTER_ORDER` when it brings a new filter, its proto message
and its CP schema; the translator itself never names a kind.
"""

from __future__ import annotations

from stoa_translate.policies import cors, ip_filter, rate_limit
from stoa_translate.policies.kind import PolicyKind

KINDS: dict[str, PolicyKind] = {kind.name: kind for kind in (cors.KIND, rate_limit.KIND, ip_filter.KIND)}
SUPPORTED_KINDS: tuple[str, ...] = tuple(KINDS)

__all__ = ["KINDS", "SUPPORTED_KINDS", "PolicyKind"]
