"""How the world size travels from ``environment.toml`` to Ray Train's ``ScalingConfig``.

Measures, on the tree it runs in (``--tree DIR`` for another checkout, e.g. the commit before a
change), for the shipped ``smoke`` job (a GPU job sized by the spec):

- ``job_file_parses``: how often the job file is read and parsed (``read_toml``) by the charts'
  sizing (``charts.jobs.plan_job``) plus once more by the job's own entry point as the RayJob
  runs it (``python -m training <the planned entrypoint's arguments> --check``);
- ``size_as_set_text``: ``--set`` items of the planned entrypoint that carry the size as text
  for the job to parse back (``parallel.num_workers``, ``workers_per_node``, ``use_gpu``);
- ``files_naming_it``: product files (environment/, charts/, raytrain_eks/, training/,
  devtools/) that name it (``num_workers``, ``world_size`` or ``workers_per_node``).

Prints ONE JSON object on its last line. Counts of code, not timings: reported, never asserted.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

PACKAGES = ("environment", "charts", "raytrain_eks", "training", "devtools")
NAMES = re.compile(r"\b(num_workers|world_size|workers_per_node)\b")
SIZE_KEYS = ("parallel.num_workers=", "parallel.workers_per_node=", "parallel.use_gpu=")

PROBE = r"""
import contextlib, json, shlex, sys
from pathlib import Path
root = Path.cwd()
sys.path.insert(0, str(root))
import training.config as config
calls = []
real = config.read_toml
def counting(path, *a, **k):
    calls.append(str(path))
    return real(path, *a, **k)
config.read_toml = counting
from charts.jobs import plan_job
from environment import load_environment
env = load_environment(root / "environment.toml")
plan = plan_job(env, root / "jobs" / "smoke.toml", root, config_path="jobs/smoke.toml")
charts = len(calls)
import training.__main__ as entry
argv = shlex.split(plan.entrypoint)[3:]
with contextlib.redirect_stdout(sys.stderr):
    code = entry.main([*argv, "--check"])
print(json.dumps({"charts": charts, "entry": len(calls) - charts, "entry_rc": code,
                  "world_size": plan.config.parallel.num_workers, "entrypoint": plan.entrypoint}))
"""


def static_counts(tree: Path) -> dict:
    naming = [path.relative_to(tree).as_posix() for package in PACKAGES for path in sorted((tree / package).rglob("*.py"))
              if "imports" not in path.parts and NAMES.search(path.read_text(encoding="utf-8"))]
    return {"files_naming_it": len(naming)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", default=str(Path(__file__).resolve().parents[1]))
    args = parser.parse_args(argv)
    tree = Path(args.tree).resolve()
    probe = subprocess.run([sys.executable, "-c", PROBE], cwd=tree, capture_output=True, text=True)
    if probe.returncode:
        print(probe.stderr, file=sys.stderr)
        return 1
    parses = json.loads(probe.stdout.strip().splitlines()[-1])
    result = {"name": "world_size_path", "tree": str(tree), "job_file_parses": parses["charts"] + parses["entry"],
              "parses_by_step": {"charts.jobs.plan_job": parses["charts"], "python -m training": parses["entry"]},
              "entry_check_rc": parses["entry_rc"], "smoke_world_size": parses["world_size"],
              "smoke_entrypoint": parses["entrypoint"],
              "size_as_set_text": sum(item.startswith(SIZE_KEYS) for item in shlex.split(parses["entrypoint"])),
              **static_counts(tree)}
    with contextlib.suppress(BrokenPipeError):
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
