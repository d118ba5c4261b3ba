#!/usr/bin/env python3
"""Write random-init inputs for llm.c's CPU trainer (train_gpt2.c).

Python 3 stdlib only (struct, random, array); NumPy is not required.

Writes, under --out (the llm.c working directory):
  gpt2_124M.bin                                        model checkpoint
  dev/data/tinyshakespeare/tiny_shakespeare_train.bin  random tokens
  dev/data/tinyshakespeare/tiny_shakespeare_val.bin    random tokens

Formats (from train_gpt2.c gpt2_build_from_checkpoint and llmc/dataloader.h):
  checkpoint: int32[256] header = {20240326 (magic), 3 (version), maxT, V, L,
              NH, C, Vp, 0...}, then float32 params in this order:
              wte (Vp,C), wpe (maxT,C), ln1w (L,C), ln1b (L,C),
              qkvw (L,3C,C), qkvb (L,3C), attprojw (L,C,C), attprojb (L,C),
              ln2w (L,C), ln2b (L,C), fcw (L,4C,C), fcb (L,4C),
              fcprojw (L,C,4C), fcprojb (L,C), lnfw (C), lnfb (C)
  tokens:     int32[256] header = {20240520 (magic), 1 (version), ntok, 0...},
              then ntok uint16 token ids.

Init: weights ~ N(0, 0.02) (wte rows V..Vp-1, the padding, are zero),
biases 0, LayerNorm weights 1. To keep this fast in pure Python, normal
samples are drawn once into a pool of 2^20 values and each 64Ki chunk of a
weight tensor is copied from a random offset into that pool; the values are
N(0, 0.02) distributed, which is all a throughput benchmark needs.
"""
import argparse
import array
import os
import random
import struct
import sys

POOL = 1 << 20
CHUNK = 1 << 16


def write_header(f, vals):
    hdr = [0] * 256
    hdr[: len(vals)] = vals
    f.write(struct.pack("<256i", *hdr))


class Filler:
    def __init__(self, seed, std):
        self.rng = random.Random(seed)
        g = self.rng.gauss
        self.pool = array.array("f", (g(0.0, std) for _ in range(POOL + CHUNK)))

    def normal(self, f, n):
        while n > 0:
            k = min(n, CHUNK)
            off = self.rng.randrange(POOL)
            self.pool[off : off + k].tofile(f)
            n -= k


def const(f, n, value):
    block = array.array("f", [value]) * CHUNK
    while n > 0:
        k = min(n, CHUNK)
        block[:k].tofile(f)
        n -= k


def write_checkpoint(path, maxT, V, Vp, L, NH, C, seed):
    assert sys.byteorder == "little"
    fill = Filler(seed, 0.02)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        write_header(f, [20240326, 3, maxT, V, L, NH, C, Vp])
        fill.normal(f, V * C)              # wte (real vocab rows)
        const(f, (Vp - V) * C, 0.0)        # wte padding rows
        fill.normal(f, maxT * C)           # wpe
        const(f, L * C, 1.0)               # ln1w
        const(f, L * C, 0.0)               # ln1b
        fill.normal(f, L * 3 * C * C)      # qkvw
        const(f, L * 3 * C, 0.0)           # qkvb
        fill.normal(f, L * C * C)          # attprojw
        const(f, L * C, 0.0)               # attprojb
        const(f, L * C, 1.0)               # ln2w
        const(f, L * C, 0.0)               # ln2b
        fill.normal(f, L * 4 * C * C)      # fcw
        const(f, L * 4 * C, 0.0)           # fcb
        fill.normal(f, L * C * 4 * C)      # fcprojw
        const(f, L * C, 0.0)               # fcprojb
        const(f, C, 1.0)                   # lnfw
        const(f, C, 0.0)                   # lnfb
    os.replace(tmp, path)


def num_params(maxT, V, Vp, L, C):
    return Vp * C + maxT * C + L * (12 * C * C + 13 * C) + 2 * C


def write_tokens(path, ntok, V, seed):
    rng = random.Random(seed)
    toks = array.array("H", (rng.randrange(V) for _ in range(ntok)))
    assert toks.itemsize == 2
    with open(path, "wb") as f:
        write_header(f, [20240520, 1, ntok])
        toks.tofile(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="llm.c working directory")
    ap.add_argument("--maxT", type=int, default=1024)
    ap.add_argument("--V", type=int, default=50257)
    ap.add_argument("--Vp", type=int, default=50304)
    ap.add_argument("--L", type=int, default=12)
    ap.add_argument("--NH", type=int, default=12)
    ap.add_argument("--C", type=int, default=768)
    ap.add_argument("--train-tokens", type=int, default=65536)
    ap.add_argument("--val-tokens", type=int, default=16384)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--force", action="store_true", help="rewrite even if present")
    a = ap.parse_args()

    ckpt = os.path.join(a.out, "gpt2_124M.bin")
    n = num_params(a.maxT, a.V, a.Vp, a.L, a.C)
    want = 256 * 4 + n * 4
    if a.force or not os.path.exists(ckpt) or os.path.getsize(ckpt) != want:
        print(f"writing {ckpt} ({n} params, {want / 2**20:.0f} MiB)", flush=True)
        write_checkpoint(ckpt, a.maxT, a.V, a.Vp, a.L, a.NH, a.C, a.seed)
    else:
        print(f"reusing {ckpt} ({n} params)")
    assert os.path.getsize(ckpt) == want

    ddir = os.path.join(a.out, "dev", "data", "tinyshakespeare")
    os.makedirs(ddir, exist_ok=True)
    for name, ntok, seed in (("train", a.train_tokens, a.seed + 1),
                             ("val", a.val_tokens, a.seed + 2)):
        p = os.path.join(ddir, f"tiny_shakespeare_{name}.bin")
        write_tokens(p, ntok, a.V, seed)
        print(f"wrote {p} ({ntok} tokens)")


if __name__ == "__main__":
    main()
