"""The before/after oracle of a move: one digest per synthesized file, so two commits' CloudFormation
and manifests can be compared with ``diff``.

    python -m devtools.synth_digest > before.txt      # on one commit
    python -m devtools.synth_digest > after.txt       # on another
    diff before.txt after.txt                         # nothing: the moves changed no output

``--root DIR`` synthesizes another checkout's code with this one's script (e.g. ``git archive main |
tar -x -C /tmp/main`` then ``--root /tmp/main``): the spec variants come from ``DIR/tests``.

What it synthesizes: every spec variant the tests synthesize, from the tests' own variant
modules (so the oracle cannot drift from them): the CDK app (``cdk synth``'s output, through
``infra.build.build_app`` as tests/infra_variants.py runs it, cdk-nag included) for ``default``,
``alternative``, ``capacity`` and ``existing`` (tests/infra_variants.py) and ``pipeline``
(:func:`infra_variants.pipeline_raw`: the pipeline stack enabled); the cdk8s app
(``charts.main.synth``, what ``cdk8s synth`` runs) for the chart tests' ``default`` and ``large``
specs (tests/charts/charts_testspec.py).

What it normalizes, and only that, because it legitimately changes with the code and nothing
else (each replaced by a named placeholder, where it appears, in every file):

- ``<code-hash>``: the code archive's content hash (``charts.code_bundle.CodeBundle.content_hash``,
  16 hex: the zip's name, the ``working_dir`` URI, the ``raytrain.io/code-hash`` label);
- ``<source-hash>``: the source tree hash (``SourceIdentity.source_hash``, full sha256, in the
  RayJob's environment);
- ``<git-commit>`` and ``<git-dirty>``: the commit the synth ran on and whether the source paths
  had uncommitted changes (labels and environment);
- ``<manifest-hash>``: each RayJob's ``training.contract.manifest_hash`` (computed over its text,
  so it follows the three above);
- ``jsii-kernel-<run>``, ``tmp<run>``: in the CDK output's JSON, the jsii kernel's and runtime's
  temporary folders that the stack traces of ``*.metadata.json`` and ``validation-report.json``
  name (:data:`JSII_TEMP`): new ones every process, so two synths of one commit differ there.

The code archive itself (``code/training-<hash>.zip``) is listed, not digested: its content IS the
code. The CDK output carries no code hash: the image watcher's asset holds
``infra/lambdas/image_watcher`` and the ``environment`` and ``spec_schema`` modules it imports, so a
move in those changes its asset hash, which is a real change of what deploys and is NOT normalized.
``manifest.json``, ``tree.json`` and ``*.assets.json`` are digested like the templates.
"""
from __future__ import annotations

import argparse
import hashlib
import re
import sys
import tempfile
import warnings
from pathlib import Path

HERE_ROOT = Path(__file__).resolve().parents[1]
JSII_TEMP = ((re.compile(rb"jsii-kernel-[A-Za-z0-9]+"), b"jsii-kernel-<run>"),
             (re.compile(rb"tmp[a-z0-9_]{8}(/lib/program\.js)"), rb"tmp<run>\1"))
"""The jsii kernel's and the jsii runtime's temporary folders (``<tmp>/jsii-kernel-XXXXXX``,
``<tmp>/tmpXXXXXXXX/lib/program.js``: new ones every process), in the stack traces of
``*.metadata.json`` and ``validation-report.json``: they follow the run, not the code."""


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _cdk_variants(root: Path) -> dict[str, tuple]:
    import infra_variants as v

    variants = {"default": (v.default_raw, "environment.toml"), "alternative": (v.alternative_raw, "alternative.toml"),
                "capacity": (v.capacity_raw, "capacity.toml"), "existing": (v.existing_raw, "existing.toml")}
    variants["pipeline"] = (getattr(v, "pipeline_raw", None) or _own_pipeline_raw(), "pipeline-test.toml")
    return variants


def _own_pipeline_raw():
    """This checkout's ``pipeline_raw`` for a ``--root`` whose tests predate it (the pipeline spec
    was inlined in tests/infra/test_pipeline_stack.py): the same spec, from this checkout's
    environment.toml."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_own_infra_variants", HERE_ROOT / "tests" / "infra_variants.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module.pipeline_raw


def cdk_digests(root: Path, work: Path) -> list[str]:
    from infra_variants import synthesize

    lines = []
    for name, (raw, source) in _cdk_variants(root).items():
        out = work / f"cdk-{name}"
        synthesize(raw(), out, source)
        for path in sorted(p for p in out.rglob("*") if p.is_file()):
            rel = path.relative_to(out).as_posix()
            data = path.read_bytes()
            if path.suffix == ".json":  # stack traces name jsii's temporary folders
                for pattern, placeholder in JSII_TEMP:
                    data = pattern.sub(placeholder, data)
            lines.append(f"cdk/{name}/{rel} {hashlib.sha256(data).hexdigest()}")
    return lines


def normalize(text: str, *, code_hash: str, source) -> str:
    """``text`` with the values that follow the code (the module docstring names them) replaced by
    their placeholders; ``source``: the synth's ``charts.provenance.SourceIdentity``."""
    from environment.contract import GIT_COMMIT_LABEL, GIT_DIRTY_LABEL
    from training.contract import ENV_GIT_COMMIT, ENV_GIT_DIRTY, ENV_MANIFEST_HASH, LABEL_HASH_CHARS

    text = text.replace(code_hash, "<code-hash>")
    # by the key that holds them: a checkout outside git (``git archive``) has no commit ("none", "")
    for placeholder, names in {"<manifest-hash>": (ENV_MANIFEST_HASH,), "<git-commit>": (ENV_GIT_COMMIT, GIT_COMMIT_LABEL),
                               "<git-dirty>": (ENV_GIT_DIRTY, GIT_DIRTY_LABEL)}.items():
        for name in names:
            text = re.sub(rf"({re.escape(name)}: )(''|\"\"|\S+)", rf"\1{placeholder}", text)
    if source.source_hash:  # the full hash, then its label-sized prefix
        text = text.replace(source.source_hash, "<source-hash>").replace(source.source_hash[:LABEL_HASH_CHARS], "<source-hash>")
    return text


def chart_lines(name: str, result) -> list[str]:
    """One line per file a cdk8s synth (``charts.main.SynthResult``) wrote: its path and the
    sha256 of its normalized text; the code archive named, not digested."""
    code_hash = result.code.content_hash
    out = Path(result.code.path).parents[1]  # <outdir>/code/training-<hash>.zip
    lines = []
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        rel = path.relative_to(out).as_posix().replace(code_hash, "<code-hash>")
        if path.suffix == ".zip":
            lines.append(f"charts/{name}/{rel} (the code archive: its bytes are the code, not compared)")
            continue
        lines.append(f"charts/{name}/{rel} {_digest(normalize(path.read_text(), code_hash=code_hash, source=result.source))}")
    return lines


def chart_digests(root: Path, work: Path) -> list[str]:
    import charts_testspec as spec
    from charts.main import synth
    from fixture_paths import FIXTURE_JOBS

    lines = []
    for name, (env, text) in {"default": (spec.make_env(), spec.SPEC_TOML), "large": (spec.large_env(), "")}.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = synth(env, work / f"dist-{name}", root=root, spec_text=text, jobs=FIXTURE_JOBS)
        lines += chart_lines(name, result)
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=HERE_ROOT, help="the checkout to synthesize (default: this one)")
    parser.add_argument("--only", choices=["cdk", "charts"], help="one app only")
    parser.add_argument("--keep", type=Path, help="synthesize into this folder (kept) instead of a temporary one")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    # the checkout's own code and its tests' variant modules, ahead of this one's
    sys.path[:0] = [str(root), str(root / "tests"), str(root / "tests" / "charts")]
    with tempfile.TemporaryDirectory(prefix="synth-digest-") as tmp:
        work = args.keep.resolve() if args.keep else Path(tmp)
        lines = []
        if args.only in (None, "cdk"):
            lines += cdk_digests(root, work)
        if args.only in (None, "charts"):
            lines += chart_digests(root, work)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
