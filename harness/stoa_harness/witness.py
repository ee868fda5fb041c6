"""The Check witness: an independent, minimal `envoy.service.auth.v3.Authorization` server.

It records the Checks Envoy sends (the latest `max_checks`: monotonic time, method, path, context
extensions, headers) and answers by a rule tests switch at runtime. It is plaintext gRPC on loopback
(Envoy's ext_authz cluster is HTTP/2 without TLS) and runs on its own asyncio loop in its own thread.

    with CheckWitness() as w:            # Link setting EXT_AUTHZ_ADDRESS = w.address
        w.allow()                        # the default: allow (optionally adding upstream headers)
        w.deny()                         # 403 with the neutral deny body
        w.hang()                         # never answer ... until w.release() (then the current rule)
        w.fail(grpc.StatusCode.INTERNAL) # answer every Check with that gRPC error status
        w.slow(0.5)                      # answer by the current rule, but only after 0.5 s
        w.crash()                        # stop serving (connections refused); w.start() comes back
        w.set_rule(lambda check: Deny() if check.method == "POST" else Allow())
        w.checks()                       # [Check(at, method, path, host, headers, context_extensions, body)]
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.auth.v3 import external_auth_pb2, external_auth_pb2_grpc
from envoy.type.v3 import http_status_pb2
from google.rpc import code_pb2, status_pb2
from stoa_proto.bodies import CONTENT_TYPE, DENY_BODIES

from stoa_harness.lifecycle import Lifecycle
from stoa_harness.ports import free_port
from stoa_harness.wait import wait_until


def neutral_deny_body(status: int = 403) -> bytes:
    """The gateway's neutral deny body, so the witness's denial is byte-identical to the real service's."""
    return DENY_BODIES[status]


@dataclass(frozen=True)
class Check:
    """One Check request as the witness received it."""

    at: float  # time.monotonic() on arrival
    method: str
    path: str
    host: str
    headers: Mapping[str, str]  # lower-case names, as Envoy sends them
    context_extensions: Mapping[str, str]
    body: str

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())


@dataclass(frozen=True)
class Allow:
    headers: Mapping[str, str] = field(default_factory=dict)  # added (overwriting) to the upstream request
    headers_to_remove: tuple[str, ...] = ()


@dataclass(frozen=True)
class Deny:
    status: int = 403
    body: bytes | None = None  # None: the neutral deny body for `status`
    headers: Mapping[str, str] = field(default_factory=lambda: {"content-type": CONTENT_TYPE})


@dataclass(frozen=True)
class Hang:
    """Never answer until `CheckWitness.release()`."""


@dataclass(frozen=True)
class Fail:
    """Answer with a gRPC error status instead of a CheckResponse."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL


@dataclass(frozen=True)
class Late:
    """Answer `then`, but only `delay_s` seconds after the Check arrived."""

    delay_s: float
    then: Allow | Deny = field(default_factory=Allow)


Decision = Allow | Deny | Hang | Fail | Late
Rule = Decision | Callable[[Check], Decision]


def _record(request: external_auth_pb2.CheckRequest) -> Check:
    http = request.attributes.request.http
    headers = {k.lower(): v for k, v in http.headers.items()}
    if not headers and http.header_map.headers:
        headers = {h.key.lower(): h.value or h.raw_value.decode("latin-1") for h in http.header_map.headers}
    return Check(
        at=time.monotonic(),
        method=http.method,
        path=http.path,
        host=http.host,
        headers=headers,
        context_extensions=dict(request.attributes.context_extensions),
        body=http.body,
    )


def _response(decision: Allow | Deny) -> external_auth_pb2.CheckResponse:
    if isinstance(decision, Allow):
        add = base_pb2.HeaderValueOption.HeaderAppendAction.OVERWRITE_IF_EXISTS_OR_ADD
        return external_auth_pb2.CheckResponse(
            status=status_pb2.Status(code=code_pb2.OK),
            ok_response=external_auth_pb2.OkHttpResponse(
                headers=[
                    base_pb2.HeaderValueOption(header=base_pb2.HeaderValue(key=k, value=v), append_action=add)
                    for k, v in decision.headers.items()
                ],
                headers_to_remove=list(decision.headers_to_remove),
            ),
        )
    body = decision.body if decision.body is not None else neutral_deny_body(decision.status)
    return external_auth_pb2.CheckResponse(
        status=status_pb2.Status(code=code_pb2.PERMISSION_DENIED),
        denied_response=external_auth_pb2.DeniedHttpResponse(
            status=http_status_pb2.HttpStatus(code=decision.status),  # type: ignore[arg-type]
            headers=[
                base_pb2.HeaderValueOption(header=base_pb2.HeaderValue(key=k, value=v))
                for k, v in decision.headers.items()
            ],
            body=body.decode(),
        ),
    )


DEFAULT_MAX_CHECKS = 10_000


class CheckWitness(Lifecycle, external_auth_pb2_grpc.AuthorizationServicer):
    def __init__(self, host: str = "127.0.0.1", port: int = 0, max_checks: int = DEFAULT_MAX_CHECKS) -> None:
        self.host = host
        self.port = port or free_port(host)  # fixed for the witness's life, so a restart comes back on it
        self._lock = threading.Lock()
        # The latest Checks only: an estate on the witness can serve traffic for days at a flat footprint.
        self._checks: deque[Check] = deque(maxlen=max_checks)
        self._rule: Rule = Allow()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: grpc.aio.Server | None = None
        self._released: asyncio.Event | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    # -- lifecycle --------------------------------------------------------------------------------
    def _start(self) -> None:
        """Also how a crashed witness comes back: on the same port, with its records and rule."""
        if self._loop is None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            self._thread = threading.Thread(target=loop.run_forever, name="check-witness", daemon=True)
            self._thread.start()
        self._call(self._serve())

    async def _serve(self) -> None:
        if self._server is not None:
            return
        self._released = asyncio.Event()
        server = grpc.aio.server()
        external_auth_pb2_grpc.add_AuthorizationServicer_to_server(self, server)
        # The port may linger briefly after a crash(); retry binding with a deadline.
        deadline = time.monotonic() + 10
        while True:
            try:
                if server.add_insecure_port(self.address) == self.port:
                    break
            except RuntimeError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"Check witness cannot bind {self.address}")
            await asyncio.sleep(0.05)
        await server.start()
        self._server = server

    def crash(self) -> None:
        """Stop serving at once: in-flight Checks are cancelled and new connections are refused."""
        self._call(self._halt())

    async def _halt(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            await server.stop(grace=None)

    def stop(self) -> None:
        if self._loop is None:
            return
        self._call(self._halt())
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._loop.close()
        self._loop = self._thread = None

    def _call(self, coro: Any, timeout: float = 15.0) -> Any:
        assert self._loop is not None, "witness not started"
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(timeout)

    # -- what tests script and read ---------------------------------------------------------------
    def set_rule(self, rule: Rule) -> None:
        with self._lock:
            self._rule = rule

    def allow(self, headers: Mapping[str, str] | None = None) -> None:
        self.set_rule(Allow(dict(headers or {})))

    def deny(self, status: int = 403, body: bytes | None = None) -> None:
        self.set_rule(Deny(status, body))

    def hang(self) -> None:
        self.set_rule(Hang())

    def fail(self, code: grpc.StatusCode = grpc.StatusCode.INTERNAL) -> None:
        self.set_rule(Fail(code))

    def slow(self, delay_s: float, then: Allow | Deny | None = None) -> None:
        self.set_rule(Late(delay_s, then or Allow()))

    def release(self, rule: Rule | None = None) -> None:
        """End a hang: the held Checks (and later ones) are answered by `rule` (default: allow)."""
        self.set_rule(rule if rule is not None else Allow())
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._wake_held)

    def _wake_held(self) -> None:
        # Held Checks wait on the current event; later Hang decisions wait on a fresh one.
        held, self._released = self._released, asyncio.Event()
        if held is not None:
            held.set()

    def checks(self) -> list[Check]:
        with self._lock:
            return list(self._checks)

    def clear(self) -> None:
        """Forget recorded Checks and go back to allowing (releasing anything held)."""
        with self._lock:
            self._checks.clear()
        self.release()

    def wait_checks(self, count: int, timeout: float = 5.0) -> list[Check]:
        return wait_until(
            lambda: (items := self.checks()) and len(items) >= count and items,
            timeout,
            f"{count} Check(s) at the witness",
        )

    # -- the gRPC service -------------------------------------------------------------------------
    async def Check(  # the generated servicer's method name
        self, request: external_auth_pb2.CheckRequest, context: grpc.aio.ServicerContext
    ) -> external_auth_pb2.CheckResponse:
        check = _record(request)
        with self._lock:
            self._checks.append(check)
        while True:
            with self._lock:
                rule = self._rule
            decision = rule(check) if callable(rule) else rule
            if isinstance(decision, Fail):
                await context.abort(decision.code, "scripted failure")
            if isinstance(decision, Late):
                await asyncio.sleep(decision.delay_s)
                return _response(decision.then)
            if not isinstance(decision, Hang):
                return _response(decision)
            assert self._released is not None
            await self._released.wait()
