"""Optional export of observability records as OpenTelemetry spans.

`OTelRecorder` turns each ObsRecord into a finished span with the record's start time,
duration and attributes (already OTel GenAI names) on a tracer of the given or the
global TracerProvider, so any configured exporter (an OTLP collector, Langfuse,
Jaeger) receives them. `otlp_recorder(endpoint)` builds a provider that ships spans
over OTLP/HTTP. Two ways records reach it:

- live: `polyrl agent --otel-endpoint URL`, and `polyrl train --otel-endpoint URL`, whose
  loop hands the recorder every record it commits, training and evaluation alike (each
  span carries x.phase and x.domain; a resumed run sends a repeated step's spans again);
- afterwards: `export_store(RUN_DIR, recorder, phase)` (`polyrl obs RUN_DIR --otel-endpoint
  URL`) sends the records a store holds, e.g. a finished run's or an evaluation's.

The `opentelemetry-*` packages are an optional extra (`pip install 'polyrl[otel]'`),
imported only when a recorder is built.

Out of scope: span parenting (each record is a root span; the episode id is in
gen_ai.conversation.id) and OTel metrics instruments.
"""

from __future__ import annotations

import json
from typing import Any

from pathlib import Path

from polyrl.obs.records import ObsRecord, Recorder
from polyrl.obs.store import read_records

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
        self.provider = tracer_provider or trace.get_tracer_provider()
        self.tracer = self.provider.get_tracer("polyrl")

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


def export_store(path: str | Path, recorder: Recorder, phase: str | None = None) -> int:
    """Send the records of the store at `path` (one phase's, or all) to `recorder`; returns how many."""
    n = 0
    for rec in read_records(path, phase=phase):
        recorder.record(rec)
        n += 1
    return n


def flush(recorder: Recorder) -> None:
    """Push spans still buffered by the recorder's provider (a BatchSpanProcessor) out now."""
    provider = getattr(recorder, "provider", None)
    if provider is not None and hasattr(provider, "force_flush"):
        provider.force_flush()
