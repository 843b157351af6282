"""The ``hpkv simulate`` chart: where prompt tokens came from, and TTFT, per strategy (PNG).

matplotlib is imported here only, with the Agg backend, so nothing else pays for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from hpkv.errors import UsageError

if TYPE_CHECKING:
    from hpkv.sizing.runner import Simulation

_TIER_COLOURS = {"L0 (GPU)": "#2b8a3e", "L1 (CPU)": "#74b816", "L2 (NVMe)": "#1c7ed6"}


def write_chart(simulation: Simulation, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = simulation.to_dict()
    names = [row["strategy"] for row in rows["strategies"]]
    figure, (tiers, ttft) = plt.subplots(1, 2, figsize=(12, 4.8))
    bottom = [0.0] * len(names)
    for label, key in (("L0 (GPU)", "l0"), ("L1 (CPU)", "l1"), ("L2 (NVMe)", "l2")):
        shares = [row["hitRate"][key] * 100 for row in rows["strategies"]]
        tiers.bar(names, shares, bottom=bottom, label=label, color=_TIER_COLOURS[label])
        bottom = [b + s for b, s in zip(bottom, shares, strict=True)]
    recomputed = [100 - b for b in bottom]
    tiers.bar(names, recomputed, bottom=bottom, label="recomputed", color="#dee2e6")
    tiers.set_ylabel("% of prompt tokens")
    tiers.set_ylim(0, 100)
    tiers.set_title("Where prompt tokens came from")
    tiers.legend(loc="lower right", fontsize="small")

    for cluster in simulation.clusters:
        points = cluster.cdf()
        if points:
            xs, ys = zip(*points, strict=True)
            ttft.step(xs, [y * 100 for y in ys], where="post", label=cluster.strategy)
    ttft.set_xscale("log")
    ttft.set_xlabel("TTFT (ms, log scale)")
    ttft.set_ylabel("% of requests at or below")
    ttft.set_title("TTFT distribution")
    ttft.grid(True, which="both", alpha=0.3)
    ttft.legend(loc="lower right", fontsize="small")

    cost = simulation.cost
    workload = rows["workload"]["kind"]
    figure.suptitle(
        f"{cost.model.key} on {cost.replicas} x {cost.instance.name} (tp {cost.tp}), "
        f"{workload}, {rows['requests']:,} requests, seed {rows['seed']}"
    )
    figure.tight_layout()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, format="png", dpi=110, metadata={"Software": None})
    except OSError as exc:
        raise UsageError(
            f"cannot write the chart to {path}: {exc.strerror or exc}",
            fix="pass a writable path to --chart, or --no-chart",
        ) from None
    finally:
        plt.close(figure)
    return path
