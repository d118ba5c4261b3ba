#!/usr/bin/env python3
"""The short table scripts/gpu_test.sh prints last: the GPU tests' counts (from gtest's XML) and,
per operation and shape, loom's and PyTorch's milliseconds and TFLOP/s (from the RESULT lines of
bench/cuda/*) with their ratio. Usage: gpu_table.py BENCH_TXT TEST_XML..."""
import sys
import xml.etree.ElementTree as ET


def tests(path):
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        return f"{path}: no result ({e})"
    cases = root.findall(".//testcase")
    failed = [c for c in cases if c.find("failure") is not None]
    skipped = [c for c in cases if c.get("result") == "skipped" or c.find("skipped") is not None]
    name = path.rsplit("/", 1)[-1].removesuffix(".xml")
    lines = [f"{name}: {len(cases)} run, {len(cases) - len(failed) - len(skipped)} passed, {len(failed)} failed, "
             f"{len(skipped)} skipped"]
    lines += [f"  FAILED {c.get('classname')}.{c.get('name')}" for c in failed]
    return "\n".join(lines)


def bench(path):
    rows = {}
    try:
        lines = open(path, encoding="utf-8").read().splitlines()
    except OSError:
        return "benchmarks: no results"
    for line in lines:
        parts = line.split("|")
        if len(parts) == 6 and parts[0] == "RESULT":
            _, impl, op, shape, ms, tflops = parts
            rows.setdefault((op, shape), {})[impl] = (float(ms), float(tflops))
    out = [f"{'operation':26} {'shape':44} {'loom ms':>9} {'TFLOP/s':>8} {'torch ms':>9} {'TFLOP/s':>8} {'loom/torch':>10}"]
    for (op, shape), r in rows.items():
        loom, torch = r.get("loom"), r.get("torch")
        cells = [f"{loom[0]:9.3f} {loom[1]:8.1f}" if loom else f"{'-':>9} {'-':>8}",
                 f"{torch[0]:9.3f} {torch[1]:8.1f}" if torch else f"{'-':>9} {'-':>8}"]
        ratio = f"{torch[0] / loom[0]:10.2f}" if loom and torch else f"{'-':>10}"
        out.append(f"{op:26} {shape:44} {cells[0]} {cells[1]} {ratio}")
    return "\n".join(out) + "\n(loom/torch: torch's time over loom's; > 1 means loom is faster)"


def recipes(path):
    """One linear layer per precision recipe (loom_bench_linear_precision_cuda): each recipe's
    time as a speedup over bf16's on the same shape."""
    prefix = "linear layer "  # forward + dgrad + wgrad
    times = {}
    try:
        lines = open(path, encoding="utf-8").read().splitlines()
    except OSError:
        return ""
    for line in lines:
        parts = line.split("|")
        if len(parts) == 6 and parts[0] == "RESULT" and parts[2].startswith(prefix):
            times.setdefault(parts[3], {})[parts[2][len(prefix):]] = float(parts[4])
    out = []
    for shape, by_recipe in times.items():
        bf16 = by_recipe.get("bf16")
        cells = [f"{r} {bf16 / ms:.2f}x" if bf16 else f"{r} {ms:.3f} ms" for r, ms in by_recipe.items()]
        out.append(f"linear layer (fwd+dgrad+wgrad) {shape}, speedup over bf16: " + ", ".join(cells))
    return "\n".join(out)


if __name__ == "__main__":
    for xml in sys.argv[2:]:
        print(tests(xml))
    print(bench(sys.argv[1]))
    speedups = recipes(sys.argv[1])
    if speedups:
        print(speedups)
