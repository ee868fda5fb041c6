"""Settings that decide whether the service can enforce at all."""

from __future__ import annotations

from stoa_authz.health import Readiness
from stoa_authz.policy import PolicyStore, compile_policy_set
from stoa_authz.settings import Settings, check


def test_blank_audience_is_no_audience(idp, policy, monkeypatch) -> None:
    monkeypatch.setenv("STOA_AUTHZ_AUDIENCE", "   ")
    settings = Settings()
    assert any("AUDIENCE is not set" in warning for warning in check(settings))
    store = PolicyStore()
    store.add(compile_policy_set(policy(idp)))
    # As serve() wires it: readiness follows the audience the decisions use.
    readiness = Readiness(bool(settings.audience), store)
    assert not readiness.ready
    assert readiness.reason() == "not_configured"
