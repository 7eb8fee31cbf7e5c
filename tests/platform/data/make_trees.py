"""Write the sysfs trees the topology tests read (only the files pace_core.platform reads).

``python tests/platform/data/make_trees.py`` rewrites the synthetic trees from the layouts
below; ``--record NAME`` copies this machine's files into ``NAME/`` instead.

- ``epyc-9354``: 1 socket, 32 cores / 64 threads (siblings n and n+32), NPS1 (one NUMA node),
  8 CCDs of 4 cores, each its own 32 MiB L3; kernel 6.x (``core_cpus_list``).
- ``xeon-2s-snc``: 2 sockets x 32 cores with HT (siblings n and n+64), SNC2 (4 NUMA nodes of 16
  cores), one 60 MiB L3 per socket; kernel 4.18 (``thread_siblings_list`` only).
- ``container-2s``: a 2 x 8-core Xeon (siblings n and n+16, 2 NUMA nodes) seen from a
  container whose cgroup v2 cpuset is ``2-5,18-19`` (node 0 only, two cores without their
  sibling).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent


def cpulist(cpus):
    from pace_core.platform import format_cpus

    return format_cpus(cpus)


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def synth(
    name: str,
    *,
    sockets: int,
    cores: int,
    nodes_per_socket: int,
    l3_cores: int,
    l3_kb: int,
    node_mem_kb: int,
    sibling_file: str,
    cgroup: str | None = None,
) -> None:
    """``cores`` per socket; thread t of core c of socket s is CPU ``t*sockets*cores +
    s*cores + c`` (Linux's order on both vendors); core ids leave the gaps of fused cores."""
    out = HERE / name
    shutil.rmtree(out, ignore_errors=True)
    total = sockets * cores
    sysd = out / "sys/devices/system"
    write(sysd / "cpu/online", f"0-{2 * total - 1}")
    per_node = cores // nodes_per_socket
    for s in range(sockets):
        for k in range(nodes_per_socket):
            node = s * nodes_per_socket + k
            first = s * cores + k * per_node
            phys = range(first, first + per_node)
            cpus = [*phys, *(c + total for c in phys)]
            write(sysd / f"node/node{node}/cpulist", cpulist(cpus))
            write(
                sysd / f"node/node{node}/meminfo",
                f"Node {node} MemTotal:       {node_mem_kb} kB",
            )
        for c in range(cores):
            phys = s * cores + c
            siblings = [phys, phys + total]
            domain = phys // l3_cores
            first = domain * l3_cores
            shared = [
                *range(first, first + l3_cores),
                *range(first + total, first + total + l3_cores),
            ]
            for cpu in siblings:
                d = sysd / f"cpu/cpu{cpu}"
                write(d / f"topology/{sibling_file}", cpulist(siblings))
                write(d / "topology/physical_package_id", str(s))
                write(d / "cache/index2/level", "2")
                write(d / "cache/index3/level", "3")
                write(d / "cache/index3/shared_cpu_list", cpulist(shared))
                write(d / "cache/index3/size", f"{l3_kb}K")
                write(d / "cache/index3/id", str(domain))
    write(sysd / "node/online", f"0-{sockets * nodes_per_socket - 1}")
    if cgroup is not None:
        write(out / "proc/self/cgroup", "0::/")
        write(out / "sys/fs/cgroup/cpuset.cpus.effective", cgroup)


READ = (
    "topology/core_cpus_list",
    "topology/thread_siblings_list",
    "topology/physical_package_id",
)
CACHE = ("level", "shared_cpu_list", "size", "id")


def record(name: str) -> None:
    """Copy the files the reader reads from this machine's /sys (and its cgroup files)."""
    out = HERE / name
    shutil.rmtree(out, ignore_errors=True)
    src = Path("/sys/devices/system")

    def copy(path: Path) -> None:
        if path.is_file():
            write(out / path.relative_to("/"), path.read_text().strip())

    copy(src / "cpu/online")
    copy(src / "node/online")
    for node in src.glob("node/node[0-9]*"):
        copy(node / "cpulist")
        mem = [ln for ln in (node / "meminfo").read_text().splitlines() if "MemTotal" in ln]
        write(out / (node / "meminfo").relative_to("/"), "\n".join(mem))
    for cpu in src.glob("cpu/cpu[0-9]*"):
        for rel in READ:
            copy(cpu / rel)
        for index in cpu.glob("cache/index[0-9]*"):
            for f in CACHE if (index / "level").read_text().strip() == "3" else ("level",):
                copy(index / f)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--record", metavar="NAME", help="copy this machine's tree into NAME/")
    args = p.parse_args()
    if args.record:
        record(args.record)
        return
    synth(
        "epyc-9354",
        sockets=1,
        cores=32,
        nodes_per_socket=1,
        l3_cores=4,
        l3_kb=32768,
        node_mem_kb=395_845_132,
        sibling_file="core_cpus_list",
    )
    synth(
        "xeon-2s-snc",
        sockets=2,
        cores=32,
        nodes_per_socket=2,
        l3_cores=32,
        l3_kb=61440,
        node_mem_kb=131_621_996,
        sibling_file="thread_siblings_list",
    )
    synth(
        "container-2s",
        sockets=2,
        cores=8,
        nodes_per_socket=1,
        l3_cores=8,
        l3_kb=25600,
        node_mem_kb=65_842_176,
        sibling_file="core_cpus_list",
        cgroup="2-5,18-19",
    )


if __name__ == "__main__":
    main()
