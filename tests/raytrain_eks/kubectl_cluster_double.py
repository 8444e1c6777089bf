#!/usr/bin/env python3
"""A kubectl double for the reads `raytrain-eks verify` makes of an existing cluster.

- ``kubectl config view --minify -o json``: the current context's cluster (``context_cluster``
  of the state file), as ``aws eks update-kubeconfig`` names it (the cluster's ARN).
- ``kubectl get <kind> -A -o json [-l k=v,...]``: ``lists[kind]`` as kubectl prints a list
  (``{"apiVersion": "v1", "kind": "List", "items": [...]}``), filtered by an equality-based
  label selector as the API server filters it (every ``key=value`` must match:
  k8s.io/apimachinery pkg/labels/selector.go). A kind the state file lacks is answered as
  kubectl answers an unknown resource type ("the server doesn't have a resource type"), exit 1.
- ``forbidden``: every ``get`` is refused as by RBAC ("Error from server (Forbidden)"), exit 1.

State: the JSON file ``$FAKE_KUBECTL_STATE``; each call is appended to ``calls``.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    path = Path(os.environ["FAKE_KUBECTL_STATE"])
    state = json.loads(path.read_text())
    state.setdefault("calls", []).append(argv)
    path.write_text(json.dumps(state))
    if argv[:2] == ["config", "view"]:
        print(json.dumps({"contexts": [{"name": "team", "context": {"cluster": state["context_cluster"]}}]}))
        return 0
    if argv[:1] != ["get"]:
        print(f"error: unsupported by this double: {argv}", file=sys.stderr)
        return 1
    kind = argv[1]
    if state.get("forbidden"):
        print(f'Error from server (Forbidden): {kind} is forbidden: User "team-dev" cannot list resource '
              f'"{kind}" in API group "" at the cluster scope', file=sys.stderr)
        return 1
    if kind not in state["lists"]:
        print(f'error: the server doesn\'t have a resource type "{kind}"', file=sys.stderr)
        return 1
    items = state["lists"][kind]
    if "-l" in argv:
        wanted = dict(pair.split("=", 1) for pair in argv[argv.index("-l") + 1].split(","))
        items = [i for i in items if all((i["metadata"].get("labels") or {}).get(k) == v for k, v in wanted.items())]
    print(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
