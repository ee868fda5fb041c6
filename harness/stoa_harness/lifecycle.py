"""What every part the harness starts shares: `with part:` starts it and stops it, and a start that
fails half-way stops what it had already started (no process or thread is left behind)."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class Lifecycle:
    def start(self) -> Self:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
