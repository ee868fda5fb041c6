"""`/metrics`: the CP's metrics in Prometheus text format (prometheus-client, one registry per app, written
as every service writes its own: `stoa_ops.endpoint.exposition`)."""

from __future__ import annotations

import contextlib

from fastapi import APIRouter, Request, Response
from prometheus_client import CollectorRegistry, Gauge
from stoa_ops.endpoint import CONTENT_TYPE, exposition

from stoa_cp.dependencies import Db
from stoa_cp.problems import Problem
from stoa_cp.store import issuers

router = APIRouter(tags=["health"])


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.stale_issuers = Gauge(
            "stoa_cp_stale_issuers",
            "Issuers whose keys left the inventories: no fetch of their jwks_uri adopted within the "
            "stale bound",
            registry=self.registry,
        )


@router.get("/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE: {}}}})
async def metrics(request: Request, db: Db) -> Response:
    """Prometheus text format. Counts read from the database keep their last value while it is away."""
    current: Metrics = request.app.state.metrics
    with contextlib.suppress(Problem):
        current.stale_issuers.set(await issuers.count_stale(db))
    return Response(exposition(current.registry), media_type=CONTENT_TYPE)
