#!/usr/bin/env python3
"""PyTorch peer of loom's GPU training benchmark: the model of one of loom's configs
(configs/gpt2-124m.yaml: LayerNorm, GELU, learned positions, biases, tied embeddings;
configs/llama-1b.yaml: RMSNorm, SwiGLU, RoPE, grouped-query attention), trained on one GPU at
B x T tokens per step in bf16 autocast with fp32 parameters (as llm.c and loom's bf16 recipe keep
fp32 master weights), causal F.scaled_dot_product_attention, global-norm clipping and fused
AdamW; first eager, then torch.compile'd (default mode). Random tokens generated on the device.

Each mode runs --warmup untimed steps (the compiled mode's first one compiles), then --steps
timed by CUDA events around every step (no host synchronisation inside the loop), and prints
  TRAIN|torch <mode>|<model>|B|T|tokens_per_s|median_step_ms|steps
with a readable line giving MFU (bench/cuda/train_shape.py: loom's FLOP count over the card's
dense bf16 peak). --device cpu --tiny is a smoke test of this script on a CPU (a small model of the
same architecture, eager only; it runs on older torch through the fallbacks marked below).

  torch_gpt2_peer.py --model gpt2-124m --batch 16 --seq 1024
  torch_gpt2_peer.py --model llama-1b --batch 4 --seq 2048"""
import argparse
import math
import re
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import train_results
import train_shape

TORCH_VERSION = tuple(int(part) for part in re.findall(r"\d+", torch.__version__)[:2])


def rms_norm(width, eps):
    if hasattr(nn, "RMSNorm"):
        return nn.RMSNorm(width, eps=eps)
    return RmsNorm(width, eps)  # torch < 2.4 (the CPU smoke test)


class RmsNorm(nn.Module):
    def __init__(self, width, eps):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(width))

    def forward(self, x):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps).to(x.dtype) * self.weight.to(x.dtype)


def causal_attention(q, k, v):
    """q [B, H, T, D], k/v [B, KV, T, D]: causal attention with grouped-query heads."""
    if k.size(1) != q.size(1):
        if TORCH_VERSION >= (2, 5):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        k = k.repeat_interleave(q.size(1) // k.size(1), dim=1)
        v = v.repeat_interleave(q.size(1) // v.size(1), dim=1)
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    # torch < 2.0 (the CPU smoke test): the T x T scores in memory.
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    hidden = torch.ones(q.size(2), q.size(2), dtype=torch.bool, device=q.device).triu(1)
    return scores.masked_fill(hidden, float("-inf")).softmax(-1).to(v.dtype) @ v


def rotate(x, cos, sin):
    """RoPE on [B, H, T, D] with the two halves of each head as the pairs' coordinates."""
    a, b = x.chunk(2, dim=-1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)


class Block(nn.Module):
    def __init__(self, m):
        super().__init__()
        d, self.heads, self.kv_heads, self.head_dim = m["d_model"], m["heads"], m["kv_heads"], m["head_dim"]
        layer_norm = m["norm"] == "layer"
        self.norm1 = nn.LayerNorm(d, eps=m["norm_eps"]) if layer_norm else rms_norm(d, m["norm_eps"])
        self.norm2 = nn.LayerNorm(d, eps=m["norm_eps"]) if layer_norm else rms_norm(d, m["norm_eps"])
        self.qkv = nn.Linear(d, (self.heads + 2 * self.kv_heads) * self.head_dim, bias=m["bias"] or m["qkv_bias"])
        self.out = nn.Linear(self.heads * self.head_dim, d, bias=m["bias"])
        self.swiglu = m["activation"] == "swiglu"
        self.up = nn.Linear(d, (2 if self.swiglu else 1) * m["ffn_size"], bias=m["bias"])
        self.down = nn.Linear(m["ffn_size"], d, bias=m["bias"])

    def forward(self, x, rope):
        B, T, _ = x.shape
        sizes = [self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim]
        q, k, v = self.qkv(self.norm1(x)).split(sizes, dim=-1)
        q = q.view(B, T, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        if rope is not None:
            q, k = rotate(q, *rope), rotate(k, *rope)
        x = x + self.out(causal_attention(q, k, v).transpose(1, 2).reshape(B, T, -1))
        h = self.up(self.norm2(x))
        if self.swiglu:
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        else:
            h = F.gelu(h, approximate="tanh")
        return x + self.down(h)


class Transformer(nn.Module):
    def __init__(self, m, seq):
        super().__init__()
        d, self.vocab = m["d_model"], m["vocab_size"]
        self.embed = nn.Embedding(self.vocab, d)
        self.positions = nn.Embedding(m["max_seq_len"], d) if m["positions"] == "learned" else None
        self.blocks = nn.ModuleList(Block(m) for _ in range(m["layers"]))
        self.norm = nn.LayerNorm(d, eps=m["norm_eps"]) if m["norm"] == "layer" else rms_norm(d, m["norm_eps"])
        self.head = None if m["tied_embeddings"] else nn.Linear(d, self.vocab, bias=False)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=m["init_std"])
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        if m["positions"] == "rope":
            half = m["head_dim"] // 2
            inverse = m["rope_theta"] ** (-torch.arange(half, dtype=torch.float64) / half)
            angles = torch.outer(torch.arange(seq, dtype=torch.float64), inverse)
            self.register_buffer("cos", angles.cos().float(), persistent=False)
            self.register_buffer("sin", angles.sin().float(), persistent=False)
        else:
            self.cos = self.sin = None

    def forward(self, tokens, targets):
        T = tokens.size(1)
        x = self.embed(tokens)
        if self.positions is not None:
            x = x + self.positions(torch.arange(T, device=tokens.device))
        rope = None if self.cos is None else (self.cos[:T], self.sin[:T])
        for block in self.blocks:
            x = block(x, rope)
        x = self.norm(x)
        logits = F.linear(x, self.embed.weight if self.head is None else self.head.weight)
        return F.cross_entropy(logits.view(-1, self.vocab), targets.view(-1))


def tiny(m):
    """The same architecture at a size a CPU trains in seconds."""
    kv = m["kv_heads"] * 4 // m["heads"]
    return {**m, "d_model": 64, "heads": 4, "kv_heads": max(kv, 1), "head_dim": 16, "layers": 2, "ffn_size": 128,
            "vocab_size": 512}


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt2-124m", help="a config in configs/ (gpt2-124m, llama-1b)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--modes", default="eager,compile", help="comma-separated: eager, compile")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--vocab-size", type=int, default=0,
                    help="rows of the embedding and head (e.g. 50304: GPT-2's 50257 padded to a multiple of 128, "
                         "as llm.c pads its matmuls); the tokens stay below the config's vocabulary")
    ap.add_argument("--tiny", action="store_true", help="a small model of the same architecture (smoke test)")
    return ap.parse_args()


def optimizer(model, device):
    # Loom's defaults for what the configs leave out: betas 0.9 / 0.95, eps 1e-8, weight decay 0.1.
    kind = {"fused": True} if device.type == "cuda" else {"foreach": True}
    return torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, **kind)


class Timer:
    """Per-step times: CUDA events on the GPU (read after one synchronisation), else the wall clock."""

    def __init__(self, device):
        self.cuda, self.marks = device.type == "cuda", []

    def mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def step_seconds(self):
        if self.cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) / 1e3 for a, b in zip(self.marks, self.marks[1:])]
        return [b - a for a, b in zip(self.marks, self.marks[1:])]


def train(step_fn, batches, warmup, steps, device):
    for i in range(warmup):
        loss = step_fn(*batches[i % len(batches)])
    first = float(loss) if warmup else float("nan")
    timer = Timer(device)
    timer.mark()
    for i in range(steps):
        loss = step_fn(*batches[i % len(batches)])
        timer.mark()
    seconds = timer.step_seconds()
    last = float(loss)
    if not math.isfinite(last):
        raise RuntimeError(f"the loss is {last} after {warmup + steps} steps")
    return seconds, first, last


def main():
    a = parse_args()
    device = torch.device(a.device)
    m = train_shape.load_model(a.model)
    flops = train_shape.flops_per_token(m, a.seq)  # the config's vocabulary: the useful FLOPs
    if a.tiny:
        m = tiny(m)
    token_ids = m["vocab_size"]
    if a.vocab_size:
        if a.vocab_size < token_ids:
            raise SystemExit(f"--vocab-size {a.vocab_size} is below the config's vocabulary ({token_ids})")
        m = {**m, "vocab_size": a.vocab_size}
    torch.manual_seed(1234)
    if TORCH_VERSION >= (2, 0):
        with device:  # parameters made and initialised on the device (a 1B model's init is slow on a CPU)
            model = Transformer(m, a.seq)
    else:
        model = Transformer(m, a.seq).to(device)
    opt = optimizer(model, device)
    parameters = list(model.parameters())
    generator = torch.Generator(device=device).manual_seed(1234)
    batches = [torch.randint(0, token_ids, (a.batch, a.seq + 1), device=device, generator=generator)
               for _ in range(4)]
    batches = [(b[:, :-1].contiguous(), b[:, 1:].contiguous()) for b in batches]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = train_shape.peak_tflops(name)
    print(f"# {a.model}{' (tiny)' if a.tiny else ''}: {sum(p.numel() for p in parameters)} parameters, "
          f"B {a.batch} x T {a.seq}, {flops / 1e9:.3f} GFLOP per token (loom's count); {name}; torch {torch.__version__}",
          flush=True)

    for mode in a.modes.split(","):
        forward = torch.compile(model) if mode == "compile" else model

        def step(tokens, targets):
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = forward(tokens, targets)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(parameters, 1.0)
            opt.step()
            return loss.detach()

        started = time.perf_counter()
        seconds, first, last = train(step, batches, a.warmup, a.steps, device)
        print(train_results.train_line(f"torch {mode}", a.model + ("-tiny" if a.tiny else ""), a.batch, a.seq, seconds))
        tokens_per_s = a.batch * a.seq / statistics.median(seconds)
        mfu = f"MFU {100 * flops * tokens_per_s / (peak * 1e12):.1f}% of {peak} TFLOP/s" if peak and not a.tiny else "MFU -"
        memory = f", peak memory {torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB" if device.type == "cuda" else ""
        print(f"# torch {mode}: {tokens_per_s:.0f} tokens/s, {mfu}; loss {first:.3f} -> {last:.3f}; "
              f"{time.perf_counter() - started:.1f} s with warm-up{memory}", flush=True)


if __name__ == "__main__":
    try:
        main()
    except (OSError, ValueError, RuntimeError) as e:
        sys.exit(f"torch_gpt2_peer: {e}")
