"""token_budget → the processing service (`envoy.filters.http.ext_proc`): tokens of OpenAI-compatible
chat completions counted per consumer or per tenant and window, in the quota store (PostgreSQL).

The route sends the service the buffered request body (to read `max_tokens`, reserved before the
request goes upstream) and the response (to settle from its `usage`; the service switches a
server-sent event stream to streamed mode itself). The rules travel in the service's policy set with
the policy id (`stoa.proc.v1.TokenBudgetRule`): every route under one policy shares its counters.
"""

from __future__ import annotations

from dataclasses import dataclass

from envoy.extensions.filters.http.ext_proc.v3 import ext_proc_pb2
from stoa_proto import proc_pb2

from stoa_translate.filters import EXT_PROC_FILTER, ext_proc_filter, ext_proc_route
from stoa_translate.policies.kind import ConfigError, PolicyKind, mirrored

PER = ("consumer", "tenant")
# Reserved for a request without max_tokens when the policy names no default.
DEFAULT_MAX_TOKENS = 1024


@dataclass(frozen=True)
class TokenBudget:
    policy_id: str
    tokens: int
    window_seconds: int
    billed: bool
    per: str
    default_max_tokens: int

    @property
    def request_buffer_bytes(self) -> int:
        # The request body is read whole (its max_tokens), at the default body limit.
        return 0

    @property
    def sends_request_headers(self) -> bool:
        # The consumer a reservation is counted for, and the default reserved for a request without
        # a body (no body message follows), come with the request headers.
        return True

    def config(self) -> proc_pb2.TokenBudget:
        return mirrored(self, proc_pb2.TokenBudget)

    def message(self) -> proc_pb2.TokenBudgetRule:
        return proc_pb2.TokenBudgetRule(policy_id=self.policy_id, budget=self.config())


def parse(policy_id: str, config: proc_pb2.TokenBudget) -> TokenBudget:
    if config.tokens < 1:
        raise ConfigError("tokens", "is required: a whole number of at least 1")
    if config.window_seconds < 1:
        raise ConfigError("windowSeconds", "is required: a whole number of at least 1")
    if config.per not in PER:
        raise ConfigError("per", f"is required: one of {', '.join(PER)}")
    default = config.default_max_tokens or min(DEFAULT_MAX_TOKENS, config.tokens)
    if default > config.tokens:
        raise ConfigError("defaultMaxTokens", "must not exceed tokens (such a reservation never fits)")
    return TokenBudget(policy_id, config.tokens, config.window_seconds, config.billed, config.per, default)


def normalised(budget: TokenBudget) -> proc_pb2.TokenBudget:
    return budget.config()


def route_config(route_id: str, budget: TokenBudget) -> ext_proc_pb2.ExtProcPerRoute:
    # Reserved at the request (its headers name the consumer), settled from the response's usage.
    return ext_proc_route(
        route_id, request_headers=True, request_body=True, response_headers=True, response_body=True
    )


KIND = PolicyKind(
    "token_budget", EXT_PROC_FILTER, proc_pb2.TokenBudget, parse, normalised, ext_proc_filter, route_config
)
