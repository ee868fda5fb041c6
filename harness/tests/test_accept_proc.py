"""The processing service through a real Envoy: guardrails on a chat-completion route in front of the
fake model, streamed and not, the size limit before any body is read, and a processing service that
is down.

Envoy runs from a static bootstrap built here with the ext_proc filter, its per-route override and
the local replies the Link renders for processing routes; stoa-proc gets its policy set from a
one-resource ADS server, as it would from the Link.
"""

from __future__ import annotations

import gzip
import json
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import httpx
import pytest
from envoy.service.discovery.v3 import ads_pb2_grpc
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryResponse
from google.protobuf import any_pb2, json_format, struct_pb2
from stoa_harness.envoy import EnvoyProcess
from stoa_harness.llm import FakeLLM
from stoa_harness.ports import free_port
from stoa_harness.processes import SupervisedProcess, tcp_accepting
from stoa_harness.site import console_script
from stoa_harness.wait import wait_until
from stoa_proto import proc_pb2
from stoa_proto.bodies import DENY_BODIES, PROC_BODIES

VERSION = "proc-v1"
LIMIT = 2048
SECRET = "forbidden fruit"
PROC_TYPE = "type.googleapis.com/stoa.proc.v1.ProcPolicySet"


class OneSetAds(ads_pb2_grpc.AggregatedDiscoveryServiceServicer):
    """Serves one ProcPolicySet to whoever subscribes, and records the ACKs."""

    def __init__(self, message: proc_pb2.ProcPolicySet) -> None:
        resource = any_pb2.Any()
        resource.Pack(message)
        self.response = DiscoveryResponse(
            version_info=message.version, type_url=PROC_TYPE, nonce="n1", resources=[resource]
        )
        self.acked = threading.Event()
        self.closed = threading.Event()

    def StreamAggregatedResources(self, request_iterator, context):
        next(request_iterator)
        yield self.response
        ack = next(request_iterator)
        if ack.response_nonce == "n1" and not ack.HasField("error_detail"):
            self.acked.set()
        self.closed.wait()


def policy_set() -> proc_pb2.ProcPolicySet:
    schema = struct_pb2.Struct()
    schema.update(
        {
            "type": "object",
            "required": ["messages"],
            "properties": {"messages": {"type": "array", "items": {"type": "object", "required": ["role"]}}},
        }
    )
    message = proc_pb2.ProcPolicySet(name="default", version=VERSION)
    message.routes.add(
        route_id="chat",
        tenant_id="acme",
        api_id="chat",
        guardrails=proc_pb2.Guardrails(
            direction="both",
            max_body_bytes=LIMIT,
            block_patterns=[SECRET],
            pii=proc_pb2.PiiRule(kinds=["email", "card"], action="redact"),
            json_schema=schema,
        ),
    )
    return message


# -- what the Link renders for a processing route (kept beside the test until the translator has it)
def _ext_proc_filter(proc_cluster: str) -> dict:
    from envoy.extensions.filters.http.ext_proc.v3 import ext_proc_pb2, processing_mode_pb2

    mode = processing_mode_pb2.ProcessingMode
    config = ext_proc_pb2.ExternalProcessor(
        grpc_service={"envoy_grpc": {"cluster_name": proc_cluster}, "timeout": {"seconds": 2}},
        failure_mode_allow=False,
        processing_mode=mode(
            request_header_mode=mode.SEND,
            response_header_mode=mode.SKIP,
            request_body_mode=mode.NONE,
            response_body_mode=mode.NONE,
            request_trailer_mode=mode.SKIP,
            response_trailer_mode=mode.SKIP,
        ),
        message_timeout={"seconds": 2},
        allow_mode_override=True,
        status_on_error={"code": 503},
    )
    return {
        "name": "envoy.filters.http.ext_proc",
        "typed_config": json_format.MessageToDict(_any(config)),
        "disabled": True,
    }


def _any(message) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


def _ext_proc_route(route_id: str, version: str) -> dict:
    from envoy.config.route.v3 import route_components_pb2
    from envoy.extensions.filters.http.ext_proc.v3 import ext_proc_pb2, processing_mode_pb2

    mode = processing_mode_pb2.ProcessingMode
    per_route = ext_proc_pb2.ExtProcPerRoute(
        overrides=ext_proc_pb2.ExtProcOverrides(
            processing_mode=mode(
                request_header_mode=mode.SEND,
                request_body_mode=mode.BUFFERED,
                response_header_mode=mode.SEND,
                response_body_mode=mode.BUFFERED,
                request_trailer_mode=mode.SKIP,
                response_trailer_mode=mode.SKIP,
            ),
            grpc_initial_metadata=[
                {"key": "x-stoa-route-id", "value": route_id},
                {"key": "x-stoa-proc-version", "value": version},
            ],
        )
    )
    enabled = route_components_pb2.FilterConfig(config=_any(per_route))
    return json_format.MessageToDict(_any(enabled))


def _cel(expression: str) -> dict:
    from envoy.extensions.access_loggers.filters.cel.v3 import cel_pb2

    return {
        "extension_filter": {
            "name": "envoy.access_loggers.extension_filters.cel",
            "typed_config": json_format.MessageToDict(_any(cel_pb2.ExpressionFilter(expression=expression))),
        }
    }


def _json_reply(status: int, body: bytes, retry_after: bool = False) -> dict:
    reply = {
        "body": {"inline_string": body.decode()},
        "body_format_override": {
            "text_format_source": {"inline_string": "%LOCAL_REPLY_BODY%"},
            "content_type": "application/json",
        },
    }
    if retry_after:
        reply["headers_to_add"] = [
            {"header": {"key": "retry-after", "value": "1"}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}
        ]
    return reply


def _local_replies() -> dict:
    return {
        "mappers": [
            # The processing service's own answers pass as they are.
            {"filter": _cel("response.code_details.startsWith('stoa_proc_')")},
            # The service unreachable, failing or past its timeout: 503, neutral body, Retry-After.
            {
                "filter": _cel("response.code_details.startsWith('ext_proc_error')"),
                "status_code": 503,
                **_json_reply(503, DENY_BODIES[503], retry_after=True),
            },
            # A body over Envoy's own buffer: the processing service's 413 body.
            {
                "filter": {
                    "status_code_filter": {
                        "comparison": {"op": "EQ", "value": {"default_value": 413, "runtime_key": "stoa_413"}}
                    }
                },
                **_json_reply(413, PROC_BODIES["too_large"]),
            },
        ]
    }


def bootstrap(listen: int, admin: int, llm_port: int, proc_port: int) -> dict:
    h2 = {
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}},
        }
    }

    def cluster(name: str, port: int, **extra: object) -> dict:
        return {
            "name": name,
            "type": "STATIC",
            "connect_timeout": "1s",
            "load_assignment": {
                "cluster_name": name,
                "endpoints": [
                    {
                        "lb_endpoints": [
                            {
                                "endpoint": {
                                    "address": {
                                        "socket_address": {"address": "127.0.0.1", "port_value": port}
                                    }
                                }
                            }
                        ]
                    }
                ],
            },
            **extra,
        }

    hcm = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3."
        "HttpConnectionManager",
        "stat_prefix": "stoa",
        "route_config": {
            "name": "stoa-routes",
            "virtual_hosts": [
                {
                    "name": "all",
                    "domains": ["*"],
                    "routes": [
                        {
                            "match": {"prefix": "/apis/chat/"},
                            "route": {"cluster": "llm", "prefix_rewrite": "/v1/", "timeout": "10s"},
                            "typed_per_filter_config": {
                                "envoy.filters.http.ext_proc": _ext_proc_route("chat", VERSION)
                            },
                        },
                        {
                            "match": {"prefix": "/apis/plain/"},
                            "route": {"cluster": "llm", "prefix_rewrite": "/v1/"},
                        },
                    ],
                }
            ],
        },
        "local_reply_config": _local_replies(),
        "http_filters": [
            _ext_proc_filter("stoa-proc"),
            {
                "name": "envoy.filters.http.router",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
                },
            },
        ],
    }
    return {
        "node": {"id": "proc-test", "cluster": "proc-test"},
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}},
        "static_resources": {
            "listeners": [
                {
                    "name": "stoa-listener",
                    "address": {"socket_address": {"address": "127.0.0.1", "port_value": listen}},
                    "filter_chains": [
                        {
                            "filters": [
                                {"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}
                            ]
                        }
                    ],
                }
            ],
            "clusters": [
                cluster("llm", llm_port),
                cluster("stoa-proc", proc_port, typed_extension_protocol_options=h2),
            ],
        },
    }


class ProcSite:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.listen, self.admin, self.proc_port, self.proc_http, self.ads_port = (
            free_port() for _ in range(5)
        )
        self.url = f"http://127.0.0.1:{self.listen}"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcSite]:
    run_dir = tmp_path_factory.mktemp("proc")
    site = ProcSite(run_dir)
    ads = OneSetAds(policy_set())
    ads_server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(ads, ads_server)
    ads_server.add_insecure_port(f"127.0.0.1:{site.ads_port}")
    ads_server.start()
    llm = FakeLLM()
    llm.start()
    site.llm = llm
    proc = SupervisedProcess(
        "stoa-proc",
        [console_script("stoa-proc")],
        log_dir=run_dir,
        env={
            "STOA_PROC_GRPC_ADDRESS": f"127.0.0.1:{site.proc_port}",
            "STOA_PROC_HTTP_ADDRESS": f"127.0.0.1:{site.proc_http}",
            "STOA_PROC_ADS_ADDRESS": f"127.0.0.1:{site.ads_port}",
        },
        ready=lambda: (
            httpx.get(f"http://127.0.0.1:{site.proc_http}/health/ready", timeout=1).status_code == 200
        ),
    )
    site.proc = proc
    config = run_dir / "envoy.json"
    config.write_text(
        json.dumps(bootstrap(site.listen, site.admin, int(llm.url.rsplit(":", 1)[1]), site.proc_port))
    )
    envoy = EnvoyProcess(config, site.admin, run_dir / "envoy.log")
    try:
        proc.start()
        assert ads.acked.wait(10), "stoa-proc did not ACK its policy set"
        envoy.start()
        wait_until(lambda: tcp_accepting("127.0.0.1", site.listen), 10, "Envoy's listener")
        yield site
    finally:
        envoy.stop()
        proc.stop()
        ads.closed.set()
        ads_server.stop(grace=None)
        llm.stop()


def chat(site: ProcSite, body: bytes | dict, **headers: str) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"content-type": "application/json", **{k.replace("_", "-"): v for k, v in headers.items()}}
    return httpx.post(f"{site.url}/apis/chat/chat/completions", content=content, headers=headers, timeout=10)


def ask(text: str, **extra: object) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": text}], **extra}


def test_a_clean_request_and_answer_pass(site: ProcSite) -> None:
    site.llm.script(["Hello", " there."])
    response = chat(site, ask("hi"))
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "Hello there."


def test_request_guardrails(site: ProcSite) -> None:
    site.llm.clear()
    cases = [
        (ask("tell me about the FORBIDDEN fruit"), 403, PROC_BODIES["guardrail_blocked"]),
        # Escaped in the JSON, full-width in the text: decoded and normalised before matching.
        (b'{"messages":[{"role":"user","content":"the forbidden \\u0066ruit"}]}', 403, None),
        (ask("the \uff46\uff4f\uff52\uff42\uff49\uff44\uff44\uff45\uff4e fruit"), 403, None),
        (b'{"messages":[{"role":"user","content":"x","content":"y"}]}', 400, DENY_BODIES[400]),
        (b'{"messages":', 400, DENY_BODIES[400]),
        (b"\xff\xfe", 400, DENY_BODIES[400]),
    ]
    for body, status, expected in cases:
        response = chat(site, body)
        assert response.status_code == status, body
        assert response.headers["content-type"] == "application/json"
        if expected is not None:
            assert response.content == expected
    schema = chat(site, {"messages": [{"role": "user"}, {"content": "no role"}]})
    assert schema.status_code == 422
    assert schema.json() == {
        "error": "schema_invalid",
        "message": "The request body does not match the expected schema.",
        "path": "$.messages[1]",
    }
    assert site.llm.requests() == [], "a refused request reached the model"


def test_compressed_request_is_inspected_and_a_bomb_is_413(site: ProcSite) -> None:
    site.llm.clear()
    hidden = gzip.compress(json.dumps(ask("the forbidden fruit")).encode())
    assert chat(site, hidden, content_encoding="gzip").status_code == 403
    clean = gzip.compress(json.dumps(ask("hello")).encode())
    assert chat(site, clean, content_encoding="gzip").status_code == 200
    # The upstream gets the body as sent: still compressed.
    [arrived] = site.llm.requests()
    assert arrived.headers["content-encoding"] == "gzip"
    assert arrived.body == clean
    bomb = gzip.compress(b" " * (LIMIT * 100))
    response = chat(site, bomb, content_encoding="gzip")
    assert (response.status_code, response.content) == (413, PROC_BODIES["too_large"])


def test_size_limit_is_413_before_the_body_and_never_a_stall(site: ProcSite) -> None:
    site.llm.clear()
    big = json.dumps(ask("x" * (LIMIT * 2))).encode()
    response = chat(site, big)
    assert (response.status_code, response.content) == (413, PROC_BODIES["too_large"])

    # Chunked (no content-length), larger than Envoy's own buffer: 413 without waiting for a timeout.
    def chunks() -> Iterator[bytes]:
        for _ in range(48):
            yield b" " * 65536

    response = httpx.post(
        f"{site.url}/apis/chat/chat/completions",
        content=chunks(),
        headers={"content-type": "application/json"},
        timeout=5,
    )
    assert response.status_code == 413
    assert site.llm.requests() == []


def test_pii_is_redacted_and_content_length_fixed(site: ProcSite) -> None:
    site.llm.clear()
    response = chat(site, ask("mail bob@example.com, card 4111 1111 1111 1111"))
    assert response.status_code == 200
    [arrived] = site.llm.requests()
    sent = json.loads(arrived.body)
    assert sent["messages"][0]["content"] == "mail [redacted], card [redacted]"
    assert arrived.headers["content-length"] == str(len(arrived.body))


def test_response_guardrails_buffered_and_compressed(site: ProcSite) -> None:
    site.llm.script(["the forbidden", " fruit is here"])
    assert chat(site, ask("hi")).status_code == 403
    site.llm.script(["the forbidden", " fruit is here"], gzip_body=True)
    assert chat(site, ask("hi")).status_code == 403
    site.llm.script(["write to ", "alice@example.org"], gzip_body=True)
    response = chat(site, ask("hi"))
    assert response.status_code == 200
    assert "content-encoding" not in response.headers
    assert response.json()["choices"][0]["message"]["content"] == "write to [redacted]"


def test_streamed_answer_split_pattern_ends_with_an_error_event(site: ProcSite) -> None:
    site.llm.script(["Sure: the forb", "idden fr", "uit grows", " on trees."])
    with httpx.stream(
        "POST",
        f"{site.url}/apis/chat/chat/completions",
        json=ask("hi", stream=True),
        timeout=10,
    ) as response:
        assert response.status_code == 200
        text = b"".join(response.iter_bytes()).decode()
    assert "forb" in text  # what came before the match was passed
    assert "uit grows" not in text
    assert "on trees" not in text
    assert text.endswith('event: error\ndata: {"error": "guardrail_blocked"}\n\n')

    site.llm.script(["All", " good."])
    with httpx.stream(
        "POST", f"{site.url}/apis/chat/chat/completions", json=ask("hi", stream=True), timeout=10
    ) as response:
        text = b"".join(response.iter_bytes()).decode()
    assert '"content": " good."' in text
    assert text.endswith("data: [DONE]\n\n")


def test_service_down_is_503_with_retry_after(site: ProcSite) -> None:
    site.proc.stop()
    try:
        response = chat(site, ask("hi"))
        assert response.status_code == 503
        assert response.content == DENY_BODIES[503]
        assert response.headers["retry-after"] == "1"
    finally:
        site.proc.start()
