#!/usr/bin/env python3
"""The short table scripts/gpu_test.sh prints last: the GPU tests' counts (from gtest's XML);
per operation and shape, loom's and PyTorch's milliseconds and TFLOP/s (from the RESULT lines of
bench/cuda/*) with their ratio; one linear layer's speedup per precision recipe over bf16;
decoding attention's GB/s beside PyTorch's (DECODE lines); serving's tokens/s per device; and,
then the training benchmark (TRAIN lines of bench/cuda/train_bench.sh): per model shape and
trainer tokens/s, MFU, the ratio to the fastest llm.c build and, for loom's other precision
recipes, to loom's bf16 run; last, FP8's loss curve against bf16's (LOSS lines).
Usage: gpu_table.py BENCH_TXT TEST_XML..."""
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


def read_lines(path):
    """The benchmark file's lines, or None when it cannot be read."""
    try:
        return open(path, encoding="utf-8").read().splitlines()
    except OSError:
        return None


def bench(path):
    rows = {}
    lines = read_lines(path)
    if lines is None:
        return "benchmarks: no results"
    for line in lines:
        parts = line.split("|")
        if len(parts) == 6 and parts[0] == "RESULT":
            _, impl, op, shape, ms, tflops = parts
            rows.setdefault((op, shape), {})[impl] = (float(ms), float(tflops))
    out = [f"{'operation':34} {'shape':44} {'loom ms':>9} {'TFLOP/s':>8} {'torch ms':>9} {'TFLOP/s':>8} {'loom/torch':>10}"]
    for (op, shape), r in rows.items():
        # A loom variant of an operation ("... via cuDNN") is compared with torch's same operation.
        loom, torch = r.get("loom"), r.get("torch") or rows.get((op.split(" via ")[0], shape), {}).get("torch")
        cells = [f"{loom[0]:9.3f} {loom[1]:8.1f}" if loom else f"{'-':>9} {'-':>8}",
                 f"{torch[0]:9.3f} {torch[1]:8.1f}" if torch else f"{'-':>9} {'-':>8}"]
        ratio = f"{torch[0] / loom[0]:10.2f}" if loom and torch else f"{'-':>10}"
        out.append(f"{op:34} {shape:44} {cells[0]} {cells[1]} {ratio}")
    return "\n".join(out) + "\n(loom/torch: torch's time over loom's; > 1 means loom is faster)"


def recipes(path):
    """One linear layer per precision recipe (loom_bench_linear_precision_cuda): each recipe's
    time as a speedup over bf16's on the same shape (uncached weight casts); the "<recipe> cached
    weights" cells are the same layer with its weight casts kept, as inside a training step."""
    prefix = "linear layer "  # forward + dgrad + wgrad
    times = {}
    for line in read_lines(path) or []:
        parts = line.split("|")
        if len(parts) == 6 and parts[0] == "RESULT" and parts[2].startswith(prefix):
            times.setdefault(parts[3], {})[parts[2][len(prefix):]] = float(parts[4])
    out = []
    for shape, by_recipe in times.items():
        bf16 = by_recipe.get("bf16")
        cells = [f"{r} {bf16 / ms:.2f}x" if bf16 else f"{r} {ms:.3f} ms" for r, ms in by_recipe.items()]
        out.append(f"linear layer (fwd+dgrad+wgrad) {shape}, speedup over bf16: " + ", ".join(cells))
    return "\n".join(out)


def decoding(path):
    """Decoding attention over a KV cache (DECODE lines: loom_bench_paged_attention_cuda over
    paged blocks, torch_cuda_peer.py decode over contiguous tensors): each one's GB/s of keys and
    values read, and loom's over torch's."""
    rows = {}
    for line in read_lines(path) or []:
        parts = line.split("|")
        if len(parts) == 6 and parts[0] == "DECODE":
            _, impl, op, shape, ms, rate = parts
            rows.setdefault((op, shape), {})[impl] = (float(ms), float(rate))
    if not rows:
        return "decoding attention: no results"
    out = [f"{'operation':30} {'shape':30} {'loom ms':>9} {'GB/s':>7} {'torch ms':>9} {'GB/s':>7} {'loom/torch':>10}"]
    for (op, shape), r in rows.items():
        loom, torch = r.get("loom"), r.get("torch")
        cells = [f"{v[0]:9.3f} {v[1]:7.0f}" if v else f"{'-':>9} {'-':>7}" for v in (loom, torch)]
        ratio = f"{torch[0] / loom[0]:10.2f}" if loom and torch else f"{'-':>10}"
        out.append(f"{op:30} {shape:30} {cells[0]} {cells[1]} {ratio}")
    return "\n".join(out) + "\n(GB/s: the cache's keys and values read per second; loom/torch: torch's time over loom's)"


def prefilling(path):
    """Prompt rows' attention over a KV cache (PREFILL lines: loom_bench_paged_attention_cuda's
    CUDA-core and tensor-core kernels over paged blocks, torch_cuda_peer.py prefill over contiguous
    tensors): TFLOP/s of each, the tensor cores' speedup over the CUDA cores, torch's time over
    loom's tensor cores'."""
    rows = {}
    for line in read_lines(path) or []:
        parts = line.split("|")
        if len(parts) == 6 and parts[0] == "PREFILL":
            _, impl, op, shape, ms, rate = parts
            key = "torch" if impl == "torch" else ("tc" if "tensor" in op else "cc")
            rows.setdefault(shape, {})[key] = (float(ms), float(rate))
    if not rows:
        return "prompt attention: no results"
    out = [f"{'prompt chunk':36} {'CUDA cores ms':>13} {'TF/s':>6} {'tensor ms':>9} {'TF/s':>6} {'torch ms':>9} "
           f"{'TF/s':>6} {'tc/cc':>6} {'torch/tc':>8}"]
    for shape, r in rows.items():
        cells = [f"{r[k][0]:{w}.3f} {r[k][1]:6.1f}" if k in r else f"{'-':>{w}} {'-':>6}"
                 for k, w in (("cc", 13), ("tc", 9), ("torch", 9))]
        speedup = f"{r['cc'][0] / r['tc'][0]:6.2f}" if "cc" in r and "tc" in r else f"{'-':>6}"
        ratio = f"{r['torch'][0] / r['tc'][0]:8.2f}" if "torch" in r and "tc" in r else f"{'-':>8}"
        out.append(f"{shape:36} {' '.join(cells)} {speedup} {ratio}")
    return "\n".join(out) + ("\n(TF/s of the causal products; tc/cc: the tensor cores' speedup; "
                             "torch/tc: torch's time over loom's)")


def serving(path):
    """The engine's tokens/s per device and GEMM dtype (SERVE lines: loom_bench_serve's JSON, tagged
    "cuda bf16", "cuda fp32" or "cpu fp32"), with each GPU row over the CPU's."""
    import json

    runs = ["cuda bf16", "cuda fp32", "cpu fp32"]
    rows = {}
    for line in read_lines(path) or []:
        parts = line.split("|", 2)
        if len(parts) != 3 or parts[0] != "SERVE":
            continue
        try:
            r = json.loads(parts[2])
        except ValueError:
            continue
        if "sequences" in r:
            rows.setdefault(f"decode, {r['sequences']} sequences", {})[parts[1]] = r["decode_tokens_per_s"]
        elif "prefill_tokens" in r:
            rows.setdefault(f"prefill, {r['prefill_tokens']} tokens", {})[parts[1]] = r["prompt_tokens_per_s"]
    if not rows:
        return "serving: no results"
    header = "".join(f"{run:>11}" for run in runs)
    out = [f"{'serving (tokens/s)':28}{header} {'bf16/cpu':>9} {'fp32/cpu':>9}"]
    for what, by_run in rows.items():
        values = [by_run.get(run) for run in runs]
        cells = "".join(f"{v:11.0f}" if v else f"{'-':>11}" for v in values)
        cpu = values[2]
        ratios = " ".join(f"{v / cpu:9.2f}" if v and cpu else f"{'-':>9}" for v in values[:2])
        out.append(f"{what:28}{cells} {ratios}")
    return "\n".join(out)


def training(path):
    lines = read_lines(path) or []
    gpu = next((line.split("|", 1)[1] for line in lines if line.startswith("GPU|")), "")
    runs = [line.split("|") for line in lines if line.startswith("TRAIN|") and line.count("|") == 7]
    if not runs:
        return "training: no results"
    import train_shape

    peak = train_shape.peak_tflops(gpu)
    out = [f"{'model':14} {'B x T':>10} {'trainer':16} {'tokens/s':>10} {'step ms':>9} {'MFU':>6} {'MFU PaLM':>8} "
           f"{'/ llm.c':>7} {'/ loom bf16':>11}"]
    for model in dict.fromkeys(run[2] for run in runs):
        rows = [run for run in runs if run[2] == model]
        llmc = max((float(run[5]) for run in rows if run[1].startswith("llm.c")), default=None)
        loom_bf16 = next((float(run[5]) for run in rows if run[1] == "loom"), None)
        try:
            shape = train_shape.load_model(model)
        except (ImportError, OSError, ValueError, KeyError):
            shape = None  # a shape without a config (the smoke test's tiny models): no MFU
        for _, impl, _, batch, seq, tokens_per_s, step_ms, _ in rows:
            rate, seq = float(tokens_per_s), int(seq)
            mfu = [f"{100 * count(shape, seq) * rate / (peak * 1e12):.1f}%" if shape and peak else "-"
                   for count in (train_shape.flops_per_token, train_shape.palm_flops_per_token)]
            ratio = f"{rate / llmc:.2f}" if llmc else "-"
            over_bf16 = f"{rate / loom_bf16:.2f}" if loom_bf16 and impl.startswith("loom ") else "-"
            out.append(f"{model:14} {batch + ' x ' + str(seq):>10} {impl:16} {rate:10.0f} {float(step_ms):9.2f} "
                       f"{mfu[0]:>6} {mfu[1]:>8} {ratio:>7} {over_bf16:>11}")
    out.append(f"(MFU: loom's FLOPs per token, causal attention; PaLM: attention over all T keys; over "
               f"{peak or '?'} TFLOP/s dense bf16, {gpu or 'GPU unknown'}; / llm.c: tokens/s over the fastest llm.c build's; / loom bf16: a loom recipe's tokens/s over loom's bf16 run)")
    return "\n".join(out)


def loss_curves(path):
    """FP8's loss curve against bf16's on the ~1B config (LOSS lines: bench/cuda/loss_curves.py's
    report of the training benchmark's two runs)."""
    lines = [line.split("|", 1)[1] for line in read_lines(path) or [] if line.startswith("LOSS|")]
    return "\n".join(["loss curves (fp8_current against bf16, ~1B):"] + lines) if lines else "loss curves: no results"


if __name__ == "__main__":
    for xml in sys.argv[2:]:
        print(tests(xml))
    print(bench(sys.argv[1]))
    speedups = recipes(sys.argv[1])
    if speedups:
        print(speedups)
    print(decoding(sys.argv[1]))
    print(prefilling(sys.argv[1]))
    print(serving(sys.argv[1]))
    print(training(sys.argv[1]))
    print(loss_curves(sys.argv[1]))
