"""How long a run takes from a fault to progress again, on the local path (never asserted).

The chaos suite's cluster (tests/e2e/test_chaos.py: a real local Ray head holding one worker's
CPU, a second Ray node holding the other's, moto's S3 as the store), the local job as the suite shortens
it: a worker frozen with SIGSTOP, a worker killed with SIGKILL, and the second node lost
whole (``node``: its processes SIGKILLed, a third node joining as its replacement), each at the
chaos suite's first fault's point (once step 5 is logged and Ray Train registered the step-4
checkpoint, of the suite's 18 steps), one fault per run. For each it prints the incident run.json recorded: what noticed it, the
watchdog's bound, the seconds from the fault to its being seen and from then to training again,
the steps and worker-minutes lost. The
watchdog's floors are the production ones (60 s) unless ``--floor`` says otherwise. Target:
``max(3 x step, 60 s)`` plus the restart, against Ray Train's 600 s worker health check.

    .venv/bin/python bench/bench_recovery.py [--floor 60] [--faults sigstop,sigkill,node]
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "e2e")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--floor", type=float, default=60.0, help="RAYTRAIN_HANG_FLOOR_S (default: production's 60)")
    parser.add_argument("--faults", default="sigstop,sigkill,node")
    args = parser.parse_args()
    import test_chaos as chaos
    from raytrain_eks.backends.local_services import ray_head
    from devtools.slow_store import slow_store

    chaos.HANG_ENV.update({"RAYTRAIN_HANG_FLOOR_S": str(args.floor)})
    faults = {"sigstop": signal.SIGSTOP, "sigkill": signal.SIGKILL}
    with slow_store(chaos.FAST) as store:
        env = {**store.client_env, **chaos.HANG_ENV, **chaos.NO_HOST_OOM_KILLS}
        with ray_head(num_cpus=1, env=env) as head:
            os.environ.update({**store.client_env, **head.client_env})
            cluster = {"head": head, "store": store, "env": env, "nodes": [chaos.Node(head, env, "node-b")]}
            try:
                chaos._wait(lambda: cluster["nodes"][-1].up() or chaos._alive_nodes(head) == 2, 600, "the second node")
                for name in args.faults.split(","):
                    struck: dict = {}

                    def strike(client, run, name=name):
                        if name == "node":
                            struck.update(at=time.time())
                            chaos.lose_node(cluster, set())
                            cluster["nodes"][:] = cluster["nodes"][1:]  # the replacement is the next case's second node
                            return
                        worker = chaos._workers(head)[-1]
                        struck.update(pid=worker.pid, at=time.time())
                        os.kill(worker.pid, faults[name])

                    with tempfile.TemporaryDirectory() as tmp:
                        try:
                            ran = chaos._run(cluster, Path(tmp), f"bench-{name}", strike)
                        finally:
                            if name == "sigstop" and struck.get("pid"):
                                try:
                                    os.kill(struck["pid"], signal.SIGKILL)
                                except ProcessLookupError:
                                    pass
                    for entry in ran["record"].get("incidents") or []:
                        seen = entry["time"]
                        after = datetime.fromisoformat(seen).timestamp() - struck["at"]  # run.json keeps whole seconds
                        print(f"{name}: {entry['kind']} of rank {entry['ranks']} at step {entry['step']}; "
                              f"seen about {after:.0f} s after the fault; "
                              f"training again {entry['progress_again_s']} s after it was seen ({seen}); "
                              f"resumed from step {entry['resumed_from_step']}, {entry['steps_lost']} steps and "
                              f"{entry['device_minutes_lost']} worker-minutes lost; {entry['detail'][:400]}")
                    print(f"{name}: verdict {ran['record']['verdict']['verdict']}, run {ran['record']['duration_s']} s")
            finally:
                for node in cluster["nodes"]:
                    node.kill([])
    return 0


if __name__ == "__main__":
    sys.exit(main())
