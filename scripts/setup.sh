#!/usr/bin/env bash
# Sets up a fresh Debian machine (as root) for BunshinRL: system packages, then a virtualenv in .venv with the
# project and its test dependencies installed, then the declared workspace images built (docs/images.md). Safe to
# run again. It prints one line per step; the package managers' own output goes to .venv/setup.log (its tail is
# shown if a step fails).
#   ./scripts/setup.sh              the engine and its tests (no torch), and the image the main job's web shop uses
#   ./scripts/setup.sh --trainers   also the optional extra `trainers` (torch, verl, skyrl-gym, gymnasium, ray) the
#                                   adapters' tests need: torch==2.13.0 first, so pip keeps that CPU build
#   ./scripts/setup.sh --osworld    also OSWorld's own code (desktop-env 1.0.2 without its dependencies, then the
#                                   extra `osworld`: what its controllers, getters and metrics import; docs/osworld.md)
#   ./scripts/setup.sh --browsergym also BrowserGym (browsergym-core 0.14.3 without its dependencies, then the extra
#                                   `browsergym`), Debian's Chromium for its browser (docs/browsergym.md), and
#                                   libwebarena 0.0.4 for WebArena's task file (its data only; docs/webarena.md)
#   ./scripts/setup.sh --all-images every declared workspace image (the tests use each), not only the main job's
#   ./scripts/setup.sh --docker     also Debian's docker.io (dockerd is not started here: the tests start one when
#                                   none answers and stop it after them; docs/docker.md)
set -euo pipefail
cd "$(dirname "$0")/.."

TRAINERS=0
OSWORLD=0
BROWSERGYM=0
IMAGES=base
DOCKER=0
for arg in "$@"; do
  case "$arg" in
    --trainers) TRAINERS=1 ;;
    --osworld) OSWORLD=1 ;;
    --browsergym) BROWSERGYM=1 ;;
    --all-images) IMAGES=--all ;;
    --docker) DOCKER=1 ;;
    *) echo "setup.sh: unknown option $arg (known: --trainers, --osworld, --browsergym, --all-images, --docker)" >&2; exit 2 ;;
  esac
done
STEPS=$((4 + TRAINERS + OSWORLD + BROWSERGYM))
EXTRAS=test
[ "$TRAINERS" = 1 ] && EXTRAS=$EXTRAS,trainers

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
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)  # builds the workspace images from the Debian archive
# BrowserGym's browser is the user's, on this machine (the workspaces' own Chromium stands on their image)
[ "$BROWSERGYM" = 1 ] && [ ! -x /usr/lib/chromium/chromium ] && need+=(chromium)
# Docker's daemon (a docker CLI alone, installed by hand, is not enough: the tests talk to dockerd's socket)
[ "$DOCKER" = 1 ] && ! command -v dockerd >/dev/null && need+=(docker.io)
if [ ${#need[@]} -gt 0 ]; then
  say "[1/$STEPS] installing system packages: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt_log=$(mktemp /tmp/bunshin-setup-apt.XXXXXX)
  LOG=$apt_log
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}"; } >"$apt_log" 2>&1 || fail "apt-get install ${need[*]}"
  rm -f "$apt_log"
  LOG=""
else
  say "[1/$STEPS] system packages present (btrfs-progs, util-linux, iproute2, procps, mmdebstrap$([ "$DOCKER" = 1 ] && echo ', docker.io'))"
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  say "[2/$STEPS] creating the virtualenv .venv with $("$PY" --version 2>&1)"
  "$PY" -m venv .venv || fail "python3 -m venv .venv (Debian: apt-get install python3-venv)"
else
  say "[2/$STEPS] virtualenv .venv present"
fi

LOG=.venv/setup.log
say "[3/$STEPS] installing bunshin and its test dependencies into .venv (log: $LOG)"
{
  .venv/bin/python -m pip install --upgrade pip || echo "(pip could not upgrade itself; going on with the one there is)"
  .venv/bin/python -m pip install -e '.[test]'
} >"$LOG" 2>&1 || fail "pip install -e '.[test]'"
.venv/bin/python -c "import bunshin.envs, bunshin.engine, bunshin.policies" >>"$LOG" 2>&1 \
  || fail "the installed package does not import"
IMAGES_WHAT=$([ "$IMAGES" = base ] && echo "base, the main job's" || echo "every declared one")
STEP=4
if [ "$TRAINERS" = 1 ] || [ "$OSWORLD" = 1 ] || [ "$BROWSERGYM" = 1 ]; then
  # the images build (mostly the Debian archive's downloads and dpkg) while pip installs the extras (PyPI's)
  IMAGES_LOG=.venv/images.log
  say "[$STEP/$STEPS] building the workspace images ($IMAGES_WHAT) in the background (log: $IMAGES_LOG; bunshin images list)"
  .venv/bin/bunshin images build $IMAGES >"$IMAGES_LOG" 2>&1 &
  IMAGES_PID=$!
  stop_images() { kill "$IMAGES_PID" 2>/dev/null; wait "$IMAGES_PID" 2>/dev/null; }
  if [ "$TRAINERS" = 1 ]; then
    STEP=$((STEP + 1))
    say "[$STEP/$STEPS] installing the trainers extra: torch 2.13.0 (CPU), then verl, skyrl-gym, gymnasium, ray (log: $LOG; several minutes the first time)"
    {
      .venv/bin/python -m pip install 'torch==2.13.0' && .venv/bin/python -m pip install -e ".[$EXTRAS]"
    } >>"$LOG" 2>&1 || { stop_images; fail "pip install -e '.[$EXTRAS]'"; }
    if .venv/bin/python -m pip list 2>/dev/null | grep -qi '^nvidia-'; then
      stop_images
      fail "pip pulled CUDA packages (nvidia-*): torch must be the CPU build 2.13.0"
    fi
    .venv/bin/python -c "import torch, verl.experimental.agent_loop, skyrl_gym, gymnasium, ray.cluster_utils" >>"$LOG" 2>&1 \
      || { stop_images; fail "the trainers extra does not import"; }
  fi
  if [ "$OSWORLD" = 1 ]; then
    STEP=$((STEP + 1))
    EXTRAS=$EXTRAS,osworld
    say "[$STEP/$STEPS] installing OSWorld's desktop-env 1.0.2 without its dependencies, the easyocr shim, then the osworld extra (log: $LOG)"
    {
      .venv/bin/python -m pip install --no-deps 'desktop-env==1.0.2' ./envs/xdesktop/easyocr_shim \
        && .venv/bin/python -m pip install -e ".[$EXTRAS]"
    } >>"$LOG" 2>&1 || { stop_images; fail "pip install -e '.[$EXTRAS]'"; }
    .venv/bin/python -c "import desktop_env.controllers.python, desktop_env.controllers.setup, \
desktop_env.evaluators.getters, desktop_env.evaluators.metrics, desktop_env.desktop_env" >>"$LOG" 2>&1 \
      || { stop_images; fail "OSWorld's desktop_env does not import"; }
  fi
  if [ "$BROWSERGYM" = 1 ]; then
    STEP=$((STEP + 1))
    EXTRAS=$EXTRAS,browsergym
    say "[$STEP/$STEPS] installing BrowserGym's browsergym-core 0.14.3 and libwebarena 0.0.4 (WebArena's tasks) without their dependencies, then the browsergym extra (log: $LOG)"
    {
      .venv/bin/python -m pip install --no-deps 'browsergym-core==0.14.3' 'libwebarena==0.0.4' \
        && .venv/bin/python -m pip install -e ".[$EXTRAS]"
    } >>"$LOG" 2>&1 || { stop_images; fail "pip install -e '.[$EXTRAS]'"; }
    .venv/bin/python -c "import bunshin.engine.adapters.browsergym" >>"$LOG" 2>&1 \
      || { stop_images; fail "BrowserGym does not import"; }
  fi
  say "waiting for the workspace images"
  LOG=$IMAGES_LOG
  wait "$IMAGES_PID" || fail "bunshin images build $IMAGES"
  grep -E '^image [a-z-]+ +[a-z-]+-[0-9a-f]{16} ' "$IMAGES_LOG" | sed 's/^/setup.sh:   /'
else
  say "[$STEP/$STEPS] building the workspace images ($IMAGES_WHAT) that are not built yet (a minute or a few each the first time; bunshin images list)"
  .venv/bin/bunshin images build $IMAGES 2>&1 | sed -u 's/^/setup.sh:   /' || fail "bunshin images build $IMAGES"
fi
say "ready: .venv/bin/bunshin ($(.venv/bin/python -c 'import msgspec, uvloop; print("msgspec", msgspec.__version__, "uvloop", uvloop.__version__)'))"
