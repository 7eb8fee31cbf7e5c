"""The machine's CPU topology: NUMA nodes, L3 domains, physical cores and SMT siblings.

Read from sysfs (``/sys/devices/system/node``, ``/sys/devices/system/cpu``), restricted to the
CPUs this process may run on: its affinity mask (``taskset``) and its cgroup's
``cpuset.cpus.effective`` (a container's CPU limit). CPUs outside that set are dropped, and
so are the NUMA nodes, L3 domains and cores left without any. A machine whose sysfs has no
NUMA nodes is one node holding every allowed CPU; one without CPU topology files has one
core per CPU. ``root`` (and ``allowed``) are parameters, so tests read recorded trees.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Core:
    """A physical core: its allowed hardware threads (SMT siblings), lowest first."""

    cpus: tuple[int, ...]
    package: int

    @property
    def primary(self) -> int:
        """The thread an instance pins to (one thread per physical core)."""
        return self.cpus[0]


@dataclass(frozen=True)
class L3Domain:
    """CPUs sharing one last-level cache (an EPYC CCD; a whole socket on most Xeons)."""

    id: int
    cpus: tuple[int, ...]
    size_kb: int | None


@dataclass(frozen=True)
class NumaNode:
    """A NUMA node's allowed CPUs and its memory (``None``: not reported)."""

    id: int
    cpus: tuple[int, ...]
    memory_kb: int | None


@dataclass(frozen=True)
class Topology:
    """What this process may use of the machine; see :func:`read_topology`."""

    cpus: tuple[int, ...]  # allowed logical CPUs
    online: int  # logical CPUs online on the machine
    nodes: tuple[NumaNode, ...]
    l3: tuple[L3Domain, ...]
    cores: tuple[Core, ...]
    numa_reported: bool  # False: sysfs has no NUMA nodes, ``nodes`` is one made-up node

    @property
    def packages(self) -> int:
        return len({c.package for c in self.cores})

    @property
    def smt(self) -> bool:
        """Some allowed core runs more than one allowed thread."""
        return any(len(c.cpus) > 1 for c in self.cores)

    def physical_cpus(self, cpus: Iterable[int] | None = None) -> list[int]:
        """The primary thread of each core with a thread in ``cpus`` (default: all allowed),
        in core order: one CPU per physical core."""
        wanted = set(self.cpus if cpus is None else cpus)
        out = []
        for core in self.cores:
            mine = [c for c in core.cpus if c in wanted]
            if mine:
                out.append(mine[0])
        return out

    def summary(self) -> str:
        """A few lines for ``pace check`` / ``pace plugins``."""
        threads = "SMT on" if self.smt else "one thread per core"
        numa = "" if self.numa_reported else " (sysfs reports none)"
        lines = [
            f"topology: {len(self.cpus)} of {self.online} CPUs allowed = {len(self.cores)} "
            f"physical cores ({threads}); {self.packages} package(s), {len(self.nodes)} NUMA "
            f"node(s){numa}"
        ]
        for node in self.nodes:
            mem = "" if node.memory_kb is None else f", {node.memory_kb / (1 << 20):.1f} GiB"
            cores = len(self.physical_cpus(node.cpus))
            lines.append(f"  node {node.id}: cpus {format_cpus(node.cpus)} ({cores} cores){mem}")
        if self.l3:
            per = sorted({len(self.physical_cpus(d.cpus)) for d in self.l3})
            sizes = {d.size_kb for d in self.l3}
            size = (
                f", {sizes.pop() // 1024} MiB each" if sizes != {None} and len(sizes) == 1 else ""
            )
            lines.append(f"  L3: {len(self.l3)} domain(s) of {'/'.join(map(str, per))} cores{size}")
        return "\n".join(lines)


# -- cpulist strings ---------------------------------------------------------------------------
def parse_cpulist(text: str) -> list[int]:
    """``"0-3,8,10-11"`` -> ``[0, 1, 2, 3, 8, 10, 11]`` (sysfs / cgroup list format)."""
    out: list[int] = []
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return sorted(set(out))


def format_cpus(cpus: Iterable[int]) -> str:
    """``[0, 1, 2, 3, 8]`` -> ``"0-3,8"``."""
    ordered = sorted(set(cpus))
    parts, i = [], 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


# -- the reader --------------------------------------------------------------------------------
def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _int(path: Path) -> int | None:
    text = _read(path)
    try:
        return None if text is None else int(text)
    except ValueError:
        return None


def _cgroup_cpus(root: Path) -> set[int] | None:
    """The CPUs of this process's cgroup cpuset (v2 ``cpuset.cpus.effective``, v1
    ``cpuset.effective_cpus``), or None when no cgroup file says."""
    text = _read(root / "proc/self/cgroup")
    if text is None:
        return None
    base = root / "sys/fs/cgroup"
    for line in text.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        rel = path.lstrip("/")
        if controllers == "":  # cgroup v2 (unified)
            candidate = base / rel / "cpuset.cpus.effective"
        elif "cpuset" in controllers.split(","):
            candidate = base / "cpuset" / rel / "cpuset.effective_cpus"
        else:
            continue
        value = _read(candidate)
        if value:
            return set(parse_cpulist(value))
    return None


def _allowed(root: Path, allowed: Iterable[int] | None, online: list[int]) -> list[int]:
    if allowed is not None:
        cpus = set(allowed)
    elif root == Path("/") and hasattr(os, "sched_getaffinity"):
        cpus = set(os.sched_getaffinity(0))
    else:
        cpus = set(online)
    cgroup = _cgroup_cpus(root)
    if cgroup is not None:
        cpus &= cgroup
    if online:
        cpus &= set(online)
    return sorted(cpus)


def _cores(cpu_dir: Path, cpus: list[int]) -> tuple[Core, ...]:
    allowed = set(cpus)
    seen: dict[tuple[int, ...], Core] = {}
    for cpu in cpus:
        topo = cpu_dir / f"cpu{cpu}" / "topology"
        text = _read(topo / "core_cpus_list") or _read(topo / "thread_siblings_list")
        siblings = tuple(c for c in parse_cpulist(text) if c in allowed) if text else ()
        key = siblings or (cpu,)
        if key not in seen:
            package = _int(topo / "physical_package_id")
            seen[key] = Core(key, package if package is not None and package >= 0 else 0)
    return tuple(sorted(seen.values(), key=lambda c: c.primary))


def _l3_domains(cpu_dir: Path, cpus: list[int]) -> tuple[L3Domain, ...]:
    allowed = set(cpus)
    found: dict[tuple[int, ...], L3Domain] = {}
    for cpu in cpus:
        cache = cpu_dir / f"cpu{cpu}" / "cache"
        for index in sorted(cache.glob("index*")):
            if _int(index / "level") != 3:
                continue
            text = _read(index / "shared_cpu_list")
            shared = tuple(c for c in parse_cpulist(text) if c in allowed) if text else (cpu,)
            if shared not in found:
                size = _read(index / "size")
                size_kb = int(size[:-1]) if size and size.endswith("K") else None
                domain_id = _int(index / "id")
                found[shared] = L3Domain(
                    len(found) if domain_id is None else domain_id, shared, size_kb
                )
    return tuple(sorted(found.values(), key=lambda d: d.cpus[0]))


def _nodes(node_dir: Path, cpus: list[int]) -> tuple[tuple[NumaNode, ...], bool]:
    allowed = set(cpus)
    nodes = []
    dirs = [d for d in node_dir.glob("node*") if d.name[4:].isdigit()]
    for d in sorted(dirs, key=lambda d: int(d.name[4:])):
        text = _read(d / "cpulist")
        mine = tuple(c for c in parse_cpulist(text or "") if c in allowed)
        if not mine:
            continue  # memory-only, or outside the allowed set
        nodes.append(NumaNode(int(d.name[4:]), mine, _meminfo_kb(d / "meminfo")))
    if dirs:
        covered = {c for n in nodes for c in n.cpus}
        if covered == allowed:
            return tuple(nodes), True
    return (NumaNode(0, tuple(cpus), None),), False


def _meminfo_kb(path: Path) -> int | None:
    for line in (_read(path) or "").splitlines():
        # "Node 0 MemTotal:       24684084 kB"
        fields = line.split()
        if len(fields) >= 4 and fields[2] == "MemTotal:":
            return int(fields[3])
    return None


def read_topology(root: str | Path = "/", allowed: Iterable[int] | None = None) -> Topology:
    """The topology under ``root`` (a sysfs tree recorded there, or ``/``).

    ``allowed``: the CPUs this process may use (default: its affinity mask when reading
    ``/``, else every online CPU), intersected with the cgroup cpuset found under ``root``.
    """
    root = Path(root)
    cpu_dir = root / "sys/devices/system/cpu"
    online_text = _read(cpu_dir / "online")
    online = parse_cpulist(online_text) if online_text else []
    cpus = _allowed(root, allowed, online)
    if not cpus:
        cpus = list(range(os.cpu_count() or 1)) if root == Path("/") else online
    nodes, reported = _nodes(root / "sys/devices/system/node", cpus)
    return Topology(
        cpus=tuple(cpus),
        online=len(online) or len(cpus),
        nodes=nodes,
        l3=_l3_domains(cpu_dir, cpus),
        cores=_cores(cpu_dir, cpus),
        numa_reported=reported,
    )


@functools.cache
def current_topology() -> Topology:
    """This process's topology (read once)."""
    return read_topology()
