"""check_cp_cuda.py: the accelerator checks of the differentiable CP collectives (issue 21, item 2), for a
machine with a GPU.

    bash tools/device/build_ext.sh /tmp/mp && PYTHONPATH=/tmp/mp python tools/device/check_cp_cuda.py

1. Probe: which torch.distributed set-ups give WORLD ranks on this machine (NCCL with one GPU per rank,
   NCCL with ranks sharing a GPU, gloo with CUDA tensors), collective by collective.
2. On every NCCL set-up that works (WORLD ranks, and always 1): cp_all_gather (forward and its
   reduce-scatter backward), Batch.to_padded(group=), ulysses_all_to_all both ways with its backward and
   cp_loss with its gradient, on device tensors, equal the single-process CPU reference (float64: bit for
   bit where nothing is summed); a host tensor handed to an NCCL group is refused on every rank, naming
   the argument and both devices.
Exits non-zero when a check fails. ``--device cpu`` runs check 2 over gloo on the CPU (the same code), so
the script itself is tested where no GPU is."""

import argparse
import os
import sys
import tempfile
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import maskpack

LENGTHS = [7, 2, 12, 5, 9, 3]
H = 4


def _batch():
    S = max(LENGTHS)
    mask = (torch.arange(S)[None] < torch.tensor(LENGTHS)[:, None]).long()
    ids = (torch.arange(len(LENGTHS) * S).reshape(len(LENGTHS), S) + 1) * mask
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.where(mask.bool(), ids, -100)}


def _table():
    return torch.randn(1000, H, dtype=torch.float64, generator=torch.Generator().manual_seed(5))


def _weights():
    g = torch.Generator().manual_seed(6)
    return (torch.randn(H, H, dtype=torch.float64, generator=g),
            torch.randn(len(LENGTHS), max(LENGTHS), H, dtype=torch.float64, generator=g))


# ---- 1. the probe -----------------------------------------------------------------------------------


def _probe_worker(rank, world, init_file, backend, share, out_dir):
    res = {}
    try:
        dev = torch.device("cuda", 0 if share else rank)
        torch.cuda.set_device(dev)
        dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world)
        x = torch.full((4,), float(rank + 1), device=dev)
        tries = {
            "all_reduce": lambda: dist.all_reduce(x.clone()),
            "all_gather": lambda: dist.all_gather([torch.empty_like(x) for _ in range(world)], x),
            "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(torch.empty(4 * world, device=dev), x),
            "all_to_all": lambda: dist.all_to_all([torch.empty(2, device=dev) for _ in range(world)],
                                                  [torch.ones(2, device=dev) for _ in range(world)]),
            "reduce_scatter": lambda: dist.reduce_scatter(torch.empty_like(x), [x.clone() for _ in range(world)]),
        }
        for name, fn in tries.items():
            try:
                fn()
                torch.cuda.synchronize()
                res[name] = "ok"
            except Exception as exc:  # noqa: BLE001 - reported, not judged
                res[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:140]}"
        dist.destroy_process_group()
    except Exception as exc:  # noqa: BLE001
        res["init"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    torch.save(res, os.path.join(out_dir, f"probe{rank}.pt"))


def _spawn(fn, world, args, timeout):
    """Run fn(rank, world, init, *args, out_dir) on WORLD processes; (ok, out_dir, message)."""
    d = tempfile.mkdtemp()
    init = os.path.join(d, "init")
    ctx = mp.start_processes(fn, args=(world, init) + tuple(args) + (d,), nprocs=world, join=False,
                             start_method="spawn")
    try:
        import time

        end = time.monotonic() + timeout
        while not ctx.join(timeout=max(0.1, end - time.monotonic())):
            if time.monotonic() >= end:
                for p in ctx.processes:
                    p.kill()
                return False, d, f"timed out after {timeout} s"
        return True, d, ""
    except Exception as exc:  # noqa: BLE001 - a rank's exception (ProcessRaisedException)
        return False, d, str(exc)[-1500:]


def probe(world):
    setups = []
    n_gpu = torch.cuda.device_count()
    print(f"probe: {n_gpu} GPU(s): {[torch.cuda.get_device_name(i) for i in range(n_gpu)]}")
    if n_gpu >= world:
        setups.append(("nccl", False))
    setups += [("nccl", True), ("gloo", True)]
    usable = []
    for backend, share in setups:
        ok, d, msg = _spawn(_probe_worker, world, (backend, share), timeout=120)
        label = f"{backend}, {world} ranks on {'one shared GPU' if share else 'a GPU each'}"
        if not ok:
            print(f"probe: {label}: the processes failed: {msg.strip().splitlines()[-1] if msg.strip() else ''}")
            continue
        res = [torch.load(os.path.join(d, f"probe{r}.pt")) for r in range(world)]
        print(f"probe: {label}:")
        for k in res[0]:
            print(f"    {k:24s} {res[0][k]}")
        if backend == "nccl" and all(v == "ok" for r in res for v in r.values()):
            usable.append((backend, share))
    return usable


# ---- 2. the collectives on device tensors ------------------------------------------------------------


def _cp_worker(rank, world, init_file, backend, device, share, out_dir):
    try:
        if device == "cuda":
            dev = torch.device("cuda", 0 if share else rank)
            torch.cuda.set_device(dev)
        else:
            dev = torch.device("cpu")
        dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world)
        grp = dist.group.WORLD
        out = {}
        batch = _batch()
        table = _table().to(dev)
        w0, G = _weights()
        G = G.to(dev)
        b = maskpack.prepare_batch(batch, padding_free=True, cp=world, cp_rank=rank, cp_scheme="zigzag").to(dev)
        # cp_all_gather itself, on the whole batch's packed layout (also when world is 1)
        w = w0.to(dev).clone().requires_grad_()
        y = torch.tanh(table[b.input_ids] @ w)                      # this rank's tokens [T_local, H]
        whole = maskpack.cp_all_gather(y, b.global_layout, grp, scheme="zigzag", align=None)
        assert whole.device == dev, (whole.device, dev)
        (whole * (rank + 1)).sum().backward()
        gw = w.grad.clone()
        dist.all_reduce(gw, group=grp)
        out["part"], out["whole"], out["gather_grad"] = y.detach().cpu(), whole.detach().cpu(), gw.cpu()
        # Batch.to_padded(group=): the gather done by the bundle, back in the dataloader's padded layout
        w.grad = None
        y = torch.tanh(table[b.input_ids] @ w)
        padded = b.to_padded(y, group=grp)
        assert padded.device == dev
        (padded * G * (rank + 1)).sum().backward()
        gw = w.grad.clone()
        dist.all_reduce(gw, group=grp)
        out["padded"], out["padded_grad"] = padded.detach().cpu(), gw.cpu()
        # cp_loss: the exact token mean of the whole batch, equal on every rank
        w.grad = None
        per_token = (torch.tanh(table[b.input_ids] @ w) ** 2).sum(-1)
        loss = maskpack.cp_loss(per_token, b.loss_weights, grp)
        loss.backward()
        gl = w.grad.clone()
        dist.all_reduce(gl, group=grp)
        out["loss"], out["loss_grad"] = loss.detach().cpu(), gl.cpu()
        # Ulysses: [T_local, heads, D] sequence-split -> [T, heads/world, D] head-split and back
        heads = 4 * world
        x = torch.randn(b.input_ids.shape[0], heads, 3, dtype=torch.float64,
                        generator=torch.Generator().manual_seed(100 + rank)).to(dev).requires_grad_()
        hs = maskpack.ulysses_all_to_all(x, grp, scatter_dim=1, gather_dim=0)
        back = maskpack.ulysses_all_to_all(hs, grp, scatter_dim=0, gather_dim=1)
        assert hs.device == dev and torch.equal(back, x)
        (hs * (rank + 1)).sum().backward()
        out["uly_x"], out["uly_hs"], out["uly_gx"] = x.detach().cpu(), hs.detach().cpu(), x.grad.cpu()
        # a tensor on a device the backend does not move: refused on every rank, naming it
        if device == "cuda" and backend == "nccl":
            try:
                maskpack.cp_all_gather(y.detach().cpu(), b.global_layout, grp, scheme="zigzag", align=None)
                out["refusal"] = "accepted"
            except maskpack.Error as exc:
                out["refusal"] = str(exc)
        # maskpack's own kernels (CPU) refuse a device tensor by name, on every rank (on the CPU: meta)
        q = torch.randn(y.shape[0], 2 * world, 8, device=dev if device == "cuda" else "meta")
        try:
            maskpack.attention(q, q, q, b.global_layout, group=grp, cp_algorithm="all_gather")
            out["kernel"] = "accepted"
        except maskpack.Error as exc:
            out["kernel"] = str(exc)
        dist.barrier()
        torch.save(out, os.path.join(out_dir, f"cp{rank}.pt"))
        dist.destroy_process_group()
    except Exception:
        with open(os.path.join(out_dir, f"error{rank}.txt"), "w") as f:
            f.write(traceback.format_exc())
        raise


def _reference(world):
    """The single-process CPU run on the whole padded batch, for the same objectives."""
    batch = _batch()
    mask = batch["attention_mask"].bool()
    table = _table()
    w0, G = _weights()
    ref = {}
    w = w0.clone().requires_grad_()
    Y = torch.tanh(table[batch["input_ids"]] @ w) * mask[..., None]
    k = world * (world + 1) // 2  # sum over ranks of (rank + 1)
    (Y * k).sum().backward()
    ref["Y"], ref["gather_grad"] = Y.detach(), w.grad.clone()
    w.grad = None
    Y = torch.tanh(table[batch["input_ids"]] @ w) * mask[..., None]
    (Y * G * k).sum().backward()
    ref["padded_grad"] = w.grad.clone()
    w.grad = None
    per_token = (torch.tanh(table[batch["input_ids"]] @ w) ** 2).sum(-1)
    lab = mask.clone()
    for i, n in enumerate(LENGTHS):
        lab[i, n - 1] = False  # labels shift: a sequence's last token predicts nothing
    loss = per_token[lab].mean()
    loss.backward()
    ref["loss"], ref["loss_grad"] = loss.detach(), w.grad.clone()
    return ref, mask


def check_cp(world, backend, device, share, failures):
    label = f"{backend}, {world} rank(s), {device}{' (one shared GPU)' if share and world > 1 else ''}"
    ok, d, msg = _spawn(_cp_worker, world, (backend, device, share), timeout=300)
    if not ok:
        errs = [open(os.path.join(d, f)).read() for f in sorted(os.listdir(d)) if f.startswith("error")]
        print(f"{label}: FAILED to run: {(errs[0] if errs else msg)[-1500:]}")
        failures.append(label)
        return
    ref, mask = _reference(world)
    got = [torch.load(os.path.join(d, f"cp{r}.pt")) for r in range(world)]
    b0 = maskpack.prepare_batch(_batch(), padding_free=True, cp=world, cp_rank=0, cp_scheme="zigzag")
    packed_ref = maskpack.relayout(ref["Y"], b0.source_layout, b0.global_layout)  # the whole, as the ranks hold it
    # the gather is a move of the ranks' own parts (computed on the device): bit for bit
    moved = maskpack.cp_gather([g["part"] for g in got], b0.global_layout, scheme="zigzag", align=None)
    moved_padded = maskpack.relayout(moved, b0.global_layout, b0.source_layout)
    rows = []

    def row(name, good, detail=""):
        rows.append((name, good))
        print(f"  {label:38s} {name:34s} {'equal' if good else 'DIFFERENT'} {detail}")

    for r, g in enumerate(got):
        row(f"rank {r} cp_all_gather forward", torch.equal(g["whole"], moved)
            and torch.allclose(g["whole"], packed_ref, rtol=1e-14, atol=1e-15))
        row(f"rank {r} to_padded forward", torch.equal(g["padded"], moved_padded)
            and torch.allclose(g["padded"], ref["Y"], rtol=1e-14, atol=1e-15))
        row(f"rank {r} cp_all_gather gradient", torch.allclose(g["gather_grad"], ref["gather_grad"], rtol=1e-12,
                                                               atol=1e-13))
        row(f"rank {r} to_padded gradient", torch.allclose(g["padded_grad"], ref["padded_grad"], rtol=1e-12,
                                                           atol=1e-13))
        # the weights are float32 (1/n rounded once): 6e-8 relative
        row(f"rank {r} cp_loss value", torch.allclose(g["loss"], ref["loss"], rtol=1.2e-7, atol=0))
        row(f"rank {r} cp_loss gradient", torch.allclose(g["loss_grad"], ref["loss_grad"], rtol=1.2e-7, atol=1e-12))
    full = torch.cat([g["uly_x"] for g in got], dim=0)
    for r, g in enumerate(got):
        row(f"rank {r} ulysses forward", torch.equal(g["uly_hs"], full[:, 4 * r:4 * r + 4]))
        want = torch.cat([torch.full((g["uly_x"].shape[0], 4, 3), float(q + 1), dtype=torch.float64)
                          for q in range(world)], dim=1)
        row(f"rank {r} ulysses gradient", torch.equal(g["uly_gx"], want))
        if "kernel" in g:
            msg = g["kernel"]
            row(f"rank {r} device tensor to CPU kernel refused", "q" in msg and "run on the CPU" in msg, f"({msg[:80]})")
        if "refusal" in g:
            msg = g["refusal"]
            row(f"rank {r} host tensor on nccl refused", "part" in msg and "cpu" in msg and "cuda" in msg,
                f"({msg[:100]})")
    if not all(good for _, good in rows):
        failures.append(label)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--world", type=int, default=2)
    args = ap.parse_args()
    failures = []
    if args.device == "cpu":
        check_cp(args.world, "gloo", "cpu", False, failures)
    else:
        if not torch.cuda.is_available():
            print("no CUDA device: nothing to check (run with --device cpu for the CPU path)")
            return 2
        usable = probe(args.world)
        check_cp(1, "nccl", "cuda", False, failures)
        for backend, share in usable:
            check_cp(args.world, backend, "cuda", share, failures)
        if not usable:
            print(f"no NCCL set-up of {args.world} ranks works on this machine (see the probe): NCCL checked on 1 rank")
        # gloo moves CUDA tensors (through the host): several ranks even on one GPU
        for world in sorted({2, args.world}):
            check_cp(world, "gloo", "cuda", True, failures)
    print("all checks passed" if not failures else f"FAILED: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
