"""What a finished local run left running: its own processes only, found by the temp dir its
Ray head ran in and the address of its S3 server (both recorded in ``ray_job.json`` and
``local.json``), so another
run on the same machine (a parallel test, a user's demo) is not mistaken for this one's."""
from __future__ import annotations

import json
from pathlib import Path

from raytrain_eks.backends.local_services import processes_matching


def left_running(out: Path) -> dict[str, list[int]]:
    """``{marker: pids}`` for each of the run's services that still has a process; {} when none."""
    # ray_job.json once the run has ended normally; local.json keeps the same two after any end
    ran = json.loads((out / ("ray_job.json" if (out / "ray_job.json").is_file() else "local.json")).read_text())
    port = ran["storage_endpoint"].rsplit(":", 1)[1]
    # /proc cmdlines end with the argument separator: the trailing space keeps port 5486 from
    # matching 54863.
    markers = [ran["ray_temp_dir"], f"moto_server -H 127.0.0.1 -p {port} "]
    return {marker: pids for marker in markers if (pids := processes_matching(marker))}


def on_the_warm_head(out: Path) -> str:
    """The Ray job's status as told now by the warm head that ran the run (``warm_head`` in
    ``ray_job.json``, or ``local.json`` after any end: tests/conftest.py ``warm_head``): that it
    answers shows the submit left it running. A run on services of its own has none: KeyError."""
    from raytrain_eks.backends.local import job_client

    ran = json.loads((out / ("ray_job.json" if (out / "ray_job.json").is_file() else "local.json")).read_text())
    warm = json.loads(Path(ran["warm_head"]).read_text())
    # the token in the request's header: this process's Ray keeps no auth mode of the head's
    status = job_client(warm["dashboard_url"], {"RAY_AUTH_TOKEN": warm["auth_token"]}).get_job_status(ran["submission_id"])
    return str(getattr(status, "value", status))
