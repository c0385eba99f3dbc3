"""Run commands one after another as a child subreaper, then list what they left running.

    python tests/reaper.py OUT.json -- CMD1 ... [--- CMD2 ... [--sigint-after-trial] ...]

PR_SET_CHILD_SUBREAPER makes every process orphaned below this one (a Ray worker whose raylet
is gone) this process's child instead of init's, so nothing a sweep leaves behind can hide:
after the commands end (and a few seconds' grace), every live descendant is a leftover. They are
written to OUT.json with their command lines, then killed. A command whose first word is
``SIGINT@N`` gets SIGINT N seconds after it starts, to its whole process group (a user's Ctrl-C)."""

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


def main() -> int:
    out, commands = sys.argv[1], " ".join(sys.argv[3:]).split(" --- ")
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise SystemExit("prctl(PR_SET_CHILD_SUBREAPER) failed")
    codes = []
    for command in commands:
        words = command.split()
        sigint_after = float(words.pop(0).split("@")[1]) if words[0].startswith("SIGINT@") else None
        # its own process group, as a shell runs a foreground job: Ctrl-C reaches the whole group
        proc = subprocess.Popen(words, start_new_session=True)
        if sigint_after is not None:
            try:
                proc.wait(timeout=sigint_after)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGINT)
        codes.append(proc.wait(timeout=900))
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
