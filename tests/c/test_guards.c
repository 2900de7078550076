/* test_guards.c: the argument guards of the tensor kernels (Gated DeltaNet and its conv, L2 norm and
 * gates, the attention forward and backward), each reached on purpose. Every call first runs with
 * all arguments valid (the control), then once per tensor argument with that one argument spoiled:
 * NULL, a dtype the call does not take, one dimension too many, a wrong extent, or (outputs) the
 * memory of an input. Each spoiled call must fail with the status of that kind, name the spoiled
 * argument in e.argument, and leave every output untouched. Then the required pointers of the other
 * calls (derived tensors, layouts, CP shards, plans, relayout, the readers and writers), each NULL in
 * turn with the ones before it valid: MASKPACK_ERR_NULL_ARGUMENT naming it. And the Gated DeltaNet
 * workspace guards: options out of range, zero heads or head dims, value heads not a multiple of key
 * heads, head dims whose workspace overflows, each with its status and message. */
#include "check.h"
#include "io.h"

#include <math.h>
#include <stdlib.h>

#define MAXS 16

/* One tensor argument: its own f32 storage (sized for the largest spoiling below), the valid view,
 * the name the library reports, whether it may be NULL, and whether the call writes it. */
typedef struct slot {
    const char *name;
    float *mem;
    int64_t n;
    maskpack_tensor t;
    int optional, output;
    /* a wrong last extent: reported with this status, naming this argument (the argument whose
     * extents the others are checked against is not the one named: the first that disagrees is) */
    maskpack_status ext_status;
    const char *ext_blame;
    int any_stride; /* no dimension needs stride 1 (the attention's lse) */
    int f32_only;   /* float32 only (states, lse, dweight); the others also take bfloat16 */
} slot;

typedef struct call {
    const char *what;
    int n;
    slot s[MAXS];
    const maskpack_tensor *p[MAXS]; /* what the adapter passes: &s[i].t, a spoiled copy, or NULL */
    int strided_ok;                 /* a last dimension of stride 2 is accepted (else UNSUPPORTED) */
    int n_variants;                 /* the control also runs with g_variant = 1 .. n_variants - 1 */
    int mixed_ok;                   /* f32 and bf16 arguments may be mixed */
    maskpack_status (*run)(const maskpack_layout *L, const maskpack_tensor *const *p, maskpack_error *e);
} call;

static slot *add(call *c, const char *name, int ndim, const int64_t *shape, int optional, int output) {
    slot *s = &c->s[c->n++];
    s->ext_status = MASKPACK_ERR_SHAPE;
    s->ext_blame = name;
    static const char *const f32_names[] = {"lse",           "dweight",         "initial_state", "final_state",
                                            "d_final_state", "d_initial_state", "dA_log",        "ddt_bias"};
    for (size_t k = 0; k < sizeof f32_names / sizeof f32_names[0]; k++) s->f32_only |= strcmp(name, f32_names[k]) == 0;
    s->name = name;
    s->n = 1;
    for (int d = 0; d < ndim; d++) s->n *= shape[d];
    s->mem = calloc((size_t)s->n * 2 + 16, sizeof(float)); /* room for an extent one larger */
    for (int64_t i = 0; i < s->n; i++) s->mem[i] = output ? 0.0f : 0.25f + 0.01f * (float)(i % 7);
    s->t = maskpack_tensor_contiguous(s->mem, MASKPACK_F32, ndim, shape);
    s->optional = optional;
    s->output = output;
    return s;
}
static void blame(slot *s, maskpack_status st, const char *name) {
    s->ext_status = st;
    s->ext_blame = name;
}

/* which of a call's option sets the adapters use (0: the defaults) */
static int g_variant = 0;

/* the token grid of the layout under test: packed [T] (g_B = 0) or padded [B, S] */
static int64_t g_B = 0, g_S = 0;

/* a per-token tensor: shape[0] is T, replaced by B, S on a padded grid */
static slot *addt(call *c, const char *name, int ndim, const int64_t *shape, int optional, int output) {
    if (!g_B) return add(c, name, ndim, shape, optional, output);
    int64_t s2[MASKPACK_MAX_DIMS] = {g_B, g_S};
    for (int d = 1; d < ndim; d++) s2[d + 1] = shape[d];
    return add(c, name, ndim + 1, s2, optional, output);
}

static void call_free(call *c) {
    for (int i = 0; i < c->n; i++) free(c->s[i].mem);
}

#define SENT 12345.0f

static void mark_outputs(call *c) {
    for (int i = 0; i < c->n; i++)
        if (c->s[i].output)
            for (int64_t k = 0; k < c->s[i].n * 2 + 16; k++) c->s[i].mem[k] = SENT;
}
static int outputs_untouched(const call *c) {
    for (int i = 0; i < c->n; i++)
        if (c->s[i].output)
            for (int64_t k = 0; k < c->s[i].n * 2 + 16; k++)
                if (c->s[i].mem[k] != SENT) return 0;
    return 1;
}

/* Runs c with argument i replaced by `bad` (NULL: the argument NULL); expects status `want` naming it. */
static void expect_spoiled(call *c, const maskpack_layout *L, int i, const maskpack_tensor *bad, maskpack_status want,
                           const char *named_arg, const char *how) {
    for (int k = 0; k < c->n; k++) c->p[k] = &c->s[k].t;
    c->p[i] = bad;
    mark_outputs(c);
    maskpack_error e;
    memset(&e, 0, sizeof e);
    const maskpack_status s = c->run(L, c->p, &e);
    const int named = strcmp(e.argument, named_arg) == 0;
    if (s != want || !named || !outputs_untouched(c))
        fprintf(stderr, "%s: %s %s: got %s naming '%s' (%s), expected %s\n", c->what, c->s[i].name, how,
                maskpack_status_name(s), e.argument, e.message, maskpack_status_name(want));
    CHECK_EQ(s, want);
    CHECK(named);
    CHECK(outputs_untouched(c));
}

static void sweep(call *c, const maskpack_layout *L) {
    maskpack_error e;
    for (int k = 0; k < c->n; k++) c->p[k] = &c->s[k].t;
    CHECK_OK(c->run(L, c->p, &e), e); /* the control */
    /* the optional arguments all NULL: still a valid call */
    for (int k = 0; k < c->n; k++) c->p[k] = c->s[k].optional ? NULL : &c->s[k].t;
    CHECK_OK(c->run(L, c->p, &e), e);
    /* bfloat16 wherever the call takes it (the f32 storage read as pairs of bf16: finite values);
     * where the call takes mixed dtypes, also bf16 on every other argument only (either half) */
    maskpack_tensor bf[MAXS], mix[MAXS];
    for (int k = 0; k < c->n; k++) {
        bf[k] = c->s[k].t;
        if (!c->s[k].f32_only) bf[k].dtype = MASKPACK_BF16;
        c->p[k] = &bf[k];
    }
    memset(&e, 0, sizeof e);
    const maskpack_status sb = c->run(L, c->p, &e);
    if (sb != MASKPACK_OK) fprintf(stderr, "%s in bfloat16: %s\n", c->what, e.message);
    CHECK_EQ(sb, MASKPACK_OK);
    for (int parity = 0; c->mixed_ok && parity < 2; parity++) {
        for (int k = 0; k < c->n; k++) {
            mix[k] = (k & 1) == parity ? bf[k] : c->s[k].t;
            c->p[k] = &mix[k];
        }
        memset(&e, 0, sizeof e);
        const maskpack_status sm = c->run(L, c->p, &e);
        if (sm != MASKPACK_OK) fprintf(stderr, "%s with mixed dtypes: %s\n", c->what, e.message);
        CHECK_EQ(sm, MASKPACK_OK);
    }
    /* where any stride is taken: every tensor over every other element of twice its memory */
    if (c->strided_ok) {
        for (int k = 0; k < c->n; k++) {
            mix[k] = c->s[k].t;
            for (int d = 0; d < mix[k].ndim; d++) mix[k].strides[d] *= 2;
            c->p[k] = &mix[k];
        }
        memset(&e, 0, sizeof e);
        const maskpack_status ss = c->run(L, c->p, &e);
        if (ss != MASKPACK_OK) fprintf(stderr, "%s strided: %s\n", c->what, e.message);
        CHECK_EQ(ss, MASKPACK_OK);
    }
    /* the call's other options (kernel, form, threads, scalars) on the valid arguments: f32, bf16, and
     * f32 without the optional ones */
    for (g_variant = 1; g_variant < c->n_variants; g_variant++)
        for (int half = 0; half < 3; half++) { /* f32, bf16, f32 with the optional arguments NULL */
            for (int k = 0; k < c->n; k++)
                c->p[k] = half == 1 ? &bf[k] : half == 2 && c->s[k].optional ? NULL : &c->s[k].t;
            memset(&e, 0, sizeof e);
            const maskpack_status sv = c->run(L, c->p, &e);
            if (sv != MASKPACK_OK) fprintf(stderr, "%s variant %d (%d): %s\n", c->what, g_variant, half, e.message);
            CHECK_EQ(sv, MASKPACK_OK);
        }
    g_variant = 0;
    /* no layout */
    for (int k = 0; k < c->n; k++) c->p[k] = &c->s[k].t;
    memset(&e, 0, sizeof e);
    CHECK_EQ(c->run(NULL, c->p, &e), MASKPACK_ERR_NULL_ARGUMENT);
    CHECK(strcmp(e.argument, "layout") == 0);
    for (int i = 0; i < c->n; i++) {
        const slot *s = &c->s[i];
        if (!s->optional) expect_spoiled(c, L, i, NULL, MASKPACK_ERR_NULL_ARGUMENT, s->name, "NULL");
        maskpack_tensor t = s->t;
        t.dtype = MASKPACK_I32;
        expect_spoiled(c, L, i, &t, MASKPACK_ERR_DTYPE, s->name, "int32");
        /* one dimension too many: a trailing extent of 1 */
        t = s->t;
        t.shape[t.ndim] = 1;
        t.strides[t.ndim] = 1;
        t.ndim++;
        expect_spoiled(c, L, i, &t, MASKPACK_ERR_SHAPE, s->name, "rank + 1");
        /* the last extent one larger (contiguous again) */
        int64_t shape[MASKPACK_MAX_DIMS];
        memcpy(shape, s->t.shape, sizeof shape);
        shape[s->t.ndim - 1]++;
        t = maskpack_tensor_contiguous(s->mem, MASKPACK_F32, s->t.ndim, shape);
        expect_spoiled(c, L, i, &t, s->ext_status, s->ext_blame, "last extent + 1");
        /* a stride-2 last dimension (the same extents over twice the memory) */
        if (!c->strided_ok && !s->any_stride && s->t.shape[s->t.ndim - 1] > 1) {
            t = s->t;
            for (int d = 0; d < t.ndim; d++) t.strides[d] *= 2;
            expect_spoiled(c, L, i, &t, MASKPACK_ERR_UNSUPPORTED, s->name, "stride 2");
        }
        /* a leading dimension of 2 before the tensor's own */
        if (s->t.ndim < MASKPACK_MAX_DIMS) {
            t = s->t;
            memmove(t.shape + 1, t.shape, sizeof(int64_t) * (size_t)t.ndim);
            memmove(t.strides + 1, t.strides, sizeof(int64_t) * (size_t)t.ndim);
            t.shape[0] = 2;
            t.strides[0] = 0;
            t.ndim++;
            expect_spoiled(c, L, i, &t, MASKPACK_ERR_SHAPE, s->name, "leading 2");
        }
        /* an output written over the first input's memory */
        if (s->output) {
            t = s->t;
            t.data = c->s[0].mem;
            expect_spoiled(c, L, i, &t, MASKPACK_ERR_OVERLAP, s->name, "over input 0");
        }
    }
}

/* ---- adapters ---------------------------------------------------------------------------------- */

#define P(i) (p[i])
#define W(i) ((maskpack_tensor *)(uintptr_t)p[i])

/* Variants: conv (silu off, 2 threads); GDN (recurrent form, no L2 norm, 2 threads, the reference and
 * AVX2 kernels); attention (softcap, a given scale, 3 threads, the reference and AVX2 kernels). A
 * kernel this CPU lacks is replaced by the automatic choice. */
static maskpack_status run_conv(const maskpack_layout *L, const maskpack_tensor *const *p, maskpack_error *e) {
    return maskpack_causal_conv1d(L, P(0), P(1), P(2), !(g_variant & 1), OPTS_NT(g_variant & 2 ? 2 : 1), W(3), W(4), e);
}
static maskpack_status run_conv_bwd(const maskpack_layout *L, const maskpack_tensor *const *p, maskpack_error *e) {
    return maskpack_causal_conv1d_backward(L, P(0), P(1), P(2), !(g_variant & 1), P(3), P(4),
                                           OPTS_NT(g_variant & 2 ? 2 : 1), W(5), W(6), W(7), e);
}
static maskpack_status run_l2(const maskpack_layout *L, const maskpack_tensor *const *p, maskpack_error *e) {
    return maskpack_gdn_l2norm(L, P(0), MASKPACK_GDN_L2_EPS, W(1), e);
}
static maskpack_status run_l2_bwd(const maskpack_layout *L, const maskpack_tensor *const *p, maskpack_error *e) {
    return maskpack_gdn_l2norm_backward(L, P(0), P(1), MASKPACK_GDN_L2_EPS, W(2), e);
}
static maskpack_status run_gates(const maskpack_layout *L, const maskpack_tensor *const *p, maskpack_error *e) {
    return maskpack_gdn_gates(L, P(0), P(1), P(2), P(3), W(4), W(5), e);
}
static maskpack_status run_gates_bwd(const maskpack_layout *L, const maskpack_tensor *const *p, maskpack_error *e) {
    return maskpack_gdn_gates_backward(L, P(0), P(1), P(2), P(3), P(4), P(5), W(6), W(7), W(8), W(9), e);
}
static maskpack_gdn_options gdn_opts(void) {
    maskpack_gdn_options o = maskpack_gdn_options_default();
    o.chunked = !(g_variant & 1);
    o.l2norm = !(g_variant & 2);
    o.n_threads = g_variant & 4 ? 2 : 1;
    /* these tests fill every tensor alike (positive values, gates too): they pin the shape, stride and
     * overlap guards, so the gate's value check (tested in test_gdn) is asked not to look */
    o.skip_gate_check = 1;
    const maskpack_isa want[3] = {MASKPACK_ISA_AUTO, MASKPACK_ISA_REF, MASKPACK_ISA_AVX2};
    maskpack_isa got;
    maskpack_error e;
    o.isa = maskpack_isa_resolve(MASKPACK_KERNEL_GDN, MASKPACK_F32, want[g_variant >> 3], &got, &e) == MASKPACK_OK
                ? want[g_variant >> 3]
                : MASKPACK_ISA_AUTO;
    return o;
}
static maskpack_status run_gdn(const maskpack_layout *L, const maskpack_tensor *const *p, maskpack_error *e) {
    const maskpack_gdn_inputs in = {P(0), P(1), P(2), P(3), P(4), P(5)};
    const maskpack_gdn_options o = gdn_opts();
    return maskpack_gdn_forward(L, &in, &o, W(6), W(7), NULL, 0, e);
}
static maskpack_status run_gdn_bwd(const maskpack_layout *L, const maskpack_tensor *const *p, maskpack_error *e) {
    const maskpack_gdn_inputs in = {P(0), P(1), P(2), P(3), P(4), P(5)};
    const maskpack_gdn_options o = gdn_opts();
    maskpack_gdn_grads g = {W(8), W(9), W(10), W(11), W(12), W(13)};
    return maskpack_gdn_backward(L, &in, P(6), P(7), &o, &g, NULL, 0, e);
}
/* sets MASKPACK_ISA for the attention variant (unset for the automatic choice or a kernel this CPU lacks) */
static void attn_isa(void) {
    static const char *const names[3] = {NULL, "ref", "avx2"};
    const char *n = names[g_variant >> 3];
    if (n) {
        setenv("MASKPACK_ISA", n, 1);
        maskpack_isa isa;
        maskpack_error e;
        if (maskpack_isa_resolve(MASKPACK_KERNEL_ATTENTION, MASKPACK_F32, MASKPACK_ISA_AUTO, &isa, &e) == MASKPACK_OK)
            return;
    }
    unsetenv("MASKPACK_ISA");
}
static maskpack_status run_attn(const maskpack_layout *L, const maskpack_tensor *const *p, maskpack_error *e) {
    attn_isa();
    const maskpack_status s =
        maskpack_attention_forward(L, P(0), P(1), P(2), g_variant & 2 ? 0.3 : 0.0, g_variant & 1 ? 5.0 : 0.0, W(3),
                                   W(4), OPTS_NT(g_variant & 4 ? 3 : 1), NULL, 0, e);
    unsetenv("MASKPACK_ISA");
    return s;
}
static maskpack_status run_attn_bwd(const maskpack_layout *L, const maskpack_tensor *const *p, maskpack_error *e) {
    attn_isa();
    const maskpack_status s = maskpack_attention_backward(L, P(0), P(1), P(2), P(3), P(4), P(5),
                                                          g_variant & 2 ? 0.3 : 0.0, g_variant & 1 ? 5.0 : 0.0, W(6),
                                                          W(7), W(8), OPTS_NT(g_variant & 4 ? 3 : 1), NULL, 0, e);
    unsetenv("MASKPACK_ISA");
    return s;
}

/* T = 8 tokens in two segments (5 and 3), packed */
enum { T = 8, N = 2, C = 8, KW = 4, H = 2, HV = 4, K = 16, V = 16, D = 16 };

static void test_gdn_side_ops(const maskpack_layout *L) {
    const int64_t tc[2] = {T, C}, w[2] = {C, KW}, st[3] = {N, C, KW - 1};
    call c = {.what = "causal_conv1d", .mixed_ok = 1, .n_variants = 4, .strided_ok = 1, .run = run_conv};
    blame(addt(&c, "x", 2, tc, 0, 0), MASKPACK_ERR_SHAPE, "weight");
    blame(add(&c, "weight", 2, w, 0, 0), MASKPACK_ERR_INVALID_ARGUMENT, "weight"); /* W = 5 */
    add(&c, "prefix", 3, st, 1, 0);
    addt(&c, "y", 2, tc, 0, 1);
    add(&c, "conv_state", 3, st, 1, 1);
    sweep(&c, L);
    call_free(&c);

    call b = {.what = "causal_conv1d_backward", .mixed_ok = 1, .n_variants = 4, .strided_ok = 1, .run = run_conv_bwd};
    blame(addt(&b, "x", 2, tc, 0, 0), MASKPACK_ERR_SHAPE, "weight");
    blame(add(&b, "weight", 2, w, 0, 0), MASKPACK_ERR_INVALID_ARGUMENT, "weight");
    add(&b, "prefix", 3, st, 1, 0);
    addt(&b, "dy", 2, tc, 0, 0);
    add(&b, "d_conv_state", 3, st, 1, 0);
    addt(&b, "dx", 2, tc, 1, 1);
    add(&b, "dweight", 2, w, 1, 1);
    add(&b, "d_prefix", 3, st, 1, 1);
    sweep(&b, L);
    call_free(&b);

    const int64_t thd[3] = {T, H, D};
    call l = {.what = "gdn_l2norm", .mixed_ok = 1, .strided_ok = 1, .run = run_l2};
    blame(addt(&l, "x", 3, thd, 0, 0), MASKPACK_ERR_SHAPE, "y");
    addt(&l, "y", 3, thd, 0, 1);
    sweep(&l, L);
    call_free(&l);
    call lb = {.what = "gdn_l2norm_backward", .mixed_ok = 1, .strided_ok = 1, .run = run_l2_bwd};
    blame(addt(&lb, "x", 3, thd, 0, 0), MASKPACK_ERR_SHAPE, "dy");
    addt(&lb, "dy", 3, thd, 0, 0);
    addt(&lb, "dx", 3, thd, 0, 1);
    sweep(&lb, L);
    call_free(&lb);

    const int64_t th[2] = {T, HV}, hv[1] = {HV};
    call g = {.what = "gdn_gates", .mixed_ok = 1, .strided_ok = 1, .run = run_gates};
    blame(addt(&g, "a", 2, th, 0, 0), MASKPACK_ERR_SHAPE, "b");
    addt(&g, "b", 2, th, 0, 0);
    add(&g, "A_log", 1, hv, 0, 0);
    add(&g, "dt_bias", 1, hv, 0, 0);
    addt(&g, "g", 2, th, 1, 1); /* either output may be skipped */
    addt(&g, "beta", 2, th, 1, 1);
    sweep(&g, L);
    call_free(&g);
    call gb = {.what = "gdn_gates_backward", .mixed_ok = 1, .strided_ok = 1, .run = run_gates_bwd};
    blame(addt(&gb, "a", 2, th, 0, 0), MASKPACK_ERR_SHAPE, "b");
    addt(&gb, "b", 2, th, 0, 0);
    add(&gb, "A_log", 1, hv, 0, 0);
    add(&gb, "dt_bias", 1, hv, 0, 0);
    addt(&gb, "dg", 2, th, 1, 0);
    addt(&gb, "dbeta", 2, th, 1, 0);
    addt(&gb, "da", 2, th, 1, 1); /* any gradient may be skipped */
    addt(&gb, "db", 2, th, 1, 1);
    add(&gb, "dA_log", 1, hv, 1, 1);
    add(&gb, "ddt_bias", 1, hv, 1, 1);
    sweep(&gb, L);
    call_free(&gb);
}

static void test_gdn_rule(const maskpack_layout *L) {
    const int64_t q[3] = {T, H, K}, v[3] = {T, HV, V}, g[2] = {T, HV}, s[4] = {N, HV, K, V};
    call f = {.what = "gdn_forward", .mixed_ok = 1, .n_variants = 24, .strided_ok = 1, .run = run_gdn};
    blame(addt(&f, "q", 3, q, 0, 0), MASKPACK_ERR_SHAPE, "k");
    addt(&f, "k", 3, q, 0, 0);
    blame(addt(&f, "v", 3, v, 0, 0), MASKPACK_ERR_SHAPE, "initial_state");
    addt(&f, "g", 2, g, 0, 0);
    addt(&f, "beta", 2, g, 0, 0);
    add(&f, "initial_state", 4, s, 1, 0);
    addt(&f, "o", 3, v, 0, 1);
    add(&f, "final_state", 4, s, 1, 1);
    sweep(&f, L);
    call_free(&f);

    call b = {.what = "gdn_backward", .mixed_ok = 1, .n_variants = 24, .strided_ok = 1, .run = run_gdn_bwd};
    blame(addt(&b, "q", 3, q, 0, 0), MASKPACK_ERR_SHAPE, "k");
    addt(&b, "k", 3, q, 0, 0);
    blame(addt(&b, "v", 3, v, 0, 0), MASKPACK_ERR_SHAPE, "initial_state");
    addt(&b, "g", 2, g, 0, 0);
    addt(&b, "beta", 2, g, 0, 0);
    add(&b, "initial_state", 4, s, 1, 0);
    addt(&b, "d_o", 3, v, 0, 0);
    add(&b, "d_final_state", 4, s, 1, 0);
    addt(&b, "dq", 3, q, 1, 1);
    addt(&b, "dk", 3, q, 1, 1);
    addt(&b, "dv", 3, v, 1, 1);
    addt(&b, "dg", 2, g, 1, 1);
    addt(&b, "dbeta", 2, g, 1, 1);
    add(&b, "d_initial_state", 4, s, 1, 1);
    sweep(&b, L);
    call_free(&b);
}

static void test_attention(const maskpack_layout *L) {
    const int64_t qs[3] = {T, H, D}, kv[3] = {T, 1, D}, lse[2] = {H, T};
    call f = {.what = "attention_forward", .n_variants = 24, .run = run_attn};
    blame(addt(&f, "q", 3, qs, 0, 0), MASKPACK_ERR_SHAPE, "k");
    addt(&f, "k", 3, kv, 0, 0);
    addt(&f, "v", 3, kv, 0, 0);
    addt(&f, "out", 3, qs, 0, 1);
    if (g_B) {
        const int64_t lse_p[3] = {g_B, H, g_S};
        add(&f, "lse", 3, lse_p, 1, 1)->any_stride = 1;
    } else {
        add(&f, "lse", 2, lse, 1, 1)->any_stride = 1;
    }
    sweep(&f, L);
    call_free(&f);

    call b = {.what = "attention_backward", .n_variants = 24, .run = run_attn_bwd};
    addt(&b, "dout", 3, qs, 0, 0);
    blame(addt(&b, "q", 3, qs, 0, 0), MASKPACK_ERR_SHAPE, "k");
    addt(&b, "k", 3, kv, 0, 0);
    addt(&b, "v", 3, kv, 0, 0);
    addt(&b, "out", 3, qs, 0, 0);
    if (g_B) {
        const int64_t lse_p[3] = {g_B, H, g_S};
        add(&b, "lse", 3, lse_p, 0, 0)->any_stride = 1;
    } else {
        add(&b, "lse", 2, lse, 0, 0)->any_stride = 1;
    }
    addt(&b, "dq", 3, qs, 0, 1);
    addt(&b, "dk", 3, kv, 0, 1);
    addt(&b, "dv", 3, kv, 0, 1);
    sweep(&b, L);
    call_free(&b);
}

/* ---- the attention's other checks: heads, head dims, dtypes, scalars, workspace, kernel choice ------- */

static void test_attention_checks(const maskpack_layout *L) {
    static float qm[T * 3 * 300], km[T * 3 * 300], vm[T * 3 * 300], om[T * 3 * 300], lm[3 * T];
    for (int i = 0; i < T * 3 * 300; i++) qm[i] = km[i] = vm[i] = 0.125f;
    const int64_t q2[3] = {T, 2, D}, k1[3] = {T, 1, D}, k3[3] = {T, 3, D}, k2[3] = {T, 2, D}, big[3] = {T, 1, 300};
    const int64_t l2[2] = {2, T};
    maskpack_tensor q = maskpack_tensor_contiguous(qm, MASKPACK_F32, 3, q2),
                    k = maskpack_tensor_contiguous(km, MASKPACK_F32, 3, k1);
    maskpack_tensor v = maskpack_tensor_contiguous(vm, MASKPACK_F32, 3, k1),
                    o = maskpack_tensor_contiguous(om, MASKPACK_F32, 3, q2);
    maskpack_tensor lse = maskpack_tensor_contiguous(lm, MASKPACK_F32, 2, l2);
    maskpack_error e;
#define FWD(qq, kk, vv, sc, cap, nt)                                                                                   \
    maskpack_attention_forward(L, qq, kk, vv, sc, cap, &o, &lse, OPTS_NT(nt), NULL, 0, &e)
    CHECK_OK(FWD(&q, &k, &v, 0.0, 0.0, 1), e);
    /* k or v of another dtype than q */
    maskpack_tensor kb = k, vb = v;
    kb.dtype = MASKPACK_BF16;
    vb.dtype = MASKPACK_BF16;
    CHECK_STATUS(FWD(&q, &kb, &v, 0.0, 0.0, 1), MASKPACK_ERR_DTYPE, e);
    CHECK_MSG(e, "k: expected q's dtype float32, found bfloat16");
    CHECK_STATUS(FWD(&q, &k, &vb, 0.0, 0.0, 1), MASKPACK_ERR_DTYPE, e);
    CHECK_MSG(e, "v: expected q's dtype float32, found bfloat16");
    /* v's head dim or head count differs from k's; query heads not a multiple of key heads */
    maskpack_tensor v8 = maskpack_tensor_contiguous(vm, MASKPACK_F32, 3, (int64_t[3]){T, 1, 8});
    CHECK_STATUS(FWD(&q, &k, &v8, 0.0, 0.0, 1), MASKPACK_ERR_SHAPE, e);
    CHECK_MSG(e, "v: expected head dim 16 (q's), found 8");
    maskpack_tensor v2 = maskpack_tensor_contiguous(vm, MASKPACK_F32, 3, k2);
    CHECK_STATUS(FWD(&q, &k, &v2, 0.0, 0.0, 1), MASKPACK_ERR_SHAPE, e);
    CHECK_MSG(e, "v: expected 1 heads (k's), found 2");
    maskpack_tensor k3t = maskpack_tensor_contiguous(km, MASKPACK_F32, 3, k3),
                    v3t = maskpack_tensor_contiguous(vm, MASKPACK_F32, 3, k3);
    CHECK_STATUS(FWD(&q, &k3t, &v3t, 0.0, 0.0, 1), MASKPACK_ERR_SHAPE, e);
    CHECK_MSG(e, "k: query heads (2) must be a positive multiple of key heads (3)");
    /* a head dim above 256 */
    maskpack_tensor qb = maskpack_tensor_contiguous(qm, MASKPACK_F32, 3, big),
                    kbg = maskpack_tensor_contiguous(km, MASKPACK_F32, 3, big);
    maskpack_tensor vbg = maskpack_tensor_contiguous(vm, MASKPACK_F32, 3, big);
    o = maskpack_tensor_contiguous(om, MASKPACK_F32, 3, big);
    CHECK_STATUS(maskpack_attention_forward(L, &qb, &kbg, &vbg, 0.0, 0.0, &o, NULL, NULL, NULL, 0, &e),
                 MASKPACK_ERR_UNSUPPORTED, e);
    CHECK_MSG(e, "q: head dim must be in [1, 256], found 300");
    o = maskpack_tensor_contiguous(om, MASKPACK_F32, 3, q2);
    /* scalars */
    CHECK_STATUS(FWD(&q, &k, &v, INFINITY, 0.0, 1), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK(strcmp(e.argument, "scale") == 0);
    CHECK_STATUS(FWD(&q, &k, &v, 0.0, -1.0, 1), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "softcap: expected 0 (none) or a finite value > 0, found -1");
    CHECK_STATUS(FWD(&q, &k, &v, 0.0, NAN, 1), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK(strcmp(e.argument, "softcap") == 0);
    CHECK_STATUS(FWD(&q, &k, &v, 0.0, 0.0, 0), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK(strcmp(e.argument, "n_threads") == 0);
    CHECK_STATUS(FWD(&q, &k, &v, 0.0, 0.0, 1025), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK(strcmp(e.argument, "n_threads") == 0);
#undef FWD
    /* workspace: NULL with a size, too small, and the queries' NULL result pointer */
    size_t need = 0;
    CHECK_OK(maskpack_attention_forward_workspace(L, &q, &k, &v, NULL, &need, &e), e);
    CHECK(need > 0);
    CHECK_STATUS(maskpack_attention_forward(L, &q, &k, &v, 0.0, 0.0, &o, &lse, NULL, NULL, 8, &e),
                 MASKPACK_ERR_NULL_ARGUMENT, e);
    CHECK_MSG(e, "workspace: NULL with 8 bytes");
    void *ws = malloc(need);
    CHECK_STATUS(maskpack_attention_forward(L, &q, &k, &v, 0.0, 0.0, &o, &lse, NULL, ws, need - 1, &e),
                 MASKPACK_ERR_BUFFER_TOO_SMALL, e);
    CHECK(strcmp(e.argument, "workspace") == 0);
    CHECK_OK(maskpack_attention_forward(L, &q, &k, &v, 0.0, 0.0, &o, &lse, NULL, ws, need, &e), e);
    free(ws);
    CHECK_STATUS(maskpack_attention_forward_workspace(L, &q, &k, &v, NULL, NULL, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
    CHECK(strcmp(e.argument, "bytes") == 0);
    CHECK_STATUS(maskpack_attention_backward_workspace(L, &q, &k, &v, NULL, NULL, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
    CHECK(strcmp(e.argument, "bytes") == 0);
    CHECK_STATUS(maskpack_attention_backward_workspace(L, &q, &k, &v, OPTS_NT(0), &need, &e),
                 MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK(strcmp(e.argument, "n_threads") == 0);

    /* the workspace queries refuse what the calls refuse */
    CHECK_STATUS(maskpack_attention_forward_workspace(L, NULL, &k, &v, NULL, &need, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
    CHECK(strcmp(e.argument, "q") == 0);
    CHECK_STATUS(maskpack_attention_forward_workspace(L, &q, &k, &v, OPTS_NT(0), &need, &e),
                 MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK(strcmp(e.argument, "n_threads") == 0);
    CHECK_STATUS(maskpack_attention_backward_workspace(L, &q, &kb, &v, NULL, &need, &e), MASKPACK_ERR_DTYPE, e);
    /* the backward: a MASKPACK_ISA it cannot honour, a workspace pointer missing; more threads than work */
    static float dom[T * 2 * D], dqm[T * 2 * D], dkm[T * D], dvm[T * D];
    maskpack_tensor dout = maskpack_tensor_contiguous(dom, MASKPACK_F32, 3, q2),
                    dqt = maskpack_tensor_contiguous(dqm, MASKPACK_F32, 3, q2);
    maskpack_tensor dkt = maskpack_tensor_contiguous(dkm, MASKPACK_F32, 3, k1),
                    dvt = maskpack_tensor_contiguous(dvm, MASKPACK_F32, 3, k1);
    CHECK_OK(maskpack_attention_forward(L, &q, &k, &v, 0.0, 0.0, &o, &lse, OPTS_NT(8), NULL, 0, &e), e);
    setenv("MASKPACK_ISA", "sse9", 1);
    CHECK_STATUS(
        maskpack_attention_backward(L, &dout, &q, &k, &v, &o, &lse, 0.0, 0.0, &dqt, &dkt, &dvt, NULL, NULL, 0, &e),
        MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "found \"sse9\"");
    unsetenv("MASKPACK_ISA");
    CHECK_STATUS(
        maskpack_attention_backward(L, &dout, &q, &k, &v, &o, &lse, 0.0, 0.0, &dqt, &dkt, &dvt, NULL, NULL, 16, &e),
        MASKPACK_ERR_NULL_ARGUMENT, e);
    CHECK(strcmp(e.argument, "workspace") == 0);
    CHECK_OK(maskpack_attention_backward(L, &dout, &q, &k, &v, &o, &lse, 0.0, 0.0, &dqt, &dkt, &dvt, OPTS_NT(8), NULL,
                                         0, &e),
             e);
    /* a batch of empty sequences: no work, no token written, both directions succeed */
    const int64_t zeros[2] = {0, 0}, t0q[3] = {0, 2, D}, t0k[3] = {0, 1, D}, l0[2] = {2, 0};
    maskpack_layout *E = NULL;
    CHECK_OK(maskpack_layout_from_lengths(zeros, 2, MASKPACK_PLACE_PACKED, 0, NULL, &E, &e), e);
    if (E) {
        maskpack_tensor q0 = maskpack_tensor_contiguous(qm, MASKPACK_F32, 3, t0q),
                        k0 = maskpack_tensor_contiguous(km, MASKPACK_F32, 3, t0k);
        maskpack_tensor v0 = maskpack_tensor_contiguous(vm, MASKPACK_F32, 3, t0k),
                        o0 = maskpack_tensor_contiguous(om, MASKPACK_F32, 3, t0q);
        maskpack_tensor ls0 = maskpack_tensor_contiguous(lm, MASKPACK_F32, 2, l0);
        maskpack_tensor d0 = maskpack_tensor_contiguous(dom, MASKPACK_F32, 3, t0q),
                        dq0 = maskpack_tensor_contiguous(dqm, MASKPACK_F32, 3, t0q);
        maskpack_tensor dk0 = maskpack_tensor_contiguous(dkm, MASKPACK_F32, 3, t0k),
                        dv0 = maskpack_tensor_contiguous(dvm, MASKPACK_F32, 3, t0k);
        CHECK_OK(maskpack_attention_forward(E, &q0, &k0, &v0, 0.0, 0.0, &o0, &ls0, OPTS_NT(2), NULL, 0, &e), e);
        CHECK_OK(maskpack_attention_backward(E, &d0, &q0, &k0, &v0, &o0, &ls0, 0.0, 0.0, &dq0, &dk0, &dv0, OPTS_NT(2),
                                             NULL, 0, &e),
                 e);
        maskpack_layout_free(E);
    }

    /* the options: NULL = the defaults (1 thread, AUTO); an _on call takes their isa (a bad one is
     * refused naming "isa") and the team's size in place of their n_threads (0 is not read) */
    const maskpack_kernel_options dflt = maskpack_kernel_options_default();
    CHECK(dflt.n_threads == 1 && dflt.isa == MASKPACK_ISA_AUTO);
    CHECK_OK(maskpack_attention_forward_on(L, &q, &k, &v, 0.0, 0.0, &o, &lse, OPTS_ISA(0, MASKPACK_ISA_REF), NULL, NULL,
                                           0, &e),
             e);
    CHECK_STATUS(maskpack_attention_forward_on(L, &q, &k, &v, 0.0, 0.0, &o, &lse, OPTS_ISA(1, (maskpack_isa)99), NULL,
                                               NULL, 0, &e),
                 MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK(strcmp(e.argument, "isa") == 0);
    CHECK_STATUS(
        maskpack_attention_forward(L, &q, &k, &v, 0.0, 0.0, &o, &lse, OPTS_ISA(1, (maskpack_isa)99), NULL, 0, &e),
        MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK(strcmp(e.argument, "isa") == 0);

    /* the kernel choice: names, a NULL result, an empty MASKPACK_ISA (= unset), amx forced */
    CHECK(strcmp(maskpack_isa_name(MASKPACK_ISA_REF), "ref") == 0);
    CHECK(strcmp(maskpack_isa_name(MASKPACK_ISA_AVX512), "avx512") == 0);
    CHECK(strcmp(maskpack_isa_name(MASKPACK_ISA_AMX), "amx") == 0);
    CHECK(strcmp(maskpack_isa_name(MASKPACK_ISA_AVX2), "avx2") == 0);
    CHECK(strcmp(maskpack_isa_name((maskpack_isa)9), "unknown") == 0);
    CHECK_STATUS(maskpack_isa_resolve(MASKPACK_KERNEL_ATTENTION, MASKPACK_F32, MASKPACK_ISA_AUTO, NULL, &e),
                 MASKPACK_ERR_NULL_ARGUMENT, e);
    CHECK(strcmp(e.argument, "resolved") == 0);
    maskpack_isa auto_isa, got;
    unsetenv("MASKPACK_ISA");
    CHECK_OK(maskpack_isa_resolve(MASKPACK_KERNEL_ATTENTION, MASKPACK_BF16, MASKPACK_ISA_AUTO, &auto_isa, &e), e);
    setenv("MASKPACK_ISA", "", 1);
    CHECK_OK(maskpack_isa_resolve(MASKPACK_KERNEL_ATTENTION, MASKPACK_BF16, MASKPACK_ISA_AUTO, &got, &e), e);
    CHECK_EQ(got, auto_isa);
    setenv("MASKPACK_ISA", "amx", 1);
    const maskpack_status sa =
        maskpack_isa_resolve(MASKPACK_KERNEL_ATTENTION, MASKPACK_BF16, MASKPACK_ISA_AUTO, &got, &e);
    /* the automatic choice for bf16 is amx exactly when the CPU has it: forcing it agrees */
    if (auto_isa == MASKPACK_ISA_AMX) {
        CHECK_EQ(sa, MASKPACK_OK);
        CHECK_EQ(got, MASKPACK_ISA_AMX);
    } else {
        CHECK_EQ(sa, MASKPACK_ERR_UNSUPPORTED);
        CHECK_MSG(e, "MASKPACK_ISA: amx requested but this CPU (or build, or OS) lacks AMX-TILE/AMX-BF16");
    }
    unsetenv("MASKPACK_ISA");
}

/* ---- relayout plans and their execution ---------------------------------------------------------- */

static void test_relayout_checks(const maskpack_layout *L) {
    maskpack_error e;
    maskpack_relayout_plan *P = NULL;
    maskpack_layout *R = NULL, *other = NULL;
    CHECK_OK(maskpack_layout_padded_of(L, MASKPACK_PLACE_RIGHT, 0, &R, &e), e);
    CHECK_STATUS(maskpack_layout_padded_of(L, (maskpack_placement)7, 0, &other, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK(strcmp(e.argument, "placement") == 0 && other == NULL);
    /* no source; a NULL source; two unsharded sources; sources and dst of other sequence counts */
    const maskpack_layout *srcs[2] = {L, NULL};
    CHECK_STATUS(maskpack_relayout_plan_create(srcs, 0, R, &P, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "n_src: expected >= 1 source, found 0");
    CHECK_STATUS(maskpack_relayout_plan_create(srcs, 2, R, &P, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
    CHECK_MSG(e, "sources[1]: expected a layout, found NULL");
    srcs[1] = L;
    CHECK_STATUS(maskpack_relayout_plan_create(srcs, 2, R, &P, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "sources[0]: several sources must all be CP shards (pieces), this one is unsharded");
    const int64_t three[3] = {5, 3, 1};
    CHECK_OK(maskpack_layout_from_lengths(three, 3, MASKPACK_PLACE_PACKED, 0, NULL, &other, &e), e);
    CHECK_STATUS(maskpack_relayout_plan_create(srcs, 1, other, &P, &e), MASKPACK_ERR_SHAPE, e);
    CHECK_MSG(e, "dst: expected the source's 2 sequences, found 3");
    CHECK(P == NULL);
    maskpack_layout_free(other);

    /* execution: x NULL, x of another dtype, a negative stride, n_threads out of range */
    CHECK_OK(maskpack_relayout_plan_create(srcs, 1, R, &P, &e), e);
    float xs[T * 2], os[2 * 5 * 2];
    for (int i = 0; i < T * 2; i++) xs[i] = (float)i;
    for (int i = 0; i < 2 * 5 * 2; i++) os[i] = NAN; /* the pad tokens must be written (zeros) */
    const int64_t xsh[2] = {T, 2}, osh[3] = {2, 5, 2};
    maskpack_tensor x = maskpack_tensor_contiguous(xs, MASKPACK_F32, 2, xsh);
    maskpack_tensor o = maskpack_tensor_contiguous(os, MASKPACK_F32, 3, osh);
    const maskpack_tensor *xv[1] = {NULL};
    CHECK_STATUS(maskpack_relayout_execute(P, xv, &o, NULL, 1, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
    CHECK_MSG(e, "x[0]: expected a tensor, found NULL");
    maskpack_tensor xi = x;
    xi.dtype = MASKPACK_I32;
    xv[0] = &xi;
    CHECK_STATUS(maskpack_relayout_execute(P, xv, &o, NULL, 1, &e), MASKPACK_ERR_DTYPE, e);
    CHECK_MSG(e, "out: expected dtype int32 (as x[0]), found float32");
    maskpack_tensor xn = x;
    xn.data = xs + (T - 1) * 2;
    xn.strides[0] = -2;
    xv[0] = &xn;
    CHECK_STATUS(maskpack_relayout_execute(P, xv, &o, NULL, 1, &e), MASKPACK_ERR_SHAPE, e);
    CHECK_MSG(e, "x[0]: negative strides are not supported");
    xv[0] = &x;
    CHECK_STATUS(maskpack_relayout_execute(P, xv, &o, NULL, 0, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK(strcmp(e.argument, "n_threads") == 0);
    /* the control: the padded copy holds each sequence's rows */
    CHECK_OK(maskpack_relayout_execute(P, xv, &o, NULL, 1, &e), e);
    CHECK(os[0] == 0.0f && os[9] == 9.0f && os[10] == 10.0f && os[15] == 15.0f && os[16] == 0.0f && os[19] == 0.0f);
    CHECK_EQ(maskpack_relayout_plan_runs(NULL), 0);
    CHECK(maskpack_relayout_plan_runs(P) >= 2);
    maskpack_relayout_plan_free(P);
    maskpack_layout_free(R);
}

/* ---- plan accessors out of range, micro-batch layouts, option checks ------------------------------- */

static void test_plan_ranges(void) {
    maskpack_error e;
    const int64_t lens[6] = {3, 5, 2, 7, 1, 4};
    maskpack_plan_options po = maskpack_plan_options_default(8);
    po.dp = 2;
    po.micro_batches = 2;
    po.seed = 7;
    po.attention_a = NAN;
    maskpack_plan *p = NULL;
    CHECK_STATUS(maskpack_plan_create(lens, 6, &po, &p, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK(strcmp(e.argument, "attention_a") == 0 && p == NULL);
    po.attention_a = 0.0;
    CHECK_OK(maskpack_plan_create(lens, 6, &po, &p, &e), e);
    if (!p) return;
    const int64_t R = maskpack_plan_n_rows(p);
    CHECK(R >= 4 && R % 4 == 0);
    /* every per-row accessor: -1 just outside [0, R) on both sides, a value inside */
    const int64_t bad[2] = {-1, R};
    for (int k = 0; k < 2; k++) {
        CHECK_EQ(maskpack_plan_rank_of_row(p, bad[k]), -1);
        CHECK_EQ(maskpack_plan_microbatch_of_row(p, bad[k]), -1);
        CHECK_EQ(maskpack_plan_row_used(p, bad[k]), -1);
        CHECK(maskpack_plan_row_cost(p, bad[k]) == -1.0);
        CHECK_EQ(maskpack_plan_row_count(p, bad[k]), -1);
    }
    CHECK_EQ(maskpack_plan_rank_of_row(p, R - 1), 1);
    CHECK_EQ(maskpack_plan_microbatch_of_row(p, R - 1), 1);
    CHECK(maskpack_plan_rank_cost(p, -1) == -1.0 && maskpack_plan_rank_cost(p, 2) == -1.0);
    CHECK(maskpack_plan_rank_cost(p, 1) >= 0.0);
    const int64_t rm[4][2] = {{-1, 0}, {2, 0}, {0, -1}, {0, 2}};
    for (int k = 0; k < 4; k++) CHECK(maskpack_plan_microbatch_cost(p, rm[k][0], rm[k][1]) == -1.0);
    CHECK(maskpack_plan_microbatch_cost(p, 1, 1) >= 0.0);
    /* micro-batch layouts: rank and micro-batch out of range; capacity-wide rows */
    maskpack_layout *L = NULL;
    CHECK_STATUS(maskpack_plan_microbatch_layout(p, 2, 0, NULL, &L, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "rank: expected in [0, 2), found 2");
    CHECK_STATUS(maskpack_plan_microbatch_layout(p, -1, 0, NULL, &L, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_STATUS(maskpack_plan_microbatch_layout(p, 0, 2, NULL, &L, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "micro_batch: expected in [0, 2), found 2");
    CHECK_STATUS(maskpack_plan_microbatch_layout(p, 0, -1, NULL, &L, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK(L == NULL);
    CHECK_OK(maskpack_plan_microbatch_layout(p, 1, 1, NULL, &L, &e), e);
    CHECK(L && maskpack_layout_q_width(L) == 8); /* the default row width is the capacity */
    maskpack_layout_free(L);
    L = NULL;
    const maskpack_rule bidir = {0};
    CHECK_OK(maskpack_plan_row_layout(p, 0, &bidir, &L, &e), e);
    maskpack_layout_free(L);
    maskpack_plan_free(p);
}

/* ---- labels and loss weights: dtypes, aliasing, both index and both float dtypes; dtype names ------- */

static void test_labels_checks(const maskpack_layout *L) {
    maskpack_error e;
    const int64_t t8 = T;
    int64_t l64[T] = {10, 11, 12, 13, 14, 20, 21, 22}, o64[T];
    int32_t l32[T] = {10, -100, 12, 13, 14, 20, 21, 22}, o32[T];
    float f[T];
    double dbl[T];
    maskpack_tensor lab64 = maskpack_tensor_contiguous(l64, MASKPACK_I64, 1, &t8);
    maskpack_tensor lab32 = maskpack_tensor_contiguous(l32, MASKPACK_I32, 1, &t8);
    maskpack_tensor out64 = maskpack_tensor_contiguous(o64, MASKPACK_I64, 1, &t8);
    maskpack_tensor out32 = maskpack_tensor_contiguous(o32, MASKPACK_I32, 1, &t8);
    maskpack_tensor of = maskpack_tensor_contiguous(f, MASKPACK_F32, 1, &t8);
    maskpack_tensor od = maskpack_tensor_contiguous(dbl, MASKPACK_F64, 1, &t8);
    /* float labels; out over labels; int32 labels shifted */
    CHECK_STATUS(maskpack_shift_labels(L, &of, -100, &of, &e), MASKPACK_ERR_DTYPE, e);
    CHECK(strcmp(e.argument, "labels") == 0);
    CHECK_STATUS(maskpack_shift_labels(L, &lab64, -100, &lab64, &e), MASKPACK_ERR_OVERLAP, e);
    CHECK_MSG(e, "out: must not alias labels");
    CHECK_OK(maskpack_shift_labels(L, &lab32, -100, &out32, &e), e);
    const int32_t want32[T] = {-100, 12, 13, 14, -100, 21, 22, -100};
    CHECK(memcmp(o32, want32, sizeof want32) == 0);
    /* loss weights: float labels, an integer out; int32 labels into f32 and int64 labels into f64 */
    double den = 0;
    CHECK_STATUS(maskpack_loss_weights(L, &of, -100, MASKPACK_LOSS_TOKEN, &od, &den, &e), MASKPACK_ERR_DTYPE, e);
    CHECK(strcmp(e.argument, "labels") == 0);
    CHECK_STATUS(maskpack_loss_weights(L, &lab64, -100, MASKPACK_LOSS_TOKEN, &out64, &den, &e), MASKPACK_ERR_DTYPE, e);
    CHECK(strcmp(e.argument, "out") == 0);
    CHECK_OK(maskpack_loss_weights(L, &lab32, -100, MASKPACK_LOSS_TOKEN, &of, &den, &e), e);
    CHECK(den == 7.0 && f[1] == 0.0f && f[0] == 1.0f / 7.0f);
    CHECK_OK(maskpack_loss_weights(L, &lab64, -100, MASKPACK_LOSS_SEQUENCE, &od, &den, &e), e);
    CHECK(den == 2.0 && dbl[0] == 0.1 && dbl[7] == 1.0 / 6.0);
    /* packed labels as [1, T]: the same shift as [T] */
    const int64_t one_t[2] = {1, T};
    int64_t o2[T];
    maskpack_tensor lab2 = maskpack_tensor_contiguous(l64, MASKPACK_I64, 2, one_t);
    maskpack_tensor out2 = maskpack_tensor_contiguous(o2, MASKPACK_I64, 2, one_t);
    CHECK_OK(maskpack_shift_labels(L, &lab64, -100, &out64, &e), e);
    CHECK_OK(maskpack_shift_labels(L, &lab2, -100, &out2, &e), e);
    CHECK(memcmp(o2, o64, sizeof o2) == 0 && o64[0] == 11 && o64[4] == -100);
    /* strided labels and outputs (every other element of twice the memory): the same values */
    int64_t l64s[2 * T], o64s[2 * T];
    int32_t l32s[2 * T], o32s[2 * T];
    float fs[2 * T];
    double ds[2 * T];
    for (int i = 0; i < T; i++) l64s[2 * i] = l64[i], l32s[2 * i] = l32[i];
    maskpack_tensor lab64s = lab64, out64s = out64, lab32s = lab32, out32s = out32, ofs = of, ods = od;
    lab64s.data = l64s, out64s.data = o64s, lab32s.data = l32s, out32s.data = o32s, ofs.data = fs, ods.data = ds;
    lab64s.strides[0] = out64s.strides[0] = lab32s.strides[0] = out32s.strides[0] = ofs.strides[0] = ods.strides[0] = 2;
    CHECK_OK(maskpack_shift_labels(L, &lab64s, -100, &out64s, &e), e);
    CHECK_OK(maskpack_shift_labels(L, &lab32s, -100, &out32s, &e), e);
    int same = 1;
    for (int i = 0; i < T; i++) same &= o64s[2 * i] == o64[i] && o32s[2 * i] == want32[i];
    CHECK(same);
    CHECK_OK(maskpack_loss_weights(L, &lab32s, -100, MASKPACK_LOSS_TOKEN, &ofs, &den, &e), e);
    CHECK(den == 7.0 && fs[2] == 0.0f && fs[0] == 1.0f / 7.0f && fs[14] == 1.0f / 7.0f);
    CHECK_OK(maskpack_loss_weights(L, &lab64s, -100, MASKPACK_LOSS_SEQUENCE, &ods, &den, &e), e);
    CHECK(den == 2.0 && ds[0] == 0.1 && ds[14] == 1.0 / 6.0);
    CHECK_OK(maskpack_loss_weights(L, NULL, -100, MASKPACK_LOSS_TOKEN, &ods, &den, &e), e);
    CHECK(den == 6.0 && ds[8] == 0.0 && ds[0] == 1.0 / 6.0); /* each sequence's last token unlabelled */
    /* no token at all: labels and out may then share their (empty) memory */
    const int64_t zeros[2] = {0, 0}, t0 = 0;
    maskpack_layout *E = NULL;
    CHECK_OK(maskpack_layout_from_lengths(zeros, 2, MASKPACK_PLACE_PACKED, 0, NULL, &E, &e), e);
    maskpack_tensor lab0 = maskpack_tensor_contiguous(l64, MASKPACK_I64, 1, &t0);
    if (E) CHECK_OK(maskpack_shift_labels(E, &lab0, -100, &lab0, &e), e);
    maskpack_layout_free(E);
    /* block masks with only some outputs asked for: the same values as with all of them */
    int64_t qb = 0, kb = 0;
    CHECK_OK(maskpack_block_mask_dims(L, 4, 4, &qb, &kb, &e), e);
    int32_t all[8][64], part[8][64];
    memset(all, 0, sizeof all);
    memset(part, 0, sizeof part);
    maskpack_block_mask_arrays full_set = {all[0], all[1], all[2], all[3], all[4], all[5], all[6], all[7]};
    CHECK_OK(maskpack_block_mask(L, 4, 4, &full_set, &e), e);
    maskpack_block_mask_arrays kv_only = {part[0], part[1], part[2], part[3], NULL, NULL, NULL, NULL};
    CHECK_OK(maskpack_block_mask(L, 4, 4, &kv_only, &e), e);
    maskpack_block_mask_arrays q_counts = {NULL, NULL, NULL, NULL, part[4], NULL, part[6], NULL};
    CHECK_OK(maskpack_block_mask(L, 4, 4, &q_counts, &e), e);
    CHECK(memcmp(part[0], all[0], sizeof(int32_t) * (size_t)qb) == 0);
    CHECK(memcmp(part[2], all[2], sizeof(int32_t) * (size_t)qb) == 0);
    CHECK(memcmp(part[4], all[4], sizeof(int32_t) * (size_t)kb) == 0);
    CHECK(memcmp(part[6], all[6], sizeof(int32_t) * (size_t)kb) == 0);
    /* dtype names out of range; a contiguous view without a shape */
    CHECK(strcmp(maskpack_dtype_name((maskpack_dtype)-1), "unknown") == 0);
    CHECK(strcmp(maskpack_dtype_name(MASKPACK_DTYPE_COUNT_), "unknown") == 0);
    maskpack_tensor z = maskpack_tensor_contiguous(f, MASKPACK_F32, 2, NULL);
    CHECK(z.ndim == 2 && z.shape[0] == 0 && z.shape[1] == 0);
}

/* ---- the Gated DeltaNet's other checks: options, NULL structs, workspace, empty batches, threads ----- */

static void test_gdn_checks(const maskpack_layout *L) {
    static float qm[T * H * K], km[T * H * K], vm[T * HV * V], gm[T * HV], bm[T * HV], om[T * HV * V];
    static float dqm[T * H * K], dom[T * HV * V];
    for (int i = 0; i < T * H * K; i++) qm[i] = km[i] = 0.1f * (float)(i % 5);
    for (int i = 0; i < T * HV * V; i++) vm[i] = dom[i] = 0.05f * (float)(i % 7);
    for (int i = 0; i < T * HV; i++) gm[i] = -0.1f, bm[i] = 0.5f;
    const int64_t qs[3] = {T, H, K}, vs[3] = {T, HV, V}, gs[2] = {T, HV};
    maskpack_tensor q = maskpack_tensor_contiguous(qm, MASKPACK_F32, 3, qs),
                    k = maskpack_tensor_contiguous(km, MASKPACK_F32, 3, qs);
    maskpack_tensor v = maskpack_tensor_contiguous(vm, MASKPACK_F32, 3, vs),
                    g = maskpack_tensor_contiguous(gm, MASKPACK_F32, 2, gs);
    maskpack_tensor b = maskpack_tensor_contiguous(bm, MASKPACK_F32, 2, gs),
                    o = maskpack_tensor_contiguous(om, MASKPACK_F32, 3, vs);
    maskpack_tensor dq = maskpack_tensor_contiguous(dqm, MASKPACK_F32, 3, qs),
                    d_o = maskpack_tensor_contiguous(dom, MASKPACK_F32, 3, vs);
    const maskpack_gdn_inputs in = {&q, &k, &v, &g, &b, NULL};
    maskpack_gdn_options opt = maskpack_gdn_options_default();
    maskpack_gdn_grads gr = {&dq, NULL, NULL, NULL, NULL, NULL};
    maskpack_error e;
    /* a NULL result pointer, inputs or grads */
    CHECK_STATUS(maskpack_isa_resolve(MASKPACK_KERNEL_GDN, MASKPACK_F32, MASKPACK_ISA_AUTO, NULL, &e),
                 MASKPACK_ERR_NULL_ARGUMENT, e);
    CHECK(strcmp(e.argument, "resolved") == 0);
    CHECK_STATUS(maskpack_gdn_forward(L, NULL, &opt, &o, NULL, NULL, 0, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
    CHECK(strcmp(e.argument, "inputs") == 0);
    CHECK_STATUS(maskpack_gdn_backward(L, &in, &d_o, NULL, &opt, NULL, NULL, 0, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
    CHECK(strcmp(e.argument, "grads") == 0);
    size_t need = 0;
    CHECK_STATUS(maskpack_gdn_workspace_size(L, &in, &opt, 0, NULL, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
    CHECK(strcmp(e.argument, "bytes") == 0);
    /* scale: +-infinity (NaN is test_gdn's) */
    const double scales[2] = {INFINITY, -INFINITY};
    for (int i = 0; i < 2; i++) {
        maskpack_gdn_options bad = opt;
        bad.scale = scales[i];
        CHECK_STATUS(maskpack_gdn_forward(L, &in, &bad, &o, NULL, NULL, 0, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
        CHECK(strcmp(e.argument, "opts.scale") == 0);
        CHECK_STATUS(maskpack_gdn_backward(L, &in, &d_o, NULL, &bad, &gr, NULL, 0, &e), MASKPACK_ERR_INVALID_ARGUMENT,
                     e);
        CHECK(strcmp(e.argument, "opts.scale") == 0);
    }
    /* the backward's workspace: a size without a pointer is refused; too small; exactly the queried size */
    CHECK_OK(maskpack_gdn_workspace_size(L, &in, &opt, 1, &need, &e), e);
    void *ws = malloc(need);
    CHECK_STATUS(maskpack_gdn_backward(L, &in, &d_o, NULL, &opt, &gr, ws, need - 1, &e), MASKPACK_ERR_BUFFER_TOO_SMALL,
                 e);
    CHECK_MSG(e, "workspace: expected at least");
    CHECK_OK(maskpack_gdn_backward(L, &in, &d_o, NULL, &opt, &gr, ws, need, &e), e);
    free(ws);
    /* more threads than (segment, head) tasks: the same result as one thread */
    static float o1[T * HV * V];
    maskpack_tensor ot = maskpack_tensor_contiguous(o1, MASKPACK_F32, 3, vs);
    CHECK_OK(maskpack_gdn_forward(L, &in, &opt, &ot, NULL, NULL, 0, &e), e);
    maskpack_gdn_options many = opt;
    many.n_threads = 64;
    CHECK_OK(maskpack_gdn_forward(L, &in, &many, &o, NULL, NULL, 0, &e), e);
    CHECK(memcmp(o1, om, sizeof o1) == 0);
    CHECK_OK(maskpack_gdn_backward(L, &in, &d_o, NULL, &many, &gr, NULL, 0, &e), e);
    /* a batch of empty sequences: no task, both directions succeed */
    const int64_t zeros[2] = {0, 0}, q0[3] = {0, H, K}, v0[3] = {0, HV, V}, g0[2] = {0, HV};
    maskpack_layout *E = NULL;
    CHECK_OK(maskpack_layout_from_lengths(zeros, 2, MASKPACK_PLACE_PACKED, 0, NULL, &E, &e), e);
    if (E) {
        maskpack_tensor qe = maskpack_tensor_contiguous(qm, MASKPACK_F32, 3, q0),
                        ve = maskpack_tensor_contiguous(vm, MASKPACK_F32, 3, v0);
        maskpack_tensor ge = maskpack_tensor_contiguous(gm, MASKPACK_F32, 2, g0),
                        oe = maskpack_tensor_contiguous(om, MASKPACK_F32, 3, v0);
        maskpack_tensor de = maskpack_tensor_contiguous(dom, MASKPACK_F32, 3, v0),
                        dqe = maskpack_tensor_contiguous(dqm, MASKPACK_F32, 3, q0);
        const maskpack_gdn_inputs ie = {&qe, &qe, &ve, &ge, &ge, NULL};
        maskpack_gdn_grads ge_ = {&dqe, NULL, NULL, NULL, NULL, NULL};
        CHECK_OK(maskpack_gdn_forward(E, &ie, &opt, &oe, NULL, NULL, 0, &e), e);
        CHECK_OK(maskpack_gdn_backward(E, &ie, &de, NULL, &opt, &ge_, NULL, 0, &e), e);
        maskpack_layout_free(E);
    }
}

/* ---- attention kernels against the reference on odd head dims and tile edges ------------------------ */

static double max_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= m)) m = d; /* NaN propagates as a failure */
    }
    return m;
}

/* Forward and backward of each kernel this CPU runs (AVX2, the automatic choice) against the scalar
 * reference, for head dims that leave remainders in every vector loop (1, 3, 17, 40) and sequences
 * (37 and 20 tokens, 2 query heads on 1 key head) that end inside tiles. */
static void test_attention_odd_dims(void) {
    const int64_t lens[2] = {37, 20};
    enum { TT = 57, HQ = 2, MAXD = 40 };
    maskpack_layout *L = NULL;
    maskpack_error e;
    CHECK_OK(maskpack_layout_from_lengths(lens, 2, MASKPACK_PLACE_PACKED, 0, NULL, &L, &e), e);
    if (!L) return;
    static float q[TT * HQ * MAXD], k[TT * MAXD], v[TT * MAXD], dout[TT * HQ * MAXD];
    static float out[3][TT * HQ * MAXD], lse[3][HQ * TT], dq[3][TT * HQ * MAXD], dk[3][TT * MAXD], dv[3][TT * MAXD];
    uint32_t x = 7;
#define RND() ((float)((x = x * 1664525u + 1013904223u) >> 8) / 16777216.0f - 0.5f)
    for (int i = 0; i < TT * HQ * MAXD; i++) q[i] = RND(), dout[i] = RND();
    for (int i = 0; i < TT * MAXD; i++) k[i] = RND(), v[i] = RND();
#undef RND
    const int64_t dims[4] = {1, 3, 17, 40};
    const char *isas[3] = {"ref", "avx2", NULL};
    for (int di = 0; di < 4; di++) {
        const int64_t D_ = dims[di], qs[3] = {TT, HQ, D_}, ks[3] = {TT, 1, D_}, ls[2] = {HQ, TT};
        const size_t nq = (size_t)(TT * HQ * D_), nk = (size_t)(TT * D_);
        maskpack_tensor qt = maskpack_tensor_contiguous(q, MASKPACK_F32, 3, qs),
                        kt = maskpack_tensor_contiguous(k, MASKPACK_F32, 3, ks);
        maskpack_tensor vt = maskpack_tensor_contiguous(v, MASKPACK_F32, 3, ks),
                        dot = maskpack_tensor_contiguous(dout, MASKPACK_F32, 3, qs);
        int ran[3] = {0, 0, 0};
        for (int a = 0; a < 3; a++) {
            if (isas[a]) {
                setenv("MASKPACK_ISA", isas[a], 1);
                maskpack_isa got;
                if (maskpack_isa_resolve(MASKPACK_KERNEL_ATTENTION, MASKPACK_F32, MASKPACK_ISA_AUTO, &got, &e) !=
                    MASKPACK_OK)
                    continue;
            } else {
                unsetenv("MASKPACK_ISA");
            }
            maskpack_tensor ot = maskpack_tensor_contiguous(out[a], MASKPACK_F32, 3, qs);
            maskpack_tensor lt = maskpack_tensor_contiguous(lse[a], MASKPACK_F32, 2, ls);
            maskpack_tensor dqt = maskpack_tensor_contiguous(dq[a], MASKPACK_F32, 3, qs);
            maskpack_tensor dkt = maskpack_tensor_contiguous(dk[a], MASKPACK_F32, 3, ks);
            maskpack_tensor dvt = maskpack_tensor_contiguous(dv[a], MASKPACK_F32, 3, ks);
            CHECK_OK(maskpack_attention_forward(L, &qt, &kt, &vt, 0.0, 0.0, &ot, &lt, OPTS_NT(2), NULL, 0, &e), e);
            CHECK_OK(maskpack_attention_backward(L, &dot, &qt, &kt, &vt, &ot, &lt, 0.0, 0.0, &dqt, &dkt, &dvt,
                                                 OPTS_NT(2), NULL, 0, &e),
                     e);
            ran[a] = 1;
        }
        unsetenv("MASKPACK_ISA");
        CHECK(ran[0] && ran[2]);
        for (int a = 1; a < 3; a++) {
            if (!ran[a]) continue;
            const double worst =
                fmax(fmax(max_diff(out[a], out[0], nq), max_diff(lse[a], lse[0], (size_t)(HQ * TT))),
                     fmax(max_diff(dq[a], dq[0], nq), fmax(max_diff(dk[a], dk[0], nk), max_diff(dv[a], dv[0], nk))));
            if (!(worst < 1e-4))
                fprintf(stderr, "attention D %lld, %s vs ref: worst %g\n", (long long)D_, isas[a] ? isas[a] : "auto",
                        worst);
            CHECK(worst < 1e-4);
        }
    }
    maskpack_layout_free(L);
}

/* ---- plans under every combination of options: each token placed once, rows within capacity -------- */

static int g_progress_calls;
static void count_progress(void *ctx, const char *stage, double fraction) {
    (void)ctx;
    if (fraction >= 0.0 && fraction <= 1.0 && (!strcmp(stage, "pack") || !strcmp(stage, "balance"))) g_progress_calls++;
}

static void test_plan_option_grid(void) {
    int64_t lens[300];
    uint32_t x = 99;
    for (int i = 0; i < 300; i++) lens[i] = (int64_t)((x = x * 1103515245u + 12345u) >> 16) % 40;
    lens[7] = 90; /* longer than a row: only with allow_split */
    maskpack_error e;
    int64_t got[300];
    for (int combo = 0; combo < 96; combo++) {
        maskpack_plan_options o = maskpack_plan_options_default(64);
        o.algorithm = (maskpack_plan_algorithm)(combo % 3);
        o.objective = (maskpack_plan_objective)((combo / 3) % 2);
        o.seed = (combo / 6) % 2 ? 17 : 0;
        o.row_width = (maskpack_plan_width)((combo / 12) % 2);
        o.micro_batches = (combo / 24) % 2 ? 3 : 1;
        o.dp = (combo / 48) % 2 ? 2 : 1;
        o.allow_split = 1;
        o.progress = count_progress;
        g_progress_calls = 0;
        maskpack_plan *p = NULL;
        CHECK_OK(maskpack_plan_create(lens, 300, &o, &p, &e), e);
        if (!p) continue;
        CHECK(g_progress_calls > 0);
        memset(got, 0, sizeof got);
        int bad_row = 0;
        for (int64_t r = 0; r < maskpack_plan_n_rows(p); r++) {
            maskpack_plan_piece pc[128];
            size_t cnt = 0;
            CHECK_OK(maskpack_plan_row(p, r, pc, 128, &cnt, &e), e);
            int64_t used = 0;
            for (size_t i = 0; i < cnt; i++) {
                got[pc[i].sequence] += pc[i].length;
                used += pc[i].slot;
            }
            bad_row |= used > 64 || used != maskpack_plan_row_used(p, r);
        }
        CHECK(!bad_row);
        CHECK(memcmp(got, lens, sizeof got) == 0); /* every token of every sequence, once */
        CHECK(maskpack_plan_n_rows(p) % (o.dp * o.micro_batches) == 0);
        maskpack_plan_free(p);
    }
    /* without allow_split the long sequence is refused, naming it */
    maskpack_plan_options o = maskpack_plan_options_default(64);
    maskpack_plan *p = NULL;
    CHECK_STATUS(maskpack_plan_create(lens, 300, &o, &p, &e), MASKPACK_ERR_VALUE, e);
    CHECK(strcmp(e.argument, "lengths") == 0 && e.index[0] == 7 && p == NULL);
}

/* ---- relayout from two CP shards back to the batch: the round trip, and each x[i] checked --------- */

static void test_relayout_shards(void) {
    maskpack_error e;
    const int64_t lens[2] = {8, 4};
    maskpack_layout *L = NULL, *R[2] = {NULL, NULL}, *bad = NULL;
    CHECK_OK(maskpack_layout_from_lengths(lens, 2, MASKPACK_PLACE_PACKED, 0, NULL, &L, &e), e);
    if (!L) return;
    for (int r = 0; r < 2; r++) CHECK_OK(maskpack_layout_cp_shard(L, 2, r, MASKPACK_CP_ZIGZAG, &R[r], &e), e);
    if (!R[0] || !R[1]) return;
    /* a shard cannot be re-laid packed or padded by itself */
    CHECK_STATUS(maskpack_layout_packed_of(R[0], &bad, &e), MASKPACK_ERR_UNSUPPORTED, e);
    CHECK_STATUS(maskpack_layout_padded_of(R[1], MASKPACK_PLACE_RIGHT, 0, &bad, &e), MASKPACK_ERR_UNSUPPORTED, e);
    CHECK(bad == NULL);
    /* cut the batch into the two shards, then gather them back */
    float x[12 * 2], sh[2][6 * 2], back[12 * 2];
    for (int i = 0; i < 24; i++) x[i] = (float)i, back[i] = -1.0f;
    const int64_t s12[2] = {12, 2}, s6[2] = {6, 2}, s6b[2] = {6, 3};
    maskpack_tensor xt = maskpack_tensor_contiguous(x, MASKPACK_F32, 2, s12),
                    bt = maskpack_tensor_contiguous(back, MASKPACK_F32, 2, s12);
    maskpack_tensor st[2] = {maskpack_tensor_contiguous(sh[0], MASKPACK_F32, 2, s6),
                             maskpack_tensor_contiguous(sh[1], MASKPACK_F32, 2, s6)};
    for (int r = 0; r < 2; r++) CHECK_OK(maskpack_relayout(L, R[r], &xt, &st[r], NULL, 1, &e), e);
    maskpack_relayout_plan *P = NULL;
    const maskpack_layout *srcs[2] = {R[0], R[1]};
    CHECK_OK(maskpack_relayout_plan_create(srcs, 2, L, &P, &e), e);
    if (!P) return;
    const maskpack_tensor *xs[2] = {&st[0], &st[1]};
    CHECK_OK(maskpack_relayout_execute(P, xs, &bt, NULL, 2, &e), e);
    CHECK(memcmp(back, x, sizeof x) == 0);
    /* x[1] of another dtype, of another per-token shape; out over x[0] */
    maskpack_tensor x1 = st[1];
    x1.dtype = MASKPACK_I32;
    xs[1] = &x1;
    CHECK_STATUS(maskpack_relayout_execute(P, xs, &bt, NULL, 1, &e), MASKPACK_ERR_DTYPE, e);
    CHECK(strcmp(e.argument, "x[1]") == 0);
    float wide[6 * 3];
    maskpack_tensor x1w = maskpack_tensor_contiguous(wide, MASKPACK_F32, 2, s6b);
    xs[1] = &x1w;
    CHECK_STATUS(maskpack_relayout_execute(P, xs, &bt, NULL, 1, &e), MASKPACK_ERR_SHAPE, e);
    CHECK_MSG(e, "x[1]: trailing dimensions (per-token shape) differ from out's");
    xs[1] = &st[1];
    float both[24];
    maskpack_tensor ov = maskpack_tensor_contiguous(both, MASKPACK_F32, 2, s12), x0o = st[0];
    x0o.data = both + 4;
    xs[0] = &x0o;
    CHECK_STATUS(maskpack_relayout_execute(P, xs, &ov, NULL, 1, &e), MASKPACK_ERR_OVERLAP, e);
    maskpack_relayout_plan_free(P);
    for (int r = 0; r < 2; r++) maskpack_layout_free(R[r]);
    maskpack_layout_free(L);
}

/* ---- CP collectives: two ranks simulated in one process ------------------------------------------- */

/* "Rank 1" records what it sends; "rank 0" then receives its own bytes and rank 1's recorded ones. */
static uint8_t g_rank1[512];
static size_t g_rank1_len;
static int record_gather(void *ctx, const void *send, void *recv, size_t bytes) {
    (void)ctx;
    if (bytes > sizeof g_rank1) return -1;
    memcpy(g_rank1, send, bytes);
    g_rank1_len = bytes;
    memcpy(recv, send, bytes);
    memcpy((uint8_t *)recv + bytes, send, bytes);
    return 0;
}
static int pair_gather(void *ctx, const void *send, void *recv, size_t bytes) {
    (void)ctx;
    if (bytes != g_rank1_len) return -1;
    memcpy(recv, send, bytes);
    memcpy((uint8_t *)recv + bytes, g_rank1, bytes);
    return 0;
}
static int self_gather(void *ctx, const void *send, void *recv, size_t bytes) {
    (void)ctx;
    memcpy(recv, send, bytes);
    return 0;
}
/* succeeds `*ctx` times (as a group of one), then fails */
static int countdown_gather(void *ctx, const void *send, void *recv, size_t bytes) {
    int *left = ctx;
    if ((*left)-- <= 0) return -1;
    memcpy(recv, send, bytes);
    return 0;
}
static int failing_gather(void *ctx, const void *send, void *recv, size_t bytes) {
    (void)ctx, (void)send, (void)recv, (void)bytes;
    return -1;
}
static int no_all_to_all(void *ctx, const void *send, void *recv, size_t bytes) {
    (void)ctx, (void)send, (void)recv, (void)bytes;
    return -1;
}

/* rank 0 holds L0 with scheme s0, rank 1 (group size n1) L1 with s1: rank 0's verdict */
static maskpack_status cp_pair(const maskpack_layout *L0, maskpack_cp_scheme s0, const maskpack_layout *L1,
                               maskpack_cp_scheme s1, int n1, maskpack_error *e) {
    maskpack_comm c1 = {NULL, 1, n1, record_gather, no_all_to_all};
    maskpack_error e1;
    (void)maskpack_cp_check(&c1, L1, s1, &e1);
    maskpack_comm c0 = {NULL, 0, 2, pair_gather, no_all_to_all};
    return maskpack_cp_check(&c0, L0, s0, e);
}

static void test_cp_comm(void) {
    maskpack_error e;
    const int64_t a[2] = {8, 4}, b[2] = {4, 8}, c[3] = {4, 4, 4};
    maskpack_layout *A = NULL, *B = NULL, *C = NULL, *W = NULL, *SP = NULL;
    CHECK_OK(maskpack_layout_from_lengths(a, 2, MASKPACK_PLACE_PACKED, 0, NULL, &A, &e), e);
    CHECK_OK(maskpack_layout_from_lengths(b, 2, MASKPACK_PLACE_PACKED, 0, NULL, &B, &e), e);
    CHECK_OK(maskpack_layout_from_lengths(c, 3, MASKPACK_PLACE_PACKED, 0, NULL, &C, &e), e);
    maskpack_rule bi = maskpack_rule_default();
    bi.causal = 0;
    if (A) CHECK_OK(maskpack_layout_with_rule(A, &bi, &W, &e), e);
    const maskpack_span sp = {0, 1, 3};
    const int64_t pf[2] = {2, 0};
    maskpack_rule rs = maskpack_rule_default();
    rs.spans = &sp;
    rs.n_spans = 1;
    rs.prefix = pf;
    rs.n_prefix = 2;
    if (A) CHECK_OK(maskpack_layout_with_rule(A, &rs, &SP, &e), e);
    if (!A || !B || !C || !W || !SP) return;
    /* the same layout and scheme on both ranks (spans and prefixes in the fingerprint too) */
    CHECK_OK(cp_pair(A, MASKPACK_CP_ZIGZAG, A, MASKPACK_CP_ZIGZAG, 2, &e), e);
    CHECK_OK(cp_pair(SP, MASKPACK_CP_ZIGZAG, SP, MASKPACK_CP_ZIGZAG, 2, &e), e);
    /* each difference, named */
    CHECK_STATUS(cp_pair(A, MASKPACK_CP_ZIGZAG, A, MASKPACK_CP_ZIGZAG, 3, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "comm: rank 1 sees a group of 3 ranks, rank 0 one of 2");
    CHECK_STATUS(cp_pair(A, MASKPACK_CP_ZIGZAG, A, MASKPACK_CP_CONTIGUOUS, 2, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "scheme: rank 1 uses CP scheme 1, rank 0 scheme 0");
    CHECK_STATUS(cp_pair(A, MASKPACK_CP_ZIGZAG, B, MASKPACK_CP_ZIGZAG, 2, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "layout: rank 1 holds other sequences than rank 0");
    CHECK_STATUS(cp_pair(A, MASKPACK_CP_ZIGZAG, C, MASKPACK_CP_ZIGZAG, 2, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "layout: rank 1 holds other sequences than rank 0 (3 segments against 2");
    CHECK_STATUS(cp_pair(A, MASKPACK_CP_ZIGZAG, W, MASKPACK_CP_ZIGZAG, 2, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "layout: rank 1's attention rule");
    CHECK_STATUS(cp_pair(A, MASKPACK_CP_ZIGZAG, SP, MASKPACK_CP_ZIGZAG, 2, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "layout: rank 1's attention rule");
    const int64_t wide[2] = {8, 8};
    maskpack_layout *D = NULL;
    CHECK_OK(maskpack_layout_from_lengths(wide, 2, MASKPACK_PLACE_PACKED, 0, NULL, &D, &e), e);
    if (D) {
        CHECK_STATUS(cp_pair(A, MASKPACK_CP_ZIGZAG, D, MASKPACK_CP_ZIGZAG, 2, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
        CHECK_MSG(e, "layout: rank 1 holds a [1, 16] grid, rank 0 a [1, 12] one");
        maskpack_layout_free(D);
    }
    /* the group itself: NULL, a rank outside it, callbacks missing, a failing transport */
    CHECK_STATUS(maskpack_cp_check(NULL, A, MASKPACK_CP_ZIGZAG, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
    maskpack_comm bad = {NULL, 2, 2, pair_gather, no_all_to_all};
    CHECK_STATUS(maskpack_cp_check(&bad, A, MASKPACK_CP_ZIGZAG, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "comm: expected 0 <= rank < size, found rank 2 of size 2");
    bad.rank = -1;
    CHECK_STATUS(maskpack_cp_check(&bad, A, MASKPACK_CP_ZIGZAG, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    bad.rank = 0;
    bad.size = 0;
    CHECK_STATUS(maskpack_cp_check(&bad, A, MASKPACK_CP_ZIGZAG, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    maskpack_comm nocb = {NULL, 0, 1, NULL, no_all_to_all};
    CHECK_STATUS(maskpack_cp_check(&nocb, A, MASKPACK_CP_ZIGZAG, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
    CHECK_MSG(e, "comm: the callbacks all_gather and all_to_all must be set");
    nocb.all_gather = pair_gather;
    nocb.all_to_all = NULL;
    CHECK_STATUS(maskpack_cp_check(&nocb, A, MASKPACK_CP_ZIGZAG, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
    maskpack_comm fails = {NULL, 0, 2, failing_gather, no_all_to_all};
    CHECK_STATUS(maskpack_cp_check(&fails, A, MASKPACK_CP_ZIGZAG, &e), MASKPACK_ERR_COMM, e);
    CHECK_MSG(e, "comm: all_gather of the layout fingerprints failed on rank 0");
    /* a rank that refuses its own arguments still joins the exchange: every rank fails with it */
    {
        maskpack_comm c1 = {NULL, 1, 2, record_gather, no_all_to_all};
        maskpack_error e1;
        float w1[12];
        const int64_t n12b = 12;
        maskpack_tensor wt1 = maskpack_tensor_contiguous(w1, MASKPACK_F32, 1, &n12b);
        g_rank1_len = 0;
        CHECK_STATUS(maskpack_cp_all_gather(&c1, A, MASKPACK_CP_ZIGZAG, NULL, &wt1, NULL, &e1),
                     MASKPACK_ERR_NULL_ARGUMENT, e1);
        CHECK(g_rank1_len > 0); /* it joined the exchange */
        maskpack_comm c0 = {NULL, 0, 2, pair_gather, no_all_to_all};
        CHECK_STATUS(maskpack_cp_check(&c0, A, MASKPACK_CP_ZIGZAG, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
        CHECK_MSG(e, "comm: rank 1 refused its arguments (MASKPACK_ERR_NULL_ARGUMENT)");
    }
    /* a group of one: all_gather is a copy; then each of its argument checks */
    {
        maskpack_comm one = {NULL, 0, 1, self_gather, no_all_to_all};
        float src[12], dst[12], two[24];
        for (int i = 0; i < 12; i++) src[i] = (float)i, dst[i] = -1.0f;
        const int64_t n12 = 12, n11 = 11;
        maskpack_tensor ps = maskpack_tensor_contiguous(src, MASKPACK_F32, 1, &n12),
                        pd = maskpack_tensor_contiguous(dst, MASKPACK_F32, 1, &n12);
        CHECK_OK(maskpack_cp_all_gather(&one, A, MASKPACK_CP_ZIGZAG, &ps, &pd, NULL, &e), e);
        CHECK(memcmp(src, dst, sizeof src) == 0);
        CHECK_STATUS(maskpack_cp_all_gather(&one, A, MASKPACK_CP_ZIGZAG, NULL, &pd, NULL, &e),
                     MASKPACK_ERR_NULL_ARGUMENT, e);
        CHECK(strcmp(e.argument, "part") == 0);
        CHECK_STATUS(maskpack_cp_all_gather(&one, A, MASKPACK_CP_ZIGZAG, &ps, NULL, NULL, &e),
                     MASKPACK_ERR_NULL_ARGUMENT, e);
        CHECK(strcmp(e.argument, "whole") == 0);
        CHECK_STATUS(maskpack_cp_all_gather(&one, NULL, MASKPACK_CP_ZIGZAG, &ps, &pd, NULL, &e),
                     MASKPACK_ERR_NULL_ARGUMENT, e);
        maskpack_tensor p11 = maskpack_tensor_contiguous(src, MASKPACK_F32, 1, &n11);
        CHECK_STATUS(maskpack_cp_all_gather(&one, A, MASKPACK_CP_ZIGZAG, &p11, &pd, NULL, &e), MASKPACK_ERR_SHAPE, e);
        CHECK_MSG(e, "part: expected this rank's shard (rank 0 of 1), [12, ...], found [11]");
        maskpack_tensor pst = maskpack_tensor_contiguous(two, MASKPACK_F32, 1, &n12);
        pst.strides[0] = 2;
        CHECK_STATUS(maskpack_cp_all_gather(&one, A, MASKPACK_CP_ZIGZAG, &pst, &pd, NULL, &e), MASKPACK_ERR_SHAPE, e);
        CHECK_MSG(e, "part: expected a contiguous tensor");
        maskpack_layout *P = NULL;
        CHECK_OK(maskpack_layout_from_lengths(a, 2, MASKPACK_PLACE_RIGHT, 0, NULL, &P, &e), e);
        if (P) {
            CHECK_STATUS(maskpack_cp_all_gather(&one, P, MASKPACK_CP_ZIGZAG, &ps, &pd, NULL, &e), MASKPACK_ERR_SHAPE,
                         e);
            CHECK_MSG(e, "part: expected this rank's shard (rank 0 of 1), [2, 8, ...], found [12]");
            const int64_t s2x6[2] = {2, 6}, s3x8[2] = {3, 8};
            maskpack_tensor p26 = maskpack_tensor_contiguous(src, MASKPACK_F32, 2, s2x6);
            CHECK_STATUS(maskpack_cp_all_gather(&one, P, MASKPACK_CP_ZIGZAG, &p26, &pd, NULL, &e), MASKPACK_ERR_SHAPE,
                         e);
            CHECK_MSG(e, "found [2, 6]");
            maskpack_tensor p38 = maskpack_tensor_contiguous(src, MASKPACK_F32, 2, s3x8);
            CHECK_STATUS(maskpack_cp_all_gather(&one, P, MASKPACK_CP_ZIGZAG, &p38, &pd, NULL, &e), MASKPACK_ERR_SHAPE,
                         e);
            CHECK_MSG(e, "found [3, 8]");
            maskpack_layout_free(P);
        }
        /* whole of another length than the batch (8 tokens, 12 given), and no group at all */
        const int64_t odd[2] = {5, 3};
        maskpack_layout *O = NULL;
        CHECK_OK(maskpack_layout_from_lengths(odd, 2, MASKPACK_PLACE_PACKED, 0, NULL, &O, &e), e);
        if (O) {
            const int64_t n8 = 8;
            maskpack_tensor p8 = maskpack_tensor_contiguous(src, MASKPACK_F32, 1, &n8);
            CHECK_STATUS(maskpack_cp_all_gather(&one, O, MASKPACK_CP_ZIGZAG, &p8, &pd, NULL, &e), MASKPACK_ERR_SHAPE,
                         e);
            CHECK_MSG(e, "expected leading dimension 8 (tokens of a packed layout), found shape [12]");
            maskpack_layout_free(O);
        }
        CHECK_STATUS(maskpack_cp_all_gather(NULL, A, MASKPACK_CP_ZIGZAG, &ps, &pd, NULL, &e),
                     MASKPACK_ERR_NULL_ARGUMENT, e);
        CHECK(strcmp(e.argument, "comm") == 0);
    }
    /* the transport failing on the shards, after the agreement went through */
    {
        int left = 1;
        maskpack_comm one = {&left, 0, 1, countdown_gather, no_all_to_all};
        float src[12], dst[12];
        const int64_t n12 = 12;
        maskpack_tensor ps = maskpack_tensor_contiguous(src, MASKPACK_F32, 1, &n12),
                        pd = maskpack_tensor_contiguous(dst, MASKPACK_F32, 1, &n12);
        CHECK_STATUS(maskpack_cp_all_gather(&one, A, MASKPACK_CP_ZIGZAG, &ps, &pd, NULL, &e), MASKPACK_ERR_COMM, e);
        CHECK_MSG(e, "comm: all_gather of the shards failed on rank 0");
    }
    /* all_gather of shards: the transport failing after the agreement */
    float part[6], whole[12];
    const int64_t p6 = 6, w12 = 12;
    maskpack_tensor pt = maskpack_tensor_contiguous(part, MASKPACK_F32, 1, &p6),
                    wt = maskpack_tensor_contiguous(whole, MASKPACK_F32, 1, &w12);
    CHECK_STATUS(maskpack_cp_all_gather(&fails, A, MASKPACK_CP_ZIGZAG, &pt, &wt, NULL, &e), MASKPACK_ERR_COMM, e);
    maskpack_layout_free(A);
    maskpack_layout_free(B);
    maskpack_layout_free(C);
    maskpack_layout_free(W);
    maskpack_layout_free(SP);
}

/* ---- NULL pointers of the other calls ------------------------------------------------------------ */

#define EXPECT_NULL(name, call)                                                                                        \
    do {                                                                                                               \
        memset(&e, 0, sizeof e);                                                                                       \
        const maskpack_status s_ = (call);                                                                             \
        CHECK_EQ(s_, MASKPACK_ERR_NULL_ARGUMENT);                                                                      \
        if (strcmp(e.argument, (name)) != 0) {                                                                         \
            fprintf(stderr, "%s:%d: %s named '%s', expected '%s'\n", __FILE__, __LINE__, #call, e.argument, (name));   \
            CHECK(0);                                                                                                  \
        }                                                                                                              \
    } while (0)

static void test_null_pointers(const maskpack_layout *L) {
    maskpack_error e;
    int32_t i32[64];
    int64_t i64v[64];
    int64_t three = 3, n64 = 64;
    maskpack_tensor t3 = maskpack_tensor_contiguous(i32, MASKPACK_I32, 1, &three);
    maskpack_tensor t64 = maskpack_tensor_contiguous(i64v, MASKPACK_I64, 1, &n64);
    maskpack_layout *out = NULL;
    int64_t a = 0, b = 0;
    size_t count = 0;

    /* derived tensors */
    EXPECT_NULL("layout", maskpack_block_mask_dims(NULL, 4, 4, &a, &b, &e));
    EXPECT_NULL("kv_blocks", maskpack_block_mask_dims(L, 4, 4, &a, NULL, &e));
    EXPECT_NULL("layout", maskpack_magi_slices(NULL, i32, i32, i32, 4, &count, &e));
    EXPECT_NULL("k_ranges", maskpack_magi_slices(L, i32, NULL, i32, 4, &count, &e));
    EXPECT_NULL("types", maskpack_magi_slices(L, i32, i32, NULL, 4, &count, &e));
    EXPECT_NULL("layout", maskpack_mask2d(NULL, &t64, &e));
    EXPECT_NULL("layout", maskpack_cu_seqlens(NULL, MASKPACK_CU_TE, 0, &t3, &e));
    EXPECT_NULL("layout", maskpack_cu_seqlens_padded(NULL, &t3, &e));
    EXPECT_NULL("out", maskpack_cu_seqlens_padded(L, NULL, &e));
    EXPECT_NULL("layout", maskpack_seqlens(NULL, 0, &t3, &e));
    EXPECT_NULL("out", maskpack_seqlens(L, 0, NULL, &e));
    EXPECT_NULL("out", maskpack_position_ids(L, NULL, &e));
    EXPECT_NULL("layout", maskpack_segment_ids(NULL, &t64, &e));
    EXPECT_NULL("out", maskpack_segment_ids(L, NULL, &e));
    EXPECT_NULL("out", maskpack_valid_indices(L, NULL, &e));
    EXPECT_NULL("layout", maskpack_last_token_index(NULL, &t3, &e));
    EXPECT_NULL("out", maskpack_last_token_index(L, NULL, &e));

    /* derived tensors into outputs of the wrong extent: refused naming out */
    int64_t n7 = T - 1, n9 = T + 1;
    maskpack_tensor short_out = maskpack_tensor_contiguous(i64v, MASKPACK_I64, 1, &n7);
    maskpack_tensor long_out = maskpack_tensor_contiguous(i64v, MASKPACK_I64, 1, &n9);
    CHECK_STATUS(maskpack_position_ids(L, &short_out, &e), MASKPACK_ERR_SHAPE, e);
    CHECK(strcmp(e.argument, "out") == 0);
    CHECK_STATUS(maskpack_segment_ids(L, &long_out, &e), MASKPACK_ERR_SHAPE, e);
    CHECK(strcmp(e.argument, "out") == 0);
    CHECK_STATUS(maskpack_valid_indices(L, &short_out, &e), MASKPACK_ERR_SHAPE, e);
    CHECK(strcmp(e.argument, "out") == 0);
    CHECK_STATUS(maskpack_last_token_index(L, &long_out, &e), MASKPACK_ERR_SHAPE, e);
    CHECK(strcmp(e.argument, "out") == 0);

    /* CP shards of a padded [2, 5] grid: rows of 5 columns split in 2*cp = 4 or cp = 2 parts */
    const int64_t lens53[2] = {5, 3};
    maskpack_layout *R = NULL;
    CHECK_OK(maskpack_layout_from_lengths(lens53, 2, MASKPACK_PLACE_RIGHT, 0, NULL, &R, &e), e);
    if (R) {
        int64_t n10 = 10;
        maskpack_tensor idx = maskpack_tensor_contiguous(i64v, MASKPACK_I64, 1, &n10);
        CHECK_STATUS(maskpack_cp_shard_indices(R, 2, 0, MASKPACK_CP_ZIGZAG, &idx, &e), MASKPACK_ERR_INVALID_ARGUMENT,
                     e);
        CHECK_MSG(e, "row width 5 is not divisible by 2*cp = 4");
        CHECK_STATUS(maskpack_cp_shard_indices(R, 2, 0, MASKPACK_CP_CONTIGUOUS, &idx, &e),
                     MASKPACK_ERR_INVALID_ARGUMENT, e);
        CHECK_MSG(e, "row width 5 is not divisible by cp = 2");
        maskpack_layout_free(R);
    }

    /* layouts and CP shards */
    EXPECT_NULL("multiple", maskpack_cp_multiple(2, 1, MASKPACK_CP_ALIGN_VERL, NULL, &e));
    EXPECT_NULL("layout", maskpack_layout_pad_to_multiple(NULL, 4, &out, &e));
    EXPECT_NULL("out", maskpack_layout_pad_to_multiple(L, 4, NULL, &e));
    EXPECT_NULL("layout", maskpack_cp_shard_indices(NULL, 2, 0, MASKPACK_CP_ZIGZAG, &t64, &e));
    EXPECT_NULL("out", maskpack_cp_shard_indices(L, 2, 0, MASKPACK_CP_ZIGZAG, NULL, &e));
    EXPECT_NULL("layout", maskpack_layout_cp_shard(NULL, 2, 0, MASKPACK_CP_ZIGZAG, &out, &e));
    EXPECT_NULL("out", maskpack_layout_cp_shard(L, 2, 0, MASKPACK_CP_ZIGZAG, NULL, &e));
    EXPECT_NULL("layout", maskpack_cp_last_token(NULL, 2, MASKPACK_CP_ZIGZAG, &t3, &t3, &e));
    EXPECT_NULL("rank", maskpack_cp_last_token(L, 2, MASKPACK_CP_ZIGZAG, NULL, &t3, &e));
    EXPECT_NULL("local", maskpack_cp_last_token(L, 2, MASKPACK_CP_ZIGZAG, &t3, NULL, &e));
    EXPECT_NULL("out", maskpack_layout_from_cu_seqlens_qk(&t3, &t3, MASKPACK_CU_TE, NULL, NULL, &e));
    EXPECT_NULL("cu_seqlens_q", maskpack_layout_from_cu_seqlens_qk(NULL, &t3, MASKPACK_CU_TE, NULL, &out, &e));
    EXPECT_NULL("mask", maskpack_layout_from_mask4d(NULL, MASKPACK_MASK_KEEP, &out, &e));
    EXPECT_NULL("mask", maskpack_mask2d_from_mask4d(NULL, MASKPACK_MASK_KEEP, &t64, &e));
    EXPECT_NULL("left", maskpack_window_from_hf(4, NULL, &b, &e));
    EXPECT_NULL("right", maskpack_window_from_hf(4, &a, NULL, &e));
    EXPECT_NULL("left", maskpack_window_from_gym(4, NULL, &b, &e));
    EXPECT_NULL("right", maskpack_window_from_gym(4, &a, NULL, &e));
    EXPECT_NULL("layout", maskpack_layout_with_rule(NULL, NULL, &out, &e));
    EXPECT_NULL("out", maskpack_layout_with_rule(L, NULL, NULL, &e));
    EXPECT_NULL("layout", maskpack_layout_clone(NULL, &out, &e));
    maskpack_segment seg;
    EXPECT_NULL("layout", maskpack_layout_segment(NULL, 0, &seg, &e));
    EXPECT_NULL("out", maskpack_layout_segment(L, 0, NULL, &e));
    maskpack_npu_argset args;
    memset(&args, 0, sizeof args);
    EXPECT_NULL("layout", maskpack_npu_atten_mask(NULL, &args, &t64, &e));
    EXPECT_NULL("out", maskpack_npu_atten_mask(L, &args, NULL, &e));
    /* a padded grid of empty rows: no B*S call exists */
    const int64_t zero_lens[2] = {0, 0};
    maskpack_layout *Z = NULL;
    CHECK_OK(maskpack_layout_from_lengths(zero_lens, 2, MASKPACK_PLACE_RIGHT, 0, NULL, &Z, &e), e);
    if (Z) {
        CHECK_STATUS(maskpack_npu_args(Z, MASKPACK_NPU_BSND, 0.125, 0, &args, &e), MASKPACK_ERR_NOT_REPRESENTABLE, e);
        CHECK_MSG(e, "npu_fusion_attention needs B, Sq, Skv >= 1, found B=2 Sq=0");
        maskpack_layout_free(Z);
    }
    /* hand-made argsets: no mask, a TND full mask, an unknown kind, a shape from another layout */
    const maskpack_npu_mask_kind kinds[4] = {MASKPACK_NPU_MASK_NONE, MASKPACK_NPU_MASK_FULL, (maskpack_npu_mask_kind)9,
                                             MASKPACK_NPU_MASK_FULL};
    const maskpack_status kind_status[4] = {MASKPACK_ERR_INVALID_ARGUMENT, MASKPACK_ERR_UNSUPPORTED,
                                            MASKPACK_ERR_INVALID_ARGUMENT, MASKPACK_ERR_SHAPE};
    const char *kind_msg[4] = {"NONE, pass atten_mask=None", "a TND full mask is never emitted",
                               "expected NONE, COMPRESSED, PREFIX_COMPRESSED or FULL, found 9",
                               "args from another layout?"};
    for (int k = 0; k < 4; k++) {
        memset(&args, 0, sizeof args);
        args.mask_kind = kinds[k];
        args.input_layout = k == 1 ? MASKPACK_NPU_TND : MASKPACK_NPU_BSND;
        args.mask_ndim = 4;
        CHECK_STATUS(maskpack_npu_atten_mask(L, &args, &t64, &e), kind_status[k], e);
        CHECK_MSG(e, kind_msg[k]);
    }

    /* labels, relayout */
    EXPECT_NULL("layout", maskpack_shift_labels(NULL, &t64, -100, &t64, &e));
    EXPECT_NULL("labels", maskpack_shift_labels(L, NULL, -100, &t64, &e));
    EXPECT_NULL("out", maskpack_shift_labels(L, &t64, -100, NULL, &e));
    double den = 0;
    EXPECT_NULL("layout", maskpack_loss_weights(NULL, &t64, -100, MASKPACK_LOSS_TOKEN, &t64, &den, &e));
    EXPECT_NULL("out", maskpack_loss_weights(L, &t64, -100, MASKPACK_LOSS_TOKEN, NULL, &den, &e));
    EXPECT_NULL("denominator", maskpack_loss_weights(L, &t64, -100, MASKPACK_LOSS_TOKEN, &t64, NULL, &e));
    EXPECT_NULL("layout", maskpack_layout_packed_of(NULL, &out, &e));
    EXPECT_NULL("out", maskpack_layout_packed_of(L, NULL, &e));
    EXPECT_NULL("layout", maskpack_layout_padded_of(NULL, MASKPACK_PLACE_RIGHT, 0, &out, &e));
    EXPECT_NULL("out", maskpack_layout_padded_of(L, MASKPACK_PLACE_RIGHT, 0, NULL, &e));
    maskpack_relayout_plan *P = NULL;
    EXPECT_NULL("sources", maskpack_relayout_plan_create(NULL, 1, L, &P, &e));
    EXPECT_NULL("dst", maskpack_relayout_plan_create(&L, 1, NULL, &P, &e));
    EXPECT_NULL("out", maskpack_relayout_plan_create(&L, 1, L, NULL, &e));
    CHECK_OK(maskpack_relayout_plan_create(&L, 1, L, &P, &e), e);
    const maskpack_tensor *xs[1] = {&t64};
    EXPECT_NULL("plan", maskpack_relayout_execute(NULL, xs, &t64, NULL, 1, &e));
    EXPECT_NULL("x", maskpack_relayout_execute(P, NULL, &t64, NULL, 1, &e));
    EXPECT_NULL("out", maskpack_relayout_execute(P, xs, NULL, NULL, 1, &e));
    EXPECT_NULL("out", maskpack_relayout_plan_adjoint(P, 0, NULL, &e));
    maskpack_relayout_plan_free(P);

    /* plans */
    const int64_t lens[3] = {3, 5, 2};
    maskpack_plan_options po = maskpack_plan_options_default(8);
    maskpack_plan *plan = NULL;
    CHECK_OK(maskpack_plan_create(lens, 3, &po, &plan, &e), e);
    maskpack_plan_piece pieces[4];
    maskpack_plan_report rep;
    EXPECT_NULL("plan", maskpack_plan_row(NULL, 0, pieces, 4, &count, &e));
    EXPECT_NULL("count", maskpack_plan_row(plan, 0, pieces, 4, NULL, &e));
    EXPECT_NULL("plan", maskpack_plan_row_layout(NULL, 0, NULL, &out, &e));
    EXPECT_NULL("out", maskpack_plan_row_layout(plan, 0, NULL, NULL, &e));
    EXPECT_NULL("plan", maskpack_plan_microbatch_layout(NULL, 0, 0, NULL, &out, &e));
    EXPECT_NULL("out", maskpack_plan_microbatch_layout(plan, 0, 0, NULL, NULL, &e));
    EXPECT_NULL("plan", maskpack_plan_get_report(NULL, &rep, &e));
    EXPECT_NULL("report", maskpack_plan_get_report(plan, NULL, &e));
    maskpack_plan_free(plan);

    /* readers and writers */
    uint8_t *buf = NULL;
    size_t len = 0;
    mpio_arrayset set;
    mpio_array arr;
    EXPECT_NULL("path", mpio_read_file(NULL, 16, &buf, &len, &e));
    EXPECT_NULL("buf", mpio_read_file("x", 16, NULL, &len, &e));
    EXPECT_NULL("len", mpio_read_file("x", 16, &buf, NULL, &e));
    EXPECT_NULL("path", mpio_write_file(NULL, "", 0, &e));
    EXPECT_NULL("buf", mpio_write_file("x", NULL, 4, &e));
    EXPECT_NULL("out", mpio_parse_any("", 0, NULL, &e));
    EXPECT_NULL("out", mpio_npy_parse("", 0, NULL, &e));
    EXPECT_NULL("buf", mpio_npy_parse(NULL, 4, &arr, &e));
    EXPECT_NULL("buf", mpio_npy_encode(&t3, NULL, &len, &e));
    EXPECT_NULL("len", mpio_npy_encode(&t3, &buf, NULL, &e));
    EXPECT_NULL("out", mpio_npz_parse("", 0, NULL, &e));
    EXPECT_NULL("buf", mpio_npz_parse(NULL, 4, &set, &e));
    EXPECT_NULL("out", mpio_npz_parse_member("", 0, "a", NULL, &e));
    EXPECT_NULL("name", mpio_npz_parse_member("", 0, NULL, &arr, &e));
    const mpio_named_tensor item = {"a", t3};
    EXPECT_NULL("buf", mpio_npz_encode(&item, 1, 0, NULL, &len, &e));
    EXPECT_NULL("len", mpio_npz_encode(&item, 1, 0, &buf, NULL, &e));
    EXPECT_NULL("items", mpio_npz_encode(NULL, 1, 0, &buf, &len, &e));
    EXPECT_NULL("out", mpio_safetensors_parse("", 0, NULL, &e));
    EXPECT_NULL("buf", mpio_safetensors_parse(NULL, 4, &set, &e));
    EXPECT_NULL("buf", mpio_safetensors_encode(&item, 1, NULL, &len, &e));
    EXPECT_NULL("len", mpio_safetensors_encode(&item, 1, &buf, NULL, &e));
    EXPECT_NULL("items", mpio_safetensors_encode(NULL, 1, &buf, &len, &e));
    EXPECT_NULL("layout", mpio_png_encode_layout(NULL, NULL, 0, NULL, &buf, &len, NULL, NULL, &e));
    EXPECT_NULL("buf", mpio_png_encode_layout(L, NULL, 0, NULL, NULL, &len, NULL, NULL, &e));
    EXPECT_NULL("len", mpio_png_encode_layout(L, NULL, 0, NULL, &buf, NULL, NULL, NULL, &e));
    EXPECT_NULL("rows", mpio_png_encode_layout(L, NULL, 2, NULL, &buf, &len, NULL, NULL, &e));
    /* the zip directory's lookups */
    uint8_t *z = NULL;
    size_t zlen = 0;
    CHECK_OK(mpio_npz_encode(&item, 1, 0, &z, &zlen, &e), e);
    mpio_zip *zip = NULL;
    CHECK_OK(mpio_zip_open(z, zlen, &zip, &e), e);
    size_t idx = 0;
    EXPECT_NULL("zip", mpio_zip_find(NULL, "a.npy", &idx, &e));
    EXPECT_NULL("name", mpio_zip_find(zip, NULL, &idx, &e));
    EXPECT_NULL("index", mpio_zip_find(zip, "a.npy", NULL, &e));
    EXPECT_NULL("zip", mpio_zip_extract(NULL, 0, &buf, &len, &e));
    EXPECT_NULL("data", mpio_zip_extract(zip, 0, NULL, &len, &e));
    EXPECT_NULL("len", mpio_zip_extract(zip, 0, &buf, NULL, &e));
    EXPECT_NULL("out", mpio_zip_open(z, zlen, NULL, &e));
    mpio_zip_close(zip);
    free(z);
}

/* ---- Gated DeltaNet guards ------------------------------------------------------------------------ */

typedef struct gdn_case {
    maskpack_tensor q, k, v, g, beta;
    maskpack_gdn_inputs in;
} gdn_case;

/* [T = 4, H, K] q/k, [T, HV, V] v, [T, HV] g/beta over a packed layout of one 4-token sequence. Data
 * points at a small buffer: the guards refuse before anything is read. */
static void gdn_shapes(gdn_case *c, int64_t H, int64_t K, int64_t HV, int64_t V) {
    static float data[64];
    int64_t qs[3] = {4, H, K}, vs[3] = {4, HV, V}, gs[2] = {4, HV};
    c->q = maskpack_tensor_contiguous(data, MASKPACK_F32, 3, qs);
    c->k = c->q;
    c->v = maskpack_tensor_contiguous(data, MASKPACK_F32, 3, vs);
    c->g = maskpack_tensor_contiguous(data, MASKPACK_F32, 2, gs);
    c->beta = c->g;
    c->in = (maskpack_gdn_inputs){&c->q, &c->k, &c->v, &c->g, &c->beta, NULL};
}

static void expect_ws(const maskpack_layout *L, const gdn_case *c, const maskpack_gdn_options *o, maskpack_status want,
                      const char *fragment) {
    size_t bytes = 12345;
    maskpack_error e;
    CHECK_STATUS(maskpack_gdn_workspace_size(L, &c->in, o, 0, &bytes, &e), want, e);
    CHECK_MSG(e, fragment);
}

static void test_gdn_guards(void) {
    const int64_t len = 4;
    maskpack_layout *L = NULL;
    maskpack_error e;
    CHECK_OK(maskpack_layout_from_lengths(&len, 1, MASKPACK_PLACE_PACKED, 0, NULL, &L, &e), e);
    gdn_case c;
    gdn_shapes(&c, 1, 4, 2, 4);
    size_t bytes = 0;
    CHECK_OK(maskpack_gdn_workspace_size(L, &c.in, NULL, 0, &bytes, &e), e); /* the control */
    CHECK(bytes > 0);

    maskpack_gdn_options o = maskpack_gdn_options_default();
    o.chunked = 2;
    expect_ws(L, &c, &o, MASKPACK_ERR_INVALID_ARGUMENT, "opts.chunked: expected 0 or 1, found 2");
    o = maskpack_gdn_options_default();
    o.l2norm = -1;
    expect_ws(L, &c, &o, MASKPACK_ERR_INVALID_ARGUMENT, "opts.l2norm: expected 0 or 1, found -1");
    o = maskpack_gdn_options_default();
    o.scale = NAN;
    expect_ws(L, &c, &o, MASKPACK_ERR_INVALID_ARGUMENT, "opts.scale: expected a finite number");
    o = maskpack_gdn_options_default();
    o.isa = (maskpack_isa)9;
    expect_ws(L, &c, &o, MASKPACK_ERR_INVALID_ARGUMENT, "isa: expected AUTO (0), REF (1), AVX512 (2) or AVX2 (3)");

    /* zero key heads, a zero key head dim, zero value heads, a zero value head dim */
    gdn_shapes(&c, 0, 4, 2, 4);
    expect_ws(L, &c, NULL, MASKPACK_ERR_SHAPE, "q: expected at least one head and a head dim >= 1");
    gdn_shapes(&c, 1, 0, 2, 4);
    expect_ws(L, &c, NULL, MASKPACK_ERR_SHAPE, "found H = 1, K = 0");
    gdn_shapes(&c, 1, 4, 0, 4);
    expect_ws(L, &c, NULL, MASKPACK_ERR_SHAPE, "v: expected at least one head and a head dim >= 1");
    gdn_shapes(&c, 1, 4, 2, 0);
    expect_ws(L, &c, NULL, MASKPACK_ERR_SHAPE, "found HV = 2, V = 0");
    /* 3 value heads over 2 key heads */
    gdn_shapes(&c, 2, 4, 3, 4);
    expect_ws(L, &c, NULL, MASKPACK_ERR_SHAPE, "multiple of the key heads H = 2, found HV = 3");
    /* head dims whose per-chunk buffers overflow int64, and ones whose workspace would */
    gdn_shapes(&c, 1, (int64_t)1 << 40, 1, 4);
    expect_ws(L, &c, NULL, MASKPACK_ERR_OVERFLOW, "are too large");
    gdn_shapes(&c, 1, (int64_t)1 << 24, 1, (int64_t)1 << 24);
    expect_ws(L, &c, NULL, MASKPACK_ERR_OVERFLOW, "workspace for K = 16777216, V = 16777216");
    maskpack_layout_free(L);
}

int main(void) {
    const int64_t lens[2] = {5, 3};
    maskpack_layout *L = NULL;
    maskpack_error e;
    CHECK_OK(maskpack_layout_from_lengths(lens, 2, MASKPACK_PLACE_PACKED, 0, NULL, &L, &e), e);
    if (!L) return check_report("test_guards");
    test_gdn_side_ops(L);
    test_gdn_rule(L);
    test_attention(L);
    test_null_pointers(L);
    test_attention_checks(L);
    test_relayout_checks(L);
    test_plan_ranges();
    test_labels_checks(L);
    test_gdn_checks(L);
    test_gdn_guards();
    test_attention_odd_dims();
    test_plan_option_grid();
    test_relayout_shards();
    test_cp_comm();
    maskpack_layout_free(L);
    /* the same calls on the padded [2, 5] grid of the same sequences */
    L = NULL;
    CHECK_OK(maskpack_layout_from_lengths(lens, 2, MASKPACK_PLACE_RIGHT, 0, NULL, &L, &e), e);
    if (!L) return check_report("test_guards");
    g_B = 2;
    g_S = 5;
    test_gdn_side_ops(L);
    test_gdn_rule(L);
    test_attention(L);
    maskpack_layout_free(L);
    return check_report("test_guards");
}
