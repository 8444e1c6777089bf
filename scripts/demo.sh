#!/usr/bin/env bash
# `make demo`: the main job on the embedded local default. Grows with the project; today:
# print the environment and synthesize what exists.
set -euo pipefail
cd "$(dirname "$0")/.."
ENV_FILE=${ENV_FILE:-environment.toml}
raytrain-eks summary --env "$ENV_FILE"
