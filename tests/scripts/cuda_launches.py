#!/usr/bin/env python3
"""Every kernel launch in the given CUDA objects or archives reaches device code.

nvcc compiles a <<<...>>> launch of a kernel instantiation that has no device code (its template
arguments differ between the host and the device pass: an output type taken from a __device__
function's deduced `auto` return type, say, which is void in host code) into a call of
cudaLaunchKernel with a null function, which fails only at run time, on a GPU, with
cudaErrorInvalidDeviceFunction. This finds such calls in the host code's disassembly: a call of
cudaLaunchKernel whose first argument (%rdi) was last set to zero.

usage: cuda_launches.py FILE...          exits 1 naming the function of each null launch
       cuda_launches.py --expect-null FILE  exits 0 only if FILE has one (the checker's own test)
"""
import re
import subprocess
import sys

FUNCTION = re.compile(r"^[0-9a-f]+ <(.+)>:$")
INSTRUCTION = re.compile(r"^\s*[0-9a-f]+:\s+(\S+)\s*(.*)$")
ZEROING = re.compile(r"^(xor %[er]di,%[er]di|mov \$0x0,%[er]di)$")
WRITES_RDI = re.compile(r",%[er]di$|^pop %rdi$")


def null_launches(path):
    """(function, address) of each cudaLaunchKernel call whose function argument is zero."""
    try:
        listing = subprocess.run(["objdump", "-dr", "--no-show-raw-insn", "-C", path], check=True,
                                 capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        sys.exit(f"cuda_launches: cannot disassemble {path}: {e}")
    found, function, rdi_zero = [], "?", False
    for line in listing.splitlines():
        head = FUNCTION.match(line)
        if head:
            function, rdi_zero = head.group(1), False
            continue
        if "R_X86_64_PLT32" in line and re.search(r"\scudaLaunchKernel-0x4$", line):
            if rdi_zero:
                found.append(function)
            continue
        ins = INSTRUCTION.match(line)
        if not ins:
            continue
        text = f"{ins.group(1)} {ins.group(2)}".strip()
        text = re.sub(r"\s+#.*$", "", re.sub(r"\s+", " ", text))
        if text.startswith("call"):
            continue  # the launch's own call; its argument was set before it
        if WRITES_RDI.search(text):
            rdi_zero = bool(ZEROING.match(text))
    return found


def main(argv):
    if len(argv) == 3 and argv[1] == "--expect-null":
        found = null_launches(argv[2])
        print(f"cuda_launches: the fixture {argv[2]}: {len(found)} null launch(es) found")
        return 0 if found else 1
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    bad = [(path, f) for path in argv[1:] for f in null_launches(path)]
    for path, function in bad:
        print(f"cuda_launches: {path}: {function} launches a kernel with no device code (a null function: the "
              "kernel's template arguments differ in host code; name its types explicitly)", file=sys.stderr)
    if not bad:
        print(f"cuda_launches: every launch in {len(argv) - 1} file(s) reaches device code")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
