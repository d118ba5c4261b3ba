#!/usr/bin/env python3
"""Validation curves of training runs: a markdown table of val_loss by step and a PNG with the
smoothed training loss and the validation loss of each run (for docs/).

usage: val_curves.py OUT.png SUMMARY.md [--row METRIC] LABEL=RUN_DIR LABEL=RUN_DIR ...
The first run is the reference: the table ends with each other run minus it, then with a row of
METRIC at the validation steps for each run that reports it (--row may repeat). Needs matplotlib
(bench/with_matplotlib.sh runs this script with a python that has it).
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def table(runs, extra_rows=()):
    val = {label: [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r] for label, rows in runs}
    first = runs[0][0]
    steps = [s for s, _ in val[first]]
    lines = ["| validation loss (nats/byte) | " + " | ".join(f"step {s}" for s in steps) + " |",
             "|---|" + "---:|" * len(steps)]
    for label, _ in runs:
        lines.append(f"| {label} | " + " | ".join(f"{v:.3f}" for _, v in val[label]) + " |")
    for label, _ in runs[1:]:
        diffs = [f"{v - ref:+.3f}" for (_, ref), (_, v) in zip(val[first], val[label])]
        lines.append(f"| {label} - {first} | " + " | ".join(diffs) + " |")
    for metric in extra_rows:
        for label, rows in runs:
            at_eval = [r.get(metric) for r in rows if "val_loss" in r]
            if any(v is not None for v in at_eval):
                lines.append(f"| {label} {metric} | " + " | ".join("-" if v is None else f"{v:.0f}" for v in at_eval) + " |")
    return "\n".join(lines), val


def main(argv):
    if len(argv) < 5:
        print(__doc__, file=sys.stderr)
        return 2
    plot, summary, rest, extra_rows = argv[1], argv[2], argv[3:], []
    while len(rest) >= 2 and rest[0] == "--row":
        extra_rows.append(rest[1])
        rest = rest[2:]
    runs = [(label, read_metrics(path)) for label, _, path in (spec.partition("=") for spec in rest)]
    text, val = table(runs, extra_rows)
    print(text)
    with open(summary, "w", encoding="utf-8") as f:
        f.write(text + "\n")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    for label, rows in runs:
        loss, w = [r["loss"] for r in rows], 5
        smooth = [sum(loss[max(0, i - w + 1):i + 1]) / (i + 1 - max(0, i - w + 1)) for i in range(len(loss))]
        ax1.plot([r["step"] for r in rows], smooth, label=label, linewidth=1.2)
        steps, values = zip(*val[label])
        ax2.plot(steps, values, marker="o", markersize=3, label=f"{label} ({values[-1]:.3f})", linewidth=1.2)
    ax1.set_title("training loss (mean of 5 steps)")
    ax2.set_title("validation loss")
    for ax in (ax1, ax2):
        ax.set_xlabel("step")
        ax.set_ylabel("loss (nats/byte)")
        ax.set_ylim(top=4.0)
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle(" vs ".join(label for label, _ in runs) + f", {val[runs[0][0]][-1][0]} steps")
    fig.tight_layout()
    fig.savefig(plot, dpi=100)
    print("wrote", plot)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
