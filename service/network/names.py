"""The names of everything an emulated network creates, and whose it is.

Every namespace, link, firewall rule and CPU cgroup of ours carries the pid of the process that
owns it (the sweep driver, or a test): ``chs-{owner pid}-{token}-h{i}`` for a host's namespace
and its cgroup, ``chs owner={pid}`` as a link's ``ifalias`` and a rule's comment. Leftovers of
a killed owner are found by these names alone, and nothing without them is ever touched.
"""

from __future__ import annotations

import os
import re

PREFIX = "chs"  # commhooks-sweep: every namespace, link and cgroup of ours starts with it
HOST_RE = re.compile(rf"^{PREFIX}-(\d+)-([0-9a-f]{{6}})-h(\d+)$")
ALIAS_RE = re.compile(rf"^{PREFIX} owner=(\d+)$")


def host_name(owner_pid: int, token: str, index: int) -> str:
    """A host's namespace, and its CPU cgroup: ``chs-{owner}-{token}-h{index}``."""
    return f"{PREFIX}-{owner_pid}-{token}-h{index}"


def alias(owner_pid: int) -> str:
    """A link's ifalias and a firewall rule's comment."""
    return f"{PREFIX} owner={owner_pid}"


def owner_of(name: str) -> int | None:
    """The owner pid in a host's name; None for a name that is not ours."""
    match = HOST_RE.match(name)
    return int(match.group(1)) if match else None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, someone else's
        return True
    return True
