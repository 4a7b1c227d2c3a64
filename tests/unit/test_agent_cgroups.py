"""The agent's cgroup layouts and files (ecm_agent/cgroups.py): pure logic, no cgroups."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ecm_agent.cgroups import (
    CPU_PERIOD_USEC,
    MIN_CPU_QUOTA_USEC,
    Limits,
    NoContainment,
    Sample,
    Write,
    check_parent_setting,
    cpu_millis_between,
    cpu_quota_usec,
    limit_writes,
    oom_reason,
    parse_keyed,
    parse_mountinfo,
    parse_proc_cgroup,
    plan_layout,
)

# This project's machines: v1 controllers, each in its own hierarchy, and a v2 hierarchy
# without controllers beside them (systemd's "hybrid" layout).
HYBRID_MOUNTINFO = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
HYBRID_SELF = """\
9:name=systemd:/
8:pids:/
6:freezer:/
4:memory:/process_api/abc
2:cpuacct:/
1:cpu:/
0::/
"""
# A systemd host on cgroup v2 only: the agent's unit delegated (Delegate=yes).
UNIFIED_MOUNTINFO = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
UNIFIED_SELF = "0::/system.slice/labelrm-agent.service\n"
ALL_V2 = frozenset({"cpuset", "cpu", "io", "memory", "pids"})


def _offers(controllers: frozenset[str]) -> Callable[[Path], frozenset[str]]:
    """What v2 cgroup directories offer, for plan_layout (no files read)."""
    return lambda _directory: controllers


def test_the_hybrid_layout_of_this_projects_machines_is_v1_under_the_agents_own_cgroups() -> None:
    mounts = parse_mountinfo(HYBRID_MOUNTINFO)
    assert {(m.version, str(m.path)) for m in mounts} == {
        (1, "/sys/fs/cgroup/cpu"),
        (1, "/sys/fs/cgroup/cpuacct"),
        (1, "/sys/fs/cgroup/memory"),
        (1, "/sys/fs/cgroup/freezer"),
        (1, "/sys/fs/cgroup/pids"),
        (2, "/sys/fs/cgroup/unified"),
    }  # cpuset and name=systemd carry nothing the agent uses
    own = parse_proc_cgroup(HYBRID_SELF)
    assert own["memory"] == "/process_api/abc" and own[""] == "/"
    layout = plan_layout(mounts, own, Path("/sys/fs/cgroup"), "labelrm-a1", _offers(frozenset()))
    assert layout.version == 1 and layout.mode == "cgroup-v1"
    assert layout.controllers == ("memory", "cpu", "cpuacct", "pids", "freezer")
    assert layout.hierarchy_of("memory").parent == Path(
        "/sys/fs/cgroup/memory/process_api/abc/labelrm-a1"
    )
    assert layout.hierarchy_of("cpu").parent == Path("/sys/fs/cgroup/cpu/labelrm-a1")
    assert layout.parents() == ("/process_api/abc/labelrm-a1", "/labelrm-a1")
    assert layout.describe() == (
        "cgroup-v1 (memory,cpu,cpuacct,pids,freezer) under /process_api/abc/labelrm-a1, /labelrm-a1"
    )
    # An absolute parent is the same path in every hierarchy.
    absolute = plan_layout(
        mounts, own, Path("/sys/fs/cgroup"), "/labelrm/a1", _offers(frozenset({"hugetlb"}))
    )
    assert absolute.version == 1  # the v2 hierarchy there has no controllers to offer
    assert absolute.parents() == ("/labelrm/a1",)


def test_combined_v1_controllers_share_one_directory() -> None:
    text = (
        "1 0 0:1 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
        "2 0 0:2 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
        "3 0 0:3 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n"
        "4 0 0:4 / /sys/fs/cgroup/freezer rw - cgroup cgroup rw,freezer\n"
    )
    layout = plan_layout(parse_mountinfo(text), {}, Path("/sys/fs/cgroup"), "x", _offers(ALL_V2))
    assert len(layout.hierarchies) == 4
    cpu = layout.hierarchy_of("cpuacct")
    assert cpu is layout.hierarchy_of("cpu") and cpu.controllers == ("cpu", "cpuacct")
    assert cpu.parent == Path("/sys/fs/cgroup/cpu,cpuacct/x")


def test_a_delegated_v2_subtree_is_used_and_the_agent_leaves_its_own_cgroup() -> None:
    mounts = parse_mountinfo(UNIFIED_MOUNTINFO)
    own = parse_proc_cgroup(UNIFIED_SELF)
    layout = plan_layout(mounts, own, Path("/sys/fs/cgroup"), "engineconns", _offers(ALL_V2))
    assert layout.version == 2 and layout.controllers == ("memory", "cpu", "pids")
    service = Path("/sys/fs/cgroup/system.slice/labelrm-agent.service")
    assert layout.hierarchies[0].parent == service / "engineconns"
    assert layout.agent_leaf == service / "ecm-agent"
    # An absolute parent (a slice of its own): the agent stays where it is.
    elsewhere = plan_layout(mounts, own, Path("/sys/fs/cgroup"), "/labelrm.slice", _offers(ALL_V2))
    assert elsewhere.agent_leaf is None
    assert elsewhere.hierarchies[0].parent == Path("/sys/fs/cgroup/labelrm.slice")


def test_no_layout_says_why() -> None:
    mounts = parse_mountinfo(UNIFIED_MOUNTINFO)
    own = parse_proc_cgroup(UNIFIED_SELF)
    with pytest.raises(NoContainment) as undelegated:
        plan_layout(mounts, own, Path("/sys/fs/cgroup"), "x", _offers(frozenset({"io"})))
    assert "memory, cpu, pids not available" in str(undelegated.value)
    assert "Delegate=yes" in str(undelegated.value)
    assert "cgroup v1: memory, cpu, cpuacct, pids, freezer not mounted" in str(undelegated.value)
    with pytest.raises(NoContainment) as nothing:
        plan_layout(mounts, own, Path("/tmp/not-cgroups"), "x", _offers(ALL_V2))
    assert str(nothing.value) == "no cgroup hierarchy is mounted under /tmp/not-cgroups"
    no_freezer = "\n".join(line for line in HYBRID_MOUNTINFO.splitlines() if "freezer" not in line)
    with pytest.raises(NoContainment) as partial:
        plan_layout(
            parse_mountinfo(no_freezer), parse_proc_cgroup(HYBRID_SELF),
            Path("/sys/fs/cgroup"), "x", _offers(frozenset()),
        )  # fmt: skip
    assert "cgroup v1: freezer not mounted" in str(partial.value)


def test_in_a_container_cgroups_are_found_below_the_mounts_root() -> None:
    text = "5 1 0:5 /docker/c1 /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
    text += "".join(
        f"{6 + i} 1 0:{6 + i} /docker/c1 /sys/fs/cgroup/{c} rw - cgroup cgroup rw,{c}\n"
        for i, c in enumerate(("cpu", "cpuacct", "pids", "freezer"))
    )
    own = {c: "/docker/c1/agent" for c in ("memory", "cpu", "cpuacct", "pids", "freezer")}
    layout = plan_layout(parse_mountinfo(text), own, Path("/sys/fs/cgroup"), "ecs", _offers(ALL_V2))
    assert layout.hierarchy_of("memory").parent == Path("/sys/fs/cgroup/memory/agent/ecs")
    with pytest.raises(NoContainment) as outside:
        plan_layout(parse_mountinfo(text), own, Path("/sys/fs/cgroup"), "/other", _offers(ALL_V2))
    assert "/other is outside this mount" in str(outside.value)


def test_a_mount_point_with_a_space_is_unescaped() -> None:
    text = r"1 0 0:1 / /mnt/my\040cgroups rw - cgroup2 cgroup2 rw" + "\n"
    assert parse_mountinfo(text)[0].path == Path("/mnt/my cgroups")


@pytest.mark.parametrize("bad", ["", "/", "..", "a/../b", "./x"])
def test_a_parent_must_name_a_cgroup(bad: str) -> None:
    with pytest.raises(ValueError, match="must name a cgroup"):
        check_parent_setting(bad)


def test_the_limits_written_for_each_version() -> None:
    limits = Limits(memory_bytes=256 * 2**20, cpu_millis=500, pids=4096)
    assert limit_writes(1, limits) == [
        Write("memory", "memory.limit_in_bytes", "268435456"),
        Write("memory", "memory.memsw.limit_in_bytes", "268435456", required=False),
        Write("cpu", "cpu.cfs_period_us", "100000"),
        Write("cpu", "cpu.cfs_quota_us", "50000"),
        Write("pids", "pids.max", "4096"),
    ]
    assert limit_writes(2, limits) == [
        Write("memory", "memory.max", "268435456"),
        Write("memory", "memory.swap.max", "0", required=False),
        Write("memory", "memory.oom.group", "1", required=False),
        Write("cpu", "cpu.max", "50000 100000"),
        Write("pids", "pids.max", "4096"),
    ]
    # A dimension that was not granted is not limited.
    assert limit_writes(2, Limits(pids=64)) == [Write("pids", "pids.max", "64")]
    assert oom_reason(limits) == "out of memory: limit 256Mi"


@given(st.integers(0, 10**7), st.integers(0, 10**7))
def test_the_cpu_quota_is_proportional_and_never_below_the_kernels_minimum(a: int, b: int) -> None:
    low, high = sorted((a, b))
    assert MIN_CPU_QUOTA_USEC <= cpu_quota_usec(low) <= cpu_quota_usec(high)
    if low >= 10:  # 10 millicores and up: exact, a share of the period
        assert cpu_quota_usec(low) == low * CPU_PERIOD_USEC // 1000


@given(
    st.floats(0, 1e6, allow_nan=False),
    st.floats(0.001, 1e4, allow_nan=False),
    st.integers(0, 10**12),
    st.integers(0, 10**12),
)
def test_cpu_between_two_samples_is_the_used_time_over_the_wall_time(
    at: float, wall: float, used: int, start: int
) -> None:
    earlier = Sample(at, 0, 0, start, 0)
    later = Sample(at + wall, 0, 0, start + used, 0)
    millis = cpu_millis_between(earlier, later)
    expected = used / (wall * 1e6) * 1000
    assert abs(millis - expected) <= 0.5 + expected * 1e-6  # (the wall time is a float)
    assert cpu_millis_between(None, later) == 0
    assert cpu_millis_between(later, earlier) == 0  # not forwards in time: nothing known


def test_keyed_files_are_read_as_integers() -> None:
    text = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n"
    assert parse_keyed(text) == {"oom_kill_disable": 0, "under_oom": 0, "oom_kill": 3}
    assert parse_keyed("usage_usec 12\nbogus x\n\n") == {"usage_usec": 12}
