"""What Envoy's ext_proc filter tells the processing service besides the HTTP messages themselves:
shared by the translator (which configures the filter) and the service (which reads it).

A route whose processing only inspects the buffered request body skips the request-headers message
(one message per exchange instead of two); what the service reads of the request's headers then comes as
request attributes, CEL expressions Envoy evaluates once per stream and sends, under the filter's
name, with the first message of the stream (`ProcessingRequest.attributes`). An absent header is an
absent attribute; a repeated one is its values joined by commas.
"""

from __future__ import annotations

# The gRPC metadata the filter sends with each stream: which route, and which version of the
# processing policy set the route was rendered with.
ROUTE_METADATA = "x-stoa-route-id"
VERSION_METADATA = "x-stoa-proc-version"
# The key of the filter's attributes in `ProcessingRequest.attributes`.
ATTRIBUTES_KEY = "envoy.filters.http.ext_proc"
REQUEST_ID = "request.id"
CONTENT_TYPE = "request.headers['content-type']"
CONTENT_ENCODING = "request.headers['content-encoding']"
REQUEST_ATTRIBUTES: tuple[str, ...] = (REQUEST_ID, CONTENT_TYPE, CONTENT_ENCODING)
