"""/metrics: Prometheus text, read from engine.stats() at each scrape (with replicas, their sums), plus the
server's rejections."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

GAUGES = {   # engine.stats() key -> (metric, help)
    "running": ("shaderlm_requests_running", "Requests generating now"),
    "waiting": ("shaderlm_requests_waiting", "Requests queued for a free sequence slot"),
    "kv_pages_used": ("shaderlm_kv_pages_used", "KV cache pages in use"),
    "kv_pages_total": ("shaderlm_kv_pages_total", "KV cache pages in all"),
    "decode_tokens_per_second": ("shaderlm_decode_tokens_per_second", "Tokens generated per second, recently"),
    "parallel": ("shaderlm_parallel", "Sequences the engine runs at once, at most"),
    "replicas_ready": ("shaderlm_replicas_ready", "Engine replicas reporting (serve --replicas)"),
}
COUNTERS = {  # engine.stats() key -> (metric without _total, help)
    "requests_total": ("shaderlm_requests", "Requests the engine has taken"),
    "prompt_tokens_total": ("shaderlm_prompt_tokens", "Prompt tokens processed"),
    "completion_tokens_total": ("shaderlm_completion_tokens", "Completion tokens generated"),
}


class _EngineCollector:
    def __init__(self, engine):
        self.engine = engine

    def collect(self):
        stats = self.engine.stats()
        for key, (name, doc) in GAUGES.items():
            if key in stats:
                yield GaugeMetricFamily(name, doc, value=float(stats[key]))
        for key, (name, doc) in COUNTERS.items():
            if key in stats:
                yield CounterMetricFamily(name, doc, value=float(stats[key]))


class Metrics:
    """A registry per app, so that several apps (tests) can live in one process."""

    def __init__(self, engine):
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(engine))
        self.rejected = Counter("shaderlm_requests_rejected", "Requests answered with an error, by HTTP status",
                                ["code"], registry=self.registry)

    def reject(self, status: int):
        self.rejected.labels(code=str(status)).inc()

    def text(self) -> bytes:
        return generate_latest(self.registry)
