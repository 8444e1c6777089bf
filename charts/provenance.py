"""Labels and annotations that say what a manifest was built from.

Every RayCluster and RayJob carries, on its OWN metadata, the spec's hash and the image; every
RayJob also the code archive's hash and the job config's hash, so ``kubectl get rayjob -L
raytrain.io/code-hash`` answers "which code, which config, which image ran". Hashes are labels
(selectable, 16 hex fit the 63-character limit); the digest and URIs are annotations (a
``sha256:...`` digest is not a valid label value).

Pod templates carry none of it (:data:`POD_TEMPLATE_LABELS` only): KubeRay's Recreate upgrade
hashes the whole RayCluster spec, templates' labels and annotations included, but not the
object's metadata (ray-operator/controllers/ray/utils/util.go,
``GenerateHashWithoutReplicasAndWorkersToDelete``), so a spec-wide hash in a template would
delete the long-lived cluster's pods on an edit of ``[prices]``.
"""
from __future__ import annotations

import base64
import subprocess
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from environment import Environment, UnlockedImageWarning
from environment.contract import PART_OF
from environment.image_source import pull_reference
from environment.contract import (
    CODE_HASH_LABEL, CODE_URI_ANNOTATION, IMAGE_ANNOTATION, IMAGE_DIGEST_ANNOTATION, IMAGE_LOCKED_LABEL,
    GIT_COMMIT_LABEL, GIT_DIRTY_LABEL, JOB_CONFIG_ANNOTATION, JOB_CONFIG_HASH_LABEL, JOB_LABEL, SPEC_HASH_LABEL,
    UNLOCKED,
)
from training import contract



POD_TEMPLATE_LABELS = dict(PART_OF)
"""The only provenance on a pod template: constant, so it never changes the Recreate hash."""


def image_reference(env: Environment) -> str:
    """The pull reference (:func:`environment.image_source.pull_reference`: the cache's
    repository when ``image.pull_through_cache``) ``@sha256:...``, or ``:tag`` for an unlocked
    spec (the warning is the caller's to show once, see charts.main; here it would repeat for
    every pod template)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnlockedImageWarning)
        return pull_reference(env)


@dataclass(frozen=True, kw_only=True, slots=True)
class SourceIdentity:
    """The tree the manifests are synthesized from, captured at synth and carried to the pods
    (RayJob labels + the job's environment): ``git_commit`` is empty outside a git checkout;
    ``dirty`` means uncommitted changes under :data:`training.contract.SOURCE_PATHS` (edits
    elsewhere, e.g. the README, cannot change a run)."""
    git_commit: str = ""
    dirty: bool = False
    source_hash: str = ""
    spec_text: str = ""

    @classmethod
    def capture(cls, root: Path, spec_text: str = "", jobs: Path | None = None) -> "SourceIdentity":
        """``jobs``: the folder packed as the archive's ``jobs/`` (default ``root/jobs``); it
        replaces ``root/jobs`` in the source hash and, where it lies in the checkout, in the
        dirty check."""
        def git(*args: str) -> str:
            try:
                out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=60)
            except (OSError, subprocess.SubprocessError):
                return ""
            return out.stdout.strip() if out.returncode == 0 else ""

        commit = git("rev-parse", "--verify", "HEAD")
        paths = list(contract.SOURCE_PATHS)
        if jobs is not None:
            paths.remove(contract.JOBS_DIR)
            if jobs.resolve().is_relative_to(root.resolve()):
                paths.append(jobs.resolve().relative_to(root.resolve()).as_posix())
        changes = git("status", "--porcelain", "--", *paths) if commit else ""
        return cls(git_commit=commit, dirty=bool(changes), spec_text=spec_text,
                   source_hash=contract.tree_hash(contract.source_files(root, jobs)))

    def env_vars(self) -> dict[str, str]:
        """What the job's runtime environment carries (run.json ``source`` and ``environment_spec``)."""
        return {contract.ENV_GIT_COMMIT: self.git_commit, contract.ENV_GIT_DIRTY: "true" if self.dirty else "false",
                contract.ENV_SOURCE_HASH: self.source_hash,
                contract.ENV_SPEC_TEXT: base64.b64encode(self.spec_text.encode()).decode()}

    def labels(self) -> dict[str, str]:
        return {GIT_COMMIT_LABEL: self.git_commit or "none", GIT_DIRTY_LABEL: "true" if self.dirty else "false"}


@dataclass(frozen=True, kw_only=True, slots=True)
class Provenance:
    """What one object was built from."""
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)

    @classmethod
    def for_cluster(cls, env: Environment) -> "Provenance":
        return cls(
            labels={
                **POD_TEMPLATE_LABELS,
                "app.kubernetes.io/managed-by": "cdk8s",
                SPEC_HASH_LABEL: env.spec_hash,
                IMAGE_LOCKED_LABEL: "true" if env.image.locked else "false",
            },
            annotations={
                IMAGE_ANNOTATION: image_reference(env),
                IMAGE_DIGEST_ANNOTATION: env.image.digest or UNLOCKED,
            },
        )

    def for_job(self, *, job: str, code_hash: str, code_uri: str, config_hash: str,
                config_path: str, source: SourceIdentity | None = None) -> "Provenance":
        """This provenance plus the job's code, config and source tree."""
        return Provenance(
            labels={**self.labels, JOB_LABEL: job, CODE_HASH_LABEL: code_hash, JOB_CONFIG_HASH_LABEL: config_hash,
                    **(source.labels() if source else {})},
            annotations={**self.annotations, CODE_URI_ANNOTATION: code_uri, JOB_CONFIG_ANNOTATION: config_path},
        )
