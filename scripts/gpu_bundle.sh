#!/usr/bin/env bash
# Prepares the GPU tests to run on a machine that has a driver and CUDA but none of the build's
# Debian packages: builds test_cuda here (nvcc from /usr/local/cuda, sm_90a + compute_90 PTX) and
# copies it with the shared libraries it needs beyond the C/C++ system and driver libraries into
# .gpu-bundle/ (ignored by git), with run.sh, which runs the tests there:
#   here:  bash scripts/gpu_bundle.sh
#   there: bash .gpu-bundle/run.sh        (the folder travels with the tree; see docs/cuda.md)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DLOOM_CUDA=ON >/dev/null
cmake --build build -j"$(nproc)" --target test_cuda >/dev/null
bundle="$repo/.gpu-bundle"
rm -rf "$bundle"
mkdir -p "$bundle/lib"
cp build/test_cuda "$bundle/"
# Libraries outside glibc and the driver (which the GPU machine has) travel with the binary.
ldd build/test_cuda | awk '/=>/ {print $1, $3}' | while read -r name path; do
  case "$name" in
    libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libcuda.so*|libgcc_s.so*|libstdc++.so*) ;;
    *) cp -L "$path" "$bundle/lib/$name" ;;
  esac
done
cat > "$bundle/run.sh" <<'RUN'
#!/usr/bin/env bash
# Runs the GPU tests of this bundle (made by scripts/gpu_bundle.sh); the last lines are the summary.
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$here/test_cuda" "$@"
RUN
chmod +x "$bundle/run.sh"
du -sh "$bundle" | awk '{print "gpu bundle: " $1 " in .gpu-bundle/ (run there: bash .gpu-bundle/run.sh)"}'
