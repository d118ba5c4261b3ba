#!/usr/bin/env python3
"""Where a training step's GPU time goes: the kernels Nsight Compute timed in a `loom train` run
(`ncu --metrics gpu__time_duration.sum --csv`, one row per kernel launch), summed by kernel name,
the largest first, with each one's share of the total, its launch count and mean duration. With
--steps N the totals are also divided by N (per step); with --step-ms M the table ends with the
GPU-busy fraction M would leave (kernel time per step over the step's wall time, measured
without the profiler).

  kernel_profile.py NCU_CSV [--steps N] [--step-ms M] [--top K]
"""
import argparse
import csv
import re
import sys

# ncu's time units in ms, long names and short (ncu 2025 on an H200 writes "ns").
UNITS = {"nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0, "second": 1e3,
         "ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}


def short_name(name):
    """A kernel's name without its argument list, templates kept (they tell the variants apart)."""
    depth = 0
    for i, ch in enumerate(name):
        if ch in "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            name = name[:i]
            break
    name = re.sub(r"\s+", " ", name).strip()
    return name if len(name) <= 90 else name[:87] + "..."


def kernel_times(path):
    """[(kernel name, milliseconds)] of every launch in an ncu CSV."""
    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        lines = [line for line in f if line.startswith('"')]  # ncu prints its own notes before the table
    rows = csv.DictReader(lines)
    needed = {"Kernel Name", "Metric Name", "Metric Unit", "Metric Value"}
    if rows.fieldnames is None or not needed <= set(rows.fieldnames):
        raise ValueError(f"{path}: not an ncu --csv table (columns {rows.fieldnames}; need {sorted(needed)})")
    times = []
    for row in rows:
        if row["Metric Name"] != "gpu__time_duration.sum":
            continue
        unit = row["Metric Unit"]
        if unit not in UNITS:
            raise ValueError(f"{path}: unknown unit '{unit}' for {row['Kernel Name']}")
        times.append((short_name(row["Kernel Name"]), float(row["Metric Value"].replace(",", "")) * UNITS[unit]))
    if not times:
        raise ValueError(f"{path}: no gpu__time_duration.sum rows (was ncu run with --metrics gpu__time_duration.sum?)")
    return times


def table(times, steps, step_ms, top):
    totals = {}
    for name, ms in times:
        count, total = totals.get(name, (0, 0.0))
        totals[name] = (count + 1, total + ms)
    whole = sum(total for _, total in totals.values())
    out = [f"{'kernel':90} {'ms/step':>9} {'share':>6} {'launches':>8} {'mean us':>8}"]
    ranked = sorted(totals.items(), key=lambda item: -item[1][1])
    for name, (count, total) in ranked[:top]:
        out.append(f"{name:90} {total / steps:9.3f} {100 * total / whole:5.1f}% {count // steps:8d} "
                   f"{1e3 * total / count:8.1f}")
    rest = ranked[top:]
    if rest:
        rest_ms = sum(total for _, (_, total) in rest)
        out.append(f"{'(' + str(len(rest)) + ' other kernels)':90} {rest_ms / steps:9.3f} {100 * rest_ms / whole:5.1f}%")
    line = f"kernel time per step: {whole / steps:.3f} ms over {len(times) // steps} launches"
    if step_ms:
        line += f"; the step's wall time {step_ms:.3f} ms: the GPU busy {100 * whole / steps / step_ms:.1f}% of it"
    out.append(line)
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--steps", type=int, default=1, help="training steps the profile covers")
    ap.add_argument("--step-ms", type=float, help="one step's wall time without the profiler")
    ap.add_argument("--top", type=int, default=20)
    a = ap.parse_args()
    if a.steps < 1:
        raise ValueError(f"--steps {a.steps}: must be at least 1")
    print(table(kernel_times(a.csv), a.steps, a.step_ms, a.top))


if __name__ == "__main__":
    try:
        main()
    except (OSError, ValueError) as e:
        sys.exit(f"kernel_profile: {e}")
