"""tests/dist_utils.py's groups against another process taking ports: CI failed once with
EADDRINUSE when the port run_distributed had picked free was bound by another test's process
before rank 0 bound it (2026-12-05)."""

from __future__ import annotations

import socket

import torch.distributed as dist

from tests import dist_utils


def _world(rank, world_size):
    return dist.get_world_size(), rank


def test_a_port_taken_after_it_was_picked_free_does_not_fail_the_group(monkeypatch):
    taken: list[socket.socket] = []

    def picked_then_taken() -> int:
        # another process binds and listens on the port the moment after it was found free
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken.append(s)
        return s.getsockname()[1]

    monkeypatch.setattr(dist_utils, "free_port", picked_then_taken)
    try:
        assert dist_utils.run_distributed(_world, 2, timeout_s=60) == [(2, 0), (2, 1)]
    finally:
        for s in taken:
            s.close()


def test_a_single_rank_group_needs_no_port():
    dist_utils.init_single_rank_group()
    try:
        assert dist.get_world_size() == 1 and dist.get_rank() == 0
    finally:
        dist.destroy_process_group()
