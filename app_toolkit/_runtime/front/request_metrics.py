"""What the front records of every request it answers: how long it took, by application,
route, method and status (and so how many there were)."""

from __future__ import annotations

from app_toolkit import metrics

HTTP_DURATION = metrics.Histogram(
    "app_toolkit_http_request_duration_seconds",
    "From the request's arrival at the proxy to the end of its response",
    ("application", "route", "method", "status"),
)
#: Read from HTTP_DURATION: a request timed there is a request answered.
HTTP_REQUESTS = metrics.Counter(
    "app_toolkit_http_requests_total",
    "HTTP requests the proxy answered",
    ("application", "route", "method", "status"),
    counts=HTTP_DURATION,
)
