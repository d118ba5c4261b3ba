#!/usr/bin/env python3
"""PyTorch on the same GPU and shapes as loom's GPU benchmarks (bench/cuda/*_bench.cpp):
torch.matmul in bf16, torch._scaled_mm in FP8 E4M3 with per-tensor scales and with 1 x 128 /
128 x 128 block scales (bf16 output), and
torch.nn.functional.scaled_dot_product_attention (causal, forward and forward + backward, bf16 and
fp32, GQA through enable_gqa); and decoding attention (one query per sequence over its whole
cache, contiguous [batch, kv_heads, length, dim] bf16 or fp32 tensors), as DECODE lines with the
cache's GB/s like loom_bench_paged_attention_cuda's; and prompt rows' attention (a chunk of
queries at the end of a sequence, causal from the bottom right, bf16) as PREFILL lines in TFLOP/s.
Random data; mean over timed runs after warm-ups, CUDA events. Prints the same
RESULT|impl|op|shape|ms|TFLOP/s lines as loom's programs."""
import sys

import torch
import torch.nn.functional as F

GEMMS = [("4096^3", 4096, 4096, 4096), ("gpt2.qkv", 8192, 2304, 768), ("gpt2.fc", 8192, 3072, 768),
         ("gpt2.proj", 8192, 768, 3072), ("llama1b.qkv", 8192, 3072, 2048), ("llama1b.gate_up", 8192, 16384, 2048),
         ("llama1b.down", 8192, 2048, 8192)]
ATTENTION = [("gpt2", 8, 1024, 12, 12, 64), ("llama1b", 4, 2048, 32, 8, 64), ("long_d128", 1, 8192, 16, 16, 128)]
# bench/cuda/paged_attention_cuda_bench.cpp's shapes: name, batch, length, heads, kv_heads, dim.
DECODE = [("llama1b", 1, 4096, 32, 8, 64), ("llama1b", 1, 32768, 32, 8, 64), ("llama1b", 16, 4096, 32, 8, 64),
          ("llama1b", 64, 2048, 32, 8, 64), ("d128", 8, 8192, 32, 8, 128)]
# Its prompt chunks: name, rows, length (positions after the chunk), heads, kv_heads, dim.
PREFILL = [("llama1b", 2048, 2048, 32, 8, 64), ("llama1b", 512, 8192, 32, 8, 64), ("llama1b", 256, 32768, 32, 8, 64),
           ("d128", 1024, 1024, 32, 8, 128)]
CYCLE_BYTES = 256 << 20  # each call reads another copy of the cache, as loom's benchmark does


def time_ms(fn, warmup=3, iterations=20):
    for _ in range(warmup):
        fn()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iterations):
        fn()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) / iterations


def result(op, shape, ms, flops):
    print(f"RESULT|torch|{op}|{shape}|{ms:.4f}|{flops / (ms * 1e-3) / 1e12:.1f}", flush=True)


def gemms():
    for name, m, n, k in GEMMS:
        shape = f"{name} {m}x{n}x{k}"
        a = torch.rand(m, k, device="cuda") * 2 - 1
        b = torch.rand(n, k, device="cuda") * 2 - 1
        a16, b16 = a.bfloat16(), b.bfloat16()
        result("gemm bf16", shape, time_ms(lambda: torch.matmul(a16, b16.t())), 2.0 * m * n * k)
        a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
        one = torch.ones((), device="cuda")
        try:
            result("gemm fp8 e4m3 tensor", shape,
                   time_ms(lambda: torch._scaled_mm(a8, b8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)),
                   2.0 * m * n * k)
        except Exception as e:  # an older torch without this signature
            print(f"SKIP|torch|gemm fp8 e4m3 tensor|{shape}|{e}", flush=True)
        try:
            result("gemm fp8 e4m3 tensor fast-accum", shape,
                   time_ms(lambda: torch._scaled_mm(a8, b8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16,
                                                    use_fast_accum=True)),
                   2.0 * m * n * k)
        except Exception as e:
            print(f"SKIP|torch|gemm fp8 e4m3 tensor fast-accum|{shape}|{e}", flush=True)
        # DeepSeek-style blocks: 1 x 128 runs of a (scales [m, k/128], m contiguous), 128 x 128
        # tiles of b (scales [k/128 rounded up to 4, n/128], k-blocks contiguous).
        kb = (k + 127) // 128
        scale_a = torch.rand(kb, m, device="cuda").t() + 0.5
        scale_b = torch.rand(n // 128, (kb + 3) // 4 * 4, device="cuda").t() + 0.5
        try:
            result("gemm fp8 e4m3 block128", shape,
                   time_ms(lambda: torch._scaled_mm(a8, b8.t(), scale_a=scale_a, scale_b=scale_b,
                                                    out_dtype=torch.bfloat16)),
                   2.0 * m * n * k)
        except Exception as e:
            print(f"SKIP|torch|gemm fp8 e4m3 block128|{shape}|{str(e).splitlines()[0]}", flush=True)
        if m == n == k == 4096:
            result("gemm fp32", shape, time_ms(lambda: torch.matmul(a, b.t())), 2.0 * m * n * k)


def attention():
    torch.backends.cuda.matmul.allow_tf32 = False
    for name, batch, seq, heads, kv_heads, dim in ATTENTION:
        shape = f"{name} B{batch} T{seq} H{heads}/{kv_heads} D{dim}"
        forward_flops = 4.0 * batch * heads * seq * seq * dim / 2.0
        for dtype, tag in ((torch.bfloat16, "bf16"), (torch.float32, "fp32")):
            q = torch.randn(batch, heads, seq, dim, device="cuda", dtype=dtype, requires_grad=True)
            k = torch.randn(batch, kv_heads, seq, dim, device="cuda", dtype=dtype, requires_grad=True)
            v = torch.randn(batch, kv_heads, seq, dim, device="cuda", dtype=dtype, requires_grad=True)
            dout = torch.randn(batch, heads, seq, dim, device="cuda", dtype=dtype)
            gqa = kv_heads != heads

            def forward():
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)

            def both():
                forward().backward(dout)

            with torch.no_grad():
                fwd = time_ms(forward, 2, 5)
            result(f"attention fwd {tag}", shape, fwd, forward_flops)
            result(f"attention fwd+bwd {tag}", shape, time_ms(both, 1, 3), 3.5 * forward_flops)


def decode():
    for name, batch, length, heads, kv_heads, dim in DECODE:
        shape = f"{name} B{batch} L{length} H{heads}/{kv_heads} D{dim}"
        for dtype, tag in ((torch.bfloat16, "bf16"), (torch.float32, "fp32")):
            read = 2 * batch * length * kv_heads * dim * dtype.itemsize  # keys and values
            copies = max(1, -(-CYCLE_BYTES // read))
            q = torch.randn(batch, heads, 1, dim, device="cuda", dtype=dtype)
            caches = [(torch.randn(batch, kv_heads, length, dim, device="cuda", dtype=dtype),
                       torch.randn(batch, kv_heads, length, dim, device="cuda", dtype=dtype)) for _ in range(copies)]
            calls = [0]

            def step():
                k, v = caches[calls[0] % copies]
                calls[0] += 1
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=kv_heads != heads)

            with torch.no_grad():
                ms = time_ms(step, copies, max(20, 2 * copies))
            print(f"DECODE|torch|decode attention {tag} cache|{shape}|{ms:.4f}|{read / (ms * 1e-3) / 1e9:.1f}",
                  flush=True)
            del caches


def prefill():
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    for name, rows, length, heads, kv_heads, dim in PREFILL:
        shape = f"{name} rows {rows} L{length} H{heads}/{kv_heads} D{dim}"
        q = torch.randn(1, heads, rows, dim, device="cuda", dtype=torch.bfloat16)
        # The kv heads repeated for the query heads beforehand (a causal bias with GQA is not served
        # by every backend); the time is the attention's.
        k, v = (torch.randn(1, kv_heads, length, dim, device="cuda", dtype=torch.bfloat16)
                .repeat_interleave(heads // kv_heads, dim=1) for _ in range(2))
        first = length - rows
        flops = 4.0 * heads * dim * (first + 1 + length) * rows / 2.0

        def step():
            if rows == length:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(rows, length))

        with torch.no_grad(), sdpa_kernel(SDPBackend.FLASH_ATTENTION):  # one backend for both masks
            ms = time_ms(step)
        print(f"PREFILL|torch|prompt attention|{shape}|{ms:.4f}|{flops / (ms * 1e-3) / 1e12:.1f}", flush=True)


if __name__ == "__main__":
    if not torch.cuda.is_available():
        print("SKIP|torch|all|all|no CUDA device for torch", flush=True)
        sys.exit(0)
    what = sys.argv[1] if len(sys.argv) > 1 else "all"
    if what in ("all", "gemm"):
        gemms()
    if what in ("all", "attention"):
        attention()
    if what in ("all", "decode"):
        decode()
    if what in ("all", "decode", "prefill"):
        prefill()
