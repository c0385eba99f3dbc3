"""Run commands one after another as a child subreaper, then list what they left running.

    python tests/reaper.py OUT.json -- CMD1 ... [--- CMD2 ... ]

PR_SET_CHILD_SUBREAPER makes every process orphaned below this one (a Ray worker whose raylet
is gone) this process's child instead of init's, so nothing a sweep leaves behind can hide:
after the commands end (and a few seconds' grace), every live descendant is a leftover. They are
written to OUT.json with their command lines, then killed. Each command runs in its own process
group, as a shell's foreground job: SIGINT or SIGTERM sent to the reaper goes to that whole group
(a user's Ctrl-C). The reaper exits with the last command's status (128 + N for signal N), so a
test runs ``reaped(OUT, cmd)`` where it would run ``cmd``."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36


def _descendants() -> dict[int, str]:
    parents, names = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                names[int(entry)] = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if fields[0] != "Z":
            parents[int(entry)] = int(fields[1])
    found, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return {p: names.get(p, "") for p in found}


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def reaped(out, command: list[str]) -> list[str]:
    """``command`` run under this reaper, which writes what it left running to ``out``."""
    return [sys.executable, __file__, str(out), "--", *command]


def left_running(out) -> dict[str, str]:
    """What the reaped command left running (pid -> command line): {} when it left nothing."""
    with open(out) as f:
        return json.load(f)["left"]


def main() -> int:
    out, commands = sys.argv[1], " ".join(sys.argv[3:]).split(" --- ")
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise SystemExit("prctl(PR_SET_CHILD_SUBREAPER) failed")
    codes, running = [], []

    def forward(sig, _frame):  # to the running command's whole group, as a terminal's Ctrl-C
        for proc in running:
            try:
                os.killpg(proc.pid, sig)
            except OSError:
                pass

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    for command in commands:
        proc = subprocess.Popen(command.split(), start_new_session=True)
        running[:] = [proc]
        codes.append(proc.wait(timeout=1800))
        running.clear()
        _reap()
    deadline = time.monotonic() + 10
    while _descendants() and time.monotonic() < deadline:
        time.sleep(0.5)
        _reap()
    left = _descendants()
    with open(out, "w") as f:
        json.dump({"exit_codes": codes, "left": {str(p): c for p, c in left.items()}}, f)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return codes[-1] if codes[-1] >= 0 else 128 - codes[-1]


if __name__ == "__main__":
    sys.exit(main())
