"""A service's Prometheus exposition read back as prometheus-client's own parser reads it, so a
malformed exposition fails the reader whatever its author meant, and a test names series by what a
scraper sees (`name{label="value",...}`, labels sorted)."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families


def samples(text: str) -> dict[str, float]:
    """`name{label="value",...}` → value for every sample of the exposition."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return out


def scrape(base_url: str, timeout: float = 10.0) -> dict[str, float]:
    """The samples of `base_url`/metrics (an error unless it answers 200)."""
    response = httpx.get(f"{base_url}/metrics", timeout=timeout)
    response.raise_for_status()
    return samples(response.text)


def total(scraped: dict[str, float], name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels` (0 when there are none)."""
    wanted = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(
        value
        for key, value in scraped.items()
        if key.partition("{")[0] == name and all(w in key.partition("{")[2] for w in wanted)
    )
