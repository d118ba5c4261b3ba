#!/usr/bin/env python3
"""One line on what the GPU's clocks did during a run: nvidia-smi's samples (clocks.sm, power.draw,
clocks_event_reasons.active; CSV, no units, one row per sample) summarised as the SM clock's median
and lowest, the power's median and highest, and how often each reason held the clock down. A step
that runs slower than its kernels' sum under Nsight Compute (which times each kernel alone, the GPU
otherwise idle) may be a clock held down by the power cap, which only a sustained run shows.
    gpu_clocks.py SAMPLES.csv
"""
import statistics
import sys

# nvidia-smi's clock event reasons (the bits of clocks_event_reasons.active).
REASONS = {0x1: "idle", 0x2: "application clocks", 0x4: "power cap", 0x8: "hardware slowdown",
           0x20: "thermal (software)", 0x40: "thermal (hardware)", 0x80: "power brake", 0x100: "display clock"}


def main():
    clocks, power, held = [], [], {}
    with open(sys.argv[1]) as samples:
        for line in samples:
            fields = [f.strip() for f in line.split(",")]
            if len(fields) < 3:
                continue
            try:
                clock, watts, reasons = float(fields[0]), float(fields[1]), int(fields[2], 16)
            except ValueError:
                continue
            if reasons & 0x1:  # idle: between the runs' phases, not their steps
                continue
            clocks.append(clock)
            power.append(watts)
            for bit, name in REASONS.items():
                if reasons & bit:
                    held[name] = held.get(name, 0) + 1
    if not clocks:
        print("# clocks: no busy samples")
        return
    reasons = ", ".join(f"{name} {100 * n / len(clocks):.0f}%" for name, n in sorted(held.items())) or "none"
    print(f"# clocks over {len(clocks)} busy samples: SM median {statistics.median(clocks):.0f} MHz "
          f"(lowest {min(clocks):.0f}), power median {statistics.median(power):.0f} W "
          f"(highest {max(power):.0f}); held down by: {reasons}")


if __name__ == "__main__":
    main()
