#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets: fuzz/corpus/<target>/<name>.

Each seed is a small valid input (plus a few near-misses) in the byte format its target reads; the
encoders below mirror the readers in fuzz/*.c step by step, so keep them in sync when a target's
input format changes. Only numpy and the standard library are used; the output is deterministic.

Run from anywhere:  python3 tools/make_fuzz_corpus.py
"""
import io
import json
import os
import shutil
import struct
import zipfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "fuzz", "corpus")

# maskpack_dtype codes
BOOL, U8, I8, I16, I32, I64, F16, BF16, F32, F64 = range(10)


def write(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(bytes(data))


def u32(v):
    return list(struct.pack("<I", v))


# ---- file formats ---------------------------------------------------------------------------------


def npy_bytes(arr, version=None):
    buf = io.BytesIO()
    if version is None:
        np.save(buf, arr, allow_pickle=False)
    else:
        np.lib.format.write_array(buf, arr, version=version, allow_pickle=False)
    return buf.getvalue()


def npz_bytes(arrays, compressed):
    out = io.BytesIO()
    method = zipfile.ZIP_DEFLATED if compressed else zipfile.ZIP_STORED
    with zipfile.ZipFile(out, "w", compression=method) as zf:
        for name, arr in arrays.items():
            info = zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = method
            with zf.open(info, "w", force_zip64=True) as f:  # like numpy.savez
                np.lib.format.write_array(f, np.asanyarray(arr), allow_pickle=False)
    return out.getvalue()


def safetensors_bytes(tensors, metadata=None):
    """tensors: list of (name, dtype string, shape, raw bytes)."""
    header, data, off = {}, b"", 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dt, shape, raw in tensors:
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        data += raw
        off += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def file_corpora():
    t = "fuzz_npy"
    write(t, "int32_2x3.npy", npy_bytes(np.arange(6, dtype=np.int32).reshape(2, 3)))
    write(t, "bool_mask.npy", npy_bytes(np.array([[1, 1, 0], [0, 1, 1]], dtype=bool)))
    write(t, "f16_fortran.npy", npy_bytes(np.asfortranarray(np.arange(6, dtype=np.float16).reshape(2, 3))))
    write(t, "i64_scalar.npy", npy_bytes(np.array(7, dtype=np.int64)))
    write(t, "empty_0x3.npy", npy_bytes(np.zeros((0, 3), dtype=np.float32)))
    write(t, "u8_1d.npy", npy_bytes(np.arange(5, dtype=np.uint8)))
    write(t, "i8_3d.npy", npy_bytes(np.arange(-4, 4, dtype=np.int8).reshape(2, 2, 2)))
    write(t, "f64_v2.npy", npy_bytes(np.linspace(0, 1, 4), version=(2, 0)))
    write(t, "i16_v3.npy", npy_bytes(np.arange(3, dtype=np.int16), version=(3, 0)))
    write(t, "bigendian.npy", npy_bytes(np.arange(3, dtype=">i4")))  # rejected: a near miss
    write(t, "truncated.npy", npy_bytes(np.arange(6, dtype=np.int32))[:-3])  # rejected

    t = "fuzz_npz"
    batch = {
        "attention_mask": np.array([[1, 1, 1, 0], [0, 1, 1, 1]], dtype=np.int64),
        "position_ids": np.array([[0, 1, 2, 0], [1, 0, 1, 2]], dtype=np.int64),
    }
    write(t, "stored.npz", npz_bytes(batch, False))
    write(t, "deflated.npz", npz_bytes(batch, True))
    write(t, "cu_seqlens.npz", npz_bytes({"cu_seqlens": np.array([0, 3, 5, 9], dtype=np.int32)}, True))
    write(t, "empty.npz", npz_bytes({}, False))
    shutil.copy(os.path.join(ROOT, "data", "sample_batch.npz"), os.path.join(CORPUS, t, "sample_batch.npz"))

    t = "fuzz_safetensors"
    write(t, "two.safetensors", safetensors_bytes([
        ("attention_mask", "I64", (2, 3), np.array([[1, 1, 0], [1, 1, 1]], dtype="<i8").tobytes()),
        ("cu_seqlens", "I32", (3,), np.array([0, 2, 5], dtype="<i4").tobytes()),
    ]))
    write(t, "meta_bf16.safetensors", safetensors_bytes([
        ("w", "BF16", (2, 2), np.array([0x3F80, 0, 0xBF80, 0x4000], dtype="<u2").tobytes()),
        ("flag", "BOOL", (3,), bytes([1, 0, 1])),
        ("empty", "F32", (0, 4), b""),
    ], metadata={"format": "pt"}))
    write(t, "all_dtypes.safetensors", safetensors_bytes([
        ("u8", "U8", (2,), bytes([1, 2])), ("i8", "I8", (2,), bytes([255, 1])),
        ("i16", "I16", (1,), struct.pack("<h", -3)), ("f16", "F16", (1,), struct.pack("<e", 1.5)),
        ("f64", "F64", (1,), struct.pack("<d", 2.25)),
    ]))
    # regression seed: huge dimensions before a zero one hold no element (the reader once called
    # their product an overflow, where the .npy reader accepts the same shape)
    write(t, "regression-zero-dim-after-huge.safetensors", safetensors_bytes([
        ("attention_mask", "I64", (1 << 32, 1 << 32, 0), b""),
    ]))


# ---- harness formats (mirror fuzz/*.c) --------------------------------------------------------------


def mask2d_corpus():
    t = "fuzz_mask2d"
    CAUSAL = 4
    # structured keep mask, int64, 3 rows x 16: right pad, full, left pad
    rows = [(0, 11), (0, 13), (4, 12)]
    data = [I64, 3, 16, 1 | CAUSAL]
    for left, ln in rows:
        data += [left, ln, 0]
    data += [0]  # no flips
    write(t, "keep_3x16", data)
    # structured doc ids, int32, 2 x 8: [1 1 1 2 2 2 3 3], [0 0 4 4 4 4 0 0]
    data = [I32, 2, 8, 1 | 2]
    data += [0, 8, 1, 1, 0, 1, 1, 4, 1, 0, 0]  # row 0: left 0, len 8, new docs at 3 and 6, next, reset
    data += [2, 4, 1, 1, 1, 0, 1]  # row 1: left 2, len 4, next, reset -> ids restart
    data += [0]
    write(t, "doc_2x8", data)
    # raw bool keep mask 2 x 5 (value byte, weird byte per cell)
    cells = [1, 1, 1, 0, 0, 0, 1, 1, 1, 1]
    data = [BOOL, 2, 5, 0]
    for v in cells:
        data += [v, 0]
    write(t, "raw_bool_2x5", data)
    # a hole (one flip inside the run): rejected
    data = [U8, 1, 6, 1, 1, 4, 0, 1] + u32(3) + [0, 0]
    write(t, "hole_1x6", data)
    # an all-pad row and an empty grid
    write(t, "allpad_2x4", [I32, 2, 4, 1 | CAUSAL, 0, 0, 0, 1, 3, 0, 0])
    write(t, "empty", [I64, 0, 0, 1])


def cu_corpus():
    t = "fuzz_cu_seqlens"

    def enc(flags, lens, fills=None, total_mode=0, dtype=None):
        data = [flags]
        if dtype is not None:
            data.append(dtype)
        data += [len(lens), total_mode, 0, 0]
        for i, ln in enumerate(lens):
            data += [ln, (fills or [0] * len(lens))[i], 0, 0]
        return data

    write(t, "te_3_2_0_4", enc(0, [3, 2, 0, 4]))
    write(t, "npu_2_2_0_2_2", enc(1, [2, 2, 0, 2, 2]))
    write(t, "te_padded_i64", enc(2 | 4 | 16, [3, 2, 4], fills=[1, 2, 3], total_mode=128))
    write(t, "npu_padded_total", enc(1 | 4, [1, 5], fills=[3, 0], total_mode=130))
    write(t, "te_float_dtype", enc(8, [2, 2], dtype=F32))
    write(t, "te_empty", enc(0, []))
    data = enc(0, [4, 4])
    data[3] = 250  # cu[0] = 2 (weird): a list not starting at 0
    write(t, "te_nonzero_start", data)


def position_corpus():
    t = "fuzz_position_ids"
    STEP, I32F, RAW, CAUSAL = 4, 8, 32, 64

    def runs(lengths, lead=0, tail=False):
        data = [lead]
        for ln in lengths:
            data += [ln - 1] + [0] * ln
        if tail:
            data.append(224)
        return data

    # rank 2 (flags % 3 == 1), B = 2, S = 12, reset rule
    data = [1, 1, 11] + runs([7, 5]) + runs([8], tail=True)
    write(t, "bs_reset_2x12", data)
    data = [1 | STEP | CAUSAL, 1, 11] + runs([7, 5]) + runs([8], tail=True)
    write(t, "bs_step_2x12", data)
    # rank 1 (flags % 3 == 0) packed, S = 10, step rule, int32
    write(t, "packed_step_10", [0 + STEP + I32F, 9] + runs([4, 6]))
    # rank 3 (flags % 3 == 2): [3, 1, 6]; then one byte per token for each other plane
    write(t, "mrope_1x6", [2, 0, 5] + runs([3, 3]) + [0] * 12)
    # left padding HF style (three 1s, then 0..4), B = 1, S = 8
    write(t, "leftpad_1x8", [1, 0, 7] + runs([5], lead=3))
    # a run continued from position 2 ((c >> 4) == 13), B = 1, S = 4
    write(t, "continued_1x4", [1 | STEP, 0, 3, 0, 0xD0 + 2, 2, 0, 0, 0, 0])
    # raw values (value byte, weird byte per token)
    write(t, "raw_2x6", [1 | RAW, 1, 5] + [v for p in [0, 1, 2, 0, 1, 0, 3, 4, 5, 0, 0, 0] for v in (p, 0)])


def mask4d_corpus():
    t = "fuzz_mask4d"
    KEEP, MASKED, ADDITIVE = 0, 1, 2
    RAW, ONEHEAD, CAUSAL, WINDOW, PADSEE = 4, 16, 32, 64, 128
    NEG_INF, MINUS_1E4, DTYPE_MIN = 0, 1, 2
    # [flags][dtype][fill][B][H][S]; structured rows: [left-pad?][left][len bytes...], window, flips
    # keep bool, B = 2, H = 1, S = 6 causal: row 0 docs 3 + 3; row 1 left pad 2 then 4
    write(t, "keep_causal_2x6", [KEEP | CAUSAL, BOOL, 0, 1, 0, 5, 1, 2, 2, 0, 2, 3, 1])
    # masked u8, B = 1, H = 2, S = 8, bidirectional, pad rows see valid keys: one doc of 4 then pad
    write(t, "masked_bidir_pad", [MASKED | PADSEE, U8, 0, 0, 1, 7, 1, 3, 250, 1])
    # additive f32 (-inf fill), causal sliding window left 2, B = 1, S = 7
    write(t, "additive_window", [ADDITIVE | CAUSAL | WINDOW, F32, NEG_INF, 0, 0, 6, 1, 6, 2, 1])
    # additive bf16, dtype-min fill, [B,1,S,S] of two heads, B = 1, S = 5: docs 2 + 3
    write(t, "additive_bf16", [ADDITIVE | CAUSAL | ONEHEAD, BF16, DTYPE_MIN, 0, 1, 4, 1, 1, 2, 1])
    # additive f16, Megatron's -10000, bidirectional, B = 2, S = 4
    write(t, "additive_f16_1e4", [ADDITIVE, F16, MINUS_1E4, 1, 0, 3, 1, 1, 1, 1, 250, 1])
    # raw bits, keep bool, B = 1, H = 1, S = 3: identity (each token alone)
    cells = [1, 0, 0, 0, 1, 0, 0, 0, 1]
    write(t, "raw_identity_3", [KEEP | RAW, BOOL, 0, 0, 0, 2] + [v for c in cells for v in (c, 0)])
    # a structured mask with one flipped cell (usually not representable)
    write(t, "flipped", [KEEP | CAUSAL, BOOL, 0, 0, 0, 5, 1, 5, 0, 0] + u32(7))


def npu_corpus():
    t = "fuzz_npu_validate"
    PACKED, RIGHT, LEFT = 2, 0, 1
    CAUSAL, WINDOW, BNSD = 4, 8, 16

    def rt(lens, opt, window=()):
        return [1, len(lens) - 1] + lens + [opt] + list(window)

    write(t, "rt_tnd_causal", rt([3, 5], PACKED | CAUSAL))
    write(t, "rt_bsnd_causal", rt([4, 2, 3], RIGHT | CAUSAL))
    write(t, "rt_bnsd_left", rt([4, 2], LEFT | CAUSAL | BNSD))
    write(t, "rt_tnd_bidir", rt([2, 0, 3], PACKED))
    write(t, "rt_bsnd_window", rt([6, 5], RIGHT | CAUSAL | WINDOW, (2,)))
    write(t, "rt_tnd_window", rt([6, 3], PACKED | WINDOW, (1, 2)))

    def hand(layout, batch, q, kv, heads, head_dim_shift, mode, pre, nxt, opt, extra):
        # [0][layout][batch v w][q v w][kv v w][total_q][total_kv][hq v w][hkv v w][hd v w][mode][pre v w][next v w][opt]
        return ([0, layout, batch - 1, 0, q - 1, 0, kv - 1, 0, 0, 0, heads - 1, 0, heads - 1, 0,
                 head_dim_shift, 0, mode + 1, pre + 1, 0, nxt + 1, 0, opt] + extra)

    # BSND mode 0 without a mask, scale not passed: findings expected
    write(t, "hand_bsnd_nomask", hand(0, 2, 4, 4, 2, 0, 0, 6, 0, 1, [0, 0]))
    # BSND mode 1 with a [2,1,4,4] full mask (opt: mask, inner precise, scale 0.125)
    mask = [1, 2, 1, 4, 4] + [0, 1, 1, 1, 0, 0, 1, 1, 0, 0, 0, 1, 0, 0, 0, 0] * 2 + [0]
    write(t, "hand_bsnd_full_mask", hand(0, 2, 4, 4, 1, 0, 1, 6, 6, 2 | 4 | 8, mask + [0, 0]))
    # TND with both actual_seq lists [2, 4, 6] and an intended packed layout of lengths 2, 2, 2
    items = [3] + [2, 0, 2, 0, 0, 0, 0] + [2, 0, 2, 0, 0, 0, 0] + [2, 0, 2, 0, 0, 0, 0]
    write(t, "hand_tnd_lists", hand(4, 1, 1, 1, 1, 0, 3, 0, 0, 2 | 32 | 64, items + [1, 2, 2, 2, 2, 1, 2]))
    # compressed 2048 x 2048 mask with mode 2
    write(t, "hand_compressed", hand(0, 1, 8, 8, 1, 0, 2, 0, 0, 2 | 8 | 16, [0, 255, 0] + [0, 0]))


def header_only_npy(descr, shape):
    """An .npy header with no data: a shape holding no element (or lying about its size)."""
    h = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (descr, "".join("%d, " % d for d in shape))
    h += " " * (-(10 + len(h) + 1) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h.encode()


def inspect_corpus():
    """fuzz_inspect: one selector byte (bits 0-1 mask convention keep/doc_id/masked/additive, 2 npu
    cu form, 3 step position rule, 4 bidirectional, 5-7 --as none/attention_mask/position_ids/
    cu_seqlens/mask4d) then a file. The regression seeds are the hostile inputs of the issue."""
    t = "fuzz_inspect"
    AS_MASK, AS_POS, AS_CU, AS_M4 = 1 << 5, 2 << 5, 3 << 5, 4 << 5
    mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=np.int64)
    pos = np.array([[0, 1, 2, 0], [0, 1, 0, 0]], dtype=np.int64)
    write(t, "batch.npz", bytes([0]) + npz_bytes({"attention_mask": mask, "position_ids": pos,
                                                 "cu_seqlens": np.array([0, 3, 5], np.int32),
                                                 "labels": np.array([[5, 6, 7, -100], [8, 9, -100, -100]])},
                                                compressed=True))
    write(t, "batch.safetensors", bytes([0]) + safetensors_bytes(
        [("attention_mask", "I64", mask.shape, mask.tobytes()), ("position_ids", "I64", pos.shape, pos.tobytes())]))
    m4 = np.tril(np.ones((4, 4), dtype=bool))[None, None].repeat(2, 0)
    m4[1, :, 2:, :] = False
    write(t, "mask4d.npy", bytes([AS_M4]) + npy_bytes(m4))
    write(t, "doc_id.npy", bytes([AS_MASK | 1]) + npy_bytes(np.array([[1, 1, 2, 0]], dtype=np.int32)))
    write(t, "pos_mrope.npy", bytes([AS_POS]) + npy_bytes(np.zeros((3, 1, 4), dtype=np.int64) + np.arange(4)))
    # regression seeds: a cu_seqlens claiming 2^61 (2^62 + 1) tokens crashed the analysis (B*S*8 wrapped)
    write(t, "cu_2pow61.npy", bytes([AS_CU]) + npy_bytes(np.array([0, 2 ** 61], dtype=np.int64)))
    write(t, "cu_2pow62p1.npy", bytes([AS_CU]) + npy_bytes(np.array([0, 2 ** 62 + 1], dtype=np.int64)))
    write(t, "cu_2pow61.npz", bytes([0]) + npz_bytes({"cu_seqlens": np.array([0, 2 ** 61])}, compressed=False))
    # zero-size dimensions with a huge other one hung (every row visited)
    write(t, "mask_2pow33x0.npy", bytes([AS_MASK]) + header_only_npy("|i1", (2 ** 33, 0)))
    write(t, "pos_2pow33x0.npy", bytes([AS_POS]) + header_only_npy("<i8", (2 ** 33, 0)))
    write(t, "pos_3x2pow33x0.npy", bytes([AS_POS | 8]) + header_only_npy("<i8", (3, 2 ** 33, 0)))
    write(t, "mask4d_2pow33x1x0x0.npy", bytes([AS_M4]) + header_only_npy("|b1", (2 ** 33, 1, 0, 0)))
    # members that claim more than the budget once inflated (deflated zeros)
    z = np.zeros(12 << 20, dtype=np.uint8)
    write(t, "inflates_past_budget.npz", bytes([0]) + npz_bytes({"a": z, "b": z, "c": z}, compressed=True))
    # names with control characters, and 'x' beside 'x.npy'
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        zf.writestr("attention_mask.npy", npy_bytes(mask))
        zf.writestr("x\x1b[2J\nproblems: none\x07.npy", npy_bytes(np.zeros(1, np.int8)))
        zf.writestr("attention_mask", npy_bytes(mask))
    write(t, "names.npz", bytes([0]) + out.getvalue())
    write(t, "st_not_utf8.safetensors", bytes([0]) + safetensors_bytes([("a", "U8", (4,), bytes(4))]).replace(
        b'"a"', b'"\xff"', 1))


def plan_corpus():
    """fuzz_plan: the lengths file of `maskpack plan` (text, JSON lines, .npy)."""
    t = "fuzz_plan"
    write(t, "lines.txt", b"5\n3\n8\n1\n\n2\n")
    write(t, "crlf.txt", b"7\r\n 4 \r\n")
    write(t, "jsonl.txt", b'{"length": 5}\n{"input_ids": [1, 2, 3]}\n[4, 5]\n{"tokens": [9]}\n3\n')
    write(t, "lengths.npy", npy_bytes(np.array([5, 3, 8, 1], dtype=np.int64)))
    write(t, "lengths_i32.npy", npy_bytes(np.array([4, 4, 2], dtype=np.int32)))
    write(t, "bad.txt", b"5\n-3\nx\n")  # rejected: a near miss
    write(t, "ones.txt", b"1\n" * 600)


def main():
    # the generated seeds are rewritten from scratch; regression seeds committed by hand (files named
    # regression-*, the inputs fuzzing once found) stay
    for d, _, files in os.walk(CORPUS):
        for name in files:
            if not name.startswith("regression-"):
                os.remove(os.path.join(d, name))
    file_corpora()
    mask2d_corpus()
    cu_corpus()
    position_corpus()
    mask4d_corpus()
    npu_corpus()
    inspect_corpus()
    plan_corpus()
    n = sum(len(files) for _, _, files in os.walk(CORPUS))
    print("wrote %d seed inputs under fuzz/corpus/" % n)


if __name__ == "__main__":
    main()
