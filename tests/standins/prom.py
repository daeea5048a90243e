"""A Prometheus text page (exposition format 0.0.4) as the servers stood in for write
one: a metric appears, its HELP and TYPE lines with it, only once something was written
to it (prometheus_client's multiprocess collector, which SGLang's
`utils/common.py add_prometheus_middleware` and TensorRT-LLM's `mount_metrics` use, reads
only what was written; metrics-exporter-prometheus, TGI's, renders what was recorded);
a counter by its full name, a histogram's samples as `_bucket`, `_count` and `_sum`.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class _Metric:
    kind: str  # "counter", "gauge", "histogram"
    help: str
    buckets: tuple[float, ...] = ()
    value: float | None = None  # counter, gauge: None until first counted
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0


class Page:
    """Metrics of one label set (`labels`), rendered by `text()`."""

    def __init__(self, labels: dict[str, str]) -> None:
        self.labels = ",".join(f'{k}="{v}"' for k, v in labels.items())
        self.metrics: dict[str, _Metric] = {}

    def counter(self, name: str, help: str) -> None:
        self.metrics[name] = _Metric("counter", help)

    def gauge(self, name: str, help: str) -> None:
        self.metrics[name] = _Metric("gauge", help)

    def histogram(self, name: str, help: str, buckets: tuple[float, ...]) -> None:
        self.metrics[name] = _Metric("histogram", help, buckets, counts=[0] * len(buckets))

    def inc(self, name: str, by: float = 1.0) -> None:
        m = self.metrics[name]
        m.value = (m.value or 0.0) + by

    def set(self, name: str, value: float) -> None:
        self.metrics[name].value = value

    def observe(self, name: str, value: float) -> None:
        m = self.metrics[name]
        m.n += 1
        m.total += value
        for i, bound in enumerate(m.buckets):
            if value <= bound:
                m.counts[i] += 1

    def text(self) -> str:
        out: list[str] = []
        lab = f"{{{self.labels}}}" if self.labels else ""
        for name, m in self.metrics.items():
            if (m.kind == "histogram" and not m.n) or (m.kind != "histogram" and m.value is None):
                continue  # nothing written yet
            out += [f"# HELP {name} {m.help}", f"# TYPE {name} {m.kind}"]
            if m.kind == "histogram":
                sep = "," if self.labels else ""
                for bound, count in zip(m.buckets, m.counts, strict=True):
                    out.append(f'{name}_bucket{{{self.labels}{sep}le="{bound}"}} {float(count)}')
                out.append(f'{name}_bucket{{{self.labels}{sep}le="+Inf"}} {float(m.n)}')
                out.append(f"{name}_count{lab} {float(m.n)}")
                out.append(f"{name}_sum{lab} {m.total!r}")
            else:
                out.append(f"{name}{lab} {float(m.value or 0.0)!r}")
        return "\n".join(out) + "\n"
