"""Re-create a run's manifests from its run.json alone and say whether they are byte-identical.

The record holds what the RayJob carried (training/run_record.py): the git commit and dirty flag
of the synth tree, the environment spec's full text, the manifest's name and hash. This module:

1. takes that commit's tree: this checkout when HEAD is the commit, else a temporary
   ``git worktree`` of it (files git ignores but the archive needs, e.g. the built tokenizer,
   are copied from this checkout and listed);
2. writes the recorded spec text to a file and runs THAT tree's ``python -m charts.main``;
3. hashes the re-synthesized manifest with :func:`training.contract.manifest_hash` (the function
   the charts used) and compares it with the recorded hash: equal means byte-identical;
4. otherwise names each difference between the new manifest and the record (image, code, spec,
   job config, commit, dirty flag, source hash, entrypoint).

Reproducibility levels (declared in the record, verified here):
``infrastructure`` (same manifests and a pinned image) is verified by a byte-identical manifest;
``execution`` (same data order and seeds) and ``result`` (bit-identical losses) need a second run:
``--against RUN2`` compares the two records' pins and their metrics.

The command (``add_arguments`` and ``run``, at the end of this module): `raytrain-eks reproduce RUN_DIR [--against RUN_DIR_2]`: re-create a run's manifests from its
record and show they are byte-identical, or name each difference.

RUN_DIR is a run directory (local or s3://) holding run.json. The recorded commit is checked out
in a temporary git worktree when this checkout is elsewhere. With ``--against`` a second run of
the same job is compared too: same pins (seeds, data content, config) verify ``execution``,
bit-identical losses ``result``.

Exit codes: 0 byte-identical, 1 differences found, 2 the record cannot be re-synthesized.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training import contract
from training.storage.files import read_json

REPO = Path(__file__).resolve().parents[2]


class ReproduceError(ValueError):
    """The record lacks what a re-synthesis needs, or the commit is not here (one line)."""


@dataclass(kw_only=True)
class Outcome:
    identical: bool
    manifest: str
    recorded_hash: str
    new_hash: str
    tree: str
    differences: list[tuple[str, Any, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    verified: str = "none"
    applied_overrides: list[str] = field(default_factory=list)
    """Entrypoint arguments the applied RayJob carried beyond the synthesized manifest (the
    pipeline's smoke step appends ``--set checkpoint.run_name=...``): what ran is the manifest
    plus these."""


def applied_overrides(record: dict, manifest: dict) -> list[str]:
    """The arguments the run's command line (run.json ``command``) carries after the manifest's
    own entrypoint arguments: an override added when the manifest was applied, not synthesized."""
    argv = list(record.get("command") or [])
    recorded = argv[argv.index("training") + 1:] if "training" in argv else argv
    synthesized = shlex.split(manifest["spec"]["entrypoint"])[3:]
    if recorded[:len(synthesized)] != synthesized:
        return []
    return recorded[len(synthesized):]


def _git(root: Path, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
    if out.returncode:
        raise ReproduceError(f"git {' '.join(args)}: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else 'failed'}")
    return out.stdout.strip()


def _needs(record: dict, run: str) -> tuple[str, str, str, str]:
    source = record.get("source") or {}
    spec = (record.get("environment_spec") or {}).get("text")
    missing = [name for name, ok in (("source.git_commit", isinstance(source.get("git_commit"), str)),
                                     ("environment_spec.text", isinstance(spec, str)),
                                     ("manifest_name", bool(record.get("manifest_name"))),
                                     ("manifest_hash", bool(record.get("manifest_hash")))) if not ok]
    if missing:
        raise ReproduceError(f"{run}/run.json: {', '.join(missing)} missing: the run was not started from a "
                             "synthesized manifest (a plain local run), so there is nothing to re-create")
    return source["git_commit"], spec, record["manifest_name"], record["manifest_hash"]


def _ignored_inputs(root: Path) -> list[str]:
    """Files under SOURCE_PATHS that git ignores but that travel (the built tokenizer)."""
    listed = _git(root, "ls-files", "--others", "--ignored", "--exclude-standard", "--", *contract.SOURCE_PATHS)
    return [p for p in listed.splitlines() if p and "__pycache__" not in p and not p.endswith((".pyc", ".pyo"))]


def _tree_for(commit: str, repo: Path, work: Path, notes: list[str]) -> tuple[Path, bool]:
    """The tree to synthesize from, and whether it is a temporary worktree."""
    if _git(repo, "rev-parse", "HEAD") == commit:
        if _git(repo, "status", "--porcelain", "--", *contract.SOURCE_PATHS):
            notes.append("this checkout is at the recorded commit but has uncommitted changes: they take part")
        return repo, False
    try:
        _git(repo, "cat-file", "-e", f"{commit}^{{commit}}")
    except ReproduceError:
        raise ReproduceError(f"commit {commit} is not in {repo} (git fetch it first)") from None
    tree = work / "tree"
    _git(repo, "worktree", "add", "--detach", "--quiet", str(tree), commit)
    copied = _ignored_inputs(repo)
    for rel in copied:
        target = tree / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / rel, target)
    notes.append(f"checked out {commit[:12]} in a temporary worktree"
                 + (f"; copied {len(copied)} git-ignored input file(s) from this checkout "
                    f"({', '.join(sorted({str(Path(p).parent) for p in copied})[:3])})" if copied else ""))
    return tree, True


def _synth(tree: Path, spec_text: str, work: Path) -> Path:
    spec = work / "environment.toml"
    spec.write_text(spec_text, encoding="utf-8")
    outdir = work / "dist"
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-m", "charts.main", "--env", str(spec), "--outdir", str(outdir),
                          "--root", str(tree)], cwd=tree, env=env, capture_output=True, text=True)
    if out.returncode:
        raise ReproduceError(f"re-synthesis failed: {(out.stderr or out.stdout).strip().splitlines()[-1]}")
    return outdir


def submitted_run(record: dict, name: str) -> tuple[str, str, list[str]] | None:
    """``(job config, run, the user's --set items)`` when ``raytrain-eks submit`` made the run:
    its entrypoint carries ``--set checkpoint.run_name=<run>`` right after the user's items
    (raytrain_eks/runs/manifest.py) and its manifest is ``rayjob-<run>``."""
    argv = list(record.get("command") or [])
    items = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--set"]
    runs = [i for i, item in enumerate(items) if item.startswith("checkpoint.run_name=")]
    if "--config" not in argv or not runs:
        return None
    run = items[runs[0]].split("=", 1)[1]
    if name != f"rayjob-{run}":
        return None
    return argv[argv.index("--config") + 1], run, items[:runs[0]]


# Where a tree keeps its run-manifest writer: today's room, then where trees before the rooms
# (f3e5feb) kept it, so that a run recorded by an older commit still reproduces.
_MANIFEST_MODULES = ("raytrain_eks.runs.manifest", "raytrain_eks.run_manifest")


def _synth_run(tree: Path, spec_text: str, work: Path, submitted: tuple[str, str, list[str]],
               on_cluster: bool) -> Path:
    """That tree's ``python -m raytrain_eks.runs.manifest``: the run's manifests as submit wrote them."""
    config, run, overrides = submitted
    spec = work / "environment.toml"
    spec.write_text(spec_text, encoding="utf-8")
    outdir = work / ("dist-on-cluster" if on_cluster else "dist")
    module = next((m for m in _MANIFEST_MODULES if (tree / (m.replace(".", "/") + ".py")).is_file()), None)
    if module is None:
        raise ReproduceError("the recorded tree has no raytrain_eks/runs/manifest.py: the run was not made by submit")
    cmd = [sys.executable, "-m", module, "--env", str(spec), "--job", config, "--run", run,
           "--outdir", str(outdir), "--root", str(tree), *(a for item in overrides for a in ("--set", item)),
           *(["--on-cluster"] if on_cluster else [])]
    out = subprocess.run(cmd, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True)
    if out.returncode:
        raise ReproduceError(f"re-synthesis failed: {(out.stderr or out.stdout).strip().splitlines()[-1]}")
    return outdir


def _differences(record: dict, manifest: dict) -> list[tuple[str, Any, Any]]:
    """(what, recorded, re-synthesized) for every recorded fact the new manifest states otherwise."""
    env_vars = json.loads(json.dumps(__import__("yaml").safe_load(manifest["spec"]["runtimeEnvYAML"])["env_vars"]))
    source = record.get("source") or {}
    argv = list(record.get("command") or [])
    recorded_args = argv[argv.index("training") + 1:] if "training" in argv else argv
    new_args = shlex.split(manifest["spec"]["entrypoint"])[3:]
    pairs = [
        ("image", record.get("image"), env_vars.get(contract.ENV_IMAGE)),
        ("code archive hash", (record.get("code_hash") or {}).get("manifest"), env_vars.get(contract.ENV_CODE_HASH)),
        ("environment spec hash", record.get("spec_hash"), env_vars.get(contract.ENV_SPEC_HASH)),
        ("job config hash", (record.get("job_config_hash") or {}).get("manifest"),
         env_vars.get(contract.ENV_JOB_CONFIG_HASH)),
        ("git commit", source.get("git_commit"), env_vars.get(contract.ENV_GIT_COMMIT)),
        ("git dirty", source.get("git_dirty"), env_vars.get(contract.ENV_GIT_DIRTY) == "true"),
        ("source hash", source.get("hash"), env_vars.get(contract.ENV_SOURCE_HASH)),
        ("entrypoint arguments", recorded_args, new_args),
    ]
    return [(what, old, new) for what, old, new in pairs if old != new]


def reproduce(run: str, *, repo: Path = REPO) -> Outcome:
    """Re-synthesize the manifest of the run at ``run`` (local dir or s3://) and compare."""
    import yaml

    record = read_json(f"{run.rstrip('/')}/{contract.RECORD_NAME}")
    commit, spec_text, name, recorded_hash = _needs(record, run)
    if not commit:
        raise ReproduceError(f"{run}/run.json: source.git_commit is empty: the manifests were synthesized "
                             "outside a git checkout, so their code cannot be checked out again")
    notes: list[str] = []
    if (record.get("source") or {}).get("git_dirty") is True:
        notes.append("the run was synthesized from a tree with uncommitted changes: git cannot restore them")
    with tempfile.TemporaryDirectory(prefix="raytrain-reproduce-") as tmp:
        work = Path(tmp)
        tree, temporary = _tree_for(commit, Path(repo), work, notes)
        submitted = submitted_run(record, name)
        try:
            if submitted is None:
                outdir = _synth(tree, spec_text, work)
            else:  # a submitted run: the same manifest on its own cluster or on the long-lived one
                outdir = _synth_run(tree, spec_text, work, submitted, on_cluster=False)
                path = outdir / f"{name}.k8s.yaml"
                if contract.manifest_hash(path.read_text(encoding="utf-8")) != recorded_hash:
                    with contextlib.suppress(ReproduceError):
                        other = _synth_run(tree, spec_text, work, submitted, on_cluster=True)
                        if contract.manifest_hash((other / f"{name}.k8s.yaml").read_text(encoding="utf-8")) == recorded_hash:
                            outdir = other
        finally:
            if temporary:
                subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(tree)],
                               capture_output=True)
        path = outdir / f"{name}.k8s.yaml"
        if not path.is_file():
            raise ReproduceError(f"the re-synthesis wrote no {path.name} (the job's config is gone at {commit[:12]}?)")
        text = path.read_text(encoding="utf-8")
    new_hash = contract.manifest_hash(text)
    manifest = next(d for d in yaml.safe_load_all(text) if d and d.get("kind") == "RayJob")
    outcome = Outcome(identical=new_hash == recorded_hash, manifest=f"{name}.k8s.yaml", recorded_hash=recorded_hash,
                      new_hash=new_hash, tree=f"{commit[:12]} ({'temporary worktree' if temporary else 'this checkout'})",
                      differences=[] if new_hash == recorded_hash else _differences(record, manifest), notes=notes)
    if outcome.identical:
        outcome.applied_overrides = applied_overrides(record, manifest)
    if outcome.identical and not outcome.differences:
        if record.get("image_digest"):
            outcome.verified = "infrastructure"
        else:
            outcome.notes.append("manifests identical, but the image is a tag (not a digest): infrastructure "
                                 "is not verified (pin it with `raytrain-eks lock`)")
    elif not outcome.differences:
        outcome.differences.append(("manifest bytes outside the recorded facts (chart code or cdk8s version)",
                                    recorded_hash, new_hash))
    return outcome


def values_by_step(rows: list[dict[str, Any]], key: str) -> dict[int, float]:
    """``{step: value}`` of one numeric key, from rows already read by report.py's ``by_step``."""
    return {r[contract.STEP]: r[key] for r in rows
            if isinstance(r.get(contract.STEP), int) and isinstance(r.get(key), (int, float))}


def first_difference(a: dict[int, float], b: dict[int, float]) -> int | None:
    """The first step at which two runs' values differ, or one run lacks the step; None when equal."""
    return next((s for s in sorted(set(a) | set(b)) if a.get(s) != b.get(s)), None)


def _losses(run: str) -> dict[int, float]:
    """``{step: loss}``, the last write winning after a resume (raytrain_eks/runs/report.py ``by_step``)."""
    from raytrain_eks.runs.report import load_run

    return values_by_step(load_run(run).train, contract.LOSS)


def compare_runs(run_a: str, run_b: str) -> dict[str, Any]:
    """Execution (same pins: seeds, data content, config) and result (bit-identical losses)."""
    a, b = (read_json(f"{r.rstrip('/')}/{contract.RECORD_NAME}") for r in (run_a, run_b))
    pins_a, pins_b = ((r.get("reproducibility") or {}).get("execution_pins") for r in (a, b))
    from raytrain_eks.runs.report_story import factors

    same_config = not factors(a, b)  # names and storage locations aside, nothing that shapes a run differs
    execution = bool(pins_a) and pins_a == pins_b and same_config
    losses_a, losses_b = _losses(run_a), _losses(run_b)
    result = execution and bool(losses_a) and losses_a == losses_b
    return {"execution": execution, "result": result, "pins": [pins_a, pins_b], "same_config": same_config,
            "steps": [len(losses_a), len(losses_b)],
            "first_loss_difference": first_difference(losses_a, losses_b)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", metavar="RUN_DIR", help="run directory holding run.json (local or s3://)")
    parser.add_argument("--against", metavar="RUN_DIR_2", default=None,
                        help="a second run of the same job: verifies the execution and result levels")


def _short(value) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return text if len(text) <= 90 else text[:87] + "..."


def run(args: argparse.Namespace) -> int:

    try:
        outcome = reproduce(args.run)
    except (ReproduceError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"manifest     {outcome.manifest} re-synthesized from {outcome.tree}")
    for note in outcome.notes:
        print(f"note         {note}")
    if outcome.identical and outcome.applied_overrides:
        # the pipeline's smoke step applies the synthesized manifest with its run name appended
        print(f"identical    yes: byte-identical to the synthesized manifest ({outcome.new_hash}); what ran was "
              f"applied with {shlex.join(outcome.applied_overrides)} appended to its entrypoint (recorded in run.json)")
    elif outcome.identical:
        print(f"identical    yes: byte-identical to what ran ({outcome.new_hash})")
    else:
        print(f"identical    no: recorded {outcome.recorded_hash}, re-synthesized {outcome.new_hash}")
        for what, old, new in outcome.differences:
            print(f"  differs    {what}: recorded {_short(old)} -> now {_short(new)}")
    levels = ["infrastructure"] if outcome.verified == "infrastructure" else []
    pair: dict = {}
    if args.against:
        pair = compare_runs(args.run, args.against)
        if levels and pair["execution"]:
            levels.append("execution")
            if pair["result"]:
                levels.append("result")
        first = pair["first_loss_difference"]
        print(f"second run   same pins and config: {'yes' if pair['execution'] else 'no'}; losses "
              f"{'bit-identical' if pair['result'] else f'differ from step {first}' if first else 'not comparable'}"
              f" ({pair['steps'][0]} vs {pair['steps'][1]} steps)")
    held = ("result" if pair["result"] else "execution" if pair["execution"] else "") if args.against else ""
    why = ("" if levels else f" (the levels build on infrastructure, which is unverified; the pair alone shows "
                             f"{held})" if held else "")
    print(f"verified     {levels[-1] if levels else 'none'}{why}"
          f"{'' if args.against else ' (execution and result need a second run: --against RUN_DIR_2)'}")
    return 0 if outcome.identical else 1
