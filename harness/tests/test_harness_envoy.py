"""The Envoy the harness runs is the pinned one."""

from pathlib import Path

from stoa_harness.envoy import envoy_version

REPO = Path(__file__).resolve().parents[2]


def test_envoy_binary_is_the_pinned_version() -> None:
    assert envoy_version() == (REPO / "envoy" / "VERSION").read_text().strip()
