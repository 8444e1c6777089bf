"""`raytrain-eks`: the one command-line entry for the operator's tasks.

Each sub-command has two functions, ``add_arguments(parser)`` and ``run(args) -> int``: those of
the module that does its work (``raytrain_eks/planning/preflight.py``, ``runs/report.py``,
``runs/listing.py``, ``runs/reproduce.py``, ``verify/capacity.py``; ``verify`` those of the
``raytrain_eks.verify`` room itself), or of a class in a module of several commands
(``"module:Class"``: ``runs/commands.py``'s status, logs, stop and list of a submitted run,
``runs/submit.py``'s netcheck, ``raytrain_eks.verify``'s summary). Command modules keep heavy imports
(matplotlib, boto3, torch) inside ``run`` so ``--help`` stays instant. User errors (spec, job config, registry) print one line and exit 2;
a cluster kubectl cannot reach exits 5, one that refuses kubectl's request 6; Ctrl-C, SIGTERM and SIGHUP exit 130 after the clean-up
(one inherited as ignored, as under nohup, stays ignored);
tracebacks are kept for bugs.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module or "module:Class", one-line help). Keep sorted by the order a user meets them.
COMMANDS: dict[str, tuple[str, str]] = {
    "summary": ("raytrain_eks.verify:Summary",
                "print the environment: nodes, GPUs, world size, image, versions, cost per hour"),
    "verify": ("raytrain_eks.verify",
               "before deploy and before a job: add-on and chart pins, GPU AZ, vCPU quotas, reservations, "
               "CDK bootstrap, image digest"),
    "capacity": ("raytrain_eks.verify.capacity",
                 "which AZs offer the GPU instance types; which reservations and Capacity Blocks match"),
    "preflight": ("raytrain_eks.planning.preflight",
                  "check a job against the environment before any spend: GPUs, Ray version, EFA, memory, cost"),
    "submit": ("raytrain_eks.runs.submit",
               "run a job: synthesize, upload, apply, follow its log, then fetch the report, model and verdict"),
    "netcheck": ("raytrain_eks.runs.submit:Netcheck",
                 "measure the network: collective bus bandwidth by size over EFA and over sockets, with a verdict"),
    "status": ("raytrain_eks.runs.commands:Status", "where a submitted run stands (KubeRay's RayJob status)"),
    "logs": ("raytrain_eks.runs.commands:Logs", "a run's driver log: streamed from the cluster, or the copy in storage"),
    "stop": ("raytrain_eks.runs.commands:Stop", "stop a run: delete its RayJob (KubeRay stops the job); storage stays"),
    "list": ("raytrain_eks.runs.commands:List", "the submitted runs the cluster knows, with their status"),
    "report": ("raytrain_eks.runs.report",
               "render a run (or two side by side) as Markdown + PNG plots from run.json and metrics"),
    "runs": ("raytrain_eks.runs.listing",
             "list the runs under a storage prefix: time, image digest, commit, job, verdict, tokens/s, eval"),
    "reproduce": ("raytrain_eks.runs.reproduce",
                  "re-create a run's manifests from its run.json: byte-identical, or each difference named"),
    "lock": ("raytrain_eks.verify.lock",
             "resolve the image tag to its digest through the registry and pin it in the spec"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="raytrain-eks",
        description="Distributed fine-tuning on EKS with the AWS Ray Train DLC: operator commands. "
                    "Everything reads the environment spec (--env, default environment.toml).")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (target, help_text) in COMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        command.set_defaults(_command=target)
        _command(target).add_arguments(command)
    return parser


def _command(target: str):
    """What ``target`` names in :data:`COMMANDS`: a module, or a class of one (``"module:Class"``),
    either with ``add_arguments`` and ``run``."""
    module, _, attribute = target.partition(":")
    found = importlib.import_module(module)
    return getattr(found, attribute) if attribute else found


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("raytrain-eks")
    except metadata.PackageNotFoundError:
        return "(not installed)"


# The signals that end a command as Ctrl-C does. One inherited as ignored stays ignored (POSIX
# practice: ``nohup`` ignores SIGHUP, a shell's ``&`` ignores SIGINT, for the program to keep).
_STOPPING = ("SIGINT", "SIGTERM", "SIGHUP")


def _stop_like_ctrl_c(signum: int, frame) -> None:
    """SIGTERM and SIGHUP (a closed terminal, a CI timeout) end a command as Ctrl-C does: the
    ``with`` blocks that started services stop them. Further signals, a second Ctrl-C included,
    are ignored meanwhile, so that clean-up runs to its end (a cut-short clean-up orphans the
    local Ray head)."""
    import signal

    for name in _STOPPING:
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    raise KeyboardInterrupt


def _handle_stop_signals() -> dict:
    """Install `_stop_like_ctrl_c` for each stopping signal not inherited as ignored; returns
    the handlers it replaced, for ``main`` to put back."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return {}
    before = {}
    for name in _STOPPING:
        sig = getattr(signal, name)
        if signal.getsignal(sig) is not signal.SIG_IGN:
            before[sig] = signal.signal(sig, _stop_like_ctrl_c)
    return before


def main(argv: list[str] | None = None) -> int:
    import signal

    from charts import ChartError
    from environment import SpecError
    from training.config import JobConfigError
    from training.data.records import DataError

    from raytrain_eks.backends.eks import KubectlError
    from raytrain_eks.planning.gpu_figures import CalibrationError
    from raytrain_eks.backends.local import LocalRunError
    from raytrain_eks.backends.local_services import HeadUnreachable

    args = build_parser().parse_args(argv)
    command = _command(args._command)
    before = _handle_stop_signals()
    try:
        code = int(command.run(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit flush
        return code
    except (SpecError, JobConfigError, DataError, ChartError, CalibrationError) as err:  # JobConfigError covers the model's
        print(f"error: {err}", file=sys.stderr)
        return 2
    except (KubectlError, HeadUnreachable, LocalRunError) as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        _say_on_a_hung_up_terminal(f"\nraytrain-eks {args.command}: interrupted")
        return 130
    except BrokenPipeError:
        return _closed_pipe()
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def _say_on_a_hung_up_terminal(line: str) -> None:
    """Print ``line`` to stderr where the terminal may be gone: after a hangup, writes to the tty
    fail with EIO (tty(4)); the clean-up already ran, so the exit stays 130. Both streams then
    point at devnull, so the interpreter's exit flush does not fail either."""
    import os

    try:
        sys.stdout.flush()
        print(line, file=sys.stderr, flush=True)
    except OSError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        for stream in (sys.stdout, sys.stderr):
            os.dup2(devnull, stream.fileno())


def _closed_pipe() -> int:
    """``raytrain-eks ... | head``: the reader left. Python's own advice (the signal module's
    "Note on SIGPIPE"): point stdout at devnull so the exit flush does not raise again, and exit
    as a SIGPIPE'd command does (128 + 13)."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 141


if __name__ == "__main__":
    sys.exit(main())
