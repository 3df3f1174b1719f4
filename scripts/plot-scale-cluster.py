#!/usr/bin/python3
"""Plots the JSON of `kvtier-bench --suite scale-cluster`: per remote lookup, the messages and
round trips against the member count, and the directory queries the busiest member answers
against the mean, for the per-key rendezvous directory ("before") and the anchored one ("runs").

  plot-scale-cluster.py [--workload mooncake] [--out bench/results/scale-cluster.png] FILE.json

Needs matplotlib (Debian: python3-matplotlib; run it with /usr/bin/python3 where another python3
comes first on the PATH).
"""
import argparse
import json


def series(runs, workload, design, field):
    pts = sorted((r["members"], r[field]) for r in runs
                 if r["workload"] == workload and r["design"] == design)
    return [p[0] for p in pts], [p[1] for p in pts]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("json")
    p.add_argument("--workload", default="mooncake")
    p.add_argument("--out", default="bench/results/scale-cluster.png")
    a = p.parse_args()
    with open(a.json) as f:
        doc = json.load(f)
    runs = doc["runs"] + doc["before"]
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    designs = sorted({r["design"] for r in runs if r["workload"] == a.workload})
    panels = [("messages_per_lookup", "messages per remote lookup", True),
              ("round_trips_per_lookup", "sequential round trips per remote lookup", False),
              ("max_mean_queries", "directory queries: busiest member / mean", False)]
    for ax, (field, title, log) in zip(axes, panels):
        for d in designs:
            x, y = series(runs, a.workload, d, field)
            ax.plot(x, y, marker="o", label=d)
        ax.set_xscale("log", base=2)
        if log:
            ax.set_yscale("log")
        ax.set_xlabel("members")
        ax.set_title(title, fontsize=10)
        ax.grid(True, alpha=0.3)
    axes[0].axhline(4, color="grey", linestyle="--", linewidth=0.8)
    axes[1].axhline(2, color="grey", linestyle="--", linewidth=0.8)
    axes[2].axhline(2, color="grey", linestyle="--", linewidth=0.8)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"kvtier's cluster directory at scale ({a.workload}; dashed: the targets)")
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    print(a.out)


if __name__ == "__main__":
    main()
