"""The processing service through a real Envoy fed by the real CP and Link: guardrails on a
chat-completion route in front of the fake model, streamed and not, the bypasses, the size limit
before any body is read (with the authorization hop in front), a processing service that is down;
transform; and compression, which Envoy does itself (no stream to the service).
"""

from __future__ import annotations

import gzip
import json
import os
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import brotli
import httpx
import pytest
import zstandard
from stoa_harness.cp_client import CPError
from stoa_harness.estate import Estate, EstateOptions
from stoa_harness.wait import wait_until
from stoa_proc.decode import Limits, decompress
from stoa_proto.bodies import DENY_BODIES, PROC_BODIES

TENANT = "proc"
LIMIT = 2048
SECRET = "forbidden fruit"
GUARDRAILS = {
    "direction": "both",
    "maxBodyBytes": LIMIT,
    "blockPatterns": [SECRET],
    "pii": {"kinds": ["email", "card"], "action": "redact"},
    "jsonSchema": {
        "type": "object",
        "required": ["messages"],
        "properties": {"messages": {"type": "array", "items": {"type": "object", "required": ["role"]}}},
    },
}


# The same request rules, inspection only (PII blocked, not redacted): Envoy sends the service the
# body alone, and holds the request headers until the service has let it through.
INSPECTED = {**GUARDRAILS, "direction": "request", "pii": {"kinds": ["email", "card"], "action": "block"}}
# Each request rule holds on both shapes of exchange.
GUARDED = pytest.mark.parametrize("api", ["chat", "inspected"])

SQUEEZE_MIN = 1024

TRANSFORM = {
    "request": {
        "headers": {"set": {"x-tier": "gold"}, "remove": ["x-debug"]},
        "json": [{"op": "set", "path": "/temperature", "value": 0.2}, {"op": "remove", "path": "/user"}],
    },
    "response": {
        "headers": {"set": {"x-served-by": "stoa"}},
        "json": [{"op": "rename", "path": "/method", "to": "/verb"}],
    },
}


@pytest.fixture(scope="module")
def estate(estates) -> Estate:
    estate = estates(EstateOptions(proc=True), "proc")
    model = f"{estate.llm.url}/v1"
    estate.publish("chat", tenant_id=TENANT, upstream_url=model, methods=["POST"])
    estate.publish("plain", tenant_id=TENANT, upstream_url=model, methods=["POST"])
    estate.admin.add_policy("chat-guard", "guardrails", GUARDRAILS, tenant_id=TENANT, targets=["chat"])
    estate.publish("inspected", tenant_id=TENANT, upstream_url=model, methods=["POST"])
    estate.admin.add_policy("inspect", "guardrails", INSPECTED, tenant_id=TENANT, targets=["inspected"])
    # Guardrails and a transform on one route (one processing stream, the union of their phases),
    # in front of the echo upstream, which shows what it received.
    estate.publish("shaped", tenant_id=TENANT, methods=["POST"])
    estate.admin.add_policy(
        "shaped-guard", "guardrails", {"blockPatterns": [SECRET]}, tenant_id=TENANT, targets=["shaped"]
    )
    estate.admin.add_policy("shaped-transform", "transform", TRANSFORM, tenant_id=TENANT, targets=["shaped"])
    # Compression alone (echo upstream), and after the response guardrails' redaction (the model).
    estate.publish("squeezed", tenant_id=TENANT, methods=["GET"])
    estate.admin.add_policy(
        "squeeze",
        "compression",
        {"algorithms": ["gzip", "br", "zstd"], "minBytes": SQUEEZE_MIN},
        tenant_id=TENANT,
        targets=["squeezed"],
    )
    estate.publish("chat-squeezed", tenant_id=TENANT, upstream_url=model, methods=["POST"])
    estate.admin.add_policy(
        "chat-squeezed-guard",
        "guardrails",
        {"direction": "response", "pii": {"kinds": ["email"], "action": "redact"}},
        tenant_id=TENANT,
        targets=["chat-squeezed"],
    )
    estate.admin.add_policy(
        "chat-squeeze", "compression", {"algorithms": ["gzip"]}, tenant_id=TENANT, targets=["chat-squeezed"]
    )
    estate.admin.wait_synced()
    return estate


@pytest.fixture(autouse=True)
def fresh(estate: Estate) -> None:
    estate.llm.clear()
    estate.llm.script(["Hello", " there."])


def chat(estate: Estate, body: bytes | dict, api: str = "chat", **headers: str) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"content-type": "application/json", **{k.replace("_", "-"): v for k, v in headers.items()}}
    return estate.gateway.post(estate.url(f"/apis/{api}/chat/completions"), content=content, headers=headers)


def ask(text: str, **extra: object) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": text}], **extra}


def streams_started(estate: Estate) -> int:
    return estate.envoy.counters(r"ext_proc\..*streams_started$")


def model_requests_started(estate: Estate) -> int:
    """Requests Envoy began to the model (headers sent), whether or not their body followed."""
    port = httpx.URL(estate.llm.url).port
    return estate.envoy.counters(rf"cluster\.backend_http_127\.0\.0\.1_{port}\.upstream_rq_total$")


def test_a_clean_request_and_answer_pass_and_only_guarded_routes_open_a_stream(estate: Estate) -> None:
    before = streams_started(estate)
    response = chat(estate, ask("hi"))
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "Hello there."
    assert streams_started(estate) == before + 1
    # The same body on a route without a body policy: no processing stream at all.
    assert chat(estate, ask(f"the {SECRET}"), api="plain").status_code == 200
    assert streams_started(estate) == before + 1


@GUARDED
def test_request_guardrails_and_bypasses(estate: Estate, api: str) -> None:
    logged_before = len(estate.site.proc_events("ext_proc_decision"))
    started = model_requests_started(estate)
    full_width = "".join(chr(ord(c) + 0xFEE0) for c in "forbidden")
    cases = [
        (ask("tell me about the FORBIDDEN fruit"), 403, PROC_BODIES["guardrail_blocked"]),
        # Escaped in the JSON, full-width in the text: decoded and normalised before matching.
        (b'{"messages":[{"role":"user","content":"the forbidden \\u0066ruit"}]}', 403, None),
        (ask(f"the {full_width} fruit"), 403, None),
        (b'{"messages":[{"role":"user","content":"x","content":"y"}]}', 400, DENY_BODIES[400]),
        (b'{"messages":', 400, DENY_BODIES[400]),
        (b"\xff\xfe", 400, DENY_BODIES[400]),
        # A lone surrogate escape: no Unicode text to inspect (it was a 503, the service failing).
        (b'{"messages":[{"role":"user","content":"\\ud800 x"}]}', 400, DENY_BODIES[400]),
    ]
    for body, status, expected in cases:
        response = chat(estate, body, api)
        assert response.status_code == status, body
        assert response.headers["content-type"] == "application/json"
        if expected is not None:
            assert response.content == expected
    schema = chat(estate, {"messages": [{"role": "user"}, {"content": "no role"}]}, api)
    assert schema.status_code == 422
    assert schema.json() == {
        "error": "schema_invalid",
        "message": "The request body does not match the expected schema.",
        "path": "$.messages[1]",
    }
    assert estate.llm.requests() == [], "a refused request reached the model"
    # Not even its headers (Envoy holds them until the service has let the body through).
    assert model_requests_started(estate) == started
    assert chat(estate, ask("hello"), api).status_code == 200
    assert model_requests_started(estate) == started + 1

    # Each refusal is one decision event with its closed reason, and no body content.
    # The service writes its log in batches, a moment after it answers (an earlier test's event may
    # come after this test began): wait for this test's eight events, its last one included.
    def logged() -> list[dict]:
        return estate.site.proc_events("ext_proc_decision")[logged_before:]  # type: ignore[union-attr]

    events = wait_until(
        lambda: (e := logged()) and any(x["reason"] == "schema_invalid" for x in e) and len(e) >= 8 and e,
        10,
        "decision events",
    )
    reasons = [e["reason"] for e in events]
    assert reasons.count("guardrail_blocked") == 3
    assert reasons.count("schema_invalid") == 1
    assert not any(SECRET in json.dumps(e) for e in events)
    # The request id Envoy gave each exchange, from the body message's attributes.
    assert all(len(e["request_id"]) == 36 for e in events[-8:])


def test_numbers_forms_invisible_characters_and_undeclared_json_do_not_slip_the_request_guardrails(
    estate: Estate,
) -> None:
    cases = [
        # A card number sent as a JSON number, a pattern split by a zero-width space, a form body's
        # percent-escapes (the upstream decodes them).
        (b'{"messages":[{"role":"user","content":"pay"}],"card":4111111111111111}', "application/json"),
        (json.dumps(ask("the forbidden\u200b fruit")).encode(), "application/json"),
        (b"q=the+forbidden%20fruit", "application/x-www-form-urlencoded"),
        # Text in the charset it declares (valid UTF-8 too: ASCII and NULs), as the upstream reads it.
        ("the forbidden fruit".encode("utf-16-le"), "text/plain; charset=utf-16le"),
    ]
    for body, content_type in cases:
        response = chat(estate, body, "inspected", content_type=content_type)
        assert (response.status_code, response.content) == (403, PROC_BODIES["guardrail_blocked"]), body
    # JSON the client did not declare JSON (an upstream may parse it anyway) is held to the schema.
    off_schema = b'{"messages":[{"content":"no role"}]}'
    response = chat(estate, off_schema, "inspected", content_type="text/plain")
    assert (response.status_code, response.json()["path"]) == (422, "$.messages[0]")
    assert estate.llm.requests() == []


@GUARDED
def test_compressed_request_is_inspected_and_a_bomb_is_413(estate: Estate, api: str) -> None:
    secret = json.dumps(ask(f"the {SECRET}")).encode()
    for encoding, packed in (
        ("gzip", gzip.compress(secret)),
        ("br", brotli.compress(secret)),
        ("zstd", zstandard.ZstdCompressor().compress(secret)),
        ("gzip, br", brotli.compress(gzip.compress(secret))),  # layered: undone last first
    ):
        assert chat(estate, packed, api, content_encoding=encoding).status_code == 403, encoding
    zstd_bomb = zstandard.ZstdCompressor().compress(b" " * (LIMIT * 100))
    assert chat(estate, zstd_bomb, api, content_encoding="zstd").status_code == 413
    clean = gzip.compress(json.dumps(ask("hello")).encode())
    assert chat(estate, clean, api, content_encoding="gzip").status_code == 200
    # Decompression is for inspection: the model gets the body as sent.
    [arrived] = estate.llm.requests()
    assert arrived.headers["content-encoding"] == "gzip"
    assert arrived.body == clean
    assert arrived.headers["content-length"] == str(len(clean))
    bomb = gzip.compress(b" " * (LIMIT * 100))
    response = chat(estate, bomb, api, content_encoding="gzip")
    assert (response.status_code, response.content) == (413, PROC_BODIES["too_large"])


@GUARDED
def test_size_limit_is_413_before_the_body_and_never_a_stall(estate: Estate, api: str) -> None:
    big = json.dumps(ask("x" * (LIMIT * 2))).encode()
    response = chat(estate, big, api)
    assert (response.status_code, response.content) == (413, PROC_BODIES["too_large"])

    # Chunked (no content-length) and larger than Envoy's own buffer, with the authorization hop in
    # front: a 413 well within the client's timeout, not a stall.
    def chunks() -> Iterator[bytes]:
        for _ in range(48):
            yield b" " * 65536

    response = httpx.post(
        estate.url(f"/apis/{api}/chat/completions"),
        content=chunks(),
        headers={"content-type": "application/json"},
        timeout=5,
    )
    assert (response.status_code, response.content) == (413, PROC_BODIES["too_large"])
    assert estate.llm.requests() == []


def test_pii_is_redacted_and_content_length_fixed(estate: Estate) -> None:
    response = chat(estate, ask("mail bob@example.com, card 4111 1111 1111 1111"))
    assert response.status_code == 200
    [arrived] = estate.llm.requests()
    assert json.loads(arrived.body)["messages"][0]["content"] == "mail [redacted], card [redacted]"
    assert arrived.headers["content-length"] == str(len(arrived.body))


def test_response_guardrails_buffered_and_compressed(estate: Estate) -> None:
    estate.llm.script(["the forbidden", " fruit is here"])
    assert chat(estate, ask("hi")).status_code == 403
    estate.llm.script(["the forbidden", " fruit is here"], gzip_body=True)
    assert chat(estate, ask("hi")).status_code == 403
    estate.llm.script(["write to ", "alice@example.org"], gzip_body=True)
    response = chat(estate, ask("hi"))
    assert response.status_code == 200
    assert "content-encoding" not in response.headers
    assert response.json()["choices"][0]["message"]["content"] == "write to [redacted]"


def stream(estate: Estate, text: str) -> str:
    with httpx.stream(
        "POST", estate.url("/apis/chat/chat/completions"), json=ask(text, stream=True), timeout=10
    ) as response:
        assert response.status_code == 200
        return b"".join(response.iter_bytes()).decode()


def test_streamed_answer_with_a_split_pattern_ends_with_an_error_event(estate: Estate) -> None:
    estate.llm.script(["Sure: the forb", "idden fr", "uit grows", " on trees."])
    text = stream(estate, "hi")
    assert "Sure: the forb" in text  # what came before the match was passed
    assert "uit grows" not in text
    assert "on trees" not in text
    assert text.endswith('event: error\ndata: {"error": "guardrail_blocked"}\n\n')

    estate.llm.script(["All", " good."])
    text = stream(estate, "hi")
    assert '"content": " good."' in text
    assert text.endswith("data: [DONE]\n\n")


def sse_chunk(delta: dict, end: str = "\n\n") -> bytes:
    # Non-ASCII unescaped, as a JavaScript server writes JSON.
    return (
        f"data: {json.dumps({'choices': [{'index': 0, 'delta': delta}]}, ensure_ascii=False)}{end}".encode()
    )


@pytest.mark.parametrize(
    ("events", "stream_type"),
    [
        # Events ended by LF then CR (the format allows it; every client's parser sees two events),
        # under a media type in capitals: each split half, then the error.
        (
            [sse_chunk({"content": "the forb"}, "\n\r"), sse_chunk({"content": "idden fruit"}, "\n\r")],
            "Text/Event-Stream",
        ),
        # A line separator inside the JSON (one line for the format), and the text in a tool call.
        ([sse_chunk({"content": f"the {SECRET} \u2028"})], "text/event-stream"),
        (
            [sse_chunk({"tool_calls": [{"index": 0, "function": {"name": "say", "arguments": SECRET}}]})],
            "text/event-stream",
        ),
    ],
)
def test_a_streamed_answer_is_inspected_as_a_client_reads_it(
    estate: Estate, events: list[bytes], stream_type: str
) -> None:
    estate.llm.script([], events=events, stream_type=stream_type)
    text = stream(estate, "hi")
    assert "fruit" not in text
    assert text.endswith('event: error\ndata: {"error": "guardrail_blocked"}\n\n')


def test_an_event_stream_under_another_media_type_is_inspected_as_one(estate: Estate) -> None:
    # A client that asked for a stream reads the answer as events whatever its type: buffered, the
    # text it would reconstruct is inspected as well.
    events = [sse_chunk({"content": "the forb"}), sse_chunk({"content": "idden fruit"})]
    estate.llm.script([], events=events, stream_type="text/plain")
    response = httpx.post(estate.url("/apis/chat/chat/completions"), json=ask("hi", stream=True), timeout=10)
    assert (response.status_code, response.content) == (403, PROC_BODIES["guardrail_blocked"])
    estate.llm.script(
        [], events=[sse_chunk({"content": "all"}), sse_chunk({"content": " good"})], stream_type="text/plain"
    )
    response = httpx.post(estate.url("/apis/chat/chat/completions"), json=ask("hi", stream=True), timeout=10)
    assert response.status_code == 200
    assert response.text.count("data: ") == 2


def test_a_bad_pattern_is_refused_by_the_cp(estate: Estate) -> None:
    with pytest.raises(CPError) as refused:
        estate.admin.create_policy(
            "bad-guard", "guardrails", {"blockPatterns": ["(?<=x)y"]}, tenant_id=TENANT, targets=["plain"]
        )
    assert refused.value.response.status_code == 422
    assert refused.value.fields == ["config.blockPatterns[0]"]


def test_service_down_is_503_with_retry_after(estate: Estate) -> None:
    estate.proc.stop()
    try:
        response = chat(estate, ask("hi"))
        assert response.status_code == 503
        assert response.content == DENY_BODIES[503]
        assert response.headers["retry-after"] == "1"
        assert estate.llm.requests() == []
        # On a route that sends the service the body alone, the same (another path in Envoy: the
        # stream opens at the body, the headers held behind it): nothing of it was started upstream.
        started = model_requests_started(estate)
        response = chat(estate, ask("hi"), api="inspected")
        assert (response.status_code, response.content) == (503, DENY_BODIES[503])
        assert response.headers["retry-after"] == "1"
        assert model_requests_started(estate) == started
        # A route without a body policy never reaches the service: it answers with the service down.
        assert chat(estate, ask("hi"), api="plain").status_code == 200
    finally:
        estate.proc.start()
        wait_until(
            lambda: httpx.get(f"{estate.site.proc_http_url}/health/ready").status_code == 200,
            30,
            "stoa-proc ready again",
        )
    assert chat(estate, ask("hi")).status_code == 200


def test_service_failing_while_the_model_answers_is_503_and_the_post_is_not_retried(estate: Estate) -> None:
    # The model holds its answer; the service goes away meanwhile, with the exchange's stream open.
    estate.llm.script(["late"], pause_s=3)
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(chat, estate, ask("hi"))
        wait_until(lambda: len(estate.llm.requests()) == 1, 10, "the model got the request")
        estate.proc.stop()
        try:
            response = pending.result(timeout=15)
        finally:
            estate.proc.start()
    assert response.status_code == 503
    assert response.content == DENY_BODIES[503]
    assert response.headers["retry-after"] == "1"
    assert len(estate.llm.requests()) == 1, "Envoy sent the POST to the model again"
    wait_until(
        lambda: httpx.get(f"{estate.site.proc_http_url}/health/ready").status_code == 200,
        30,
        "stoa-proc ready again",
    )


def test_a_service_up_but_past_its_timeout_is_503_and_the_post_is_not_retried(estate: Estate) -> None:
    timeouts = estate.envoy.counters(r"ext_proc\..*message_timeouts$")
    # Frozen (its port open, answering nothing) before the request: Envoy's message timeout, a 503,
    # and the model never reached.
    started = model_requests_started(estate)
    with estate.proc.frozen():
        response = chat(estate, ask("hi"))
        inspected = chat(estate, ask("hi"), api="inspected")  # the body alone, the headers held
    for answer in (response, inspected):
        assert (answer.status_code, answer.content) == (503, DENY_BODIES[503])
        assert answer.headers["retry-after"] == "1"
    assert estate.llm.requests() == []
    assert model_requests_started(estate) == started
    # Frozen while the model holds its answer: the answer's message times out, a 503 again, and the
    # POST reached the model once.
    estate.llm.script(["late"], pause_s=1)
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(chat, estate, ask("hi"))
        wait_until(lambda: len(estate.llm.requests()) == 1, 10, "the model got the request")
        with estate.proc.frozen():
            response = pending.result(timeout=15)
    assert (response.status_code, response.content) == (503, DENY_BODIES[503])
    assert response.headers["retry-after"] == "1"
    assert len(estate.llm.requests()) == 1, "Envoy sent the POST to the model again"
    assert estate.envoy.counters(r"ext_proc\..*message_timeouts$") == timeouts + 3
    # Thawed, it answers in time again.
    estate.llm.script(["Hello"])
    assert chat(estate, ask("hi")).status_code == 200


def test_transform_edits_both_ways_beside_guardrails(estate: Estate) -> None:
    estate.upstream.clear()
    response = chat(estate, {"user": "u-1", "q": "hi"}, api="shaped", x_debug="1")
    assert response.status_code == 200
    assert response.headers["x-served-by"] == "stoa"
    echoed = response.json()
    assert echoed["verb"] == "POST"
    assert "method" not in echoed
    [arrived] = estate.upstream.arrivals()
    assert json.loads(arrived.body) == {"q": "hi", "temperature": 0.2}
    assert arrived.header("x-tier") == "gold"
    assert arrived.header("x-debug") is None
    assert arrived.header("content-length") == str(len(arrived.body))
    # The guardrails of the same route still hold, and a request that is not JSON is refused.
    assert chat(estate, {"q": SECRET}, api="shaped").status_code == 403
    assert chat(estate, b"plain words", api="shaped", content_type="text/plain").status_code == 400
    assert len(estate.upstream.arrivals()) == 1


def raw_get(estate: Estate, path: str, **headers: str) -> tuple[httpx.Response, bytes]:
    """The response and its body exactly as sent (httpx would decode it)."""
    sent = {name.replace("_", "-"): value for name, value in headers.items()}
    with estate.gateway.stream("GET", estate.url(path), headers=sent) as response:
        return response, b"".join(response.iter_raw())


def test_compression_by_envoy_for_each_algorithm_above_the_threshold_only(estate: Estate) -> None:
    before = streams_started(estate)
    pad = "x" * (2 * SQUEEZE_MIN)
    for algorithm in ("gzip", "br", "zstd"):
        response, raw = raw_get(estate, "/apis/squeezed/big", accept_encoding=algorithm, x_pad=pad)
        assert response.status_code == 200
        assert response.headers["content-encoding"] == algorithm
        assert len(raw) < SQUEEZE_MIN
        plain = decompress(raw, algorithm, Limits(1 << 20, 1000))
        assert json.loads(plain)["headers"]["x-pad"] == pad
    # Equal preference: the one the client lists first.
    for first in ("gzip", "br", "zstd"):
        listed = ", ".join([first, *(a for a in ("zstd", "br", "gzip") if a != first)])
        response, _ = raw_get(estate, "/apis/squeezed/big", accept_encoding=listed, x_pad=pad)
        assert response.headers["content-encoding"] == first
    response, _ = raw_get(estate, "/apis/squeezed/big", accept_encoding="gzip;q=1, zstd;q=0.5", x_pad=pad)
    assert response.headers["content-encoding"] == "gzip"
    # Below the threshold, without an Accept-Encoding, or on a route without the policy: as it is.
    response, raw = raw_get(estate, "/apis/squeezed/small", accept_encoding="gzip")
    assert len(raw) < SQUEEZE_MIN
    assert "content-encoding" not in response.headers
    assert json.loads(raw)["path"].endswith("/small")
    response, raw = raw_get(estate, "/apis/squeezed/big", accept_encoding="identity", x_pad=pad)
    assert "content-encoding" not in response.headers
    assert json.loads(raw)["headers"]["x-pad"] == pad
    plain = chat(estate, ask("hi"), api="plain", accept_encoding="gzip")
    assert plain.status_code == 200
    assert "content-encoding" not in plain.headers
    # Envoy's compressor alone: no processing stream was opened for any of these.
    assert streams_started(estate) == before


def test_compression_applies_to_what_the_guardrails_passed(estate: Estate) -> None:
    estate.llm.script(["write to ", "alice@example.org"])
    with estate.gateway.stream(
        "POST",
        estate.url("/apis/chat-squeezed/chat/completions"),
        json=ask("hi"),
        headers={"accept-encoding": "gzip"},
    ) as response:
        raw = b"".join(response.iter_raw())
    assert response.status_code == 200
    assert response.headers["content-encoding"] == "gzip"
    answer = json.loads(gzip.decompress(raw))
    assert answer["choices"][0]["message"]["content"] == "write to [redacted]"


def test_a_service_killed_mid_stream_ends_the_stream_and_passes_nothing_more(estate: Estate) -> None:
    # The service goes away between two events of a streamed answer: what follows was never inspected,
    # so the client's stream ends there (never the rest of the model's answer), and nothing is retried.
    estate.llm.script(["first", " second", " third", " fourth"], pause_s=0.6)
    received = b""
    killed = False
    try:
        with httpx.stream(
            "POST", estate.url("/apis/chat/chat/completions"), json=ask("hi", stream=True), timeout=10
        ) as response:
            assert response.status_code == 200
            chunks = response.iter_bytes()
            try:
                while b'"first"' not in received:
                    received += next(chunks)
                assert estate.proc.proc is not None
                os.killpg(estate.proc.proc.pid, signal.SIGKILL)
                killed = True
                for chunk in chunks:
                    received += chunk
            except httpx.HTTPError:
                pass  # Envoy reset the stream: what a client of an interrupted answer sees
    finally:
        estate.proc.stop()
        estate.proc.start()  # the module's other tests need it, whatever happened here
    assert killed, f"the stream ended before its first event: {received!r}"
    text = received.decode()
    assert '"first"' in text
    assert " third" not in text
    assert " fourth" not in text
    assert "[DONE]" not in text
    assert len(estate.llm.requests()) == 1, "Envoy sent the POST to the model again"
    estate.llm.script(["All", " good."])
    assert stream(estate, "hi").endswith("data: [DONE]\n\n")
