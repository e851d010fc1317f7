#!/usr/bin/env bash
# Sets up a fresh Debian machine (as root) for BunshinRL: system packages, then a virtualenv in .venv with the
# project and its test dependencies installed. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
  echo "setup.sh: run as root (workspaces need namespaces, mounts and cgroups)" >&2
  exit 1
fi

need=()
command -v mkfs.btrfs >/dev/null || need+=(btrfs-progs)
command -v unshare >/dev/null || need+=(util-linux)
command -v ip >/dev/null || need+=(iproute2)
command -v ps >/dev/null || need+=(procps)
if [ ${#need[@]} -gt 0 ]; then
  echo "setup.sh: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install -q -e '.[test]' 2>&1 | grep -v -e '^WARNING: Location' || true
.venv/bin/python -c "import bunshin.envs, bunshin.engine" || { echo "setup.sh: install failed" >&2; exit 1; }
echo "setup.sh: ready (.venv/bin/bunshin)"
