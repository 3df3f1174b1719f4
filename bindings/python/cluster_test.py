"""Cluster calls of the kvtier Python package against real kvtierd processes: outside a
cluster, and two nodes on loopback copying a prompt's blocks, a range and snapshots between them,
then draining one into the other.

Fixtures: conftest.py; helpers shared with the other *_test.py: testlib/kvtier_test_helpers.py.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import kvtier
from kvtier.testing import Daemon

from kvtier_test_helpers import packed, prompt


def test_cluster_calls_outside_a_cluster(client: kvtier.Client) -> None:
    assert client.cluster() == ("", [])
    with pytest.raises(kvtier.InvalidArgument):  # not a cluster member
        client.drain(1, 1)


def test_cluster_calls_move_blocks_and_snapshots_between_nodes(
    two_nodes: list[Daemon], layout: kvtier.Layout, seq: str
) -> None:
    a, b = two_nodes
    with kvtier.Client(a.socket) as ca, kvtier.Client(b.socket) as cb:
        deadline = time.monotonic() + 15
        while ca.stats()["cluster"]["members_up"] < 2 or cb.stats()["cluster"]["members_up"] < 2:
            assert time.monotonic() < deadline, "the two nodes did not meet"
            time.sleep(0.02)
        me, members = ca.cluster()
        assert me == "n0"
        assert sorted((m.node_id, m.up, m.self) for m in members) == [
            ("n0", True, True), ("n1", True, False)]
        sa, sb = ca.open(layout), cb.open(layout)
        tokens, kv = prompt(48), packed(layout, 48, seed=11)
        sa.put(seq, 0, tokens, kv)
        # A prompt's blocks copied to n1: n1 then hits them without asking the cluster.
        moved = sa.copy_prompt("n1", tokens)
        assert (moved.blocks, moved.held, moved.dropped) == (3, 3, 0)
        with sb.lookup(tokens, remote="local") as hit:
            assert hit.matched_tokens == 48
            np.testing.assert_array_equal(hit.copy_to(), kv)
        ranged = sa.copy_range("n1", seq, 0, 32)
        assert (ranged.blocks, ranged.held) == (2, 2)
        # A snapshot of n0 restored on n1 (pulled by node name), and copied there as its own.
        snap = sa.snapshot(seq)
        assert snap.node == "n0"
        sb.restore(seq + "-b", snap.id, 48, node="n0")
        with sb.get(seq + "-b") as h:
            np.testing.assert_array_equal(h.copy_to(), kv)
        copied = sb.copy_snapshot("n0", snap.id)
        assert (copied.start, copied.end, copied.node) == (0, 48, "n1")
        sb.drop_snapshot(copied.id)
        # Bad targets are typed errors and change nothing.
        with pytest.raises(kvtier.Error):
            sa.copy_prompt("no-such-node", tokens)
        with pytest.raises(kvtier.InvalidArgument):
            sa.copy_keys("n1", [b"short"])
        assert sa.snapshot_info(snap.id).end == 48
        # Draining n0 hands its snapshot to n1 and drops it here.
        step = ca.drain(8, 64)
        for _ in range(20):
            if step.snapshots_left == 0 and step.blocks_left == 0:
                break
            step = ca.drain(8, 64)
        assert (step.snapshots_left, step.blocks_left) == (0, 0)
        with pytest.raises(kvtier.NotFound):
            sa.snapshot_info(snap.id)
