"""Which NUMA nodes one workload's cores come from when no single node holds them (issue 25).

``choose_local`` is what ``cmk isolate`` runs with ``CMK_NUM_CORES``; its
items here are ``(name, node, l3)`` in hand-out order. Every expected choice
was worked out by hand from the distance table written beside it.
"""

from __future__ import annotations

import itertools
import os

import pytest
from cpupools.core.errors import TopologyError
from cpupools.hardware import locality
from cpupools.hardware.locality import CpuLocality, choose_local, nearest_nodes
from hypothesis import given, settings
from hypothesis import strategies as st


def table(rows):
    """``distance(a, b)`` over a list of rows (row ``a``, column ``b``)."""
    return lambda a, b: rows[a][b]


def pick(items, count, distance=None):
    return "".join(i[0] for i in choose_local(items, count, lambda i: i[1], lambda i: i[2], distance))


# Two sockets, four nodes numbered across the sockets, as some firmware does:
# nodes 0 and 2 on socket 0, nodes 1 and 3 on socket 1.
INTERLEAVED = [
    [10, 32, 12, 32],
    [32, 10, 32, 12],
    [12, 32, 10, 32],
    [32, 12, 32, 10],
]


def test_the_nearest_node_not_the_next_numbered_one():
    # Packed hand-out order: four lists per node, node 0 first; one L3 per node.
    items = [(chr(ord("a") + i), i // 4, i // 4) for i in range(16)]
    # Six lists: no node holds them; two nodes do. Before distances were read
    # it took node 0 and the next in order, node 1, on the other socket
    # (distance 32); node 2 is on node 0's socket (12).
    assert pick(items, 6) == "abcdef"
    assert pick(items, 6, table(INTERLEAVED)) == "abcdij"
    # Ten lists need three nodes: every set of three spans both sockets
    # (farthest pair 32) and has one pair at 12 (sum 76), so hand-out order
    # decides: nodes 0, 1, 2, as before.
    assert pick(items, 10, table(INTERLEAVED)) == pick(items, 10) == "abcdefghij"


def test_the_nearest_node_not_the_largest():
    # Node 0 has three free lists, node 1 (other socket) four, node 2 (node
    # 0's socket) three. Five lists: the largest-first rule took node 1 whole
    # and one list of node 0; the nearest pair is {0, 2} (12), which holds 6.
    items = [("a", 0, 0), ("b", 0, 0), ("c", 0, 0), ("d", 1, 1), ("e", 1, 1), ("f", 1, 1), ("g", 1, 1)]
    items += [("h", 2, 2), ("i", 2, 2), ("j", 2, 2)]
    assert pick(items, 5) == "adefg"
    # Best fit within the chosen nodes: node 0 whole (first of two equal
    # nodes), the remaining two from node 2.
    assert pick(items, 5, table(INTERLEAVED)) == "abchi"


def test_the_sum_decides_when_the_farthest_pairs_tie():
    # One socket, four nodes (NPS4-like), each with one free list; three lists
    # need three nodes. Every set of three has a pair at 12; the sums are
    # {0,1,2} 36, {0,1,3} 35, {0,2,3} 35, {1,2,3} 34: nodes 1, 2, 3 although
    # node 0 comes first in hand-out order.
    rows = [
        [10, 12, 12, 12],
        [12, 10, 12, 11],
        [12, 12, 10, 11],
        [12, 11, 11, 10],
    ]
    items = [("a", 0, 0), ("b", 1, 1), ("c", 2, 2), ("d", 3, 3)]
    assert pick(items, 3) == "abc"
    assert pick(items, 3, table(rows)) == "bcd"
    # An asymmetric table counts a pair at its larger entry: 0->3 is 11 but
    # 3->0 is 13, so {0,3} is farther than every other pair (12 both ways),
    # and of those hand-out order (0, 3, 1, 2) takes {0,1}.
    rows = [
        [10, 12, 12, 11],
        [12, 10, 12, 12],
        [12, 12, 10, 12],
        [13, 12, 12, 10],
    ]
    assert nearest_nodes({0: 1, 3: 1, 1: 1, 2: 1}, 2, table(rows)) == [0, 1]
    rows[3][0] = 11
    assert nearest_nodes({0: 1, 3: 1, 1: 1, 2: 1}, 2, table(rows)) == [0, 3]


def test_unknown_distances_keep_the_hand_out_rule():
    items = [(chr(ord("a") + i), i // 4, i // 4) for i in range(16)]
    rows = [row[:] for row in INTERLEAVED]
    unknown = lambda a, b: None if a == 3 else rows[a][b]  # noqa: E731 - one row missing
    assert pick(items, 6, unknown) == pick(items, 6) == "abcdef"


def test_dozens_of_nodes_grow_the_nearest_set():
    # 8 sockets of 4 nodes, two free lists each: 17 lists need 9 nodes, and
    # C(32, 9) sets are too many to try: sets are grown from each node. From
    # node 0: its socket's three (12), then a whole second socket (each node
    # added is 32 from the first four and 12 from those of its socket already
    # taken), then one node of a third.
    rows = [[10 if a == b else 12 if a // 4 == b // 4 else 32 for b in range(32)] for a in range(32)]
    sizes = dict.fromkeys(range(32), 2)
    assert locality._binomial(32, 9) > locality.EXACT_LIMIT
    assert nearest_nodes(sizes, 17, table(rows)) == [*range(9)]
    # Uneven sizes: the grown set still has as few nodes as any (node 5 holds 9).
    sizes[5] = 9
    chosen = nearest_nodes(sizes, 17, table(rows))
    assert len(chosen) == 5 and 5 in chosen and sum(sizes[n] for n in chosen) >= 17
    assert {n // 4 for n in chosen} == {0, 1}, chosen  # node 5's socket and one other, not three


@st.composite
def node_sets(draw):
    n = draw(st.integers(2, 7))
    sizes = {node: draw(st.integers(1, 4)) for node in draw(st.permutations(range(n)))}
    rows = [[10] * n for _ in range(n)]
    for a, b in itertools.combinations(range(n), 2):
        rows[a][b] = draw(st.sampled_from([11, 12, 16, 21, 32]))
        rows[b][a] = draw(st.sampled_from([rows[a][b], 10 + rows[a][b]]))
    total = sum(sizes.values())
    count = draw(st.integers(max(sizes.values()) + 1, total)) if total > max(sizes.values()) else total
    return sizes, rows, count


@settings(max_examples=300, deadline=None)
@given(node_sets())
def test_the_chosen_nodes_are_the_fewest_then_the_nearest(case):
    sizes, rows, count = case
    chosen = nearest_nodes(sizes, count, table(rows))
    order = list(sizes)
    assert chosen == [n for n in order if n in chosen], "hand-out order kept"
    assert sum(sizes[n] for n in chosen) >= count
    fewest = min(
        k
        for k in range(1, len(order) + 1)
        if any(sum(sizes[n] for n in c) >= count for c in itertools.combinations(order, k))
    )
    assert len(chosen) == fewest

    def cost(nodes):
        spans = [max(rows[a][b], rows[b][a]) for a, b in itertools.combinations(nodes, 2)] or [0]
        return max(spans), sum(spans)

    others = [c for c in itertools.combinations(order, fewest) if sum(sizes[n] for n in c) >= count]
    assert cost(chosen) == min(cost(c) for c in others)


def renumber(root, rows):
    """Write ``rows`` as the distance table of the tree under ``root``."""
    for node, row in enumerate(rows):
        path = os.path.join(root, f"sys/devices/system/node/node{node}/distance")
        with open(path, "w") as handle:
            handle.write(" ".join(map(str, row)) + "\n")


def test_distance_rows_are_read_once_and_only_when_asked(make_root, monkeypatch):
    root = str(make_root("1s32c-nps4-noid"))
    renumber(root, [[10, 12, 11, 12], [12, 10, 12, 11], [11, 12, 10, 12], [12, 11, 12, 10]])
    opened = []
    real = locality.read_text
    monkeypatch.setattr(locality, "read_text", lambda path: opened.append(path) or real(path))
    where = CpuLocality(root)
    assert where.node(0) == 0
    assert not [p for p in opened if p.endswith("distance")]
    assert (where.distance(0, 2), where.distance(2, 0), where.distance(1, 3), where.distance(0, 0)) == (11, 11, 11, 10)
    assert (where.distance(0, 1), where.distance(3, 1)) == (12, 11)
    assert sorted(p.rsplit("/", 2)[1] for p in opened if p.endswith("distance")) == ["node0", "node1", "node2", "node3"]


@pytest.mark.parametrize(
    ("text", "why"),
    [(None, "no file"), ("10 12 11\n", "three entries for four nodes"), ("10 x 11 12\n", "not numbers")],
)
def test_an_unreadable_row_is_unknown(make_root, text, why):
    root = str(make_root("1s32c-nps4-noid"))
    path = os.path.join(root, "sys/devices/system/node/node2/distance")
    if text is None:
        os.remove(path)
    else:
        with open(path, "w") as handle:
            handle.write(text)
    where = CpuLocality(root)
    assert where.distance(0, 1) == 12, why
    assert (where.distance(2, 0), where.distance(0, 7)) == (None, None), why


def test_read_text_reads_a_whole_file_says_none_for_a_missing_one_and_refuses_a_directory(tmp_path):
    big = tmp_path / "big"
    text = "".join(f"{i},\n" for i in range(30000))  # past one read (64 KiB) and not a page multiple
    big.write_text(text)
    assert locality.read_text(str(big)) == text
    page = tmp_path / "page"
    page.write_bytes(b"7" * 4096)  # exactly a page, as a full sysfs attribute reads: the next read ends it
    assert locality.read_text(str(page)) == "7" * 4096
    crlf = tmp_path / "crlf"
    crlf.write_bytes(b"0-3\r\n4\r")
    assert locality.read_text(str(crlf)) == "0-3\n4\n"
    assert locality.read_text(str(tmp_path / "missing")) is None
    assert locality.read_text(str(big / "below-a-file")) is None
    with pytest.raises(TopologyError, match=r"cannot read .*: Is a directory"):
        locality.read_text(str(tmp_path))
