"""The ExternalProcessor over a real gRPC channel: one stream per exchange, messages in Envoy's order,
the route and policy-set version read from the stream's metadata; and the ADS client's ACK/NACK."""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import AsyncIterator

import grpc
import pytest
from envoy.config.core.v3.base_pb2 import HeaderMap, HeaderValue
from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
from envoy.service.discovery.v3 import ads_pb2_grpc
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryResponse
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc
from envoy.service.ext_proc.v3.external_processor_pb2 import HttpBody, HttpHeaders, ProcessingRequest
from google.protobuf import any_pb2, struct_pb2
from stoa_harness.wait import wait_until_async
from stoa_proc.ads import TYPE_URL, subscribe
from stoa_proc.log import DecisionLog
from stoa_proc.policy import PolicyStore, compile_policy_set
from stoa_proc.process import ProcessingService
from stoa_proto import proc_pb2, processing
from stoa_proto.bodies import DENY_BODIES, PROC_BODIES
from stoa_proto.processing import ROUTE_METADATA, VERSION_METADATA
from stoa_translate.policies import KINDS

LIMIT = 4096


def policy_set(version: str = "v1") -> proc_pb2.ProcPolicySet:
    schema = struct_pb2.Struct()
    schema.update({"type": "object", "properties": {"n": {"type": "integer"}}})
    message = proc_pb2.ProcPolicySet(name="default", version=version)
    shaped = message.routes.add(route_id="shaped", tenant_id="acme", api_id="shaped")
    shaped.transform.request.headers.set["x-tier"] = "gold"
    shaped.transform.request.headers.remove.append("x-debug")
    shaped.transform.request.json.add(op="set", path="/temperature").value.number_value = 0.5
    shaped.transform.request.json.add(op="remove", path="/user")
    shaped.transform.response.json.add(op="rename", path="/usage", to="/billing")
    message.routes.add(
        route_id="chat",
        tenant_id="acme",
        api_id="chat",
        guardrails=proc_pb2.Guardrails(
            direction="both",
            max_body_bytes=LIMIT,
            block_patterns=["forbidden fruit"],
            pii=proc_pb2.PiiRule(kinds=["email"], action="redact"),
            json_schema=schema,
        ),
    )
    for route in message.routes:
        # As the translator publishes them: in its normal form.
        for kind in ("guardrails", "transform"):
            if route.HasField(kind):
                rules = getattr(route, kind)
                rules.CopyFrom(KINDS[kind].normalised(KINDS[kind].parse("", rules)))
    return message


@pytest.fixture(scope="module")
async def processor() -> AsyncIterator[tuple[external_processor_pb2_grpc.ExternalProcessorStub, DecisionLog]]:
    store = PolicyStore()
    store.add(compile_policy_set(policy_set(), LIMIT))
    decisions = DecisionLog()
    server = grpc.aio.server()
    external_processor_pb2_grpc.add_ExternalProcessorServicer_to_server(
        ProcessingService(store, decisions, max_ratio=20, max_body_bytes=LIMIT), server
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield external_processor_pb2_grpc.ExternalProcessorStub(channel), decisions
    await server.stop(grace=None)


def headers(end: bool = False, **values: str) -> HttpHeaders:
    return HttpHeaders(
        headers=HeaderMap(
            headers=[HeaderValue(key=k.replace("_", "-"), raw_value=v.encode()) for k, v in values.items()]
        ),
        end_of_stream=end,
    )


async def exchange(stub, messages: list[ProcessingRequest], route: str = "chat", version: str = "v1"):
    call = stub.Process(metadata=((ROUTE_METADATA, route), (VERSION_METADATA, version)))
    answers = []
    for message in messages:
        await call.write(message)
        answer = await call.read()
        answers.append(answer)
        if answer.HasField("immediate_response"):
            break
    await call.done_writing()
    return answers


def request(body: bytes, **values: str) -> list[ProcessingRequest]:
    return [
        ProcessingRequest(request_headers=headers(content_type="application/json", **values)),
        ProcessingRequest(request_body=HttpBody(body=body, end_of_stream=True)),
    ]


def body_only(body: bytes, **values: str) -> list[ProcessingRequest]:
    """What Envoy sends on a route that skips the request-headers message: the buffered body alone,
    what the service reads of the headers as the stream's request attributes."""
    attributes = struct_pb2.Struct()
    names = {"content_type": processing.CONTENT_TYPE, "content_encoding": processing.CONTENT_ENCODING}
    attributes.update(
        {names.get(k, processing.REQUEST_ID): v for k, v in {"x_request_id": "rid", **values}.items()}
    )
    message = ProcessingRequest(request_body=HttpBody(body=body, end_of_stream=True))
    message.attributes[processing.ATTRIBUTES_KEY].CopyFrom(attributes)
    return [message]


SHAPES = {
    "headers and body": lambda body, **values: request(body, **values),
    "body alone": lambda body, **values: body_only(body, content_type="application/json", **values),
}


async def test_declared_size_over_the_limit_is_413_at_the_headers(processor) -> None:
    stub, _ = processor
    answers = await exchange(stub, request(b"{}", content_length=str(LIMIT + 1)))
    assert len(answers) == 1
    immediate = answers[0].immediate_response
    assert immediate.status.code == 413
    assert immediate.body == PROC_BODIES["too_large"]


@pytest.mark.parametrize("shape", SHAPES)
async def test_clean_body_continues(processor, shape: str) -> None:
    stub, _ = processor
    clean = await exchange(stub, SHAPES[shape](b'{"n":1,"q":"hi"}'))
    assert clean[-1].HasField("request_body")
    assert not clean[-1].request_body.response.HasField("body_mutation")
    # The encoding, from the headers or from the attributes, is undone for inspection.
    compressed = gzip.compress(b'{"q":"the forbidden fruit"}')
    answers = await exchange(stub, SHAPES[shape](compressed, content_encoding="gzip"))
    assert answers[-1].immediate_response.status.code == 403


async def test_a_repeated_content_encoding_is_read_whole(processor) -> None:
    stub, _ = processor
    # `gzip` then `identity` on two lines: the upstream would see both, so the service undoes gzip too.
    message = ProcessingRequest(
        request_headers=HttpHeaders(
            headers=HeaderMap(
                headers=[
                    HeaderValue(key="content-type", raw_value=b"application/json"),
                    HeaderValue(key="content-encoding", raw_value=b"gzip"),
                    HeaderValue(key="content-encoding", raw_value=b"identity"),
                ]
            )
        )
    )
    body = ProcessingRequest(
        request_body=HttpBody(body=gzip.compress(b'{"q":"the forbidden fruit"}'), end_of_stream=True)
    )
    answers = await exchange(stub, [message, body])
    assert answers[-1].immediate_response.status.code == 403
    assert json.loads(answers[-1].immediate_response.body)["error"] == "guardrail_blocked"


async def test_pii_only_a_declared_charset_shows_is_blocked_not_passed(processor) -> None:
    stub, _ = processor

    def utf16(text: str) -> list[ProcessingRequest]:
        return [
            ProcessingRequest(request_headers=headers(content_type="text/plain; charset=utf-16le")),
            ProcessingRequest(request_body=HttpBody(body=text.encode("utf-16-le"), end_of_stream=True)),
        ]

    # The route redacts email: the UTF-8 view shows none (NULs between letters), the declared one does.
    assert (await exchange(stub, utf16("write to bob@example.com")))[-1].immediate_response.status.code == 403
    assert (await exchange(stub, utf16("hello")))[-1].HasField("request_body")


async def test_pii_only_an_encoded_view_shows_is_blocked_and_what_redaction_reaches_is_redacted(
    processor,
) -> None:
    stub, _ = processor
    form = "application/x-www-form-urlencoded"

    def sent(text: str, content_type: str = form) -> list[ProcessingRequest]:
        return [
            ProcessingRequest(request_headers=headers(content_type=content_type)),
            ProcessingRequest(request_body=HttpBody(body=text.encode(), end_of_stream=True)),
        ]

    # The route redacts email; a redaction rewrites the text as sent, where these escapes hide it.
    for hidden in ("to=bob%40example.com", "to=bob\\u0040example.com", "to=bob%5Cu0040example.com"):
        answer = (await exchange(stub, sent(hidden)))[-1]
        assert answer.immediate_response.status.code == 403, hidden
    # In plain sight, the same address is redacted, and its escaped spelling elsewhere goes with it.
    answer = (await exchange(stub, sent("to=bob@example.com&q=hello")))[-1]
    assert answer.request_body.response.body_mutation.body == b"to=[redacted]&q=hello"
    # A pattern hidden by a form's escapes, in a JSON value of a form field.
    smuggled = "payload=%7B%22q%22%3A%22forbidden%20%5Cu0066ruit%22%7D"
    assert (await exchange(stub, sent(smuggled)))[-1].immediate_response.status.code == 403


async def test_redaction_fixes_the_headers(processor) -> None:
    stub, _ = processor
    compressed = gzip.compress(b'{"q":"mail bob@example.com"}')
    answers = await exchange(stub, request(compressed, content_encoding="gzip"))
    common = answers[1].request_body.response
    assert json.loads(common.body_mutation.body) == {"q": "mail [redacted]"}
    mutation = common.header_mutation
    assert mutation.remove_headers == ["content-encoding"]
    assert [(h.header.key, h.header.raw_value) for h in mutation.set_headers] == [
        ("content-length", str(len(common.body_mutation.body)).encode())
    ]
    # Without the headers message Envoy would keep the content-encoding of a body re-sent plain:
    # refused, never passed mislabelled (the translator sends the headers where a body may change).
    answers = await exchange(stub, body_only(compressed, content_encoding="gzip"))
    assert answers[0].immediate_response.status.code == 503


@pytest.mark.parametrize(
    ("body", "status", "error"),
    [
        (b'{"q":"the FORBIDDEN fruit"}', 403, "guardrail_blocked"),
        (b'{"q":"the forbidden \\u0066ruit"}', 403, "guardrail_blocked"),
        (b'{"n":"one"}', 422, "schema_invalid"),
        (b'{"n":1,"n":2}', 400, "bad_request"),
        (b'{"n":', 400, "bad_request"),
    ],
)
@pytest.mark.parametrize("shape", SHAPES)
async def test_denials(processor, body: bytes, status: int, error: str, shape: str) -> None:
    stub, _ = processor
    answers = await exchange(stub, SHAPES[shape](body))
    immediate = answers[-1].immediate_response
    assert immediate.status.code == status
    assert json.loads(immediate.body)["error"] == error
    if status == 422:
        assert json.loads(immediate.body)["path"] == "$.n"


@pytest.mark.parametrize("shape", SHAPES)
async def test_unknown_version_is_503_and_unknown_route_403(processor, shape: str) -> None:
    stub, _ = processor
    # Refused at the first message, whichever it is: never a body passed for want of rules.
    answers = await exchange(stub, SHAPES[shape](b"{}"), version="v-unknown")
    immediate = answers[0].immediate_response
    assert immediate.status.code == 503
    assert [(h.header.key, h.header.raw_value) for h in immediate.headers.set_headers][1] == (
        "retry-after",
        b"1",
    )
    answers = await exchange(stub, SHAPES[shape](b"{}"), route="other")
    assert answers[0].immediate_response.status.code == 403


def test_a_body_alone_takes_the_request_id_and_type_from_its_attributes() -> None:
    store = PolicyStore()
    store.add(compile_policy_set(policy_set(), LIMIT))
    service = ProcessingService(store, DecisionLog(), max_ratio=20, max_body_bytes=LIMIT)
    exchange = service.open({ROUTE_METADATA: "chat", VERSION_METADATA: "v1"})
    [message] = body_only(b"mail bob@example.com", x_request_id="rid-1", content_type="text/plain")
    answer = exchange.handle(message)
    assert (exchange.request_id, exchange.request_type) == ("rid-1", "text/plain")
    # Inspected as the plain text it says it is (JSON would not parse).
    assert answer.request_body.response.body_mutation.body == b"mail [redacted]"


@pytest.mark.parametrize(
    "attributes",
    [None, {}, {processing.CONTENT_TYPE: "text/plain"}, {processing.REQUEST_ID: 7.0}],
    ids=["none", "empty", "no-request-id", "not-a-string"],
)
async def test_a_body_alone_without_the_attributes_envoy_sends_with_it_is_refused(
    processor, attributes
) -> None:
    stub, _ = processor
    # Its encoding and type would be unknown: a gzip body would be read as text. Fail closed.
    message = ProcessingRequest(request_body=HttpBody(body=b"clean", end_of_stream=True))
    if attributes is not None:
        struct = struct_pb2.Struct()
        struct.update(attributes)
        message.attributes[processing.ATTRIBUTES_KEY].CopyFrom(struct)
    [answer] = await exchange(stub, [message])
    assert answer.immediate_response.status.code == 503
    assert answer.immediate_response.body == DENY_BODIES[503]


async def test_event_stream_switches_to_streamed_and_is_cut_at_the_pattern(processor) -> None:
    stub, decisions = processor
    before = decisions.count("guardrail_blocked")
    chunks = [
        b'data: {"choices":[{"delta":{"content":"forbid"}}]}\n\n',
        b'data: {"choices":[{"delta":{"content":"den fruit"}}]}\n\n',
    ]
    answers = await exchange(
        stub,
        [
            *request(b"{}"),
            ProcessingRequest(response_headers=headers(content_type="text/event-stream")),
            ProcessingRequest(response_body=HttpBody(body=chunks[0])),
            ProcessingRequest(response_body=HttpBody(body=chunks[1], end_of_stream=True)),
        ],
    )
    assert answers[2].mode_override.response_body_mode == ProcessingMode.STREAMED
    assert not answers[3].response_body.response.HasField("body_mutation")
    replaced = answers[4].response_body.response.body_mutation.body
    assert replaced.startswith(b"event: error\n")
    # One decision per exchange, written when the server side of the stream ends.
    await wait_until_async(lambda: decisions.count("guardrail_blocked") == before + 1, what="decision")


class OneShotAds(ads_pb2_grpc.AggregatedDiscoveryServiceServicer):
    """Sends the given responses one after another and records the requests that answer them."""

    def __init__(self, responses: list[DiscoveryResponse]) -> None:
        self.responses = responses
        self.requests: asyncio.Queue = asyncio.Queue()

    async def StreamAggregatedResources(self, request_iterator, context):
        first = await request_iterator.__anext__()
        await self.requests.put(first)
        for response in self.responses:
            yield response
            await self.requests.put(await request_iterator.__anext__())
        await asyncio.Event().wait()


def response(message: proc_pb2.ProcPolicySet, nonce: str) -> DiscoveryResponse:
    resource = any_pb2.Any()
    resource.Pack(message)
    return DiscoveryResponse(
        version_info=message.version, type_url=TYPE_URL, nonce=nonce, resources=[resource]
    )


async def test_ads_acks_a_usable_set_and_nacks_a_bad_pattern() -> None:
    bad = policy_set("v2")
    next(r for r in bad.routes if r.route_id == "chat").guardrails.block_patterns.append("(?<=lookbehind)")
    ads = OneShotAds([response(policy_set("v1"), "n1"), response(bad, "n2")])
    server = grpc.aio.server()
    ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(ads, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    store = PolicyStore()
    task = asyncio.create_task(subscribe(f"127.0.0.1:{port}", store, LIMIT, delta=False).run())
    try:
        first = await asyncio.wait_for(ads.requests.get(), 10)
        assert (first.type_url, first.version_info) == (TYPE_URL, "")
        ack = await asyncio.wait_for(ads.requests.get(), 10)
        assert (ack.response_nonce, ack.version_info, ack.error_detail.message) == ("n1", "v1", "")
        nack = await asyncio.wait_for(ads.requests.get(), 10)
        assert (nack.response_nonce, nack.version_info) == ("n2", "v1")
        assert "RE2" in nack.error_detail.message
        assert store.versions() == ["v1"]
    finally:
        task.cancel()
        await server.stop(grace=None)


async def test_transform_edits_headers_and_json_and_refuses_a_request_that_is_not_json(processor) -> None:
    stub, _ = processor
    answers = await exchange(stub, request(b'{"user":"u1","q":"hi"}'), route="shaped")
    mutation = answers[0].request_headers.response.header_mutation
    assert [(h.header.key, h.header.raw_value) for h in mutation.set_headers] == [("x-tier", b"gold")]
    assert list(mutation.remove_headers) == ["x-debug"]
    body = answers[1].request_body.response.body_mutation.body
    assert json.loads(body) == {"q": "hi", "temperature": 0.5}

    refused = await exchange(
        stub,
        [
            ProcessingRequest(request_headers=headers(content_type="text/plain")),
            ProcessingRequest(request_body=HttpBody(body=b"not json", end_of_stream=True)),
        ],
        route="shaped",
    )
    assert refused[-1].immediate_response.status.code == 400

    answers = await exchange(
        stub,
        [
            *request(b"{}"),
            ProcessingRequest(response_headers=headers(content_type="application/json")),
            ProcessingRequest(
                response_body=HttpBody(body=b'{"usage":{"total_tokens":3}}', end_of_stream=True)
            ),
        ],
        route="shaped",
    )
    assert json.loads(answers[3].response_body.response.body_mutation.body) == {
        "billing": {"total_tokens": 3}
    }
    # A response that is not JSON passes untouched.
    answers = await exchange(
        stub,
        [
            *request(b"{}"),
            ProcessingRequest(response_headers=headers(content_type="text/plain")),
            ProcessingRequest(response_body=HttpBody(body=b"plain words", end_of_stream=True)),
        ],
        route="shaped",
    )
    assert not answers[3].response_body.response.HasField("body_mutation")
