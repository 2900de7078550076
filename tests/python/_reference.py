"""Independent pure-Python/numpy reference for the maskpack tests.

Everything here is written from the contract in include/maskpack.h (the rule formula, the output
definitions), never from the library's code, and works from a plain segment list and a rule dict:

    segments: [(row, q_start, q_len, kv_start, kv_len), ...]
    rule:     {"causal", "alignment", "window", "spans", "prefix"}
"""

from __future__ import annotations

import numpy as np


def local_allowed(q_len, kv_len, k, rule):
    """[q_len, kv_len] bool: the header's rule inside segment k (local coordinates)."""
    i = np.arange(q_len)[:, None]
    j = np.arange(kv_len)[None, :]
    d = kv_len - q_len if rule["alignment"] == "bottom_right" else 0
    left, right = rule["window"]
    base = np.ones((q_len, kv_len), bool)
    if rule["causal"]:
        base &= j <= i + d
    if left >= 0:
        base &= j >= i + d - left
    if right >= 0:
        base &= j <= i + d + right
    out = base
    for seg, s, e in rule["spans"]:
        if seg == k:
            ins_i = (i >= s) & (i < e)
            ins_j = (j >= s) & (j < e)
            out = out | (ins_i & ins_j)
    if rule["prefix"] is not None:
        out = out | (j < rule["prefix"][k])
    return out


def allowed(segments, rule, n_rows, q_width, kv_width):
    """[B, S, Skv] bool reference predicate."""
    a = np.zeros((n_rows, q_width, kv_width), bool)
    for k, (row, qs, ql, ks, kl) in enumerate(segments):
        if ql and kl:
            a[row, qs:qs + ql, ks:ks + kl] = local_allowed(ql, kl, k, rule)
    return a


def per_token(segments, n_rows, q_width, packed, fn, fill=0, dtype=np.int64):
    out = np.full((n_rows, q_width), fill, dtype=dtype)
    for k, (row, qs, ql, _ks, _kl) in enumerate(segments):
        for t in range(ql):
            out[row, qs + t] = fn(k, t)
    return out.reshape(-1) if packed else out


def mask2d(segments, n_rows, q_width, packed):
    return per_token(segments, n_rows, q_width, packed, lambda k, t: True, False, bool)


def position_ids(segments, n_rows, q_width, packed):
    return per_token(segments, n_rows, q_width, packed, lambda k, t: t)


def segment_ids(segments, n_rows, q_width, packed):
    return per_token(segments, n_rows, q_width, packed, lambda k, t: k + 1)


def cu_seqlens(segments, form="te", kv=False):
    lens = [s[4] if kv else s[2] for s in segments]
    ends = list(np.cumsum(lens, dtype=np.int64)) if lens else []
    return ([0] + ends) if form == "te" else ends


def cu_seqlens_padded(segments, n_rows, q_width):
    """The header: slot k starts at segment k's first column, or its row's first column when it is
    the first segment of its row; entry 0 is 0 and entry N is B*S."""
    if not segments:
        return [0]
    out = [0]
    for k in range(1, len(segments)):
        row, qs = segments[k][0], segments[k][1]
        first_in_row = segments[k - 1][0] != row
        out.append(row * q_width + (0 if first_in_row else qs))
    out.append(n_rows * q_width)
    return out


def valid_indices(segments, q_width):
    idx = []
    for row, qs, ql, _ks, _kl in segments:
        idx.extend(row * q_width + qs + t for t in range(ql))
    return sorted(idx)


def last_token_index(segments, q_width):
    return [row * q_width + qs + ql - 1 if ql else -1 for row, qs, ql, _ks, _kl in segments]


def block_status(allowed_rows, block_q, block_k):
    """allowed_rows [B,S,Skv] -> [B,Qb,Kb] 0 empty / 1 partial / 2 full. As torch's create_block_mask,
    the grid is padded to whole blocks with False: a block cut short by the grid's end is never full."""
    b, s, skv = allowed_rows.shape
    qb = -(-s // block_q)
    kb = -(-skv // block_k)
    st = np.zeros((b, qb, kb), np.int64)
    for x in range(qb):
        for y in range(kb):
            blk = allowed_rows[:, x * block_q:(x + 1) * block_q, y * block_k:(y + 1) * block_k]
            anyv = blk.reshape(b, -1).any(axis=1)
            whole = blk.shape[1] == block_q and blk.shape[2] == block_k
            allv = blk.reshape(b, -1).all(axis=1) & whole
            st[:, x, y] = np.where(allv, 2, np.where(anyv, 1, 0))
    return st


def expand_block_lists(num, idx, n_other):
    """([B,1,n] counts, [B,1,n,m] indices) -> [B,n,m] membership, checking ascending, in-range lists."""
    num = np.asarray(num)[:, 0]
    idx = np.asarray(idx)[:, 0]
    b, n = num.shape
    out = np.zeros((b, n, n_other), bool)
    for x in range(b):
        for y in range(n):
            c = int(num[x, y])
            assert 0 <= c <= n_other
            lst = idx[x, y, :c]
            assert list(lst) == sorted(set(int(v) for v in lst)), "block lists must ascend without repeats"
            assert all(0 <= v < n_other for v in lst)
            out[x, y, lst] = True
            assert not idx[x, y, c:].any(), "entries past the count stay as initialised (zero)"
    return out


def magi_expand(q_ranges, k_ranges, types, n_q, n_k):
    """Union of MagiAttention slices -> [n_q, n_k] bool over flattened token indices.
    FULL=0, CAUSAL=1 (bottom-right), INVCAUSAL=2 (top-left inverse), BICAUSAL=3."""
    out = np.zeros((n_q, n_k), bool)
    for (q0, q1), (k0, k1), t in zip(np.asarray(q_ranges), np.asarray(k_ranges), np.asarray(types)):
        qn, kn = q1 - q0, k1 - k0
        i = np.arange(qn)[:, None]
        j = np.arange(kn)[None, :]
        if t == 0:
            m = np.ones((qn, kn), bool)
        elif t == 1:
            m = j <= i + kn - qn
        elif t == 2:
            m = j >= i
        elif t == 3:
            m = (j >= i) & (j <= i + kn - qn)
        else:
            raise AssertionError(f"unknown slice type {t}")
        out[q0:q1, k0:k1] |= m
    return out


def flatten_allowed(a):
    """[B,S,Skv] -> [B*S, B*Skv] block-diagonal predicate over flattened indices."""
    b, s, skv = a.shape
    out = np.zeros((b * s, b * skv), bool)
    for x in range(b):
        out[x * s:(x + 1) * s, x * skv:(x + 1) * skv] = a[x]
    return out
