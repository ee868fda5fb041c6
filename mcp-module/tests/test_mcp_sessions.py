"""Who may use a session: only the caller that opened it, also once the module has forgotten its
opener (past the bound on sessions it remembers) — forgotten is refused, never open to anyone."""

from __future__ import annotations

from typing import Any

import stoa_mcp.server as server
from stoa_mcp.permissions import Caller, Permissions
from stoa_mcp.registry import Registry
from stoa_mcp.server import McpModule


class Verifier:
    """The envelope is the caller's consumer id (the real verifier is tested on its own)."""

    async def caller(self, envelope: str | None) -> Caller:
        return Caller("t", "mcp", envelope or "", frozenset())


def module() -> tuple[McpModule, list[str]]:
    mcp = McpModule(Permissions({}, "gw", "cp"), Verifier(), None, 1000)  # type: ignore[arg-type]
    mcp.use_registry(Registry(routes={"mcp": "t"}))
    served: list[str] = []
    opened = iter(range(1_000_000))

    class Sessions:
        """The SDK's session manager: answers every request, a new session id for one without."""

        async def handle_request(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
            headers = dict(scope["headers"])
            session = headers.get(b"mcp-session-id") or f"s{next(opened)}".encode()
            served.append(session.decode())
            await send(
                {"type": "http.response.start", "status": 200, "headers": [(b"mcp-session-id", session)]}
            )
            await send({"type": "http.response.body", "body": b"{}"})

    mcp.sessions = Sessions()  # type: ignore[assignment]
    return mcp, served


async def request(mcp: McpModule, consumer: str, session: str | None = None) -> int:
    headers = [(b"x-stoa-identity", consumer.encode())]
    if session is not None:
        headers.append((b"mcp-session-id", session.encode()))
    answered: list[int] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            answered.append(message["status"])

    scope = {"type": "http", "method": "POST", "headers": headers}
    await mcp(scope, None, send)  # type: ignore[arg-type]
    return answered[0]


async def test_a_session_whose_opener_was_forgotten_is_refused_to_everyone(monkeypatch) -> None:
    monkeypatch.setattr(server, "MAX_OWNERS", 2)
    mcp, served = module()
    assert await request(mcp, "alice") == 200  # opens s0
    assert await request(mcp, "mallory", "s0") == 404
    assert await request(mcp, "alice", "s0") == 200
    # Mallory opens sessions until alice's is past the bound and forgotten.
    for _ in range(2):
        assert await request(mcp, "mallory") == 200
    assert "s0" not in mcp._owners
    assert await request(mcp, "mallory", "s0") == 404
    assert await request(mcp, "alice", "s0") == 404  # she opens a new one, as for an ended session
    assert served.count("s0") == 2
