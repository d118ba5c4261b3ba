#!/usr/bin/env python3
"""Two training runs' loss curves side by side (each run's metrics.jsonl, `loss` per step): the
relative difference of their moving averages (--window steps) from step --from on, its largest
and mean value and where the largest is, the final averages, and whether the largest stays within
--tolerance (the GPU issue's FP8 rule: within 5% of bf16). Writes both curves as CSV with --csv.

  loss_curves.py REFERENCE_METRICS OTHER_METRICS [--names bf16,fp8] [--window 10] [--from 20]
                 [--tolerance 0.05] [--csv OUT.csv]
Exit status 0 within the tolerance, 1 beyond it, 2 on bad input.
"""
import argparse
import json
import sys


def losses(path):
    by_step = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                by_step[int(record["step"])] = float(record["loss"])
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{number}: not a metrics record with step and loss ({e})")
    if not by_step:
        raise ValueError(f"{path}: no steps")
    return by_step


def moving_average(values, window):
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def compare(reference, other, window, start):
    steps = sorted(set(reference) & set(other))
    if len(steps) < start + window:
        raise ValueError(f"{len(steps)} common steps: too few to compare from step {start} over {window}-step windows")
    ref = moving_average([reference[s] for s in steps], window)
    oth = moving_average([other[s] for s in steps], window)
    diffs = [(abs(o - r) / abs(r), s) for s, r, o in zip(steps, ref, oth) if s >= start]
    worst, at = max(diffs)
    return {"steps": steps, "worst": worst, "worst_step": at, "mean": sum(d for d, _ in diffs) / len(diffs),
            "final": (ref[-1], oth[-1])}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("reference")
    ap.add_argument("other")
    ap.add_argument("--names", default="reference,other")
    ap.add_argument("--window", type=int, default=10)
    ap.add_argument("--from", dest="start", type=int, default=20)
    ap.add_argument("--tolerance", type=float, default=0.05)
    ap.add_argument("--csv")
    a = ap.parse_args()
    names = a.names.split(",")
    if len(names) != 2 or a.window < 1:
        raise ValueError(f"--names needs two names (got '{a.names}'), --window at least 1 (got {a.window})")
    reference, other = losses(a.reference), losses(a.other)
    c = compare(reference, other, a.window, a.start)
    if a.csv:
        with open(a.csv, "w", encoding="utf-8") as f:
            f.write(f"step,{names[0]},{names[1]}\n")
            for s in c["steps"]:
                f.write(f"{s},{reference[s]:.6f},{other[s]:.6f}\n")
    within = c["worst"] <= a.tolerance
    print(f"LOSS|{names[0]}|{names[1]}|{len(c['steps'])} steps|{a.window}-step averages from step {a.start}: "
          f"largest difference {100 * c['worst']:.2f}% (step {c['worst_step']}), mean {100 * c['mean']:.2f}%; "
          f"final {c['final'][0]:.4f} vs {c['final'][1]:.4f}; "
          f"{'within' if within else 'BEYOND'} {100 * a.tolerance:g}%")
    return 0 if within else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (OSError, ValueError) as e:
        print(f"loss_curves: {e}", file=sys.stderr)
        sys.exit(2)
