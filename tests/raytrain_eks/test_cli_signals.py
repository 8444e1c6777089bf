"""SIGTERM and SIGHUP end a command as Ctrl-C does: the ``with`` blocks that started services
run their clean-up, the command exits 130 with one line, no traceback (raytrain_eks/cli.py)."""
from __future__ import annotations

import os
import pty
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


def as_a_terminal_starts_it() -> None:
    """The child's SIGINT, SIGTERM and SIGHUP at their default, as an interactive shell starts a
    command. The test runner may have inherited one as ignored (a non-interactive shell starts a
    background job with SIGINT ignored, POSIX "Signals and Error Handling"; nohup ignores SIGHUP);
    the CLI keeps an ignored signal ignored, so the child would wait for a signal it never gets."""
    for each in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(each, signal.SIG_DFL)


@pytest.mark.parametrize("name", ["SIGTERM", "SIGHUP", "SIGINT"])
def test_a_signal_stops_the_command_like_ctrl_c(name):
    proc = subprocess.run([sys.executable, "-c", PROGRAM.format(name=name)], capture_output=True, text=True, timeout=120,
                          preexec_fn=as_a_terminal_starts_it)
    assert proc.returncode == 130, proc.stdout + proc.stderr
    assert proc.stdout == "service stopped\n"
    assert proc.stderr.strip() == "raytrain-eks fake: interrupted" and "Traceback" not in proc.stderr


@pytest.mark.parametrize("second", ["SIGHUP", "SIGINT"])
def test_a_second_signal_during_the_clean_up_does_not_cut_it_short(second):
    """A second Ctrl-C while the clean-up runs would otherwise leave the local Ray head behind."""
    program = PROGRAM.format(name="SIGTERM").replace(
        'print("service stopped", flush=True)', f'os.kill(os.getpid(), signal.{second}); print("service stopped", flush=True)')
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120,
                          preexec_fn=as_a_terminal_starts_it)
    assert proc.returncode == 130 and proc.stdout == "service stopped\n", proc.stderr


def test_a_hangup_inherited_as_ignored_stays_ignored():
    """``nohup raytrain-eks submit ... &`` then logging out: nohup starts the command with SIGHUP
    ignored (POSIX nohup; an ignored disposition survives exec, execve(2)), and the command keeps
    it, so the run goes on."""
    program = PROGRAM.format(name="SIGHUP").replace("signal.pause()  # the handler raises before this returns",
                                                    'print("survived the hangup", flush=True)')
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120,
                          preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == "survived the hangup\nservice stopped\n"


HUNG_UP = textwrap.dedent("""
    import contextlib, sys, types
    from raytrain_eks import cli

    @contextlib.contextmanager
    def service():
        try:
            yield
        finally:
            open(sys.argv[1] + "/cleanup", "w").write("service stopped")

    def run(args):
        with service():
            print("ready", flush=True)
            sys.stdin.read()  # until the hangup's SIGHUP
        return 0

    module = types.ModuleType("fake_command")
    module.add_arguments = lambda parser: None
    module.run = run
    sys.modules["fake_command"] = module
    cli.COMMANDS = {"fake": ("fake_command", "a command on a terminal that hangs up")}
    sys.exit(cli.main(["fake"]))
""")


def test_a_real_terminal_hangup_exits_130_after_the_clean_up(tmp_path):
    """A closed terminal: the session leader gets SIGHUP and later writes to the tty fail with
    EIO (Linux tty hangup, drivers/tty/tty_io.c ``hung_up_tty_write``). The clean-up has run, so
    the exit is 130, not 1 from the failed "interrupted" line."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: a session leader with the pty as its controlling terminal
        as_a_terminal_starts_it()
        os.execv(sys.executable, [sys.executable, "-c", HUNG_UP, str(tmp_path)])
    seen = b""
    while b"ready" not in seen:
        chunk = os.read(fd, 1000)
        assert chunk, seen
        seen += chunk
    os.close(fd)  # hang up the terminal
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 130
    assert (tmp_path / "cleanup").read_text() == "service stopped"
