"""bench_compat.py: each maskpack.compat twin against the upstream function it replaces, on the CPU, on
one batch of B = 64 sequences of up to S = 4096 tokens (left and right padding mixed), at cp = 1, 2, 4
(rank 0; the other ranks' parts of a gather come from a faked all-gather, on both sides alike). Calls
alternate (ours, theirs) in one process; each figure is the median of the per-pair ratios theirs/ours
(> 1: the twin is faster). The upstream functions are loaded as the conformance tests load them
(tests/python/compat_upstream.py; build/upstream from `make test-conformance`). TransformerEngine's
thd_get_partitioned_indices is a CUDA kernel upstream: not timed here.

    .venv/bin/python bench/bench_compat.py [--pairs N] [--B 64] [--S 4096] [--H 64] [--only NAME]"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import types
import warnings
from typing import Any, Dict, Optional

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# One torch thread and maskpack's own worker threads on both sides: on a shared 2-core machine torch's
# OpenMP regions (and a team hosted on them) wait for descheduled threads; the upstream functions' small
# per-sequence ops run single-threaded anyway. --torch-threads and MASKPACK_THREAD_POOL change this.
os.environ.setdefault("MASKPACK_THREAD_POOL", "own")
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
warnings.filterwarnings("ignore")

import compat_upstream as cu  # noqa: E402
from maskpack.compat import mcore_bridge as tw_mb  # noqa: E402
from maskpack.compat import megatron as tw_mg  # noqa: E402
from maskpack.compat import swift as tw_sw  # noqa: E402
from maskpack.compat import te as tw_te  # noqa: E402
from maskpack.compat import twinkle as tw_tk  # noqa: E402
from maskpack.compat import verl as tw_v  # noqa: E402



def load() -> str:
    return "load average %.2f %.2f %.2f" % os.getloadavg()


def timed(fn) -> float:
    a = time.perf_counter()
    fn()
    return time.perf_counter() - a


def pairs(ours, theirs, n):
    ours(), theirs()
    to, tt = [], []
    for _ in range(n):
        to.append(timed(ours))
        tt.append(timed(theirs))
    return statistics.median([t / o for o, t in zip(to, tt)]), statistics.median(to), statistics.median(tt)


class Upstream:
    """The upstream functions, loaded once (see tests/python/compat_upstream.py)."""

    def __init__(self):
        from typing import List

        self.verl = cu.verl_mcore_util()
        self.uly = cu._load_file("upstream_verl_ulysses", cu.UPSTREAM / "verl/utils/ulysses.py", {})
        self.mg_utils = cu.megatron_module("megatron.core.utils")
        self.mamba = cu.megatron_module("megatron.core.ssm.mamba_context_parallel")
        self.mamba.tex = cu.FakeTex
        self.mamba.is_te_min_version = lambda v: True
        self.mtp = cu.megatron_module("megatron.core.transformer.multi_token_prediction")
        self.te = cu.te_functions()
        from megatron.core.packed_seq_params import PackedSeqParams

        self.ns_mb = {"torch": torch, "Optional": Optional, "mpu": None}
        self.split = cu.extract("mcore_bridge/utils/megatron_utils.py", "split_cp_inputs", self.ns_mb)
        self.npu = {"on": False}
        ns_q = {"torch": torch, "Optional": Optional, "is_torch_npu_available": lambda: self.npu["on"]}
        self.resolve = cu.extract("mcore_bridge/model/gpts/qwen3_next.py", "resolve_gdn_attention_mask", ns_q)
        self.hf_params = cu.extract("swift/utils/transformers_utils.py", "get_packed_seq_params", {"torch": torch})
        self.ns_l = {"torch": torch, "Dict": Dict, "Any": Any, "mpu": None, "split_cp_inputs": self.split,
                     "is_torch_npu_available": lambda: self.npu["on"]}
        self.sw_cp_rank = cu.extract("swift/megatron/utils/megatron_lm_utils.py", "get_batch_on_this_cp_rank",
                                     self.ns_l)
        self.ns_tr = {"torch": torch, "mpu": None}
        self.sw_recon = cu.extract("swift/megatron/trainers/utils.py", "reconstruct_tensor_cp", self.ns_tr)
        ns_tk = {"torch": torch, "Optional": Optional, "List": List, "Dict": Dict, "Any": Any,
                 "torch_util": types.SimpleNamespace(is_torch_npu_available=lambda: False),
                 "PackedSeqParams": PackedSeqParams, "InputFeature": dict,
                 "Platform": types.SimpleNamespace(device_prefix=lambda: "npu")}
        import heapq

        ns_b = {"heapq": heapq, "torch": torch}
        cu.extract("verl/utils/seqlen_balancing.py", "karmarkar_karp", ns_b)
        self.balance = cu.extract("verl/utils/seqlen_balancing.py", "get_seqlen_balanced_partitions", ns_b)
        self.rearrange, _ = cu.verl_seqlen_balancing()
        base = "twinkle/processor/base.py"
        self.tk = {n: cu.extract(base, n, ns_tk, cls="InputProcessor")
                   for n in ("pad_cp", "split_cp", "_get_packed_seq_params")}

    def set_ps(self, ps):
        self.ns_mb["mpu"] = ps
        self.ns_l["mpu"] = ps
        self.ns_tr["mpu"] = ps
        self.verl.mpu = ps
        self.mg_utils.parallel_state = ps


def cases(up: Upstream, B: int, S: int, H: int, cp: int):
    """(name, ours, theirs) closures for one cp, rank 0."""
    g = torch.Generator().manual_seed(cp)
    lens = torch.randint(S // 4, S + 1, (B,), generator=g)
    mask = torch.zeros(B, S, dtype=torch.bool)
    for i, n in enumerate(lens.tolist()):
        if i % 2:
            mask[i, S - n:] = True
        else:
            mask[i, :n] = True
    ids = torch.randint(1, 30000, (B, S), generator=g)
    kw = dict(tp=1, cp=cp, cp_rank=0)
    ps = cu.FakeParallelState(1, cp, 0)
    up.set_ps(ps)
    out = []

    # verl: padded batch <-> THD shard
    _, params = tw_v.preprocess_packed_seqs(ids, mask, **kw)
    hid_parts = [tw_v.preprocess_packed_seqs(ids, mask, tp=1, cp=cp, cp_rank=r)[0].float().unsqueeze(-1)
                 .expand(-1, -1, H).contiguous() for r in range(cp)]
    out.append(("verl.preprocess_packed_seqs", lambda: tw_v.preprocess_packed_seqs(ids, mask, **kw),
                lambda: up.verl.preprocess_packed_seqs(ids, mask)))

    def post_ours():
        with cu.fake_all_gather(hid_parts):
            return tw_v.postprocess_packed_seqs(hid_parts[0], params, mask, B, S, cp=cp, cp_rank=0)

    def post_theirs():
        with cu.fake_all_gather(hid_parts):
            return up.verl.postprocess_packed_seqs(hid_parts[0], params, mask, B, S)

    out.append(("verl.postprocess_packed_seqs", post_ours, post_theirs))

    # verl's engine: nested tensors
    nested = torch.nested.as_nested_tensor([ids[i, :int(n)] for i, n in enumerate(lens)], layout=torch.jagged)
    out.append(("verl.preprocess_thd_engine", lambda: tw_v.preprocess_thd_engine(nested, **kw),
                lambda: up.verl.preprocess_thd_engine(nested)))
    out.append(("verl.preprocess_thd_engine need_roll", lambda: tw_v.preprocess_thd_engine(nested, True, True, **kw),
                lambda: up.verl.preprocess_thd_engine(nested, True, True)))
    _, tparams, _ = tw_v.preprocess_thd_engine(nested, **kw)
    thd_parts = [tw_v.preprocess_thd_engine(nested, tp=1, cp=cp, cp_rank=r)[0].float().unsqueeze(-1)
                 .expand(-1, -1, H).contiguous() for r in range(cp)]

    def tpost_ours():
        with cu.fake_all_gather(thd_parts):
            return tw_v.postprocess_thd_engine(thd_parts[0], tparams, nested, B, cp=cp, cp_rank=0)

    def tpost_theirs():
        with cu.fake_all_gather(thd_parts):
            return up.verl.postprocess_thd_engine(thd_parts[0], tparams, nested, B)

    out.append(("verl.postprocess_thd_engine", tpost_ours, tpost_theirs))
    out.append(("verl.preprocess_bshd_engine", lambda: tw_v.preprocess_bshd_engine(nested, npu=False, **kw),
                lambda: up.verl.preprocess_bshd_engine(nested)))
    pre = [tw_v.preprocess_bshd_engine(nested, tp=1, cp=cp, cp_rank=r, npu=False) for r in range(cp)]
    bparts = [p[0].float().unsqueeze(-1).expand(-1, -1, H).contiguous() for p in pre]
    bmasks = [p[1] for p in pre]

    def gather_b(tensor_list, tensor, group=None, async_op=False):
        src = bmasks if tensor.dtype == torch.bool else bparts
        for j, t in enumerate(tensor_list):
            t.copy_(src[j])

    def bpost_ours():
        with cu.patched(torch.distributed, all_gather=gather_b):
            return tw_v.postprocess_bshd_engine(bparts[0], bmasks[0], cp=cp, cp_rank=0, npu=False)

    def bpost_theirs():
        with cu.patched(torch.distributed, all_gather=gather_b):
            return up.verl.postprocess_bshd_engine(bparts[0], bmasks[0])

    out.append(("verl.postprocess_bshd_engine", bpost_ours, bpost_theirs))
    out.append(("verl.build_vlm_attn_mask_thd", lambda: tw_v.build_vlm_attn_mask_thd(nested, 0, tp=1, cp=cp),
                lambda: up.verl.build_vlm_attn_mask_thd(nested, 0)))
    out.append(("verl.build_vlm_attn_mask_bshd",
                lambda: tw_v.build_vlm_attn_mask_bshd(nested, B, 0, None, tp=1, cp=cp, npu=False),
                lambda: up.verl.build_vlm_attn_mask_bshd(nested, B, 0)))
    if cp > 1:
        row = nested.values().unsqueeze(0)
        pos = torch.cat([torch.arange(int(n)) for n in lens]).unsqueeze(0)
        grp = cu.FakeGroup(cp, 0)

        def uly_theirs():
            with cu.patched(up.uly, _ULYSSES_SEQUENCE_PARALLEL_GROUP=grp), cu.fake_group_queries():
                return up.uly.ulysses_pad_and_slice_inputs(row, pos, cp)

        out.append(("verl.ulysses_pad_and_slice_inputs",
                    lambda: tw_v.ulysses_pad_and_slice_inputs(row, pos, cp, sp_rank=0), uly_theirs))

    # megatron / TransformerEngine / mcore-bridge on the packed stream (slots padded to 2 cp)
    cu_real = torch.zeros(B + 1, dtype=torch.int32)
    cu_real[1:] = torch.cumsum(lens, 0)
    slots = lens + (-lens) % (2 * cp)
    cu_pad = torch.zeros(B + 1, dtype=torch.int32)
    cu_pad[1:] = torch.cumsum(slots, 0)
    total = int(cu_pad[-1])
    stream = torch.randn(total, H, generator=g)
    psp = types.SimpleNamespace(cu_seqlens_q=cu_pad, cu_seqlens_q_padded=cu_pad)
    out.append(("megatron.get_batch_on_this_cp_rank",
                lambda: tw_mg.get_batch_on_this_cp_rank({"tokens": ids, "labels": ids, "loss_mask": mask.float(),
                                                         "position_ids": ids}, cp=cp, cp_rank=0),
                lambda: up.mg_utils.get_batch_on_this_cp_rank({"tokens": ids, "labels": ids,
                                                               "loss_mask": mask.float(), "position_ids": ids})))
    if cp == 1:
        lab = stream[:, 0].unsqueeze(0).contiguous()
        rpsp = types.SimpleNamespace(cu_seqlens_q=cu_pad)
        out.append(("megatron.roll_tensor (packed, no CP)", lambda: tw_mg.roll_tensor(lab, -1, -1, None, rpsp),
                    lambda: up.mtp.roll_tensor(lab, -1, -1, None, rpsp)))
    if cp > 1:
        out.append(("megatron.undo_attention_load_balancing (packed)",
                    lambda: tw_mg.undo_attention_load_balancing(stream, cp, psp),
                    lambda: up.mamba._undo_attention_load_balancing(stream, cp, psp)))
        out.append(("megatron.redo_attention_load_balancing (packed)",
                    lambda: tw_mg.redo_attention_load_balancing(stream, cp, psp),
                    lambda: up.mamba._redo_attention_load_balancing(stream, cp, psp)))
        out.append(("megatron.undo_attention_load_balancing",
                    lambda: tw_mg.undo_attention_load_balancing(stream, cp),
                    lambda: up.mamba._undo_attention_load_balancing(stream, cp)))
    flat = nested.values()
    labels = flat.clone()
    out.append(("te.pad_thd_sequences_for_cp", lambda: tw_te.pad_thd_sequences_for_cp(flat, labels, cu_real, 2 * cp),
                lambda: up.te.pad_thd_sequences_for_cp(flat, labels, cu_real, 2 * cp)))
    out.append(("te.generate_positional_ids_for_cp", lambda: tw_te.generate_positional_ids_for_cp(cu_real, 2 * cp),
                lambda: up.te.generate_positional_ids_for_cp(cu_real, 2 * cp)))
    out.append(("te.get_cu_seqlens_on_cp_rank",
                lambda: tw_te.get_cu_seqlens_on_cp_rank(cu_real, cu_pad // cp, cp, 0, True, True),
                lambda: up.te.get_cu_seqlens_on_cp_rank(cu_real, cu_pad // cp, cp, 0, True, True)))
    if cp > 1:
        ids_p = torch.randint(1, 99, (1, total), generator=g)
        grp = cu.FakeGroup(cp, 0)

        def te_theirs():
            with cu.fake_group_queries():
                return up.te.get_batch_on_this_cp_rank(cu_pad, ids_p, ids_p[0], ids_p[0], grp)

        def te_ours():
            with cu.fake_group_queries():
                return tw_te.get_batch_on_this_cp_rank(cu_pad, ids_p, ids_p[0], ids_p[0], grp)

        out.append(("te.get_batch_on_this_cp_rank", te_ours, te_theirs))
        x3 = stream.unsqueeze(0)
        out.append(("mcore_bridge.split_cp_inputs", lambda: tw_mb.split_cp_inputs(x3, cu_pad, 1, cp=cp, cp_rank=0),
                    lambda: up.split(x3, cu_pad, 1)))
        pos_p = torch.cat([torch.arange(int(n)) for n in slots]).unsqueeze(0)
        args = types.SimpleNamespace(is_multimodal=False, task_type="causal_lm", cp_partition_mode="zigzag")
        batch = {"input_ids": ids_p, "labels": ids_p, "position_ids": pos_p, "loss_scale": ids_p.float(),
                 "packed_seq_params": types.SimpleNamespace(cu_seqlens_q=cu_pad)}
        out.append(("swift.get_batch_on_this_cp_rank",
                    lambda: tw_sw.get_batch_on_this_cp_rank(args, dict(batch), cp=cp, cp_rank=0, npu=False),
                    lambda: up.sw_cp_rank(args, dict(batch))))
        lp_parts = [tw_mb.split_cp_inputs(ids_p.float(), cu_pad, 1, cp=cp, cp_rank=r) for r in range(cp)]
        rpsp = types.SimpleNamespace(cu_seqlens_q=cu_pad)

        def rec_ours():
            with cu.fake_all_gather(lp_parts):
                return tw_sw.reconstruct_tensor_cp(cp, lp_parts[0], rpsp, B, cp_rank=0)

        def rec_theirs():
            with cu.fake_all_gather(lp_parts):
                return up.sw_recon(cp, lp_parts[0], rpsp, B)

        out.append(("swift.reconstruct_tensor_cp", rec_ours, rec_theirs))
        tk_inp = {"input_ids": ids_p, "labels": ids_p, "position_ids": pos_p,
                  "packed_seq_params": tw_tk.get_packed_seq_params(pos_p, npu=False)}
        proc = types.SimpleNamespace(device_mesh=types.SimpleNamespace(cp_world_size=cp, tp_world_size=1,
                                                                       sequence_parallel=False, cp_rank=0),
                                     framework="megatron", padding_map=tw_tk.PADDING_MAP)
        out.append(("twinkle.split_cp", lambda: tw_tk.split_cp([dict(tk_inp)], cp=cp, cp_rank=0),
                    lambda: up.tk["split_cp"](proc, [dict(tk_inp)])))
        pos_r = torch.cat([torch.arange(int(n)) for n in lens]).unsqueeze(0)
        tk_pad = {"input_ids": flat.unsqueeze(0), "labels": flat.unsqueeze(0), "position_ids": pos_r}
        out.append(("twinkle.pad_cp", lambda: tw_tk.pad_cp([dict(tk_pad)], cp=cp, tp=1),
                    lambda: up.tk["pad_cp"](proc, [dict(tk_pad)])))
    work = [24576 * n + n * n for n in lens.tolist()]
    k = 4 * cp  # e.g. dp ranks
    out.append((f"verl.get_seqlen_balanced_partitions (k={k})",
                lambda: tw_v.get_seqlen_balanced_partitions(work, k, False), lambda: up.balance(work, k, False)))
    out.append((f"verl.get_seqlen_balanced_partitions equal (k={k})",
                lambda: tw_v.get_seqlen_balanced_partitions(work, k, True), lambda: up.balance(work, k, True)))
    from tensordict import TensorDict

    td = TensorDict({"input_ids": ids, "attention_mask": mask, "position_ids": ids}, batch_size=B)
    limit = 2 * S
    out.append((f"verl.rearrange_micro_batches (max_token_len={limit})",
                lambda: tw_v.rearrange_micro_batches(td, limit), lambda: up.rearrange(td, limit)))
    if cp > 1:
        thd = {"tokens": ids_p, "labels": ids_p, "position_ids": pos_p}
        mx = slots.max().reshape(1)

        def thd_theirs():
            with cu.patched(up.mg_utils, tex=cu.FakeTex, is_te_min_version=lambda v, check_equality=True: True):
                return up.mg_utils.get_thd_batch_on_this_cp_rank(dict(thd), cu_real, cu_pad, mx)

        out.append(("megatron.get_thd_batch_on_this_cp_rank",
                    lambda: tw_mg.get_thd_batch_on_this_cp_rank(dict(thd), cu_real, cu_pad, mx, cp, 0), thd_theirs))
    pos_r = torch.cat([torch.arange(int(n)) for n in lens]).unsqueeze(0)
    out.append(("swift.get_packed_seq_params", lambda: tw_sw.get_packed_seq_params(pos_r),
                lambda: up.hf_params(pos_r)))
    out.append(("twinkle.get_packed_seq_params", lambda: tw_tk.get_packed_seq_params(pos_r, npu=False),
                lambda: up.tk["_get_packed_seq_params"](pos_r)))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=7)
    ap.add_argument("--B", type=int, default=64)
    ap.add_argument("--S", type=int, default=4096)
    ap.add_argument("--H", type=int, default=64)
    ap.add_argument("--only", default=None)
    ap.add_argument("--torch-threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.torch_threads)
    import logging

    logging.getLogger(str(cu.UPSTREAM / "verl/models/mcore/util.py")).setLevel(logging.ERROR)
    up = Upstream()
    print(f"bench_compat: B={a.B} S={a.S} H={a.H}, {a.pairs} pairs, torch threads {torch.get_num_threads()}, "
          f"MASKPACK_THREAD_POOL={os.environ['MASKPACK_THREAD_POOL']}; {load()}")
    slower = []
    for cp in (1, 2, 4):
        print(f"cp = {cp}")
        for name, ours, theirs in cases(up, a.B, a.S, a.H, cp):
            if a.only and a.only not in name:
                continue
            r, to, tt = pairs(ours, theirs, a.pairs)
            print(f"  {name:<48s} ours {to * 1e3:9.3f} ms  upstream {tt * 1e3:9.3f} ms  ratio {r:6.2f}x")
            if r < 0.97:  # below 3 %: the noise of a pair of sub-millisecond calls
                slower.append((cp, name, r))
    print(load())
    print("no twin slower than upstream (a ratio under 0.97 counts as slower)" if not slower else
          "slower than upstream: " + ", ".join(f"{n} (cp {c}: {r:.2f}x)" for c, n, r in slower))


if __name__ == "__main__":
    main()
