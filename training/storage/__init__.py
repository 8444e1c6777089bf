"""The remote-storage room: every reader and writer of run data, inputs and checkpoints goes
through it. This module is the ONE description of where runs live (standard library only: charts/
and the CLI import it); :mod:`training.storage.files` is the one file-system factory, the one retry
policy and the reads, writes, listings and downloads over it, with the node-local download cache
(one download per node).

The storage of a job's runs is taken by the charts (the storage path every job gets), the job
config (its rules), the launcher (Ray Train's storage) and the CLI readers (a finished run's
records and model). The kind follows from the URI alone, so a job config's
``checkpoint.storage_path`` and the spec's storage say the same thing:

- ``s3://bucket/prefix``: an S3 bucket (the environment's, by default), through pyarrow's S3
  file system, which the factory points at ``AWS_ENDPOINT_URL`` when set;
- ``file:///path``: a SHARED file system mounted at that path on every Ray pod (FSx for Lustre,
  EFS, any PersistentVolumeClaim: ``storage.shared_path`` in environment.toml). Every node sees
  the same files, so a job may span nodes;
- a plain path: a directory of the machine the job runs on (tests, a single node): never shared.

Layout under it: ``<storage>/<run>/`` is one run (its record, metrics, logs, ``checkpoint_<step>/``
folders, the exported ``hf/``); ``<storage>/_inputs/<run>.json`` is what ``submit`` hands the run
(:func:`training.contract.run_inputs_uri`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

S3_SCHEME = "s3://"
SHARED_SCHEME = "file://"
"""RFC 8089's scheme: here, a path every pod of the job mounts (the spec's shared file system)."""


@dataclass(frozen=True, slots=True)
class RunStorage:
    """The storage of a job's runs, from its URI (see the module docstring for the kinds)."""
    uri: str

    @property
    def kind(self) -> str:
        """``s3``, ``shared`` or ``local``."""
        if self.uri.startswith(S3_SCHEME):
            return "s3"
        return "shared" if self.uri.startswith(SHARED_SCHEME) else "local"

    @property
    def shared(self) -> bool:
        """Whether every node of a job sees the same files (a job may span nodes)."""
        return self.kind != "local"

    @property
    def path(self) -> str:
        """Where the runs are on the file system that holds them: the bucket and prefix without
        the scheme (S3), or the absolute directory (shared, local)."""
        if self.kind == "s3":
            return self.uri[len(S3_SCHEME):].rstrip("/")
        return os.path.abspath(self.uri.removeprefix(SHARED_SCHEME))

    def run(self, name: str) -> str:
        """The run's directory: an ``s3://`` URI, or a path every process of the run can open."""
        return join(self.uri.rstrip("/") if self.kind == "s3" else self.path, name)


def storage_problem(uri: str) -> str | None:
    """Why ``uri`` cannot be a run storage (a job's ``checkpoint.storage_path``), or None."""
    if "://" in uri and not uri.startswith((S3_SCHEME, SHARED_SCHEME)):
        return "must be s3://bucket/prefix, file:///<path> of a shared file system or a directory"
    if uri.startswith(SHARED_SCHEME) and not uri[len(SHARED_SCHEME):].startswith("/"):
        return "must be file:///<absolute path> (file:// then a path starting with /)"
    return None


def join(uri: str, *parts: str) -> str:
    """``uri`` with ``parts`` appended, ``/``-separated (S3 keys and POSIX paths alike)."""
    return "/".join([uri.rstrip("/"), *parts])
