"""Where and how EngineConns are contained: the cgroup layout of this host, and what is
written to and read from an EngineConn's cgroup. Pure functions, no I/O (the agent's
side of the files is ecm_agent/containment.py).

Two layouts are supported, as YARN's LinuxContainerExecutor, Slurm's task/cgroup and
Nomad's exec driver support them:

* **cgroup v2** (the unified hierarchy, or a subtree of it delegated to the agent, as
  systemd does for a unit with ``Delegate=yes``): one directory per EngineConn with the
  ``memory``, ``cpu`` and ``pids`` controllers; ``cgroup.kill`` ends all of it at once.
* **cgroup v1** (one hierarchy per controller, or a few controllers per hierarchy): a
  directory per EngineConn in each of the ``memory``, ``cpu``, ``cpuacct``, ``pids`` and
  ``freezer`` hierarchies; the freezer stops every process before each is killed, so that
  nothing forks between the listing and the kill.

v2 is used when a cgroup2 hierarchy offers the three controllers where the agent's parent
goes; else v1 when the five v1 controllers are mounted; else there is no containment (the
agent refuses to start unless told ``isolation = "none"``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from labelrm_common.quantity import format_bytes

V1_CONTROLLERS = ("memory", "cpu", "cpuacct", "pids", "freezer")
V2_CONTROLLERS = ("memory", "cpu", "pids")
#: The CFS period the CPU quota is a share of (the kernel's default, 100 ms).
CPU_PERIOD_USEC = 100_000
#: The smallest quota the kernel takes (1 ms per period: 10 millicores).
MIN_CPU_QUOTA_USEC = 1_000
#: In v2 the agent moves itself out of the cgroup it was started in (a cgroup with
#: processes cannot hand controllers to its children) into this leaf.
AGENT_LEAF = "ecm-agent"


class NoContainment(Exception):
    """This host offers no layout the agent can contain EngineConns with (one line)."""


@dataclass(frozen=True)
class Mount:
    """A cgroup hierarchy mounted on this host (a line of /proc/self/mountinfo)."""

    version: int  # 1 or 2
    root: str  # the cgroup the mount shows at its mount point ("/" but in containers)
    path: Path  # the mount point
    controllers: frozenset[str]  # v1: its controllers; v2: empty (they are in files)


@dataclass(frozen=True)
class Hierarchy:
    """One hierarchy the agent uses: the directory of its parent cgroup there, and the
    controllers that hierarchy carries."""

    parent: Path
    controllers: tuple[str, ...]
    cgroup_path: str  # the parent as /proc/<pid>/cgroup names it


@dataclass(frozen=True)
class Layout:
    """How this agent contains its EngineConns: cgroup v1 or v2, the hierarchies it
    creates a directory in for each EngineConn, and what it can enforce."""

    version: int
    hierarchies: tuple[Hierarchy, ...]
    # v2 only: where the agent moves itself first (None: it stays where it is).
    agent_leaf: Path | None = None

    @property
    def controllers(self) -> tuple[str, ...]:
        """Every controller used, in the canonical order."""
        used = {c for h in self.hierarchies for c in h.controllers}
        order = V2_CONTROLLERS if self.version == 2 else V1_CONTROLLERS
        return tuple(c for c in order if c in used)

    @property
    def mode(self) -> str:
        """``cgroup-v1`` or ``cgroup-v2`` (what the RM shows as the node's isolation)."""
        return f"cgroup-v{self.version}"

    def hierarchy_of(self, controller: str) -> Hierarchy:
        """The hierarchy carrying `controller` (v2: the one hierarchy)."""
        for h in self.hierarchies:
            if controller in h.controllers:
                return h
        raise KeyError(controller)

    def parents(self) -> tuple[str, ...]:
        """The parent cgroup's path in each hierarchy, once each (for people)."""
        seen: list[str] = []
        for h in self.hierarchies:
            if h.cgroup_path not in seen:
                seen.append(h.cgroup_path)
        return tuple(seen)

    def describe(self) -> str:
        """One line: ``cgroup-v1 (memory,cpu,...) under /a/b``."""
        return f"{self.mode} ({','.join(self.controllers)}) under {', '.join(self.parents())}"


# ----- reading the host's files -------------------------------------------------------------


def _unescape(field: str) -> str:
    """Octal escapes of mountinfo (a space is ``\\040``)."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit() and i + 4 <= len(field):
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[Mount]:
    """The cgroup and cgroup2 mounts of a /proc/self/mountinfo text."""
    mounts: list[Mount] = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        fstype, super_options = tail[0], tail[2]
        if fstype == "cgroup2":
            mounts.append(Mount(2, _unescape(fields[3]), Path(_unescape(fields[4])), frozenset()))
        elif fstype == "cgroup":
            names = frozenset(o for o in super_options.split(",") if o in V1_CONTROLLERS)
            if names:
                mounts.append(Mount(1, _unescape(fields[3]), Path(_unescape(fields[4])), names))
    return mounts


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """A process's cgroup per controller from /proc/<pid>/cgroup; the v2 one under ""."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if not controllers:
            out[""] = path
        for name in controllers.split(","):
            if name:
                out[name] = path
    return out


def parse_keyed(text: str) -> dict[str, int]:
    """``key value`` lines (memory.events, memory.oom_control, cpu.stat) as integers."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        try:
            out[key] = int(value.strip())
        except ValueError:
            continue
    return out


# ----- choosing the layout ----------------------------------------------------------------


def _join(base: str, relative: str) -> str:
    return str(PurePosixPath(base) / relative)


def _parent_path(own: str, parent_setting: str) -> str:
    """The agent's parent cgroup: a relative setting is under the agent's own cgroup,
    an absolute one from the hierarchy's root."""
    if parent_setting.startswith("/"):
        return str(PurePosixPath(parent_setting))
    return _join(own or "/", parent_setting)


def _directory(mount: Mount, cgroup: str) -> Path | None:
    """Where `cgroup` is on `mount` (None: outside what the mount shows)."""
    root = PurePosixPath(mount.root)
    path = PurePosixPath(cgroup)
    if path != root and root not in path.parents:
        return None
    return mount.path / path.relative_to(root)


def _under(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def check_parent_setting(parent: str) -> None:
    """ValueError unless `parent` is a path of plain names (no ``..``, no empty parts)."""
    parts = [p for p in parent.split("/") if p]
    if not parts or any(p in (".", "..") or "\0" in p for p in parts):
        raise ValueError(f"cgroup_parent {parent!r} must name a cgroup (no '..', not empty)")


def plan_layout(
    mounts: Sequence[Mount],
    own: Mapping[str, str],
    cgroup_root: Path,
    parent_setting: str,
    v2_controllers: Callable[[Path], frozenset[str]],
) -> Layout:
    """The layout for this host (raises NoContainment saying why there is none).

    `mounts` and `own` come from /proc/self/mountinfo and /proc/self/cgroup;
    `cgroup_root`: only hierarchies mounted there or below count; `parent_setting`: the
    agent's parent cgroup (relative: under the agent's own); `v2_controllers(dir)`: the
    controllers a v2 cgroup directory offers (its cgroup.controllers)."""
    check_parent_setting(parent_setting)
    usable = [m for m in mounts if _under(m.path, cgroup_root)]
    if not usable:
        raise NoContainment(f"no cgroup hierarchy is mounted under {cgroup_root}")
    reasons: list[str] = []
    for mount in (m for m in usable if m.version == 2):
        layout = _plan_v2(mount, own.get("", "/"), parent_setting, v2_controllers, reasons)
        if layout is not None:
            return layout
    layout = _plan_v1([m for m in usable if m.version == 1], own, parent_setting, reasons)
    if layout is not None:
        return layout
    raise NoContainment("; ".join(reasons))


def _plan_v2(
    mount: Mount,
    own: str,
    parent_setting: str,
    v2_controllers: Callable[[Path], frozenset[str]],
    reasons: list[str],
) -> Layout | None:
    parent = _parent_path(own, parent_setting)
    directory = _directory(mount, parent)
    # Controllers are handed down from the nearest existing ancestor of the parent.
    ancestor = directory
    while ancestor is not None and not ancestor.exists() and _under(ancestor.parent, mount.path):
        ancestor = ancestor.parent
    if directory is None or ancestor is None:
        reasons.append(f"cgroup v2 at {mount.path}: {parent} is outside this mount")
        return None
    offered = v2_controllers(ancestor)
    missing = [c for c in V2_CONTROLLERS if c not in offered]
    if missing:
        reasons.append(
            f"cgroup v2 at {mount.path}: {', '.join(missing)} not available in {ancestor}"
            " (delegate them, e.g. systemd Delegate=yes)"
        )
        return None
    leaf = None
    own_dir = _directory(mount, own)
    if own_dir is not None and own_dir != mount.path and _under(directory, own_dir):
        leaf = own_dir / AGENT_LEAF  # the agent leaves the cgroup it hands controllers from
    hierarchy = Hierarchy(directory, V2_CONTROLLERS, parent)
    return Layout(2, (hierarchy,), leaf)


def _plan_v1(
    mounts: Sequence[Mount], own: Mapping[str, str], parent_setting: str, reasons: list[str]
) -> Layout | None:
    by_controller = {c: m for m in mounts for c in sorted(m.controllers)}
    missing = [c for c in V1_CONTROLLERS if c not in by_controller]
    if missing:
        reasons.append(f"cgroup v1: {', '.join(missing)} not mounted")
        return None
    hierarchies: list[Hierarchy] = []
    for mount in dict.fromkeys(by_controller[c] for c in V1_CONTROLLERS):
        first = sorted(mount.controllers)[0]
        parent = _parent_path(own.get(first, "/"), parent_setting)
        directory = _directory(mount, parent)
        if directory is None:
            reasons.append(f"cgroup v1 {first} at {mount.path}: {parent} is outside this mount")
            return None
        names = tuple(c for c in V1_CONTROLLERS if c in mount.controllers)
        hierarchies.append(Hierarchy(directory, names, parent))
    return Layout(1, tuple(hierarchies))


# ----- limits -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Limits:
    """What an EngineConn is held to (0: that dimension was not granted, no limit)."""

    memory_bytes: int = 0
    cpu_millis: int = 0
    pids: int = 0

    def describe_memory(self) -> str:
        return format_bytes(self.memory_bytes) if self.memory_bytes else "none"


@dataclass(frozen=True)
class Write:
    """One value written to one file of an EngineConn's cgroup."""

    controller: str
    file: str
    value: str
    required: bool = True  # False: skipped when the kernel has no such file


def cpu_quota_usec(cpu_millis: int) -> int:
    """The CFS quota per CPU_PERIOD_USEC for `cpu_millis` (500m: 50 ms per 100 ms)."""
    return max(MIN_CPU_QUOTA_USEC, cpu_millis * CPU_PERIOD_USEC // 1000)


def limit_writes(version: int, limits: Limits) -> list[Write]:
    """What to write to a fresh EngineConn cgroup, in order, for `limits`."""
    writes: list[Write] = []
    memory, cpu, pids = limits.memory_bytes, limits.cpu_millis, limits.pids
    if version == 2:
        if memory:
            writes += [
                Write("memory", "memory.max", str(memory)),
                Write("memory", "memory.swap.max", "0", required=False),  # no swap beyond
                # The OOM killer ends the whole EngineConn, not one of its processes.
                Write("memory", "memory.oom.group", "1", required=False),
            ]
        if cpu:
            writes.append(Write("cpu", "cpu.max", f"{cpu_quota_usec(cpu)} {CPU_PERIOD_USEC}"))
        if pids:
            writes.append(Write("pids", "pids.max", str(pids)))
        return writes
    if memory:
        writes += [
            Write("memory", "memory.limit_in_bytes", str(memory)),
            # memory + swap: the same figure, so no swap beyond the limit (absent when the
            # kernel does not account swap: then there is no swap to account).
            Write("memory", "memory.memsw.limit_in_bytes", str(memory), required=False),
        ]
    if cpu:
        writes += [
            Write("cpu", "cpu.cfs_period_us", str(CPU_PERIOD_USEC)),
            Write("cpu", "cpu.cfs_quota_us", str(cpu_quota_usec(cpu))),
        ]
    if pids:
        writes.append(Write("pids", "pids.max", str(pids)))
    return writes


# ----- usage ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    """What an EngineConn's cgroup said at one moment (`at`: monotonic seconds)."""

    at: float
    memory_bytes: int
    memory_peak_bytes: int
    cpu_usec: int
    oom_kills: int


def cpu_millis_between(earlier: Sample | None, later: Sample) -> int:
    """Millicores used on average from `earlier` to `later` (0 without two samples)."""
    if earlier is None or later.at <= earlier.at:
        return 0
    used = max(0, later.cpu_usec - earlier.cpu_usec)
    return round(used / ((later.at - earlier.at) * 1e6) * 1000)


def oom_reason(limits: Limits) -> str:
    """The reason an EngineConn stopped over its memory ends with."""
    return f"out of memory: limit {limits.describe_memory()}"
