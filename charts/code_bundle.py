"""The training code as ONE content-addressed zip: how the job's code reaches the pods.

Choice: ``training/``, ``jobs/`` and ``spec_schema/`` (the job config's parser) are packed into ``training-<sha256[:16]>.zip`` during synth
(``dist/code/``), uploaded to ``s3://<bucket>/code/``, and every RayJob names it in its
``runtimeEnvYAML`` as ``working_dir: s3://<bucket>/code/training-<hash>.zip``.

Why this and not the alternatives:

- **No custom image.** The AWS Ray Train DLC is used unmodified, pinned by digest; baking our code
  into a derived image would mean a registry, an image build per code change and a second digest
  to track.
- **No run-time pip.** Ray downloads a remote ``working_dir`` zip itself (its runtime-env agent
  on every node, with boto3 + smart_open, which ``ray[default]`` ships) and unpacks it as the
  job's working directory on the driver and on every worker, before any of our code runs.
  ``py_modules``/``pip`` are not used: nothing is installed and nothing is resolved at run time.
- **Content-addressed name.** Ray caches ``working_dir`` packages by URI on each node, so a
  changed package under an old name could run stale code; a name derived from the content can
  never be stale, and re-uploading an unchanged tree is a no-op. The hash is also a label on
  every manifest, so ``kubectl get rayjob -L raytrain.io/code-hash`` says which code ran.
- **Not a ConfigMap.** ConfigMaps are capped at 1 MiB and the tokenizer alone is larger; a
  ConfigMap also needs a volume on every pod and a PYTHONPATH change, and it changes the pod
  templates whenever the code changes.
- **Same artifact locally.** The local demo uploads this very zip to an S3-compatible server
  on 127.0.0.1 and submits the RayJob's own ``runtimeEnvYAML``.

The hash covers the tree, not the zip bytes: sha256 over the sorted ``(path, sha256(content))``
list, so a different zlib cannot change the name of identical code. The zip itself is also
deterministic (sorted entries, fixed timestamps and modes, no ``__pycache__``).

The zip holds several top-level folders (:data:`training.contract.CODE_DIRS`): Ray strips a single
top-level folder from remote zips, and with more it keeps the layout, so the unpacked working directory is
the repository root as far as the job is concerned (``python -m training --config jobs/x.toml``).
"""
from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

from environment.contract import CODE_PREFIX
from training import contract

BUNDLED_DIRS = contract.CODE_DIRS
"""Folders of the repository that travel to the pods."""
_FIXED_TIME = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip can hold
_LEVEL = 6
"""zlib's default level. Every synth builds the archive; on this tree (the 18 MB tokenizer is
most of it) level 9 takes 5 times as long for an archive 3% smaller (bench/bench_code_bundle.py)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CodeBundle:
    """A built archive."""
    path: Path
    """The zip on this machine (``dist/code/training-<hash>.zip``)."""
    content_hash: str
    """First 16 hex of the tree hash (also the ``raytrain.io/code-hash`` label)."""
    files: int

    @property
    def name(self) -> str:
        return self.path.name

    def key(self) -> str:
        """S3 key of the archive in the bucket."""
        return f"{CODE_PREFIX}/{self.name}"

    def uri(self, bucket: str) -> str:
        """What ``working_dir`` names."""
        return f"s3://{bucket}/{self.key()}"


BUILT_ASSETS = ("training/assets/qwen2.5-tokenizer/",)
"""Ignored by git yet part of the code: what ``make`` builds into the tree (the offline tokenizer)."""


def bundle_files(root: Path, jobs: Path | None = None) -> list[tuple[str, Path]]:
    """``(archive name, file)`` of every file that travels (:func:`training.contract.code_files`:
    no hidden file, no symbolic link); ``jobs`` (default ``root/jobs``) travels as ``jobs/``.

    In a git work tree only what git tracks travels, plus :data:`BUILT_ASSETS`: a stray file left
    in ``training/`` or ``jobs/`` (notes, a key, a scratch script) would otherwise reach every pod
    and the bucket. Outside a work tree (an unpacked release) every file travels."""
    files = contract.code_files(root, BUNDLED_DIRS, jobs)
    tracked = tracked_files(root)
    if tracked is None:
        return files
    return [(name, path) for name, path in files if _travels(path, root, tracked)]


def tracked_files(root: Path) -> set[str] | None:
    """The paths git tracks under ``root`` (relative, ``/``-separated), or None outside a work tree."""
    import subprocess

    try:
        proc = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--full-name"],
                              capture_output=True, check=False, timeout=60)
        top = subprocess.run(["git", "-C", str(root), "rev-parse", "--show-toplevel"],
                             capture_output=True, text=True, check=False, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0 or top.returncode != 0 or Path(top.stdout.strip()).resolve() != root.resolve():
        return None
    return {name for name in proc.stdout.decode().split("\0") if name}


def _travels(path: Path, root: Path, tracked: set[str]) -> bool:
    if not path.resolve().is_relative_to(root.resolve()):
        return True  # a jobs folder from elsewhere (the chart tests' fixture copies): all of it
    relative = path.resolve().relative_to(root.resolve()).as_posix()
    return relative in tracked or relative.startswith(BUILT_ASSETS)


def build_code_bundle(root: str | Path, outdir: str | Path, jobs: str | Path | None = None) -> CodeBundle:
    """Write ``<outdir>/training-<hash>.zip`` (unless an identical one is there) and describe it."""
    root = Path(root).resolve()
    files = bundle_files(root, Path(jobs).resolve() if jobs is not None else None)
    content_hash = contract.tree_hash(files)  # the same hash the job recomputes from what ran
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    target = outdir / f"training-{content_hash}.zip"
    if not target.exists():
        partial = target.with_suffix(".zip.partial")
        with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=_LEVEL) as zf:
            for name, path in files:
                info = zipfile.ZipInfo(name, date_time=_FIXED_TIME)
                info.external_attr = 0o644 << 16  # one mode for all: the umask must not matter
                info.compress_type = zipfile.ZIP_DEFLATED
                zf.writestr(info, path.read_bytes(), compresslevel=_LEVEL)
        partial.replace(target)  # never leave a half-written archive under the final name
    return CodeBundle(path=target, content_hash=content_hash, files=len(files))
