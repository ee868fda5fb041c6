"""Link settings that shape what Envoy strips: a site adds identity headers, never removes one."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from stoa_link.settings import LinkSettings


def test_a_site_adds_identity_headers_by_name_or_prefix_in_any_case() -> None:
    settings = LinkSettings(extra_identity_headers=" X-Legacy-User, x-corp-* ,,x-legacy-user")
    assert settings.identity_headers_added == ("x-legacy-user", "x-corp-*")


def test_no_extra_identity_headers_by_default() -> None:
    assert LinkSettings().identity_headers_added == ()


@pytest.mark.parametrize("value", ["x user", "x-a:b", "*", "x-é", "x-*-y"])
def test_something_that_is_not_a_header_name_refuses_start_up(value: str) -> None:
    with pytest.raises(ValidationError, match="not a header name"):
        LinkSettings(extra_identity_headers=value)


def test_decision_settings_are_read_as_the_authorization_service_reads_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("STOA_LINK_AUDIENCE", " stoa ")
    monkeypatch.setenv("STOA_LINK_REQUIRED_SCOPES", "orders:read, admin")
    settings = LinkSettings()
    assert (settings.audience, settings.required_scopes) == ("stoa", ["orders:read", "admin"])


def test_a_blank_required_scope_refuses_run_as_it_refuses_the_authorization_service() -> None:
    settings = LinkSettings(
        cp_url="http://127.0.0.1:1",
        gateway_id="g",
        gateway_credential="c",
        required_scopes="orders:read, ,admin",
    )
    assert settings.required_scopes == ["orders:read", "", "admin"]
    with pytest.raises(ValueError, match="STOA_LINK_REQUIRED_SCOPES has a blank entry"):
        settings.require_run_settings()
