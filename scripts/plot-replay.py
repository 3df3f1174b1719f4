#!/usr/bin/python3
"""Merges and plots the JSON of `kvtier replay` runs: hit rate against total capacity, kvtier
beside the ideal LRU of the same capacity (and, for several nodes, isolated LRUs of each node's).

  plot-replay.py [--merge OUT.json] [--meta KEY=VALUE ...] [--out FILE.png] RUNS.json ...

Each input holds {"runs": [...]} as `kvtier replay --json` writes it (or a merged file). With
--merge the runs of all inputs are written to one document, with a "summary" per configuration
(median and min-max over repetitions). Needs matplotlib only for --out (Debian: python3-matplotlib;
run it with /usr/bin/python3 where another python3 comes first on the PATH).
"""
import argparse
import json
import statistics
import sys


def load_runs(paths):
    runs = []
    for path in paths:
        with open(path) as f:
            runs.extend(json.load(f)["runs"])
    return runs


def config_of(run):
    return (run["nodes"], run["route"], run["capacity_blocks"], run.get("speedup"))


def summarize(runs):
    """One entry per configuration: median, min and max over its repetitions."""
    groups = {}
    for run in runs:
        groups.setdefault(config_of(run), []).append(run)
    out = []
    for (nodes, route, capacity, speedup), rs in sorted(
            groups.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2], kv[0][3] or 0)):
        entry = {"nodes": nodes, "route": route, "capacity_blocks": capacity,
                 "total_capacity_blocks": capacity * nodes, "speedup": speedup,
                 "repetitions": len(rs), "requests": rs[0]["requests"]}
        for key in ("hit_rate", "ideal_lru_hit_rate", "diff_pp", "isolated_lru_hit_rate",
                    "ratio_to_isolated", "cluster_model_hit_rate",
                    "cluster_model_fetched_last_hit_rate", "copies_per_key", "remote_hit_blocks",
                    "fetch_errors", "lookups_over_1s", "wall_s"):
            values = [r[key] for r in rs if r.get(key) is not None]
            if values:
                entry[key] = {"median": statistics.median(values), "min": min(values),
                              "max": max(values)}
        out.append(entry)
    return out


def plot(runs, png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.2))
    # The ideal LRU curve (same requests; the longest run's curve, plus every run's own point).
    longest = max(runs, key=lambda r: r["requests"])
    same = [r for r in runs if r["requests"] == longest["requests"]]
    # Paced runs (--speedup) are a check on the as-fast-as-possible ones: plotted only alone.
    unpaced = [r for r in same if r.get("speedup") is None]
    same = unpaced or same
    curve = {c: rate for c, rate in longest.get("ideal_lru_curve", [])}
    for r in same:
        curve[r["ideal_lru_capacity_blocks"]] = r["ideal_lru_hit_rate"]
    xs = sorted(curve)
    ax.plot(xs, [100 * curve[x] for x in xs], "-", color="0.35", lw=1.5,
            label="ideal LRU of the total capacity (offline)")
    # Belady's optimum of the same requests (offline), the bound a policy is judged against.
    opt = {c: rate for c, rate in longest.get("opt_curve", [])}
    for r in same:
        if "opt_hit_rate" in r:
            opt[r["ideal_lru_capacity_blocks"]] = r["opt_hit_rate"]
    if opt:
        xo = sorted(opt)
        ax.plot(xo, [100 * opt[x] for x in xo], "--", color="0.2", lw=1.5,
                label="Belady's optimum of the total capacity (offline)")
    inf = longest.get("infinite_cache_hit_rate")
    if inf is not None:
        ax.axhline(100 * inf, color="0.6", ls=":", lw=1, label="infinite cache")

    # Points of one capacity coincide where kvtier meets its anchor: sizes and fills differ so
    # that each stays visible.
    styles = {
        ("single", None): dict(marker="o", color="tab:blue", ms=13, mfc="none", mew=2, ls="none"),
        ("session", None): dict(marker="s", color="tab:green", ms=6, ls="none"),
        ("round-robin", None): dict(marker="^", color="tab:red", ms=8, ls="none"),
        ("session", "isolated"): dict(marker="x", color="darkgreen", ms=10, mew=1.5, ls="none"),
        ("round-robin", "isolated"): dict(marker="^", color="tab:red", ms=8, ls="none",
                                          mfc="none"),
        ("round-robin", "model"): dict(marker="_", color="black", ms=16, mew=2, ls="none"),
        ("round-robin", "what-if"): dict(marker="+", color="0.4", ms=12, mew=1.5, ls="none"),
    }
    summary = summarize(same)
    seen = set()

    def point(key, x, stat, label):
        med = 100 * stat["median"]
        err = [[med - 100 * stat["min"]], [100 * stat["max"] - med]]
        ax.errorbar([x], [med], yerr=err, capsize=3,
                    label=None if key in seen else label, **styles[key])
        seen.add(key)

    for e in summary:
        x = e["total_capacity_blocks"]
        if e["nodes"] == 1:
            point(("single", None), x, e["hit_rate"], "kvtier, 1 node")
            continue
        n = e["nodes"]
        point((e["route"], None), x, e["hit_rate"], f"kvtier, {n}-node cluster, route {e['route']}")
        if "isolated_lru_hit_rate" in e:
            point((e["route"], "isolated"), x, e["isolated_lru_hit_rate"],
                  f"{n} isolated LRUs, route {e['route']} (offline)")
        if e["route"] == "round-robin" and "cluster_model_hit_rate" in e:
            point(("round-robin", "model"), x, e["cluster_model_hit_rate"],
                  "model: LRUs whose remote hits are copied (offline)")
            point(("round-robin", "what-if"), x, e["cluster_model_fetched_last_hit_rate"],
                  "what-if: copies evicted first (offline)")
    ax.set_xlabel("total capacity (blocks of 512 trace tokens = 16 kvtier tokens)")
    ax.set_ylabel("hit rate (% of request blocks)")
    ax.set_title(f"Mooncake synthetic trace, {longest['requests']} requests: kvtier, ideal LRU, optimum")
    ax.set_xlim(0, max(xs) * 1.02)
    ax.set_ylim(0, 100 * (inf or max(curve.values())) + 8)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("inputs", nargs="+")
    p.add_argument("--merge", help="write all runs (and a summary) to this JSON file")
    p.add_argument("--meta", action="append", default=[], help="KEY=VALUE for the merged file")
    p.add_argument("--out", help="the PNG to write")
    a = p.parse_args()
    runs = load_runs(a.inputs)
    if not runs:
        sys.exit("plot-replay: no runs")
    if a.merge:
        doc = {"tool": "kvtier replay", "block_tokens": 16}
        for kv in a.meta:
            key, _, value = kv.partition("=")
            try:
                doc[key] = json.loads(value)
            except json.JSONDecodeError:
                doc[key] = value
        doc["summary"] = summarize(runs)
        doc["runs"] = runs
        with open(a.merge, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
    if a.out:
        plot(runs, a.out)


if __name__ == "__main__":
    main()
