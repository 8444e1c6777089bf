"""The cluster tier's fixed costs (docs/testing.md): building the control plane and starting it.

- cold build: the seconds scripts/build-control-plane.sh wrote to .work/cluster-bin/build-times.txt
  for each part when it built it (``cache=cold``: with an empty Go build cache; a fresh clone
  pays these once, plus the module downloads they include);
- warm build: the script again with every binary present (what `make test` pays each time after);
- warm start: tests/cluster/plane.py's start (etcd, apiserver, controller-manager, scheduler,
  CRDs, the spec's KWOK nodes, kwok, KubeRay, Kueue and its webhooks), per component and in
  all, and its stop.

One JSON line; reported, never asserted (the machine is shared). Without the binaries it says
so: `make cluster-plane` builds them.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "cluster")]

from plane import BIN, BUILD_SCRIPT, Plane, PlaneError, spec  # noqa: E402


def cold_builds() -> list[dict]:
    path = BIN / "build-times.txt"
    rows = []
    for line in (path.read_text().splitlines() if path.exists() else []):
        when, name, version, took, cores, cache = line.split()
        rows.append({"part": name, "version": version, "seconds": int(took.rstrip("s")), "at": when,
                     "cores": cores.split("=")[1], "cache": cache.split("=")[1]})
    return rows


def main() -> None:
    out: dict = {"name": "cluster_plane", "builds": cold_builds()}
    start = time.perf_counter()
    proc = subprocess.run(["bash", str(BUILD_SCRIPT)], cwd=ROOT, capture_output=True, text=True)
    out["warm_build_s"] = round(time.perf_counter() - start, 1)
    if proc.returncode != 0:
        out["error"] = f"build-control-plane.sh exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}"
        print(json.dumps(out))
        return
    env = spec()
    with tempfile.TemporaryDirectory(prefix="bench-plane-") as tmp:
        plane = Plane(workdir=Path(tmp), cluster_name=env.cluster.eks_name)
        start = time.perf_counter()
        try:
            plane.start(env)
            out["warm_start_s"] = round(time.perf_counter() - start, 1)
            out["components_s"] = {k: round(v, 1) for k, v in plane.started_s.items()}
            out["nodes"] = len(plane.get("nodes")["items"])
        except PlaneError as err:
            out["error"] = str(err)
        finally:
            start = time.perf_counter()
            plane.stop()
            out["stop_s"] = round(time.perf_counter() - start, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
