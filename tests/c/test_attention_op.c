/* test_attention_op.c: the attention operator object (maskpack_attention_op_*) and the team entry
 * points (maskpack_attention_forward_on / _backward_on) against the plain n_threads calls, bit for
 * bit, for every attention kernel this CPU runs, f32 and bf16, on layouts that reach each way the
 * work is dealt out (items one by one, whole units with a tail, the backward's split mode and its
 * tail pieces), on teams of every size up to the op's threads and with the op's own workspace or
 * the caller's; then the refusals: a workspace too small (named size, nothing written), NULL with a
 * size, an ISA this CPU lacks, a team larger than the op, tensors of other heads, head dim or dtype,
 * bad creation arguments, and the one thread limit of the plain calls. */
#include "check.h"

#include <stdint.h>
#include <stdlib.h>

static test_rng rng = {0x9e3779b97f4a7c15ull};
static float rnd_f(void) { return (float)test_rng_signed(&rng); }

/* One problem in its dtype: q, k, v, dout inputs; the forward's out and lse from the plain call. */
typedef struct {
    const maskpack_layout *L;
    int64_t B, S, Skv, Hq, Hkv, D;
    int packed;
    maskpack_dtype dt;
    size_t es, nq, nk, nl; /* element size; elements of q-like, k-like tensors and of lse */
    void *q, *k, *v, *dout;
} prob;

static void *filled(size_t n, size_t es, maskpack_dtype dt) {
    void *p = malloc(n * es + 1);
    for (size_t i = 0; i < n; i++) {
        float f = rnd_f();
        if (dt == MASKPACK_BF16) {
            uint32_t u;
            memcpy(&u, &f, 4);
            uint16_t h = (uint16_t)(u >> 16);
            memcpy((char *)p + i * 2, &h, 2);
        } else {
            memcpy((char *)p + i * 4, &f, 4);
        }
    }
    return p;
}

static prob make(const maskpack_layout *L, int64_t Hq, int64_t Hkv, int64_t D, maskpack_dtype dt) {
    prob p;
    memset(&p, 0, sizeof p);
    p.L = L;
    p.B = maskpack_layout_n_rows(L);
    p.S = maskpack_layout_q_width(L);
    p.Skv = maskpack_layout_kv_width(L);
    p.Hq = Hq, p.Hkv = Hkv, p.D = D;
    p.packed = maskpack_layout_is_packed(L);
    p.dt = dt;
    p.es = maskpack_dtype_size(dt);
    p.nq = (size_t)(p.B * p.S * Hq * D);
    p.nk = (size_t)(p.B * p.Skv * Hkv * D);
    p.nl = (size_t)(p.B * p.S * Hq);
    p.q = filled(p.nq, p.es, dt);
    p.dout = filled(p.nq, p.es, dt);
    p.k = filled(p.nk, p.es, dt);
    p.v = filled(p.nk, p.es, dt);
    return p;
}

static void free_prob(prob *p) {
    free(p->q);
    free(p->k);
    free(p->v);
    free(p->dout);
}

static maskpack_tensor grid(const prob *p, void *data, int kv, int64_t H) {
    int64_t W = kv ? p->Skv : p->S;
    if (p->packed) {
        int64_t s[3] = {W, H, p->D};
        return maskpack_tensor_contiguous(data, p->dt, 3, s);
    }
    int64_t s[4] = {p->B, W, H, p->D};
    return maskpack_tensor_contiguous(data, p->dt, 4, s);
}

static maskpack_tensor lse_of(const prob *p, float *data) {
    if (p->packed) {
        int64_t s[2] = {p->Hq, p->S};
        return maskpack_tensor_contiguous(data, MASKPACK_F32, 2, s);
    }
    int64_t s[3] = {p->B, p->Hq, p->S};
    return maskpack_tensor_contiguous(data, MASKPACK_F32, 3, s);
}

/* Outputs of one forward and backward, pre-filled with a byte pattern so that an element a run
 * fails to write shows as a difference. */
typedef struct {
    void *out, *dq, *dk, *dv;
    float *lse;
} outs;

static outs outs_new(const prob *p, int pattern) {
    outs o;
    o.out = malloc(p->nq * p->es);
    o.dq = malloc(p->nq * p->es);
    o.dk = malloc(p->nk * p->es);
    o.dv = malloc(p->nk * p->es);
    o.lse = malloc(p->nl * sizeof(float) + 1);
    memset(o.out, pattern, p->nq * p->es);
    memset(o.dq, pattern, p->nq * p->es);
    memset(o.dk, pattern, p->nk * p->es);
    memset(o.dv, pattern, p->nk * p->es);
    memset(o.lse, pattern, p->nl * sizeof(float));
    return o;
}

static void outs_free(outs *o) {
    free(o->out);
    free(o->dq);
    free(o->dk);
    free(o->dv);
    free(o->lse);
}

static int same(const prob *p, const outs *a, const outs *b, int grads) {
    int ok = memcmp(a->out, b->out, p->nq * p->es) == 0 && memcmp(a->lse, b->lse, p->nl * sizeof(float)) == 0;
    if (grads)
        ok = ok && memcmp(a->dq, b->dq, p->nq * p->es) == 0 && memcmp(a->dk, b->dk, p->nk * p->es) == 0 &&
             memcmp(a->dv, b->dv, p->nk * p->es) == 0;
    return ok;
}

/* How a run is made: the plain calls at n_threads, the _on calls on a team, or the op on a team. */
enum { PLAIN, ON, OP };

static maskpack_status run(const prob *p, int how, maskpack_isa isa, int n_threads, maskpack_workers *team,
                           maskpack_attention_op *op, void *ws, size_t ws_bytes, outs *o, maskpack_error *e) {
    maskpack_tensor q = grid(p, p->q, 0, p->Hq), k = grid(p, p->k, 1, p->Hkv), v = grid(p, p->v, 1, p->Hkv);
    maskpack_tensor out = grid(p, o->out, 0, p->Hq), dout = grid(p, p->dout, 0, p->Hq), lse = lse_of(p, o->lse);
    maskpack_tensor dq = grid(p, o->dq, 0, p->Hq), dk = grid(p, o->dk, 1, p->Hkv), dv = grid(p, o->dv, 1, p->Hkv);
    const double scale = 0.11, cap = 0;
    maskpack_status s;
    if (how == PLAIN) {
        s = maskpack_attention_forward(p->L, &q, &k, &v, scale, cap, &out, &lse, OPTS_ISA(n_threads, isa), NULL, 0, e);
        if (!s)
            s = maskpack_attention_backward(p->L, &dout, &q, &k, &v, &out, &lse, scale, cap, &dq, &dk, &dv,
                                            OPTS_ISA(n_threads, isa), NULL, 0, e);
    } else if (how == ON) {
        s = maskpack_attention_forward_on(p->L, &q, &k, &v, scale, cap, &out, &lse, OPTS_ISA(1, isa), team, NULL, 0, e);
        if (!s)
            s = maskpack_attention_backward_on(p->L, &dout, &q, &k, &v, &out, &lse, scale, cap, &dq, &dk, &dv,
                                               OPTS_ISA(1, isa), team, NULL, 0, e);
    } else {
        s = maskpack_attention_op_forward(op, &q, &k, &v, scale, cap, &out, &lse, team, ws, ws_bytes, e);
        if (!s)
            s = maskpack_attention_op_backward(op, &dout, &q, &k, &v, &out, &lse, scale, cap, &dq, &dk, &dv, team, ws,
                                               ws_bytes, e);
    }
    return s;
}

static maskpack_layout *lengths(const int64_t *len, size_t n, maskpack_placement pl) {
    maskpack_layout *L = NULL;
    maskpack_error e;
    maskpack_rule r = maskpack_rule_default();
    CHECK_OK(maskpack_layout_from_lengths(len, n, pl, 0, &r, &L, &e), e);
    return L;
}

/* Every kernel, dtype, thread count and team size on one layout and head shape. */
static int n_compared = 0;
static void op_equals_plain(const maskpack_layout *L, int64_t Hq, int64_t Hkv, int64_t D) {
    maskpack_kernel_info ks[32];
    size_t nk = 0;
    maskpack_error e;
    CHECK_OK(maskpack_kernel_list(ks, 32, &nk, &e), e);
    for (size_t x = 0; x < nk && x < 32; x++) {
        if (ks[x].family != MASKPACK_KERNEL_ATTENTION || !ks[x].available) continue;
        for (int d = 0; d < 2; d++) {
            maskpack_dtype dt = d ? MASKPACK_BF16 : MASKPACK_F32;
            if (!(ks[x].dtypes & (1u << dt))) continue;
            prob p = make(L, Hq, Hkv, D, dt);
            for (int nt = 1; nt <= 3; nt++) {
                outs want = outs_new(&p, 0xA5);
                CHECK_OK(run(&p, PLAIN, ks[x].isa, nt, NULL, NULL, NULL, 0, &want, &e), e);
                maskpack_attention_op *op = NULL;
                CHECK_OK(maskpack_attention_op_create(L, Hq, Hkv, D, dt, OPTS_ISA(nt, ks[x].isa), &op, &e), e);
                size_t fb = 0, bb = 0;
                CHECK_OK(maskpack_attention_op_workspace_size(op, 0, &fb, &e), e);
                CHECK_OK(maskpack_attention_op_workspace_size(op, 1, &bb, &e), e);
                size_t wb = fb > bb ? fb : bb;
                char *ws = malloc(wb + 1);
                for (int t = 1; t <= nt; t++) {
                    maskpack_workers *team = NULL;
                    CHECK_OK(maskpack_workers_create(t, &team, &e), e);
                    if (t == nt) { /* the _on calls: the team's size is their thread count */
                        outs got = outs_new(&p, 0x5A);
                        CHECK_OK(run(&p, ON, ks[x].isa, 0, team, NULL, NULL, 0, &got, &e), e);
                        CHECK(same(&p, &want, &got, 1));
                        outs_free(&got);
                    }
                    /* the op: its own workspace twice (kept between runs), then the caller's, unaligned */
                    for (int rep = 0; rep < 3; rep++) {
                        outs got = outs_new(&p, 0x5A + rep);
                        CHECK_OK(run(&p, OP, ks[x].isa, 0, t > 1 ? team : NULL, op, rep == 2 ? ws + 1 : NULL,
                                     rep == 2 ? wb : 0, &got, &e),
                                 e);
                        if (!same(&p, &want, &got, 1))
                            fprintf(stderr, "  differs: %s %s threads %d team %d run %d\n", ks[x].name,
                                    maskpack_dtype_name(dt), nt, t, rep);
                        CHECK(same(&p, &want, &got, 1));
                        n_compared++;
                        outs_free(&got);
                    }
                    maskpack_workers_free(team);
                }
                free(ws);
                maskpack_attention_op_free(op);
                outs_free(&want);
            }
            free_prob(&p);
        }
    }
}

static void test_op_equals_plain(void) {
    /* the small call: 4 documents of 64 tokens (items one by one over the shares) */
    int64_t four[4] = {64, 64, 64, 64};
    maskpack_layout *L = lengths(four, 4, MASKPACK_PLACE_PACKED);
    op_equals_plain(L, 8, 2, 64);
    maskpack_layout_free(L);
    /* one long sequence of one key head: the backward splits its query blocks over the shares */
    int64_t one[1] = {300};
    L = lengths(one, 1, MASKPACK_PLACE_PACKED);
    op_equals_plain(L, 2, 1, 32);
    maskpack_layout_free(L);
    /* many short documents, padded: whole units with a tail item by item, the backward's tail pieces */
    int64_t many[13] = {33, 17, 80, 5, 64, 1, 40, 71, 12, 9, 56, 3, 48};
    L = lengths(many, 13, MASKPACK_PLACE_RIGHT);
    op_equals_plain(L, 2, 2, 16);
    maskpack_layout_free(L);
    CHECK(n_compared > 0);
}

/* Nothing written: every output still holds its pattern byte. */
static int untouched(const prob *p, const outs *o, int pattern) {
    const unsigned char *bufs[5] = {o->out, o->dq, o->dk, o->dv, (const unsigned char *)o->lse};
    size_t n[5] = {p->nq * p->es, p->nq * p->es, p->nk * p->es, p->nk * p->es, p->nl * sizeof(float)};
    for (int b = 0; b < 5; b++)
        for (size_t i = 0; i < n[b]; i++)
            if (bufs[b][i] != (unsigned char)pattern) return 0;
    return 1;
}

static void test_refusals(void) {
    int64_t four[4] = {64, 64, 64, 64};
    maskpack_layout *L = lengths(four, 4, MASKPACK_PLACE_PACKED);
    prob p = make(L, 4, 2, 32, MASKPACK_F32);
    maskpack_error e;
    maskpack_attention_op *op = NULL;
    CHECK_OK(maskpack_attention_op_create(L, 4, 2, 32, MASKPACK_F32, OPTS_ISA(2, MASKPACK_ISA_REF), &op, &e), e);
    maskpack_tensor q = grid(&p, p.q, 0, 4), k = grid(&p, p.k, 1, 2), v = grid(&p, p.v, 1, 2);

    /* a workspace one byte short: the size needed named, nothing written (forward and backward) */
    for (int bwd = 0; bwd < 2; bwd++) {
        size_t need = 0;
        CHECK_OK(maskpack_attention_op_workspace_size(op, bwd, &need, &e), e);
        CHECK(need > 0);
        char *ws = malloc(need);
        outs o = outs_new(&p, 0x77);
        maskpack_tensor out = grid(&p, o.out, 0, 4), lse = lse_of(&p, o.lse), dout = grid(&p, p.dout, 0, 4);
        maskpack_tensor dq = grid(&p, o.dq, 0, 4), dk = grid(&p, o.dk, 1, 2), dv = grid(&p, o.dv, 1, 2);
        if (!bwd)
            CHECK_STATUS(maskpack_attention_op_forward(op, &q, &k, &v, 0, 0, &out, &lse, NULL, ws, need - 1, &e),
                         MASKPACK_ERR_BUFFER_TOO_SMALL, e);
        else
            CHECK_STATUS(maskpack_attention_op_backward(op, &dout, &q, &k, &v, &out, &lse, 0, 0, &dq, &dk, &dv, NULL,
                                                        ws, need - 1, &e),
                         MASKPACK_ERR_BUFFER_TOO_SMALL, e);
        char want[64];
        snprintf(want, sizeof want, "expected at least %zu bytes", need);
        CHECK_MSG(e, want);
        CHECK_MSG(e, "maskpack_attention_op_workspace_size");
        CHECK(untouched(&p, &o, 0x77));
        /* NULL with a size: not the op's own workspace but a mistake */
        CHECK_STATUS(maskpack_attention_op_forward(op, &q, &k, &v, 0, 0, &out, &lse, NULL, NULL, need, &e),
                     MASKPACK_ERR_NULL_ARGUMENT, e);
        CHECK(untouched(&p, &o, 0x77));
        /* exactly the size: accepted */
        if (!bwd) CHECK_OK(maskpack_attention_op_forward(op, &q, &k, &v, 0, 0, &out, &lse, NULL, ws, need, &e), e);
        outs_free(&o);
        free(ws);
    }

    outs o = outs_new(&p, 0x33);
    maskpack_tensor out = grid(&p, o.out, 0, 4), lse = lse_of(&p, o.lse);
    /* a team larger than the op's threads */
    maskpack_workers *team = NULL;
    CHECK_OK(maskpack_workers_create(3, &team, &e), e);
    CHECK_STATUS(maskpack_attention_op_forward(op, &q, &k, &v, 0, 0, &out, &lse, team, NULL, 0, &e),
                 MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "at most the op's 2 threads");
    maskpack_workers_free(team);
    /* tensors of other head counts or dtype than the op's */
    prob p8 = make(L, 8, 2, 32, MASKPACK_F32);
    outs o8 = outs_new(&p8, 0x33);
    maskpack_tensor q8 = grid(&p8, p8.q, 0, 8), k8 = grid(&p8, p8.k, 1, 2), v8 = grid(&p8, p8.v, 1, 2);
    maskpack_tensor out8 = grid(&p8, o8.out, 0, 8), lse8 = lse_of(&p8, o8.lse);
    CHECK_STATUS(maskpack_attention_op_forward(op, &q8, &k8, &v8, 0, 0, &out8, &lse8, NULL, NULL, 0, &e),
                 MASKPACK_ERR_SHAPE, e);
    CHECK_MSG(e, "the op's Hq = 4");
    CHECK(untouched(&p8, &o8, 0x33));
    prob pb = make(L, 4, 2, 32, MASKPACK_BF16);
    outs ob = outs_new(&pb, 0x33);
    maskpack_tensor qb = grid(&pb, pb.q, 0, 4), kb = grid(&pb, pb.k, 1, 2), vb = grid(&pb, pb.v, 1, 2);
    maskpack_tensor outb = grid(&pb, ob.out, 0, 4), lseb = lse_of(&pb, ob.lse);
    CHECK_STATUS(maskpack_attention_op_forward(op, &qb, &kb, &vb, 0, 0, &outb, &lseb, NULL, NULL, 0, &e),
                 MASKPACK_ERR_DTYPE, e);
    CHECK_MSG(e, "the op's dtype float32");
    CHECK(untouched(&pb, &ob, 0x33));
    CHECK(untouched(&p, &o, 0x33));
    maskpack_attention_op_free(op);

    /* creation: bad arguments, and an ISA this CPU lacks */
    maskpack_attention_op *bad = NULL;
    CHECK_STATUS(maskpack_attention_op_create(L, 4, 3, 32, MASKPACK_F32, OPTS_ISA(1, MASKPACK_ISA_REF), &bad, &e),
                 MASKPACK_ERR_SHAPE, e);
    CHECK_STATUS(maskpack_attention_op_create(L, 4, 2, 0, MASKPACK_F32, OPTS_ISA(1, MASKPACK_ISA_REF), &bad, &e),
                 MASKPACK_ERR_UNSUPPORTED, e);
    CHECK_STATUS(maskpack_attention_op_create(L, 4, 2, 32, MASKPACK_I32, OPTS_ISA(1, MASKPACK_ISA_REF), &bad, &e),
                 MASKPACK_ERR_DTYPE, e);
    CHECK_STATUS(maskpack_attention_op_create(L, 4, 2, 32, MASKPACK_F32,
                                              OPTS_ISA(MASKPACK_MAX_THREADS + 1, MASKPACK_ISA_REF), &bad, &e),
                 MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK(bad == NULL);
    maskpack_kernel_info ks[32];
    size_t nk = 0;
    CHECK_OK(maskpack_kernel_list(ks, 32, &nk, &e), e);
    int lacked = 0;
    for (size_t x = 0; x < nk && x < 32; x++) {
        if (ks[x].family != MASKPACK_KERNEL_ATTENTION || ks[x].available) continue;
        maskpack_dtype dt = (ks[x].dtypes & (1u << MASKPACK_BF16)) ? MASKPACK_BF16 : MASKPACK_F32;
        CHECK_STATUS(maskpack_attention_op_create(L, 4, 2, 32, dt, OPTS_ISA(1, ks[x].isa), &bad, &e),
                     MASKPACK_ERR_UNSUPPORTED, e);
        CHECK_MSG(e, maskpack_isa_name(ks[x].isa));
        CHECK(bad == NULL);
        lacked++;
    }
    if (!lacked)
        printf(
            "test_attention_op: this CPU runs every attention kernel (the unsupported-ISA refusal is not reached)\n");

    /* the plain calls' one thread limit: above MASKPACK_MAX_THREADS is refused, never clamped */
    CHECK_STATUS(
        maskpack_attention_forward(L, &q, &k, &v, 0, 0, &out, &lse, OPTS_NT(MASKPACK_MAX_THREADS + 1), NULL, 0, &e),
        MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "n_threads: expected in [1, 256]");
    size_t w64 = 0, w100 = 0;
    CHECK_OK(maskpack_attention_forward_workspace(L, &q, &k, &v, OPTS_NT(64), &w64, &e), e);
    CHECK_OK(maskpack_attention_forward_workspace(L, &q, &k, &v, OPTS_NT(100), &w100, &e), e);
    CHECK(w100 > w64); /* 100 threads get 100 areas (no silent clamp to 64) */
    CHECK(untouched(&p, &o, 0x33));

    outs_free(&o);
    outs_free(&o8);
    outs_free(&ob);
    free_prob(&p);
    free_prob(&p8);
    free_prob(&pb);
    maskpack_layout_free(L);
}

int main(void) {
    test_refusals();
    test_op_equals_plain();
    return check_report("test_attention_op");
}
