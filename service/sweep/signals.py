"""SIGINT and SIGTERM as one path: a KeyboardInterrupt in the main thread, raised once.

Tune's own SIGINT handler would wind the experiment down quietly and return as if it had
finished; with this one both signals end the trials' runs KILLED, so ``--resume`` runs them again.
A command that stops after a signal (``python -m service.sweep``: :func:`stop_once`) ignores every
later one, to its exit: a second Ctrl-C while the interrupted sweep closed its runs, wrote its report
or printed its table once raised KeyboardInterrupt there (a traceback, no exit 130, no --resume hint).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import time

log = logging.getLogger("service.sweep")

_once = {"stop_once": False}


def stop_once() -> None:
    """From now on, once a signal has stopped a :func:`signals_raise_keyboard_interrupt` block,
    SIGINT and SIGTERM stay ignored after it (this process is on its way out: it finishes that
    way, whatever else arrives). For a command's main(), not a library caller."""
    _once["stop_once"] = True


@contextlib.contextmanager
def signals_raise_keyboard_interrupt():
    """SIGINT and SIGTERM raise KeyboardInterrupt in the main thread (once: further signals
    are ignored until the block has cleaned up, so the runs get closed). Yields a dict whose
    ``at_ms`` is the signal's time (epoch ms), None until one came."""
    watched = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.getsignal(s) for s in watched}
    received: dict[str, int | None] = {"at_ms": None}

    def handler(signum, frame):
        received["at_ms"] = int(time.time() * 1000)
        for s in watched:
            signal.signal(s, signal.SIG_IGN)
        log.warning("received %s: stopping", signal.Signals(signum).name)
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for s in watched:
        signal.signal(s, handler)
    try:
        yield received
    finally:
        if received["at_ms"] is None or not _once["stop_once"]:
            for s, h in previous.items():
                signal.signal(s, h)
        # else: the handler left both ignored, and they stay so to the exit
