#!/usr/bin/env python3
"""Token files for the GPU training benchmark: the same deterministic pseudo-random tokens (below the
vocabulary size) written in llm.c's shard format and as loom's (Megatron's) indexed dataset.
Python's standard library only.

  token_shards.py llmc  --out DIR --tokens N [--vocab V] [--seed S]   DIR/train.bin, DIR/val.bin
  token_shards.py check-llmc FILE --batch B --seq T                    read back as llm.c does
  token_shards.py loom  --prefix P --tokens N [--vocab V] [--seed S]   P.bin + P.idx

llm.c's shard (llmc/dataloader.h, dataloader_load_shard_): 256 little-endian int32 (magic
20240520, version 1, token count, then zeros), then the tokens as uint16. Its loader rejects a bad
magic or version, a count <= 0, a file whose size is not 1024 + 2 x count bytes, and a shard
with fewer than B x T + 1 tokens. `check-llmc` applies the same checks.

loom's dataset (src/loom/data/indexed_dataset.h): P.bin holds the uint16 tokens, P.idx is
"MMIDIDX\\0\\0", u64 version 1, u8 dtype 8 (uint16), u64 sequence count, u64 document-index
count, i32 lengths, i64 byte offsets, i64 document indices; one document per sequence of
`--doc` tokens."""
import argparse
import array
import os
import random
import struct
import sys

LLMC_MAGIC, LLMC_VERSION, LLMC_HEADER_INTS = 20240520, 1, 256
MEGATRON_MAGIC, MEGATRON_UINT16 = b"MMIDIDX\x00\x00", 8


def tokens(count, vocab, seed):
    """`count` pseudo-random ids in [0, vocab), the same for the same seed on every machine."""
    if not 0 < vocab <= 65536:
        raise ValueError(f"vocab {vocab} does not fit uint16 tokens (1..65536)")
    rng = random.Random(seed)
    out = array.array("H", (rng.randrange(vocab) for _ in range(count)))
    if sys.byteorder != "little":
        out.byteswap()
    return out


def replace_atomically(path, write):
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        write(f)
    os.replace(tmp, path)


def write_llmc_shard(path, toks):
    header = [LLMC_MAGIC, LLMC_VERSION, len(toks)] + [0] * (LLMC_HEADER_INTS - 3)

    def write(f):
        f.write(struct.pack(f"<{LLMC_HEADER_INTS}i", *header))
        toks.tofile(f)

    replace_atomically(path, write)


def check_llmc_shard(path, batch, seq):
    """llm.c's own checks of a shard (dataloader_load_shard_ and dataloader_init); returns the count."""
    with open(path, "rb") as f:
        header = struct.unpack(f"<{LLMC_HEADER_INTS}i", f.read(4 * LLMC_HEADER_INTS))
    if header[0] != LLMC_MAGIC:
        raise ValueError(f"{path}: bad magic {header[0]} (llm.c wants {LLMC_MAGIC})")
    if header[1] != LLMC_VERSION:
        raise ValueError(f"{path}: bad version {header[1]} (llm.c wants {LLMC_VERSION})")
    count = header[2]
    if count <= 0:
        raise ValueError(f"{path}: token count {count} must be > 0")
    size, expected = os.path.getsize(path), 4 * LLMC_HEADER_INTS + 2 * count
    if size != expected:
        raise ValueError(f"{path}: {size} bytes, llm.c expects {expected} for {count} tokens")
    if count < batch * seq + 1:
        raise ValueError(f"{path}: {count} tokens, llm.c needs at least B x T + 1 = {batch * seq + 1}")
    return count


def write_megatron(prefix, toks, doc):
    lengths = [min(doc, len(toks) - start) for start in range(0, len(toks), doc)]
    offsets, at = [], 0
    for n in lengths:
        offsets.append(at)
        at += 2 * n
    replace_atomically(f"{prefix}.bin", toks.tofile)

    def write_index(f):
        f.write(MEGATRON_MAGIC + struct.pack("<QBQQ", 1, MEGATRON_UINT16, len(lengths), len(lengths) + 1))
        f.write(struct.pack(f"<{len(lengths)}i", *lengths))
        f.write(struct.pack(f"<{len(offsets)}q", *offsets))
        f.write(struct.pack(f"<{len(lengths) + 1}q", *range(len(lengths) + 1)))

    replace_atomically(f"{prefix}.idx", write_index)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    llmc = sub.add_parser("llmc")
    llmc.add_argument("--out", required=True)
    check = sub.add_parser("check-llmc")
    check.add_argument("file")
    check.add_argument("--batch", type=int, required=True)
    check.add_argument("--seq", type=int, required=True)
    loom = sub.add_parser("loom")
    loom.add_argument("--prefix", required=True)
    loom.add_argument("--doc", type=int, default=4096, help="tokens per document")
    for p in (llmc, loom):
        p.add_argument("--tokens", type=int, required=True)
        p.add_argument("--vocab", type=int, default=50257)
        p.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()
    if a.command == "llmc":
        os.makedirs(a.out, exist_ok=True)
        write_llmc_shard(os.path.join(a.out, "train.bin"), tokens(a.tokens, a.vocab, a.seed))
        write_llmc_shard(os.path.join(a.out, "val.bin"), tokens(a.tokens, a.vocab, a.seed + 1))
        print(f"llm.c shards: {a.out}/train.bin, {a.out}/val.bin ({a.tokens} tokens below {a.vocab} each)")
    elif a.command == "check-llmc":
        count = check_llmc_shard(a.file, a.batch, a.seq)
        print(f"{a.file}: llm.c header ok ({count} tokens, B x T + 1 = {a.batch * a.seq + 1} fit)")
    else:
        parent = os.path.dirname(a.prefix)
        if parent:
            os.makedirs(parent, exist_ok=True)
        write_megatron(a.prefix, tokens(a.tokens, a.vocab, a.seed), a.doc)
        print(f"loom dataset: {a.prefix}.bin/.idx ({a.tokens} tokens below {a.vocab})")


if __name__ == "__main__":
    try:
        main()
    except (OSError, ValueError, struct.error) as e:
        sys.exit(f"token_shards: {e}")
