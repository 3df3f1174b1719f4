#!/usr/bin/env python3
"""Where the slowest hot lookups of a cold-suite run waited: the hot client's and the event loop's
runnable-but-not-running time, split by how it began, and what held the core meanwhile.

  perf sched record -k CLOCK_MONOTONIC -o sched.data -- \\
      build-bench/bench/kvtier-bench --suite cold --reps 1 --hot-samples hot.txt
  perf sched timehist --state -w -i sched.data > timehist.txt
  scripts/hot-waits.py hot.txt timehist.txt HOT_TID LOOP_TID [--kind spilling|idle] [--top N]

HOT_TID: the bench's main thread (it takes the hot lookups); LOOP_TID: the measured repetition's
kvtierd (its main thread is the event loop). A thread is "preempted" from the moment it left a
core still runnable (state R) until it ran again, and "woken" from its wake-up until it ran
(sch delay). The last lines count who took the core at each preemption inside those lookups.
Only the measured repetition (1) is read. Companion of scripts/hot-tail.py (CPU time by thread).
"""
import argparse
import collections
import re

ROW = re.compile(r'\s*([\d.]+)\s+\[(\d+)\]\s+(.+?)\[(\d+)(?:/\d+)?\]\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\S+)\s*$')


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('samples')
    ap.add_argument('timehist')
    ap.add_argument('hot_tid')
    ap.add_argument('loop_tid')
    ap.add_argument('--kind', default='spilling', choices=['spilling', 'idle'])
    ap.add_argument('--top', type=int, default=20)
    a = ap.parse_args()

    runs = collections.defaultdict(list)  # cpu -> [(start, end, "name:tid")]
    rows = collections.defaultdict(list)  # tid -> [(start, end, state at switch-out, sch delay)]
    for line in open(a.timehist):
        m = ROW.match(line)
        if not m:
            continue
        end, cpu, name, tid = float(m.group(1)), m.group(2), m.group(3).strip(), m.group(4)
        delay, run, state = float(m.group(6)) / 1e3, float(m.group(7)) / 1e3, m.group(8)
        runs[cpu].append((end - run, end, '%s:%s' % (name, tid)))
        rows[tid].append((end - run, end, state, delay, cpu))

    def waits(tid):
        out = []
        r = rows[tid]
        for prev, cur in zip(r, r[1:]):
            if prev[2].startswith('R'):
                out.append((prev[1], cur[0], 'preempted', cur[4]))
            elif cur[3] > 0:
                out.append((cur[0] - cur[3], cur[0], 'woken', cur[4]))
        return out

    def holders(lo, hi, cpu):
        held = collections.Counter()
        for s, e, who in runs[cpu]:
            overlap = min(hi, e) - max(lo, s)
            if overlap > 0:
                held[who] += overlap
        return held

    lookups = []
    for line in open(a.samples):
        rep, kind, start, us = line.split()
        if rep == '1' and kind == a.kind:
            lookups.append((float(start), float(us) / 1e6))
    lookups.sort(key=lambda x: -x[1])
    lookups = lookups[:a.top]
    if not lookups:
        raise SystemExit('no %s lookups of repetition 1 in %s' % (a.kind, a.samples))
    n = len(lookups)

    total = collections.Counter()
    behind = collections.Counter()
    takers = collections.Counter()
    for who, tid in (('hot', a.hot_tid), ('loop', a.loop_tid)):
        for lo, hi, how, cpu in waits(tid):
            inside = [(s, d) for s, d in lookups if max(lo, s) < min(hi, s + d)]
            for s, d in inside:
                o0, o1 = max(lo, s), min(hi, s + d)
                total[(who, how)] += o1 - o0
                for holder, t in holders(o0, o1, cpu).items():
                    behind[(who, how, holder)] += t
            if inside and how == 'preempted':
                nxt = sorted(x for x in runs[cpu] if x[0] >= lo - 1e-6)
                if nxt:
                    takers[(who, nxt[0][2])] += 1

    print('%d slowest %s lookups, mean %.0f us; waiting per lookup:' %
          (n, a.kind, sum(d for _, d in lookups) / n * 1e6))
    for (who, how), t in total.most_common():
        print('  %-4s %-9s %6.0f us' % (who, how, t / n * 1e6))
    print('behind (us per lookup):')
    for (who, how, holder), t in behind.most_common(12):
        print('  %-4s %-9s %-32s %6.0f' % (who, how, holder, t / n * 1e6))
    print('preemptions, by the thread that took the core:')
    for (who, taker), count in takers.most_common(10):
        print('  %-4s %-32s %d' % (who, taker, count))


if __name__ == '__main__':
    main()
