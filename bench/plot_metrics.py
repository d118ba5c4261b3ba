#!/usr/bin/env python3
"""Plots keys of metrics.jsonl files (one curve per run) into a PNG, for docs/.

usage: plot_metrics.py OUT.png TITLE KEY[,KEY...] LABEL=RUN_DIR_OR_METRICS_JSONL ...
  e.g. plot_metrics.py docs/sft_loss.png "SFT loss" loss,val_loss packed=runs/sft-packed
Each KEY gets its own panel; records without the key are skipped (val_loss is only present at
evaluations). Needs matplotlib (Debian's python3-matplotlib; bench/with_matplotlib.sh runs this
script with a python that has it, installing the package if needed).
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_metrics(path):
    if os.path.isdir(path):
        path = os.path.join(path, "metrics.jsonl")
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def main(argv):
    if len(argv) < 5:
        print(__doc__, file=sys.stderr)
        return 2
    out, title, keys = argv[1], argv[2], argv[3].split(",")
    runs = []
    for spec in argv[4:]:
        label, sep, path = spec.partition("=")
        if not sep:
            print(f"plot_metrics: '{spec}' is not LABEL=PATH", file=sys.stderr)
            return 2
        runs.append((label, read_metrics(path)))
    fig, axes = plt.subplots(1, len(keys), figsize=(6.5 * len(keys), 4.5), squeeze=False)
    for ax, key in zip(axes[0], keys):
        for label, rows in runs:
            points = [(r["step"], r[key]) for r in rows if key in r and "step" in r]
            if points:
                steps, values = zip(*points)
                ax.plot(steps, values, label=label, linewidth=1.2, marker="o" if len(points) < 30 else None,
                        markersize=3)
        ax.set_title(key)
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"plot_metrics: wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
