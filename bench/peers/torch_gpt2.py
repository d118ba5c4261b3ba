#!/usr/bin/env python3
"""PyTorch CPU peer for loom's end-to-end training benchmark.

GPT-2 124M in plain torch (fp32): token + position embeddings, 12 pre-LN blocks
(LayerNorm, fused qkv Linear with bias, causal scaled_dot_product_attention,
proj, LayerNorm, MLP 4x with tanh-approx GELU), final LayerNorm, lm head tied
to the token embedding. AdamW (fused if the CPU build supports it, else
foreach), grad-norm clipping at 1.0. On torch 1.13 (Debian 12's python3-torch),
which predates the public F.scaled_dot_product_attention, the equivalent
private F._scaled_dot_product_attention(..., is_causal=True) is used. Random tokens, B=4, T=64, 2 threads.

Each timed step = zero_grad + forward + cross-entropy + backward +
clip_grad_norm_ + optimizer.step. Prints one machine-readable line:
  peer=pytorch tokens_per_s=<median> step_ms=<median> ...
Run with OPENBLAS_CORETYPE=SkylakeX (OpenBLAS misdetects this CPU).
"""
import argparse
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


if hasattr(F, "scaled_dot_product_attention"):          # torch >= 2.0
    SDPA = "F.scaled_dot_product_attention"

    def causal_attention(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
elif hasattr(F, "_scaled_dot_product_attention"):       # torch 1.13 (Debian 12)
    SDPA = "F._scaled_dot_product_attention"

    def causal_attention(q, k, v):
        return F._scaled_dot_product_attention(q, k, v, None, 0.0, False, True)[0]
else:
    SDPA = "manual"

    def causal_attention(q, k, v):
        T = q.size(-2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
        mask = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
        return att.masked_fill(mask, float("-inf")).softmax(-1) @ v


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln1 = nn.LayerNorm(C)
        self.qkv = nn.Linear(C, 3 * C)
        self.proj = nn.Linear(C, C)
        self.ln2 = nn.LayerNorm(C)
        self.fc = nn.Linear(C, 4 * C)
        self.fcproj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q = q.view(B, T, self.NH, C // self.NH).transpose(1, 2)
        k = k.view(B, T, self.NH, C // self.NH).transpose(1, 2)
        v = v.view(B, T, self.NH, C // self.NH).transpose(1, 2)
        y = causal_attention(q, k, v)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.proj(y)
        x = x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))
        return x


class GPT2(nn.Module):
    def __init__(self, V=50257, maxT=1024, L=12, NH=12, C=768):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(maxT, C)
        self.blocks = nn.ModuleList([Block(C, NH) for _ in range(L)])
        self.lnf = nn.LayerNorm(C)
        self.lm_head = nn.Linear(C, V, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, idx, targets):
        B, T = idx.shape
        pos = torch.arange(T, dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for blk in self.blocks:
            x = blk(x)
        logits = self.lm_head(self.lnf(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def make_optimizer(params, lr):
    # Prefer fused AdamW on CPU (torch >= 2.4), then foreach, then plain.
    for kw in ({"fused": True}, {"foreach": True}, {}):
        try:
            opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), eps=1e-8,
                                    weight_decay=0.0, **kw)
            return opt, (next(iter(kw)) if kw else "plain")
        except (RuntimeError, TypeError, ValueError):
            continue
    raise RuntimeError("no AdamW")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--B", type=int, default=4)
    ap.add_argument("--T", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1337)
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    V = 50257
    model = GPT2(V=V).float()
    model.train()
    nparams = sum(p.numel() for p in model.parameters())
    opt, opt_kind = make_optimizer(model.parameters(), 1e-4)
    g = torch.Generator().manual_seed(a.seed)

    def batch():
        t = torch.randint(0, V, (a.B, a.T + 1), generator=g)
        return t[:, :-1].contiguous(), t[:, 1:].contiguous()

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()

    times, losses = [], []
    for i in range(a.warmup + a.steps):
        x, y = batch()
        t0 = time.perf_counter()
        try:
            loss = step(x, y)
        except RuntimeError as e:
            # fused AdamW may be CUDA-only in this build: fall back to foreach
            if i == 0 and opt_kind == "fused":
                print(f"# fused AdamW failed ({e}); using foreach", file=sys.stderr)
                opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.999),
                                        eps=1e-8, weight_decay=0.0, foreach=True)
                opt_kind = "foreach"
                t0 = time.perf_counter()
                loss = step(x, y)
            else:
                raise
        dt = time.perf_counter() - t0
        losses.append(loss)
        tag = "warmup" if i < a.warmup else "step"
        print(f"# {tag} {i}: loss {loss:.4f} took {dt * 1000:.1f} ms", flush=True)
        if i >= a.warmup:
            times.append(dt)

    med = statistics.median(times)
    assert all(math.isfinite(l) for l in losses)
    print(f"peer=pytorch tokens_per_s={a.B * a.T / med:.2f} step_ms={med * 1000:.1f} "
          f"mean_step_ms={statistics.mean(times) * 1000:.1f} B={a.B} T={a.T} "
          f"threads={torch.get_num_threads()} steps={a.steps} warmup={a.warmup} "
          f"params={nparams} adamw={opt_kind} sdpa={SDPA} torch={torch.__version__}")


if __name__ == "__main__":
    main()
