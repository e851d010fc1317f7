#!/usr/bin/env bash
# Sets up a fresh Debian machine (as root) for BunshinRL: system packages, then a virtualenv in .venv with the
# project and its test dependencies installed. Safe to run again. It prints one line per step; the package
# managers' own output goes to .venv/setup.log (its tail is shown if a step fails).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "setup.sh: $*"; }
LOG=""
fail() {
  say "FAILED: $1"
  if [ -n "$LOG" ] && [ -f "$LOG" ]; then
    say "last lines of $LOG:"
    tail -n 30 "$LOG" >&2
  fi
  exit 1
}

if [ "$(id -u)" != 0 ]; then
  say "run as root (workspaces need namespaces, mounts and cgroups)" >&2
  exit 1
fi

need=()
command -v mkfs.btrfs >/dev/null || need+=(btrfs-progs)
command -v unshare >/dev/null || need+=(util-linux)
command -v ip >/dev/null || need+=(iproute2)
command -v ps >/dev/null || need+=(procps)
if [ ${#need[@]} -gt 0 ]; then
  say "[1/3] installing system packages: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt_log=$(mktemp /tmp/bunshin-setup-apt.XXXXXX)
  LOG=$apt_log
  { apt-get update -qq && apt-get install -y -qq "${need[@]}"; } >"$apt_log" 2>&1 || fail "apt-get install ${need[*]}"
  rm -f "$apt_log"
  LOG=""
else
  say "[1/3] system packages present (btrfs-progs, util-linux, iproute2, procps)"
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  say "[2/3] creating the virtualenv .venv with $("$PY" --version 2>&1)"
  "$PY" -m venv .venv || fail "python3 -m venv .venv (Debian: apt-get install python3-venv)"
else
  say "[2/3] virtualenv .venv present"
fi

LOG=.venv/setup.log
say "[3/3] installing bunshin and its test dependencies into .venv (log: $LOG)"
{
  .venv/bin/python -m pip install --upgrade pip || echo "(pip could not upgrade itself; going on with the one there is)"
  .venv/bin/python -m pip install -e '.[test]'
} >"$LOG" 2>&1 || fail "pip install -e '.[test]'"
.venv/bin/python -c "import bunshin.envs, bunshin.engine, bunshin.policies" >>"$LOG" 2>&1 \
  || fail "the installed package does not import"
say "ready: .venv/bin/bunshin ($(.venv/bin/python -c 'import msgspec, uvloop; print("msgspec", msgspec.__version__, "uvloop", uvloop.__version__)'))"
