"""bench/report.py: every benchmark program against its baselines in one run -> bench/report.md + plots.

    .venv/bin/python bench/report.py [--quick] [--only NAME,NAME] [--no-programs] [--no-sweep]
                                     [--out bench/report.md] [--timeout 1800] [--threads N]

What it runs (the shapes and arguments of everything live in bench/shapes.json):

* each program of bench/shapes.json with its arguments (``full``, or ``quick`` with --quick) and, for a
  program with a ``table``, that shape table of shapes.json as options (bench_shapes.options), one after
  another (the Python programs' defaults read from the same shapes file: MASKPACK_BENCH_SHAPES), stdout
  and stderr captured, the load average read before and after each; its headline lines (those with a
  ratio, a target, GFLOP/s or a median) go into the report, its whole output into a folded section.
  Programs marked ``left_out`` are listed with the reason.
* two sweeps over sequence length, run here in this process on ``threads`` threads, each side
  alternating with its baseline rep by rep (a busy moment of a shared machine hits both): causal
  attention of one sequence (maskpack.attention against torch's scaled_dot_product_attention) and
  the gated delta rule of one segment (maskpack.gated_delta_rule against transformers'
  torch_chunk_gated_delta_rule), forward; each figure the median over the reps with its spread
  (the 25th to 75th percentile, and the extremes in the JSON).
* ``maskpack cp-sim`` (per-rank attention work under zigzag, contiguous and area-balanced CP dealing)
  at the ranks of shapes.json, and its per-rank picture.

The plots (matplotlib, beside the report in bench/report/): time and GFLOP/s against sequence length,
the fraction of the f32 FMA peak (the peak bench_gdn / bench_attention measured in the same run, else
torch's sgemm throughput, said so), the speed-up over each baseline, the CP schemes' per-rank work.
The report states the machine (CPU model, cores, the ISA each kernel ran, torch), the date and the
load average. ``--quick`` runs the programs' quick arguments and small sweeps (for testing the report,
not for figures to quote).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

import bench_shapes  # bench/ is this script's folder: the shape tables as options, as the programs read them

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADLINE = re.compile(r"(->|\d\.\d+x\b|\bx torch\b|target|GFLOP/s|RESULT|MET\b|MISSED|speed-?up|median|ratio)", re.I)
PEAK = re.compile(r"(?:f32|fp32) FMA peak[^:\n]*:\s*([\d.]+) GFLOP/s|highest peak measured \(([\d.]+) GFLOP/s\)")


def load() -> List[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def cpu_flags() -> List[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    return [x for x in ("avx2", "fma", "avx512f", "avx512bw", "avx512_bf16", "amx_tile", "amx_bf16")
                            if x in have]
    except OSError:
        pass
    return []


def machine(threads: int) -> Dict[str, Any]:
    info: Dict[str, Any] = {"cpu": cpu_model(), "cores": os.cpu_count(), "flags": cpu_flags(), "threads": threads,
                            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                            "load_start": load()}
    try:
        import torch

        info["torch"] = torch.__version__
    except ImportError:
        info["torch"] = None
    try:
        import maskpack

        info["maskpack"] = maskpack.__version__
        info["isa"] = {}
        try:
            info["isa"]["gated_delta_rule"] = maskpack.gdn_isa()
        except Exception as e:  # noqa: BLE001 (reported, never fatal)
            info["isa"]["gated_delta_rule"] = f"unknown ({e})"
        try:
            from maskpack import attention_isa

            info["isa"]["attention f32"] = attention_isa("float32")
            info["isa"]["attention bf16"] = attention_isa("bfloat16")
        except Exception as e:  # noqa: BLE001
            info["isa"]["attention"] = f"unknown ({e})"
    except ImportError as e:
        info["maskpack"] = f"not importable ({e})"
    return info


# ---- the programs ------------------------------------------------------------------------------------


def expand(args: List[str], ctx: Dict[str, str]) -> List[str]:
    return [a.format(**ctx) for a in args]


def run_program(p: Dict[str, Any], quick: bool, ctx: Dict[str, str], timeout: int) -> Dict[str, Any]:
    cmd = expand(p["cmd"], ctx) + expand(p["quick" if quick else "full"], ctx) + p.get("table_args", [])
    exe = cmd[0]
    out: Dict[str, Any] = {"name": p["name"], "cmd": " ".join(shlex.quote(c) for c in cmd), "load_before": load()}
    if not (os.path.isabs(exe) and os.access(exe, os.X_OK)) and not exe.endswith("python") and "/" in exe:
        if not os.access(os.path.join(ROOT, exe), os.X_OK):
            out.update(status="not built", output=f"{exe} is not there (make build)")
            return out
    script = next((c for c in cmd[1:2] if c.endswith(".py")), None)
    if script and not os.path.isfile(os.path.join(ROOT, script)):
        out.update(status="missing", output=f"{script} is not in this tree")
        return out
    if p.get("needs") and "build/upstream" in p["needs"] and not os.path.isdir(os.path.join(ROOT, "build", "upstream")):
        out.update(status="skipped", output=f"needs {p['needs']}")
        return out
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(x for x in (ctx["pythonpath"], env.get("PYTHONPATH", "")) if x)
    env["MASKPACK_BENCH_SHAPES"] = ctx["shapes"]  # a program's defaults come from the file the report runs
    t0 = time.perf_counter()
    try:
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
        text = r.stdout + (("\n[stderr]\n" + r.stderr) if r.stderr.strip() else "")
        out.update(status="ok" if r.returncode == 0 else f"exit {r.returncode}", output=text)
    except subprocess.TimeoutExpired as e:
        so = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        out.update(status=f"timed out after {timeout} s", output=so)
    except OSError as e:
        out.update(status="could not run", output=str(e))
    out["seconds"] = round(time.perf_counter() - t0, 1)
    out["load_after"] = load()
    out["headlines"] = [ln.strip() for ln in out["output"].splitlines() if HEADLINE.search(ln)][:16]
    m = [float(x) for pair in PEAK.findall(out["output"]) for x in pair if x]
    if m:
        out["peak_gflops"] = max(m)
    return out


# ---- the sweeps ----------------------------------------------------------------------------------------


def spread(xs: List[float]) -> Dict[str, float]:
    xs = sorted(xs)
    q = statistics.quantiles(xs, n=4) if len(xs) >= 2 else [xs[0], xs[0], xs[0]]
    return {"median": statistics.median(xs), "p25": q[0], "p75": q[2], "min": xs[0], "max": xs[-1], "n": len(xs)}


def paired(fns: Dict[str, Any], reps: int) -> Dict[str, Dict[str, float]]:
    """Each function once as warm-up, then ``reps`` rounds, the order rotating round by round."""
    names = list(fns)
    for n in names:
        fns[n]()
    times: Dict[str, List[float]] = {n: [] for n in names}
    for r in range(reps):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            t0 = time.perf_counter()
            fns[n]()
            times[n].append(time.perf_counter() - t0)
    return {n: spread(v) for n, v in times.items()}


def sweep_attention(cfg: Dict[str, Any], lens: List[int], reps: int, threads: int, progress) -> List[Dict[str, Any]]:
    import torch
    import torch.nn.functional as F

    import maskpack

    H, D = cfg["heads"], cfg["head_dim"]
    rows = []
    for S in lens:
        progress(f"sweep attention S={S}")
        g = torch.Generator().manual_seed(S)
        q, k, v = (torch.randn(S, H, D, generator=g) for _ in range(3))
        lay = maskpack.Layout.from_lengths([S], placement="packed")
        qt, kt, vt = (x.transpose(0, 1)[None].contiguous() for x in (q, k, v))  # [1, H, S, D]

        def ours():
            with torch.no_grad():
                maskpack.attention(q, k, v, lay, threads=threads)

        def sdpa():
            with torch.no_grad():
                F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)

        res = paired({"maskpack": ours, "torch sdpa": sdpa}, reps)
        flops = 4.0 * (S * (S + 1) / 2) * D * H  # QK^T and PV over the allowed (causal) pairs
        rows.append({"S": S, "flops": flops, "times": res})
    return rows


def sweep_gdn(cfg: Dict[str, Any], lens: List[int], reps: int, threads: int, progress) -> List[Dict[str, Any]]:
    import torch

    import maskpack
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule

    H, HV, K, V = cfg["heads"], cfg["value_heads"], cfg["key_dim"], cfg["value_dim"]
    rows = []
    for S in lens:
        progress(f"sweep gated delta rule S={S}")
        g = torch.Generator().manual_seed(S)
        q = torch.randn(S, H, K, generator=g)
        k = torch.randn(S, H, K, generator=g)
        v = torch.randn(S, HV, V, generator=g)
        gate = -torch.nn.functional.softplus(torch.randn(S, HV, generator=g)) * 0.5
        beta = torch.rand(S, HV, generator=g)
        lay = maskpack.Layout.from_lengths([S], placement="packed")
        rep = HV // H  # transformers' rule takes as many key heads as value heads
        qh, kh = (x.repeat_interleave(rep, dim=1)[None] for x in (q, k))

        def ours():
            with torch.no_grad():
                maskpack.gated_delta_rule(q, k, v, gate, beta, lay, threads=threads)

        def theirs():
            with torch.no_grad():
                torch_chunk_gated_delta_rule(qh, kh, v[None], gate[None], beta[None], use_qk_l2norm_in_kernel=True)

        res = paired({"maskpack": ours, "transformers torch_chunk": theirs}, reps)
        flops = 2.0 * gdn_chunk_macs(S, H, HV, K, V)
        rows.append({"S": S, "flops": flops, "times": res})
    return rows


def gdn_chunk_macs(length: int, H: int, HV: int, K: int, V: int, chunk: int = 64) -> float:
    """The chunked rule's matrix work in multiply-adds, counted as bench/gdn/bench_gdn.c counts it
    (chunk_macs: Q K^T and K K^T once per key head, the unit-lower inverse at n^3/6, [Q; K] S from
    the second chunk on, Dv, P Dv and the state update per value head)."""
    macs = 0.0
    for t0 in range(0, length, chunk):
        n = float(min(chunk, length - t0))
        tri, stri = n * (n + 1) / 2, n * (n - 1) / 2
        macs += H * (tri * K + stri * K)
        macs += HV * (n ** 3 / 6.0 + (2.0 * n * K * V if t0 else 0.0) + tri * V + tri * V + n * K * V)
    return macs


def sgemm_peak(threads: int) -> float:
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    best = 0.0
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(4):
            a @ b
        best = max(best, 4 * 2 * 1024 ** 3 / (time.perf_counter() - t0) / 1e9)
    return best


def cp_sim(cfg: Dict[str, Any], quick: bool, build: str, plots: str) -> Dict[str, Any]:
    cli = os.path.join(build, "maskpack")
    if not os.access(cli, os.X_OK):
        return {"status": f"{cli} is not there (make build)"}
    tokens = cfg["quick_tokens" if quick else "tokens"]
    png = os.path.join(plots, "cp_per_rank_work.png")
    cmd = [cli, "cp-sim", "--tokens", str(tokens), "--ranks", cfg["ranks"], "--mix", cfg["mix"], "--png", png]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    rows = []
    for ln in r.stdout.splitlines():
        m = re.match(r"\s*(\d+)\s+(zigzag|contiguous|area-balanced)\s+([\d.e+]+)\s+([\d.]+)\s+(\d+)\s+([\d.]+)\s+([\d.e+]+)", ln)
        if m:
            rows.append({"ranks": int(m[1]), "scheme": m[2], "work_max": float(m[3]), "work_imbalance": float(m[4]),
                         "tokens_max": int(m[5]), "token_imbalance": float(m[6]), "bytes_per_step": float(m[7])})
    return {"cmd": " ".join(cmd), "output": r.stdout + r.stderr, "rows": rows,
            "png": png if os.path.isfile(png) else None, "status": "ok" if r.returncode == 0 else f"exit {r.returncode}"}


# ---- plots and the report ------------------------------------------------------------------------------


def plots(sweeps: Dict[str, List[Dict[str, Any]]], peak: Optional[float], cp: Dict[str, Any], out: str) -> List[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    for name, rows in sweeps.items():
        if not rows:
            continue
        S = [r["S"] for r in rows]
        sides = list(rows[0]["times"])
        fig, ax = plt.subplots(1, 4 if peak else 3, figsize=(18 if peak else 14, 3.8))
        for side in sides:
            med = [r["times"][side]["median"] * 1e3 for r in rows]
            lo = [r["times"][side]["p25"] * 1e3 for r in rows]
            hi = [r["times"][side]["p75"] * 1e3 for r in rows]
            ax[0].errorbar(S, med, yerr=[[m - a for m, a in zip(med, lo)], [b - m for m, b in zip(med, hi)]], marker="o",
                           capsize=3, label=side)
            gf = [r["flops"] / r["times"][side]["median"] / 1e9 for r in rows]
            ax[1].plot(S, gf, marker="o", label=side)
            if peak:
                ax[3].plot(S, [x / peak for x in gf], marker="o", label=side)
        base = sides[0]
        for side in sides[1:]:
            ax[2].plot(S, [r["times"][side]["median"] / r["times"][base]["median"] for r in rows], marker="o",
                       label=f"over {side}")
        ax[2].axhline(1.0, color="grey", lw=0.8, ls="--")
        titles = ["time (ms, median; bars 25-75 %)", "GFLOP/s", f"speed-up of {base}", "fraction of peak"]
        for a, t in zip(ax, titles):
            a.set_xscale("log", base=2)
            a.set_xlabel("sequence length")
            a.set_title(t, fontsize=10)
            a.legend(fontsize=8)
        ax[0].set_yscale("log")
        fig.suptitle(name)
        fig.tight_layout()
        path = os.path.join(out, "sweep_" + re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_") + ".png")
        fig.savefig(path, dpi=90)
        plt.close(fig)
        files.append(path)
    if cp.get("rows"):
        fig, ax = plt.subplots(1, 2, figsize=(11, 3.8))
        for scheme in ("zigzag", "contiguous", "area-balanced"):
            rr = [r for r in cp["rows"] if r["scheme"] == scheme]
            ax[0].plot([r["ranks"] for r in rr], [r["work_imbalance"] for r in rr], marker="o", label=scheme)
            ax[1].plot([r["ranks"] for r in rr], [r["work_max"] for r in rr], marker="o", label=scheme)
        for a, t in zip(ax, ("attention work: max / mean over ranks", "the busiest rank's work (query-key pairs)")):
            a.set_xscale("log", base=2)
            a.set_xlabel("CP ranks")
            a.set_title(t, fontsize=10)
            a.legend(fontsize=8)
        ax[1].set_yscale("log")
        fig.tight_layout()
        path = os.path.join(out, "cp_schemes.png")
        fig.savefig(path, dpi=90)
        plt.close(fig)
        files.append(path)
    return files


def fmt_ms(s: Dict[str, float]) -> str:
    return f"{s['median'] * 1e3:.2f} ({s['p25'] * 1e3:.2f}-{s['p75'] * 1e3:.2f})"


def write_report(res: Dict[str, Any], path: str) -> None:
    m = res["machine"]
    rel = lambda p: os.path.relpath(p, os.path.dirname(path))  # noqa: E731
    L = [f"# maskpack benchmark report{' (quick: not figures to quote)' if res['quick'] else ''}", ""]
    ran = [p["name"] for p in res["programs"] if p.get("status") and not str(p["status"]).startswith("not run")]
    L.append(f"Written by `bench/report.py{' --quick' if res['quick'] else ''}` on {m['date']}; shapes and arguments: "
             f"[bench/shapes.json](shapes.json). Programs run: {', '.join(ran) if ran else 'none'}"
             f"{'' if len(ran) == len([p for p in res['programs'] if not p.get('left_out')]) else ' (not all: `make bench` runs every one)'}.")
    L.append("")
    L.append(f"* machine: {m['cpu']}, {m['cores']} cores ({', '.join(m['flags']) or 'no AVX2'}), {m['threads']} threads "
             f"per benchmark")
    L.append(f"* kernels ran: " + ", ".join(f"{k} `{v}`" for k, v in m.get("isa", {}).items()))
    L.append(f"* torch {m['torch']}, Python {m['python']}, maskpack {m.get('maskpack')}")
    L.append(f"* load average (1, 5, 15 min): {m['load_start']} at the start, {res.get('load_end')} at the end "
             "(a busy machine slows both sides of a pair alike, not the absolute times)")
    for n in m.get("notes", []):
        L.append(f"* note: {n}")
    peak = res.get("peak")
    if peak:
        L.append(f"* peak for the fractions: {peak['gflops']:.1f} GFLOP/s ({peak['source']})")
    L.append("")
    if res["sweeps"]:
        L.append("## Kernels against their baselines, by sequence length")
        L.append("")
        L.append("Forward, float32, one sequence of S tokens; medians over the reps with the 25th-75th percentile in "
                 "brackets; the two sides alternate rep by rep. GFLOP/s count the same work for both sides: attention "
                 "the products over the allowed (causal) query-key pairs, the gated delta rule the chunked form's "
                 "matrix work as bench/gdn/bench_gdn.c counts it (so a side doing more work shows a lower rate).")
        L.append("")
        for name, rows in res["sweeps"].items():
            if not rows:
                continue
            sides = list(rows[0]["times"])
            L.append(f"### {name}")
            L.append("")
            L.append("| S | " + " | ".join(f"{s} ms" for s in sides) + f" | speed-up | {sides[0]} GFLOP/s |"
                     + (" of peak |" if peak else ""))
            L.append("|---" * (len(sides) + 3 + (1 if peak else 0)) + "|")
            for r in rows:
                t = r["times"]
                gf = r["flops"] / t[sides[0]]["median"] / 1e9
                sp = " / ".join(f"{t[s]['median'] / t[sides[0]]['median']:.2f}x" for s in sides[1:])
                L.append(f"| {r['S']} | " + " | ".join(fmt_ms(t[s]) for s in sides) + f" | {sp} | {gf:.1f} |"
                         + (f" {gf / peak['gflops']:.1%} |" if peak else ""))
            L.append("")
    for f in res["plots"]:
        L.append(f"![{os.path.basename(f)}]({rel(f)})")
        L.append("")
    cp = res.get("cp_sim") or {}
    if cp.get("rows"):
        L.append("## Context parallelism: per-rank attention work")
        L.append("")
        L.append(f"`{cp['cmd'].replace(ROOT + '/', '')}`: imbalance = the busiest rank's work over the mean.")
        L.append("")
        L.append("| ranks | scheme | work imbalance | token imbalance | ring bytes / step |")
        L.append("|---|---|---|---|---|")
        for r in cp["rows"]:
            L.append(f"| {r['ranks']} | {r['scheme']} | {r['work_imbalance']:.3f} | {r['token_imbalance']:.3f} | "
                     f"{r['bytes_per_step']:.3g} |")
        L.append("")
        if cp.get("png"):
            L.append(f"![per-rank work]({rel(cp['png'])})")
            L.append("")
    L.append("## The benchmark programs")
    L.append("")
    L.append("| program | baselines | shapes | status | seconds | load before -> after |")
    L.append("|---|---|---|---|---|---|")
    for p in res["programs"]:
        if p.get("left_out"):
            L.append(f"| {p['name']} | - | - | left out: {p['left_out']} | | |")
            continue
        shp = p.get("shapes", "")
        if p.get("table"):
            shp += f" (table {p['table']}: {' '.join(p.get('table_args', []))})"
        shp += "; its defaults read from shapes.json" if p.get("reads") else ""
        L.append(f"| {p['name']} | {p.get('baselines', '')} | {shp} | {p.get('status', 'not run')} | "
                 f"{p.get('seconds', '')} | {p.get('load_before', '')} -> {p.get('load_after', '')} |")
    L.append("")
    for p in res["programs"]:
        if p.get("left_out") or "output" not in p:
            continue
        L.append(f"### {p['name']}")
        L.append("")
        L.append(f"`{p['cmd'].replace(ROOT + '/', '')}` ({p['status']}, {p.get('seconds', '?')} s)")
        L.append("")
        if p.get("headlines"):
            L.append("```")
            L.extend(p["headlines"])
            L.append("```")
            L.append("")
        L.append("<details><summary>whole output</summary>")
        L.append("")
        L.append("```")
        L.extend(p["output"].rstrip().splitlines())
        L.append("```")
        L.append("</details>")
        L.append("")
    with open(path, "w") as f:
        f.write("\n".join(L) + "\n")


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the programs' quick arguments and small sweeps (testing)")
    ap.add_argument("--only", default=None, help="comma-separated program names to run (default: all)")
    ap.add_argument("--no-programs", action="store_true", help="run no program, only the sweeps and cp-sim")
    ap.add_argument("--no-sweep", action="store_true", help="skip the sweeps")
    ap.add_argument("--shapes", default=os.path.join(ROOT, "bench", "shapes.json"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "report.md"))
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per program (default 1800)")
    ap.add_argument("--threads", type=int, default=None, help="threads per benchmark (default: shapes.json)")
    ap.add_argument("--render", metavar="JSON", default=None,
                    help="run nothing: write the report and plots again from a report.json of an earlier run")
    a = ap.parse_args(argv)
    if a.render:
        with open(a.render) as f:
            res = json.load(f)
        plot_dir = os.path.splitext(a.out)[0]
        os.makedirs(plot_dir, exist_ok=True)
        res["plots"] = plots(res["sweeps"], (res.get("peak") or {}).get("gflops"), res.get("cp_sim") or {}, plot_dir)
        write_report(res, a.out)
        print(f"report: {a.out} (rendered from {a.render})")
        return 0
    with open(a.shapes) as f:
        shapes = json.load(f)
    threads = a.threads or int(shapes.get("threads", 2))
    plot_dir = os.path.splitext(a.out)[0]
    os.makedirs(plot_dir, exist_ok=True)
    names = [p["name"] for p in shapes["programs"]]
    only = None
    if a.only:
        only = [x.strip() for x in a.only.split(",") if x.strip()]
        bad = [x for x in only if x not in names]
        if bad:
            print(f"report.py: --only: unknown {bad}; known: {', '.join(names)}", file=sys.stderr)
            return 2

    def progress(msg: str) -> None:
        print(f"report [{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    res: Dict[str, Any] = {"quick": a.quick, "machine": machine(threads), "programs": [], "sweeps": {}, "plots": []}
    src_py = os.path.join(ROOT, "python")
    ctx = {"build": a.build, "threads": str(threads), "py": sys.executable, "shapes": os.path.abspath(a.shapes),
           "pythonpath": src_py if any(n.startswith("_maskpack") for n in os.listdir(os.path.join(src_py, "maskpack")))
           else ""}
    for p in shapes["programs"]:
        entry = dict(p)
        if p.get("left_out"):
            res["programs"].append(entry)
            continue
        if p.get("table"):
            try:
                entry["table_args"] = bench_shapes.options(bench_shapes.table_of(p["table"], shapes, a.shapes))
            except bench_shapes.ShapesError as e:  # the report says so; the other programs still run
                entry["status"] = f"not run: {e}"
                res["programs"].append(entry)
                continue
        if a.no_programs or (only is not None and p["name"] not in only):
            entry["status"] = "not run (--only / --no-programs)"
            res["programs"].append(entry)
            continue
        progress(f"{p['name']}")
        entry.update(run_program(entry, a.quick, ctx, a.timeout))
        res["programs"].append(entry)
    peaks = [p["peak_gflops"] for p in res["programs"] if p.get("peak_gflops")]
    if not a.no_sweep:
        sw = shapes["sweep"]
        lens = sw["quick_seq_lens" if a.quick else "seq_lens"]
        reps = sw["quick_reps" if a.quick else "reps"]
        import torch

        torch.set_num_threads(threads)
        try:
            res["sweeps"]["attention (causal)"] = sweep_attention(sw["attention"], lens, reps, threads, progress)
        except Exception as e:  # noqa: BLE001 (the report says what failed; the rest still runs)
            res["machine"].setdefault("notes", []).append(f"attention sweep failed: {e}")
        try:
            res["sweeps"]["gated delta rule"] = sweep_gdn(sw["gdn"], lens, reps, threads, progress)
        except Exception as e:  # noqa: BLE001
            res["machine"].setdefault("notes", []).append(f"gated delta rule sweep failed: {e}")
        if peaks:
            res["peak"] = {"gflops": max(peaks), "source": "the f32 FMA peak a C program measured in this run"}
        else:
            res["peak"] = {"gflops": sgemm_peak(threads), "source": "torch sgemm 1024^3 throughput: no C program measured "
                           "the FMA peak in this run (run bench_gdn or bench_attention with the report)"}
    progress("cp-sim")
    res["cp_sim"] = cp_sim(shapes["cp_sim"], a.quick, a.build, plot_dir)
    try:
        res["plots"] = plots(res["sweeps"], (res.get("peak") or {}).get("gflops"), res["cp_sim"], plot_dir)
    except ImportError as e:
        res["machine"].setdefault("notes", []).append(f"no plots: {e} (pip install matplotlib)")
    res["load_end"] = load()
    write_report(res, a.out)
    with open(os.path.join(plot_dir, "report.json"), "w") as f:
        json.dump(res, f, indent=1, default=str)
    print(f"report: {a.out} (plots and report.json in {plot_dir}/)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
