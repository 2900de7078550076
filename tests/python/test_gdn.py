"""Gated DeltaNet over layouts (maskpack.gdn) against transformers' Qwen3-Next code, a float64
autograd reference written here, and (when it imports) flash-linear-attention's naive reference.

Checks: the rule against torch_chunk_gated_delta_rule / torch_recurrent_gated_delta_rule (whole
batches and per segment), gradients of every input against torch autograd of the float64
recurrence, padded vs packed bitwise equality of outputs, states and gradients with NaN planted in
the padding, the conv1d against F.conv1d per segment (with prefix and state) and its gradients,
the whole layer against Qwen3NextGatedDeltaNet (outputs and parameter gradients), continuation of
the layer with state and conv prefix, bf16, forcing the reference kernel, and bad input errors.
The tests marked with the ``isa`` fixture run once per kernel this CPU has (ref, avx2, avx512;
MASKPACK_ISA forces each), the others under the default choice.
"""

import copy
import importlib.util
import io
import math
import os

import pytest
import torch
import torch.nn.functional as F

import maskpack
from transformers import Qwen3NextConfig
from transformers.models.qwen3_next import modeling_qwen3_next as hf

torch.manual_seed(0)

ISAS = ["ref", "avx2", "avx512"]


def _unavailable_gdn_kernels():
    import os

    old, missing = os.environ.get("MASKPACK_ISA"), []
    try:
        for name in ISAS:
            os.environ["MASKPACK_ISA"] = name
            try:
                maskpack.gdn_isa()
            except maskpack.Error:
                missing.append("gdn " + name)
    finally:
        if old is None:
            os.environ.pop("MASKPACK_ISA", None)
        else:
            os.environ["MASKPACK_ISA"] = old
    return missing


# kernels this CPU cannot run: their parametrizations skip, and conftest.py names them in the summary
NOT_RUN_ON_THIS_CPU = _unavailable_gdn_kernels()


@pytest.fixture(params=ISAS)
def isa(request, monkeypatch):
    """Runs the test with MASKPACK_ISA forcing one kernel; skips a kernel this CPU lacks (after
    checking that forcing it is refused with UNSUPPORTED rather than silently replaced)."""
    monkeypatch.setenv("MASKPACK_ISA", request.param)
    try:
        got = maskpack.gdn_isa()
    except maskpack.Error as e:
        assert e.status == "MASKPACK_ERR_UNSUPPORTED"
        pytest.skip(f"gdn kernel {request.param} NOT RUN: this CPU lacks its ISA")
    assert got == request.param
    return request.param


def relerr(a, b):
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def make_inputs(lead, H, HV, K, V, dtype=torch.float32, gen=None):
    gen = gen or torch.Generator().manual_seed(1)
    q = torch.randn(*lead, H, K, generator=gen)
    k = torch.randn(*lead, H, K, generator=gen)
    v = torch.randn(*lead, HV, V, generator=gen)
    g = -F.softplus(torch.randn(*lead, HV, generator=gen)) * 0.5
    beta = torch.sigmoid(torch.randn(*lead, HV, generator=gen))
    return [x.to(dtype) for x in (q, k, v, g, beta)]


# ---- a float64 reference written here: the recurrence of docs/conventions.md section 9 ---------------


def ref_rule(q, k, v, g, beta, h0=None, scale=None, l2=True):
    """One segment: q, k [L, H, K], v [L, HV, V], g, beta [L, HV], h0 [HV, K, V] -> o [L, HV, V], S."""
    L, H, K = q.shape
    HV, V = v.shape[-2:]
    G = HV // H
    scale = 1.0 / math.sqrt(K) if scale is None else scale
    if l2:
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    q, k = q.repeat_interleave(G, dim=1), k.repeat_interleave(G, dim=1)
    S = h0.clone() if h0 is not None else torch.zeros(HV, K, V, dtype=v.dtype)
    outs = []
    for t in range(L):
        S = S * torch.exp(g[t])[:, None, None]
        delta = beta[t][:, None] * (v[t] - torch.einsum("hkv,hk->hv", S, k[t]))
        S = S + k[t][:, :, None] * delta[:, None, :]
        outs.append(scale * torch.einsum("hkv,hk->hv", S, q[t]))
    o = torch.stack(outs) if outs else torch.zeros(0, HV, V, dtype=v.dtype)
    return o, S


def packed_to_padded(x, lengths, width, fill=float("nan"), left=False):
    """[T, ...] packed rows -> [B, width, ...] (one sequence per row), pads = fill."""
    out = torch.full((len(lengths), width) + tuple(x.shape[1:]), fill, dtype=x.dtype)
    at = 0
    for i, n in enumerate(lengths):
        if n:
            if left:
                out[i, width - n:] = x[at:at + n]
            else:
                out[i, :n] = x[at:at + n]
        at += n
    return out


def padded_rows(x, lengths, left=False):
    """[B, width, ...] -> [T, ...] of the real tokens, in order."""
    width = x.shape[1]
    parts = [x[i, width - n:] if left else x[i, :n] for i, n in enumerate(lengths)]
    return torch.cat(parts) if parts else x[:0, 0]


# ---- the rule against transformers' torch fallbacks ---------------------------------------------


@pytest.mark.parametrize("chunked", [True, False])
def test_rule_matches_transformers_fallbacks(chunked, isa):
    B, S, H, HV, K, V = 2, 150, 2, 4, 32, 16
    lay = maskpack.Layout.from_lengths([S, S], placement="right")
    q, k, v, g, beta = make_inputs((B, S), H, HV, K, V)
    h0 = torch.randn(B, HV, K, V) * 0.3
    o, st = maskpack.gated_delta_rule(q, k, v, g, beta, lay, initial_state=h0, chunked=chunked)
    for fn in (hf.torch_chunk_gated_delta_rule, hf.torch_recurrent_gated_delta_rule):
        ro, rs = fn(q, k, v, g=g, beta=beta, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True)
        assert relerr(o, ro) < 2e-5, fn.__name__
        assert relerr(st, rs) < 2e-5, fn.__name__


def test_rule_per_segment_matches_transformers(isa):
    """A packed batch with chunk-boundary lengths: each segment equals the fallback on it alone."""
    lengths = [40, 64, 129, 0, 1, 65]
    H, HV, K, V = 2, 4, 16, 24
    lay = maskpack.Layout.from_lengths(lengths, placement="packed")
    q, k, v, g, beta = make_inputs((sum(lengths),), H, HV, K, V)
    h0 = torch.randn(len(lengths), HV, K, V) * 0.2
    o, st = maskpack.gated_delta_rule(q, k, v, g, beta, lay, initial_state=h0)
    at = 0
    for i, n in enumerate(lengths):
        sl = slice(at, at + n)
        if n == 0:
            assert torch.equal(st[i], h0[i])  # zero-length segment: final state = initial state
            continue
        ro, rs = hf.torch_chunk_gated_delta_rule(q[sl][None], k[sl][None], v[sl][None], g=g[sl][None],
                                                 beta=beta[sl][None], initial_state=h0[i:i + 1],
                                                 output_final_state=True, use_qk_l2norm_in_kernel=True)
        assert relerr(o[sl], ro[0]) < 2e-5
        assert relerr(st[i], rs[0]) < 2e-5
        at += n


def _fla_naive():
    spec = importlib.util.find_spec("fla")
    if spec is None or not spec.submodule_search_locations:
        return None, "flash-linear-attention is not installed (pip install flash-linear-attention)"
    path = os.path.join(list(spec.submodule_search_locations)[0], "ops", "gated_delta_rule", "naive.py")
    if not os.path.exists(path):
        return None, f"flash-linear-attention has no naive reference at {path}"
    try:
        # the package itself imports triton (absent on CPU machines); the naive module needs only torch + einops
        mspec = importlib.util.spec_from_file_location("_fla_gdn_naive", path)
        mod = importlib.util.module_from_spec(mspec)
        mspec.loader.exec_module(mod)
    except Exception as e:  # noqa: BLE001 - any import failure means the comparison cannot run
        return None, f"flash-linear-attention's naive reference does not import here: {e!r}"
    return mod, None


def test_rule_matches_flash_linear_attention_naive():
    mod, why = _fla_naive()
    if mod is None:
        print(f"skipping the flash-linear-attention comparison: {why}")
        pytest.skip(why)
    B, S, H, HV, K, V = 2, 100, 2, 4, 32, 16
    lay = maskpack.Layout.from_lengths([S, S], placement="right")
    q, k, v, g, beta = make_inputs((B, S), H, HV, K, V)
    h0 = torch.randn(B, HV, K, V) * 0.3
    o, st = maskpack.gated_delta_rule(q, k, v, g, beta, lay, initial_state=h0)
    # fla's naive functions take equal head counts and no in-kernel L2 norm: expand and normalise here
    qn = hf.l2norm(q).repeat_interleave(HV // H, dim=2)
    kn = hf.l2norm(k).repeat_interleave(HV // H, dim=2)
    ro, rs = mod.naive_recurrent_gated_delta_rule(qn, kn, v, beta, g, initial_state=h0, output_final_state=True)
    assert relerr(o, ro) < 2e-5 and relerr(st, rs) < 2e-5
    ro, rs = mod.naive_chunk_gated_delta_rule(qn, kn, v, g, beta, initial_state=h0, output_final_state=True)
    assert relerr(o, ro) < 2e-5 and relerr(st, rs) < 2e-5


# ---- gradients against float64 autograd ------------------------------------------------------------


@pytest.mark.parametrize("l2norm", [True, False])
def test_rule_gradients_match_float64_autograd(l2norm, isa):
    lengths = [70, 1, 0, 130]
    H, HV, K, V = 2, 4, 16, 16
    lay = maskpack.Layout.from_lengths(lengths, placement="packed")
    T = sum(lengths)
    q, k, v, g, beta = make_inputs((T,), H, HV, K, V, gen=torch.Generator().manual_seed(5))
    if not l2norm:  # keep the unnormalised recurrence contractive
        q, k, beta = q * 0.25, k * 0.25, beta * 0.5
    h0 = torch.randn(len(lengths), HV, K, V) * 0.3
    R = torch.randn(T, HV, V)
    Rs = torch.randn(len(lengths), HV, K, V)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v, g, beta, h0)]
    o, st = maskpack.gated_delta_rule(*leaves[:5], lay, initial_state=leaves[5], l2norm=l2norm)
    ((o * R).sum() + (st * Rs).sum()).backward()
    ours = [x.grad for x in leaves]
    # float64 reference, segment by segment
    ref_leaves = [x.double().clone().requires_grad_(True) for x in (q, k, v, g, beta, h0)]
    loss, at = 0.0, 0
    for i, n in enumerate(lengths):
        sl = slice(at, at + n)
        ro, rs = ref_rule(*(x[sl] for x in ref_leaves[:5]), h0=ref_leaves[5][i], l2=l2norm)
        loss = loss + (ro * R[sl].double()).sum() + (rs * Rs[i].double()).sum()
        at += n
    loss.backward()
    names = ["q", "k", "v", "g", "beta", "initial_state"]
    for name, a, b in zip(names, ours, (x.grad for x in ref_leaves)):
        assert relerr(a, b) < 1e-4, name
    # the forward agrees with the float64 reference as well
    with torch.no_grad():
        at = 0
        for i, n in enumerate(lengths):
            sl = slice(at, at + n)
            ro, rs = ref_rule(*(x[sl].double() for x in (q, k, v, g, beta)), h0=h0[i].double(), l2=l2norm)
            if n:
                assert relerr(o[sl].detach(), ro) < 1e-5
            assert relerr(st[i].detach(), rs) < 1e-5
            at += n


def test_long_segment_gradients_match_float64_autograd(isa):
    """A segment of 18 chunks: more than the backward keeps states for (it recomputes them from
    binomial checkpoints), with slow decay so every earlier chunk reaches the last ones."""
    lengths = [17 * 64 + 3, 5]
    H, HV, K, V = 1, 2, 16, 16
    lay = maskpack.Layout.from_lengths(lengths, placement="packed")
    T = sum(lengths)
    q, k, v, g, beta = make_inputs((T,), H, HV, K, V, gen=torch.Generator().manual_seed(11))
    g = g * 0.05
    h0 = torch.randn(len(lengths), HV, K, V) * 0.3
    R = torch.randn(T, HV, V)
    Rs = torch.randn(len(lengths), HV, K, V)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v, g, beta, h0)]
    o, st = maskpack.gated_delta_rule(*leaves[:5], lay, initial_state=leaves[5], threads=2)
    ((o * R).sum() + (st * Rs).sum()).backward()
    ref_leaves = [x.double().clone().requires_grad_(True) for x in (q, k, v, g, beta, h0)]
    loss, at = 0.0, 0
    for i, n in enumerate(lengths):
        sl = slice(at, at + n)
        ro, rs = ref_rule(*(x[sl] for x in ref_leaves[:5]), h0=ref_leaves[5][i])
        loss = loss + (ro * R[sl].double()).sum() + (rs * Rs[i].double()).sum()
        at += n
    loss.backward()
    for name, a, b in zip(["q", "k", "v", "g", "beta", "initial_state"], (x.grad for x in leaves),
                          (x.grad for x in ref_leaves)):
        assert relerr(a, b) < 1e-4, name


def test_backward_workspace_does_not_grow_with_segment_length():
    """The backward's workspace is a constant number of states per thread: one segment of 512,
    32768 or 131072 tokens asks for the same bytes (only sizes are queried: the inputs are
    zero-stride views of one token, no data is read)."""
    from maskpack import gdn as gdn_mod
    from maskpack._maskpack import gdn as _gdn

    H, HV, K, V = 16, 32, 128, 128
    sizes = []
    for T in (512, 32768, 131072):
        lay = maskpack.Layout.from_lengths([T], placement="packed")
        q = torch.zeros(1, H, K).expand(T, H, K)
        v = torch.zeros(1, HV, V).expand(T, HV, V)
        g = torch.zeros(1, HV).expand(T, HV)
        descs = tuple(gdn_mod._d(x, n) for x, n in ((q, "q"), (q, "k"), (v, "v"), (g, "g"), (g, "beta"))) + (None,)
        sizes.append([_gdn.workspace_size(lay._h, descs, True, True, t) for t in (1, 2)])
    assert sizes[0] == sizes[1] == sizes[2], sizes
    # a few states of K x V floats per value head of a key head, not O(T): well under 8 MiB a thread
    assert sizes[0][0] < 8 << 20
    assert sizes[0][1] > sizes[0][0]


# ---- padded vs packed: bitwise, NaN in the padding changes nothing --------------------------------


@pytest.mark.parametrize("left", [False, True])
def test_padded_and_packed_are_bitwise_equal(left, isa):
    lengths = [65, 3, 0, 128, 20]
    H, HV, K, V = 2, 4, 16, 16
    width = 130
    packed = maskpack.Layout.from_lengths(lengths, placement="packed")
    padded = maskpack.Layout.from_lengths(lengths, placement="left" if left else "right", capacity=width)
    T = sum(lengths)
    xs = make_inputs((T,), H, HV, K, V, gen=torch.Generator().manual_seed(9))
    h0 = torch.randn(len(lengths), HV, K, V) * 0.3
    R = torch.randn(T, HV, V)
    results = []
    for lay, conv in ((packed, lambda x: x), (padded, lambda x: packed_to_padded(x, lengths, width, left=left))):
        leaves = [conv(x).clone().requires_grad_(True) for x in xs]
        h = h0.clone().requires_grad_(True)
        o, st = maskpack.gated_delta_rule(*leaves, lay, initial_state=h)
        Rl = conv(R).nan_to_num(0.0)
        ((o * Rl).sum() + st.sum()).backward()
        results.append((o.detach(), st.detach(), [x.grad for x in leaves], h.grad))
    (o1, s1, g1, h1), (o2, s2, g2, h2) = results
    mask = torch.as_tensor(padded.mask2d("bool"))
    assert torch.equal(o2[~mask], torch.zeros_like(o2[~mask]))  # pad rows exactly 0 despite NaN inputs
    assert torch.equal(padded_rows(o2, lengths, left), o1)
    assert torch.equal(s1, s2) and torch.equal(h1, h2)
    for a, b in zip(g1, g2):
        assert torch.equal(b[~mask], torch.zeros_like(b[~mask]))
        assert torch.equal(padded_rows(b, lengths, left), a)


def test_chunked_and_recurrent_agree_and_reference_kernel():
    lengths = [1, 63, 64, 65, 127, 128, 129]
    lay = maskpack.Layout.from_lengths(lengths, placement="packed")
    xs = make_inputs((sum(lengths),), 2, 4, 32, 32)
    oc, sc = maskpack.gated_delta_rule(*xs, lay, chunked=True)
    orr, sr = maskpack.gated_delta_rule(*xs, lay, chunked=False)
    assert relerr(oc, orr) < 1e-5 and relerr(sc, sr) < 1e-5
    old = os.environ.get("MASKPACK_ISA")
    try:
        os.environ["MASKPACK_ISA"] = "ref"
        assert maskpack.gdn_isa() == "ref"
        o_ref, s_ref = maskpack.gated_delta_rule(*xs, lay)
        os.environ["MASKPACK_ISA"] = "bogus"
        with pytest.raises(maskpack.Error) as e:
            maskpack.gated_delta_rule(*xs, lay)
        assert e.value.argument == "MASKPACK_ISA"
    finally:
        if old is None:
            os.environ.pop("MASKPACK_ISA", None)
        else:
            os.environ["MASKPACK_ISA"] = old
    assert relerr(o_ref, oc) < 1e-5 and relerr(s_ref, sc) < 1e-5


def test_isa_amx_means_avx512():
    """MASKPACK_ISA=amx (which the attention reads too) runs float32 inputs of the rule on the AVX-512
    kernel on a CPU with AMX (the amx entry, whose own kernel is for bfloat16: gdn_isa names the entry,
    the bits are the AVX-512 kernel's); a CPU without AMX refuses it, naming it, as every kernel family
    does."""
    lengths = [5, 64, 70]
    lay = maskpack.Layout.from_lengths(lengths, placement="packed")
    xs = make_inputs((sum(lengths),), 2, 4, 32, 32)
    old = os.environ.get("MASKPACK_ISA")
    try:
        os.environ["MASKPACK_ISA"] = "avx512"
        try:
            o_avx, s_avx = maskpack.gated_delta_rule(*xs, lay)
        except maskpack.Error as e:
            assert e.status == "MASKPACK_ERR_UNSUPPORTED"
            o_avx = None
        os.environ["MASKPACK_ISA"] = "amx"
        try:
            have_amx = maskpack.attention_isa("bfloat16") == "amx"
        except maskpack.Error as e:
            assert e.status == "MASKPACK_ERR_UNSUPPORTED"
            have_amx = False
        if o_avx is None or not have_amx:
            with pytest.raises(maskpack.Error) as e:
                maskpack.gated_delta_rule(*xs, lay)
            assert e.value.status == "MASKPACK_ERR_UNSUPPORTED"
            assert "amx" in str(e.value)
        else:
            assert maskpack.gdn_isa() == "amx"
            o_amx, s_amx = maskpack.gated_delta_rule(*xs, lay)
            assert torch.equal(o_amx, o_avx) and torch.equal(s_amx, s_avx)
        os.environ["MASKPACK_ISA"] = "ref"
        o_ref, s_ref = maskpack.gated_delta_rule(*xs, lay)
    finally:
        if old is None:
            os.environ.pop("MASKPACK_ISA", None)
        else:
            os.environ["MASKPACK_ISA"] = old
    if o_avx is not None:
        assert relerr(o_avx, o_ref) < 1e-5 and relerr(s_avx, s_ref) < 1e-5
    if o_avx is not None and have_amx:
        assert relerr(o_amx, o_ref) < 1e-5 and relerr(s_amx, s_ref) < 1e-5


def _with_isa(name, fn):
    old = os.environ.get("MASKPACK_ISA")
    try:
        os.environ["MASKPACK_ISA"] = name
        return fn()
    finally:
        if old is None:
            os.environ.pop("MASKPACK_ISA", None)
        else:
            os.environ["MASKPACK_ISA"] = old


def test_isa_per_dtype():
    """gdn_isa(dtype) names the kernel inputs of that dtype run: under AUTO bfloat16 runs the AMX kernel
    where the CPU has AMX, else the float32 kernel (converted once as rows load), never avx512_bf16;
    float32 never a bf16 kernel; amx by name is that kernel, or is refused, naming AMX, where the CPU
    lacks it; asked for by name, avx512_bf16 runs bfloat16 on its dot products (its float32 calls run
    the AVX-512 kernel), or is refused, naming the feature, where the CPU lacks AVX512-BF16."""
    best = _with_isa("auto", maskpack.gdn_isa)
    assert best in ("avx512", "avx2", "ref")
    try:
        amx16 = _with_isa("amx", lambda: maskpack.gdn_isa("bfloat16"))
        assert amx16 == "amx"
    except maskpack.Error as e:
        assert e.status == "MASKPACK_ERR_UNSUPPORTED" and "AMX" in str(e)
        amx16 = None
    auto16 = "amx" if amx16 else best
    assert _with_isa("auto", lambda: maskpack.gdn_isa("bfloat16")) == auto16
    assert _with_isa("auto", lambda: maskpack.gdn_isa(torch.bfloat16)) == auto16
    assert _with_isa("auto", lambda: maskpack.gdn_isa(torch.float32)) == best
    try:
        got16 = _with_isa("avx512_bf16", lambda: maskpack.gdn_isa("bfloat16"))
    except maskpack.Error as e:
        assert e.status == "MASKPACK_ERR_UNSUPPORTED" and "AVX512-BF16" in str(e)
        return
    assert got16 == "avx512_bf16"
    # the entry asked for by name answers for float32 too (its float32 calls run the AVX-512 kernels)
    assert _with_isa("avx512_bf16", lambda: maskpack.gdn_isa("float32")) == "avx512_bf16"


def test_isa_avx2_forced_or_unsupported_and_auto_order():
    """MASKPACK_ISA=avx2 runs the AVX2 kernel (or raises UNSUPPORTED on a CPU without AVX2 + FMA,
    never falling back); AUTO picks avx512 > avx2 > ref."""
    have = {}
    for name in ISAS:
        try:
            have[name] = _with_isa(name, maskpack.gdn_isa) == name
        except maskpack.Error as e:
            assert e.status == "MASKPACK_ERR_UNSUPPORTED"
            have[name] = False
    assert have["ref"]
    best = "avx512" if have["avx512"] else "avx2" if have["avx2"] else "ref"
    assert _with_isa("auto", maskpack.gdn_isa) == best
    assert _with_isa("", maskpack.gdn_isa) == best
    lay = maskpack.Layout.from_lengths([5, 64, 70], placement="packed")
    xs = make_inputs((139,), 2, 4, 32, 32)
    if not have["avx2"]:
        with pytest.raises(maskpack.Error) as e:
            _with_isa("avx2", lambda: maskpack.gated_delta_rule(*xs, lay))
        assert e.value.status == "MASKPACK_ERR_UNSUPPORTED"


@pytest.mark.parametrize("chunked", [True, False])
def test_vector_kernels_match_reference_kernel(chunked):
    """Each vector kernel this CPU has against the portable one: outputs, final states and every
    gradient (the tolerances of the C tests)."""
    lengths = [1, 63, 64, 65, 127, 129, 0, 200]
    H, HV, K, V = 2, 4, 40, 24  # K, V not multiples of 16: the pad columns are exercised
    lay = maskpack.Layout.from_lengths(lengths, placement="packed")
    T = sum(lengths)
    xs = make_inputs((T,), H, HV, K, V, gen=torch.Generator().manual_seed(21))
    h0 = torch.randn(len(lengths), HV, K, V) * 0.3
    R, Rs = torch.randn(T, HV, V), torch.randn(len(lengths), HV, K, V)

    def run():
        leaves = [x.clone().requires_grad_(True) for x in (*xs, h0)]
        o, st = maskpack.gated_delta_rule(*leaves[:5], lay, initial_state=leaves[5], chunked=chunked, threads=2)
        if chunked:  # the backward is the chunked one whatever the forward form
            ((o * R).sum() + (st * Rs).sum()).backward()
        return o.detach(), st.detach(), [x.grad for x in leaves]

    o0, s0, g0 = _with_isa("ref", run)
    tested = 0
    for name in ("avx2", "avx512"):
        try:
            o1, s1, g1 = _with_isa(name, run)
        except maskpack.Error as e:
            assert e.status == "MASKPACK_ERR_UNSUPPORTED"
            continue
        tested += 1
        assert relerr(o1, o0) < 1e-5 and relerr(s1, s0) < 1e-5, name
        if chunked:
            for a, b in zip(g1, g0):
                assert relerr(a, b) < 1e-4, name
    if tested == 0:
        pytest.skip("no vector kernel on this CPU")


@pytest.mark.parametrize("dims", [(2, 4, 40, 24), (1, 2, 64, 80)])
def test_no_initial_state_equals_zero_initial_state(dims, isa):
    """Without an initial state the kernels skip the first chunk's state products (S = 0 there);
    the outputs, final states and gradients must equal those of an explicit all-zero initial state
    exactly (the skipped products are exact zeros), for first chunks that are whole, partial and
    single tokens, in the forward, in the backward's state replay and in the recurrent form. The
    second shape has K, V >= the chunk, where the chunked forward lets its decay matrices share
    buffers with later ones."""
    lengths = [1, 5, 63, 64, 65, 129, 0, 200]
    H, HV, K, V = dims
    lay = maskpack.Layout.from_lengths(lengths, placement="packed")
    T = sum(lengths)
    xs = make_inputs((T,), H, HV, K, V, gen=torch.Generator().manual_seed(5))
    R, Rs = torch.randn(T, HV, V), torch.randn(len(lengths), HV, K, V)
    zero = torch.zeros(len(lengths), HV, K, V)
    for chunked in (True, False):
        runs = []
        for h0 in (None, zero):
            leaves = [x.clone().requires_grad_(True) for x in xs]
            o, st = maskpack.gated_delta_rule(*leaves, lay, initial_state=h0, chunked=chunked, threads=2)
            ((o * R).sum() + (st * Rs).sum()).backward()
            runs.append((o.detach(), st.detach(), [x.grad for x in leaves]))
        (o0, s0, g0), (o1, s1, g1) = runs
        assert torch.equal(o0, o1) and torch.equal(s0, s1), chunked
        for name, a, b in zip("q k v g beta".split(), g0, g1):
            assert torch.equal(a, b), (chunked, name)
        # and both are right: against the float64 recurrence, segment by segment
        at = 0
        for i, n in enumerate(lengths):
            sl = slice(at, at + n)
            ro, rs = ref_rule(*(x[sl].double() for x in xs))
            if n:
                assert relerr(o0[sl], ro) < 1e-5, (chunked, n)
                assert relerr(s0[i], rs) < 1e-5, (chunked, n)
            else:
                assert torch.count_nonzero(s0[i]) == 0
            at += n


def test_bf16_inputs():
    """bf16 inputs on the float32 kernel (AUTO's for them without AMX; named here, since an AMX CPU runs
    them on the tiles: test_gdn_bf16 and test_isa_per_dtype) are exactly their float32 values."""
    isa32 = maskpack.gdn_isa("float32")
    lay = maskpack.Layout.from_lengths([70, 9], placement="right")
    xs = make_inputs((2, 70), 1, 2, 16, 16, dtype=torch.bfloat16)
    o, st = maskpack.gated_delta_rule(*xs, lay, isa=isa32)
    assert o.dtype == torch.bfloat16 and st.dtype == torch.float32
    o32, st32 = maskpack.gated_delta_rule(*(x.float() for x in xs), lay)
    assert torch.equal(o, o32.to(torch.bfloat16))  # bf16 inputs are exactly their f32 values
    assert torch.equal(st, st32)
    # gradients by value: bf16 inputs are widened, so each bf16 gradient is the f32 gradient of the
    # same values rounded to nearest once, bit for bit (a truncating store or a 5% error fails)
    leaves = [x.clone().requires_grad_(True) for x in xs]
    o, _ = maskpack.gated_delta_rule(*leaves, lay, isa=isa32)
    gout = torch.randn(o.shape, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    o.backward(gout)
    leaves32 = [x.float().requires_grad_(True) for x in xs]
    o32, _ = maskpack.gated_delta_rule(*leaves32, lay)
    o32.backward(gout.float())
    for x, x32 in zip(leaves, leaves32):
        assert x.grad.dtype == torch.bfloat16
        assert torch.count_nonzero(x32.grad) > 0
        assert torch.equal(x.grad, x32.grad.to(torch.bfloat16))


# ---- conv1d ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("W", [1, 2, 4])
def test_conv1d_matches_torch_per_segment(W, isa):
    lengths = [0, 1, 2, 3, 40]
    C = 12
    lay = maskpack.Layout.from_lengths(lengths, placement="right", capacity=41)
    x = packed_to_padded(torch.randn(sum(lengths), C), lengths, 41)
    w = torch.randn(C, 1, W, requires_grad=True)
    prefix = torch.randn(len(lengths), C, W - 1, requires_grad=True)
    xl = x.clone().requires_grad_(True)
    y, st = maskpack.causal_conv1d(xl, w, lay, "silu", prefix=prefix)
    R = torch.randn_like(y).nan_to_num(0.0) * torch.as_tensor(lay.mask2d("bool"))[..., None]
    Rs = torch.randn_like(st)
    ((y * R).sum() + (st * Rs).sum()).backward()
    # reference: F.conv1d on prefix ++ segment, float64, autograd
    wd = w.detach().double().requires_grad_(True)
    pd = prefix.detach().double().requires_grad_(True)
    xd = x.double().nan_to_num(0.0).requires_grad_(True)
    loss = 0.0
    for i, n in enumerate(lengths):
        seq = torch.cat([pd[i], xd[i, :n].T], dim=1)[None]  # [1, C, W-1+n]
        ref = F.silu(F.conv1d(seq, wd, groups=C))[0].T if n else seq[0, :, :0].T  # [n, C]
        if n:
            assert relerr(y[i, :n].detach(), ref.detach()) < 1e-5
        ref_state = seq[0, :, seq.shape[-1] - (W - 1):]
        assert relerr(st[i].detach(), ref_state.detach()) < 1e-6 if W > 1 else st[i].numel() == 0
        loss = loss + (ref * R[i, :n].double()).sum() + (ref_state * Rs[i].double()).sum()
    loss.backward()
    assert relerr(xl.grad.nan_to_num(0.0), xd.grad) < 1e-5
    assert relerr(w.grad, wd.grad) < 1e-5
    if W > 1:
        assert relerr(prefix.grad, pd.grad) < 1e-5
    mask = torch.as_tensor(lay.mask2d("bool"))
    assert torch.equal(y[~mask], torch.zeros_like(y[~mask])) and torch.equal(xl.grad[~mask], torch.zeros_like(y[~mask]))


# ---- the layer against transformers' Qwen3NextGatedDeltaNet and Qwen3_5GatedDeltaNet ------------------

# the same tiny shapes in each family's config class
_TINY = dict(hidden_size=48, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
             linear_value_head_dim=8, linear_conv_kernel_dim=4, num_hidden_layers=4, num_attention_heads=2,
             num_key_value_heads=1, head_dim=16, intermediate_size=32, vocab_size=32, rms_norm_eps=1e-6)
LAYER_KINDS = ["qwen3_next", "qwen3_5", "qwen3_5_moe"]


def tiny_config(kind="qwen3_next"):
    if kind == "qwen3_next":
        return Qwen3NextConfig(**_TINY)
    if kind == "qwen3_5":
        from transformers import Qwen3_5TextConfig
        return Qwen3_5TextConfig(**_TINY)
    from transformers import Qwen3_5MoeTextConfig
    return Qwen3_5MoeTextConfig(**_TINY)


def hf_layer_class(kind):
    if kind == "qwen3_next":
        return hf.Qwen3NextGatedDeltaNet
    if kind == "qwen3_5":
        from transformers.models.qwen3_5 import modeling_qwen3_5
        return modeling_qwen3_5.Qwen3_5GatedDeltaNet
    from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe
    return modeling_qwen3_5_moe.Qwen3_5MoeGatedDeltaNet


def tiny_layers(kind="qwen3_next"):
    cfg = tiny_config(kind)
    assert cfg.layer_types[0] == "linear_attention"
    theirs = hf_layer_class(kind)(cfg, layer_idx=0)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in theirs.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
        theirs.A_log.copy_(torch.log(torch.rand(4, generator=gen) * 4 + 0.5))
        theirs.norm.weight.add_(1.0)
    ours = maskpack.GatedDeltaNet.from_config(cfg)
    assert ours.projections == ("qwen3_next" if kind == "qwen3_next" else "qwen3_5")
    ours.load_state_dict(theirs.state_dict())  # strict: the same names and shapes, nothing left over
    return cfg, theirs, ours


@pytest.mark.parametrize("kind", LAYER_KINDS)
def test_layer_matches_transformers_and_packed_matches_padded(isa, kind):
    cfg, theirs, ours = tiny_layers(kind)
    lengths = [70, 9, 130]
    width = 130
    T = sum(lengths)
    hidden = torch.randn(T, cfg.hidden_size)
    padded = maskpack.Layout.from_lengths(lengths, placement="right", capacity=width)
    packed = maskpack.Layout.from_lengths(lengths, placement="packed")
    mask = torch.as_tensor(padded.mask2d("bool"))
    hp = packed_to_padded(hidden, lengths, width, fill=0.0)
    R = torch.randn(T, cfg.hidden_size)
    # transformers: padded batch with its 2D mask (right padding: real tokens are exact there)
    hp_t = hp.clone().requires_grad_(True)
    ref = theirs(hp_t, attention_mask=mask.long())
    (padded_rows(ref, lengths) * R).sum().backward()
    ref_grads = {n: p.grad.clone() for n, p in theirs.named_parameters()}
    # ours, padded (NaN in the padding) and packed
    hp_nan = packed_to_padded(hidden, lengths, width).requires_grad_(True)
    out_pad = ours(hp_nan, padded)
    assert torch.equal(out_pad[~mask], torch.zeros_like(out_pad[~mask]))
    assert relerr(padded_rows(out_pad, lengths).detach(), padded_rows(ref, lengths).detach()) < 1e-4
    (padded_rows(out_pad, lengths) * R).sum().backward()
    for n, p in ours.named_parameters():
        assert relerr(p.grad, ref_grads[n]) < 1e-3, n
        p.grad = None
    assert relerr(padded_rows(hp_nan.grad, lengths), padded_rows(hp_t.grad, lengths)) < 1e-3
    out_packed = ours(hidden, packed)
    assert relerr(out_packed.detach(), padded_rows(out_pad, lengths).detach()) < 1e-6
    # the maskpack ops themselves are bitwise equal across layouts; the torch projections may
    # block their GEMMs differently by batch shape, hence a tolerance at the layer level


@pytest.mark.parametrize("kind", ["qwen3_next", "qwen3_5"])
def test_layer_continuation_with_state_and_conv_prefix(isa, kind):
    """A sequence run in two pieces (final state and conv state passed on) equals the whole run:
    the basis of context parallelism and of cached decoding."""
    cfg, _, ours = tiny_layers(kind)
    n, cut = 150, 64
    hidden = torch.randn(n, cfg.hidden_size)
    whole = maskpack.Layout.from_lengths([n], placement="packed")
    first = maskpack.Layout.from_lengths([cut], placement="packed")
    second = maskpack.Layout.from_lengths([n - cut], placement="packed")
    with torch.no_grad():
        out_w, st_w, cs_w = ours(hidden, whole, return_states=True)
        out_1, st_1, cs_1 = ours(hidden[:cut], first, return_states=True)
        out_2, st_2, cs_2 = ours(hidden[cut:], second, initial_state=st_1, conv_prefix=cs_1, return_states=True)
    assert relerr(torch.cat([out_1, out_2]), out_w) < 1e-5
    assert relerr(st_2, st_w) < 1e-5
    assert torch.equal(cs_2, cs_w)  # the conv state is a copy of inputs


def test_layer_from_config_picks_the_projection_layout_and_refuses_what_it_cannot_run():
    from transformers import Qwen3_5Config
    # the vision-language config holds the layer's fields in text_config
    vl = Qwen3_5Config(text_config=dict(_TINY))
    layer = maskpack.GatedDeltaNet.from_config(vl)
    assert layer.projections == "qwen3_5" and layer.num_v_heads == 4 and layer.head_k_dim == 16
    names = {n for n, _ in layer.named_parameters()}
    assert {"in_proj_qkv.weight", "in_proj_z.weight", "in_proj_b.weight", "in_proj_a.weight"} <= names
    assert not any(n.startswith(("in_proj_qkvz", "in_proj_ba")) for n in names)
    # an explicit layout wins over the config's model_type
    assert maskpack.GatedDeltaNet.from_config(tiny_config("qwen3_5"), projections="qwen3_next").projections == \
        "qwen3_next"
    with pytest.raises(maskpack.Error) as e:
        maskpack.GatedDeltaNet(48, 2, 4, 16, 8, projections="qwen2")
    assert e.value.status == "MASKPACK_ERR_INVALID_ARGUMENT" and e.value.argument == "projections"
    # the conv runs with config.hidden_act in transformers; maskpack's conv has SiLU only
    with pytest.raises(maskpack.Error) as e:
        maskpack.GatedDeltaNet.from_config(Qwen3NextConfig(**{**_TINY, "hidden_act": "gelu"}))
    assert e.value.status == "MASKPACK_ERR_UNSUPPORTED" and e.value.argument == "hidden_act"


# ---- transformers' own layers and models, patched --------------------------------------------------


@pytest.mark.parametrize("kind", LAYER_KINDS)
def test_patched_transformers_layer_keeps_packed_sequences_apart(isa, kind):
    """patch_linear_attention: transformers' layer, called as a padding-free trainer calls it (one
    packed row with cu_seq_lens_q), gives its own padded result per sequence, gradients included;
    padded calls (NaN in the padding) match too; enabled=False restores its own forward."""
    cfg, theirs, _ = tiny_layers(kind)
    lengths = [70, 9, 130]
    width, T = 130, sum(lengths)
    hidden = torch.randn(T, cfg.hidden_size)
    R = torch.randn(T, cfg.hidden_size)
    mask = torch.as_tensor(maskpack.Layout.from_lengths(lengths, placement="right", capacity=width).mask2d("bool"))
    # reference: transformers' own layer on the padded batch with its 2D mask (right padding)
    hp = packed_to_padded(hidden, lengths, width, fill=0.0).requires_grad_(True)
    ref = padded_rows(theirs(hp, attention_mask=mask.long()), lengths)
    (ref * R).sum().backward()
    ref_grads = {n: p.grad.clone() for n, p in theirs.named_parameters()}
    theirs.zero_grad(set_to_none=True)
    assert maskpack.patch_linear_attention(theirs) == 1
    cu = torch.tensor([0, 70, 79, 209], dtype=torch.int32)
    hl = hidden[None].clone().requires_grad_(True)
    out = theirs(hl, cu_seq_lens_q=cu, cu_seq_lens_k=cu)
    assert out.shape == (1, T, cfg.hidden_size)
    assert relerr(out[0].detach(), ref.detach()) < 1e-4
    (out[0] * R).sum().backward()
    for n, p in theirs.named_parameters():
        assert relerr(p.grad, ref_grads[n]) < 1e-3, n
    assert relerr(hl.grad[0], padded_rows(hp.grad, lengths)) < 1e-3
    with torch.no_grad():
        out_pad = theirs(packed_to_padded(hidden, lengths, width), attention_mask=mask.long())  # NaN pads
    assert torch.equal(out_pad[~mask], torch.zeros_like(out_pad[~mask]))
    assert relerr(padded_rows(out_pad, lengths), ref.detach()) < 1e-4
    with pytest.raises(maskpack.Error) as e:
        theirs(hidden[None].expand(2, T, -1), cu_seq_lens_q=cu)
    assert e.value.status == "MASKPACK_ERR_SHAPE" and e.value.argument == "cu_seq_lens_q"
    # a patched layer deep-copies (the copy runs itself) and survives torch.save / torch.load
    twin = copy.deepcopy(theirs)
    buf = io.BytesIO()
    torch.save(theirs, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    with torch.no_grad():
        twin.out_proj.weight.mul_(2.0)  # the copy's own parameters, not the original's
        assert relerr(twin(hidden[None], cu_seq_lens_q=cu)[0], 2.0 * ref.detach()) < 1e-4
        assert torch.equal(loaded(hidden[None], cu_seq_lens_q=cu), theirs(hidden[None], cu_seq_lens_q=cu))
    assert maskpack.patch_linear_attention(theirs, enabled=False) == 1 and "forward" not in theirs.__dict__
    with torch.no_grad():
        again = padded_rows(theirs(packed_to_padded(hidden, lengths, width, fill=0.0), attention_mask=mask.long()),
                            lengths)
    assert torch.equal(again, ref.detach())  # transformers' own forward again, bit for bit


@pytest.mark.parametrize("kind", ["qwen3_5", "qwen3_next"])
def test_patched_transformers_model_packed_equals_padded_and_generation_is_unchanged(isa, kind):
    """A whole (tiny) Qwen3.5 or Qwen3-Next causal LM: after patching, the padding-free batch (one
    packed row, position ids and cu_seq_lens) gives the logits of the padded batch; a prefill
    through maskpack leaves transformers' cache as its own prefill would, so greedy generation is
    unchanged."""
    torch.manual_seed(5)
    if kind == "qwen3_5":
        from transformers import Qwen3_5TextConfig
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM as LM
        cfg = Qwen3_5TextConfig(**_TINY)
    else:
        LM = hf.Qwen3NextForCausalLM
        cfg = Qwen3NextConfig(**_TINY, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                              shared_expert_intermediate_size=16)
    cfg._attn_implementation = "sdpa"
    model = LM(cfg).eval()
    lengths, width = [7, 3, 12], 12
    ids = [torch.randint(0, cfg.vocab_size, (n,)) for n in lengths]
    pad = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros_like(pad)
    for i, x in enumerate(ids):
        pad[i, :len(x)], mask[i, :len(x)] = x, 1
    flat = torch.cat(ids)[None]
    pos = torch.cat([torch.arange(n) for n in lengths])[None]
    cu = torch.tensor([0, 7, 10, 22], dtype=torch.int32)
    packed_kw = dict(position_ids=pos, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=12, max_length_k=12,
                     use_cache=False)
    left = torch.zeros(2, 7, dtype=torch.long)
    lmask = torch.zeros_like(left)
    left[0], lmask[0] = ids[0], 1
    left[1, 4:], lmask[1, 4:] = ids[1], 1
    gen_kw = dict(attention_mask=lmask, max_new_tokens=5, do_sample=False, output_scores=True,
                  return_dict_in_generate=True)
    with torch.no_grad():
        ref = padded_rows(model(pad, attention_mask=mask, use_cache=False).logits, lengths)
        gen_ref = model.generate(left, **gen_kw)
        assert maskpack.patch_linear_attention(model) == 3  # three of every four layers
        assert relerr(model(flat, **packed_kw).logits[0], ref) < 1e-5
        assert relerr(padded_rows(model(pad, attention_mask=mask, use_cache=False).logits, lengths), ref) < 1e-5
        gen = model.generate(left, **gen_kw)
    assert torch.equal(gen.sequences, gen_ref.sequences)
    for a, b in zip(gen.scores, gen_ref.scores):
        assert relerr(a, b) < 1e-5


# ---- bad input --------------------------------------------------------------------------------------


def test_bad_input_raises_specific_errors():
    lay = maskpack.Layout.from_lengths([5, 7], placement="packed")
    q, k, v, g, beta = make_inputs((12,), 3, 4, 8, 8)
    with pytest.raises(maskpack.Error) as e:
        maskpack.gated_delta_rule(q, k, v, g, beta, lay)
    assert e.value.status == "MASKPACK_ERR_SHAPE" and e.value.argument == "v" and "multiple" in str(e.value)
    q, k, v, g, beta = make_inputs((11,), 2, 4, 8, 8)
    with pytest.raises(maskpack.Error) as e:
        maskpack.gated_delta_rule(q, k, v, g, beta, lay)
    assert e.value.status == "MASKPACK_ERR_SHAPE" and e.value.argument == "q"
    with pytest.raises(maskpack.Error) as e:
        maskpack.causal_conv1d(torch.randn(12, 4), torch.randn(4, 5), lay)
    assert e.value.status == "MASKPACK_ERR_INVALID_ARGUMENT" and e.value.argument == "weight"
    with pytest.raises(maskpack.Error) as e:
        maskpack.gated_delta_rule(*make_inputs((12,), 2, 4, 8, 8, dtype=torch.float64), lay)
    assert e.value.status == "MASKPACK_ERR_DTYPE"
    # a lazily negated view (its memory holds the negated values) is refused by name, not misread
    q, k, v, g, beta = make_inputs((12,), 2, 4, 8, 8)
    negq = torch.complex(torch.zeros_like(q), -q).conj().imag  # equals q, with the negative bit
    assert negq.is_neg() and torch.equal(negq, q)
    with pytest.raises(maskpack.Error) as e:
        maskpack.gated_delta_rule(negq, k, v, g, beta, lay)
    assert e.value.status == "MASKPACK_ERR_UNSUPPORTED" and e.value.argument == "q"


# ---- the operator kept per layout ---------------------------------------------------------------------


@pytest.mark.parametrize("chunked", [True, False])
def test_rule_operator_is_kept_per_layout_and_gives_the_plain_calls_bits(monkeypatch, chunked):
    """gated_delta_rule plans a layout once: one C operator per (shapes, options, threads,
    MASKPACK_ISA) in the layout's cache, reused by the next call and by the backward, with the bits of
    the plain per-call path (forward and gradients)."""
    from maskpack import gdn as gdn_mod

    lengths = [64, 64, 1, 70]
    lay = maskpack.Layout.from_lengths(lengths, placement="packed")
    xs = make_inputs((sum(lengths),), 2, 4, 32, 16)

    def run():
        leaves = [x.clone().requires_grad_(True) for x in xs]
        o, st = maskpack.gated_delta_rule(*leaves, lay, chunked=chunked, threads=2)
        (o.square().sum() + st.sum()).backward()
        return o.detach(), st.detach(), [x.grad for x in leaves]

    def ops():
        return {k: v for k, v in (lay._cache or {}).items() if isinstance(k, tuple) and k[0] == "gdn_op"}

    o1, s1, g1 = run()
    first = ops()
    assert len(first) == 1
    o2, s2, g2 = run()
    assert ops() == first and all(ops()[k] is first[k] for k in first)  # the same operator object
    monkeypatch.setattr(gdn_mod, "_rule_op", lambda *a: None)  # the plain calls
    o3, s3, g3 = run()
    for a, b, c in zip((o1, s1, *g1), (o2, s2, *g2), (o3, s3, *g3)):
        assert torch.equal(a, b) and torch.equal(a, c)
    monkeypatch.undo()
    # another thread count or MASKPACK_ISA is another operator
    maskpack.gated_delta_rule(*xs, lay, chunked=chunked, threads=1)
    assert len(ops()) == 2
    monkeypatch.setenv("MASKPACK_ISA", "ref")
    o4, _ = maskpack.gated_delta_rule(*xs, lay, chunked=chunked, threads=1)
    assert len(ops()) == 3
    assert (o4 - o1).abs().max() < 1e-4


# ---- gdn_l2norm --------------------------------------------------------------------------------------

def _l2_ref(x, eps):
    x64 = x.double()
    return x64 / torch.sqrt((x64 * x64).sum(-1, keepdim=True) + eps)


@pytest.mark.parametrize("placement", ["packed", "right"])
def test_gdn_l2norm_forward_backward(placement):
    lay = maskpack.Layout.from_lengths([5, 3], placement=placement)
    gen = torch.Generator().manual_seed(3)
    shape = (lay.q_width, 2, 16) if lay.packed else (lay.n_rows, lay.q_width, 2, 16)
    x = torch.randn(*shape, generator=gen, dtype=torch.float32)
    valid = torch.zeros(shape[:-2], dtype=torch.bool)
    if lay.packed:
        valid[:8] = True
    else:
        valid[0, :5] = True
        valid[1, :3] = True
    x[~valid] = float("nan")  # padding is never read
    x.requires_grad_(True)
    eps = 1e-3
    y = maskpack.gdn_l2norm(x, lay, eps=eps)
    assert y.shape == x.shape and y.dtype == torch.float32
    want = _l2_ref(x.detach()[valid], eps)
    torch.testing.assert_close(y.detach()[valid].double(), want, rtol=1e-5, atol=1e-6)
    assert torch.all(y.detach()[~valid] == 0), "padding rows are 0"
    # backward against autograd of the double reference on the real rows
    dy = torch.randn(*shape, generator=gen)
    (dx,) = torch.autograd.grad(y, x, dy)
    xr = x.detach()[valid].double().requires_grad_(True)
    (dref,) = torch.autograd.grad(_l2_ref(xr, eps), xr, dy[valid].double())
    torch.testing.assert_close(dx[valid].double(), dref, rtol=1e-4, atol=1e-6)
    assert torch.all(dx[~valid] == 0)


def test_gdn_l2norm_rejects_a_wrong_grid():
    lay = maskpack.Layout.from_lengths([5, 3], placement="packed")
    with pytest.raises((maskpack.Error, TypeError)):
        maskpack.gdn_l2norm(torch.zeros(7, 2, 16), lay)  # 7 tokens, the layout has 8


# ---- Gated DeltaNet: strided head dimension, bf16 in and out, NaN to bf16 ----------------------------

def _every_other(x):
    """x's values in a tensor whose last dimension has stride 2 (a view of a buffer twice as wide)."""
    wide = torch.zeros(*x.shape[:-1], 2 * x.shape[-1], dtype=x.dtype)
    wide[..., ::2] = x
    view = wide[..., ::2]
    assert view.stride(-1) == 2
    return view


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunked", [True, False])
def test_gdn_strided_head_dim_matches_contiguous(dtype, chunked):
    lay = maskpack.Layout.from_lengths([70, 9], placement="packed")
    gen = torch.Generator().manual_seed(11)
    T, H, HV, K, V = 79, 1, 2, 16, 16
    q = torch.randn(T, H, K, generator=gen).to(dtype)
    k = torch.randn(T, H, K, generator=gen).to(dtype)
    v = torch.randn(T, HV, V, generator=gen).to(dtype)
    g = (-0.1 * torch.rand(T, HV, generator=gen)).to(dtype)
    beta = torch.rand(T, HV, generator=gen).to(dtype)
    o, ht = maskpack.gated_delta_rule(q, k, v, g, beta, lay, chunked=chunked)
    # the same values read through head-dim stride 2, and written through stride 2
    o_out = _every_other(torch.full_like(v, 7.0))
    ht_out = torch.empty_like(ht)
    o2, ht2 = maskpack.gated_delta_rule(_every_other(q), _every_other(k), _every_other(v), g, beta, lay,
                                        chunked=chunked, out=(o_out, ht_out))
    assert o2 is o_out and o2.stride(-1) == 2
    assert torch.equal(o2, o), "strided inputs and output give the contiguous result bit for bit"
    assert torch.equal(ht2, ht)


def test_gdn_nan_to_bf16_stays_nan():
    lay = maskpack.Layout.from_lengths([5, 4], placement="packed")
    T, K, V = 9, 16, 16
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(T, 1, K, generator=gen).bfloat16()
    k = torch.randn(T, 1, K, generator=gen).bfloat16()
    v = torch.randn(T, 1, V, generator=gen).bfloat16()
    v[6, 0, 3] = float("nan")  # token 1 of the second segment
    g = torch.full((T, 1), -0.1).bfloat16()
    beta = torch.full((T, 1), 0.5).bfloat16()
    for chunked in (True, False):
        o, ht = maskpack.gated_delta_rule(q, k, v, g, beta, lay, chunked=chunked)
        assert o.dtype == torch.bfloat16
        assert torch.isfinite(o[:5].float()).all(), "the first segment never sees the second's NaN"
        assert torch.isnan(o[6:].float()).any(dim=-1).all(), "the NaN reaches the segment's later outputs as NaN"
        bits = o[6:].view(torch.int16).int() & 0xFFFF
        nan_bits = bits[torch.isnan(o[6:].float())]
        assert torch.all((nan_bits & 0x7F80) == 0x7F80) and torch.all((nan_bits & 0x0040) != 0), "quiet NaN"
        assert torch.isfinite(ht[0]).all() and torch.isnan(ht[1]).any()
