#!/usr/bin/env python3
"""Fails when a Communicator method is called under src/loom/ outside the declared communication
files, the paths and globs of the ```collective-files block in docs/collectives.md.

Usage: check_collectives.py [--list] [ROOT]   (ROOT: the tree to check, default the repository;
--list prints every call found, allowed or not, with its enclosing function)

A call is `.name(` or `->name(` of a Communicator method (all_reduce, reduce_scatter, all_gather,
all_gather_v, broadcast, reduce, all_to_all, all_to_all_v, barrier, send, recv, each also with
_async, exchange_async, and split) with the method's number of arguments, so that same-named helpers with other
signatures (TensorParallel::split and all_reduce, std containers) are not taken for it. Comments
and string literals are skipped.
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_sizes import blank_comments_and_strings, functions  # noqa: E402

# Method -> the argument counts of its Communicator overloads (communicator.h).
ARITY = {
    "all_reduce": {4}, "reduce_scatter": {5}, "all_gather": {4}, "all_gather_v": {4},
    "broadcast": {4}, "reduce": {6}, "all_to_all": {4}, "all_to_all_v": {6}, "barrier": {0},
    "send": {5}, "recv": {5}, "exchange": {1}, "split": {3},
}
# std::atomic's exchange takes one argument too: only exchange_async is taken for Communicator's.
ASYNC_ONLY = {"exchange"}
CALL = re.compile(r"(?:\.|->)\s*(" + "|".join(sorted(ARITY, key=len, reverse=True)) + r")(_async)?\s*\(")
SUFFIXES = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh")


def declared_globs(doc_path):
    with open(doc_path, encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"^```collective-files[ \t]*\n(.*?)^```", text, re.S | re.M)
    if not m:
        return None
    return [line.split("#")[0].strip() for line in m.group(1).splitlines() if line.split("#")[0].strip()]


def glob_regex(glob):
    out, i = [], 0
    while i < len(glob):
        if glob.startswith("**", i):
            out.append(".*")
            i += 2
        elif glob[i] == "*":
            out.append("[^/]*")
            i += 1
        elif glob[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(glob[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def argument_count(code, open_paren):
    """Top-level arguments of the call whose '(' is at open_paren; None when unbalanced."""
    depth, count, saw_any = 0, 1, False
    for j in range(open_paren, len(code)):
        c = code[j]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                return count if saw_any else 0
        elif c == "," and depth == 1:
            count += 1
        elif depth >= 1 and not c.isspace():
            saw_any = True
    return None


def calls(text):
    """(line, call text, enclosing function) of every Communicator-shaped call in `text`."""
    code = blank_comments_and_strings(text)
    spans = functions(text)
    found = []
    for m in CALL.finditer(code):
        name, suffix = m.group(1), m.group(2) or ""
        if name in ASYNC_ONLY and not suffix:
            continue
        if argument_count(code, m.end() - 1) not in ARITY[name]:
            continue
        line = code.count("\n", 0, m.start()) + 1
        owner = next((f for f, a, b in spans if a <= line <= b), "-")
        found.append((line, name + suffix, owner))
    return found


def main(argv):
    listing = "--list" in argv
    args = [a for a in argv[1:] if a != "--list"]
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.abspath(args[0]) if args else os.path.dirname(os.path.dirname(here))
    doc = os.path.join(root, "docs", "collectives.md")
    if not os.path.exists(doc):
        print(f"check_collectives: FAIL: {doc} is missing (it declares the communication files)", file=sys.stderr)
        return 1
    globs = declared_globs(doc)
    if not globs:
        print(f"check_collectives: FAIL: {doc} has no ```collective-files block of paths", file=sys.stderr)
        return 1
    patterns = [glob_regex(g) for g in globs]
    failures = []
    base = os.path.join(root, "src", "loom")
    for dirpath, _, names in sorted(os.walk(base)):
        for name in sorted(names):
            if not name.endswith(SUFFIXES):
                continue
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root).replace(os.sep, "/")
            with open(full, encoding="utf-8", errors="replace") as f:
                found = calls(f.read())
            declared = any(p.match(rel) for p in patterns)
            for line, call, owner in found:
                if listing:
                    print(f"{rel}:{line}: {call} in {owner}{'' if declared else '  (UNDECLARED)'}")
                if not declared:
                    failures.append(f"{rel}:{line}: calls Communicator::{call} (in {owner}) but the file is not "
                                    f"a declared communication file; list it in docs/collectives.md or move the call")
    for msg in failures:
        print(f"check_collectives: FAIL: {msg}", file=sys.stderr)
    if failures:
        print(f"check_collectives: {len(failures)} violation(s)", file=sys.stderr)
        return 1
    print("check_collectives: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
