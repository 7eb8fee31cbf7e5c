"""PNG plots of benchmark payloads (matplotlib, Agg backend, imported only when drawing).

Plots are drawn from the JSON payload alone, so ``pace bench plot <folder>`` redraws them:

- offline: decode and prefill tok/s vs threads, vs batch, vs prompt length, per engine;
- kernels: per-op backend comparison bars (GB/s for GEMV, GFLOP/s for GEMM, µs for ops,
  ms / tok/s for the model plans), one panel per shape and M;
- attention: µs per decode step vs context, per cache type;
- serving: output tok/s, TTFT and inter-token latency vs concurrency, per engine and mode;
- embeddings: inputs/s vs batch, per engine and input length;
- scoring: scored tokens/s vs batch, per engine and prompt length;
- scaling: streaming read GB/s and each model's tok/s vs threads, measured and modelled.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

Row = Mapping[str, Any]


class PlotsUnavailable(RuntimeError):
    """matplotlib is not installed (the JSON is written all the same)."""


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise PlotsUnavailable(
            "matplotlib is not installed, so no plots were drawn (the JSON is written): "
            "pip install 'pace-core[bench]', then `pace bench plot <results folder>`"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _unique(rows: Iterable[Row], key: str) -> list[Any]:
    return list(dict.fromkeys(r.get(key) for r in rows))


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def _title(payload: Mapping[str, Any]) -> str:
    m = payload.get("machine", {})
    cores = (m.get("cores") or {}).get("usable")
    pace = (m.get("versions") or {}).get("pace", "?")
    return f"{m.get('cpu', '?')} [{m.get('isa', '?')}], {cores} cores, pace {pace}"


# -- offline ----------------------------------------------------------------------------------
OFFLINE_AXES = (("threads", "threads"), ("batch", "batch"), ("prompt_len", "prompt length"))


def _base_slice(rows: list[Row], axis: str) -> list[Row]:
    """Rows where every other sweep axis sits at its first (base) value."""
    others = [a for a, _ in OFFLINE_AXES if a != axis]
    base = {a: rows[0].get(a) for a in others} if rows else {}
    return [r for r in rows if all(r.get(a) == base[a] for a in others)]


def plot_offline(payload: Mapping[str, Any], out: Path) -> list[Path]:
    """tok/s vs threads, vs batch and vs prompt length: decode (top) and prefill (bottom)."""
    plt, rows, written = _pyplot(), payload["results"], []
    for model in _unique(rows, "model"):
        sub = [r for r in rows if r["model"] == model]
        fig, axes = plt.subplots(2, 3, figsize=(15, 8), squeeze=False)
        for col, (axis, label) in enumerate(OFFLINE_AXES):
            points = _base_slice(sub, axis)
            for engine in _unique(points, "engine"):
                mine = sorted((r for r in points if r["engine"] == engine), key=lambda r: r[axis])
                xs = [r[axis] for r in mine]
                axes[0][col].plot(xs, [r["decode_tok_s"] for r in mine], "o-", label=engine)
                axes[1][col].plot(xs, [r["prefill_tok_s"] for r in mine], "o-", label=engine)
            for row, what in enumerate(("decode tok/s", "prefill tok/s")):
                ax = axes[row][col]
                ax.set_xlabel(label)
                ax.set_ylabel(what)
                ax.set_title(f"{what} vs {label}")
                ax.grid(True, alpha=0.3)
                ax.legend(fontsize=8)
        fig.suptitle(f"offline {model} ({_title(payload)})", fontsize=10)
        written.append(_save(fig, out / f"offline-{_slug(Path(str(model)).name)}.png"))
    return written


# -- kernels ----------------------------------------------------------------------------------
def kernel_group(section: str) -> str:
    """Which figure a kernels section goes to: ``linear`` (with its DRAM reference),
    ``model`` (whole-model plans) or ``ops``."""
    if section in ("gemv", "gemm", "dram-read"):
        return "linear"
    return "model" if section.startswith("model") else "ops"


def plot_kernels(payload: Mapping[str, Any], out: Path) -> list[Path]:
    """A figure per (group, dtype, threads): a panel per section/shape/M, a bar per backend."""
    rows, written = payload["results"], []
    colours = _colours(rows)
    groups: dict[tuple, list[Row]] = {}
    for r in rows:
        groups.setdefault((kernel_group(r["section"]), r["threads"]), []).append(r)
    for (group, threads), sub in groups.items():
        for dtype in _unique([r for r in sub if r["section"] != "dram-read"], "dtype"):
            mine = [r for r in sub if r["dtype"] == dtype or r["section"] == "dram-read"]
            title = f"kernels: {group} {dtype}, {threads} thread(s) ({_title(payload)})"
            path = out / f"kernels-{group}-{dtype}-t{threads}.png"
            written.append(_bar_panels(mine, title, path, colours))
    return written


def _bar_panels(rows: list[Row], title: str, path: Path, colours: Mapping[str, str]) -> Path:
    """One bar chart (a bar per backend) per (section, shape, M) of ``rows``, 4 per line."""
    plt = _pyplot()
    panels = list(dict.fromkeys((r["section"], r["shape"], r.get("M")) for r in rows))
    cols = min(4, len(panels))
    nrows = -(-len(panels) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(3.6 * cols, 3.4 * nrows), squeeze=False)
    flat = [ax for line in axes for ax in line]
    for ax, key in zip(flat, panels):
        mine = [r for r in rows if (r["section"], r["shape"], r.get("M")) == key]
        names = [r["backend"] for r in mine]
        values = [r["value"] for r in mine]
        bars = ax.bar(range(len(mine)), values, color=[colours[n] for n in names])
        ax.bar_label(bars, labels=[f"{v:.3g}" for v in values], fontsize=7)
        ax.set_xticks(range(len(mine)), names, rotation=30, ha="right", fontsize=8)
        section, shape, m = key
        ax.set_title(f"{section} {shape}" + (f" M={m}" if m is not None else ""), fontsize=9)
        unit = "µs" if mine[0]["unit"] == "us" else mine[0]["unit"]
        ax.set_ylabel(unit + (" (lower is better)" if _lower_better(mine[0]) else ""), fontsize=8)
        ax.grid(True, axis="y", alpha=0.3)
    for ax in flat[len(panels) :]:
        ax.axis("off")
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def _lower_better(row: Row) -> bool:
    return row.get("unit") in ("us", "ms")


_PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)


def _colours(rows: Iterable[Row]) -> dict[str, str]:
    """One colour per backend, the same in every figure of a payload."""
    names = _unique(rows, "backend")
    return {name: _PALETTE[i % len(_PALETTE)] for i, name in enumerate(names)}


# -- attention and serving --------------------------------------------------------------------
def plot_attention(payload: Mapping[str, Any], out: Path) -> list[Path]:
    """µs per decode step vs context, a line per cache type, a panel per batch."""
    plt, rows = _pyplot(), payload["results"]
    batches = _unique(rows, "batch")
    fig, axes = plt.subplots(1, len(batches), figsize=(5 * len(batches), 4), squeeze=False)
    for ax, batch in zip(axes[0], batches):
        for cache in _unique(rows, "cache"):
            mine = [r for r in rows if r["batch"] == batch and r["cache"] == cache]
            ax.plot(
                [r["context"] for r in mine], [r["us_per_step"] for r in mine], "o-", label=cache
            )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel("µs per decode step")
        ax.set_title(f"batch {batch}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"decode attention per cache type ({_title(payload)})", fontsize=10)
    return [_save(fig, out / "attention.png")]


def serving_series(rows: list[Row]) -> dict[str, list[Row]]:
    """The lines of the serving plot: one per engine, or per engine and mode when an engine
    ran in several modes (rows without ``engine`` are pace's)."""
    engine = [str(r.get("engine", "pace")) for r in rows]
    modes: dict[str, set] = {}
    for e, r in zip(engine, rows):
        modes.setdefault(e, set()).add(r.get("mode"))
    series: dict[str, list[Row]] = {}
    for e, r in zip(engine, rows):
        label = e if len(modes[e]) == 1 else f"{e} {r.get('mode')}"
        series.setdefault(label, []).append(r)
    return series


def plot_serving(payload: Mapping[str, Any], out: Path) -> list[Path]:
    """Output tok/s, TTFT and inter-token latency (p50, p99) vs concurrency, per engine/mode."""
    plt, rows = _pyplot(), payload["results"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    series = serving_series(rows)
    styles = ("o-", "s--", "^:", "d-.", "v-", "P--")
    for (label, sub), style in zip(series.items(), styles * len(series)):
        c = [r["concurrency"] for r in sub]
        axes[0].plot(c, [r["out_tok_per_s"] for r in sub], style, label=label)
        for ax, key in ((axes[1], "ttft"), (axes[2], "itl")):
            ax.plot(c, [r[f"{key}_p50_ms"] for r in sub], style, label=f"{label} p50")
            ax.plot(c, [r[f"{key}_p99_ms"] for r in sub], style, alpha=0.4, label=f"{label} p99")
    titles = ("output tokens/s", "TTFT (ms)", "inter-token latency (ms)")
    for ax, title in zip(axes, titles):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    axes[1].set_yscale("log")
    what = " vs ".join(series) if len(series) > 1 else "pace serve"
    fig.suptitle(f"{what}: throughput vs concurrency ({_title(payload)})", fontsize=10)
    return [_save(fig, out / "serving.png")]


# -- quantized ------------------------------------------------------------------------------
def plot_quantized(payload: Mapping[str, Any], out: Path) -> list[Path]:
    """Per model: decode (top) and prefill (bottom) tok/s per format, pace and llama.cpp bars
    side by side, one column per thread count and batch (the first prompt length)."""
    plt, rows, written = _pyplot(), payload["results"], []
    for model in _unique(rows, "model"):
        sub = [r for r in rows if r["model"] == model]
        prompt = _unique(sub, "prompt_len")[0]
        columns = sorted({(r["threads"], r.get("batch", 1)) for r in sub})
        fig, axes = plt.subplots(2, len(columns), figsize=(6 * len(columns), 8), squeeze=False)
        formats = _unique(sub, "format")
        for col, (t, batch) in enumerate(columns):
            points = [r for r in sub if r["threads"] == t and r.get("batch", 1) == batch
                      and r["prompt_len"] == prompt]  # fmt: skip
            for i, engine in enumerate(_unique(points, "engine")):
                mine = {r["format"]: r for r in points if r["engine"] == engine}
                xs = [j + 0.4 * i for j, f in enumerate(formats) if f in mine]
                for row, key in enumerate(("decode_tok_s", "prefill_tok_s")):
                    values = [mine[f][key] for f in formats if f in mine]
                    axes[row][col].bar(xs, values, width=0.4, label=engine)
            for row, what in enumerate(("decode tok/s", "prefill tok/s")):
                ax = axes[row][col]
                ax.set_xticks([j + 0.2 for j in range(len(formats))], formats, fontsize=8)
                ax.set_ylabel(what)
                ax.set_title(f"{what}, {t} thread(s), batch {batch}, prompt {prompt}")
                ax.grid(True, axis="y", alpha=0.3)
                ax.legend(fontsize=8)
        fig.suptitle(f"quantized {model} ({_title(payload)})", fontsize=10)
        written.append(_save(fig, out / f"quantized-{_slug(Path(str(model)).name)}.png"))
    return written


# -- embeddings, scoring ----------------------------------------------------------------------
def _rate_vs_batch(payload: Mapping[str, Any], out: Path, column: str, unit: str) -> list[Path]:
    """Per model: ``column`` vs batch, a line per engine, a panel per input length."""
    plt, rows, written = _pyplot(), payload["results"], []
    name = payload["benchmark"]
    for model in _unique(rows, "model"):
        sub = [r for r in rows if r["model"] == model]
        lengths = _unique(sub, "length")
        fig, axes = plt.subplots(1, len(lengths), figsize=(5 * len(lengths), 4), squeeze=False)
        for ax, length in zip(axes[0], lengths):
            for engine in _unique(sub, "engine"):
                mine = [r for r in sub if r["length"] == length and r["engine"] == engine]
                ax.plot([r["batch"] for r in mine], [r[column] for r in mine], "o-",
                        label=engine)  # fmt: skip
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("batch (inputs per call)")
            ax.set_ylabel(unit)
            ax.set_title(f"{length} tokens per input")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
        fig.suptitle(f"{name} {model} ({_title(payload)})", fontsize=10)
        written.append(_save(fig, out / f"{name}-{_slug(Path(str(model)).name)}.png"))
    return written


def plot_embeddings(payload: Mapping[str, Any], out: Path) -> list[Path]:
    """Per model: inputs/s vs batch, a line per engine, a panel per input length."""
    return _rate_vs_batch(payload, out, "inputs_s", "inputs/s")


def plot_scoring(payload: Mapping[str, Any], out: Path) -> list[Path]:
    """Per model: scored tokens/s vs batch, a line per engine, a panel per prompt length."""
    return _rate_vs_batch(payload, out, "tokens_s", "scored tokens/s")


def plot_scaling(payload: Mapping[str, Any], out: Path) -> list[Path]:
    """Read GB/s and each model's tok/s vs threads: measured (dots) and the model (dashes)."""
    plt, rows = _pyplot(), payload["results"]
    models = [r for r in rows if r.get("section") == "model"]
    panels = [("read", None)] + [(m, w) for m in _unique(models, "model")
                                 for w in _unique(models, "what")]  # fmt: skip
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.6), squeeze=False)
    for ax, (model, what) in zip(axes[0], panels):
        if what is None:
            sub = [r for r in rows if r.get("section") == "read"]
            ys, fit, label = "gbs", "fit_gbs", "streaming read GB/s"
        else:
            sub = [r for r in models if r["model"] == model and r["what"] == what]
            ys, fit, label = "tok_s", "pred", f"{Path(str(model)).name} {what} tok/s"
        sub = sorted(sub, key=lambda r: r["threads"])
        xs = [r["threads"] for r in sub]
        ax.plot(xs, [r[ys] for r in sub], "o-", label="measured")
        ax.plot(xs, [r[fit] for r in sub], "--", label="model")
        ax.set_xlabel("threads")
        ax.set_title(label, fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"scaling ({_title(payload)})", fontsize=10)
    return [_save(fig, out / "scaling.png")]


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in str(text))


PLOTTERS: dict[str, Callable[[Mapping[str, Any], Path], list[Path]]] = {
    "offline": plot_offline,
    "kernels": plot_kernels,
    "attention": plot_attention,
    "serving": plot_serving,
    "quantized": plot_quantized,
    "embeddings": plot_embeddings,
    "scoring": plot_scoring,
    "scaling": plot_scaling,
}


def make_plots(payload: Mapping[str, Any], out: Path) -> list[Path]:
    """The PNGs of one benchmark payload written into ``out`` (none for benchmarks or
    payloads without plots); raises :class:`PlotsUnavailable` without matplotlib."""
    plotter = PLOTTERS.get(payload.get("benchmark", ""))
    if plotter is None or not payload.get("results"):
        return []
    return plotter(payload, Path(out))
