"""compression → Envoy's own compressor filter (`envoy.filters.http.compressor`): responses compressed
with gzip, br or zstd as the client's Accept-Encoding asks, above a size threshold. No processing
service on that path.

A route cannot override a compressor's algorithm or threshold, so the listener holds one compressor
per (algorithm, threshold) some route uses, each off unless a route switches it on; a route switches
on its algorithms at its threshold. The client's Accept-Encoding chooses: the highest q, and at equal
q the algorithm it lists first. Envoy's default content types apply (JSON, text,
XML, JavaScript…; never `text/event-stream`, so a streamed completion is not held back).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from envoy.config.core.v3 import extension_pb2
from envoy.extensions.compression.brotli.compressor.v3 import brotli_pb2
from envoy.extensions.compression.gzip.compressor.v3 import gzip_pb2
from envoy.extensions.compression.zstd.compressor.v3 import zstd_pb2
from envoy.extensions.filters.http.compressor.v3 import compressor_pb2
from google.protobuf import message, wrappers_pb2
from stoa_proto import inventory_pb2

from stoa_translate.filters import COMPRESSOR_FILTER, packed
from stoa_translate.policies.kind import ConfigError, PolicyKind, mirrored

# The order of the instances in the chain (which does not decide between them: the client does).
ALGORITHMS = ("zstd", "br", "gzip")
# Envoy's own default threshold, made explicit so that the stored config says what applies.
DEFAULT_MIN_BYTES = 30
_LIBRARIES: dict[str, tuple[str, message.Message]] = {
    "zstd": ("envoy.compression.zstd.compressor", zstd_pb2.Zstd()),
    "br": ("envoy.compression.brotli.compressor", brotli_pb2.Brotli()),
    "gzip": ("envoy.compression.gzip.compressor", gzip_pb2.Gzip()),
}


@dataclass(frozen=True)
class Compression:
    policy_id: str
    algorithms: tuple[str, ...]  # in ALGORITHMS order
    min_bytes: int

    def instances(self) -> list[str]:
        return [instance_name(algorithm, self.min_bytes) for algorithm in self.algorithms]


def instance_name(algorithm: str, min_bytes: int) -> str:
    return f"stoa.compressor.{algorithm}.{min_bytes}"


def parse(policy_id: str, config: inventory_pb2.CompressionPolicy) -> Compression:
    algorithms = list(config.algorithms)
    if not algorithms:
        raise ConfigError("algorithms", f"must name at least one of {', '.join(ALGORITHMS)}")
    for i, algorithm in enumerate(algorithms):
        if algorithm not in ALGORITHMS:
            raise ConfigError(f"algorithms[{i}]", f"must be one of {', '.join(ALGORITHMS)}")
    if len(set(algorithms)) != len(algorithms):
        raise ConfigError("algorithms", "must not repeat an algorithm")
    return Compression(
        policy_id,
        tuple(a for a in ALGORITHMS if a in algorithms),
        config.min_bytes or DEFAULT_MIN_BYTES,
    )


def normalised(rules: Compression) -> inventory_pb2.CompressionPolicy:
    return mirrored(rules, inventory_pb2.CompressionPolicy)


def _compressor(algorithm: str, min_bytes: int) -> compressor_pb2.Compressor:
    library, config = _LIBRARIES[algorithm]
    return compressor_pb2.Compressor(
        compressor_library=extension_pb2.TypedExtensionConfig(name=library, typed_config=packed(config)),
        response_direction_config=compressor_pb2.Compressor.ResponseDirectionConfig(
            common_config=compressor_pb2.Compressor.CommonDirectionConfig(
                min_content_length=wrappers_pb2.UInt32Value(value=min_bytes)
            )
        ),
    )


def listener_filters(used: Sequence[Compression]) -> list[tuple[str, message.Message]]:
    pairs = {(a, rules.min_bytes) for rules in used for a in rules.algorithms}
    ordered = sorted(pairs, key=lambda pair: (ALGORITHMS.index(pair[0]), pair[1]))
    return [(instance_name(a, n), _compressor(a, n)) for a, n in ordered]


def route_configs(route_id: str, rules: Compression) -> dict[str, message.Message]:
    # Any per-route config switches on a filter that is off on the listener; this one changes nothing.
    return {
        name: compressor_pb2.CompressorPerRoute(overrides=compressor_pb2.CompressorOverrides())
        for name in rules.instances()
    }


KIND = PolicyKind(
    "compression",
    COMPRESSOR_FILTER,
    inventory_pb2.CompressionPolicy,
    parse,
    normalised,
    None,
    None,
    listener_filters=listener_filters,
    route_configs=route_configs,
)
