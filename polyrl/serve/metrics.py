"""The server's counters in Prometheus text format (`GET /metrics`).

polyrl_requests_total{endpoint,tier,status}, polyrl_prompt_tokens_total{tier},
polyrl_completion_tokens_total{tier}, polyrl_prefix_cache_hit_tokens_total{tier} (prompt
tokens served from the prefix cache), polyrl_in_flight_requests{tier} (the queue depth a
429 guards), polyrl_weight_version{tier}, and polyrl_time_to_first_token_seconds{tier}, a
histogram. Written by hand (the format is a few lines of text) rather than with
prometheus_client, one dependency fewer; observations come from request handlers and
engine threads, hence the lock.
"""

from __future__ import annotations

import threading
from collections import Counter, defaultdict
from typing import Iterable

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: Counter[tuple[str, str, int]] = Counter()
        self.tokens: Counter[tuple[str, str]] = Counter()
        """(kind, tier) -> tokens; kind is prompt, completion or cached."""
        self._ttft_counts: dict[str, list[int]] = defaultdict(lambda: [0] * (len(TTFT_BUCKETS) + 1))
        self._ttft_sum: Counter[str] = Counter()

    def request(self, endpoint: str, tier: str, status: int) -> None:
        with self._lock:
            self.requests[(endpoint, tier, status)] += 1

    def usage(self, tier: str, prompt: int, completion: int, cached: int) -> None:
        with self._lock:
            self.tokens[("prompt", tier)] += prompt
            self.tokens[("completion", tier)] += completion
            self.tokens[("cached", tier)] += cached

    def first_token(self, tier: str, seconds: float) -> None:
        with self._lock:
            counts = self._ttft_counts[tier]
            counts[next((i for i, b in enumerate(TTFT_BUCKETS) if seconds <= b), len(TTFT_BUCKETS))] += 1
            self._ttft_sum[tier] += seconds

    def render(self, gauges: Iterable[tuple[str, str, float]]) -> str:
        """The exposition text; `gauges` are (name, tier, value) read from the tiers now."""
        gauges = list(gauges)
        with self._lock:
            lines = ["# TYPE polyrl_requests_total counter"]
            lines += [f'polyrl_requests_total{{endpoint="{e}",tier="{t}",status="{s}"}} {n}'
                      for (e, t, s), n in sorted(self.requests.items())]
            for kind, name in (("prompt", "prompt_tokens"), ("completion", "completion_tokens"),
                               ("cached", "prefix_cache_hit_tokens")):
                lines.append(f"# TYPE polyrl_{name}_total counter")
                lines += [f'polyrl_{name}_total{{tier="{t}"}} {n}'
                          for (k, t), n in sorted(self.tokens.items()) if k == kind]
            lines.append("# TYPE polyrl_time_to_first_token_seconds histogram")
            for tier, counts in sorted(self._ttft_counts.items()):
                total = 0
                for bound, count in zip([*map(str, TTFT_BUCKETS), "+Inf"], counts):
                    total += count
                    lines.append(f'polyrl_time_to_first_token_seconds_bucket{{tier="{tier}",le="{bound}"}} {total}')
                lines.append(f'polyrl_time_to_first_token_seconds_sum{{tier="{tier}"}} {self._ttft_sum[tier]:.6f}')
                lines.append(f'polyrl_time_to_first_token_seconds_count{{tier="{tier}"}} {total}')
        for name in sorted({g[0] for g in gauges}):
            lines.append(f"# TYPE polyrl_{name} gauge")
            lines += [f'polyrl_{n}{{tier="{t}"}} {v:g}' for n, t, v in gauges if n == name]
        return "\n".join(lines) + "\n"
