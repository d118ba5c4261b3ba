#!/usr/bin/env python3
"""Fails when a file of one layer includes a header of another layer that it does not link.

Usage: check_layers.py [ROOT]   (ROOT: the tree to check, default the repository)

A layer is a folder src/loom/<layer>/ (subfolders included) built by `loom_layer(<layer> deps...)`
in ROOT/CMakeLists.txt; src/loom/kernels/cuda/ is the `loom_cuda` library and src/loom/comm/nccl/
the `loom_nccl` library, whose links are their `target_link_libraries(loom_cuda ...)` and
`target_link_libraries(loom_nccl ...)`. A layer may include its own headers and those of every
layer it links, directly or transitively. The device seam: only src/loom/kernels/ includes the
CPU kernels (loom/kernels/cpu/...); every other layer calls the device-neutral entries
(loom/kernels/ops.h), which dispatch on where the tensors live.
"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]loom/([^">]+)[">]')


def read_links(cmake_text):
    """{layer: set of directly linked layers} from loom_layer(...) and loom_cuda's and loom_nccl's links."""
    links = {}
    text = re.sub(r"#[^\n]*", "", cmake_text)
    for m in re.finditer(r"\bloom_layer\s*\(([^)]*)\)", text):
        words = m.group(1).split()
        if not words or words[0] == "name":
            continue  # the function's own definition
        links[words[0]] = {w[len("loom_"):] for w in words[1:] if w.startswith("loom_")}
    for m in re.finditer(r"\btarget_link_libraries\s*\(\s*loom_(cuda|nccl)\b([^)]*)\)", text):
        linked = (w[len("loom_"):] for w in m.group(2).split() if w.startswith("loom_"))
        links.setdefault(m.group(1), set()).update(linked)
    return links


def closure(links, layer):
    seen, todo = set(), [layer]
    while todo:
        for dep in links.get(todo.pop(), ()):
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def layer_of(path_under_loom):
    """The layer of a path relative to src/loom/ (or of an include "loom/<...>")."""
    parts = path_under_loom.split("/")
    if len(parts) >= 3 and parts[0] == "kernels" and parts[1] == "cuda":
        return "cuda"
    if len(parts) >= 3 and parts[0] == "comm" and parts[1] == "nccl":
        return "nccl"
    return parts[0] if len(parts) >= 2 else None


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.abspath(argv[1]) if len(argv) > 1 else os.path.dirname(os.path.dirname(here))
    with open(os.path.join(root, "CMakeLists.txt"), encoding="utf-8") as f:
        links = read_links(f.read())
    if not links:
        print(f"check_layers: FAIL: no loom_layer(...) lines in {root}/CMakeLists.txt", file=sys.stderr)
        return 1
    base = os.path.join(root, "src", "loom")
    failures = []
    for dirpath, _, names in sorted(os.walk(base)):
        for name in sorted(names):
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, base).replace(os.sep, "/")
            layer = layer_of(rel)
            if layer is None or not name.endswith((".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh")):
                continue
            if layer not in links:
                failures.append(f"src/loom/{rel}: layer '{layer}' has no loom_layer({layer} ...) in CMakeLists.txt")
                continue
            allowed = closure(links, layer) | {layer}
            with open(full, encoding="utf-8", errors="replace") as f:
                for number, line in enumerate(f, 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    if m.group(1).startswith("kernels/cpu/") and layer not in ("kernels", "cuda"):
                        failures.append(f"src/loom/{rel}:{number}: includes \"loom/{m.group(1)}\" outside "
                                        f"src/loom/kernels/; call the device-neutral entry in loom/kernels/ops.h")
                        continue
                    target = layer_of(m.group(1))
                    if target is None or target in allowed:
                        continue
                    failures.append(f"src/loom/{rel}:{number}: includes \"loom/{m.group(1)}\" of layer '{target}', "
                                    f"but loom_{layer} does not link loom_{target} (directly or transitively); "
                                    f"add it to loom_{layer}'s links in CMakeLists.txt if the layering allows it")
    for msg in failures:
        print(f"check_layers: FAIL: {msg}", file=sys.stderr)
    if failures:
        print(f"check_layers: {len(failures)} violation(s)", file=sys.stderr)
        return 1
    print("check_layers: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
