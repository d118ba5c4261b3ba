#!/usr/bin/env bash
# Runs a Python plotting script with a python that has matplotlib (Debian's python3-matplotlib,
# installed here if missing; plots are for docs only, not a build or CI dependency).
#   bash bench/with_matplotlib.sh bench/plot_metrics.py OUT.png TITLE KEYS LABEL=RUN ...
set -euo pipefail
py=python3
if ! "$py" -c "import matplotlib" 2>/dev/null; then
  py=/usr/bin/python3
  if ! "$py" -c "import matplotlib" 2>/dev/null; then
    sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get install -y -q python3-matplotlib >/dev/null ||
      { $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q python3-matplotlib >/dev/null; }
  fi
fi
exec "$py" "$@"
