#!/usr/bin/env python3
"""One parseable line per training run of the GPU benchmark, from each trainer's own output:

  TRAIN|impl|model|B|T|tokens_per_s|step_ms|timed_steps

tokens/s is B x T over the median step time of the steps after the first `--warmup` (the first
steps pay for allocations, cuBLAS's heuristics, compilation).

  train_results.py llmc LOG --model M --batch B --seq T [--impl NAME]   llm.c's "| X ms |" step lines
  train_results.py loom METRICS --model M --batch B --seq T  loom's metrics.jsonl (step_time_s)"""
import argparse
import json
import re
import statistics
import sys

LLMC_STEP = re.compile(r"^step\s+(\d+)/\d+ \|.*\| ([0-9.]+) ms \|")


def train_line(impl, model, batch, seq, step_seconds):
    median = statistics.median(step_seconds)
    return (f"TRAIN|{impl}|{model}|{batch}|{seq}|{batch * seq / median:.1f}|{median * 1e3:.3f}|"
            f"{len(step_seconds)}")


def llmc_steps(path):
    steps = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = LLMC_STEP.match(line)
            if m:
                steps.append((int(m.group(1)), float(m.group(2)) / 1e3))
    return steps


def loom_steps(path, batch, seq):
    steps = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            if record.get("trained_tokens") != batch * seq:
                raise ValueError(f"{path}: step {record.get('step')} trained {record.get('trained_tokens')} tokens, "
                                 f"not B x T = {batch * seq}")
            steps.append((int(record["step"]), float(record["step_time_s"])))
    return steps


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", choices=("llmc", "loom"))
    ap.add_argument("path")
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--impl", help="the trainer's name in the line (default: llm.c or loom)")
    a = ap.parse_args()
    steps = llmc_steps(a.path) if a.source == "llmc" else loom_steps(a.path, a.batch, a.seq)
    timed = [seconds for step, seconds in steps if step > a.warmup]
    if not timed:
        raise ValueError(f"{a.path}: no step after the {a.warmup} warm-up steps ({len(steps)} steps found)")
    impl = a.impl or ("llm.c" if a.source == "llmc" else "loom")
    print(train_line(impl, a.model, a.batch, a.seq, timed))


if __name__ == "__main__":
    try:
        main()
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"train_results: {e}")
