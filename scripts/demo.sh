#!/usr/bin/env bash
# `make demo`: the main job on the embedded local default, end to end (see devtools/demo.py).
# FAULT=1 kills one worker from outside mid-run (SIGKILL, once a checkpoint is registered) and shows the resume.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python -m devtools.demo --env "${ENV_FILE:-environment.toml}" ${FAULT:+$([ "$FAULT" != 0 ] && echo --fault)}
