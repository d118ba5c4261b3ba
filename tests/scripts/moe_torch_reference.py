#!/usr/bin/env python3
"""One MoE layer in PyTorch (float64, autograd) from the definitions Megatron-Core uses, compared
with what loom computed on the same weights and inputs (tests/model/moe_reference_dump_test.cpp):
the output, the selected experts, the load-balancing and z losses, the input gradient and every
parameter's gradient, the router's included. Usage: moe_torch_reference.py DUMP_ROOT.
Exit 0 when every case matches, 1 when one does not, 77 when torch is not installed."""
import os
import sys

try:
    import numpy as np
    import torch
except ImportError as e:
    print(f"moe_torch_reference: {e} (Debian: apt-get install -y python3-torch)", file=sys.stderr)
    sys.exit(77)

ROUTERS = ["topk_softmax", "softmax_topk", "sigmoid"]


def load(case_dir):
    values, arrays = {}, {}
    with open(os.path.join(case_dir, "meta.txt")) as f:
        for line in f:
            kind, key, v = line.split()
            if kind == "value":
                values[key] = float(v)
            else:
                dtype = np.int32 if key == "selected" else np.float32
                arrays[key] = np.fromfile(os.path.join(case_dir, key + ".bin"), dtype=dtype)
                assert arrays[key].size == int(v), key
    return values, arrays


def reference(v, a):
    T = int(v["batch"] * v["seq"])
    C, E, k, F = int(v["d_model"]), int(v["experts"]), int(v["top_k"]), int(v["ffn"])
    router = ROUTERS[int(v["router"])]
    t64 = lambda name, *shape: torch.tensor(a[name].astype(np.float64).reshape(*shape), requires_grad=True)
    x = t64("x", T, C)
    pre = "value.model.layers.0.mlp."
    params = {name[len("value."):]: t64(name, -1) for name in a if name.startswith("value.")}
    w_router = params["model.layers.0.mlp.gate.weight"].view(E, C)
    bias = torch.tensor(a["expert_bias"].astype(np.float64))
    logits = x @ w_router.T
    if router == "sigmoid":
        scores = torch.sigmoid(logits)
    else:
        scores = torch.softmax(logits, dim=-1)
    select_by = (logits if router == "topk_softmax" else scores).detach() + bias
    top = torch.topk(select_by, k, dim=-1)
    sel = top.indices
    picked = torch.gather(logits if router == "topk_softmax" else scores, 1, sel)
    if router == "topk_softmax":
        weight = torch.softmax(picked, dim=-1)
    elif router == "softmax_topk":
        weight = picked
    else:
        weight = picked / picked.sum(-1, keepdim=True)
    weight = weight * v["scaling"]
    y = torch.zeros(T, C, dtype=torch.float64)
    for e in range(E):
        p = f"model.layers.0.mlp.experts.{e}."
        gate = params[p + "gate_proj.weight"].view(F, C)
        up = params[p + "up_proj.weight"].view(F, C)
        down = params[p + "down_proj.weight"].view(C, F)
        out = (torch.nn.functional.silu(x @ gate.T) * (x @ up.T)) @ down.T
        w_e = (weight * (sel == e)).sum(-1, keepdim=True)  # 0 for tokens that did not pick e
        y = y + w_e * out
    # Switch / Megatron load balancing per group: coeff * E / (k * T_g^2) * sum_e count_e * sum_t p_te.
    groups = int(v["batch"]) if v["aux_per_sequence"] else 1
    probs = scores / scores.sum(-1, keepdim=True) if router == "sigmoid" else scores
    aux = torch.zeros((), dtype=torch.float64)
    for g in range(groups):
        rows = slice(g * T // groups, (g + 1) * T // groups)
        tg = T // groups
        counts = torch.bincount(sel[rows].reshape(-1), minlength=E).to(torch.float64)
        aux = aux + v["aux_coeff"] * E / (k * tg * tg) * (counts * probs[rows].sum(0)).sum()
    aux = aux / groups
    z = v["z_coeff"] * torch.logsumexp(logits, dim=-1).square().mean()
    dy = torch.tensor(a["dy"].astype(np.float64).reshape(T, C))
    objective = (y * dy).sum() + v["aux_scale"] * (aux + z)
    objective.backward()
    return sel, y, aux, z, x, params


def compare(name, ours, ref, rtol=2e-4):
    ref = np.asarray(ref, dtype=np.float64).reshape(-1)
    ours = np.asarray(ours, dtype=np.float64).reshape(-1)
    err = float(np.max(np.abs(ours - ref))) if ref.size else 0.0
    bound = rtol * max(1e-3, float(np.max(np.abs(ref))) if ref.size else 0.0)
    ok = err <= bound
    if not ok:
        print(f"  MISMATCH {name}: max |loom - torch| {err:.3e} > {bound:.3e}")
    return ok, err / max(bound / rtol, 1e-30)


def check_case(case_dir):
    v, a = load(case_dir)
    sel, y, aux, z, x, params = reference(v, a)
    T, k = int(v["batch"] * v["seq"]), int(v["top_k"])
    ok = True
    if not np.array_equal(np.sort(sel.numpy(), axis=1), np.sort(a["selected"].reshape(T, k), axis=1)):
        print("  MISMATCH selected experts")
        ok = False
    checks = [("y", a["y"], y.detach().numpy()), ("aux_loss", [v["aux_loss"]], [aux.item()]),
              ("z_loss", [v["z_loss"]], [z.item()]), ("d_input", a["dx"], x.grad.numpy())]
    for name, p in params.items():
        checks.append(("d " + name, a["grad." + name], p.grad.numpy()))
    worst = 0.0
    for name, ours, ref in checks:
        good, rel = compare(name, ours, ref)
        ok &= good
        worst = max(worst, rel)
    router_grad = np.linalg.norm(params["model.layers.0.mlp.gate.weight"].grad.numpy())
    print(f"{os.path.basename(case_dir)}: {'ok' if ok else 'FAILED'}; {len(checks)} tensors, worst relative error "
          f"{worst:.2e}; aux {aux.item():.6f} z {z.item():.6f}; router gradient norm {router_grad:.5f}")
    return ok


def main():
    root = sys.argv[1]
    cases = sorted(d for d in os.listdir(root) if os.path.isfile(os.path.join(root, d, "meta.txt")))
    if len(cases) != 3:
        print(f"moe_torch_reference: expected 3 cases under {root}, found {cases}", file=sys.stderr)
        return 1
    return 0 if all([check_case(os.path.join(root, c)) for c in cases]) else 1


if __name__ == "__main__":
    sys.exit(main())
