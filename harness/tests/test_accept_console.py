"""The console in a real headless Chromium against a real estate (CP + Link + Envoy): a tenant admin
signs in at the dev identity provider (authorization code + PKCE), creates and deploys an API, sees
it SYNCED live and it answers through Envoy; a refused write shows its field message next to the
field; a publication Envoy never acknowledges (Envoy stopped with SIGSTOP, past the ACK deadline)
shows FAILED with its reason; a tenant admin does not see another tenant; a platform admin sees
Envoy's detail and the preview. Each step leaves a screenshot under the test output directory
(`.stoa/test-output/console/`, or `$STOA_TEST_OUTPUT/console/`)."""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Callable, Iterator

import httpx
import pytest
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select
from stoa_harness.browser import Browser, output_dir
from stoa_harness.estate import Estate, EstateOptions
from stoa_harness.idp import DevIdentityProvider, DevUser

ACK_DEADLINE_S = 5
TENANT, OTHER = "acme", "globex"
USERS = (
    DevUser("ada", "ada-password", "platform_admin"),
    DevUser("alice", "alice-password", "tenant_admin", TENANT),
)


@pytest.fixture(scope="module")
def idp() -> Iterator[DevIdentityProvider]:
    with DevIdentityProvider(users=USERS) as provider:
        yield provider


@pytest.fixture(scope="module")
def estate(estates: Callable[..., Estate], idp: DevIdentityProvider) -> Estate:
    options = EstateOptions(
        cp_env={"STOA_CP_OIDC_ISSUERS": idp.issuer},
        link_env={"STOA_LINK_ACK_TIMEOUT_S": str(ACK_DEADLINE_S)},
    )
    running = estates(options, "console")
    running.admin.create_tenant(TENANT, "ACME")
    # Another tenant with an API on the same gateway: what the tenant admin must never see.
    running.publish("globex-ledger", tenant_id=OTHER, auth={"mode": "none"})
    running.admin.wait_synced()
    return running


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with Browser(output_dir("console")) as chromium:
        yield chromium


def sign_in(browser: Browser, estate: Estate, user: DevUser) -> None:
    browser.d.delete_all_cookies()
    browser.open(f"{estate.cp_url}/console")
    browser.d.execute_script("sessionStorage.clear()")
    browser.open(f"{estate.cp_url}/console")
    browser.css("#sign-in").click()
    browser.css("#username").send_keys(user.username)
    browser.css("#password").send_keys(user.password)
    browser.shot(f"sign-in-{user.username}")
    browser.css("#sign-in").click()
    browser.wait(lambda d: user.username in d.find_element(By.ID, "signed-in-as").text, what="signed in")


def status_box(browser: Browser, gateway_id: str = "gw-1"):
    return browser.css(f'.gateway-status[data-gateway="{gateway_id}"]')


def wait_state(browser: Browser, state: str, generation: int, timeout: float = 30) -> None:
    """The live status shows `state` for `generation` (read by the page itself, no reload)."""

    def shown(_driver) -> bool:
        box = status_box(browser)
        desired = box.find_elements(By.CSS_SELECTOR, 'dd[data-role="desired-generation"]')
        return (
            box.get_attribute("data-state") == state and bool(desired) and desired[0].text == str(generation)
        )

    try:
        browser.wait(shown, timeout, f"gw-1 {state} at generation {generation}")
    except TimeoutException:
        browser.shot(f"timeout-{state}-{generation}")
        raise AssertionError(
            f"gw-1 not {state} at {generation}: the page shows {status_box(browser).text!r}"
        ) from None


def fill_api(browser: Browser, api_id: str, upstream_url: str) -> None:
    form = browser.css("#new-apis")
    for name, value in (
        ("api_id", api_id),
        ("name", api_id.title()),
        ("upstream_url", upstream_url),
        ("methods", "GET"),
    ):
        field = form.find_element(By.NAME, name)
        field.clear()
        field.send_keys(value)
    Select(form.find_element(By.NAME, "auth.mode")).select_by_value("none")


def deployed_generation(browser: Browser, api_id: str) -> int:
    notice = browser.wait(
        lambda d: next(
            (p for p in d.find_elements(By.CSS_SELECTOR, "p.notice") if f"{api_id} deployed on" in p.text),
            False,
        ),
        what=f"{api_id} deployed",
    )
    return int(notice.text.rsplit("generation ", 1)[1].rstrip("."))


def test_a_tenant_admin_signs_in_creates_and_deploys_an_api_sees_it_synced_and_it_serves(browser, estate):
    sign_in(browser, estate, USERS[1])
    browser.wait(
        lambda d: d.find_element(By.CSS_SELECTOR, "h1").text == f"APIs of {TENANT}", what="APIs page"
    )
    browser.shot("01-tenant-admin-signed-in")
    # The tenant's pages are the CP's own: one per collection its OpenAPI document offers a tenant.
    paths = httpx.get(f"{estate.cp_url}/openapi.json", timeout=10).json()["paths"]
    offered = {
        match.group(1)
        for path, ops in paths.items()
        if (match := re.fullmatch(r"/v1/tenants/\{tenant_id\}/([a-z_-]+)", path))
        and {"get", "post"} <= ops.keys()
    }
    links = {
        a.get_attribute("href").rsplit("/", 1)[1] for a in browser.d.find_elements(By.CSS_SELECTOR, "#nav a")
    }
    assert offered >= {"apis", "policies", "issuers", "tools", "tool-grants"}
    assert offered <= links
    fill_api(browser, "orders", estate.upstream.url)
    browser.shot("02-api-form-filled")
    browser.css("#new-apis button[type=submit]").click()
    browser.css('#apis-table tr[data-id="orders"]')
    browser.shot("03-api-created")
    browser.css("#deploy-orders-gw-1").click()
    generation = deployed_generation(browser, "orders")
    wait_state(browser, "SYNCED", generation)
    browser.shot("04-deployed-synced", at=status_box(browser))
    answer = estate.gateway.get(estate.url("/apis/orders/hello"))
    assert answer.status_code == 200, answer.text
    assert answer.json()["method"] == "GET"
    assert [a.path for a in estate.upstream.arrivals()][-1].endswith("/hello")
    browser.open(estate.url("/apis/orders/hello"))
    browser.shot("05-called-through-envoy")
    # A collection added to the CP after the console (MCP tools) has its page, form included.
    browser.open(f"{estate.cp_url}/console#/t/{TENANT}/tools")
    browser.shot("05b-tools-page", at=browser.css("#new-tools"))


def test_a_refused_write_shows_the_field_message_next_to_the_field(browser, estate):
    browser.open(f"{estate.cp_url}/console#/t/{TENANT}/apis")
    fill_api(browser, "refused", "ftp://127.0.0.1/nowhere")
    browser.css("#new-apis button[type=submit]").click()
    error = browser.css("#new-apis-upstream_url-error")
    field = browser.css("#new-apis-upstream_url")
    assert "http://" in error.text, error.text
    assert field.get_attribute("aria-invalid") == "true"
    assert "new-apis-upstream_url-error" in field.get_attribute("aria-describedby")
    assert "upstream_url" in browser.css("#new-apis .form-errors[role=alert]").text
    browser.shot("06-refused-write-field-message", at=field)
    assert not browser.d.find_elements(By.CSS_SELECTOR, '#apis-table tr[data-id="refused"]')
    assert [a["api_id"] for a in estate.admin.apis(TENANT)] == ["orders"]


def test_a_publication_envoy_never_acknowledges_shows_failed_with_its_reason(browser, estate):
    estate.create_api("stalled", tenant_id=TENANT, auth={"mode": "none"})
    browser.open(f"{estate.cp_url}/console#/t/{TENANT}/apis")
    button = browser.css("#deploy-stalled-gw-1")
    envoy_pid = estate.envoy.pid
    assert envoy_pid is not None
    os.kill(envoy_pid, signal.SIGSTOP)  # connected but silent: the ACK never comes
    try:
        button.click()
        generation = deployed_generation(browser, "stalled")
        wait_state(browser, "FAILED", generation, timeout=5 * ACK_DEADLINE_S)
        reason = status_box(browser).find_element(By.CSS_SELECTOR, 'dd[data-role="reason"]').text
        browser.shot("07-publication-failed", at=status_box(browser))
    finally:
        os.kill(envoy_pid, signal.SIGCONT)
    assert reason == "ACK_TIMEOUT"
    # A tenant admin gets the reason, not Envoy's text (it may name other tenants' routes) ...
    assert not status_box(browser).find_elements(By.CSS_SELECTOR, 'dd[data-role="envoy-s-detail"]')
    # ... a platform admin gets both, on the gateway's page.
    sign_in(browser, estate, USERS[0])
    browser.open(f"{estate.cp_url}/console#/gateways/gw-1")
    assert browser.css('dd[data-role="reason"]').text == "ACK_TIMEOUT"
    detail = browser.css('dd[data-role="envoy-s-detail"]')
    assert "no ACK within" in detail.text
    browser.shot("08-platform-admin-sees-envoys-detail", at=detail)


def test_after_the_failure_an_edit_and_an_undeploy_publish_and_sync(browser, estate):
    sign_in(browser, estate, USERS[1])
    browser.open(f"{estate.cp_url}/console#/t/{TENANT}/apis")
    browser.css("#edit-stalled").click()
    name = browser.css("#edit-apis-name")
    assert name.get_attribute("value") == "stalled"
    name.clear()
    name.send_keys("Stalled, then edited")
    browser.css("#edit-apis button[type=submit]").click()
    browser.wait(
        lambda d: (
            d.find_element(By.CSS_SELECTOR, '#apis-table tr[data-id="stalled"] td[data-col="name"]').text
            == "Stalled, then edited"
        ),
        what="the edited name listed",
    )
    browser.css("#undeploy-stalled-gw-1").click()
    notice = browser.wait(
        lambda d: next(
            (p for p in d.find_elements(By.CSS_SELECTOR, "p.notice") if "undeployed" in p.text), False
        ),
        what="stalled undeployed",
    )
    wait_state(browser, "SYNCED", int(notice.text.rsplit("generation ", 1)[1].rstrip(".")))
    browser.shot("09-edited-undeployed-synced", at=status_box(browser))
    assert estate.admin.get_api("stalled", tenant_id=TENANT)["name"] == "Stalled, then edited"
    assert estate.gateway.get(estate.url("/apis/stalled/x")).status_code == 404
    assert estate.gateway.get(estate.url("/apis/orders/x")).status_code == 200


def test_a_tenant_admin_does_not_see_another_tenant(browser, estate):
    browser.open(f"{estate.cp_url}/console#/tenants")
    browser.css('#tenants-table tr[data-id="acme"]')
    options = [o.get_attribute("value") for o in Select(browser.css("#tenant-select")).options]
    assert options == [TENANT]
    assert not browser.d.find_elements(By.CSS_SELECTOR, f'#tenants-table tr[data-id="{OTHER}"]')
    browser.shot("10-tenants-of-a-tenant-admin")
    browser.open(f"{estate.cp_url}/console#/t/{OTHER}/apis")
    alert = browser.css("main [role=alert]")
    assert "404" in alert.text
    assert "globex-ledger" not in browser.d.page_source
    browser.shot("11-another-tenant-not-found")
    browser.open(f"{estate.cp_url}/console#/gateways/gw-1")
    deployed = browser.css("#deployments").text
    assert "orders" in deployed
    assert "globex-ledger" not in browser.d.page_source


def test_a_platform_admin_sees_the_rendered_configuration(browser, estate):
    sign_in(browser, estate, USERS[0])
    browser.open(f"{estate.cp_url}/console#/gateways/gw-1")
    browser.css("#show-preview").click()
    preview = browser.css("#preview-output pre")
    assert "globex-ledger" in preview.text
    assert "orders" in preview.text
    browser.shot("12-platform-admin-preview", at=preview)
