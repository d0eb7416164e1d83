#!/usr/bin/env bash
# Install polyrl into ./.venv for a CPU machine.   usage: bash scripts/setup.sh [test]
#
# torch is pinned to the 2.13.0 CPU build here: an unpinned torch would pull a
# multi-GB CUDA build. On a GPU machine, install your own torch first and then
# `pip install -e .` instead of running this script.
set -euo pipefail
cd "$(dirname "$0")/.."

extras=""
if [ "${1:-}" = "test" ]; then extras="[test]"; fi

if [ ! -x .venv/bin/python ]; then python3 -m venv .venv; fi
.venv/bin/pip install --quiet --disable-pip-version-check "torch==2.13.0"
.venv/bin/pip install --quiet --disable-pip-version-check -e ".${extras}"

# Code rewards run untrusted programs under bubblewrap (Debian/Ubuntu package).
if ! command -v bwrap >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get install -y -qq bubblewrap >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq bubblewrap; }) \
      || echo "setup: could not install bubblewrap; code rewards will refuse to run" >&2
  else
    echo "setup: bubblewrap missing; install it with: sudo apt-get install bubblewrap" >&2
  fi
fi
# The rollout engine's fused decode kernels are compiled on first use; without a C
# compiler the engine still runs, on the model's own forward pass (about half the rollout
# speed on small models).
if ! command -v "${CC:-cc}" >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get install -y -qq gcc >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq gcc; }) \
      || echo "setup: could not install gcc; the engine will decode without its fused kernels" >&2
  else
    echo "setup: no C compiler; for the engine's fused kernels install one: sudo apt-get install gcc" >&2
  fi
fi
# The report tests open the HTML report in headless Chromium (Debian's `chromium`).
if [ "${1:-}" = "test" ] && ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get install -y -qq chromium >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq chromium; }) \
      || echo "setup: could not install chromium; the report's browser test will be skipped" >&2
  else
    echo "setup: chromium missing; for the report's browser test: sudo apt-get install chromium" >&2
  fi
fi
echo "setup: polyrl installed in .venv"
