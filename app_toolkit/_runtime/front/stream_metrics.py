"""What the proxy records about streams: connections open now (streamed HTTP responses,
SSE included, and WebSockets), time to a streamed response's first chunk, and chunks."""

from __future__ import annotations

from app_toolkit import metrics

OPEN = metrics.Gauge(
    "app_toolkit_open_streams",
    "Streamed HTTP responses (SSE included) and WebSocket connections open at the proxy",
    ("application", "kind"),
)
FIRST_CHUNK = metrics.Histogram(
    "app_toolkit_stream_first_chunk_seconds",
    "From a streamed request's arrival at the proxy to its first body chunk leaving",
    ("application", "route"),
)
CHUNKS = metrics.Counter(
    "app_toolkit_stream_chunks_total",
    "Body chunks of streamed responses the proxy sent",
    ("application", "route"),
)
