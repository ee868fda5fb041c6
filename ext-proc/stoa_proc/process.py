"""The ExternalProcessor: one gRPC stream per HTTP exchange, its messages taken in order.

Envoy opens a stream only on routes with a body policy; the route names itself and the policy-set
version it was built with in the stream's metadata. Request: headers (a declared size over the limit
is refused at once, before any body is read), then the buffered body (size, decode, inspect,
redact, edit, then reserve tokens). A route whose processing only inspects the body sends no headers
message: the body message's attributes carry the content type, encoding and request id
(`stoa_proto.processing`), and Envoy's buffer filter has refused a body over the limit before.
Response: headers (a server-sent event stream switches the body to streamed mode), then the body,
buffered or event by event (inspect, edit, settle tokens). Any denial ends the exchange with an
immediate response; anything unforeseen is a 503, never a pass.

A message of an exchange with a token budget may wait on PostgreSQL: it is handled on a worker
thread, so the event loop keeps serving every other stream meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc
from envoy.service.ext_proc.v3.external_processor_pb2 import (
    HttpHeaders,
    ProcessingRequest,
    ProcessingResponse,
)
from google.protobuf.struct_pb2 import Struct
from stoa_ops.logs import DecisionPlace
from stoa_proto import processing
from stoa_proto.bodies import media_type
from stoa_proto.decisions import CONSUMER_HEADER
from stoa_proto.processing import ROUTE_METADATA, VERSION_METADATA
from stoa_quota import Reservation

from stoa_proc import budget, decode, respond
from stoa_proc.budget import Budgets, StreamUsage
from stoa_proc.decode import Limits
from stoa_proc.guardrails import Guardrails
from stoa_proc.log import DecisionLog
from stoa_proc.policy import PolicyStore, RoutePolicy
from stoa_proc.reasons import Deny, Reason
from stoa_proc.stream import SseGuard
from stoa_proc.transform import Side, dump

log = logging.getLogger("stoa_proc.process")


# The headers an exchange reads, of each side; no other header is decoded.
_REQUEST_HEADERS = frozenset(
    ("x-request-id", "content-type", "content-encoding", "content-length", CONSUMER_HEADER)
)
_RESPONSE_HEADERS = frozenset(("content-type", "content-encoding"))
# What a stream's request attributes give, by the field of the exchange they set.
_ATTRIBUTES = (
    ("request_id", processing.REQUEST_ID),
    ("request_type", processing.CONTENT_TYPE),
    ("request_encoding", processing.CONTENT_ENCODING),
)


def _headers(message: HttpHeaders, names: frozenset[str]) -> dict[str, str]:
    """The named headers; a repeated one is its values joined by commas, as an HTTP list and as the
    request attributes give it (so `br` then `identity` is read as both, never the last alone)."""
    found: dict[str, str] = {}
    for header in message.headers.headers:
        key = header.key.lower()
        if key in names:
            value = header.raw_value.decode("latin-1") if header.raw_value else header.value
            found[key] = f"{found[key]},{value}" if key in found else value
    return found


@dataclass(slots=True)
class Exchange:
    """The state of one HTTP exchange across its messages."""

    route: RoutePolicy | None
    version: str
    max_ratio: int
    # The body limit when no guardrails policy names one (the service's own).
    max_body_bytes: int
    budgets: Budgets | None = None
    request_id: str = ""
    consumer_id: str = ""
    # The tokens reserved for this exchange (None: no budget, or passed uncounted), and the usage
    # its response reported; settled once.
    reservation: Reservation | None = None
    usage: StreamUsage | None = None
    used: int | None = None
    settled: bool = False
    # The response body comes chunk by chunk (a server-sent event stream switched to streamed mode).
    streamed_response: bool = False
    # The stream carried the request-headers message (a route that only inspects skips it).
    request_headers_sent: bool = False
    request_type: str = ""
    request_encoding: str = ""
    response_type: str = ""
    response_encoding: str = ""
    sse: SseGuard | None = None
    outcome: Reason = Reason.ALLOWED
    started: float = field(default_factory=time.perf_counter)

    @property
    def guardrails(self) -> Guardrails | None:
        return self.route.guardrails if self.route else None

    @property
    def budget(self) -> budget.Budget | None:
        return self.route.token_budget if self.route else None

    def handle(self, request: ProcessingRequest) -> ProcessingResponse:
        phase = request.WhichOneof("request")
        # The attributes come with the first message of a stream (a request id among them, always).
        if not self.request_id and processing.ATTRIBUTES_KEY in request.attributes:
            self.request_attributes(request.attributes[processing.ATTRIBUTES_KEY])
        if phase == "request_headers":
            return self.request_headers(request.request_headers)
        if self.route is None:
            # Which reason was decided when the stream opened; the first message carries it out.
            raise Deny(self.outcome)
        if phase == "request_body":
            if not self.request_headers_sent and not self.request_id:
                # A body first comes only on a route that skips the headers message, whose headers
                # Envoy sends as attributes with it: without them its encoding and type are unknown.
                raise Deny(Reason.INTERNAL_ERROR)
            return self.body(request.request_body.body, request.request_body.end_of_stream, request=True)
        if phase == "response_headers":
            return self.response_headers(request.response_headers)
        if phase == "response_body":
            return self.body(request.response_body.body, request.response_body.end_of_stream, request=False)
        if phase == "request_trailers":
            return ProcessingResponse(request_trailers={})
        if phase == "response_trailers":
            return ProcessingResponse(response_trailers={})
        raise Deny(Reason.INTERNAL_ERROR)

    def side(self, request: bool) -> Side | None:
        transform = self.route.transform if self.route else None
        if transform is None:
            return None
        return transform.request if request else transform.response

    def inspects(self, request: bool) -> Guardrails | None:
        guardrails = self.guardrails
        if guardrails is None or not (guardrails.request if request else guardrails.response):
            return None
        return guardrails

    def request_attributes(self, attributes: Struct) -> None:
        """What a stream without the request-headers message knows of them (a headers message, when
        one follows, is read as well)."""
        fields = attributes.fields
        for name, attribute in _ATTRIBUTES:
            value = fields.get(attribute)
            if value is not None:
                if value.WhichOneof("kind") != "string_value":
                    raise Deny(Reason.INTERNAL_ERROR)  # not what the translator asked Envoy for
                setattr(self, name, value.string_value)

    def request_headers(self, message: HttpHeaders) -> ProcessingResponse:
        headers = _headers(message, _REQUEST_HEADERS)
        self.request_headers_sent = True
        self.request_id = headers.get("x-request-id", "")
        if self.route is None:
            # Which reason was decided when the stream opened; the first message carries it out.
            raise Deny(self.outcome)
        self.request_type = headers.get("content-type", "")
        self.request_encoding = headers.get("content-encoding", "")
        # Set by the authorization service (a client's own x-stoa-* headers are stripped at ingress).
        self.consumer_id = headers.get(CONSUMER_HEADER, "")
        declared = headers.get("content-length", "")
        side = self.side(request=True)
        reads_body = (
            self.inspects(request=True) is not None
            or (side is not None and bool(side.json))
            or self.budget is not None
        )
        # Refused on the declared size, before Envoy buffers a byte of the body.
        if reads_body and declared.isdigit() and int(declared) > self.limit(request=True):
            raise Deny(Reason.TOO_LARGE)
        if self.budget is not None and message.end_of_stream:
            # No body will follow (no body message either): the default is reserved here.
            self.reserve(self.budget.default_max_tokens)
        return self._headers_answer(request=True)

    def reserve(self, amount: int) -> None:
        rules = self.budget
        assert rules is not None
        assert self.route is not None
        if rules.per == "consumer" and not self.consumer_id:
            raise Deny(Reason.NO_CONSUMER)
        if self.budgets is None:
            raise Deny(Reason.QUOTA_UNAVAILABLE)
        self.reservation = self.budgets.reserve(
            rules, rules.key(self.route.tenant_id, self.consumer_id), amount
        )

    def settle(self, used: int | None = None) -> None:
        """Charge what the response reported (or `used`) instead of the reservation (once); without a
        report the reservation stands."""
        if self.settled or self.reservation is None or self.budgets is None:
            return
        self.settled = True
        if used is None:
            used = self.usage.total if self.usage is not None else self.used
        if used is not None:
            self.budgets.settle(self.reservation, used)

    def release(self) -> None:
        """Give the reservation back whole (once): for a request that never went upstream."""
        self.settle(used=0)

    def response_headers(self, message: HttpHeaders) -> ProcessingResponse:
        headers = _headers(message, _RESPONSE_HEADERS)
        self.response_type = headers.get("content-type", "")
        self.response_encoding = headers.get("content-encoding", "")
        guardrails = self.inspects(request=False)
        media = media_type(self.response_type)
        if media == "text/event-stream" and (guardrails or self.budget):
            encoded = bool(decode.encodings(self.response_encoding))
            if guardrails and encoded:
                # An encoded event stream cannot be inspected event by event: refused, never passed.
                raise Deny(Reason.MALFORMED_BODY)
            if guardrails:
                self.sse = SseGuard(guardrails)
            if self.budget is not None and not encoded:
                self.usage = StreamUsage()  # an encoded stream reports no readable usage
            self.streamed_response = True
            return self._headers_answer(request=False, streamed=True)
        return self._headers_answer(request=False)

    def _headers_answer(self, request: bool, streamed: bool = False) -> ProcessingResponse:
        side = self.side(request)
        if side is None or not side.headers:
            return respond.proceed_headers(request, streamed)
        return respond.proceed_headers(request, streamed, side.set_headers, side.remove_headers)

    def limit(self, request: bool) -> int:
        guardrails = self.inspects(request)
        return guardrails.max_body_bytes if guardrails else self.max_body_bytes

    def body(self, data: bytes, end_of_stream: bool, *, request: bool) -> ProcessingResponse:
        guardrails = self.inspects(request)
        side = self.side(request)
        edits = side if side is not None and side.json else None
        rules = self.budget
        if not request and self.streamed_response:
            return self._streamed(data, end_of_stream)
        if not request and rules is not None and guardrails is None and edits is None:
            # Read for the usage only: whatever it holds, the answer passes as it is.
            self._read_usage(data)
            return respond.proceed_body(request)
        if guardrails is None and edits is None and rules is None:
            return respond.proceed_body(request)
        limit = self.limit(request)
        if len(data) > limit:
            raise Deny(Reason.TOO_LARGE)
        content_type = self.request_type if request else self.response_type
        encoding = self.request_encoding if request else self.response_encoding
        plain = decode.decompress(data, encoding, Limits(limit, self.max_ratio))
        if not plain:
            if request and rules is not None:
                self.reserve(rules.default_max_tokens)
            return respond.proceed_body(request)
        is_json = decode.is_json(content_type)
        document: object = None
        replaced: bytes | None = None
        if guardrails is not None:
            text = decode.text(plain)
            declared = decode.declared_text(content_type, plain)
            if declared is not None and declared != text:
                # PII is blocked there whatever the action: a redaction rewrites the UTF-8 view only.
                guardrails.check_text(declared, block_pii=True)
            if is_json:
                document = decode.parse_json(text)
                guardrails.check_texts(decode.strings(document))
                if request:
                    guardrails.check_schema(document)
                redacted = _redact_json(document, guardrails)
                if redacted is not document:
                    document, replaced = redacted, dump(redacted)
                    self.outcome = Reason.REDACTED
            else:
                # Escapes are decoded for matching only: a `\u0041` in plain text is inspected as `A`.
                guardrails.check_text(text)
                if request and guardrails.schema is not None:
                    # JSON under another type is still JSON to an upstream that parses it regardless.
                    sniffed = decode.sniffed_json(text)
                    if sniffed is not decode.NOT_JSON:
                        guardrails.check_schema(sniffed)
                redacted_text = guardrails.redact_text(text)
                # The text as an upstream may decode it: what the redaction (of the text as sent)
                # left there is blocked whatever the action.
                for view in decode.decoded_views(content_type, redacted_text):
                    guardrails.check_text(view, block_pii=True)
                if redacted_text != text:
                    replaced = redacted_text.encode()
                    self.outcome = Reason.REDACTED
                if not request and "data" in redacted_text:
                    # An event stream under another media type is still read as one by a client
                    # that asked for a stream: what it would reconstruct is inspected too.
                    events = SseGuard(guardrails)
                    events.feed(replaced or plain, end_of_stream=True)
                    if events.denied is not None:
                        raise Deny(events.denied)
        if edits is not None:
            if document is None:
                document = self._json_for_edits(plain, is_json, request)
            if document is not None:
                edited = edits.edit(document)
                if edited != document:
                    document, replaced = edited, dump(edited)
        if rules is not None:
            if request:
                # Last: what reaches the model (edits included) is what is reserved for, and only
                # a request every other rule let through reserves anything.
                if document is None:
                    document = decode.parse_json(decode.text(plain))
                self.reserve(budget.requested(document, rules))
            else:
                self.used = budget.usage_of(document) if document is not None else None
                self.settle()
        if replaced is None:
            return respond.proceed_body(request)
        if request and encoding and not self.request_headers_sent:
            # Envoy edits only headers the service was sent: the plain body would keep its
            # content-encoding. The translator sends the headers wherever a body may be rewritten.
            raise Deny(Reason.INTERNAL_ERROR)
        return respond.replace_body(request, replaced, whole=True)

    def _read_usage(self, data: bytes) -> None:
        """The usage of a buffered answer, when it reports one, then settle (the reservation stands
        for an answer that is not JSON, not decodable, or without usage)."""
        try:
            plain = decode.decompress(
                data, self.response_encoding, Limits(self.max_body_bytes, self.max_ratio)
            )
            self.used = budget.usage_of(decode.parse_json(decode.text(plain)))
        except Deny:
            self.used = None
        self.settle()

    def _streamed(self, data: bytes, end_of_stream: bool) -> ProcessingResponse:
        """One chunk of a server-sent event stream: usage read from what the model sent, guardrails
        applied to what passes."""
        if self.usage is not None:
            self.usage.feed(data)
            if end_of_stream:
                self.settle()
        if self.sse is None:
            return respond.proceed_body(request=False)
        passed = self.sse.feed(data, end_of_stream)
        if self.sse.denied is not None:
            self.outcome = self.sse.denied
        if passed == data:
            return respond.proceed_body(request=False)
        return respond.replace_body(request=False, body=passed, whole=False)

    def _json_for_edits(self, plain: bytes, is_json: bool, request: bool) -> object:
        """The JSON document JSON edits apply to; a request that is not JSON is 400, a response that
        is not JSON passes untouched (None)."""
        try:
            if not is_json:
                raise Deny(Reason.MALFORMED_BODY)
            return decode.parse_json(decode.text(plain))
        except Deny:
            if request:
                raise
            return None


def _redact_json(document: object, guardrails: Guardrails) -> object:
    """The document with PII redacted in its strings; the same object when nothing changed."""
    if not (guardrails.pii and guardrails.redact):
        return document
    if isinstance(document, str):
        redacted = guardrails.redact_text(document)
        return document if redacted == document else redacted
    digits = decode.number_text(document)
    if digits is not None:
        # A number holding PII (a card number) becomes the redacted text.
        redacted = guardrails.redact_text(digits)
        return document if redacted == digits else redacted
    if isinstance(document, list):
        items = [_redact_json(item, guardrails) for item in document]
        return document if all(a is b for a, b in zip(items, document, strict=True)) else items
    if isinstance(document, dict):
        pairs = [(guardrails.redact_text(k), _redact_json(v, guardrails)) for k, v in document.items()]
        unchanged = all(
            k2 == k1 and v2 is v1 for (k2, v2), (k1, v1) in zip(pairs, document.items(), strict=True)
        )
        return document if unchanged else dict(pairs)
    return document


class ProcessingService(external_processor_pb2_grpc.ExternalProcessorServicer):
    def __init__(
        self,
        store: PolicyStore,
        decisions: DecisionLog,
        max_ratio: int,
        max_body_bytes: int,
        budgets: Budgets | None = None,
    ) -> None:
        self._store = store
        self._decisions = decisions
        self._max_ratio = max_ratio
        self._max_body_bytes = max_body_bytes
        self._budgets = budgets

    def open(self, metadata: dict[str, str]) -> Exchange:
        version = metadata.get(VERSION_METADATA, "")
        policy_set = self._store.get(version)
        exchange = Exchange(None, version, self._max_ratio, self._max_body_bytes, self._budgets)
        if policy_set is None:
            exchange.outcome = Reason.POLICY_UNAVAILABLE
            return exchange
        route = policy_set.routes.get(metadata.get(ROUTE_METADATA, ""))
        if route is None:
            exchange.outcome = Reason.UNKNOWN_ROUTE
            return exchange
        exchange.route = route
        return exchange

    async def Process(
        self, request_iterator: AsyncIterator[ProcessingRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[ProcessingResponse]:
        metadata = {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}
        exchange = self.open(metadata)
        # An exchange that may wait on the quota store is handled off the event loop.
        blocking = exchange.budget is not None
        phase = ""
        # A message being handled on its worker thread, until its answer is yielded to Envoy.
        pending: asyncio.Future[ProcessingResponse] | None = None
        try:
            async for request in request_iterator:
                phase = request.WhichOneof("request") or ""
                try:
                    if blocking:
                        pending = asyncio.ensure_future(asyncio.to_thread(exchange.handle, request))
                        # Shielded: the stream reset meanwhile must not lose what the thread does.
                        response = await asyncio.shield(pending)
                        pending = None
                    else:
                        response = exchange.handle(request)
                except Deny as deny:
                    exchange.outcome = deny.reason
                    yield respond.immediate(deny.reason, deny.path, deny.retry_after)
                    return
                except Exception:
                    log.exception("processing_failed", extra={"phase": phase})
                    exchange.outcome = Reason.INTERNAL_ERROR
                    yield respond.immediate(Reason.INTERNAL_ERROR)
                    return
                yield response
        finally:
            try:
                if pending is not None:
                    # The stream ended (Envoy's message timeout, the client gone) or was refused
                    # while a message was handled: its thread is waited for, never raced by the
                    # settlement below. A request's answer never let it through, so it never went
                    # upstream: what the store reserved for it is given back.
                    with contextlib.suppress(Exception):
                        await asyncio.shield(pending)
                    if phase in ("request_headers", "request_body"):
                        await asyncio.shield(asyncio.to_thread(exchange.release))
                if blocking and not exchange.settled:
                    # Ended before the response was complete (the client went away mid-stream): a
                    # usage already reported is charged, otherwise the reservation stands whole. The
                    # stream may be cancelled again meanwhile: the settlement's thread runs on.
                    await asyncio.shield(asyncio.to_thread(exchange.settle))
            finally:
                # One event per exchange, also when the client went away mid-stream.
                self._record(exchange, phase)

    def _record(self, exchange: Exchange, phase: str) -> None:
        route = exchange.route
        self._decisions.emit(
            exchange.outcome,
            DecisionPlace(
                tenant=route.tenant_id if route else "",
                api=route.api_id if route else "",
                route=route.route_id if route else "",
                request_id=exchange.request_id,
                policy_set_version=exchange.version,
            ),
            (time.perf_counter() - exchange.started) * 1000,
            phase=phase,
        )
