"""The model shapes of the GPU training benchmark, read from loom's own configs (one definition for
loom and its peers), and the FLOP count that turns tokens/s into MFU.

FLOPs per token are loom's (src/loom/model/flops.cpp, the `gflops_per_s` of metrics.jsonl):
3 x the forward's matrix products, i.e. 6 x the parameters in matrices (q/k/v/o, the MLP, the
output head counted even when tied to the embedding; embeddings' lookups and norms not counted)
plus causal attention's scores and weighted sums over (T + 1) / 2 keys on average:
3 x 2 x 2 x heads x head_dim x (T + 1) / 2 per token and layer. PaLM's convention (used by
Megatron-LM and llm.c) counts attention over all T keys (12 x layers x heads x head_dim x T);
`palm_flops_per_token` gives that count for comparison with their MFU figures.

Peak: the card's dense bf16 tensor-core rate from NVIDIA's datasheets (half the "with sparsity"
figure): H100 SXM and H200 989.4 TFLOP/s, H100 NVL 835.5, H100 PCIe 756.5; LOOM_PEAK_TFLOPS
overrides it."""
import os
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[2]

DENSE_BF16_TFLOPS = [("H100 PCIe", 756.5), ("H100 NVL", 835.5), ("H100", 989.4), ("H200", 989.4)]


def load_model(name):
    """The `model` section of configs/NAME.yaml with loom's defaults for the keys it leaves out."""
    import yaml

    path = REPO / "configs" / f"{name}.yaml"
    with open(path, encoding="utf-8") as f:
        model = yaml.safe_load(f)["model"]
    for key in ("moe", "mamba", "layer_pattern", "block_configs", "mtp_depths"):
        if model.get(key):
            raise ValueError(f"{path}: model.{key} is set; the GPU training peers build dense transformers only")
    defaults = {"kv_heads": 0, "norm": "rms", "activation": "swiglu", "positions": "rope", "tied_embeddings": True,
                "bias": False, "qkv_bias": False, "rope_theta": 10000.0, "norm_eps": 1e-5, "init_std": 0.02}
    model = {**defaults, **model}
    if model["vocab_size"] <= 0:
        raise ValueError(f"{path}: model.vocab_size must be explicit (> 0) for the GPU training peers")
    if model["kv_heads"] == 0:
        model["kv_heads"] = model["heads"]
    model["head_dim"] = model["d_model"] // model["heads"]
    return model


def matrix_params(m):
    """Parameters in the matrix products per token: every layer's projections and the head."""
    d, hd, ffn = m["d_model"], m["head_dim"], m["ffn_size"]
    attention = d * (m["heads"] + 2 * m["kv_heads"]) * hd + m["heads"] * hd * d
    mlp = (3 if m["activation"] == "swiglu" else 2) * d * ffn
    return m["layers"] * (attention + mlp) + d * m["vocab_size"]


def flops_per_token(m, seq):
    """loom's training FLOPs per token (causal attention over (seq + 1) / 2 keys on average)."""
    attention = 3.0 * 2.0 * 2.0 * m["heads"] * m["head_dim"] * (seq + 1) / 2.0
    return 6.0 * matrix_params(m) + m["layers"] * attention


def palm_flops_per_token(m, seq):
    """PaLM's / Megatron-LM's count: attention over all seq keys."""
    return 6.0 * matrix_params(m) + 12.0 * m["layers"] * m["heads"] * m["head_dim"] * seq


def peak_tflops(device_name):
    """Dense bf16 peak of the named GPU, or None when it is not one of the table's."""
    if os.environ.get("LOOM_PEAK_TFLOPS"):
        return float(os.environ["LOOM_PEAK_TFLOPS"])
    for key, tflops in DENSE_BF16_TFLOPS:
        if key in device_name:
            return tflops
    return None
