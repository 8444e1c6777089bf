"""Read a synthesized RayJob back: what the local demo submits, from the manifest itself.

The demo must run the RayJob's OWN entrypoint and runtime environment, not a copy; this reads
them from ``dist/rayjob-<job>.k8s.yaml`` (see charts.main for the file names). It imports only
PyYAML, so the demo does not pay for the cdk8s bindings.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


@dataclass(frozen=True, kw_only=True, slots=True)
class RayJobSubmission:
    """The parts of a RayJob that ``ray job submit`` needs."""
    name: str
    entrypoint: str
    """Exactly the manifest's ``spec.entrypoint`` (a shell command line)."""
    runtime_env_yaml: str
    """Exactly the manifest's ``spec.runtimeEnvYAML``."""
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def runtime_env(self) -> dict[str, Any]:
        return yaml.safe_load(self.runtime_env_yaml) or {}

    @property
    def working_dir(self) -> str:
        return self.runtime_env.get("working_dir", "")


def read_rayjob(manifest: str | Path) -> RayJobSubmission:
    """The one RayJob in ``manifest``; ValueError if there is none or more than one."""
    docs = [d for d in yaml.safe_load_all(Path(manifest).read_text(encoding="utf-8")) if d]
    jobs = [d for d in docs if d.get("kind") == "RayJob"]
    if len(jobs) != 1:
        raise ValueError(f"{manifest}: expected one RayJob, found {len(jobs)}")
    job = jobs[0]
    return RayJobSubmission(
        name=job["metadata"]["name"], entrypoint=job["spec"]["entrypoint"],
        runtime_env_yaml=job["spec"].get("runtimeEnvYAML", ""),
        labels=dict(job["metadata"].get("labels", {})))
