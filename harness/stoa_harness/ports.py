"""Free loopback ports for the processes the harness starts."""

from __future__ import annotations

import socket
import threading

# Every port handed out by this process. A probe socket is closed before the process that will
# listen on its port starts, and the kernel picks ports for bind(0) at random, so it can pick the
# same free port twice: two processes of one test (a Site's Envoy admin and its stoa-authz, say)
# then race for it and the loser exits with "Address already in use".
_handed_out: set[int] = set()
_lock = threading.Lock()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now on `host` (the kernel picks it) and that this process has
    never handed out before."""
    with _lock:
        while True:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind((host, 0))
                port = int(sock.getsockname()[1])
            if port not in _handed_out:
                _handed_out.add(port)
                return port
