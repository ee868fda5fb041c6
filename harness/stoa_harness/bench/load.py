"""Load through the real load generator, Debian `wrk`: a Lua script rotates request paths and bearer
tokens (each wrk thread takes its own stride, so N tokens are N distinct tokens to the server), or
API keys in their header with `credential_header`, sends an optional JSON body (`POST`), and prints
wrk's own summary and latency percentiles as one JSON line from its `done` hook.

    result = run_wrk(url, paths=["/apis/a/x"], tokens=tokens, connections=32, duration_s=5)
    result.rps, result.p50_ms, result.non_2xx
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

MARKER = "STOA_WRK "

# `id` is set per thread by setup(); init() reads the path and token files named by the arguments.
LUA = r"""
local next_id = 0
function setup(thread)
  thread:set("id", next_id)
  next_id = next_id + 1
end

local paths, tokens = {}, {}
local counter, stride = 0, 1
local header, scheme = "Authorization", "Bearer "
local body = nil
function init(args)
  for line in io.lines(args[1]) do paths[#paths + 1] = line end
  if args[2] ~= nil and args[2] ~= "-" then
    for line in io.lines(args[2]) do tokens[#tokens + 1] = line end
  end
  stride = tonumber(args[3])
  -- Another header (an API key's) carries the credential as it is, without a scheme.
  if args[4] ~= nil and args[4] ~= "authorization" then header, scheme = args[4], "" end
  if args[5] ~= nil and args[5] ~= "-" then
    local f = io.open(args[5], "rb")
    body = f:read("*a")
    f:close()
  end
  counter = id
end

function request()
  local i = counter
  counter = counter + stride
  local headers = {}
  if #tokens > 0 then headers[header] = scheme .. tokens[(i % #tokens) + 1] end
  if body ~= nil then
    headers["Content-Type"] = "application/json"
    return wrk.format("POST", paths[(i % #paths) + 1], headers, body)
  end
  return wrk.format("GET", paths[(i % #paths) + 1], headers)
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'STOA_WRK {"requests":%d,"duration_us":%d,"connect_errors":%d,"read_errors":%d,'
    .. '"write_errors":%d,"non_2xx":%d,"timeouts":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,"max_us":%d}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end
"""


class LoadError(RuntimeError):
    """wrk is missing, failed, or printed no summary."""


@dataclass(frozen=True)
class WrkResult:
    requests: int
    duration_s: float
    rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    non_2xx: int  # wrk's "Non-2xx or 3xx responses"
    socket_errors: int  # connect + read + write + timeouts

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def wrk_binary() -> str:
    found = shutil.which("wrk")
    if not found:
        raise LoadError("wrk not found: `make bench` installs it (apt-get install -y wrk)")
    return found


def parse(stdout: str) -> WrkResult:
    """The JSON line printed by the script's `done` hook."""
    for line in stdout.splitlines():
        if line.startswith(MARKER):
            raw = json.loads(line[len(MARKER) :])
            duration_s = raw["duration_us"] / 1e6
            return WrkResult(
                requests=raw["requests"],
                duration_s=duration_s,
                rps=raw["requests"] / duration_s if duration_s > 0 else 0.0,
                p50_ms=raw["p50_us"] / 1000,
                p90_ms=raw["p90_us"] / 1000,
                p99_ms=raw["p99_us"] / 1000,
                max_ms=raw["max_us"] / 1000,
                non_2xx=raw["non_2xx"],
                socket_errors=raw["connect_errors"]
                + raw["read_errors"]
                + raw["write_errors"]
                + raw["timeouts"],
            )
    raise LoadError(f"wrk printed no summary:\n{stdout[-2000:]}")


class WrkRun:
    """wrk running in the background: `interrupt()` stops it early (SIGINT: wrk still prints its
    summary), `result()` waits for it and parses the summary."""

    def __init__(
        self,
        base_url: str,
        *,
        paths: Sequence[str],
        tokens: Sequence[str] = (),
        credential_header: str = "authorization",
        body: bytes | None = None,
        connections: int,
        duration_s: float,
        threads: int | None = None,
        timeout_s: float = 5.0,
    ) -> None:
        if not paths:
            raise ValueError("wrk needs at least one path")
        self.duration_s = duration_s
        threads = threads or min(2, connections)
        self._tmp = tempfile.TemporaryDirectory(prefix="stoa-wrk-")
        folder = Path(self._tmp.name)
        script = folder / "rotate.lua"
        script.write_text(LUA)
        path_file = folder / "paths.txt"
        path_file.write_text("\n".join(paths) + "\n")
        token_arg = "-"
        if tokens:
            token_file = folder / "tokens.txt"
            token_file.write_text("\n".join(tokens) + "\n")
            token_arg = str(token_file)
        body_arg = "-"
        if body is not None:
            body_file = folder / "body.json"
            body_file.write_bytes(body)
            body_arg = str(body_file)
        argv = [
            wrk_binary(),
            "-t",
            str(threads),
            "-c",
            str(connections),
            "-d",
            f"{max(1, round(duration_s))}s",
            "--timeout",
            f"{timeout_s:g}s",
            "-s",
            str(script),
            base_url,
            "--",
            str(path_file),
            token_arg,
            str(threads),
            credential_header.lower(),
            body_arg,
        ]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def interrupt(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)

    def result(self) -> WrkResult:
        try:
            stdout, stderr = self.proc.communicate(timeout=self.duration_s + 60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            raise LoadError("wrk did not finish") from None
        finally:
            self._tmp.cleanup()
        if self.proc.returncode not in (0, -signal.SIGINT):
            raise LoadError(f"wrk exited with {self.proc.returncode}: {stderr[-2000:]}")
        return parse(stdout)

    def __enter__(self) -> WrkRun:
        return self

    def __exit__(self, *_exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._tmp.cleanup()


def run_wrk(base_url: str, **options: Any) -> WrkResult:
    """Run wrk against `base_url` to the end (options as for WrkRun) and return its summary."""
    with WrkRun(base_url, **options) as run:
        return run.result()
