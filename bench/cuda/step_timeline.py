#!/usr/bin/env python3
"""Where a training step leaves the GPU idle: the timeline libloom_step_timeline.so wrote
(bench/cuda/step_timeline.cpp, a CUPTI injection library: the GPU's kernels, copies and sets, the
host's CUDA calls and synchronisations, one CSV) cut into steps, each with its wall time, the GPU's
busy time (kernels, copies and sets on any stream), its idle time, the host's time inside
synchronisations, and the gaps of at least --gap-us: how long, between which GPU work, and what the
host was doing when the GPU went idle. Then the means over the steps, the idle time split by what
the host was doing during it (waiting in a synchronisation, inside launch calls, between CUDA
calls, in other CUDA calls), and the GPU work the largest gaps precede. Last, the GPU's work per
step by kind (products, attention, other kernels, copies and sets) and by name: each kernel's
time as it ran in the step (clocks and all), which lines two trainers' steps up kernel by kernel
(train_bench.sh's timeline runs loom and llm.c alike: any binary takes the library). Nsight Compute
times each kernel alone; this tells a step's wall time beyond their sum that it is not the clocks.

A step ends where a run of consecutive kernels matching --step-kernel (loom's multi-tensor AdamW
launches) ends; the next one starts there. What comes before the first such end (the first step,
with its warm-up) is left out; the last --steps complete steps are shown. The host's calls count
from every thread; a gap's host state is the call covering its first instant (a synchronisation
before a launch before any other call).

  step_timeline.py TIMELINE_CSV [--step-kernel REGEX] [--steps N] [--gap-us US] [--top K]
Exit status 0, or 2 on a file that is not such a timeline (naming the file and line).
"""
import argparse
import bisect
import csv
import re
import sys

HEADER = ["kind", "name", "start_ns", "end_ns", "stream", "correlation"]
KINDS = {"kernel", "memcpy", "memset", "sync", "runtime", "driver"}
GPU_KINDS = {"kernel", "memcpy", "memset"}
HOST_KINDS = {"runtime", "driver"}
# Calls in which the host waits for the GPU (a synchronous cudaMemcpy included), after the
# version suffix and the per-thread-stream suffix are dropped.
SYNC_CALLS = {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaThreadSynchronize",
              "cudaMemcpy", "cudaMemcpy2D", "cudaMemcpy3D", "cudaMemcpyToSymbol", "cudaMemcpyFromSymbol",
              "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize", "cuMemcpy", "cuMemcpyDtoH",
              "cuMemcpyHtoD", "cuMemcpyDtoD"}
# A synchronisation record of this type is a GPU-side wait: the host does not block.
GPU_SIDE_SYNC = "stream wait event"
# Kinds of GPU work by kernel name (the first that matches): cuBLAS(Lt)'s and CUTLASS's products,
# attention (cuDNN's fused SDPA, FlashAttention-style kernels, loom's), and the rest.
WORK_KINDS = [("products", re.compile(r"gemm|nvjet|xmma|cutlass|cublas|matmul", re.IGNORECASE)),
              ("attention", re.compile(r"sdpa|fmha|flash|attention", re.IGNORECASE))]
MAX_NAME = 80


def call_name(name):
    """An API call's name without CUPTI's version suffix or the per-thread stream's suffix."""
    return re.sub(r"(_ptsz|_ptds)?(_v\d+)?$", "", name)


def is_launch(name):
    return "Launch" in name


def short_name(name):
    """GPU work's name without its argument list and return type, templates kept, <= 80 chars."""
    name = name.replace("(anonymous namespace)::", "")
    depth = 0
    for i, ch in enumerate(name):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0 and i > 0:
            name = name[:i]
            break
    name = re.sub(r"\s+", " ", name).strip()
    if name.startswith("void "):
        name = name[5:]
    return name if len(name) <= MAX_NAME else name[:MAX_NAME - 3] + "..."


def whole_number(path, number, column, text):
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{path}:{number}: {column} '{text}' is not a whole number") from None


def read_timeline(path):
    """The records ({kind, name, start, end, stream}, times in ns) and the comments' counts."""
    records, notes, header_seen = [], [], False
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            if line.startswith("#"):
                notes.append(line[1:].strip())
                continue
            if not line.strip():
                continue
            fields = next(csv.reader([line]))
            if not header_seen:
                if fields != HEADER:
                    raise ValueError(f"{path}:{number}: not a step timeline (the header should be {','.join(HEADER)})")
                header_seen = True
                continue
            if len(fields) != len(HEADER):
                raise ValueError(f"{path}:{number}: {len(fields)} fields, expected {len(HEADER)}")
            kind, name = fields[0], fields[1]
            if kind not in KINDS:
                raise ValueError(f"{path}:{number}: unknown kind '{kind}' (one of {', '.join(sorted(KINDS))})")
            start = whole_number(path, number, "start_ns", fields[2])
            end = whole_number(path, number, "end_ns", fields[3])
            if end < start:
                raise ValueError(f"{path}:{number}: ends ({end}) before it starts ({start})")
            records.append({"kind": kind, "name": name, "start": start, "end": end, "stream": fields[4]})
    if not header_seen:
        raise ValueError(f"{path}: no header line (an empty timeline?)")
    return records, notes


def union(intervals):
    """Sorted, disjoint intervals covering the same time as the given ones."""
    merged = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def clipped(intervals, lo, hi):
    return [(max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi]


class Cover:
    """Disjoint intervals, asked how much of [lo, hi] they cover (in log time: a step's holes
    are many)."""

    def __init__(self, intervals):
        merged = union(intervals)
        self.starts = [s for s, _ in merged]
        self.ends = [e for _, e in merged]
        self.before = [0]  # before[i]: the length of the first i intervals
        for s, e in merged:
            self.before.append(self.before[-1] + e - s)

    def covered(self, lo, hi):
        first = bisect.bisect_right(self.ends, lo)  # the first interval ending after lo
        last = bisect.bisect_left(self.starts, hi)  # one past the last starting before hi
        if last <= first:
            return 0
        total = self.before[last] - self.before[first]
        return total - max(0, lo - self.starts[first]) - max(0, self.ends[last - 1] - hi)


def step_ends(kernels, pattern):
    """The end of each run of consecutive kernels (by start) whose name matches."""
    ends, run_end = [], None
    for k in kernels:
        if pattern.search(k["name"]):
            run_end = max(run_end or 0, k["end"])
        elif run_end is not None:
            ends.append(run_end)
            run_end = None
    if run_end is not None:
        ends.append(run_end)
    return ends


def host_state(record):
    """What a host record says the host was doing: waiting, launching or in another call."""
    if record["kind"] == "sync":
        return "waiting"
    name = call_name(record["name"])
    return "waiting" if name in SYNC_CALLS else "launching" if is_launch(name) else "in"


class Timeline:
    def __init__(self, records):
        self.gpu = sorted((r for r in records if r["kind"] in GPU_KINDS), key=lambda r: r["start"])
        self.gpu_starts = [r["start"] for r in self.gpu]
        self.gpu_by_end = sorted(self.gpu, key=lambda r: r["end"])
        self.gpu_ends = [r["end"] for r in self.gpu_by_end]
        self.kernel_starts = sorted(r["start"] for r in self.gpu if r["kind"] == "kernel")
        self.busy = union((r["start"], r["end"]) for r in self.gpu)
        # The host's records: its CUDA calls and the synchronisations it blocked in.
        host = [r for r in records if r["kind"] in HOST_KINDS or (r["kind"] == "sync" and r["name"] != GPU_SIDE_SYNC)]
        self.host = sorted(({"start": r["start"], "end": r["end"], "state": host_state(r), "call": r["kind"] != "sync",
                             "name": call_name(r["name"]) if r["kind"] in HOST_KINDS else r["name"]} for r in host),
                           key=lambda r: r["start"])
        self.host_starts = [r["start"] for r in self.host]
        self.longest_host = max((r["end"] - r["start"] for r in self.host), default=0)
        spans = {state: [(r["start"], r["end"]) for r in self.host if r["state"] == state]
                 for state in ("waiting", "launching", "in")}
        self.waiting = Cover(spans["waiting"])
        self.waiting_or_launching = Cover(spans["waiting"] + spans["launching"])
        self.in_calls = Cover(spans["waiting"] + spans["launching"] + spans["in"])

    def before(self, t):
        """The GPU work that ends last at or before t."""
        i = bisect.bisect_right(self.gpu_ends, t)
        return short_name(self.gpu_by_end[i - 1]["name"]) if i > 0 else "(nothing)"

    def after(self, t):
        """The GPU work that starts first at or after t."""
        i = bisect.bisect_left(self.gpu_starts, t)
        return short_name(self.gpu[i]["name"]) if i < len(self.gpu) else "(nothing)"

    def host_at(self, t):
        """What the host was doing at t: the host record covering it (a synchronisation first, then
        a launch, then any other call; the latest started)."""
        first = bisect.bisect_left(self.host_starts, t - self.longest_host)
        last = bisect.bisect_right(self.host_starts, t)
        covering = [r for r in self.host[first:last] if r["start"] <= t < r["end"]]
        for state in ("waiting", "launching", "in"):
            chosen = [r for r in covering if r["state"] == state]
            if chosen:
                # An API call's name before a synchronisation record's type; the innermost call.
                name = max(chosen, key=lambda r: (r["call"], r["start"]))["name"]
                return f"in {name}" if state == "in" else f"{state} in {name}"
        return "between CUDA calls"

    def step(self, lo, hi, gap_ns):
        """One step's times (ns) and its gaps of at least gap_ns."""
        busy = clipped(self.busy, lo, hi)
        holes, cursor = [], lo
        for s, e in busy:
            if s > cursor:
                holes.append((cursor, s))
            cursor = e
        if cursor < hi:
            holes.append((cursor, hi))
        idle = sum(e - s for s, e in holes)
        # The idle time by what the host did meanwhile: waiting first, then launching, other calls.
        waiting = sum(self.waiting.covered(s, e) for s, e in holes)
        launching = sum(self.waiting_or_launching.covered(s, e) for s, e in holes) - waiting
        calls = sum(self.in_calls.covered(s, e) for s, e in holes)
        gaps = [{"start": s, "length": e - s, "before": self.before(s), "after": self.after(e),
                 "host": self.host_at(s)} for s, e in holes if e - s >= gap_ns]
        kernels = bisect.bisect_left(self.kernel_starts, hi) - bisect.bisect_left(self.kernel_starts, lo)
        return {"start": lo, "wall": hi - lo, "busy": sum(e - s for s, e in busy), "idle": idle, "kernels": kernels,
                "host_sync": self.waiting.covered(lo, hi), "waiting": waiting, "launching": launching,
                "other_calls": calls - waiting - launching, "between": idle - calls, "gaps": gaps}


def work_kind(record):
    if record["kind"] != "kernel":
        return "copies and sets"
    for kind, pattern in WORK_KINDS:
        if pattern.search(record["name"]):
            return kind
    return "other kernels"


def work_lines(timeline, bounds, top):
    """The GPU work starting inside the steps [lo, hi), summed per step by kind and by name."""
    n = len(bounds)
    by_kind, by_name = {}, {}
    for lo, hi in bounds:
        first, last = bisect.bisect_left(timeline.gpu_starts, lo), bisect.bisect_left(timeline.gpu_starts, hi)
        for r in timeline.gpu[first:last]:
            length, kind = r["end"] - r["start"], work_kind(r)
            by_kind[kind] = by_kind.get(kind, 0) + length
            total = by_name.setdefault(short_name(r["name"]), [0, 0])
            total[0] += length
            total[1] += 1
    whole = sum(by_kind.values())

    def share(ns):
        return f"{ms(ns / n)} ({100 * ns / whole if whole else 0.0:.1f}%)"

    kinds = ["products", "attention", "other kernels", "copies and sets"]
    out = ["GPU work per step by kind: " + ", ".join(f"{k} {share(by_kind.get(k, 0))}" for k in kinds) +
           f"; {ms(whole / n)} in all"]
    out.append(f"GPU work per step by name (the {top} largest):")
    out.append(f"  {'ms/step':>9} {'runs':>7}  name")
    for name, (length, count) in sorted(by_name.items(), key=lambda item: (-item[1][0], item[0]))[:top]:
        out.append(f"  {length / n / 1e6:9.3f} {count / n:7.1f}  {name}")
    return out


def ms(ns):
    return f"{ns / 1e6:.3f} ms"


def step_lines(number, step):
    idle_share = 100 * step["idle"] / step["wall"] if step["wall"] else 0.0
    out = [f"step {number}: wall {ms(step['wall'])}, GPU busy {ms(step['busy'])}, idle {ms(step['idle'])} "
           f"({idle_share:.1f}%), {step['kernels']} kernels, host in synchronisation {ms(step['host_sync'])}"]
    for gap in step["gaps"]:
        out.append(f"  gap {gap['length'] / 1e3:.1f} us at +{(gap['start'] - step['start']) / 1e6:.3f} ms, host "
                   f"{gap['host']}: after {gap['before']}, before {gap['after']}")
    return out


def summary_lines(steps, gap_us, top):
    n = len(steps)
    mean = {key: sum(s[key] for s in steps) / n for key in
            ("wall", "busy", "idle", "host_sync", "waiting", "launching", "between", "other_calls")}
    mean["starved"] = mean["launching"] + mean["between"]
    idle = mean["idle"]

    def part(key):
        return f"{ms(mean[key])} ({100 * mean[key] / idle if idle else 0.0:.1f}%)"

    idle_share = 100 * idle / mean["wall"] if mean["wall"] else 0.0
    out = [f"mean over {n} steps: wall {ms(mean['wall'])}, GPU busy {ms(mean['busy'])}, idle {ms(idle)} "
           f"({idle_share:.1f}%), host in synchronisation {ms(mean['host_sync'])}",
           f"idle per step by what the host did: waiting in a synchronisation {part('waiting')}; "
           f"the GPU starved {part('starved')}: launching {part('launching')}, between CUDA calls "
           f"{part('between')}; in other CUDA calls {part('other_calls')}"]
    by_next = {}
    for step in steps:
        for gap in step["gaps"]:
            total = by_next.setdefault(gap["after"], [0, 0])
            total[0] += gap["length"]
            total[1] += 1
    if by_next:
        out.append(f"gaps of {gap_us:g} us or more by the GPU work after them, per step (the {top} largest):")
        out.append(f"  {'ms/step':>9} {'gaps':>5}  next")
        for name, (length, count) in sorted(by_next.items(), key=lambda item: (-item[1][0], item[0]))[:top]:
            out.append(f"  {length / n / 1e6:9.3f} {count:5d}  {name}")
    else:
        out.append(f"no gaps of {gap_us:g} us or more")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--step-kernel", default="adamw", help="regex of the kernels that end a step")
    ap.add_argument("--steps", type=int, default=3, help="the last N complete steps")
    ap.add_argument("--gap-us", type=float, default=20.0, help="list idle gaps at least this long")
    ap.add_argument("--top", type=int, default=15)
    a = ap.parse_args()
    if a.steps < 1:
        raise ValueError(f"--steps {a.steps}: must be at least 1")
    try:
        pattern = re.compile(a.step_kernel, re.IGNORECASE)
    except re.error as e:
        raise ValueError(f"--step-kernel '{a.step_kernel}': {e}") from None
    records, notes = read_timeline(a.csv)
    timeline = Timeline(records)
    ends = step_ends([r for r in timeline.gpu if r["kind"] == "kernel"], pattern)
    if len(ends) < 2:
        raise ValueError(f"{a.csv}: {len(ends)} step ends (runs of kernels matching '{a.step_kernel}'): "
                         "no complete step")
    chosen = list(range(1, len(ends)))[-a.steps:]
    print(f"{a.csv}: {len(records)} records, {len(ends)} step ends ('{a.step_kernel}'), {len(ends) - 1} complete "
          f"steps after the first; the last {len(chosen)}")
    for note in notes:  # the library's counts of records it could not keep, when not 0
        count = re.match(r"(dropped|cupti dropped|skipped|incomplete) (\d+) records", note)
        if count and int(count.group(2)) > 0:
            print(f"note: {note}")
    steps = []
    for i in chosen:
        steps.append(timeline.step(ends[i - 1], ends[i], a.gap_us * 1e3))
        print("\n".join(step_lines(i + 1, steps[-1])))
    print("\n".join(summary_lines(steps, a.gap_us, a.top)))
    print("\n".join(work_lines(timeline, [(ends[i - 1], ends[i]) for i in chosen], a.top)))


if __name__ == "__main__":
    try:
        main()
    except (OSError, ValueError, csv.Error) as e:
        print(f"step_timeline: {e}", file=sys.stderr)
        sys.exit(2)
