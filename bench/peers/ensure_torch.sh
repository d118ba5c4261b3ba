# Sourced by the benchmarks whose peer is PyTorch: ensure_torch PYTHON installs Debian's
# python3-torch when PYTHON cannot import torch (the peers run on Debian's build, on demand).
ensure_torch() {
  "$1" -c 'import torch' 2>/dev/null && return 0
  echo "== torch missing for $1; installing Debian python3-torch" >&2
  if [ "$(id -u)" = 0 ]; then apt-get install -y python3-torch >&2
  else sudo apt-get install -y python3-torch >&2; fi
}
