"""Apply an :class:`~pace_core.platform.placement.InstancePlan` to the calling process:
pin it to the plan's cores and prefer its NUMA node's memory.

Memory goes through the ``set_mempolicy`` system call (libc's ``syscall``, no libnuma needed)
with ``MPOL_PREFERRED``: pages come from the node while it has free memory and from the
others after that, so an instance too big for its node runs slower instead of being killed
by the OOM killer (``MPOL_BIND``). The policy belongs to the calling thread and the threads
it starts afterwards: call :func:`apply_plan` before loading the weights and before starting
the engine thread. Failures are logged warnings, never errors.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import platform

from pace_core.platform.placement import InstancePlan

log = logging.getLogger("pace.server.binding")

MPOL_PREFERRED = 1
_SET_MEMPOLICY = {"x86_64": 238, "aarch64": 237, "ppc64le": 261, "s390x": 270}


def prefer_node(node: int) -> bool:
    """Prefer ``node``'s memory for this thread and the threads it starts; False (logged)
    when the kernel refuses or the platform has no known ``set_mempolicy``."""
    number = _SET_MEMPOLICY.get(platform.machine())
    if number is None:
        log.warning("NUMA node %d: set_mempolicy unknown on %s; memory not bound",
                    node, platform.machine())  # fmt: skip
        return False
    words = node // 64 + 1
    mask = (ctypes.c_ulong * words)()
    mask[node // 64] = 1 << (node % 64)
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    result = libc.syscall(
        ctypes.c_long(number),
        ctypes.c_int(MPOL_PREFERRED),
        mask,
        ctypes.c_ulong(words * 64 + 1),
    )
    if result != 0:
        err = ctypes.get_errno()
        hint = " (in a container: --cap-add SYS_NICE allows it)" if err == errno.EPERM else ""
        log.warning("NUMA node %d: set_mempolicy failed: %s; memory not bound%s",
                    node, os.strerror(err), hint)  # fmt: skip
        return False
    return True


def apply_plan(plan: InstancePlan, name: str) -> None:
    """Pin this process to ``plan.cores`` and prefer ``plan.numa_node``'s memory."""
    if plan.cores and hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, plan.cores)
        except OSError as exc:
            log.warning("instance %s: cannot pin to cores %s: %s", name, list(plan.cores), exc)
    if plan.numa_node is not None and prefer_node(plan.numa_node):
        log.info("instance %s: memory on NUMA node %d", name, plan.numa_node)
