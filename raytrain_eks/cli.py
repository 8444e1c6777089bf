"""`raytrain-eks`: the one command-line entry for the operator's tasks.

Each sub-command lives in its own module under ``raytrain_eks/commands`` with two functions,
``add_arguments(parser)`` and ``run(args) -> int``. Command modules keep heavy imports
(matplotlib, boto3, torch) inside ``run`` so ``--help`` stays instant. User errors (spec, job config, registry) print one line and exit 2; tracebacks are
kept for bugs.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help). Keep sorted by the order a user meets them.
COMMANDS: dict[str, tuple[str, str]] = {
    "summary": ("raytrain_eks.commands.summary",
                "print the environment: nodes, GPUs, world size, image, versions, cost per hour"),
    "verify": ("raytrain_eks.commands.verify",
               "before deploy and before a job: add-on and chart pins, GPU AZ, vCPU quotas, reservations, "
               "CDK bootstrap, image digest"),
    "capacity": ("raytrain_eks.commands.capacity",
                 "which AZs offer the GPU instance types; which reservations and Capacity Blocks match"),
    "preflight": ("raytrain_eks.commands.preflight",
                  "check a job against the environment before any spend: GPUs, Ray version, EFA, memory, cost"),
    "report": ("raytrain_eks.commands.report",
               "render a run (or two side by side) as Markdown + PNG plots from run.json and metrics"),
    "runs": ("raytrain_eks.commands.runs",
             "list the runs under a storage prefix: time, image digest, commit, job, verdict, tokens/s, eval"),
    "reproduce": ("raytrain_eks.commands.reproduce",
                  "re-create a run's manifests from its run.json: byte-identical, or each difference named"),
    "lock": ("raytrain_eks.commands.lock",
             "resolve the image tag to its digest through the registry and pin it in the spec"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="raytrain-eks",
        description="Distributed fine-tuning on EKS with the AWS Ray Train DLC: operator commands. "
                    "Everything reads the environment spec (--env, default environment.toml).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_text) in COMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        command.set_defaults(_module=module)
        importlib.import_module(module).add_arguments(command)
    return parser


def main(argv: list[str] | None = None) -> int:
    from charts.errors import ChartError
    from environment import SpecError
    from training.config import JobConfigError
    from training.data.records import DataError

    args = build_parser().parse_args(argv)
    module = importlib.import_module(args._module)
    try:
        return int(module.run(args) or 0)
    except (SpecError, JobConfigError, DataError, ChartError) as err:  # JobConfigError covers the model's
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
