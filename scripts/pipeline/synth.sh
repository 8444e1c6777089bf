#!/usr/bin/env bash
# The Synth stage's digest handling and manifests (buildspec: infra/stacks/pipeline_builds.py).
# Pins the digest this run deploys (one source of truth: raytrain_eks/pipeline/synth.py) into
# $ENV_FILE with the same `lock --digest` an operator runs, synthesizes dist/, and re-synthesizes
# the promoted digest's manifests into dist/promoted/ (the rollback target for a promotion made
# before Apply recorded its manifest). dist/pipeline-run.json keeps the digest and the promoted
# digest this choice saw (Apply and Promote compare-and-swap on it). Prints the digest last.
set -euo pipefail
ENV_FILE="${ENV_FILE:-environment.toml}"
PYTHON="${PYTHON:-python}"
mkdir -p dist
digest="$("$PYTHON" -m raytrain_eks.pipeline --env "$ENV_FILE" choose-digest --requested "${IMAGE_DIGEST:-spec}" \
  --run-file dist/pipeline-run.json)"
"$PYTHON" -m raytrain_eks.cli lock --env "$ENV_FILE" --digest "$digest" >&2
promoted="$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["promoted_at_synth"])' dist/pipeline-run.json)"
rm -rf dist/promoted
synths=(--env "$ENV_FILE" --outdir dist)
if [ -n "$promoted" ] && [ "$promoted" != "$digest" ]; then
  mkdir -p .work
  cp "$ENV_FILE" .work/promoted-environment.toml
  "$PYTHON" -m raytrain_eks.cli lock --env .work/promoted-environment.toml --digest "$promoted" >&2
  synths+=(--env .work/promoted-environment.toml --outdir dist/promoted)
fi
# both syntheses in one process: the jsii runtime and the bindings load once (charts/main.py)
"$PYTHON" -m charts.main "${synths[@]}" >&2
echo "$digest"
