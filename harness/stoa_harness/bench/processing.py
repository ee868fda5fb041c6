"""Processing: the same Envoy with and without the processing hop, and stoa-proc against a processor
that changes nothing (`noop_proc`, the same grpcio server), in one run.

- Throughput, 32 connections, each repetition with its own proxy-only baseline (the proxy-only
  listener, router only, to the same `direct_response` upstream): `guard` = a route with request
  guardrails (patterns, e-mail and card PII, a body limit; no auth) taking a 1 KiB JSON body through
  stoa-proc; `guard_noop` = the same route through the no-op processor.
  `proc_ratio` = guard ÷ proxy-only; `proc_floor_ratio` = guard's ratio ÷ guard_noop's.
- Time to first byte at one connection of a streamed completion (the fake model, server-sent events):
  the time from sending the request to the first byte of the first event, on a route with guardrails
  on both directions (the request inspected, the stream switched to streamed mode and inspected event
  by event) minus the same on a route without a body policy to the same model.
  `proc_stream_ttfb_ratio` = stoa-proc's added time ÷ the no-op processor's.
The no-op processor takes stoa-proc's port while stoa-proc is stopped: nothing else changes. The two
alternate in an A-B-B-A order (stoa-proc, no-op, no-op, stoa-proc, …), each warmed up after it takes
the port: an estate settles over the first tens of seconds after its routes are set up (with all of
stoa-proc's phases first, the plain stream route, which no processor serves, was up to 0.7 ms slower in
them in eight runs of nine), so running one processor's phases first would charge that to it.
"""

from __future__ import annotations

import http.client
import json
import statistics
import sys
import time
from typing import Any

import httpx

from stoa_harness.bench.load import run_wrk
from stoa_harness.bench.report import spread
from stoa_harness.bench.rig import TENANT, Rig
from stoa_harness.processes import SupervisedProcess, tcp_accepting
from stoa_harness.site import Site
from stoa_harness.wait import wait_until

GUARD_API = "bench-guard"
STREAM_API = "bench-stream"
PLAIN_STREAM_API = "bench-stream-plain"
GUARD_PATH = f"/apis/{GUARD_API}/resource"
CONNECTIONS = 32
GUARDRAILS = {
    "direction": "request",
    "maxBodyBytes": 4096,
    "blockPatterns": ["ignore (all )?previous instructions", "forbidden fruit"],
    "pii": {"kinds": ["email", "card"], "action": "block"},
}
STREAM_GUARDRAILS = {"direction": "both", "blockPatterns": ["forbidden fruit"]}
STREAM_BODY = json.dumps(
    {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
).encode()


def kib_body() -> bytes:
    """A 1 KiB chat-completion request that every rule lets through."""
    text = "Tell me about the weather in the mountains in spring, please. " * 20
    body = {
        "model": "m",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": ""}],
    }
    bare = len(json.dumps(body).encode())
    body["messages"][1]["content"] = text[: 1024 - bare]
    encoded = json.dumps(body).encode()
    assert len(encoded) == 1024
    return encoded


def _clean(name: str, phase: dict[str, Any]) -> None:
    if phase["non_2xx"] or phase["socket_errors"]:
        raise AssertionError(f"{name}: {phase['non_2xx']} non-2xx, {phase['socket_errors']} socket errors")


def _streams(rig: Rig) -> int:
    return rig.estate.envoy.counters(r"ext_proc\..*streams_started$")


def _first_byte_ms(conn: http.client.HTTPConnection, path: str) -> float:
    """One streamed completion on `conn`: the time to the first byte of its body."""
    start = time.perf_counter()
    conn.request("POST", path, body=STREAM_BODY, headers={"content-type": "application/json"})
    response = conn.getresponse()
    first = response.read1(1)
    took = (time.perf_counter() - start) * 1000
    if response.status != 200 or not first:
        raise AssertionError(f"{path}: {response.status}")
    response.read()
    return took


def _throughput(rig: Rig, body: bytes, duration_s: float) -> tuple[dict[str, Any], dict[str, Any]]:
    proxy = run_wrk(
        rig.proxy_only_url, paths=[GUARD_PATH], body=body, connections=CONNECTIONS, duration_s=duration_s
    )
    before = _streams(rig)
    guard = run_wrk(
        rig.gateway_url, paths=[GUARD_PATH], body=body, connections=CONNECTIONS, duration_s=duration_s
    )
    if _streams(rig) - before < guard.requests:
        raise AssertionError("the guardrail route did not go through the processor")
    p, g = proxy.as_dict(), guard.as_dict()
    _clean("proxy_only", p)
    _clean("guard", g)
    g["ratio"] = g["rps"] / p["rps"]
    return p, g


def _ttfb_added(rig: Rig, count: int) -> dict[str, float]:
    """`count` pairs, each a completion on the plain route then one on the guarded route (one
    keep-alive connection each), so that the machine's load shifts both alike; the median of the
    pairs' differences is the added time."""
    host, port = "127.0.0.1", int(rig.gateway_url.rsplit(":", 1)[1])
    plain_conn = http.client.HTTPConnection(host, port, timeout=10)
    guarded_conn = http.client.HTTPConnection(host, port, timeout=10)
    plain_path = f"/apis/{PLAIN_STREAM_API}/chat/completions"
    guarded_path = f"/apis/{STREAM_API}/chat/completions"
    pairs = []
    try:
        for i in range(count + 3):  # three to warm the connections, not counted
            plain = _first_byte_ms(plain_conn, plain_path)
            guarded = _first_byte_ms(guarded_conn, guarded_path)
            if i >= 3:
                pairs.append((plain, guarded))
    finally:
        plain_conn.close()
        guarded_conn.close()
    return {
        "plain_p50_ms": statistics.median(p for p, _ in pairs),
        "guarded_p50_ms": statistics.median(g for _, g in pairs),
        "added_p50_ms": statistics.median(g - p for p, g in pairs),
    }


def _setup(rig: Rig) -> None:
    estate, admin = rig.estate, rig.estate.admin
    model = f"{estate.llm.url}/v1"
    for api_id, upstream in (
        (GUARD_API, rig.upstream.url("a")),
        (STREAM_API, model),
        (PLAIN_STREAM_API, model),
    ):
        admin.create_api(
            api_id,
            tenant_id=TENANT,
            upstream_url=upstream,
            methods=["POST"],
            auth={"mode": "none", "scopes": []},
        )
        admin.deploy(api_id)
    admin.add_policy("bench-guard", "guardrails", GUARDRAILS, tenant_id=TENANT, targets=[GUARD_API])
    admin.add_policy("bench-stream", "guardrails", STREAM_GUARDRAILS, tenant_id=TENANT, targets=[STREAM_API])
    admin.wait_synced()


class _Processors:
    """Which processor serves stoa-proc's port: stoa-proc itself, or the no-op processor while
    stoa-proc is stopped."""

    def __init__(self, rig: Rig, site: Site, proc: SupervisedProcess, body: bytes) -> None:
        self._rig, self._body, self._site, self._proc = rig, body, site, proc
        address = site.proc_env["STOA_PROC_GRPC_ADDRESS"]
        host, port = address.rsplit(":", 1)
        self._noop = SupervisedProcess(
            "noop-proc",
            [sys.executable, "-m", "stoa_harness.bench.noop_proc", address],
            log_dir=rig.run_dir,
            ready=lambda: tcp_accepting(host, int(port)),
        )

    @property
    def serving(self) -> str:
        return "noop" if self._noop.running else "proc"

    def use(self, name: str) -> None:
        """`name` ("proc" or "noop") serving the guardrail route, warmed up like the other was."""
        if name != self.serving:
            if name == "noop":
                self._proc.stop()
                self._noop.start()
            else:
                self._noop.stop()
                self._start_proc()
        estate = self._rig.estate
        wait_until(
            lambda: estate.gateway.post(estate.url(GUARD_PATH), content=self._body).status_code == 200,
            30,
            f"guardrail route served by {name}",
        )
        run_wrk(
            self._rig.gateway_url, paths=[GUARD_PATH], body=self._body, connections=CONNECTIONS, duration_s=1
        )

    def restore(self) -> None:
        """stoa-proc serving again, as the estate had it."""
        self._noop.stop()
        if not self._proc.running:
            self._start_proc()

    def _start_proc(self) -> None:
        self._proc.start()
        url = f"{self._site.proc_http_url}/health/ready"
        wait_until(lambda: httpx.get(url).status_code == 200, 30, "stoa-proc ready")


def run(rig: Rig, *, reps: int, duration_s: float, ttfb_count: int) -> dict[str, Any]:
    estate = rig.estate
    site = estate.site
    if site is None or site.proc is None:
        raise RuntimeError("the bench estate runs no processing service")
    _setup(rig)
    body = kib_body()
    processors = _Processors(rig, site, site.proc, body)
    phases: dict[str, list[dict[str, Any]]] = {}
    ttfb: dict[str, list[dict[str, float]]] = {"proc": [], "noop": []}
    suffix = {"proc": "", "noop": "_noop"}
    try:
        for rep in range(reps):
            for name in ("proc", "noop") if rep % 2 == 0 else ("noop", "proc"):
                processors.use(name)
                proxy, guard = _throughput(rig, body, duration_s)
                phases.setdefault(f"proxy_only{suffix[name]}", []).append(proxy)
                phases.setdefault(f"guard{suffix[name]}", []).append(guard)
                ttfb[name].append(_ttfb_added(rig, ttfb_count))
            print(f"bench: processing: repetition {rep + 1} of {reps} done", file=sys.stderr)
    finally:
        processors.restore()

    summary = {
        name: {
            key: spread([p[key] for p in runs])
            for key in ("rps", "p50_ms", "p99_ms", "ratio")
            if key in runs[0]
        }
        for name, runs in phases.items()
    }
    proc_ratio = summary["guard"]["ratio"]["median"]
    noop_ratio = summary["guard_noop"]["ratio"]["median"]
    added_proc = statistics.median(t["added_p50_ms"] for t in ttfb["proc"])
    added_noop = statistics.median(t["added_p50_ms"] for t in ttfb["noop"])
    return {
        "proc_ratio": proc_ratio,
        "proc_ratio_spread": summary["guard"]["ratio"],
        "proc_noop_ratio": noop_ratio,
        "proc_floor_ratio": proc_ratio / noop_ratio,
        # Added time to first byte: of a no-op hop near 0 on a quiet machine; the ratio is reported as
        # measured (a tiny denominator makes it noisy, so both terms are kept beside it).
        "proc_stream_ttfb_ratio": added_proc / added_noop if added_noop > 0 else float("inf"),
        "proc_stream_added_ttfb_ms": added_proc,
        "noop_stream_added_ttfb_ms": added_noop,
        "ttfb_requests_per_sample": ttfb_count,
        "ttfb": ttfb,
        "body_bytes": len(body),
        "connections": CONNECTIONS,
        "duration_s": duration_s,
        "repetitions": reps,
        "order": "stoa-proc and the no-op processor alternating A-B-B-A, each warmed up on taking the port",
        "variants": summary,
    }
