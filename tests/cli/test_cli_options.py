#!/usr/bin/env python3
"""The options of `maskpack inspect` and `maskpack plan` that no other CLI test gives, each parsed
and checked for its effect on the output (and each refused with exit status 2 and its message on a
bad value). Python standard library only; the writers and readers are test_cli.py's.

usage: test_cli_options.py MASKPACK_BINARY SOURCE_ROOT [CASE...]   (no CASE: run every case)
"""
import json
import math
import os
import sys
import struct
import tempfile
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_cli as base  # noqa: E402  (its writers, readers, run/check/expect and failure list)

check, expect, npy, read_npz = base.check, base.expect, base.npy, base.read_npz


def tmp(name):
    return os.path.join(base.TMP, name)


def inspect_json(*args):
    out = expect(["inspect", *args, "--json"], 0)
    return json.loads(out)


def mask4d(*args):
    """The sample batch's mask4d (keep, bool) under the given rule flags: [3][16][16] lists."""
    path = tmp("m4.npz")
    expect(["inspect", *args, "--emit", "mask4d", "--out", path], 0)
    shape, m = read_npz(path)["mask4d"]
    check(shape == (3, 1, 16, 16), "mask4d shape %r" % (shape,))
    return [[m[b * 256 + i * 16:b * 256 + i * 16 + 16] for i in range(16)] for b in range(3)]


# ---- inspect --------------------------------------------------------------------------------------

def case_inspect_window():
    # row 0 of the sample is one 11-token sequence at columns 0..10
    full = mask4d()
    check(full[0][8][0:9] == [1] * 9, "causal, no window: query 8 sees keys 0..8")
    win = mask4d("--window", "2,0")
    check(win[0][8][0:11] == [0] * 6 + [1] * 3 + [0] * 2, "--window 2,0: query 8 sees keys 6..8 only, got %r"
          % (win[0][8][0:11],))
    check(inspect_json("--window", "2,0")["rule"]["window"] == [2, 0], "--window in the report's rule")
    both = mask4d("--bidirectional", "--window", "1,1")
    check(both[0][5][0:11] == [0] * 4 + [1] * 3 + [0] * 4, "--bidirectional --window 1,1: keys 4..6 of query 5")
    expect(["inspect", "--window", "3"], 2, err_has=["--window: expected L,R"])
    expect(["inspect", "--window", "3,-2"], 2, err_has=["--window: expected two integers >= -1"])


def case_inspect_alignment():
    rule = inspect_json("--alignment", "top_left")["rule"]
    check(rule["alignment"] == "top_left" and rule["from"] == "flags", "--alignment top_left: %r" % (rule,))
    check(inspect_json()["rule"]["alignment"] == "bottom_right", "default alignment bottom_right")
    expect(["inspect", "--alignment", "middle"], 2, err_has=["--alignment: expected top_left|bottom_right"])


def case_inspect_total():
    path = tmp("cu.npy")
    with open(path, "wb") as f:
        f.write(npy("i4", (3,), [0, 3, 7]))
    plain = inspect_json(path, "--as", "cu_seqlens", "--cu-form", "te")
    check(plain["shape"] == [7] and plain["pad_fraction"] == 0, "cu_seqlens alone: stream of 7 tokens")
    tot = inspect_json(path, "--as", "cu_seqlens", "--cu-form", "te", "--total", "10")
    check(tot["shape"] == [10] and tot["n_tokens"] == 7 and abs(tot["pad_fraction"] - 0.3) < 1e-12,
          "--total 10: a stream of 10 with 3 padding tokens, got %r" % ({k: tot[k] for k in ("shape", "n_tokens")},))
    expect(["inspect", path, "--as", "cu_seqlens", "--cu-form", "te", "--total", "-4"], 2,
           err_has=["--total: expected an integer >= 0"])


def case_inspect_block():
    path = tmp("bm.npz")
    expect(["inspect", "--emit", "block_mask", "--block", "4", "--out", path], 0)
    z = read_npz(path)
    shape, kvn = z["block_mask_kv_num_blocks"]
    check(shape == (3, 4), "--block 4: 16 columns make 4 query blocks, got %r" % (shape,))
    # row 0: tokens 0..10 causal; query block 1 (rows 4..7) sees key blocks 0 and 1, partly or fully
    _, full = z["block_mask_full_kv_num_blocks"]
    check(kvn[1] + full[1] == 2, "row 0, query block 1 reaches 2 key blocks (partial %d + full %d)" % (kvn[1], full[1]))
    expect(["inspect", "--emit", "block_mask", "--out", tmp("bm128.npz")], 0)
    check(read_npz(tmp("bm128.npz"))["block_mask_kv_num_blocks"][0] == (3, 1), "default block 128: one block")
    expect(["inspect", "--emit", "block_mask", "--block", "0", "--out", path], 2, err_has=["--block: expected an integer >= 1"])


def case_inspect_npu():
    for name in ("BSND", "BNSD", "BSH", "SBH"):
        path = tmp("npu_%s.npz" % name)
        expect(["inspect", "--emit", "npu", "--npu-layout", name, "--out", path], 0,
               out_has=["npu_input_layout text '%s'" % name])
        # the string torch_npu takes, not a code to look up
        check(read_npz(path)["npu_input_layout"] == ((), name), "--npu-layout %s -> input_layout text" % name)
        st = tmp("npu_%s.safetensors" % name)
        expect(["inspect", "--emit", "npu", "--npu-layout", name, "--out", st], 0)
        with open(st, "rb") as f:
            raw = f.read()
        head = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
        check(head["__metadata__"] == {"npu_input_layout": name} and "npu_input_layout" not in head,
              "safetensors: input_layout %s in __metadata__" % name)
    # TND needs a packed layout: the sample is a padded grid
    expect(["inspect", "--emit", "npu", "--npu-layout", "TND", "--out", tmp("tnd.npz")], 1,
           out_has=["input_layout TND needs a packed (THD) layout"])
    expect(["inspect", "--npu-layout", "NTD"], 2, err_has=["--npu-layout: expected TND|BSND|BNSD|BSH|SBH"])
    # the scale: 1/sqrt(head dim), or given
    path = tmp("npu_scale.npz")
    expect(["inspect", "--emit", "npu", "--head-dim", "64", "--out", path], 0)
    check(read_npz(path)["npu_scale"][1] == [0.125], "--head-dim 64 -> scale 1/8")
    expect(["inspect", "--emit", "npu", "--out", path], 0)
    check(abs(read_npz(path)["npu_scale"][1][0] - 1 / math.sqrt(128)) < 1e-15, "default head dim 128")
    expect(["inspect", "--emit", "npu", "--scale", "0.3", "--out", path], 0)
    check(read_npz(path)["npu_scale"][1] == [0.3], "--scale 0.3")
    expect(["inspect", "--head-dim", "0"], 2, err_has=["--head-dim: expected an integer >= 1"])
    expect(["inspect", "--scale", "-1"], 2, err_has=["--scale: expected a finite number > 0"])
    expect(["inspect", "--scale", "inf"], 2, err_has=["--scale: expected a finite number > 0"])


def case_inspect_fill_and_index_dtype():
    path = tmp("fill.npz")
    expect(["inspect", "--emit", "mask4d", "--emit-convention", "additive", "--emit-dtype", "float32",
            "--emit-fill", "neg_inf", "--out", path], 0)
    _, m = read_npz(path)["mask4d"]
    check(m[1] == -math.inf and m[0] == 0.0, "--emit-fill neg_inf: masked entries are -inf, allowed 0")
    expect(["inspect", "--emit", "mask4d", "--emit-convention", "additive", "--emit-dtype", "float32",
            "--emit-fill", "dtype_min", "--out", path], 0)
    _, m = read_npz(path)["mask4d"]
    check(m[1] == -3.4028234663852886e38, "--emit-fill dtype_min: masked entries are float32's lowest, got %r" % m[1])
    expect(["inspect", "--emit-fill", "zero"], 2, err_has=["--emit-fill: expected neg_inf|dtype_min"])

    path = tmp("idx.npz")
    out = expect(["inspect", "--emit", "cu_seqlens,valid_indices", "--index-dtype", "int64", "--out", path], 0,
                 out_has=["cu_seqlens int64 [5]", "valid_indices int64 [36]"])
    check(read_npz(path)["cu_seqlens"][1] == [0, 11, 18, 24, 36], "int64 cu_seqlens values")
    expect(["inspect", "--emit", "cu_seqlens,valid_indices", "--index-dtype", "int32", "--out", path], 0,
           out_has=["cu_seqlens int32 [5]", "valid_indices int32 [36]"])
    expect(["inspect", "--index-dtype", "int16"], 2, err_has=["--index-dtype: expected int32|int64"])
    del out


def case_inspect_input_shapes():
    # --as mask4d on a 2D array: a usage error
    m2 = tmp("m2.npy")
    with open(m2, "wb") as f:
        f.write(npy("b1", (2, 4), [1, 1, 1, 0, 1, 1, 0, 0]))
    expect(["inspect", m2, "--as", "mask4d", "--mask-convention", "keep"], 2,
           err_has=["--as mask4d, but " + m2 + " has 2 dimensions"])
    # a [B,1,1,S] padding-only 4D mask (TransformerEngine's) reads as its 2D keep mask
    p4 = tmp("p4.npz")
    base.npz(p4, {"attention_mask": ("b1", (2, 1, 1, 4), [1, 1, 1, 0, 1, 1, 0, 0])})
    r = inspect_json(p4, "--mask-convention", "keep")
    check(r["inputs"][0]["read_as"] == "[B,1,1,S] keep padding mask" and r["n_tokens"] == 5 and r["shape"] == [2, 4],
          "[B,1,1,S] mask: %r" % (r["inputs"][0],))
    check([(s["row"], s["start"], s["length"]) for s in r["segments"]] == [(0, 0, 3), (1, 0, 2)], "its segments")
    # mrope position_ids [3,B,S]; a member nobody reads is listed as ignored; float labels are a problem
    m3 = tmp("m3.npz")
    base.npz(m3, {"position_ids": ("i8", (3, 2, 4), [0, 1, 2, 3, 0, 1, 0, 1] * 3), "foo": ("i4", (2,), [1, 2]),
                  "labels": ("f4", (2, 4), [0.0] * 8)})
    out = expect(["inspect", m3, "--position-rule", "reset", "--json"], 1)
    r = json.loads(out)
    check(r["n_sequences"] == 3 and r["shape"] == [2, 4], "[3,B,S] position_ids: 3 sequences on a [2, 4] grid")
    check(r["ignored"] == ["foo"], "unknown member ignored: %r" % (r["ignored"],))
    check(r["problems"] == ["labels: expected an integer dtype, found float32"], "float labels: %r" % (r["problems"],))
    # a 3D attention_mask has no per-token shape
    x3 = tmp("x3.npz")
    base.npz(x3, {"attention_mask": ("i4", (2, 3, 4), [1] * 24)})
    expect(["inspect", x3, "--mask-convention", "keep"], 1,
           out_has=["attention_mask: int32 [2, 3, 4] has no per-token shape (expected [B,S] or [T], or a 4D mask)"])
    # a packed stream laid over a grid must not run from one row into the next
    cr = tmp("cr.npz")
    base.npz(cr, {"attention_mask": ("i4", (2, 4), [1] * 8), "cu_seqlens": ("i4", (3,), [0, 6, 8])})
    expect(["inspect", cr, "--mask-convention", "keep", "--cu-form", "te"], 1,
           out_has=["cu_seqlens: sequence 0 (tokens [0, 6)) runs from row 0 into row 1 of the [2, 4] grid"])


def case_inspect_reports():
    # a packed stream's TND npu arguments, in the text report and in the JSON one
    cu = tmp("cu.npy")
    with open(cu, "wb") as f:
        f.write(npy("i4", (3,), [0, 3, 7]))
    args = ["inspect", cu, "--as", "cu_seqlens", "--cu-form", "te", "--emit", "npu", "--npu-layout", "TND",
            "--out", tmp("t.npz")]
    expect(args, 0, out_has=["shape: [7] packed stream (THD)", "input_layout TND, sparse_mode 3",
                             "actual_seq_qlen [3, 7]", "npu_actual_seq_kvlen int64 [2]"])
    npu = json.loads(expect(args + ["--json"], 0))["npu"]
    check(npu["input_layout"] == "TND" and npu["actual_seq_qlen"] == [3, 7] and npu["actual_seq_kvlen"] == [3, 7]
          and npu["atten_mask"] == "compressed" and npu["atten_mask_shape"] == [2048, 2048],
          "JSON npu arguments: %r" % (npu,))
    check(read_npz(tmp("t.npz"))["npu_actual_seq_qlen"][1] == [3, 7], "the npz holds actual_seq_qlen")
    check(npu["fully_masked_rows"] == 0 and npu["fully_masked_pad_rows"] == 0, "packed: no row sees nothing")
    # the padded sample: its 12 pad slots see nothing under the full mask, and are counted as padding
    padded = json.loads(expect(["inspect", "--emit", "npu", "--json", "--out", tmp("p.npz")], 0))["npu"]
    check(padded["fully_masked_rows"] == 0 and padded["fully_masked_pad_rows"] == 12 and padded["inner_precise"] == 2,
          "padded sample: pad rows counted apart: %r" % (padded,))
    expect(["inspect", "--emit", "npu", "--out", tmp("p.npz")], 0,
           out_has=["query rows that see nothing: 0 of tokens, 12 of padding"])
    # the rule line names a window
    expect(["inspect", "--window", "2,0"], 0, out_has=["rule: causal, bottom_right alignment, window (2, 0) (from flags)"])
    # help for each command, and for one that does not exist
    expect(["help", "inspect"], 0, out_has=["usage: maskpack inspect [FILE] [options]"])
    expect(["help", "plan"], 0, out_has=["usage: maskpack plan LENGTHS_FILE --capacity N [options]"])
    expect(["help", "bogus"], 2, err_has=["maskpack: unknown command 'bogus'"])


def case_inspect_mask_forms():
    """4D masks: the convention each needs, a [B,1,1,S] padding mask read as its 2D keep mask, the rule
    a 4D mask encodes compared with the rule flags; arrays of no per-token shape; --total against the
    grid; cu_seqlens_padded alone; members no reader takes."""
    npz = base.npz
    causal = [1 if j <= i else 0 for i in range(4) for j in range(4)]
    m4 = tmp("m4.npz")
    npz(m4, {"attention_mask": ("i8", (1, 1, 4, 4), causal)})
    expect(["inspect", m4], 2, err_has=["attention_mask is a 4D mask: pass --mask-convention keep"])
    expect(["inspect", m4, "--mask-convention", "doc_id"], 2,
           err_has=["--mask-convention doc_id describes 2D masks; a 4D attention_mask is keep, masked or additive"])
    expect(["inspect", m4, "--mask-convention", "keep", "--bidirectional"], 1,
           out_has=["rule: attention_mask encodes a causal rule, the flags say --bidirectional"])
    expect(["inspect", m4, "--mask-convention", "keep", "--causal", "--window", "1,0"], 1,
           out_has=["rule: attention_mask encodes window (-1, -1), the flags say (1, 0)"])
    # TE's padding-only [B,1,1,S] mask, masked convention (1 = excluded): rows of 3 and 2 tokens
    pad = tmp("pad4.npz")
    npz(pad, {"attention_mask": ("i8", (2, 1, 1, 4), [0, 0, 0, 1, 0, 0, 1, 1])})
    d = inspect_json(pad, "--mask-convention", "masked")
    check([(s["row"], s["length"]) for s in d["segments"]] == [(0, 3), (1, 2)], "padding mask segments %r" % d["segments"])
    out = expect(["inspect", pad, "--mask-convention", "masked"], 0)
    check("[B,1,1,S] masked padding mask" in out, "padding mask named: %s" % out)
    cu = tmp("cu2d.npz")
    npz(cu, {"attention_mask": ("i8", (1, 6), [1] * 6), "cu_seqlens": ("i4", (3,), [0, 3, 6])})
    expect(["inspect", cu, "--mask-convention", "masked"], 2,
           err_has=["--mask-convention masked|additive describes 4D masks; a 2D attention_mask is keep or doc_id"])
    expect(["inspect", cu, "--mask-convention", "keep", "--cu-form", "te", "--total", "10"], 1,
           out_has=["cu_seqlens: --total 10, but the token grid [1, 6] holds 6 tokens"])
    cup = tmp("cup.npz")
    npz(cup, {"attention_mask": ("i8", (1, 4), [1] * 4), "cu_seqlens_padded": ("i4", (2,), [0, 4]),
              "extra_thing": ("i4", (1,), [0])})
    expect(["inspect", cup, "--mask-convention", "keep"], 1,
           out_has=["cu_seqlens_padded: present without cu_seqlens; ignored", "(not read: extra_thing)"])
    flat = tmp("flat_mask.npz")
    base.npz(flat, {"attention_mask": ("i8", (5,), [1, 1, 1, 1, 0])})
    expect(["inspect", flat, "--mask-convention", "keep"], 1,
           out_has=["attention_mask: int64 [5] has no per-token shape (expected [B,S] or [T], or a 4D mask)"])
    # half-open windows in the rule line
    expect(["inspect", "--window", "-1,0"], 0, out_has=["rule: causal, bottom_right alignment, window (-1, 0) (from flags)"])
    expect(["inspect", "--window", "3,-1", "--bidirectional"], 0,
           out_has=["rule: bidirectional, bottom_right alignment, window (3, -1) (from flags)"])
    odd = tmp("odd.npz")
    npz(odd, {"attention_mask": ("i8", (1, 2, 2), [1] * 4), "position_ids": ("i8", (1, 1, 2, 2), [0, 1, 0, 1]),
              "labels": ("i8", (1, 2), [1, 2])})
    expect(["inspect", odd, "--mask-convention", "keep", "--position-rule", "reset"], 1,
           out_has=["attention_mask: int64 [1, 2, 2] has no per-token shape (expected [B,S] or [T], or a 4D mask)",
                    "position_ids: int64 [1, 1, 2, 2] has no per-token shape (expected [B,S] or [T], or [3,B,S])",
                    "no input describes the sequences", "-100 on padding                not checked"])


# ---- plan ------------------------------------------------------------------------------------------

def lengths(name, values):
    path = tmp(name)
    with open(path, "w") as f:
        f.write("".join("%d\n" % v for v in values))
    return path


def plan_json(*args):
    return json.loads(expect(["plan", *args, "--json"], 0))


def case_plan_parallel_alignment():
    path = lengths("l.txt", [5, 9, 3, 12, 7])
    # verl: tp * cp * 2; minimal: cp * lcm(2, tp); --multiple overrides both
    r = plan_json(path, "--capacity", "48", "--cp", "2", "--tp", "2")
    check(r["options"]["tp"] == 2 and r["report"]["multiple"] == 8, "--tp 2 --cp 2 verl: multiple 8, got %r"
          % r["report"]["multiple"])
    check(r["report"]["alignment_padding"] == sum(-v % 8 for v in [5, 9, 3, 12, 7]), "padding to multiples of 8")
    r = plan_json(path, "--capacity", "48", "--cp", "2", "--tp", "3", "--align", "minimal")
    check(r["options"]["align"] == "minimal" and r["report"]["multiple"] == 12, "minimal: cp * lcm(2, 3) = 12")
    r = plan_json(path, "--capacity", "48", "--cp", "2", "--tp", "3", "--align", "verl")
    check(r["report"]["multiple"] == 12, "verl: tp * cp * 2 = 12")
    r = plan_json(path, "--capacity", "48", "--multiple", "16")
    check(r["report"]["multiple"] == 16 and r["report"]["alignment_padding"] == sum(-v % 16 for v in [5, 9, 3, 12, 7]),
          "--multiple 16")
    expect(["plan", path, "--capacity", "48", "--align", "wide"], 2, err_has=["--align"])
    expect(["plan", path, "--capacity", "48", "--tp", "0"], 2, err_has=["--tp"])
    expect(["plan", path, "--capacity", "48", "--multiple", "x"], 2, err_has=["--multiple"])


def case_plan_objective():
    values = [5, 9, 3, 12, 7]
    path = lengths("l.txt", values)
    r = plan_json(path, "--capacity", "16", "--objective", "attention", "--attention-a", "10")
    check(r["options"]["objective"] == "attention" and r["report"]["attention_a"] == 10, "--attention-a 10")
    check(sum(r["rank_costs"]) == sum(10 * v + v * v for v in values),
          "attention objective: costs sum a*L + L^2, got %r" % r["rank_costs"])
    r = plan_json(path, "--capacity", "16")
    check(sum(r["rank_costs"]) == sum(values), "tokens objective: costs sum the lengths")
    # --model H: a = W / (2 q) with W = H (q + 2 kv) + q H + 2 H I (I = 4H, q = kv = H), / q when causal
    h = 1024
    w = h * (h + 2 * h) + h * h + 2 * h * 4 * h
    r = plan_json(path, "--capacity", "16", "--objective", "attention", "--model", str(h))
    check(r["report"]["attention_a"] == w // (2 * h), "--model 1024: a = %d, got %r" % (w // (2 * h), r["report"]["attention_a"]))
    w = h * (512 + 2 * 256) + 512 * h + 3 * h * 2048
    r = plan_json(path, "--capacity", "16", "--objective", "attention", "--model", "%d,2048,512,256,1,1" % h)
    check(r["report"]["attention_a"] == w // 512, "--model 1024,2048,512,256,1,1 (gated, causal): a = %d, got %r"
          % (w // 512, r["report"]["attention_a"]))
    # the user's a wins over a model shape (--model or --hidden); --hidden alone gives a = 6 H
    r = plan_json(path, "--capacity", "16", "--objective", "attention", "--model", "1024", "--attention-a", "5")
    check(r["report"]["attention_a"] == 5, "--attention-a 5 wins over --model: got %r" % r["report"]["attention_a"])
    r = plan_json(path, "--capacity", "16", "--objective", "attention", "--hidden", "1024", "--attention-a", "7")
    check(r["report"]["attention_a"] == 7, "--attention-a 7 wins over --hidden: got %r" % r["report"]["attention_a"])
    r = plan_json(path, "--capacity", "16", "--objective", "attention", "--hidden", "1024")
    check(r["report"]["attention_a"] == 6 * 1024 and r["options"]["hidden"] == 1024,
          "--hidden 1024: a = 6144, got %r" % r["report"]["attention_a"])
    r = plan_json(path, "--capacity", "16", "--objective", "attention")
    check(r["report"]["attention_a"] == 24576, "no model shape: verl's a = 24576, got %r" % r["report"]["attention_a"])
    expect(["plan", path, "--capacity", "16", "--hidden", "0"], 2, err_has=["--hidden: expected an integer >= 1"])
    expect(["plan", path, "--capacity", "16", "--model", "a,b"], 2, err_has=["--model: expected"])
    expect(["plan", path, "--capacity", "16", "--objective", "flops"], 2, err_has=["--objective"])
    expect(["plan", path, "--capacity", "16", "--attention-a", "-3"], 2, err_has=["--attention-a"])


def case_plan_report_fields():
    # six sequences, rows of 10, two ranks: three packed rows (6+4 each) cannot be dealt evenly (20 vs 10
    # tokens), the sequences can (16 vs 14); every rank runs two rows, so four rows hold 30 tokens
    values = [6, 6, 6, 4, 4, 4]
    path = lengths("rep.txt", values)
    out = tmp("rep.json")
    expect(["plan", path, "--capacity", "10", "--dp", "2", "--json-out", out], 0)
    with open(out) as f:
        plan = json.load(f)
    rep = plan["report"]
    check(rep["rows_per_rank"] == 2 and rep["n_rows"] == 4, "two rows per rank, got %r" % rep["rows_per_rank"])
    check(rep["fill_all_rows"] == 30 / 40, "fill over all rows 30/40, got %r" % rep["fill_all_rows"])
    check(rep["fill_nonempty_rows"] == rep["fill"] == 30 / (10 * rep["n_packed_rows"]),
          "fill of non-empty rows = real / (capacity * packed rows), got %r" % rep["fill_nonempty_rows"])
    tok = [0, 0]
    att = [0.0, 0.0]
    for row in plan["rows"]:
        for s_ in row["sequences"]:
            tok[row["rank"]] += values[s_]
            att[row["rank"]] += 24576.0 * values[s_] + values[s_] ** 2
    check(abs(rep["token_imbalance"] - (max(tok) / (sum(tok) / 2) - 1)) < 1e-12,
          "token imbalance from the rows: %r vs %r" % (rep["token_imbalance"], tok))
    check(abs(rep["attention_imbalance"] - (max(att) / (sum(att) / 2) - 1)) < 1e-12,
          "attention imbalance from the rows: %r vs %r" % (rep["attention_imbalance"], att))
    check(rep["token_imbalance"] <= 16 / 15 - 1 + 1e-12, "sequences balanced (16 vs 14), got %r" % tok)
    check(rep["rank_tokens_max"] == max(tok) and rep["rank_tokens_mean"] == 15, "rank token figures")
    text = expect(["plan", path, "--capacity", "10", "--dp", "2"], 0)
    for want in ("fill over every row every rank runs: 75.0000%", "fill of non-empty rows",
                 "rank imbalance max/mean-1: tokens", "2 rows per rank"):
        check(want in text, "text report has %r:\n%s" % (want, text))


def case_plan_seed_and_row_width():
    path = lengths("eq.txt", [4] * 8)

    def rows(seed):
        out = tmp("seed%d.json" % seed)
        expect(["plan", path, "--capacity", "8", "--dp", "2", "--seed", str(seed), "--json-out", out, "-q"], 0)
        with open(out) as f:
            plan = json.load(f)
        check(plan["options"]["seed"] == seed, "--seed %d in the plan's options" % seed)
        return [r["sequences"] for r in plan["rows"]]

    r0, r0b, r7 = rows(0), rows(0), rows(7)
    check(r0 == r0b, "the same seed gives the same plan")
    check(r0 != r7, "--seed 7 breaks the ties between equal lengths differently: %r vs %r" % (r0, r7))
    check(sorted(s for r in r7 for s in r) == list(range(8)), "every sequence placed once under --seed 7")
    expect(["plan", path, "--capacity", "8", "--seed", "-1"], 2, err_has=["--seed"])

    # --row-width: full-capacity rows need the capacity to divide by the multiple, used-width rows not
    path = lengths("l.txt", [5, 9, 3, 12, 7])
    expect(["plan", path, "--capacity", "14", "--multiple", "4"], 2,
           err_has=["capacity: expected a multiple of the alignment multiple 4"])
    r = plan_json(path, "--capacity", "14", "--multiple", "4", "--row-width", "used", "--allow-split")
    check(r["options"]["row_width"] == "used" and r["report"]["multiple"] == 4, "--row-width used accepted")
    check(r["report"]["real_tokens"] == 36, "every token planned")
    expect(["plan", path, "--capacity", "14", "--row-width", "half"], 2, err_has=["--row-width: expected capacity or used"])


def case_plan_inputs_and_outputs():
    import struct
    # JSON lines: an object with length / input_ids / tokens, a token list, a bare number
    path = tmp("j.jsonl")
    with open(path, "w") as f:
        f.write('{"length": 5}\n[1, 2, 3]\n{"input_ids": [1, 2, 3, 4]}\n{"tokens": [7, 7]}\n9\n')
    r = plan_json(path, "--capacity", "16")
    check(r["format"] == "json lines" and r["report"]["n_sequences"] == 5 and r["report"]["real_tokens"] == 23,
          "JSON lines: 5 sequences, 23 tokens, got %r" % ({k: r["report"][k] for k in ("n_sequences", "real_tokens")},))
    # a 1-D integer .npy, and standard input
    npy_path = tmp("l.npy")
    with open(npy_path, "wb") as f:
        f.write(npy("i8", (4,), [10, 10, 6, 6]))
    r = plan_json(npy_path, "--capacity", "16")
    check(r["report"]["n_sequences"] == 4 and r["report"]["real_tokens"] == 32, ".npy lengths")
    # the algorithms: next-fit keeps the input order ([10], [10, 6], [6]); first-fit-decreasing pairs them
    out = expect(["plan", "-", "--capacity", "16", "--algorithm", "nextfit", "--json"], 0, stdin=b"10\n10\n6\n6\n")
    r = json.loads(out)
    check(r["source"] == "-" and r["options"]["algorithm"] == "nextfit" and r["report"]["n_rows"] == 3,
          "nextfit from stdin: 3 rows, got %r" % r["report"]["n_rows"])
    out = expect(["plan", "-", "--capacity", "16", "--algorithm", "ffd", "--json"], 0, stdin=b"10\n10\n6\n6\n")
    check(json.loads(out)["report"]["n_rows"] == 2, "ffd: 2 rows")
    expect(["plan", "-", "--capacity", "16", "--algorithm", "best"], 2, stdin=b"1\n", err_has=["--algorithm"])
    # a sequence longer than a row: refused, or cut with --allow-split
    expect(["plan", "-", "--capacity", "16"], 1, stdin=b"20\n3\n", err_has=["more than the capacity 16"])
    out = expect(["plan", "-", "--capacity", "16", "--allow-split", "--json"], 0, stdin=b"20\n3\n")
    r = json.loads(out)["report"]
    check(r["n_split"] == 1 and r["n_pieces"] == 3 and r["real_tokens"] == 23, "--allow-split: one sequence cut in two")
    # micro-batches: 4 ranks' worth of rows over dp 2 x 2 micro-batches
    r = plan_json(lengths("m.txt", [16, 16, 16, 16]), "--capacity", "16", "--dp", "2", "--micro-batches", "2")
    check(r["report"]["rows_per_microbatch"] == 1 and r["report"]["rows_per_rank"] == 2, "--micro-batches 2")
    # the progress bar on stderr, forced on and off
    rc, _, err = base.run("plan", lengths("p.txt", [5, 9, 3]), "--capacity", "16", "--progress")
    check(rc == 0 and "pack" in err and "100%" in err, "--progress draws on stderr: %r" % err[:200])
    rc, _, err = base.run("plan", lengths("p.txt", [5, 9, 3]), "--capacity", "16", "--no-progress")
    check(rc == 0 and err == "", "--no-progress: nothing on stderr, got %r" % err[:200])
    # the rows picture: a PNG, shorter with fewer rows drawn per rank
    heights = []
    for rows in (None, "1"):
        png = tmp("rows.png")
        args = ["plan", lengths("r.txt", [5, 9, 3, 12, 7, 1]), "--capacity", "16", "--dp", "2", "--png", png]
        if rows:
            args += ["--png-rows", rows]
        expect(args, 0, out_has=["picture written to " + png])
        with open(png, "rb") as f:
            data = f.read()
        check(data[:8] == b"\x89PNG\r\n\x1a\n", "--png writes a PNG")
        heights.append(struct.unpack(">II", data[16:24])[1])
    check(heights[1] < heights[0], "--png-rows 1 draws fewer rows: heights %r" % heights)
    # -q prints nothing
    rc, out, _ = base.run("plan", lengths("q.txt", [5]), "--capacity", "16", "-q")
    check(rc == 0 and out == "", "-q: no output")


def case_reports_and_pictures():
    """The text report's limits and escapes; plan pictures with micro-batch boundaries, and the two
    ways a picture is refused (a path that cannot be created, more ranks than the image can draw)."""
    many = tmp("many.npz")
    base.npz(many, {"position_ids": ("i8", (1, 150), [i % 3 for i in range(150)])})
    out = expect(["inspect", many, "--position-rule", "reset"], 0, out_has=["  ... and 10 more segments"])
    check(out.count("\n      0 ") == 40, "40 segments listed")
    # a file name with a carriage return and a C1 control: escaped, never written raw
    plain = tmp("x.npz")
    base.npz(plain, {"position_ids": ("i8", (1, 4), [0, 1, 0, 1])})
    odd = os.path.join(os.fsencode(base.TMP), b"we\rird\xc2\x85.npz")
    with open(plain, "rb") as f, open(odd, "wb") as g:
        g.write(f.read())
    rc, out, err = base.run("inspect", os.fsdecode(odd), "--position-rule", "reset")
    check(rc == 0 and "we\\rird\\u0085.npz" in out and "\r" not in out, "escaped name: %r" % out[:120])
    path = lengths("pics.txt", [5, 1, 7, 3, 9, 2, 6])
    png = tmp("mb.png")
    expect(["plan", path, "--capacity", "16", "--micro-batches", "2", "--dp", "2", "--png", png], 0,
           out_has=["picture written to " + png])
    with open(png, "rb") as f:
        check(f.read(8) == b"\x89PNG\r\n\x1a\n", "micro-batch picture is a PNG")
    # a 1-token sequence next to a 4000-token one in a 4096-token row rounds to no pixel: drawn 1 wide
    pics = []
    for stdin in (b"4000\n", b"4000\n1\n"):
        png = tmp("tiny%d.png" % len(pics))
        expect(["plan", "-", "--capacity", "4096", "--png", png], 0, stdin=stdin)
        with open(png, "rb") as f:
            pics.append(f.read())
    check(pics[0] != pics[1], "a 1-token sequence is visible in the picture")
    # only empty sequences (every cost 0), and 3000 rows of 1 pixel with micro-batches (no gaps)
    import struct
    # (the heights now include the title, caption, axes and legend: about 300 pixels)
    for stdin, args, lo, hi in [(b"0\n0\n", [], 1, 400), (b"16\n" * 3000, ["--micro-batches", "2"], 3000, 3400)]:
        png = tmp("rows_%d.png" % lo)
        expect(["plan", "-", "--capacity", "16", "--png", png] + args, 0, stdin=stdin)
        with open(png, "rb") as f:
            h = struct.unpack(">II", f.read(24)[16:24])[1]
        check(lo <= h <= hi, "picture height %d not in [%d, %d]" % (h, lo, hi))
    expect(["plan", path, "--capacity", "16", "--png", tmp("no/such/dir.png")], 1, err_has=["cannot create"])
    expect(["plan", path, "--capacity", "16", "--png-rows", "2"], 2, err_has=["--png-rows applies to a picture"])
    # the plan as SVG: title, ranks and micro-batches, the token axis, the capacity line, the mean, the
    # legend, and the fill and imbalance in the caption, all as text
    svg = tmp("plan.svg")
    expect(["plan", path, "--capacity", "16", "--micro-batches", "2", "--dp", "2", "--png", svg], 0,
           out_has=["picture written to " + svg])
    texts, groups, images = base.svg_texts(svg)
    words = "\n".join(texts)
    for want in ["Packing plan: 7 sequences into", "rows of 16 tokens, 2 ranks x 2 micro-batches", "rank 0", "rank 1",
                 "micro-batch 0", "micro-batch 1", "tokens in the row (capacity 16)", "capacity 16", "rank cost (tokens)",
                 "fill: ", "imbalance: the heaviest rank's cost is", "Legend", "unused:", "alignment padding:",
                 "capacity line:", "mean: the mean cost over ranks"]:
        check(want in words, "plan SVG lacks %r" % want)
    check(any(t.startswith("mean ") for t in texts), "the mean line is labelled")
    check(len(images) == 2, "one raster of rows per rank")
    expect(["plan", path, "--capacity", "16", "--dp", "5000", "--png", tmp("wide.png")], 1,
           err_has=["png: 5000 ranks are too many to draw (at most 4096)"])
    check(not os.path.exists(tmp("wide.png")), "no picture for too many ranks")


def case_emit_packed():
    """--emit all from a packed stream (cu_seqlens alone): every derived array's values, the TND
    arguments of npu_fusion_attention with their lists; --index-dtype int32 and the masked convention."""
    cu = tmp("cu_only.npz")
    base.npz(cu, {"cu_seqlens": ("i4", (3,), [0, 3, 7])})
    out = tmp("packed_all.npz")
    expect(["inspect", cu, "--cu-form", "te", "--emit", "all", "--out", out], 0,
           out_has=["input_layout TND, sparse_mode 3", "actual_seq_qlen [3, 7]"])
    d = read_npz(out)
    for name, shape, values in [("cu_seqlens", (3,), [0, 3, 7]), ("cu_seqlens_npu", (2,), [3, 7]),
                                ("seqlens", (2,), [3, 4]), ("position_ids", (7,), [0, 1, 2, 0, 1, 2, 3]),
                                ("segment_ids", (7,), [1, 1, 1, 2, 2, 2, 2]), ("last_token_index", (2,), [2, 6]),
                                ("npu_actual_seq_qlen", (2,), [3, 7]), ("npu_actual_seq_kvlen", (2,), [3, 7]),
                                ("npu_pad_items", (2,), [0, 0])]:
        check(d[name] == (shape, values), "%s: %r" % (name, d[name]))
    check(d["mask4d"][0] == (1, 1, 7, 7) and d["npu_atten_mask"][0] == (2048, 2048), "mask shapes")
    # the 4D keep mask is block-diagonal causal: row 4 (second sequence, position 1) sees keys 3 and 4
    check(d["mask4d"][1][4 * 7:5 * 7] == [0, 0, 0, 1, 1, 0, 0], "mask4d row 4: %r" % d["mask4d"][1][28:35])
    # --index-dtype int32 applies to every index output; a name without .safetensors is written as .npz
    out_all = tmp("packed_all_i32.bin")
    out = expect(["inspect", cu, "--cu-form", "te", "--emit", "all", "--index-dtype", "int32", "--emit-convention",
                  "masked", "--out", out_all], 0,
                 out_has=["position_ids int32 [7]", "segment_ids int32 [7]", "valid_indices int32 [7]",
                          "last_token_index int32 [2]"])
    with open(out_all, "rb") as f:
        check(f.read(4) == b"PK\x03\x04", "a .bin --out is a zip archive")
    check(read_npz(out_all)["valid_indices"] == ((7,), list(range(7))), "int32 valid_indices")
    out2 = tmp("packed_i32.npz")
    expect(["inspect", cu, "--cu-form", "te", "--emit", "position_ids,mask4d", "--index-dtype", "int32",
            "--emit-convention", "masked", "--out", out2], 0)
    with zipfile.ZipFile(out2) as z:
        check(b"'<i4'" in z.read("position_ids.npy")[:80], "position_ids as int32")
    # bidirectional: sparse_mode 0 and no atten_mask member; a budget too small for the compressed mask
    bi = tmp("packed_bi.npz")
    expect(["inspect", cu, "--cu-form", "te", "--bidirectional", "--emit", "npu", "--out", bi], 0,
           out_has=["sparse_mode 0", "atten_mask none"])
    names = set(read_npz(bi))
    check("npu_atten_mask" not in names and "npu_actual_seq_qlen" in names, "bidirectional npu members %r" % names)
    small = tmp("packed_small.npz")
    expect(["inspect", cu, "--cu-form", "te", "--emit", "npu", "--max-bytes", "1000", "--out", small], 1,
           out_has=["emit npu_atten_mask: cannot allocate the output (larger than the memory budget of 1000 bytes"])
    check(not os.path.exists(small), "nothing written when an output does not fit")
    d2 = read_npz(out2)
    check(d2["position_ids"] == ((7,), [0, 1, 2, 0, 1, 2, 3]), "int32 position_ids")
    check(d2["mask4d"][1][28:35] == [1, 1, 1, 0, 0, 1, 1], "masked convention inverts: %r" % d2["mask4d"][1][28:35])


def case_inspect_many_rows():
    """A batch of 70 rows: the picture draws the first 64 (as --png-rows 0..63 would), the problems list
    stops at 64 with a count of the rest, and several members no reader takes are all named."""
    import struct
    n = 70
    rows = tmp("rows70.npz")
    base.npz(rows, {"attention_mask": ("i8", (n, 3), [1, 1, 0] * n)})
    heights = []
    for extra in ([], ["--png-rows", ",".join(str(r) for r in range(64))]):
        png = tmp("rows70_%d.png" % len(extra))
        expect(["inspect", rows, "--mask-convention", "keep", "--png", png] + extra, 0)
        with open(png, "rb") as f:
            heights.append(struct.unpack(">II", f.read(24)[16:24])[1])
    check(heights[0] == heights[1], "default picture = first 64 rows: %r" % heights)
    probs = tmp("probs70.npz")
    base.npz(probs, {"attention_mask": ("i8", (n, 3), [1, 0, 0] * n), "labels": ("i8", (n, 3), [5, 7, 8] * n),
                     "junk_a": ("i4", (1,), [0]), "junk_b": ("i4", (1,), [0])})
    out = expect(["inspect", probs, "--mask-convention", "keep"], 1,
                 out_has=["row 63: labels are not -100 on 2 pad tokens (first at column 1: 7)", "  ... and 6 more",
                          "(not read: junk_a, junk_b)"])
    check("row 64:" not in out, "problems listed up to 64")
    # cu_seqlens_padded with the NPU form: named in the input list, its convention refused
    npup = tmp("npu_padded.npz")
    base.npz(npup, {"cu_seqlens": ("i4", (2,), [3, 7]), "cu_seqlens_padded": ("i4", (2,), [4, 8])})
    expect(["inspect", npup, "--cu-form", "npu"], 1,
           out_has=["NPU form + cu_seqlens_padded", "cu_seqlens_padded[0]: expected 0, found 4"])


def raw_npy(descr, shape, payload):
    """A .npy with any descr (test_cli.npy knows five)."""
    import struct
    shape_txt = "(%s)" % (", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else ""))
    h = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape_txt)
    h += " " * (-(10 + len(h) + 1) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h.encode() + payload


def case_plan_length_forms():
    """Lengths as JSON lists, input_ids and tokens objects; as [n, 1], int16 and int8 arrays; refused as
    bool arrays and fractional JSON numbers; the progress bar forced on; plan --help."""
    import struct
    out = expect(["plan", "-", "--capacity", "16", "--json"], 0,
                 stdin=b'[1, 2, 3]\n{"input_ids": [1, 2]}\n{"tokens": 4}\n')
    rep = json.loads(out)["report"]
    check(rep["n_sequences"] == 3 and rep["real_tokens"] == 9, "JSON line forms: %r" % rep)
    expect(["plan", "-", "--capacity", "16"], 1, stdin=b'{"length": 5.5}\n',
           err_has=["-:1: expected a length (integer) or a list of tokens"])
    for name, descr, shape, payload in [("c.npy", "<i4", (3, 1), struct.pack("<3i", 5, 6, 7)),
                                        ("s.npy", "<i2", (3,), struct.pack("<3h", 5, 6, 7)),
                                        ("b.npy", "|i1", (3,), struct.pack("<3b", 5, 6, 7))]:
        path = tmp(name)
        with open(path, "wb") as f:
            f.write(raw_npy(descr, shape, payload))
        rep = json.loads(expect(["plan", path, "--capacity", "16", "--json"], 0))["report"]
        check(rep["real_tokens"] == 18 and rep["n_sequences"] == 3, "%s lengths: %r" % (name, rep))
    path = tmp("bool.npy")
    with open(path, "wb") as f:
        f.write(raw_npy("|b1", (3,), b"\x01\x01\x00"))
    expect(["plan", path, "--capacity", "16"], 1, err_has=["expected a 1-D integer array of lengths, found bool"])
    rc, out, err = base.run("plan", "-", "--capacity", "16", "--progress", stdin=b"5\n6\n7\n")
    check(rc == 0 and "reading" in err and "100%" in err and "pack" in err, "--progress draws: %r" % err[-200:])
    rc, out, err = base.run("plan", "-", "--capacity", "16", "--no-progress", stdin=b"5\n6\n7\n")
    check(rc == 0 and err == "", "--no-progress: nothing on stderr: %r" % err)
    expect(["plan", "--help"], 0, out_has=["usage: maskpack plan LENGTHS_FILE --capacity N"])
    expect(["plan", "-h"], 0, out_has=["usage: maskpack plan"])


def case_report_rules_and_json():
    """The rule line names a 4D mask's prefix-LM prefixes and bidirectional spans, and a top_left
    alignment; the npu line cuts actual_seq_qlen after 16 items; the JSON report lists labels, unread
    members, what was emitted and where; a C2 byte that starts no C1 control is kept as it is."""
    S = 6
    pre = tmp("prefix4d.npz")
    base.npz(pre, {"attention_mask": ("i8", (1, 1, S, S), [1 if (j <= i or j < 3) else 0 for i in range(S) for j in range(S)])})
    expect(["inspect", pre, "--mask-convention", "keep"], 0,
           out_has=["rule: causal, bottom_right alignment, no window, prefix-LM prefixes (from attention_mask (4D))"])
    span = tmp("span4d.npz")
    base.npz(span, {"attention_mask": ("i8", (1, 1, S, S),
                                       [1 if (j <= i or (2 <= i < 4 and 2 <= j < 4)) else 0 for i in range(S) for j in range(S)])})
    expect(["inspect", span, "--mask-convention", "keep"], 0,
           out_has=["rule: causal, bottom_right alignment, no window, 1 bidirectional spans (from attention_mask (4D))"])
    many = tmp("many_cu.npz")
    base.npz(many, {"cu_seqlens": ("i4", (21,), list(range(0, 42, 2)))})
    expect(["inspect", many, "--cu-form", "te", "--emit", "npu", "--out", tmp("many_npu.npz")], 0,
           out_has=["actual_seq_qlen [" + ", ".join(str(x) for x in range(2, 34, 2)) + ", ...]"])
    jl = tmp("labelled.npz")
    base.npz(jl, {"attention_mask": ("i8", (1, 4), [1, 1, 1, 0]), "labels": ("i8", (1, 4), [1, 2, 3, -100]),
                  "zz": ("i4", (1,), [0])})
    out_path = tmp("labelled_out.npz")
    d = json.loads(expect(["inspect", jl, "--mask-convention", "keep", "--alignment", "top_left", "--json", "--emit",
                           "mask2d", "--out", out_path], 0))
    check([i["name"] for i in d["inputs"]] == ["attention_mask", "labels"], "json inputs %r" % d["inputs"])
    check(d["ignored"] == ["zz"] and d["emitted"] == ["mask2d int64 [1, 4]"] and d["out"] == out_path,
          "json ignored/emitted/out %r" % {k: d.get(k) for k in ("ignored", "emitted", "out")})
    check(d["rule"]["alignment"] == "top_left" and d["rule"]["from"] == "flags", "json rule %r" % d["rule"])
    expect(["inspect", jl, "--mask-convention", "keep", "--alignment", "top_left"], 0,
           out_has=["rule: causal, top_left alignment, no window (from flags)"])
    # U+00A0 (C2 A0) is printable: kept; U+0085 (C2 85) is a C1 control: escaped
    with open(jl, "rb") as f:
        data = f.read()
    nb = os.path.join(os.fsencode(base.TMP), b"no\xc2\xa0break.npz")
    with open(nb, "wb") as f:
        f.write(data)
    rc, out, err = base.run("inspect", os.fsdecode(nb), "--mask-convention", "keep")
    check(rc == 0 and "no\u00a0break.npz" in out, "C2 A0 kept: %r" % out[:80])


def case_plan_text_forms():
    """The text report names an explicit multiple, the minimal alignment, ffd and nextfit, the attention
    objective; -q and --quiet print nothing; seeds that are no unsigned integer, JSON lengths too large
    to be exact and [n, 2] arrays are refused."""
    path = lengths("l3.txt", [5, 6, 7])
    expect(["plan", path, "--capacity", "16", "--algorithm", "ffd", "--multiple", "4", "--objective", "attention"], 0,
           out_has=["capacity 16, multiple 4 (cp 1, tp 1, explicit), algorithm ffd, objective attention (24576*L + L^2)"])
    expect(["plan", path, "--capacity", "16", "--algorithm", "nextfit", "--align", "minimal", "--cp", "2"], 0,
           out_has=["capacity 16, multiple 4 (cp 2, tp 1, minimal), algorithm nextfit, objective tokens"])
    for q in ("-q", "--quiet"):
        rc, out, err = base.run("plan", path, "--capacity", "16", q)
        check(rc == 0 and out == "" and err == "", "plan %s prints nothing: %r %r" % (q, out, err))
    for seed in ("abc", "99999999999999999999999"):
        expect(["plan", path, "--capacity", "16", "--seed", seed], 2,
               err_has=["--seed: expected an integer >= 0, found '%s'" % seed])
    expect(["plan", "-", "--capacity", "16"], 1, stdin=b'{"length": 1e16}\n',
           err_has=["-:1: expected a length (integer) or a list of tokens"])
    import struct
    wide = tmp("wide.npy")
    with open(wide, "wb") as f:
        f.write(raw_npy("<i4", (3, 2), struct.pack("<6i", 1, 2, 3, 4, 5, 6)))
    expect(["plan", wide, "--capacity", "16"], 1,
           err_has=["expected a 1-D integer array of lengths, found int32 with 2 dimension(s)"])


def case_inspect_more_masks():
    """An additive [B,1,1,S] padding mask; a masked one with a value not 0/1 (the library's message); rule
    flags that agree with a 4D mask; a grid whose row count disagrees; input_ids of no per-token shape."""
    add = tmp("additive_pad.npz")
    base.npz(add, {"attention_mask": ("f4", (2, 1, 1, 4), [0, 0, 0, -1e9, 0, 0, -1e9, -1e9])})
    d = inspect_json(add, "--mask-convention", "additive")
    check([(g["row"], g["length"]) for g in d["segments"]] == [(0, 3), (1, 2)], "additive padding %r" % d["segments"])
    bad = tmp("bad_pad.npz")
    base.npz(bad, {"attention_mask": ("i8", (1, 1, 1, 4), [0, 2, 0, 1])})
    expect(["inspect", bad, "--mask-convention", "masked"], 1,
           out_has=["attention_mask: MASKPACK_ERR_VALUE: mask[0, 0, 0, 1]: expected 0 or 1 in a MASKED mask (1 = "
                    "excluded), found 2"])
    m4 = tmp("causal4d.npz")
    base.npz(m4, {"attention_mask": ("i8", (1, 1, 4, 4), [1 if j <= i else 0 for i in range(4) for j in range(4)])})
    expect(["inspect", m4, "--mask-convention", "keep", "--alignment", "bottom_right", "--window", "-1,-1"], 0,
           out_has=["problems: none"])
    grid = tmp("grid_rows.npz")
    base.npz(grid, {"attention_mask": ("i8", (2, 4), [1] * 8), "labels": ("i8", (1, 4), [1, 2, 3, 4]),
                    "input_ids": ("i8", (1, 2, 4), [1] * 8)})
    expect(["inspect", grid, "--mask-convention", "keep"], 1,
           out_has=["input_ids: int64 [1, 2, 4] has no per-token shape (expected [B,S] or [T])\n",
                    "shape: labels [1, 4] implies a [1, 4] token grid, attention_mask [2, 4] implies [2, 4]"])


def case_bad_values():
    """Every value check of both commands' parsers: exit status 2 and the message naming the flag."""
    for args, msg in [
        (["--as", "foo"], "--as: expected attention_mask|position_ids|cu_seqlens|mask4d, found 'foo'"),
        (["--mask-convention", "foo"], "--mask-convention: expected keep|doc_id|masked|additive, found 'foo'"),
        (["--position-rule", "foo"], "--position-rule: expected reset|step, found 'foo'"),
        (["--cu-form", "xx"], "--cu-form: expected te|npu, found 'xx'"),
        (["--emit-convention", "foo"], "--emit-convention: expected keep|masked|additive, found 'foo'"),
        (["--emit-dtype", "foo"], "--emit-dtype: expected a dtype name"),
        (["--png-rows", "a,b"], "--png-rows: expected a comma list of up to 64 row indices, found 'a,b'"),
        (["--png-zoom", "99"], "--png-zoom: expected an integer in [1, 32], found '99'"),
        (["--emit-dtype", "int32"], "--emit-dtype applies to --emit mask4d only"),
        (["--emit", "mask2d"], "--emit needs --out FILE.npz"),
        (["--out", tmp("x.npz")], "--out needs --emit a,b,..."),
        (["--emit", "foo", "--out", tmp("x.npz")], "--emit: expected a comma list of mask2d"),
        (["--emit", "x" * 600, "--out", tmp("x.npz")], "--emit: expected a comma list of mask2d"),
        (["--window", "12"], "--window: expected L,R (e.g. 128,0 or -1,-1), found '12'"),
        (["--window", "-2,0"], "--window: expected two integers >= -1, found '-2,0'"),
        (["--window", "3,x"], "--window: expected two integers >= -1, found '3,x'"),
        (["--window", "4,-5"], "--window: expected two integers >= -1, found '4,-5'"),
        (["--alignment", "middle"], "--alignment: expected top_left|bottom_right, found 'middle'"),
        (["--total", "-1"], "--total: expected an integer >= 0, found '-1'"),
        (["--total", "7x"], "--total: expected an integer >= 0, found '7x'"),
        (["--total", "99999999999999999999"], "--total: expected an integer >= 0, found '99999999999999999999'"),
        (["--emit-fill", "zero"], "--emit-fill: expected neg_inf|dtype_min, found 'zero'"),
        (["--index-dtype", "int16"], "--index-dtype: expected int32|int64, found 'int16'"),
        (["--block", "0"], "--block: expected an integer >= 1, found '0'"),
        (["--block", "b"], "--block: expected an integer >= 1, found 'b'"),
        (["--npu-layout", "XYZ"], "--npu-layout: expected TND|BSND|BNSD|BSH|SBH, found 'XYZ'"),
        (["--head-dim", "0"], "--head-dim: expected an integer >= 1, found '0'"),
        (["--head-dim", ""], "--head-dim: expected an integer >= 1, found ''"),
        (["--scale", "0"], "--scale: expected a finite number > 0, found '0'"),
        (["--scale", "inf"], "--scale: expected a finite number > 0, found 'inf'"),
        (["--scale", "1.5x"], "--scale: expected a finite number > 0, found '1.5x'"),
        (["--scale", ""], "--scale: expected a finite number > 0, found ''"),
        (["--max-bytes", "0"], "--max-bytes: expected a byte count >= 1, found '0'"),
        (["--png-zoom", "0"], "--png-zoom: expected an integer in [1, 32], found '0'"),
        (["--png-zoom", "z"], "--png-zoom: expected an integer in [1, 32], found 'z'"),
        (["--png-rows", "-1"], "--png-rows: expected a comma list of up to 64 row indices, found '-1'"),
        (["--png-rows", ",".join(["0"] * 65)], "--png-rows: expected a comma list of up to 64 row indices"),
        (["--png-rows", "1" * 600], "--png-rows: expected a comma list of up to 64 row indices"),
        (["--causal=1"], "option '--causal' takes no value"),
        (["--json=yes"], "option '--json' takes no value"),
        (["--block"], "option '--block' needs a value"),
        (["--no-such-flag"], "unknown option '--no-such-flag'"),
        (["--" + "z" * 100], "unknown option '--" + "z" * 100 + "'"),
        (["a.npz", "b.npz"], "more than one FILE given ('a.npz' and 'b.npz')"),
    ]:
        expect(["inspect"] + args, 2, err_has=[msg])
    path = lengths("ok.txt", [5])
    expect(["plan", path, "--capacity", "16", "--micro-batches", "0"], 2,
           err_has=["--micro-batches: expected an integer >= 1, found '0'"])
    expect(["plan", path, "--capacity", "16", "--frobnicate"], 2, err_has=["--frobnicate needs a value"])
    expect(["plan", path, "--capacity", "16", "--model", "0"], 2, err_has=["--model: hidden: expected in [1, 2^30], found 0"])
    model_msg = "--model: expected H[,I[,Q[,KV[,GATED[,CAUSAL]]]]] non-negative integers, found "
    for args, msg in [
        (["--capacity", "0"], "--capacity: expected an integer >= 1, found '0'"),
        (["--capacity", "1x"], "--capacity: expected an integer >= 1, found '1x'"),
        (["--capacity", "16", "--dp", "0"], "--dp: expected an integer >= 1, found '0'"),
        (["--capacity", "16", "--dp", "q"], "--dp: expected an integer >= 1, found 'q'"),
        (["--capacity", "16", "--micro-batches", "b"], "--micro-batches: expected an integer >= 1, found 'b'"),
        (["--capacity", "16", "--cp", "0"], "--cp: expected an integer >= 1, found '0'"),
        (["--capacity", "16", "--cp", "c"], "--cp: expected an integer >= 1, found 'c'"),
        (["--capacity", "16", "--tp", "-1"], "--tp: expected an integer >= 1, found '-1'"),
        (["--capacity", "16", "--multiple", "0"], "--multiple: expected an integer >= 1, found '0'"),
        (["--capacity", "16", "--align", "max"], "--align: expected verl or minimal, found 'max'"),
        (["--capacity", "16", "--objective", "flops"], "--objective: expected tokens or attention, found 'flops'"),
        (["--capacity", "16", "--attention-a", "0"], "--attention-a: expected a number > 0, found '0'"),
        (["--capacity", "16", "--attention-a", "inf"], "--attention-a: expected a number > 0, found 'inf'"),
        (["--capacity", "16", "--attention-a", "2x"], "--attention-a: expected a number > 0, found '2x'"),
        (["--capacity", "16", "--model", "1" * 300], "--model: value too long"),
        (["--capacity", "16", "--model", "1,2,3,4,5,6,7"], model_msg + "'1,2,3,4,5,6,7'"),
        (["--capacity", "16", "--model", "64,-1"], model_msg + "'64,-1'"),
        (["--capacity", "16", "--model", ","], "--model: expected at least the hidden size"),
        (["--capacity", "16", "--algorithm", "greedy"], "--algorithm: expected bfd, ffd or nextfit, found 'greedy'"),
        (["--capacity", "16", "--seed", "-3"], "--seed: expected an integer >= 0, found '-3'"),
        (["--capacity", "16", "--row-width", "wide"], "--row-width: expected capacity or used, found 'wide'"),
        (["--capacity", "16", "--png-rows", "0"], "--png-rows: expected an integer >= 1, found '0'"),
        (["--capacity", "16", "--bogus=3"], "unknown option '--bogus'"),
        (["--capacity", "16", "--" + "y" * 80 + "=1"], "unknown option '--" + "y" * 80),
        (["--capacity", "16", "--" + "y" * 80], "unknown option '--" + "y" * 80),
        (["--dp", "1"], "--capacity is required"),
        (["extra.txt", "--capacity", "16"], "one lengths file expected, found"),
    ]:
        expect(["plan", path] + args, 2, err_has=[msg])
    expect(["plan", "--capacity", "16"], 2, err_has=["a lengths file is required"])
    # --flag=value is the same as --flag value
    r = json.loads(expect(["plan", path, "--capacity=16", "--dp=1", "--json"], 0))
    check(r["options"]["capacity"] == 16, "--capacity=16")


def case_plan_bad_inputs():
    """Unreadable length files: each refused (exit 1) with the file, the line and what was wrong."""
    two_d = tmp("l2d.npy")
    with open(two_d, "wb") as f:
        f.write(npy("i8", (2, 2), [1, 2, 3, 4]))
    expect(["plan", two_d, "--capacity", "16"], 1,
           err_has=["expected a 1-D integer array of lengths, found int64 with 2 dimension(s)"])
    floats = tmp("lf.npy")
    with open(floats, "wb") as f:
        f.write(npy("f4", (2,), [5.0, 6.0]))
    expect(["plan", floats, "--capacity", "16"], 1,
           err_has=["expected a 1-D integer array of lengths, found float32 with 1 dimension(s)"])
    u8 = tmp("lu8.npy")
    with open(u8, "wb") as f:
        f.write(npy("u1", (3,), [5, 6, 7]))
    check(plan_json(u8, "--capacity", "16")["report"]["real_tokens"] == 18, "uint8 lengths read")
    expect(["plan", tmp("missing.txt"), "--capacity", "16"], 1, err_has=["missing.txt: cannot open"])
    for text, msg in [(b'{"length": 5}\n{bad json\n', "-:2: not valid JSON"),
                      (b'{"length": 5}\n{"foo": 1}\n', '-:2: an object needs "length", "input_ids" or "tokens"'),
                      (b"5\n12abc\n", "-:2: expected an integer length, found '12abc'"),
                      (b"5\n-3\n", "-:2: expected a length >= 0, found -3")]:
        expect(["plan", "-", "--capacity", "16"], 1, stdin=text, err_has=[msg])
    # micro-batches: the report gives their costs (the sequences are dealt over them, {7} and {5, 6};
    # the packed rows dealt whole gave 13 and 5)
    expect(["plan", "-", "--capacity", "16", "--micro-batches", "2"], 0, stdin=b"5\n6\n7\n",
           out_has=["micro-batch cost: mean 9, max 11"])


def case_cp_sim():
    """cp-sim: per-rank attention work and tokens under the three assignments, a picture, bad values."""
    png = tmp("cp.png")
    out = expect(["cp-sim", "--tokens", "200000", "--ranks", "8,64", "--mix", "chat", "--png", png], 0,
                 out_has=["200000 tokens in", "chat mix", "wrote " + png])
    rows = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) == 7 and f[0].isdigit():
            rows[(int(f[0]), f[1])] = [float(x) for x in f[2:]]
    check(sorted(rows) == [(c, s) for c in (8, 64) for s in ("area-balanced", "contiguous", "zigzag")],
          "a row per rank count and scheme: %r" % sorted(rows))
    for cp in (8, 64):
        zz, ct, ab = rows[(cp, "zigzag")], rows[(cp, "contiguous")], rows[(cp, "area-balanced")]
        # causal documents: zigzag balances work far better than contiguous pieces, area-balanced best
        check(zz[1] < ct[1] and ab[1] <= zz[1] + 1e-9 and ab[1] < 1.01, "cp %d work imbalance %r" % (cp, rows))
        # zigzag and contiguous hold equal token counts; the area-balanced dealing does not
        check(zz[3] == 1.0 and ct[3] == 1.0 and ab[3] >= 1.0, "cp %d token imbalance" % cp)
        # ring bytes per step follow the largest rank's tokens (8 heads x 128 x 2 bytes, K and V)
        check(abs(zz[4] - zz[2] * 2 * 8 * 128 * 2) <= 1e-3 * zz[4], "cp %d ring bytes" % cp)
    with open(png, "rb") as f:
        head = f.read(24)
    # (the picture now has axes, names and a legend: its width is no longer 8 pixels per rank + 20)
    check(head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR" and struct.unpack(">I", head[16:20])[0] >= 64 * 8,
          "the picture: a PNG at least one bar of 8 pixels per rank wide")
    svg = tmp("cp.svg")
    expect(["cp-sim", "--tokens", "200000", "--ranks", "8,64", "--mix", "chat", "--png", svg], 0, out_has=["wrote " + svg])
    texts, groups, _ = base.svg_texts(svg)
    words = "\n".join(texts)
    for want in ["cp = 64", "zigzag", "contiguous", "area-balanced", "max / mean = ", "rank (0 to 63): one bar per rank",
                 "work", "0", "Legend", "mean: the mean work over ranks"]:
        check(want in texts or want in words, "cp-sim SVG lacks %r" % want)
    check(sum(1 for t in texts if t.startswith("mean ")) == 3, "a labelled mean line per scheme: %r" %
          [t for t in texts if t.startswith("mean")])
    check([c for c, _ in groups].count("mean-line") == 3, "three mean lines")
    again = expect(["cp-sim", "--tokens", "200000", "--ranks", "8,64", "--mix", "chat"], 0)
    def table(text):
        return [line for line in text.splitlines() if line.split() and line.split()[0].isdigit()]

    check(table(again) == table(out) and len(table(out)) == 6, "the same seed: the same table")
    other = expect(["cp-sim", "--tokens", "200000", "--ranks", "8", "--seed", "7"], 0)
    check("lognormal mix" in other, "another seed and mix")
    expect(["cp-sim", "--ranks", "0"], 2, err_has=["--ranks: expected up to 16 counts in [1, 65536]"])
    expect(["cp-sim", "--mix", "zipf"], 2, err_has=["--mix: expected lognormal, chat or uniform, found 'zipf'"])
    expect(["cp-sim", "--tokens", "-5"], 2, err_has=["--tokens: expected an integer in [1, 2^40], found '-5'"])
    expect(["cp-sim", "--bogus", "1"], 2, err_has=["unknown option '--bogus'"])
    expect(["cp-sim", "--help"], 0, out_has=["usage: maskpack cp-sim"])


CASES = {name[5:]: fn for name, fn in globals().items() if name.startswith("case_")}


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    base.BIN, base.ROOT = sys.argv[1], sys.argv[2]
    names = sys.argv[3:] or sorted(CASES)
    with tempfile.TemporaryDirectory(prefix="maskpack_cli_opts_") as t:
        base.TMP = t
        for name in names:
            CASES[name]()
    if base.FAILURES:
        print("%d check(s) failed" % len(base.FAILURES))
        return 1
    print("cli option tests passed: %s" % ", ".join(names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
