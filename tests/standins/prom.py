"""A Prometheus text page as `prometheus_client` writes one (exposition format 0.0.4):
HELP and TYPE lines for every metric declared (a counter by its `_total` name), a
histogram's samples as `_bucket`, `_count` and `_sum`, and no sample of a
label set until something was counted for it (`.labels(...)` is called on first use).
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
            out += [f"# HELP {name} {m.help}", f"# TYPE {name} {m.kind}"]
            if m.kind == "histogram":
                if not m.n:
                    continue
                sep = "," if self.labels else ""
                for bound, count in zip(m.buckets, m.counts, strict=True):
                    out.append(f'{name}_bucket{{{self.labels}{sep}le="{bound}"}} {float(count)}')
                out.append(f'{name}_bucket{{{self.labels}{sep}le="+Inf"}} {float(m.n)}')
                out.append(f"{name}_count{lab} {float(m.n)}")
                out.append(f"{name}_sum{lab} {m.total!r}")
            elif m.value is not None:
                out.append(f"{name}{lab} {float(m.value)!r}")
        return "\n".join(out) + "\n"
