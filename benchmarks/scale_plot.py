"""The scale benchmark's curves as one image (docs/img/scale.png), with the targets and
the figures Ray Serve has published for its own controller beside ours."""

from __future__ import annotations

from typing import Any

#: Ray Serve's controller loop, mean duration per iteration, autoscaled to a pinned 8,192
#: replicas on a 211-node cluster (ray-project/ray#64507: before -> after that change).
#: Its loop does what our reconcile pass does plus Ray calls; ours is simulated here.
RAY_SERVE_LOOP_MS = {8192: (1267.0, 921.0)}


def plot(results: list[dict[str, float]], path: str) -> None:
    """Four panels against the replica count: reconcile time, fan-out, memory, CPU."""
    import matplotlib

    matplotlib.use("Agg")  # no display on these machines
    import matplotlib.pyplot as plt

    replicas = [r["replicas"] for r in results]
    figure, axes = plt.subplots(2, 2, figsize=(11, 7.5), constrained_layout=True)
    reconcile, fan_out, memory, cpu = axes.flat

    reconcile.plot(replicas, [r["reconcile_p50_ms"] for r in results], "o-", label="app_toolkit p50")
    reconcile.plot(replicas, [r["reconcile_p99_ms"] for r in results], "s-", label="app_toolkit p99")
    for count, (before, after) in RAY_SERVE_LOOP_MS.items():
        reconcile.plot([count, count], [before, after], "k^", label="Ray Serve loop, mean (#64507)")
    reconcile.axhline(100, color="grey", linestyle="--", label="target p99 < 100 ms")
    _axes(reconcile, "Reconcile pass (ms)", log_y=True)

    median_ms = [r["fan_out_s"] * 1000 for r in results]
    fan_out.plot(replicas, median_ms, "o-", label="new table -> every caller, median")
    fan_out.plot(replicas, [r["fan_out_max_s"] * 1000 for r in results], "s--", label="max of the deaths")
    fan_out.axhline(1000, color="grey", linestyle="--", label="target < 1 s")
    _axes(fan_out, "Fan-out of a new table (ms)", log_y=True)

    memory.plot(replicas, [r["rss_growth_mb"] for r in results], "o-", label="controller RSS growth")
    memory.axhline(1024, color="grey", linestyle="--", label="target < 1 GB")
    _axes(memory, "Memory (MB)", log_y=True)

    cpu.plot(replicas, [r["steady_cpu"] for r in results], "o-", label="steady state")
    cpu.plot(replicas, [r["churn_cpu"] for r in results], "s-", label="with replicas dying")
    cpu.axhline(0.5, color="grey", linestyle="--", label="target < 0.5 core")
    _axes(cpu, "Controller CPU (cores)", log_y=False)

    sizes = ", ".join(f"{int(r['replicas'])}/{int(r['nodes'])}/{int(r['deployments'])}" for r in results)
    figure.suptitle(f"One controller, simulated replicas and callers (replicas/nodes/apps: {sizes})")
    figure.savefig(path, dpi=90)
    plt.close(figure)


def _axes(axes: Any, title: str, log_y: bool) -> None:
    axes.set_xscale("log")
    if log_y:
        axes.set_yscale("log")
    axes.set_xlabel("replicas")
    axes.set_title(title)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize="small")
