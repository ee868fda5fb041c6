"""What the translator (and the Link's guard before it) says when an inventory cannot be published."""

from __future__ import annotations

from stoa_proto import inventory_pb2

FailureReason = inventory_pb2.FailureReason


class Refusal(Exception):
    """An inventory that will not be published; `reason` is a `FailureReason` value."""

    def __init__(self, reason: int, detail: str) -> None:
        super().__init__(f"{FailureReason.Name(reason)}: {detail}")
        self.reason = reason
        self.detail = detail


def invalid(detail: str) -> Refusal:
    return Refusal(FailureReason.INVALID_INVENTORY, detail)
