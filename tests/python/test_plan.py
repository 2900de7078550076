"""maskpack.plan (the packing planner) and the `maskpack plan` command.

Checks the placement invariants, the balance, the layouts each row yields, the best-fit packer against
a plain reference implementation and against the `binpacking` package ms-swift packs with (our
best-fit-decreasing must fill at least as well), and the CLI on text, .npy and JSON-lines inputs.
"""

import glob
import json
import os
import shutil
import struct
import subprocess
import zlib

import binpacking
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import maskpack

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ---- helpers -----------------------------------------------------------------------------------------


def sft_lengths(n, seed, capacity=8192):
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(np.log(600), 1.0, n).astype(np.int64), 16, capacity)


def check_plan(p, lengths, capacity, dp=1, micro_batches=1, multiple=1, split=False):
    """Every invariant a plan must hold for its input."""
    lengths = [int(x) for x in lengths]
    rep = p.report()
    assert p.n_rows == rep["n_rows"] == len(p.rows) == len(p.pieces)
    assert rep["n_rows"] == dp * micro_batches * rep["rows_per_microbatch"]
    assert rep["n_packed_rows"] + rep["n_empty_rows"] == rep["n_rows"]
    assert rep["multiple"] == multiple
    covered = [0] * len(lengths)
    pieces_of = {}
    for r, pieces in enumerate(p.pieces):
        assert [pc[0] for pc in pieces] == p.rows[r]
        assert sorted(pieces) == pieces  # sorted by (sequence, offset)
        used = 0
        for seq, off, length, slot in pieces:
            assert slot == -(-length // multiple) * multiple  # alignment padding included
            assert 0 <= off and off + length <= lengths[seq]
            covered[seq] += length
            pieces_of.setdefault(seq, []).append((off, length))
            used += slot
        assert used <= capacity  # no row over capacity
        assert used == p.row_used[r]
    # every sequence placed exactly once (its pieces tile [0, L))
    assert covered == lengths
    for seq, parts in pieces_of.items():
        parts.sort()
        pos = 0
        for off, length in parts:
            assert off == pos
            pos += length
        if not split:
            assert len(parts) == 1
    assert len(pieces_of) == len(lengths)
    # equal row counts per rank and micro-batch
    per_rank = rep["rows_per_rank"]
    assert p.rank_of_row == [r // per_rank for r in range(p.n_rows)]
    counts = np.bincount(p.rank_of_row, minlength=dp)
    assert counts.tolist() == [per_rank] * dp
    assert p.microbatch_of_row == [(r // rep["rows_per_microbatch"]) % micro_batches for r in range(p.n_rows)]
    # rank costs are the sums of their rows' costs
    rc = np.zeros(dp)
    np.add.at(rc, p.rank_of_row, p.row_costs)
    assert np.allclose(rc, p.rank_costs)
    assert rep["real_tokens"] == sum(lengths)
    if rep["n_packed_rows"]:
        assert rep["fill"] == pytest.approx(sum(lengths) / (capacity * rep["n_packed_rows"]))
    return rep


def ref_bfd(sizes, capacity):
    """Plain best-fit-decreasing with the documented tie rules (items: size descending then index;
    rows: least sufficient free space, then the row updated last). -> rows of item indices."""
    order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
    free, stamp, rows, clock = [], [], [], 0
    for i in order:
        best = None
        for r in range(len(free)):
            if free[r] >= sizes[i] and (best is None or free[r] < free[best]
                                        or (free[r] == free[best] and stamp[r] > stamp[best])):
                best = r
        if best is None:
            free.append(capacity)
            stamp.append(0)
            rows.append([])
            best = len(free) - 1
        free[best] -= sizes[i]
        clock += 1
        stamp[best] = clock
        rows[best].append(i)
    return [sorted(r) for r in rows]


# ---- the Python API ------------------------------------------------------------------------------------


def test_small_plan_rows_and_layouts():
    p = maskpack.plan([3, 7, 1, 6, 5, 2, 4], capacity=10)
    assert p.rows == [[0, 1], [3, 6], [2, 4, 5]]
    check_plan(p, [3, 7, 1, 6, 5, 2, 4], 10)
    rep = p.report()
    assert rep["n_packed_rows"] == 3 and rep["tail_padding"] == 2
    lays = p.layouts()
    assert len(lays) == 3
    lay = lays[2]
    assert isinstance(lay, maskpack.Layout)
    assert lay.packed and lay.q_width == 10
    assert lay.seqlens.tolist() == [1, 5, 2]
    assert lay.cu_seqlens().tolist() == [0, 1, 6, 8]
    assert lay.cu_seqlens_padded().tolist() == [0, 1, 6, 10]
    # the rule keywords reach the layout
    assert p.layout(0, causal=False).rule["causal"] is False


def test_balance_and_microbatches_match_layouts():
    lengths = sft_lengths(3000, seed=1, capacity=4096)
    p = maskpack.plan(lengths, 4096, dp=8, micro_batches=2, objective="attention")
    rep = check_plan(p, lengths, 4096, dp=8, micro_batches=2)
    assert rep["attention_a"] == 24576.0
    assert rep["imbalance"] < 0.01  # hundreds of rows per rank balance tightly
    # micro-batch layout rows hold exactly the plan rows' sequences
    lay = p.microbatch_layout(3, 1)
    rows = p.rows_of(3, 1)
    assert lay.n_rows == len(rows) == rep["rows_per_microbatch"]
    assert lay.n_tokens == sum(int(lengths[s]) for r in rows for s in p.rows[r])
    assert p.microbatch_costs.shape == (8, 2)
    assert np.allclose(p.microbatch_costs.sum(axis=1), p.rank_costs)
    # attention cost by hand for one row
    r = rows[0]
    want = sum(24576.0 * slot + slot * slot for _, _, _, slot in p.pieces[r])
    assert p.row_costs[r] == pytest.approx(want)


def test_cp_alignment_in_rows_and_layouts():
    lengths = [5, 9, 3, 12, 1, 7, 8, 2, 13, 6, 30, 17]
    p = maskpack.plan(lengths, 32, cp=2)  # verl: tp*cp*2 = 4
    check_plan(p, lengths, 32, multiple=4)
    for lay in p.layouts():
        cu = lay.cu_seqlens_padded().tolist()
        assert all(c % 4 == 0 for c in cu) and cu[-1] == 32
    p = maskpack.plan(lengths, 48, cp=2, tp=3, align="minimal")  # cp * lcm(2, tp) = 12
    check_plan(p, lengths, 48, multiple=12)
    p = maskpack.plan(lengths, 34, multiple=8, row_width="used")  # 30 -> slot 32 <= 34
    check_plan(p, lengths, 34, multiple=8)
    assert [lay.q_width for lay in p.layouts()] == p.row_used.tolist()


def test_errors_name_the_sequence():
    with pytest.raises(maskpack.Error) as e:
        maskpack.plan([4, 9, 11, 2], 10)
    assert e.value.status == "MASKPACK_ERR_VALUE"
    assert e.value.index == (2,)
    assert e.value.argument == "lengths"
    assert "sequence 2" in e.value.message and "11" in e.value.message
    with pytest.raises(maskpack.Error) as e:
        maskpack.plan([12, 13], 12, multiple=4)
    assert e.value.index == (1,) and "slot of 16" in e.value.message
    with pytest.raises(maskpack.Error) as e:
        maskpack.plan([3, -1], 10)
    assert e.value.index == (1,)
    with pytest.raises(maskpack.Error):
        maskpack.plan([3], 10, dp=0)
    with pytest.raises(maskpack.Error):
        maskpack.plan([3], 10, algorithm="worst")
    with pytest.raises(TypeError):
        maskpack.plan([3.5], 10)
    with pytest.raises(TypeError):
        maskpack.plan(np.array([1.0, 2.0]), 10)


def test_split_pieces():
    p = maskpack.plan([25, 3, 10, 0], 10, allow_split=True)
    check_plan(p, [25, 3, 10, 0], 10, split=True)
    pieces = sorted(pc for row in p.pieces for pc in row if pc[0] == 0)
    assert pieces == [(0, 0, 10, 10), (0, 10, 10, 10), (0, 20, 5, 5)]
    assert p.report()["n_split"] == 1
    # a split sequence is listed in every row holding one of its pieces
    assert sum(row.count(0) for row in p.rows) == 3


def test_determinism_and_seed():
    lengths = (np.arange(2000) % 7 + 1) * 64  # many equal lengths
    a = maskpack.plan(lengths, 1024, dp=4, seed=0)
    b = maskpack.plan(lengths, 1024, dp=4, seed=0)
    c = maskpack.plan(lengths, 1024, dp=4, seed=5)
    d = maskpack.plan(lengths, 1024, dp=4, seed=5)
    assert a.rows == b.rows and c.rows == d.rows
    assert a.rows != c.rows
    assert a.report()["n_packed_rows"] == c.report()["n_packed_rows"]
    check_plan(c, lengths, 1024, dp=4)


def test_inputs_torch_numpy_list_agree():
    import torch

    lengths = [int(x) for x in sft_lengths(500, seed=3, capacity=2048)]
    a = maskpack.plan(lengths, 2048, dp=2)
    b = maskpack.plan(np.array(lengths, dtype=np.int32), 2048, dp=2)
    c = maskpack.plan(torch.tensor(lengths), 2048, dp=2)
    assert a.rows == b.rows == c.rows


def test_bfd_matches_reference():
    rng = np.random.default_rng(7)
    for _ in range(30):
        n = int(rng.integers(1, 200))
        cap = int(rng.integers(10, 300))
        sizes = rng.integers(0, cap + 1, n).tolist()
        p = maskpack.plan(sizes, cap)
        assert p.rows == ref_bfd(sizes, cap)


def test_attention_coefficient():
    assert maskpack.attention_coefficient(4096) == 24576.0
    assert maskpack.attention_coefficient(4096, causal=True) == 2 * 24576.0
    W = 4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 4096 * 14336
    assert maskpack.attention_coefficient(4096, 14336, 4096, 1024, gated_mlp=True) == pytest.approx(W / 8192)
    p = maskpack.plan([100, 200], 1000, objective="attention", model=dict(hidden=1024))
    assert p.report()["attention_a"] == 6144.0
    p = maskpack.plan([100, 200], 1000, objective="attention", attention_a=10.0)
    assert p.row_costs[0] == pytest.approx(10 * 300 + 100**2 + 200**2)


def test_attention_a_precedence_and_hidden():
    # the user's a wins over a model shape; a hidden size alone gives 6 * hidden; nothing gives verl's
    p = maskpack.plan([100, 200], 1000, objective="attention", model=dict(hidden=1024), attention_a=7.0)
    assert p.report()["attention_a"] == 7.0
    p = maskpack.plan([100, 200], 1000, objective="attention", hidden=2048, attention_a=3.0)
    assert p.report()["attention_a"] == 3.0
    p = maskpack.plan([100, 200], 1000, objective="attention", hidden=2048)
    assert p.report()["attention_a"] == 6 * 2048
    assert p.row_costs.sum() == pytest.approx(6 * 2048 * 300 + 100**2 + 200**2)
    assert maskpack.plan([100, 200], 1000, objective="attention").report()["attention_a"] == 24576.0
    with pytest.raises(maskpack.Error) as e:
        maskpack.plan([1], 10, hidden=0)
    assert e.value.argument == "hidden"


# ---- balance across ranks, honest figures, rows as arrays -----------------------------------------


def rank_sums(p, lengths, a=24576.0):
    """Per rank: tokens (slots) and a*L + L^2, from the rows."""
    tok = np.zeros(p.dp)
    att = np.zeros(p.dp)
    for r, pieces in enumerate(p.pieces):
        q = r // (p.n_rows // p.dp)
        for _, _, _, slot in pieces:
            tok[q] += slot
            att[q] += a * slot + slot * slot
    return tok, att


def test_report_counts_every_row_and_both_imbalances():
    lengths = sft_lengths(5000, seed=11)
    p = maskpack.plan(lengths, 8192, dp=64)
    rep = check_plan(p, lengths, 8192, dp=64)
    assert rep["fill_all_rows"] == pytest.approx(lengths.sum() / (8192 * rep["n_rows"]))
    assert rep["fill_nonempty_rows"] == rep["fill"]
    assert rep["rows_per_rank"] * 64 == rep["n_rows"]
    tok, att = rank_sums(p, lengths)
    assert rep["token_imbalance"] == pytest.approx(tok.max() / tok.mean() - 1, abs=1e-12)
    assert rep["attention_imbalance"] == pytest.approx(att.max() / att.mean() - 1, abs=1e-12)
    assert rep["rank_tokens_max"] == tok.max() and rep["rank_tokens_mean"] == pytest.approx(tok.mean())
    # sequences, not whole rows, are balanced: dealing ~470 packed rows whole over 64 ranks leaves some
    # ranks a full row short (about 1/7 of the mean); the sequences balance to well under 0.5%
    assert rep["token_imbalance"] < 0.005
    assert "of all rows" in repr(p) and "non-empty rows" in repr(p)


def test_rows_are_csr_arrays_with_a_list_view():
    lengths = sft_lengths(3000, seed=5)
    p = maskpack.plan(lengths, 8192, dp=8)
    rows = p.rows
    assert isinstance(rows, maskpack.Rows)
    off, seq = rows.offsets, rows.sequences
    assert off.dtype == np.int64 and seq.dtype == np.int64
    assert off[0] == 0 and off[-1] == len(seq) == len(lengths) and len(off) == p.n_rows + 1
    assert np.array_equal(np.sort(seq), np.arange(len(lengths)))  # every sequence exactly once
    assert not seq.flags.writeable and not off.flags.writeable
    assert p.row_offsets is off and p.row_sequences is seq
    lists = rows.tolist()
    assert len(lists) == len(rows) == p.n_rows
    assert rows == lists and lists == rows and list(rows) == lists
    assert rows[3] == lists[3] and rows[-1] == lists[-1] and rows[1:3] == lists[1:3]
    assert np.array_equal(rows.array(2), np.array(lists[2]))
    assert p.row_ranks.tolist() == p.rank_of_row and p.row_microbatches.tolist() == p.microbatch_of_row
    assert p.piece_array.shape == (len(lengths), 4) and np.array_equal(p.piece_array[:, 0], seq)
    with pytest.raises(IndexError):
        rows[p.n_rows]


def test_bad_dp_and_microbatches_name_both_numbers():
    with pytest.raises(maskpack.Error) as e:
        maskpack.plan([3, 4], 10, dp=1 << 20, micro_batches=1 << 10)
    assert str(1 << 20) in e.value.message and str(1 << 10) in e.value.message
    assert e.value.argument == "micro_batches"


def ref_nextfit_rows(sizes, capacity):
    """Order-preserving next-fit: a row stays open while the next item fits (an exact fit included);
    -> the number of rows."""
    rows, free = 0, -1
    for x in sizes:
        if free < x:
            rows, free = rows + 1, capacity
        free -= x
    return rows


def greedy_bound(costs, dp):
    """List scheduling's bound for dealing items to dp ranks (largest first, to the lightest): no rank
    ends above mean + the largest item."""
    return costs.sum() / dp + (costs.max() if len(costs) else 0.0)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=st.lists(st.integers(0, 1200), min_size=0, max_size=250), capacity=st.integers(300, 1200),
       dp=st.integers(1, 9), micro_batches=st.integers(1, 3), objective=st.sampled_from(["tokens", "attention"]),
       algorithm=st.sampled_from(["bfd", "ffd", "nextfit"]), seed=st.integers(0, 3))
def test_property_invariants_and_balance(lengths, capacity, dp, micro_batches, objective, algorithm, seed):
    lengths = [x if x <= capacity else x % 301 for x in lengths]  # some near the capacity, most small
    p = maskpack.plan(lengths, capacity, dp=dp, micro_batches=micro_batches, objective=objective,
                      algorithm=algorithm, seed=seed, attention_a=50.0)
    rep = check_plan(p, lengths, capacity, dp=dp, micro_batches=micro_batches)
    assert rep["fill_all_rows"] == pytest.approx(sum(lengths) / (capacity * rep["n_rows"]))
    # as few rows per micro-batch as the packed rows need: fill over all rows no worse than dealing the
    # first-fit-decreasing rows round-robin with empty rows added (NeMo-RL's way)
    ffd_rows = maskpack.plan(lengths, capacity, algorithm="ffd").report()["n_packed_rows"]
    g = dp * micro_batches
    if algorithm != "nextfit":
        assert rep["n_rows"] <= max(1, -(-ffd_rows // g)) * g
    # balance: no rank (and no micro-batch) above the list-scheduling bound, mean + the largest
    # sequence's cost; dealing whole rows (next-fit's way) can miss it by up to a row
    L = np.array(lengths, dtype=np.float64)
    costs = L if objective == "tokens" else 50.0 * L + L * L
    if algorithm != "nextfit":
        assert rep["rank_cost_max"] <= greedy_bound(costs, dp) * (1 + 1e-12) + 1e-9
        assert rep["microbatch_cost_max"] <= greedy_bound(costs, dp * micro_batches) * (1 + 1e-12) + 1e-9
    else:
        # next-fit keeps the input order, so its rows are exactly the reference's (an exact fit does
        # not open a row), and whole rows dealt to ranks miss the mean by at most the costliest row
        assert rep["n_packed_rows"] == ref_nextfit_rows(lengths, capacity)
        assert rep["n_rows"] == max(1, -(-rep["n_packed_rows"] // g)) * g
        row_cost_max = max(p.row_costs) if len(p.row_costs) else 0.0
        assert rep["rank_cost_max"] <= costs.sum() / dp + row_cost_max + 1e-9 * (1 + costs.sum())


def test_nextfit_exact_fit_keeps_the_row_open():
    # 3 + 5 fills a row of 8 exactly; the 8 after it opens the second row, the 2 + 6 the third
    p = maskpack.plan([3, 5, 8, 2, 6], 8, algorithm="nextfit")
    assert p.report()["n_packed_rows"] == 3
    assert [sorted(r) for r in p.rows if r] == [[0, 1], [2], [3, 4]]


# ---- against the binpacking package (ms-swift's packer) -------------------------------------------


@pytest.mark.parametrize("seed,n,capacity", [(0, 2000, 8192), (1, 3000, 4096), (2, 1500, 2048), (3, 2500, 16384)])
def test_bfd_fills_at_least_as_well_as_binpacking(seed, n, capacity):
    lengths = sft_lengths(n, seed, capacity)
    theirs = binpacking.to_constant_volume(lengths.tolist(), capacity)
    # their bins are a valid packing of the same items
    assert sorted(x for b in theirs for x in b) == sorted(lengths.tolist())
    assert all(sum(b) <= capacity for b in theirs)
    ours = maskpack.plan(lengths, capacity)
    rep = check_plan(ours, lengths, capacity)
    their_fill = float(lengths.sum()) / (capacity * len(theirs))
    assert rep["n_packed_rows"] <= len(theirs)
    assert rep["fill"] >= their_fill
    # both are close to the lower bound on this kind of input
    assert rep["n_packed_rows"] >= -(-int(lengths.sum()) // capacity)


def test_bfd_beats_binpacking_where_worst_fit_fails():
    # binpacking.to_constant_volume puts each item into the emptiest bin it fits (worst fit). On
    # {6, 5, 4, 3, 2} x 819 tokens best fit pairs 6+4 and 5+3+2 (two full rows); worst fit puts the 4
    # with the 5 (the emptier row) and strands the 2 in a third row.
    lengths = [6 * 819, 5 * 819, 4 * 819, 3 * 819, 2 * 819]
    theirs = binpacking.to_constant_volume(lengths, 8192)
    assert len(theirs) == 3
    ours = maskpack.plan(lengths, 8192)
    assert sorted(ours.rows) == [[0, 2], [1, 3, 4]]
    # on many small random inputs best fit never needs more rows, and sometimes fewer
    rng = np.random.default_rng(12)
    fewer = 0
    for _ in range(400):
        sizes = rng.integers(1, 100, int(rng.integers(4, 14))).tolist()
        t = len(binpacking.to_constant_volume(sizes, 100))
        o = maskpack.plan(sizes, 100).report()["n_packed_rows"]
        assert o <= t, sizes
        fewer += o < t
    assert fewer > 0


# ---- the CLI -------------------------------------------------------------------------------------------


def cli_path():
    env = os.environ.get("MASKPACK_CLI")
    if env:
        return env
    for cand in [os.path.join(ROOT, "build", "maskpack")] + sorted(glob.glob(os.path.join(ROOT, "build*", "maskpack"))):
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    found = shutil.which("maskpack")
    if found:
        return found
    pytest.fail("the maskpack CLI was not found: build it (make build) or set MASKPACK_CLI")


def run_cli(*args):
    return subprocess.run([cli_path(), "plan", *map(str, args)], capture_output=True, text=True, timeout=120)


def png_size(path):
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR"
    w, h = struct.unpack(">II", data[16:24])
    # the IHDR CRC is valid, and the file ends with IEND
    assert struct.unpack(">I", data[16 + length:20 + length])[0] == zlib.crc32(data[12:16 + length])
    assert data[-8:-4] == b"IEND"
    return w, h


@pytest.fixture
def lengths_files(tmp_path):
    lengths = sft_lengths(700, seed=4, capacity=4096)
    txt = tmp_path / "lengths.txt"
    txt.write_text("# lengths\n" + "\n".join(str(x) for x in lengths) + "\n\n")
    npy = tmp_path / "lengths.npy"
    np.save(npy, lengths.astype(np.int32))
    jsl = tmp_path / "lengths.jsonl"
    rng = np.random.default_rng(0)
    lines = []
    for k, x in enumerate(lengths.tolist()):
        if k % 3 == 0:
            lines.append(json.dumps(x))
        elif k % 3 == 1:
            lines.append(json.dumps(rng.integers(0, 50000, x).tolist()))  # a token list
        else:
            lines.append(json.dumps({"input_ids": [1] * x, "labels": [0]}))
    jsl.write_text("\n".join(lines) + "\n")
    return lengths, txt, npy, jsl


def test_cli_text_npy_jsonl_agree_with_python(lengths_files, tmp_path):
    lengths, txt, npy, jsl = lengths_files
    want = maskpack.plan(lengths, 4096, dp=4, micro_batches=2, cp=2, objective="attention")
    for src in (txt, npy, jsl):
        out = tmp_path / (src.name + ".json")
        r = run_cli(src, "--capacity", 4096, "--dp", 4, "--micro-batches", 2, "--cp", 2, "--objective", "attention",
                    "--json-out", out)
        assert r.returncode == 0, r.stderr
        assert "fill" in r.stdout and "imbalance" in r.stdout
        plan = json.loads(out.read_text())
        assert plan["report"]["n_sequences"] == len(lengths)
        assert [row["sequences"] for row in plan["rows"]] == want.rows
        assert [row["rank"] for row in plan["rows"]] == want.rank_of_row
        assert [row["micro_batch"] for row in plan["rows"]] == want.microbatch_of_row
        assert plan["options"]["multiple"] == 4
        assert plan["report"]["fill"] == pytest.approx(want.report()["fill"])
        # ranks -> micro-batches -> rows covers every row once
        listed = [r for rank in plan["ranks"] for mb in rank["micro_batches"] for r in mb["rows"]]
        assert listed == list(range(want.n_rows))
        assert [rank["cost"] for rank in plan["ranks"]] == pytest.approx(want.rank_costs.tolist())


def test_cli_reads_lengths_from_standard_input(lengths_files, tmp_path):
    lengths, txt, npy, _ = lengths_files
    want = maskpack.plan(lengths, 4096, dp=2)
    for src in (txt, npy):  # text and .npy bytes through a pipe ('-')
        out = tmp_path / (src.name + ".stdin.json")
        r = subprocess.run([cli_path(), "plan", "-", "--capacity", "4096", "--dp", "2", "--json-out", str(out)],
                           input=src.read_bytes(), capture_output=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert [row["sequences"] for row in json.loads(out.read_text())["rows"]] == want.rows


def test_cli_json_report_and_png(lengths_files, tmp_path):
    lengths, txt, _, _ = lengths_files
    png = tmp_path / "rows.png"
    r = run_cli(txt, "--capacity", 4096, "--dp", 3, "--json", "--png", png)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["report"]["n_sequences"] == len(lengths)
    assert len(rep["rank_costs"]) == 3
    w, h = png_size(png)
    assert w > 1000 and h > rep["report"]["n_rows"]  # every row at least a pixel tall


def test_cli_progress_and_errors(tmp_path):
    f = tmp_path / "l.txt"
    f.write_text("4\n9\n11\n2\n")
    r = run_cli(f, "--capacity", 10)
    assert r.returncode == 1
    assert "lengths[2]" in r.stderr and "sequence 2" in r.stderr
    r = run_cli(f, "--capacity", 10, "--allow-split", "--progress")
    assert r.returncode == 0, r.stderr
    assert "100%" in r.stderr and "pack" in r.stderr
    r = run_cli(f, "--capacity", 10, "--algorithm", "worst")
    assert r.returncode == 2
    r = run_cli(f)
    assert r.returncode == 2 and "--capacity" in r.stderr
    bad = tmp_path / "bad.txt"
    bad.write_text("4\nfive\n")
    r = run_cli(bad, "--capacity", 10)
    assert r.returncode == 1 and ":2:" in r.stderr
    r = run_cli(tmp_path / "missing.txt", "--capacity", 10)
    assert r.returncode == 1


def _python_row_layouts(p, rows, packed, rule):
    """The row layouts as the package used to build them in Python (pieces back to back, each
    followed by its slot), for comparison with the library's maskpack_plan_row_layout."""
    arr, begin = p.piece_array, p.row_offsets
    segs = []
    for t, r in enumerate(rows):
        col = 0
        for _seq, _off, length, slot in arr[begin[r]:begin[r + 1]].tolist():
            segs.append((0 if packed else t, col, length))
            col += slot
    width = p.capacity if p.row_width == "capacity" else int(max((p.row_used[r] for r in rows), default=0))
    return maskpack.Layout.from_segments(segs, 1 if packed else len(rows), width, packed=packed, **rule)


@pytest.mark.parametrize("kw", [dict(), dict(row_width="used"), dict(cp=2, dp=2, micro_batches=2),
                                dict(allow_split=True), dict(algorithm="nextfit", dp=3)])
def test_row_layouts_come_from_the_library(kw):
    rng = np.random.default_rng(7)
    lengths = rng.integers(0, 40, 60).tolist()
    p = maskpack.plan(lengths, 48, **kw)
    for rule in (dict(), dict(causal=False), dict(window=(3, 0))):
        for r in range(p.n_rows):
            lay = p.layout(r, **rule)
            assert lay == _python_row_layouts(p, [r], True, rule)
            assert lay.packed and lay.n_rows == 1
        for rank in range(p.dp):
            for mb in range(p.micro_batches):
                assert p.microbatch_layout(rank, mb, **rule) == _python_row_layouts(p, p.rows_of(rank, mb), False, rule)
    with pytest.raises(maskpack.Error) as e:
        p.layout(p.n_rows)
    assert e.value.argument == "row"
    with pytest.raises(TypeError):
        p.layout(0, alignment_x="top_left")
