"""Optional export of observability records as OpenTelemetry spans.

`OTelRecorder` turns each ObsRecord into a finished span with the record's start time,
duration and attributes (already OTel GenAI names) on a tracer of the given or the
global TracerProvider, so any configured exporter (an OTLP collector, Langfuse,
Jaeger) receives them. `otlp_recorder(endpoint)` builds a provider that ships spans
over OTLP/HTTP.

The `opentelemetry-*` packages are an optional extra (`pip install 'polyrl[otel]'`),
imported only when a recorder is built.

Out of scope: span parenting (each record is a root span; the episode id is in
gen_ai.conversation.id) and OTel metrics instruments.
"""

from __future__ import annotations

import json
from typing import Any

from polyrl.obs.records import ObsRecord

_MISSING = ("OpenTelemetry export needs the optional packages: pip install 'polyrl[otel]'  "
            "(opentelemetry-sdk and opentelemetry-exporter-otlp-proto-http)")


def _otel_value(value: Any) -> Any:
    """OTel attributes take str, bool, int, float and homogeneous lists of them."""
    if isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return list(value)
    return json.dumps(value, default=str)


class OTelRecorder:
    def __init__(self, tracer_provider: Any = None):
        try:
            from opentelemetry import trace
        except ImportError as exc:
            raise ImportError(_MISSING) from exc
        provider = tracer_provider or trace.get_tracer_provider()
        self.tracer = provider.get_tracer("polyrl")

    def record(self, rec: ObsRecord) -> None:
        start_ns = int(rec.start_time * 1e9)
        attributes = {k: _otel_value(v) for k, v in rec.attributes.items() if v is not None}
        attributes.update({"x.record.kind": rec.kind, "x.trace_id": rec.trace_id})
        span = self.tracer.start_span(rec.name, start_time=start_ns, attributes=attributes)
        span.end(end_time=start_ns + int((rec.duration_s or 0.0) * 1e9))


def otlp_recorder(endpoint: str) -> OTelRecorder:
    """A recorder exporting over OTLP/HTTP to `endpoint` (e.g. http://localhost:4318/v1/traces)."""
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise ImportError(_MISSING) from exc
    provider = TracerProvider(resource=Resource.create({"service.name": "polyrl"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    return OTelRecorder(provider)
