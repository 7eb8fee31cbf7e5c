"""Plain-text tables for the CLI: installed plugins and per-op kernel candidates."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pace_core.cpu import CpuInfo
from pace_core.opconfig import OperatorConfig
from pace_core.ops import OPS
from pace_core.plugins import PluginHost
from pace_core.registry import OpContext


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


def plugins_table(host: PluginHost) -> str:
    rows = []
    for info in host.plugins.values():
        provides = ", ".join(f"{n} {k}" for k, n in info.provides.items() if n) or "-"
        detail = info.error if info.status == "failed" else provides
        rows.append(
            [info.name, info.distribution or info.origin, info.version or "-", info.status, detail]
        )
    return format_table(["plugin", "from", "version", "status", "provides / error"], rows)


def ops_table(host: PluginHost, config: OperatorConfig, cpu: CpuInfo, dtype: torch.dtype) -> str:
    resolver = host.resolver(config, cpu)  # a bad backend name raises ConfigError here
    rows, notes = [], []
    for op in OPS:
        ctx = OpContext(op, dtype)
        try:
            res = resolver.resolve(ctx)
            chosen = res.backend
            if res.fallback_reason:
                notes.append(
                    f"{op}: {res.requested!r} unavailable ({res.fallback_reason}); using {chosen!r}"
                )
        except Exception as exc:  # shown, not raised: this is a diagnostic table
            chosen = ""
            notes.append(f"{op}: error: {exc}")
        for spec in host.ops.where(op=op):
            reason = spec.check(ctx, cpu.features)
            mark = "*" if spec.backend == chosen else ""
            rows.append(
                [
                    op,
                    spec.backend + mark,
                    spec.plugin,
                    str(spec.priority),
                    "yes" if reason is None else f"no: {reason}",
                ]
            )
        if not host.ops.where(op=op):
            rows.append([op, "-", "-", "-", "no kernel registered"])
    dt = str(dtype).removeprefix("torch.")
    header = f"CPU: {cpu.model_name} [{cpu.isa_level}; features from {cpu.source}]\n"
    header += f"dtype: {dt}; config: {config.to_dict()}; * = chosen\n"
    table = format_table(["op", "backend", "plugin", "priority", "available"], rows)
    if notes:  # fallbacks and errors, with their reasons
        table += "\n\n" + "\n".join(notes)
    return header + table
