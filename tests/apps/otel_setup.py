"""An OpenTelemetry set-up for tests (``APP_TOOLKIT_OTEL_SETUP``): every process appends
the spans it ends to the JSON-lines file ``APP_TOOLKIT_TEST_SPANS_FILE`` names."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

SPANS_FILE_ENV = "APP_TOOLKIT_TEST_SPANS_FILE"


class _LinesExporter(SpanExporter):
    def __init__(self, path: str) -> None:
        self._path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        for span in spans:
            context = span.get_span_context()
            assert context is not None
            line = {
                "name": span.name,
                "kind": span.kind.name,
                "trace": f"{context.trace_id:032x}",
                "span": f"{context.span_id:016x}",
                "parent": f"{span.parent.span_id:016x}" if span.parent else "",
                "error": span.status.status_code.name == "ERROR",
                "attributes": dict(span.attributes or {}),
                "pid": os.getpid(),
            }
            # One write per line to a file opened for appending: lines from several
            # processes do not interleave.
            fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, (json.dumps(line) + "\n").encode())
            finally:
                os.close(fd)
        return SpanExportResult.SUCCESS


def setup() -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(_LinesExporter(os.environ[SPANS_FILE_ENV])))
    trace.set_tracer_provider(provider)
