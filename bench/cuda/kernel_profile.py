#!/usr/bin/env python3
"""Where a training step's GPU time goes: the kernels Nsight Compute timed in a `loom train` run
(`ncu --metrics gpu__time_duration.sum --csv`, one row per kernel launch and metric), summed by
kernel name, the largest first, with each one's share of the total, its launch count and mean
duration. With --steps N the totals are also divided by N (per step); with --step-ms M the table
ends with the GPU-busy fraction M would leave (kernel time per step over the step's wall time,
measured without the profiler). When the CSV also holds dram__bytes_read.sum and
dram__bytes_write.sum (train_bench.sh's PROFILE_BYTES=1), each kernel's DRAM traffic over its time
(TB/s, against the card's ~4.8 of an H200) and, with sm__warps_active.avg.pct_of_peak_sustained_active,
its achieved occupancy (time-weighted) follow: what a memory-bound kernel leaves on the table.

  kernel_profile.py NCU_CSV [--steps N] [--step-ms M] [--top K]
"""
import argparse
import csv
import re
import sys

# ncu's time units in ms, long names and short (ncu 2025 on an H200 writes "ns").
UNITS = {"nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0, "second": 1e3,
         "ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}
# ncu's byte units (SI prefixes, its default) in bytes.
BYTE_UNITS = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12,
              "B": 1.0, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}
TIME = "gpu__time_duration.sum"
BYTES = ("dram__bytes_read.sum", "dram__bytes_write.sum")
OCCUPANCY = "sm__warps_active.avg.pct_of_peak_sustained_active"


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


def number(path, row, units):
    unit = row["Metric Unit"]
    if unit not in units:
        raise ValueError(f"{path}: unknown unit '{unit}' of {row['Metric Name']} for {row['Kernel Name']}")
    return float(row["Metric Value"].replace(",", "")) * units[unit]


def kernel_launches(path):
    """Every launch in an ncu CSV, in order: {name, ms} and, where the CSV has them, bytes (DRAM
    read + written) and occupancy (percent)."""
    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        lines = [line for line in f if line.startswith('"')]  # ncu prints its own notes before the table
    rows = csv.DictReader(lines)
    needed = {"Kernel Name", "Metric Name", "Metric Unit", "Metric Value"}
    if rows.fieldnames is None or not needed <= set(rows.fieldnames):
        raise ValueError(f"{path}: not an ncu --csv table (columns {rows.fieldnames}; need {sorted(needed)})")
    launches = {}  # by ncu's launch ID (each metric of a launch is a row of its own)
    for index, row in enumerate(rows):
        launch = launches.setdefault(row.get("ID", index), {"name": short_name(row["Kernel Name"])})
        metric = row["Metric Name"]
        if metric == TIME:
            launch["ms"] = number(path, row, UNITS)
        elif metric in BYTES:
            launch["bytes"] = launch.get("bytes", 0.0) + number(path, row, BYTE_UNITS)
        elif metric == OCCUPANCY:
            launch["occupancy"] = number(path, row, {"%": 1.0})
    timed = [launch for launch in launches.values() if "ms" in launch]
    if not timed:
        raise ValueError(f"{path}: no {TIME} rows (was ncu run with --metrics {TIME}?)")
    return timed


def table(launches, steps, step_ms, top):
    totals = {}  # name: [launches, ms, bytes, occupancy x ms]
    for launch in launches:
        t = totals.setdefault(launch["name"], [0, 0.0, 0.0, 0.0])
        t[0] += 1
        t[1] += launch["ms"]
        t[2] += launch.get("bytes", 0.0)
        t[3] += launch.get("occupancy", 0.0) * launch["ms"]
    traffic = any("bytes" in launch for launch in launches)
    occupancy = any("occupancy" in launch for launch in launches)
    whole = sum(t[1] for t in totals.values())
    header = f"{'kernel':90} {'ms/step':>9} {'share':>6} {'launches':>8} {'mean us':>8}"
    header += f" {'TB/s':>6}" if traffic else ""
    header += f" {'occ %':>6}" if occupancy else ""
    out = [header]
    ranked = sorted(totals.items(), key=lambda item: -item[1][1])
    for name, (count, ms, moved, occupied) in ranked[:top]:
        line = f"{name:90} {ms / steps:9.3f} {100 * ms / whole:5.1f}% {count // steps:8d} {1e3 * ms / count:8.1f}"
        line += f" {moved / (ms * 1e9) if ms > 0 else 0.0:6.2f}" if traffic else ""
        line += f" {occupied / ms if ms > 0 else 0.0:6.1f}" if occupancy else ""
        out.append(line)
    rest = ranked[top:]
    if rest:
        rest_ms = sum(t[1] for _, t in rest)
        out.append(f"{'(' + str(len(rest)) + ' other kernels)':90} {rest_ms / steps:9.3f} {100 * rest_ms / whole:5.1f}%")
    line = f"kernel time per step: {whole / steps:.3f} ms over {len(launches) // steps} launches"
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
    print(table(kernel_launches(a.csv), a.steps, a.step_ms, a.top))


if __name__ == "__main__":
    try:
        main()
    except (OSError, ValueError) as e:
        sys.exit(f"kernel_profile: {e}")
