#!/usr/bin/env bash
# `make demo`: the main job on the embedded local default, end to end (see raytrain_eks/demo.py).
# FAULT=1 kills one worker mid-run and shows the resume.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python -m raytrain_eks.demo --env "${ENV_FILE:-environment.toml}" ${FAULT:+$([ "$FAULT" != 0 ] && echo --fault)}
