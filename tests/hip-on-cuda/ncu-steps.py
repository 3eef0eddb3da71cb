#!/usr/bin/env python3
"""Sums an ncu CSV (`ncu --metrics gpu__time_duration.sum --csv --page raw`, direct launches) per decode step.

A step starts at each ds4_embed_hc launch; prints the launches and kernel time of every whole step, then
the last whole step per kernel and grid (count x mean = total, share), and with a second argument (any)
the launch sequence of two layers in the middle of that step with each launch's duration (it tells
apart the matrices one kernel serves). Usage: ncu-steps.py FILE.csv [seq]"""
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if r]
hdr_i = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
hdr = rows[hdr_i]; body = rows[hdr_i + 1:]
if body and body[0][hdr.index("Kernel Name")] == "": body = body[1:]
k, g, b, m = (hdr.index(c) for c in ("Kernel Name", "Grid Size", "Block Size", "gpu__time_duration.sum"))
unit = rows[hdr_i + 1][m] if rows[hdr_i + 1][k] == "" else "?"
data = [(r[k], r[g], float(r[m].replace(",", ""))) for r in body if len(r) > m and r[m]]
print(f"{len(data)} kernels, unit {unit}")
# Decode steps: the embed launch starts each step.
starts = [i for i, d in enumerate(data) if d[0].startswith("ds4_embed_hc")]
if len(starts) >= 2:
    steps = [data[starts[i]:starts[i + 1]] for i in range(len(starts) - 1)]
    print("launches per step:", [len(s) for s in steps], "sum per step:", [round(sum(x[2] for x in s) / 1000, 1) for s in steps])
    step = steps[-1]
else:
    step = data
by = collections.defaultdict(lambda: [0, 0.0])
for name, grid, t in step:
    key = f"{name} {grid}"; by[key][0] += 1; by[key][1] += t
tot = sum(v[1] for v in by.values())
print(f"one step: {sum(v[0] for v in by.values())} launches, {tot/1000:.1f} (unit x1000) of kernel time")
for key, (n, t) in sorted(by.items(), key=lambda kv: -kv[1][1]):
    print(f"  {key:70s} {n:5d} x {t/n:9.1f} = {t/1000:8.1f}  {100*t/tot:5.1f}%")
# The launch sequence of two consecutive layers in the middle of the step (per-shape durations).
if len(sys.argv) > 2:
    mid = len(step) // 2
    hc = [i for i in range(mid, len(step)) if step[i][0].startswith("ds4_hc_post_pre")][:5]
    if len(hc) >= 5:
        print("launch sequence of two layers (from an attention HC post+pre):")
        for name, grid, t in step[hc[0]:hc[4] + 1]:
            print(f"    {name:45s} {grid:16s} {t/1000:7.2f}")
