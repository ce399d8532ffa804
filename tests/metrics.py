"""/metrics of a test app, parsed: the samples of each family, and sums over label matches."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["Families", "scrape", "shadow_divergence", "value"]

#: family name -> its samples (sample name, labels, value).
Families = dict[str, list[tuple[str, dict[str, str], float]]]


async def scrape(client) -> Families:
    response = await client.get("/metrics")
    assert response.status == 200
    families: Families = {}
    for family in text_string_to_metric_families(await response.text()):
        families.setdefault(family.name, []).extend(
            (s.name, s.labels, s.value) for s in family.samples)
    return families


def value(families: Families, family: str, sample: str | None = None, **labels: str) -> float:
    """The sum of ``family``'s samples named ``sample`` (default: the family's name) whose
    labels include ``labels``."""
    return sum(v for name, lab, v in families[family]
               if name == (sample or family) and all(lab.get(k) == x for k, x in labels.items()))


async def shadow_divergence(client, live: str, candidate: str) -> float:
    """``controlplane_policy_shadow_divergence_total`` for one (live, candidate) pair; 0 before
    the first divergence is counted."""
    families = await scrape(client)
    family = "controlplane_policy_shadow_divergence"
    if family not in families:
        return 0.0
    return value(families, family, f"{family}_total", live=live, candidate=candidate)
