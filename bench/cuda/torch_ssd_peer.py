#!/usr/bin/env python3
"""The peer of loom_bench_ssd_scan_cuda: Mamba-2's chunked scan (SSD) written as PyTorch einsums
over blocks of `chunk` tokens, the same function as loom's kernels (dt = softplus(dt_raw +
dt_bias), A = -exp(A_log), y = D x + the scan), forward and forward + backward (autograd) at the
same shapes, in fp32 and with the products in bf16 (autocast), each under torch.compile where it
compiles (eager otherwise: a NOTE line says which). Within a block: y_i = sum_{j <= i} (C_i . B_j)
exp(cum_i - cum_j) dt_j x_j; each block's state passes to the next through exp of the block's
total decay. TFLOP/s count the planner's scan FLOPs, as loom's rows do. Prints
RESULT|torch|op|shape|ms|TFLOP/s lines.
  torch_ssd_peer.py            the benchmark (needs CUDA; one SKIP line without it)
  torch_ssd_peer.py --check    the chunked form against the token-by-token recurrence (CPU)"""
import sys

import torch
import torch.nn.functional as F

from torch_cuda_peer import time_ms  # CUDA events over timed runs after warm-ups

# loom_bench_ssd_scan_cuda's cases: name, batch, seq, heads, head_dim, groups, state, chunk.
CASES = [("tiny-super", 8, 128, 8, 16, 2, 16, 64), ("nemotron-h", 1, 4096, 128, 64, 8, 128, 128),
         ("nemotron-h", 1, 8192, 128, 64, 8, 128, 128)]


def pairwise_decay_logs(a):
    """a [..., T] -> [..., T, T]: cum_i - cum_j for j <= i (the log of the decay from j to i), -inf above."""
    cum = torch.cumsum(a, dim=-1)
    diff = cum[..., :, None] - cum[..., None, :]
    causal = torch.ones(a.shape[-1], a.shape[-1], dtype=torch.bool, device=a.device).tril()
    return diff.masked_fill(~causal, float("-inf"))


def chunked_scan(x, dt_raw, dt_bias, a_log, B, C, D, chunk):
    """x [b, l, h, p], dt_raw [b, l, h], B and C [b, l, g, n]; l a multiple of chunk."""
    b, l, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    blocks = l // chunk
    dt = F.softplus(dt_raw + dt_bias)
    a = (dt * -torch.exp(a_log)).reshape(b, blocks, chunk, h).permute(0, 3, 1, 2)  # [b, h, c, L]
    xs = (x * dt[..., None]).reshape(b, blocks, chunk, h, p)
    Bh = B.repeat_interleave(h // g, dim=2).reshape(b, blocks, chunk, h, n)
    Ch = C.repeat_interleave(h // g, dim=2).reshape(b, blocks, chunk, h, n)
    cum = torch.cumsum(a, dim=-1)
    # Within each block: the masked quadratic form.
    weights = torch.einsum("bclhn,bcshn->bhcls", Ch, Bh) * torch.exp(pairwise_decay_logs(a))
    y = torch.einsum("bhcls,bcshp->bclhp", weights, xs)
    # Each block's own state, then the states entering each block (a zero state before the first).
    own = torch.einsum("bclhn,bhcl,bclhp->bchpn", Bh, torch.exp(cum[..., -1:] - cum), xs)
    own = torch.cat([torch.zeros_like(own[:, :1]), own], dim=1)
    passing = torch.exp(pairwise_decay_logs(F.pad(cum[..., -1], (1, 0))))  # [b, h, c + 1, c + 1]
    entering = torch.einsum("bhzc,bchpn->bzhpn", passing, own)[:, :-1]
    y = y + torch.einsum("bclhn,bchpn,bhcl->bclhp", Ch, entering, torch.exp(cum))
    return y.reshape(b, l, h, p) + D[:, None] * x


def recurrence(x, dt_raw, dt_bias, a_log, B, C, D):
    """The token-by-token form: S_t = exp(dt_t A) S_{t-1} + dt_t x_t B_t^T, y_t = S_t C_t + D x_t."""
    b, l, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    dt = F.softplus(dt_raw + dt_bias)
    A = -torch.exp(a_log)
    Bh, Ch = B.repeat_interleave(h // g, dim=2), C.repeat_interleave(h // g, dim=2)
    S = torch.zeros(b, h, p, n, dtype=x.dtype)
    ys = []
    for t in range(l):
        S = torch.exp(dt[:, t] * A)[..., None, None] * S + \
            (dt[:, t, :, None, None] * x[:, t, :, :, None]) * Bh[:, t, :, None, :]
        ys.append(torch.einsum("bhpn,bhn->bhp", S, Ch[:, t]) + D[:, None] * x[:, t])
    return torch.stack(ys, dim=1)


def inputs(batch, seq, heads, head_dim, groups, state, device, dtype=torch.float32, seed=1):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    rand = lambda *shape: (torch.rand(*shape, generator=gen, dtype=dtype) * 2 - 1).to(device)
    return (rand(batch, seq, heads, head_dim), rand(batch, seq, heads), rand(heads), rand(heads),
            rand(batch, seq, groups, state), rand(batch, seq, groups, state), rand(heads))


def check():
    """The chunked form equals the recurrence (double, CPU), at block sizes that do and do not cut
    the sequence into equal parts of the state's."""
    for chunk in (1, 4, 8):
        args = inputs(2, 16, 4, 3, 2, 5, "cpu", torch.float64, seed=chunk)
        got, want = chunked_scan(*args, chunk), recurrence(*args)
        err = ((got - want).abs().max() / want.abs().max()).item()
        print(f"chunk {chunk}: largest difference {err:.2e} of the largest output")
        assert err < 1e-12, f"the chunked scan differs from the recurrence at chunk {chunk}: {err}"
    print("ok")


def scan_flops(batch, seq, heads, head_dim, groups, state, chunk):
    prefix = (min(chunk, seq) + 1.0) / 2.0
    per_token = 2.0 * groups * state * prefix + 2.0 * heads * head_dim * prefix + 4.0 * heads * head_dim * state
    return batch * seq * per_token


def bench():
    try:
        compiled = torch.compile(chunked_scan)
    except Exception as e:  # no compiler in this torch
        print(f"SKIP|torch|ssd scan compile|all|{e}", flush=True)
        compiled = None
    for name, batch, seq, heads, head_dim, groups, state, chunk in CASES:
        shape = f"{name} B{batch} T{seq} H{heads} P{head_dim} G{groups} N{state} chunk{chunk}"
        flops = scan_flops(batch, seq, heads, head_dim, groups, state, chunk)
        args = inputs(batch, seq, heads, head_dim, groups, state, "cuda")
        for products in ("fp32", "bf16"):
            for fn, how in ((compiled, "compiled"), (chunked_scan, "eager")):
                if fn is None:
                    continue
                try:
                    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=products == "bf16"):
                        with torch.no_grad():
                            ms = time_ms(lambda: fn(*args, chunk), 2, 10)
                        leaves = [t.detach().requires_grad_() for t in args]
                        dy = torch.rand_like(args[0])

                        def both():
                            fn(*leaves, chunk).backward(dy)
                        both_ms = time_ms(both, 2, 10)
                except Exception as e:  # a compile failure: say so and try eager
                    print(f"SKIP|torch|ssd scan {products} {how}|{shape}|{str(e)[:160]}", flush=True)
                    continue
                # fp32's rows pair with loom's in gpu_table.py ("X via Y" against "X").
                suffix = "" if products == "fp32" else " bf16 products"
                print(f"NOTE|torch|ssd scan{suffix}|{shape}|{how}", flush=True)
                print(f"RESULT|torch|ssd scan fwd{suffix}|{shape}|{ms:.4f}|{flops / (ms * 1e-3) / 1e12:.1f}",
                      flush=True)
                print(f"RESULT|torch|ssd scan fwd+bwd{suffix}|{shape}|{both_ms:.4f}|"
                      f"{3 * flops / (both_ms * 1e-3) / 1e12:.1f}", flush=True)
                break  # the compiled form when it runs, else eager


if __name__ == "__main__":
    if "--check" in sys.argv:
        check()
        sys.exit(0)
    if not torch.cuda.is_available():
        print("SKIP|torch|ssd scan|all|no CUDA device for torch", flush=True)
        sys.exit(0)
    bench()
