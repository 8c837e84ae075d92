"""The one cpulist implementation: parse, format, isolcpus flags, cmdline."""

from __future__ import annotations

import pytest
from cpupools.core.cpulist import (
    format_cmk_cpulist,
    format_cpulist,
    format_cpumask,
    format_isolcpus,
    parse_cpulist,
    parse_isolcpus,
    split_cmdline,
)
from cpupools.core.errors import CpulistError
from hypothesis import given
from hypothesis import strategies as st


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("", []),
        ("\n", []),
        ("5", [5]),
        ("0-3,8", [0, 1, 2, 3, 8]),
        (" 0-1 , 3\n", [0, 1, 3]),
        ("3,1,2,1", [1, 2, 3]),
        ("0-31:2/8", [0, 1, 8, 9, 16, 17, 24, 25]),
        ("0-1023:2/256", [0, 1, 256, 257, 512, 513, 768, 769]),
        ("2-9:1/3", [2, 5, 8]),
    ],
)
def test_parse(text, cpus):
    assert parse_cpulist(text) == cpus


def test_parse_last_cpu_needs_count():
    assert parse_cpulist("4-N", nr_cpus=8) == [4, 5, 6, 7]
    with pytest.raises(CpulistError, match="needs the number of CPUs"):
        parse_cpulist("4-N")


def test_parse_accepts_yaml_lists():
    assert parse_cpulist([3, 1, "5-6"]) == [1, 3, 5, 6]
    assert parse_cpulist(7) == [7]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1-", r"malformed cpulist '1-': item 1 '1-': '' is not a CPU number"),
        ("a", r"'a' is not a CPU number"),
        ("3-1", r"range 3-1 runs backwards"),
        ("1,,2", r"item 2 is empty"),
        ("0-7:3/2", r"stride 3/2 needs 0 < used <= group"),
        ("5:1/2", r"a stride needs a range"),
        ("0-7:2", r"stride must be <used>/<group>"),
        ("-2", r"'' is not a CPU number"),
    ],
)
def test_parse_errors_say_what_and_where(text, message):
    with pytest.raises(CpulistError, match=message):
        parse_cpulist(text)


def test_parse_rejects_non_numbers_in_lists():
    with pytest.raises(CpulistError, match="is not a CPU number"):
        parse_cpulist([1, -3])
    with pytest.raises(CpulistError, match="is not a cpulist"):
        parse_cpulist(True)


def test_format_forms():
    cpus = [8, 0, 1, 2, 3, 10, 11]
    assert format_cpulist(cpus) == "0-3,8,10-11"
    assert format_cmk_cpulist(cpus) == "0,1,2,3,8,10,11"
    assert format_cpulist([]) == ""
    assert format_cpumask([0, 11]) == "801"
    assert format_cpumask([0, 1, 2, 3, 64]) == "1000000000000000F"


@given(st.sets(st.integers(min_value=0, max_value=2048)))
def test_format_parse_round_trip(cpus):
    assert parse_cpulist(format_cpulist(cpus)) == sorted(cpus)
    assert parse_cpulist(format_cmk_cpulist(cpus)) == sorted(cpus)
    assert format_cpulist(parse_cpulist(format_cpulist(cpus))) == format_cpulist(cpus)


@pytest.mark.parametrize(
    ("value", "flags", "cpus"),
    [
        ("2-5", [], [2, 3, 4, 5]),
        ("managed_irq,domain,2-5", ["managed_irq", "domain"], [2, 3, 4, 5]),
        ("nohz,domain,1-3,9", ["nohz", "domain"], [1, 2, 3, 9]),
        ("domain,domain,1", ["domain"], [1]),
        ("domain,0-31:2/8", ["domain"], [0, 1, 8, 9, 16, 17, 24, 25]),
    ],
)
def test_isolcpus_with_flags(value, flags, cpus):
    assert parse_isolcpus(value) == (flags, cpus)


def test_isolcpus_errors():
    with pytest.raises(CpulistError, match="unknown flag 'bogus'"):
        parse_isolcpus("bogus,1-3")
    with pytest.raises(CpulistError, match="no CPU list"):
        parse_isolcpus("domain,")
    with pytest.raises(CpulistError, match="no CPU list"):
        parse_isolcpus("")


def test_format_isolcpus():
    assert format_isolcpus(["managed_irq", "domain"], [3, 1, 2, 7]) == "managed_irq,domain,1-3,7"
    with pytest.raises(CpulistError, match="unknown isolcpus flag 'fast'"):
        format_isolcpus(["fast"], [1])


def test_split_cmdline_handles_quotes_and_bare_words():
    text = 'BOOT_IMAGE=/vmlinuz ro quiet isolcpus=domain,2-5 foo="a b=c" nohz_full=2-5\n'
    assert split_cmdline(text) == [
        ("BOOT_IMAGE", "/vmlinuz"),
        ("ro", None),
        ("quiet", None),
        ("isolcpus", "domain,2-5"),
        ("foo", "a b=c"),
        ("nohz_full", "2-5"),
    ]
