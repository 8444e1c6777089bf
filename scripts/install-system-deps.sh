#!/usr/bin/env bash
# Install the system packages the tests need, once. Idempotent: returns at once when they are
# already installed (called from `make install` and CI on every run).
#
#   docker-registry  Debian's build of the CNCF distribution registry (`registry` v2): a REAL
#                    OCI distribution server the `lock` command and the image watcher are tested
#                    against on 127.0.0.1 (tests/fixtures_pipeline.py starts it).
#   jq               the pipeline's Smoke step rewrites the RayJob with jq; a test runs that step.
set -euo pipefail

PACKAGES=(docker-registry jq)

missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done
if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "install-system-deps: need root (or sudo) to apt-get install ${missing[*]}" >&2
    exit 1
  fi
fi
echo "install-system-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# --no-install-recommends: the registry binary is all we need.

$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
# The package starts a system-wide registry on :5000 where an init system runs; the tests do not
# use it, so stop it if it came up (ignored where there is no systemd, e.g. containers).
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet docker-registry 2>/dev/null; then
  $SUDO systemctl stop docker-registry || true
  $SUDO systemctl disable docker-registry || true
fi
