"""check_moves_cuda.py: the accelerator checks of the moves (issue 17), for a machine with a GPU.

    bash tools/device/build_ext.sh /tmp/mp && PYTHONPATH=/tmp/mp python tools/device/check_moves_cuda.py

1. Every move (pack, unpack, re-padding, shard, padded -> shard, gather, last tokens, label shift, loss
   weights) and its gradient on device tensors equal the CPU (C engine) results bit for bit.
2. pack and unpack of a bf16 [8, 4096, 4096] tensor against a device-to-device copy of the same bytes,
   CUDA events, alternating pairs, median of per-pair ratios (target: >= 80 % of the copy bandwidth).
Exits non-zero when a check fails. ``--device cpu`` runs check 1 with engine="torch" on the CPU (the
same code path), so the script itself is tested where no GPU is."""

import argparse
import statistics
import sys

import torch

import maskpack
from maskpack import Layout


def bits(t):
    t = t.detach().cpu().contiguous()
    return t.view(torch.uint8) if t.dtype.itemsize == 1 else t.reshape(-1).view(torch.uint8)


def equal_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


def check_equal(dev, failures):
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0, 0, 0], [0] * 8, [1] * 8])
    lay = Layout.from_mask2d(mask)
    packed = lay.packed_of()
    whole = packed.pad_to_multiple(8)
    left = lay.padded_of("left", width=11)
    gen = torch.Generator().manual_seed(0)
    engine = "torch" if dev.type == "cpu" else None  # on the CPU: the device code path, forced
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        x = torch.randn(4, 8, 3, 5, generator=gen).to(dtype)
        cases = {
            "pack": lambda t, e: lay.pack(t, engine=e),
            "unpack": lambda t, e: lay.unpack(lay.pack(t, engine=e), pad_value=1.5, engine=e),
            "re-pad left": lambda t, e: maskpack.relayout(t, lay, left, pad_value=-2.0, engine=e),
            "shard cp=4": lambda t, e: lay.shard(t, 4, 3, engine=e),
            "gather": lambda t, e: maskpack.cp_gather([packed.shard(lay.pack(t, engine=e), 2, r, engine=e)
                                                        for r in range(2)], packed, engine=e),
            "gather -> padded": lambda t, e: maskpack.relayout(
                [whole.shard(maskpack.relayout(t, lay, whole, engine=e), 2, r, align=None, engine=e)
                 for r in range(2)], [whole.cp_shard(2, r, align=None) for r in range(2)], lay, engine=e),
            "last tokens": lambda t, e: lay.gather_last_tokens(t),
        }
        for name, f in cases.items():
            host = x.clone().requires_grad_()
            on = x.to(dev).requires_grad_()
            yh, yd = f(host, "c"), f(on, engine)
            ok = equal_bits(yh, yd) and yd.device.type == dev.type
            g = torch.randn(yh.shape, generator=gen).to(dtype)
            (gh,) = torch.autograd.grad(yh, host, g)
            (gd,) = torch.autograd.grad(yd, on, g.to(dev))
            ok = ok and equal_bits(gh, gd)
            print(f"  {str(dtype):15s} {name:18s} {'equal' if ok else 'DIFFERENT'}")
            if not ok:
                failures.append(f"{name} {dtype}")
    labels = torch.where(mask.bool(), torch.arange(32).reshape(4, 8), -100)
    sh, sd = lay.shift_labels(labels), lay.shift_labels(labels.to(dev), engine=engine)
    wh = lay.with_outputs("torch").loss_weights("sequence", labels=sh)
    wd = lay.loss_weights("sequence", labels=sd, engine=engine)
    ok = equal_bits(sh, sd) and equal_bits(wh, wd)
    print(f"  {'int64/float32':15s} {'labels, weights':18s} {'equal' if ok else 'DIFFERENT'}")
    if not ok:
        failures.append("labels")


def bandwidth(dev, pairs, failures):
    B, S, H = 8, 4096, 4096
    lengths = torch.randint(S // 2, S + 1, (B,), generator=torch.Generator().manual_seed(1))
    mask = torch.arange(S)[None, :] < lengths[:, None]
    lay = Layout.from_mask2d(mask)
    x = torch.randn(B, S, H, device=dev, dtype=torch.bfloat16)
    p = lay.pack(x)
    T = p.shape[0]

    def time_ms(fn):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        return a.elapsed_time(b)

    def measure(name, fn, nbytes, judged):
        # the copy moves the bytes the move reads and writes: a copy of nbytes / 2
        s2 = torch.empty(nbytes // 4, dtype=torch.bfloat16, device=dev)
        d2 = torch.empty_like(s2)
        fn(), d2.copy_(s2)
        ratios, ours, base = [], [], []
        for _ in range(pairs):
            o = time_ms(fn)
            c = time_ms(lambda: d2.copy_(s2))
            ours.append(o)
            base.append(c)
            ratios.append(c / o)
        r = statistics.median(ratios)
        gbs = nbytes / (statistics.median(ours) * 1e-3) / 1e9
        verdict = f"target >= 80 %: {'met' if r >= 0.8 else 'NOT met'}" if judged else "reported"
        print(f"  {name}: {statistics.median(ours):.3f} ms ({gbs:.0f} GB/s read+write) vs copy of the same bytes "
              f"{statistics.median(base):.3f} ms: {r:.0%} of the copy bandwidth ({verdict})")
        if judged and r < 0.8:
            failures.append(f"{name} bandwidth {r:.0%}")
        del s2, d2

    import maskpack._moves as moves

    limit = moves._RUN_LIMIT
    for way, lim in (("default: pack index_select, unpack contiguous runs", limit), ("index kernels", 0)):
        moves._RUN_LIMIT = lim
        measure(f"pack ({way})", lambda: lay.pack(x), 2 * T * H * 2, lim == limit)
        measure(f"unpack ({way})", lambda: lay.unpack(p), (T * H + B * S * H) * 2, lim == limit)
    moves._RUN_LIMIT = limit
    del x, p
    # many documents (the index kernels' case): 256 rows of up to 512 tokens
    B2, S2 = 256, 512
    lengths = torch.randint(1, S2 + 1, (B2,), generator=torch.Generator().manual_seed(2))
    lay2 = Layout.from_mask2d(torch.arange(S2)[None, :] < lengths[:, None])
    x2 = torch.randn(B2, S2, H, device=dev, dtype=torch.bfloat16)
    p2 = lay2.pack(x2)
    T2 = p2.shape[0]
    measure(f"pack, {B2} rows (index kernels)", lambda: lay2.pack(x2), 2 * T2 * H * 2, False)
    measure(f"unpack, {B2} rows (index kernels)", lambda: lay2.unpack(p2), (T2 * H + B2 * S2 * H) * 2, False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--pairs", type=int, default=11)
    a = ap.parse_args()
    dev = torch.device(a.device)
    print(f"check_moves_cuda: torch {torch.__version__}, device {dev}"
          + (f" ({torch.cuda.get_device_name(dev)})" if dev.type == "cuda" else ""))
    failures = []
    print("1. device results equal the CPU (C engine), outputs and gradients, bit for bit")
    check_equal(dev, failures)
    if dev.type == "cuda":
        print("2. bf16 [8, 4096, 4096] moves (and [256, 512, 4096]) against a device-to-device copy")
        bandwidth(dev, a.pairs, failures)
    print("FAILED: " + ", ".join(failures) if failures else "all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
