"""The code archive: deterministic, content-addressed, holding training/, jobs/ and spec_schema/ only."""
from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from charts.code_bundle import build_code_bundle
from devtools.tokenizer_build import DEFAULT_OUT as TOKENIZER_DIR


def tree(root: Path) -> Path:
    for rel, text in {"training/__init__.py": "", "training/__main__.py": "print('hi')\n",
                      "training/data/x.py": "X = 1\n", "jobs/a.toml": 'name = "a"\n', "spec_schema/__init__.py": "",
                      "training/__pycache__/x.cpython-311.pyc": "junk", "training/y.pyc": "junk",
                      "training/.hidden": "no", "README.md": "not shipped"}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_archive_is_deterministic_and_content_addressed(tmp_path):
    root = tree(tmp_path / "src")
    first = build_code_bundle(root, tmp_path / "out1")
    (root / "training" / "__main__.py").touch()  # a new mtime alone changes nothing
    second = build_code_bundle(root, tmp_path / "out2")
    assert first.content_hash == second.content_hash and len(first.content_hash) == 16
    assert first.path.read_bytes() == second.path.read_bytes()
    assert first.name == f"training-{first.content_hash}.zip"
    assert first.uri("bkt") == f"s3://bkt/code/{first.name}"

    (root / "jobs" / "a.toml").write_text('name = "b"\n')
    third = build_code_bundle(root, tmp_path / "out1")
    assert third.content_hash != first.content_hash and third.path != first.path


def test_archive_holds_sorted_sources_with_fixed_metadata(tmp_path):
    bundle = build_code_bundle(tree(tmp_path / "src"), tmp_path / "out")
    with zipfile.ZipFile(bundle.path) as zf:
        names = zf.namelist()
        infos = zf.infolist()
    assert names == ["jobs/a.toml", "spec_schema/__init__.py", "training/__init__.py", "training/__main__.py",
                     "training/data/x.py"]
    assert {i.date_time for i in infos} == {(1980, 1, 1, 0, 0, 0)}
    assert {i.external_attr >> 16 for i in infos} == {0o644}
    # Several top-level folders: Ray keeps the layout (it strips a lone top-level folder).
    assert {n.split("/")[0] for n in names} == {"training", "jobs", "spec_schema"}


def test_unpacked_archive_runs_as_the_job_working_directory(tmp_path):
    import subprocess
    import sys

    bundle = build_code_bundle(tree(tmp_path / "src"), tmp_path / "out")
    with zipfile.ZipFile(bundle.path) as zf:
        zf.extractall(tmp_path / "wd")
    out = subprocess.run([sys.executable, "-m", "training"], cwd=tmp_path / "wd", capture_output=True, text=True)
    assert out.stdout == "hi\n"


def test_rayjob_entrypoints_pass_the_jobs_own_check_in_the_unpacked_archive(default_synth, tmp_path):
    # What Ray does on a node: unpack working_dir, run the entrypoint through a shell in it.
    # `--check` is the job's own validation (config, data path, model config) without training.
    import os
    import subprocess

    from charts.main import read_rayjob
    from charts_testspec import ROOT
    from fixture_paths import FIXTURE_JOBS

    with zipfile.ZipFile(default_synth.result.code.path) as zf:
        zf.extractall(tmp_path / "wd")
    env = {**os.environ, "PATH": f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)  # only the archive's code: the repository must not leak in
    unbuilt = []
    for job in ("local", "smoke"):  # finetune's model lives in S3: not reachable here
        if not (ROOT / TOKENIZER_DIR).is_dir() and TOKENIZER_DIR in (FIXTURE_JOBS / f"{job}.toml").read_text():
            unbuilt.append(job)  # its tokenizer is built offline, never committed
            continue
        submission = read_rayjob(default_synth.result.files[f"rayjob-{job}"])
        proc = subprocess.run(["bash", "-c", submission.entrypoint + " --check"], cwd=tmp_path / "wd",
                              env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith(f"jobs/{job}.toml: ok"), proc.stdout
    if unbuilt:
        pytest.skip(f"jobs {', '.join(unbuilt)} not checked: {TOKENIZER_DIR} is absent (build it with "
                    f"`python -m devtools.tokenizer_build`; it needs transformers, which Synth does not install)")


@pytest.mark.subprocess  # asks git which files it tracks
def test_untracked_files_and_symbolic_links_stay_behind(tmp_path):
    """A stray file in training/ or jobs/ (notes, a key) and a link to a file elsewhere never reach
    the pods: in a git work tree only tracked files travel, plus what make builds (the tokenizer)."""
    import subprocess

    root = tree(tmp_path / "src")
    (tmp_path / "secret").write_text("the operator's key")
    (root / "jobs" / "key.toml").symlink_to(tmp_path / "secret")
    built = root / "training" / "assets" / "qwen2.5-tokenizer"
    built.mkdir(parents=True)
    (built / "tokenizer.json").write_text("{}")
    (root / ".gitignore").write_text("training/assets/qwen2.5-tokenizer/\n")
    git = ["git", "-C", str(root), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "training", "jobs/a.toml", "spec_schema", ".gitignore"], check=True)
    subprocess.run([*git, "commit", "-qm", "tree"], check=True)
    (root / "training" / "notes.py").write_text("scratch, never committed")
    names = set(zipfile.ZipFile(build_code_bundle(root, tmp_path / "out").path).namelist())
    assert "training/notes.py" not in names and "jobs/key.toml" not in names
    assert {"training/__main__.py", "jobs/a.toml", "training/assets/qwen2.5-tokenizer/tokenizer.json"} <= names
