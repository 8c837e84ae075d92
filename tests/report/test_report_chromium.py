"""The HTML report in a real headless Chromium: what a person would see.

Renders the page to a PNG and counts the pixels of each pool colour (decoded
here with zlib and struct), and reads the DOM Chromium built (``--dump-dom``).
Needs Debian's ``chromium`` package; skipped with the reason when absent.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import zlib
from collections import Counter
from pathlib import Path

import pytest
from cpupools.core.cpulist import parse_cpulist
from cpupools.report.page import COLOURS, PENDING_COLOUR
from report_page import render_html

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="needs headless Chromium: apt-get install -y chromium"),
]
WIDTH, HEIGHT = 1400, 2000
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--force-device-scale-factor=1",
]


def chromium(tmp_path: Path, page: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / "profile"
    cmd = [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args, page.as_uri()]
    env = dict(os.environ, HOME=str(tmp_path))
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True, env=env, cwd=tmp_path)


def screenshot(tmp_path: Path, html: str, name: str = "report") -> Path:
    page = tmp_path / f"{name}.html"
    page.write_text(html, encoding="utf-8")
    png = tmp_path / f"{name}.png"
    chromium(tmp_path, page, f"--screenshot={png}", f"--window-size={WIDTH},{HEIGHT}")
    assert png.exists(), "chromium wrote no screenshot"
    return png


def dump_dom(tmp_path: Path, html: str) -> str:
    page = tmp_path / "dom.html"
    page.write_text(html, encoding="utf-8")
    return chromium(tmp_path, page, "--dump-dom").stdout


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def decode_png(path: Path) -> tuple[int, int, list[bytes]]:
    """Width, height and RGB rows of an 8-bit, non-interlaced RGB/RGBA PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, []
    width = height = channels = 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and interlace == 0 and colour in (2, 6), (depth, colour, interlace)
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    raw = zlib.decompress(b"".join(idat))
    stride = width * channels
    rows: list[bytes] = []
    prev = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        if kind == 1:
            for i in range(channels, stride):
                line[i] = (line[i] + line[i - channels]) & 0xFF
        elif kind == 2:
            line = bytearray((x + p) & 0xFF for x, p in zip(line, prev, strict=True))
        elif kind == 3:
            for i in range(stride):
                left = line[i - channels] if i >= channels else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 0xFF
        elif kind == 4:
            for i in range(stride):
                left = line[i - channels] if i >= channels else 0
                upleft = prev[i - channels] if i >= channels else 0
                line[i] = (line[i] + _paeth(left, prev[i], upleft)) & 0xFF
        prev = line
        rows.append(bytes(line) if channels == 3 else bytes(b for i, b in enumerate(line) if i % 4 != 3))
    return width, height, rows


def colour_counts(path: Path) -> Counter:
    width, height, rows = decode_png(path)
    assert (width, height) == (WIDTH, HEIGHT)
    counts: Counter = Counter()
    for row in rows:
        for x in range(0, len(row), 3):
            counts[row[x : x + 3]] += 1
    return counts


def rgb(hex_colour: str) -> bytes:
    return bytes.fromhex(hex_colour.lstrip("#"))


@pytest.fixture
def node(host_input):
    """2 sockets x 22 cores SMT2: 12 exclusive, 4 shared, 72 infra threads; the kernel already in line."""
    request = {"num_exclusive_cores": 6, "num_shared_cores": 2, "exclusive_mode": "spread"}
    plan = host_input("2s22c-smt2", request)["plan"]
    return host_input(
        "2s22c-smt2",
        request,
        host="node-1",
        spec={"isolated": plan["isolated_cpus"]},
        kernel={"reboot_required": False},
    )


def test_pool_colours_fill_the_picture_in_the_planned_proportions(tmp_path, node):
    png = screenshot(tmp_path, render_html([node]))
    counts = colour_counts(png)
    area = {pool: counts[rgb(COLOURS[pool][0])] for pool in ("exclusive", "shared", "infra")}
    threads = {pool: len(parse_cpulist(node["plan"]["pool_cpus"][pool])) for pool in area}
    assert threads == {"exclusive": 12, "shared": 4, "infra": 72}
    # Each thread is a solid cell of its pool's colour: a person sees 72 grey cells, 12 blue, 4 green.
    per_thread = {pool: area[pool] / threads[pool] for pool in area}
    assert all(px > 300 for px in per_thread.values()), per_thread  # cells are big enough to see
    lo, hi = min(per_thread.values()), max(per_thread.values())
    assert hi / lo < 1.35, per_thread  # same size per thread: the proportions are the plan's
    # Colours of what this node does not have appear at most in the legend (one swatch each).
    for absent in ("stranded", "exclusive-non-isolcpus"):
        assert counts[rgb(COLOURS[absent][0])] < per_thread["infra"], absent


def test_pending_isolation_is_visible(tmp_path, node, host_input):
    calm = colour_counts(screenshot(tmp_path, render_html([node]), "calm"))
    pending = host_input(
        "2s22c-smt2",
        {"num_exclusive_cores": 6, "num_shared_cores": 2, "exclusive_mode": "spread"},
        host="node-1",
        kernel={"reboot_required": True},
    )
    busy = colour_counts(screenshot(tmp_path, render_html([pending]), "pending"))
    orange = rgb(PENDING_COLOUR)
    # 16 threads get an orange frame (3 px of a 34x24 cell): hundreds of pixels more than the legend alone.
    assert busy[orange] - calm[orange] > 16 * 150, (calm[orange], busy[orange])
    # The hatching lightens part of each pending cell, so less solid exclusive blue shows.
    blue = rgb(COLOURS["exclusive"][0])
    assert busy[blue] < calm[blue] * 0.8


def test_legend_and_tables_are_in_the_dom(tmp_path, node):
    dom = dump_dom(tmp_path, render_html([node, {"host": "bare-<host>"}]))
    for text in (
        "exclusive: whole cores handed to one process at a time, isolated",
        "shared: cores shared by the processes of the shared pool, isolated",
        "infra: the host, Kubernetes and everything else",
        "fleet: 2 hosts; 1 as planned; 1 unplanned (bare-&lt;host&gt;)",
        "1-3,45-47",
        "topology not collected",
        # the modes and the runtime in an operator's words
        "Modes: generate: cpupools chose the isolated CPUs; adopt: kept the isolcpus set by hand, pools as CMK "
        "computed them.",
        "<th>Mode</th><td>generate: cpupools chose the isolated CPUs; exclusive cores spread over the sockets and "
        "NUMA nodes, shared cores packed (socket 0 first)</td>",
        "<th>Runtime</th><td>cmk: cmk isolate hands out the exclusive pools",
    ):
        assert text in dom, text
    assert dom.count('class="t c-') >= 88
    # The legend explains what the pictures show, and nothing else: no stranded, offline or unplanned CPU,
    # no pending change and no live task on this node.
    legend = dom[dom.index('id="legend"') : dom.index("</div>", dom.index('id="legend"'))]
    for absent in ("stranded:", "offline:", "unplanned:", "exclusive-non-isolcpus:", "orange frame", "live task"):
        assert absent not in legend, absent


def test_cpu_numbers_stay_readable_on_hatched_cells(tmp_path, host_input):
    """The number of a cell isolated at next boot sits on a solid chip of its pool's colour, not on the hatching."""
    pending = host_input(
        "2s22c-smt2",
        {"num_exclusive_cores": 6, "num_shared_cores": 2, "exclusive_mode": "spread"},
        host="node-1",
        kernel={"reboot_required": True},
    )
    probe = (
        "<script>for (const cell of document.querySelectorAll('.p-isolate')) {"
        "const chip = cell.querySelector('span'); const s = chip && getComputedStyle(chip);"
        "cell.dataset.chip = s ? [s.backgroundColor, s.backgroundImage, s.color].join('|') : 'none';}</script>"
    )
    dom = dump_dom(tmp_path, render_html([pending]).replace("</body>", probe + "</body>"))
    cells = re.findall(r'class="t c-([a-z-]+) p-isolate" title="[^"]*" data-chip="([^"]*)"', dom)  # the picture's
    assert len(cells) == 16, cells  # 12 exclusive and 4 shared threads wait for the next boot
    assert "orange frame: isolated at next boot" in dom
    for pool, chip in cells:
        bg, fg = (tuple(bytes.fromhex(c.lstrip("#"))) for c in COLOURS[pool])
        assert chip == f"rgb{bg}|none|rgb{fg}".replace(",", ", ").replace("  ", " "), (pool, chip)


def test_numa_and_l3_boxes_keep_every_cell_whole(tmp_path, host_input):
    """4 NUMA nodes of 2 L3 domains each: the nesting is visible and no cell shrinks or disappears."""
    request = {"num_exclusive_cores": 12, "num_shared_cores": 4}
    iso = host_input("1s64c-smt2-nps4", request)["plan"]["isolated_cpus"]
    entry = host_input(
        "1s64c-smt2-nps4",
        request,
        host="epyc",
        spec={"isolated": iso},
        numa_facts=True,
        kernel={"reboot_required": False},
    )
    entry["topology"]["hugepages"] = {"0": {"1G": {"total": 2, "free": 2}}}
    entry["hugepages"] = [{"size": "1G", "count": 4, "numa_node": 0}]
    page = render_html([entry])
    counts = colour_counts(screenshot(tmp_path, page))
    area = {pool: counts[rgb(COLOURS[pool][0])] for pool in ("exclusive", "shared", "infra")}
    per_thread = {pool: area[pool] / n for pool, n in {"exclusive": 24, "shared": 8, "infra": 96}.items()}
    assert all(px > 300 for px in per_thread.values()), per_thread
    assert max(per_thread.values()) / min(per_thread.values()) < 1.35, per_thread
    dom = dump_dom(tmp_path, page)
    for text in (
        "socket 0 · 64 cores · NUMA nodes 0-3 · L3 domains 0-7",
        "NUMA node 3 · 16 cores · L3 6-7",
        "L3 7 · 8 cores",
        "L3 domains (8)",
        "short by 2",
    ):
        assert text in dom, text
    assert dom.count('class="l3"') == 8 and dom.count('class="numa"') == 4


def test_latency_colours_win_over_the_pool_and_the_chart_is_drawn(tmp_path, host_input):
    """A measured CPU shows its latency step's colour with its pool as a stripe; the inline SVG chart renders."""
    from cpupools.report.report_verify import LATENCY_SCALE
    from verify_results import noisy

    request = {"num_exclusive_cores": 2, "num_shared_cores": 1}
    plain = host_input("1s8c-adjacent", request, host="node-1")
    page = render_html([dict(plain, verify=noisy())])
    probe = (
        "<script>for (const cell of document.querySelectorAll('.node .t')) {"
        "const s = getComputedStyle(cell); cell.dataset.seen = [s.backgroundColor, s.boxShadow].join('|');}</script>"
    )
    dom = dump_dom(tmp_path, page.replace("</body>", probe + "</body>"))
    seen = dict(re.findall(r'title="CPU (\d+):[^"]*" data-seen="([^"]*)"', dom))

    def css(hex_colour: str) -> str:
        return "rgb({}, {}, {})".format(*rgb(hex_colour))

    assert seen["5"].startswith(css(LATENCY_SCALE[4][1]) + "|")  # 180 µs: the darkest step, not the pool's blue
    assert css(COLOURS["exclusive"][0]) in seen["5"].split("|")[1]  # the pool: the stripe along the bottom
    assert seen["0"].startswith(css(LATENCY_SCALE[2][1]) + "|") and css(COLOURS["infra"][0]) in seen["0"]
    assert seen["6"] == css(COLOURS["shared"][0]) + "|none"  # not measured: as before
    # The chart: CPU 5's bar is 378 x 12 px of the darkest step; the cell, the legend's and the table's swatches
    # of that colour are under 1,100 px together, so the count proves the bar was drawn.
    dark = colour_counts(screenshot(tmp_path, page, "verified"))[rgb(LATENCY_SCALE[4][1])]
    assert dark > 378 * 12, dark
