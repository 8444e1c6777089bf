"""The argv a RayJob's ``entrypoint`` reaches the job as, through the two shells it meets.

1. ``ray-project/kuberay`` tag ``ray-operator/v1.7.0``, ``ray-operator/controllers/ray/common/job.go``
   ``BuildJobSubmitCommand``: ``strings.TrimSpace(entrypoint)`` is spliced after ``--`` into the
   submitter's ``/bin/bash -ce`` script, which splits it into ``ray job submit``'s argv.
2. Ray 2.58 ``ray/dashboard/modules/job/cli.py`` ``submit``: ``list2cmdline(entrypoint)`` joins
   that argv back into one string (quoting spaces and double quotes only), and
   ``ray/dashboard/modules/job/job_supervisor.py`` runs it with ``subprocess.Popen(shell=True)``.

``shlex`` models sh's quoting but not its expansions or operators: a word holding one of those
is reported as not surviving rather than guessed at.
"""
from __future__ import annotations

import shlex
from subprocess import list2cmdline

SH_EXPANDS_OR_SPLITS = set("$`!;&|<>(){}*?[]~#\n")  # backslashes: shlex reads them as sh does


def job_argv(entrypoint: str) -> list[str] | None:
    """The job's argv, or None when the second shell would not hand it over as written."""
    submit_argv = shlex.split(entrypoint.strip())          # the submitter's bash
    command = list2cmdline(submit_argv)                    # ray job submit
    if set(command) & SH_EXPANDS_OR_SPLITS:
        return None
    try:
        return shlex.split(command)                        # the job supervisor's /bin/sh
    except ValueError:                                     # e.g. an unterminated quote
        return None


def runtime_env_argument_survives(runtime_env_yaml: str) -> bool:
    """common/job.go: ``--runtime-env-json`` gets ``strconv.Quote(YAMLToJSON(runtimeEnvYAML))``, a
    double-quoted word of the submitter's bash script, where ``$`` and backticks still expand."""
    import json

    import yaml
    return not set(json.dumps(yaml.safe_load(runtime_env_yaml) or {})) & set("$`")
