"""The GPU check's report: every figure of ``--work`` into ``--out`` (``jobs/gpu_check.py``).

Reads what the steps left in ``--work`` (``steps.json``, ``probe.json``,
``kernels.json``, ``kernel-table.json``, the ``syncbench comm`` results
``comm-*.h5`` and the run files ``train-*.h5`` and ``throughput-*.h5``) and
writes ``figures.json`` (every figure), ``report.md`` (the same as tables) and
the plots ``kernels.png``, ``comm.png`` and ``training.png`` (matplotlib's
Agg backend; without matplotlib the report says so and draws nothing). Any
piece missing is reported as missing: a failed step never stops the report.
Runs in the check's venv (NumPy, h5py and this repository).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any


def load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def comm_figures(work: Path) -> list[dict[str, Any]]:
    """One entry per ``syncbench comm`` result: its label, staging, sizes and latencies."""
    from syncbench.bench.micro.comm import read_results

    out = []
    for path in sorted(work.glob("comm-*.h5")):
        try:
            results = read_results(str(path))
        except Exception as exc:  # a run killed while writing: say so
            out.append({"label": path.stem[5:].replace("-", " "), "error": str(exc)})
            continue
        attrs = results["attrs"]
        out.append({"label": path.stem[5:].replace("-", " "), "op": attrs.get("op"),
                    "buffer": attrs.get("buffer"), "staging": attrs.get("staging", ""),
                    "ranks": attrs.get("world_size"),
                    "size": [int(v) for v in results["size"]],
                    "avg_us": [float(v) for v in results["avg_us"]],
                    "busbw_mbps": [float(v) for v in results["busbw_mbps"]],
                    "overlap_pct": [float(v) for v in results.get("overlap_pct", [])]})
    return out


def run_figures(path: Path) -> dict[str, Any]:
    """A run file's figures: samples/s, steps, OD-SGD's delayed steps, seconds per step by
    phase (rank mean), the machine context line, the CuPy package."""
    from syncbench.analysis.context import context_line
    from syncbench.analysis.runfile import read_run
    from syncbench.analysis.schema import PHASES

    run = read_run(path)
    steps = {r: len(cols["step"]) for r, cols in run.ranks.items()}
    warmup = int(run.attrs.get("warmup_steps", 0) or 0)
    phases = {}
    for phase in PHASES:
        per_rank = [float(cols[f"t_{phase}"].mean()) for cols in run.ranks.values()
                    if len(cols[f"t_{phase}"])]
        phases[phase] = sum(per_rank) / len(per_rank) if per_rank else math.nan
    return {"file": path.name, "algorithm": run.attrs.get("algorithm"),
            "model": run.attrs.get("model"), "ranks": run.attrs.get("world_size"),
            "backend": run.attrs.get("backend"), "devices": run.attrs.get("devices"),
            "cupy": f"{run.attrs.get('cupy_package', '')} {run.attrs.get('cupy_version', '')}"
            .strip(), "samples_per_s": float(run.summary.get("samples_per_s", math.nan)),
            "wall_s": float(run.summary.get("wall_s", math.nan)),
            "steps_per_rank": max(steps.values()) if steps else 0,
            "warmup_steps": warmup,
            "delayed_steps": max(0, max(steps.values()) - warmup) if steps and warmup else 0,
            "comm_fraction": float(run.summary.get("comm_fraction", math.nan)),
            "seconds_per_step": phases, "gpu_shared": run.attrs.get("gpu_shared"),
            "ranks_per_gpu": run.attrs.get("ranks_per_gpu"),
            "machine": context_line([run])}


def training_figures(work: Path, prefix: str) -> list[dict[str, Any]]:
    out = []
    for path in sorted(work.glob(f"{prefix}-*.h5")):
        try:
            out.append(run_figures(path))
        except Exception as exc:
            out.append({"file": path.name, "error": f"{type(exc).__name__}: {exc}"})
    return out


def gpu_vs_cpu(throughput: list[dict[str, Any]]) -> dict[str, Any]:
    """Per model: GPU samples/s over CPU samples/s (None where one is missing)."""
    by = {(t.get("model"), t.get("backend")): t.get("samples_per_s") for t in throughput}
    models = sorted({m for m, _ in by if m})
    return {m: (by[(m, "cupy")] / by[(m, "numpy")]
                if by.get((m, "cupy")) and by.get((m, "numpy")) else None) for m in models}


def figures(work: Path) -> dict[str, Any]:
    throughput = training_figures(work, "throughput")
    return {"check": load_json(work / "steps.json"), "probe": load_json(work / "probe.json"),
            "kernels": load_json(work / "kernels.json"),
            "kernel_table": load_json(work / "kernel-table.json"),
            "comm": comm_figures(work), "strategies": training_figures(work, "train"),
            "throughput": throughput, "gpu_vs_cpu": gpu_vs_cpu(throughput)}


def _num(value: Any, fmt: str = "{:.1f}") -> str:
    return "-" if value is None or (isinstance(value, float) and not math.isfinite(value)) \
        else fmt.format(value)


def report_markdown(fig: dict[str, Any]) -> str:
    """report.md: the check's steps, what it used, then every table."""
    check = fig.get("check") or {}
    lines = ["# GPU check", ""]
    if check:
        lines += [f"Budget {check.get('budget_s')} s; ran {check.get('elapsed_s')} s before "
                  "the report. GPU: " + ("yes" if check.get("gpu") else
                                         f"NONE ({check.get('gpu_reason')}): the GPU path "
                                         "did not run"), "",
                  "| step | status | s | limit s | detail |", "| --- | --- | --- | --- | --- |"]
        for step in check.get("steps", []):
            lines.append(f"| {step['name']} | {step['status']} | {step['seconds']} | "
                         f"{step['limit_s']} | {step['detail']} |")
        lines += ["", "## What it used", ""]
        lines += [f"- {k}: {v}" for k, v in (check.get("used") or {}).items()]
    kernels = fig.get("kernels")
    lines += ["", "## Kernel bandwidth (CUDA events, 1 GiB arrays)", ""]
    if kernels and kernels.get("bandwidth"):
        bw = kernels["bandwidth"]
        peak = bw.get("peak_gb_s")
        lines += [f"Device {kernels.get('device')}; device-to-device copy "
                  f"{bw['copy']['gb_s']:.1f} GB/s (read + write)"
                  + (f", reported peak {peak:.1f} GB/s" if peak else ""), "",
                  "| kernel | GB moved | ms | GB/s | vs copy |", "| --- | --- | --- | --- | --- |"]
        for row in bw["rows"]:
            lines.append(f"| {row['kernel']} | {row['bytes'] / 1e9:.2f} | {row['ms']:.3f} | "
                         f"{row['gb_s']:.1f} | {row['vs_copy']:.2f} |")
        lines += ["", "| GEMM | matmul TFLOP/s | cuBLAS TFLOP/s | cuBLAS time / matmul time |",
                  "| --- | --- | --- | --- |"]
        for row in kernels.get("gemm") or []:
            lines.append(f"| {row['gemm']} | {_num(row['matmul_tflop_s'], '{:.2f}')} | "
                         f"{_num(row['cublas_tflop_s'], '{:.2f}')} | "
                         f"{_num(row['matmul_vs_cublas'], '{:.2f}')} |")
    else:
        lines.append("not measured (see the kernels step)")
    table = fig.get("kernel_table")
    if table and table.get("rows"):
        bad = [r["case"] for r in table["rows"] if not r.get("ok")]
        lines += ["", f"Kernels against NumPy at the model's sizes: {len(table['rows'])} cases, "
                  + (f"MISMATCH: {', '.join(bad)}" if bad else "all agree")]
    lines += ["", "## syncbench comm (2 ranks)", ""]
    comm = [c for c in fig.get("comm", []) if "size" in c]
    if comm:
        sizes = sorted({s for c in comm for s in c["size"]})
        lines += ["| size | " + " | ".join(c["label"] for c in comm) + " |",
                  "| --- |" + " --- |" * len(comm)]
        for size in sizes:
            cells = [_num(c["avg_us"][c["size"].index(size)], "{:.1f} us")
                     if size in c["size"] else "-" for c in comm]
            lines.append(f"| {size} | " + " | ".join(cells) + " |")
    else:
        lines.append("not measured")
    lines += ["", "## Strategies on the GPU", ""]
    lines += _training_table(fig.get("strategies", []))
    lines += ["", "## Throughput, GPU and CPU (1 rank)", ""]
    lines += _training_table(fig.get("throughput", []))
    ratios = {m: r for m, r in (fig.get("gpu_vs_cpu") or {}).items() if r}
    if ratios:
        lines += ["", "GPU / CPU samples/s: " + ", ".join(f"{m} {r:.1f}x"
                                                         for m, r in ratios.items())]
    return "\n".join(lines) + "\n"


def _training_table(runs: list[dict[str, Any]]) -> list[str]:
    if not runs:
        return ["no run file"]
    lines = ["| run | ranks | samples/s | steps/rank | delayed | compute s/step | comm s/step "
             "| update s/step | machine |", "|" + " --- |" * 9]
    for r in runs:
        if "error" in r:
            lines.append(f"| {r['file']} | unreadable: {r['error']} |||||||| ")
            continue
        ph = r["seconds_per_step"]
        lines.append(f"| {r['algorithm']} {r['model']} {r['backend']} | {r['ranks']} | "
                     f"{_num(r['samples_per_s'], '{:.0f}')} | {r['steps_per_rank']} | "
                     f"{r['delayed_steps'] if r['warmup_steps'] else '-'} | "
                     f"{_num(ph.get('compute'), '{:.5f}')} | {_num(ph.get('comm'), '{:.5f}')} | "
                     f"{_num(ph.get('update'), '{:.5f}')} | {r['machine']} |")
    return lines


def plots(fig: dict[str, Any], out: Path) -> list[str]:
    """kernels.png, comm.png, training.png where there is something to draw; the names."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    made = []
    for name, draw in (("kernels.png", _plot_kernels), ("comm.png", _plot_comm),
                       ("training.png", _plot_training)):
        figure = draw(plt, fig)
        if figure is not None:
            figure.tight_layout()
            figure.savefig(out / name, dpi=110)
            plt.close(figure)
            made.append(name)
    return made


def _plot_kernels(plt: Any, fig: dict[str, Any]) -> Any:
    kernels = fig.get("kernels") or {}
    if not kernels.get("bandwidth"):
        return None
    bw = kernels["bandwidth"]
    figure, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar([r["kernel"] for r in bw["rows"]], [r["gb_s"] for r in bw["rows"]], color="tab:blue")
    ax.axhline(bw["copy"]["gb_s"], color="k", ls="--", label="device-to-device copy")
    if bw.get("peak_gb_s"):
        ax.axhline(bw["peak_gb_s"], color="tab:red", ls=":", label="reported peak")
    ax.set_ylabel("GB/s (1 GiB arrays)")
    ax.set_title(f"kernel bandwidth, {kernels.get('device', '')}")
    ax.legend(fontsize=8)
    ax.tick_params(axis="x", rotation=30)
    return figure


def _plot_comm(plt: Any, fig: dict[str, Any]) -> Any:
    comm = [c for c in fig.get("comm", []) if "size" in c]
    if not comm:
        return None
    figure, ax = plt.subplots(figsize=(6, 4))
    for c in comm:
        ax.loglog(c["size"], c["avg_us"], marker="o", label=c["label"])
    ax.set_xlabel("message bytes")
    ax.set_ylabel("latency (us)")
    ax.set_title("syncbench comm, 2 ranks")
    ax.legend(fontsize=8)
    return figure


def _plot_training(plt: Any, fig: dict[str, Any]) -> Any:
    strategies = [r for r in fig.get("strategies", []) if "error" not in r]
    throughput = [r for r in fig.get("throughput", []) if "error" not in r]
    if not (strategies or throughput):
        return None
    figure, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, runs in zip(axes, (strategies, throughput)):
        if not runs:
            ax.text(0.5, 0.5, "not run", ha="center", va="center", transform=ax.transAxes)
            ax.set_xticks([])
            ax.set_yticks([])
    axes[0].bar([f"{r['algorithm']}\nnp{r['ranks']}" for r in strategies],
                [r["samples_per_s"] for r in strategies], color="tab:green")
    axes[0].set_ylabel("samples/s")
    axes[0].set_title("strategies on the GPU (lenet)")
    axes[1].bar([f"{r['model']}\n{'GPU' if r['backend'] == 'cupy' else 'CPU'}"
                 for r in throughput], [r["samples_per_s"] for r in throughput],
                color="tab:purple")
    if throughput:
        axes[1].set_yscale("log")
    axes[1].set_title("throughput, 1 rank")
    return figure


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    config = parser.parse_args(argv)
    config.out.mkdir(parents=True, exist_ok=True)
    fig = figures(config.work)
    made = plots(fig, config.out)
    text = report_markdown(fig)
    if not made:
        text += "\nNo plot: nothing measured to draw, or matplotlib is missing.\n"
    (config.out / "report.md").write_text(text)
    (config.out / "figures.json").write_text(json.dumps(fig, indent=1, default=str) + "\n")
    print(text)
    print(f"report: figures.json, report.md{''.join(', ' + m for m in made)} in {config.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
