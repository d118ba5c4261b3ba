#!/usr/bin/env python3
"""PyTorch's AdamW on the CPU over one fp32 tensor of N elements, the peer of
bench/host_adamw_bench.cpp: the median of REPEATS timed steps after one untimed, in ms and in GB/s
of 28 bytes per element (as loom's). FOREACH 1 takes torch's multi-tensor path, 0 its per-tensor
loop (one tensor here: the same work).

Usage: torch_adamw.py N [REPEATS=5] [THREADS=0: torch's default] [FOREACH=0]
"""
import sys
import time

import torch


def main():
    n = int(sys.argv[1])
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    threads = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    foreach = bool(int(sys.argv[4])) if len(sys.argv) > 4 else False
    if threads > 0:
        torch.set_num_threads(threads)
    index = torch.arange(n, dtype=torch.int64)
    param = torch.nn.Parameter(0.01 * ((index % 97) - 48).float())
    param.grad = 0.001 * ((index % 89) - 44).float()
    optimizer = torch.optim.AdamW([param], lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                                  foreach=foreach)
    times = []
    for r in range(repeats + 1):
        start = time.perf_counter()
        optimizer.step()
        elapsed = (time.perf_counter() - start) * 1e3
        if r > 0:
            times.append(elapsed)
    times.sort()
    median = times[len(times) // 2]
    engine = "torch-foreach" if foreach else "torch"
    print(f"HOST_ADAMW engine={engine} n={n} threads={torch.get_num_threads()} ms={median:.3f} "
          f"gbs={28.0 * n / (median * 1e6):.2f}")


if __name__ == "__main__":
    main()
