#!/usr/bin/env python3
"""Which threads held the cores during the slowest hot lookups of a cold-suite run.

  perf sched record -k CLOCK_MONOTONIC -o sched.data -- \\
      build-bench/bench/kvtier-bench --suite cold --reps 1 --hot-samples hot.txt
  perf sched timehist -i sched.data -w > timehist.txt
  scripts/hot-tail.py hot.txt timehist.txt [--kind spilling|idle] [--top N]

For the N slowest lookups of the kind, prints each thread's CPU time inside those lookups (summed
over both cores, averaged per lookup) and the five slowest one by one. A lookup slowed by a
thread that held a core shows that thread; a lookup that waited while its own threads ran little
points at something else (a blocked call, a wake-up that came late).
"""
import argparse
import collections
import re

ROW = re.compile(r'\s*([\d.]+)\s+\[(\d+)\]\s+(.+?)\[(\d+)(?:/\d+)?\]\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$')


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('samples')
    ap.add_argument('timehist')
    ap.add_argument('--kind', default='spilling', choices=['spilling', 'idle'])
    ap.add_argument('--top', type=int, default=30)
    a = ap.parse_args()

    lookups = []
    for line in open(a.samples):
        _, kind, start, us = line.split()
        if kind == a.kind:
            lookups.append((float(start), float(us)))
    lookups.sort(key=lambda x: -x[1])
    lookups = lookups[:a.top]
    if not lookups:
        raise SystemExit('no %s lookups in %s' % (a.kind, a.samples))

    # Each timehist row ends a run of a thread on a core: (start, end, "name:tid") per core.
    runs = collections.defaultdict(list)
    for line in open(a.timehist):
        m = ROW.match(line)
        if m:
            end = float(m[1])
            runs[int(m[2])].append((end - float(m[7]) / 1e3, end, '%s:%s' % (m[3], m[4])))

    def held(t0, t1):
        out = collections.Counter()
        for core in runs.values():
            for s, e, who in core:
                if e > t0 and s < t1:
                    out[who] += (min(e, t1) - max(s, t0)) * 1e6
        return out

    total = collections.Counter()
    for start, us in lookups:
        total.update(held(start, start + us / 1e6))
    mean = sum(us for _, us in lookups) / len(lookups)
    print('%d slowest %s lookups, mean %.0f us; CPU us per lookup by thread:' % (len(lookups), a.kind, mean))
    for who, us in total.most_common(12):
        print('  %-36s %7.0f' % (who, us / len(lookups)))
    for start, us in lookups[:5]:
        top = ', '.join('%s %.0f' % (w, v) for w, v in held(start, start + us / 1e6).most_common(5))
        print('lookup at %.6f, %.0f us: %s' % (start, us, top))


if __name__ == '__main__':
    main()
