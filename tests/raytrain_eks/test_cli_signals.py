"""SIGTERM and SIGHUP end a command as Ctrl-C does: the ``with`` blocks that started services
run their clean-up, the command exits 130 with one line, no traceback (raytrain_eks/cli.py)."""
from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

# A command whose run() holds a service in a with block and signals its own process, as a
# closed terminal (SIGHUP) or a CI timeout (SIGTERM) would.
PROGRAM = textwrap.dedent("""
    import contextlib, os, signal, sys, types
    from raytrain_eks import cli

    @contextlib.contextmanager
    def service():
        try:
            yield
        finally:
            print("service stopped", flush=True)

    def run(args):
        with service():
            os.kill(os.getpid(), signal.{name})
            signal.pause()  # the handler raises before this returns
        return 0

    module = types.ModuleType("fake_command")
    module.add_arguments = lambda parser: None
    module.run = run
    sys.modules["fake_command"] = module
    cli.COMMANDS = {{"fake": ("fake_command", "a command that is signalled")}}
    sys.exit(cli.main(["fake"]))
""")


@pytest.mark.parametrize("name", ["SIGTERM", "SIGHUP", "SIGINT"])
def test_a_signal_stops_the_command_like_ctrl_c(name):
    proc = subprocess.run([sys.executable, "-c", PROGRAM.format(name=name)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 130, proc.stdout + proc.stderr
    assert proc.stdout == "service stopped\n"
    assert proc.stderr.strip() == "raytrain-eks fake: interrupted" and "Traceback" not in proc.stderr


def test_a_second_signal_during_the_clean_up_does_not_cut_it_short():
    program = PROGRAM.format(name="SIGTERM").replace(
        'print("service stopped", flush=True)', 'os.kill(os.getpid(), signal.SIGHUP); print("service stopped", flush=True)')
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 130 and proc.stdout == "service stopped\n", proc.stderr
