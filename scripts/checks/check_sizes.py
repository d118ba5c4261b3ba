#!/usr/bin/env python3
"""Fails when a source file under src/ is over 600 lines or a function over 80 lines, unless
scripts/checks/sizes_allowlist.txt lists it with a reason.

Usage: check_sizes.py [ROOT]   (ROOT: the tree to check, default the repository)

Functions are found by matching braces with comments, strings and preprocessor lines skipped:
a brace block at namespace or class scope whose header has a parameter list is a function; its
length is the number of lines from the line of its opening brace's header to its closing brace.
Allowlist lines: `file PATH REASON...` or `function PATH NAME REASON...` (NAME as reported).
"""
import os
import re
import sys

MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80
SOURCE_SUFFIXES = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh")


def blank_comments_and_strings(text):
    """The text with comments, string and char literals replaced by spaces (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            if not m:
                out.append(c)
                i += 1
                continue
            end = text.find(")" + m.group(1) + '"', i)
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum() and (i + 1 < n and text[i + 1].isalnum()):
                out.append(" ")  # digit separator: 1'000'000
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(" " * (j - i))
            i = j
        else:
            out.append(c)
            i += 1
    code = "".join(out)
    # Preprocessor lines (with continuations) carry no braces that matter.
    lines = code.split("\n")
    cont = False
    for k, line in enumerate(lines):
        if cont or line.lstrip().startswith("#"):
            cont = line.rstrip().endswith("\\")
            lines[k] = ""
    return "\n".join(lines)


SCOPE_WORDS = re.compile(r"^\s*(template\s*<.*>\s*)?(namespace|extern|class|struct|union|enum)\b", re.S)


def functions(text):
    """(name, first_line, last_line) of every function body at namespace or class scope."""
    code = blank_comments_and_strings(text)
    found = []
    stack = []  # kinds: "scope" (namespace/class/extern), "function", "other"
    header_start = 0
    line = 1
    for i, c in enumerate(code):
        if c == "\n":
            line += 1
        elif c == "{":
            header = code[header_start:i]
            inside_function = any(k[0] in ("function", "other") for k in stack)
            stripped = header.strip()
            if inside_function:
                kind = ("other", None, None)
            elif SCOPE_WORDS.match(stripped) and not re.search(r"\)\s*(const|noexcept|override|final|\s)*$", stripped):
                kind = ("scope", None, None)
            elif "(" in stripped and not stripped.endswith("=") and not stripped.endswith(","):
                name = re.findall(r"([~\w:<>]+(?:operator\s*\S+?)?)\s*\(", stripped)
                # the header's first non-blank line
                lead = len(header) - len(header.lstrip())
                first = line - header[lead:].count("\n")
                kind = ("function", name[0] if name else "?", first)
            else:
                kind = ("other", None, None)
            stack.append(kind)
            header_start = i + 1
        elif c == "}":
            if stack:
                kind, name, first = stack.pop()
                if kind == "function":
                    found.append((name, first, line))
            header_start = i + 1
        elif c == ";":
            header_start = i + 1
        elif c == ":" and i > 0 and code[i - 1] != ":" and (i + 1 < len(code) and code[i + 1] != ":"):
            # `public:` / `private:` / `case x:` end a header; a ctor's `) :` init list does not.
            before = code[header_start:i].strip()
            if re.fullmatch(r"(public|private|protected)", before):
                header_start = i + 1
    return found


def load_allowlist(path):
    files, funcs, problems = {}, {}, []
    if not os.path.exists(path):
        return files, funcs, problems
    with open(path, encoding="utf-8") as f:
        for number, raw in enumerate(f, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split()
            if parts[0] == "file" and len(parts) >= 3:
                files[parts[1]] = " ".join(parts[2:])
            elif parts[0] == "function" and len(parts) >= 4:
                funcs[(parts[1], parts[2])] = " ".join(parts[3:])
            else:
                problems.append(f"{path}:{number}: expected `file PATH REASON` or `function PATH NAME REASON`, got: {line}")
    return files, funcs, problems


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.abspath(argv[1]) if len(argv) > 1 else os.path.dirname(os.path.dirname(here))
    allow_files, allow_funcs, problems = load_allowlist(os.path.join(root, "scripts/checks/sizes_allowlist.txt"))
    violations, allowed = [], []
    src = os.path.join(root, "src")
    for dirpath, _, names in sorted(os.walk(src)):
        for name in sorted(names):
            if not name.endswith(SOURCE_SUFFIXES):
                continue
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root)
            with open(full, encoding="utf-8", errors="replace") as f:
                text = f.read()
            count = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
            if count > MAX_FILE_LINES:
                msg = f"{rel}: {count} lines (limit {MAX_FILE_LINES})"
                (allowed if rel in allow_files else violations).append(msg)
            for fname, first, last in functions(text):
                length = last - first + 1
                if length > MAX_FUNCTION_LINES:
                    msg = f"{rel}:{first}: function {fname} is {length} lines (limit {MAX_FUNCTION_LINES})"
                    ok = (rel, fname) in allow_funcs or rel in allow_files
                    (allowed if ok else violations).append(msg)
    for msg in allowed:
        print(f"check_sizes: allowed: {msg}")
    for msg in problems:
        print(f"check_sizes: {msg}", file=sys.stderr)
    for msg in violations:
        print(f"check_sizes: FAIL: {msg}; split it, or list it with a reason in scripts/checks/sizes_allowlist.txt",
              file=sys.stderr)
    if violations or problems:
        print(f"check_sizes: {len(violations)} violation(s)", file=sys.stderr)
        return 1
    print("check_sizes: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
