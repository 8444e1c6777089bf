"""Time to refuse a bad input, per entry point: how long a user waits for the one-line error.

Each entry point is run as the user runs it (a fresh process: interpreter start and imports
included), on one representative bad input of each kind from the test battery
(tests/validation/cases.py); each is checked to exit 2 with ONE stderr line. The in-process
figure is the validation alone, over the whole battery. Prints ONE JSON object on its last line.
Run: ``.venv/bin/python bench/bench_refusals.py``. Figures are reported, never asserted.
"""
from __future__ import annotations

import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "validation"))

from cases import DATA_CASES, ENV_CASES, JOB_CASES  # noqa: E402
from toml_writer import toml_text  # noqa: E402


def _time(argv: list[str], env: dict | None = None, repeat: int = 3) -> dict:
    times, last = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        last = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600,
                              env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
        times.append(time.perf_counter() - start)
    lines = [line for line in last.stderr.splitlines() if line.strip()]
    return {"median_s": round(statistics.median(times), 3), "exit": last.returncode,
            "one_line": len(lines) == 1, "line": lines[-1][:160] if lines else ""}


def main() -> None:
    py = sys.executable
    raw = tomllib.loads((ROOT / "environment.toml").read_text())
    bad_env = copy.deepcopy(raw)
    bad_env["cluster"]["region"] = "us-east-3"
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        env_file = tmp_path / "environment.toml"
        env_file.write_text(toml_text(bad_env))
        data = tmp_path / "corpus.jsonl"
        data.write_text('{"text": "fine"}\n' * 30 + '{"content": "wrong field"}\n')
        local = "jobs/local.toml"
        figures = {
            "env: raytrain-eks summary": _time([py, "-m", "raytrain_eks.cli", "summary", "--env", str(env_file)]),
            "env: cdk8s synth (charts.main)": _time([py, "-m", "charts.main", "--env", str(env_file),
                                                     "--outdir", str(tmp_path / "dist")]),
            "env: cdk synth (app.py)": _time([py, "app.py"], {"ENV_FILE": str(env_file)}, repeat=1),
            "job: python -m training --check": _time([py, "-m", "training", "--config", local, "--check",
                                                      "--set", "train.seq_len=4096"]),
            "model: python -m training --check": _time([py, "-m", "training", "--config", local, "--check",
                                                        "--set", "model.config.num_hidden_layer=2"]),
            "data: python -m training --check": _time([py, "-m", "training", "--config", local, "--check",
                                                       "--set", f"data.path={data}"]),
            "data: python -m training (real run, driver)": _time([py, "-m", "training", "--config", local,
                                                                  "--set", f"data.path={data}"]),
            "data: raytrain-eks preflight": _time([py, "-m", "raytrain_eks.cli", "preflight", "--job", local,
                                                   "--set", f"data.path={data}", "--dist", str(tmp_path / "none")]),
            # before any Ray start: the local submit refuses the bad line before its services start
            "data: raytrain-eks submit --local": _time([py, "-m", "raytrain_eks.cli", "submit", local, "--local",
                                                        "--set", f"data.path={data}"]),
            "plan: raytrain-eks preflight (cpus per worker)": _time(
                [py, "-m", "raytrain_eks.cli", "preflight", "--job", "jobs/smoke.toml", "--set",
                 "parallel.cpus_per_worker=12", "--dist", str(tmp_path / "none")]),
        }
    in_process = _in_process()
    print(json.dumps({"name": "refusals", "entry_points": figures, "in_process_ms": in_process}))


def _in_process() -> dict:
    """Median milliseconds of the validation alone, per kind, over the battery."""
    from environment import SpecError, environment_from_dict
    from training.config import JobConfigError, load_job_config
    from training.data.check import check_data
    from training.data.records import DataError
    from training.model_config import check_model

    raw = tomllib.loads((ROOT / "environment.toml").read_text())
    out = {}
    env_ms = []
    for _, mutate, _ in ENV_CASES:
        broken = copy.deepcopy(raw)
        mutate(broken)
        start = time.perf_counter()
        try:
            environment_from_dict(broken)
        except SpecError:
            env_ms.append((time.perf_counter() - start) * 1000)
    out["env"] = round(statistics.median(env_ms), 3)
    os.chdir(ROOT)
    job_ms = []
    for _, overrides, _ in JOB_CASES:
        start = time.perf_counter()
        try:
            check_model(load_job_config("jobs/local.toml", overrides))
        except JobConfigError:
            job_ms.append((time.perf_counter() - start) * 1000)
    out["job_and_model"] = round(statistics.median(job_ms), 3)
    data_ms = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (_, kind, name, content, extra, _) in enumerate(DATA_CASES):
            target = Path(tmp) / str(i) / name
            target.parent.mkdir(parents=True)
            (target.write_bytes if isinstance(content, bytes) else target.write_text)(content)
            path = target.parent if "/" in name else target
            job = load_job_config("jobs/local.toml", [f"data.kind={kind}", f"data.path={path}", *extra])
            start = time.perf_counter()
            try:
                check_data(job)
            except DataError:
                data_ms.append((time.perf_counter() - start) * 1000)
    out["data"] = round(statistics.median(data_ms), 3)
    out["cases"] = {"env": len(env_ms), "job_and_model": len(job_ms), "data": len(data_ms)}
    return out


if __name__ == "__main__":
    main()
