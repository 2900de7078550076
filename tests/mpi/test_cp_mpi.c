/* test_cp_mpi.c: the C API across real processes, run under mpirun with 2 and 4 ranks: every rank's
 * zigzag and contiguous shard all-gathered into the whole packed and padded batch equals the
 * single-process tensor; ranks whose layouts disagree, or one rank's wrong part, fail on every rank
 * with the same status (never a hang). Exit status 0 on every rank when every check passed. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "maskpack.h"
#include "maskpack_mpi.h"

static int failures = 0, rank_ = 0;

#define CHECK(cond)                                                                                                    \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            fprintf(stderr, "rank %d: %s:%d: CHECK(%s) failed\n", rank_, __FILE__, __LINE__, #cond);                   \
            failures++;                                                                                                \
        }                                                                                                              \
    } while (0)

static maskpack_layout *aligned(const int64_t *lengths, size_t n, int packed, int64_t multiple) {
    maskpack_error e;
    maskpack_layout *L = NULL, *A = NULL;
    int64_t width = 0;
    for (size_t i = 0; i < n; i++) width = lengths[i] > width ? lengths[i] : width;
    maskpack_status s = maskpack_layout_from_lengths(lengths, n, packed ? MASKPACK_PLACE_PACKED : MASKPACK_PLACE_RIGHT,
                                                     packed ? 0 : width, NULL, &L, &e);
    if (!s) s = maskpack_layout_pad_to_multiple(L, multiple, &A, &e);
    if (s) fprintf(stderr, "rank %d: layout: %s\n", rank_, e.message);
    maskpack_layout_free(L);
    return A;
}

/* whole [tokens, 3] int64: token t holds (t, 10t, 100t) for real tokens (the pad value elsewhere) */
static void check_gather(const maskpack_comm *comm, const maskpack_layout *L, maskpack_cp_scheme scheme) {
    maskpack_error e;
    int64_t T = maskpack_layout_n_rows(L) * maskpack_layout_q_width(L), tl = T / comm->size;
    int64_t *idx = calloc((size_t)tl, sizeof *idx), *part = calloc((size_t)(tl * 3), sizeof *part);
    int64_t *whole = calloc((size_t)(T * 3), sizeof *whole), *mask = calloc((size_t)T, sizeof *mask);
    int64_t B = maskpack_layout_n_rows(L), S_local = maskpack_layout_q_width(L) / comm->size;
    int64_t s_idx[1] = {tl}, s_part[2] = {tl, 3}, s_part3[3] = {B, S_local, 3},
            s_whole[3] = {maskpack_layout_n_rows(L), maskpack_layout_q_width(L), 3};
    maskpack_tensor ti = maskpack_tensor_contiguous(idx, MASKPACK_I64, 1, s_idx);
    CHECK(maskpack_cp_shard_indices(L, comm->size, comm->rank, scheme, &ti, &e) == MASKPACK_OK);
    for (int64_t i = 0; i < tl; i++)
        for (int c = 0; c < 3; c++) part[i * 3 + c] = idx[i] * (c == 0 ? 1 : c == 1 ? 10 : 100);
    int packed = maskpack_layout_is_packed(L);
    /* the part is a per-token tensor of the rank's shard layout: [T/cp, 3] packed, [B, S/cp, 3] padded */
    maskpack_tensor tp = packed ? maskpack_tensor_contiguous(part, MASKPACK_I64, 2, s_part)
                                : maskpack_tensor_contiguous(part, MASKPACK_I64, 3, s_part3);
    int64_t s_flat[2] = {T, 3};
    maskpack_tensor tw = packed ? maskpack_tensor_contiguous(whole, MASKPACK_I64, 2, s_flat)
                                : maskpack_tensor_contiguous(whole, MASKPACK_I64, 3, s_whole);
    int64_t pad = -7;
    maskpack_status st = maskpack_cp_all_gather(comm, L, scheme, &tp, &tw, &pad, &e);
    CHECK(st == MASKPACK_OK);
    if (st) fprintf(stderr, "rank %d: %s\n", rank_, e.message);
    int64_t s_mask[2] = {maskpack_layout_n_rows(L), maskpack_layout_q_width(L)};
    maskpack_tensor tm = packed ? maskpack_tensor_contiguous(mask, MASKPACK_I64, 1, &T)
                                : maskpack_tensor_contiguous(mask, MASKPACK_I64, 2, s_mask);
    CHECK(maskpack_mask2d(L, &tm, &e) == MASKPACK_OK);
    int64_t wrong = 0;
    for (int64_t t = 0; t < T; t++)
        for (int c = 0; c < 3; c++) {
            int64_t want = mask[t] ? t * (c == 0 ? 1 : c == 1 ? 10 : 100) : pad;
            wrong += whole[t * 3 + c] != want;
        }
    CHECK(wrong == 0);
    free(idx);
    free(part);
    free(whole);
    free(mask);
}

/* ---- ring attention --------------------------------------------------------------------------- */

/* A comm that counts the point-to-point messages this rank sends, around the MPI one. */
typedef struct counting {
    maskpack_comm inner;
    int sends;
} counting;

static int c_all_gather(void *ctx, const void *s, void *r, size_t b) {
    counting *c = ctx;
    return c->inner.all_gather(c->inner.ctx, s, r, b);
}
static int c_all_to_all(void *ctx, const void *s, void *r, size_t b) {
    counting *c = ctx;
    return c->inner.all_to_all(c->inner.ctx, s, r, b);
}
static int c_start(void *ctx, const void *s, size_t sb, int to, void *r, size_t rb, int from, int tag, void **req) {
    counting *c = ctx;
    c->sends += to >= 0;
    return c->inner.sendrecv_start(c->inner.ctx, s, sb, to, r, rb, from, tag, req);
}
static int c_wait(void *ctx, void *req) {
    counting *c = ctx;
    return c->inner.wait(c->inner.ctx, req);
}

static float rnd(uint64_t *x) {
    *x = *x * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((double)(*x >> 40) / (double)(1ULL << 24) * 2.0 - 1.0);
}

static int close_to(float a, float b, float tol) {
    if (a == b) return 1; /* both -inf for rows that see nothing */
    float d = a > b ? a - b : b - a, m = b > 0 ? b : -b;
    return d <= tol * (1.0f + m);
}

/* Ring attention on this rank's shard against the single-process kernel on the whole batch (every
 * rank computes the reference from the same seeded inputs): out, lse and dq, dk, dv of the shard's
 * tokens. Returns the point-to-point messages this rank sent (forward + backward). */
static int check_ring(const maskpack_comm *mpi, const maskpack_layout *L, maskpack_cp_scheme scheme, int64_t Hq,
                      int64_t Hk, double softcap) {
    counting cc = {*mpi, 0};
    maskpack_comm comm = {&cc, mpi->rank, mpi->size, c_all_gather, c_all_to_all, c_start, c_wait};
    maskpack_error e;
    const int64_t D = 8, B = maskpack_layout_n_rows(L), S = maskpack_layout_q_width(L), T = B * S;
    const int64_t tl = T / comm.size, Sl = S / comm.size;
    const int packed = maskpack_layout_is_packed(L);
    size_t nq = (size_t)(T * Hq * D), nk = (size_t)(T * Hk * D);
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *dout = malloc(nq * 4);
    float *out = malloc(nq * 4), *lse = malloc((size_t)(T * Hq) * 4), *dq = malloc(nq * 4), *dk = malloc(nk * 4),
          *dv = malloc(nk * 4);
    uint64_t seed = 12345;
    for (size_t i = 0; i < nq; i++) q[i] = rnd(&seed), dout[i] = rnd(&seed);
    for (size_t i = 0; i < nk; i++) k[i] = rnd(&seed), v[i] = rnd(&seed);
    /* the whole batch in one process */
    int64_t sq[4] = {B, S, Hq, D}, sk[4] = {B, S, Hk, D}, sl[3] = {B, Hq, S};
    int64_t fq[3] = {T, Hq, D}, fk[3] = {T, Hk, D}, fl[2] = {Hq, T};
#define T4(p, s4, s3)                                                                                                  \
    (packed ? maskpack_tensor_contiguous(p, MASKPACK_F32, 3, s3) : maskpack_tensor_contiguous(p, MASKPACK_F32, 4, s4))
    maskpack_tensor tq = T4(q, sq, fq), tk = T4(k, sk, fk), tv = T4(v, sk, fk), tdo = T4(dout, sq, fq),
                    to = T4(out, sq, fq);
    maskpack_tensor tdq = T4(dq, sq, fq), tdk = T4(dk, sk, fk), tdv = T4(dv, sk, fk);
    maskpack_tensor tl_ = packed ? maskpack_tensor_contiguous(lse, MASKPACK_F32, 2, fl)
                                 : maskpack_tensor_contiguous(lse, MASKPACK_F32, 3, sl);
    CHECK(maskpack_attention_forward(L, &tq, &tk, &tv, 0, softcap, &to, &tl_, NULL, NULL, 0, &e) == MASKPACK_OK);
    CHECK(maskpack_attention_backward(L, &tdo, &tq, &tk, &tv, &to, &tl_, 0, softcap, &tdq, &tdk, &tdv, NULL, NULL, 0,
                                      &e) == MASKPACK_OK);
    /* this rank's shard of every input */
    int64_t *idx = malloc((size_t)tl * sizeof *idx);
    maskpack_tensor ti = maskpack_tensor_contiguous(idx, MASKPACK_I64, 1, &tl);
    CHECK(maskpack_cp_shard_indices(L, comm.size, comm.rank, scheme, &ti, &e) == MASKPACK_OK);
    size_t mq = (size_t)(tl * Hq * D), mk = (size_t)(tl * Hk * D);
    float *lq = malloc(mq * 4), *lk = malloc(mk * 4), *lv = malloc(mk * 4), *ldo = malloc(mq * 4), *lo = malloc(mq * 4);
    float *ll = malloc((size_t)(tl * Hq) * 4), *ldq = malloc(mq * 4), *ldk = malloc(mk * 4), *ldv = malloc(mk * 4);
    for (int64_t i = 0; i < tl; i++) {
        memcpy(lq + i * Hq * D, q + idx[i] * Hq * D, (size_t)(Hq * D) * 4);
        memcpy(ldo + i * Hq * D, dout + idx[i] * Hq * D, (size_t)(Hq * D) * 4);
        memcpy(lk + i * Hk * D, k + idx[i] * Hk * D, (size_t)(Hk * D) * 4);
        memcpy(lv + i * Hk * D, v + idx[i] * Hk * D, (size_t)(Hk * D) * 4);
    }
    int64_t rq[4] = {B, Sl, Hq, D}, rk[4] = {B, Sl, Hk, D}, rl[3] = {B, Hq, Sl};
    int64_t gq[3] = {tl, Hq, D}, gk[3] = {tl, Hk, D}, gl[2] = {Hq, tl};
    maskpack_tensor uq = T4(lq, rq, gq), uk = T4(lk, rk, gk), uv = T4(lv, rk, gk), udo = T4(ldo, rq, gq),
                    uo = T4(lo, rq, gq);
    maskpack_tensor udq = T4(ldq, rq, gq), udk = T4(ldk, rk, gk), udv = T4(ldv, rk, gk);
    maskpack_tensor ul = packed ? maskpack_tensor_contiguous(ll, MASKPACK_F32, 2, gl)
                                : maskpack_tensor_contiguous(ll, MASKPACK_F32, 3, rl);
#undef T4
    maskpack_status st = maskpack_cp_attention_forward(&comm, L, scheme, &uq, &uk, &uv, 0, softcap, &uo, &ul, NULL, &e);
    CHECK(st == MASKPACK_OK);
    if (st) fprintf(stderr, "rank %d: ring forward: %s\n", rank_, e.message);
    st = maskpack_cp_attention_backward(&comm, L, scheme, &udo, &uq, &uk, &uv, &uo, &ul, 0, softcap, &udq, &udk, &udv,
                                        NULL, &e);
    CHECK(st == MASKPACK_OK);
    if (st) fprintf(stderr, "rank %d: ring backward: %s\n", rank_, e.message);
    int64_t bad_o = 0, bad_l = 0, bad_g = 0;
    for (int64_t i = 0; i < tl; i++) {
        for (int64_t x = 0; x < Hq * D; x++) {
            bad_o += !close_to(lo[i * Hq * D + x], out[idx[i] * Hq * D + x], 1e-5f);
            bad_g += !close_to(ldq[i * Hq * D + x], dq[idx[i] * Hq * D + x], 1e-4f);
        }
        for (int64_t x = 0; x < Hk * D; x++) {
            bad_g += !close_to(ldk[i * Hk * D + x], dk[idx[i] * Hk * D + x], 1e-4f);
            bad_g += !close_to(ldv[i * Hk * D + x], dv[idx[i] * Hk * D + x], 1e-4f);
        }
        int64_t b = idx[i] / S, col = idx[i] % S, c = i % Sl;
        for (int64_t h = 0; h < Hq; h++) {
            float got = packed ? ll[h * tl + i] : ll[(b * Hq + h) * Sl + c];
            float want = packed ? lse[h * T + idx[i]] : lse[(b * Hq + h) * S + col];
            bad_l += !close_to(got, want, 1e-5f);
        }
    }
    CHECK(bad_o == 0 && bad_l == 0 && bad_g == 0);
    if (bad_o || bad_l || bad_g)
        fprintf(stderr, "rank %d: ring differs: out %lld, lse %lld, gradients %lld elements\n", rank_, (long long)bad_o,
                (long long)bad_l, (long long)bad_g);
    free(q), free(k), free(v), free(dout), free(out), free(lse), free(dq), free(dk), free(dv), free(idx);
    free(lq), free(lk), free(lv), free(ldo), free(lo), free(ll), free(ldq), free(ldk), free(ldv);
    return cc.sends;
}

static maskpack_layout *with_rule(maskpack_layout *L, int causal, int64_t wl, int64_t wr) {
    maskpack_rule r = maskpack_rule_default();
    r.causal = causal;
    r.window_left = wl;
    r.window_right = wr;
    maskpack_layout *out = NULL;
    maskpack_error e;
    if (maskpack_layout_with_rule(L, &r, &out, &e)) fprintf(stderr, "rank %d: rule: %s\n", rank_, e.message);
    return out;
}

static void ring_tests(const maskpack_comm *comm) {
    const int n = comm->size;
    const int64_t lengths[5] = {37, 5, 64, 20, 3};
    maskpack_layout *packed = aligned(lengths, 5, 1, 2 * n), *padded = aligned(lengths, 5, 0, 2 * n);
    CHECK(packed && padded);
    if (!packed || !padded) return;
    maskpack_layout *bidir = with_rule(packed, 0, -1, -1), *win = with_rule(packed, 1, 2, 0);
    check_ring(comm, packed, MASKPACK_CP_ZIGZAG, 4, 2, 0.0); /* causal, GQA */
    check_ring(comm, padded, MASKPACK_CP_ZIGZAG, 2, 2, 0.0);
    check_ring(comm, packed, MASKPACK_CP_CONTIGUOUS, 2, 1, 5.0); /* softcap, MQA */
    check_ring(comm, bidir, MASKPACK_CP_ZIGZAG, 2, 2, 0.0);
    int sends_causal = check_ring(comm, packed, MASKPACK_CP_CONTIGUOUS, 2, 2, 0.0);
    /* contiguous causal: rank r's block only goes to the ranks after it; a window of 2 keys reaches at
     * most the next rank: fewer messages, the same results */
    int sends_window = check_ring(comm, win, MASKPACK_CP_CONTIGUOUS, 2, 2, 0.0);
    CHECK(sends_window <= sends_causal);
    int total_causal = 0, total_window = 0;
    MPI_Allreduce(&sends_causal, &total_causal, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(&sends_window, &total_window, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    /* with 4 ranks the 64-token sequence spans ranks 1..3: causal sends rank 1's block to rank 3, the
     * window does not */
    if (n >= 4) CHECK(total_window < total_causal);
    /* forward + backward (keys out, gradients back): at most 3 sends per needed pair, and ranks before
     * the last one's sequences never receive a later block under causal contiguous sharding */
    if (n > 1) CHECK(total_causal < 3 * n * (n - 1));

    /* refused alike on every rank: a rule with a prefix (spans and prefixes need the all-gather form),
     * and bf16 on rank 0 only */
    maskpack_error e;
    int64_t prefix[5] = {2, 0, 0, 0, 0};
    maskpack_rule r = maskpack_layout_rule(packed);
    r.prefix = prefix;
    r.n_prefix = (size_t)maskpack_layout_n_segments(packed);
    maskpack_layout *pre = NULL;
    int64_t np_seg = (int64_t)maskpack_layout_n_segments(packed);
    if (np_seg == 5 && maskpack_layout_with_rule(packed, &r, &pre, &e) == MASKPACK_OK) {
        int64_t tl = maskpack_layout_q_width(packed) / n, sh[3] = {tl, 1, 8};
        float *buf = calloc((size_t)(tl * 8), 4), *o = calloc((size_t)(tl * 8), 4);
        maskpack_tensor t = maskpack_tensor_contiguous(buf, MASKPACK_F32, 3, sh),
                        to = maskpack_tensor_contiguous(o, MASKPACK_F32, 3, sh);
        maskpack_status st =
            maskpack_cp_attention_forward(comm, pre, MASKPACK_CP_ZIGZAG, &t, &t, &t, 0, 0, &to, NULL, NULL, &e);
        CHECK(st == MASKPACK_ERR_UNSUPPORTED && strstr(e.message, "prefix") != NULL);
        maskpack_tensor tb = t;
        if (comm->rank == 0) tb.dtype = MASKPACK_BF16;
        st = maskpack_cp_attention_forward(comm, packed, MASKPACK_CP_ZIGZAG, &tb, &t, &t, 0, 0, &to, NULL, NULL, &e);
        CHECK(comm->rank == 0 ? st == MASKPACK_ERR_DTYPE && strstr(e.message, "q: ring attention takes float32")
                              : st == MASKPACK_ERR_DTYPE && strstr(e.message, "rank 0 refused its arguments"));
        free(buf);
        free(o);
    }
    maskpack_layout_free(pre);
    maskpack_layout_free(bidir);
    maskpack_layout_free(win);
    maskpack_layout_free(packed);
    maskpack_layout_free(padded);
}

/* ---- sequence-parallel Gated DeltaNet ---------------------------------------------------------- */

/* maskpack_cp_gdn_forward / _backward on this rank's shard against the single-process kernel on the
 * whole batch: o and every gradient of the shard's tokens, the final states and the initial state's
 * gradient summed over the ranks. Heads 2 / 3 divide by no rank count, as the way is meant for. */
static void check_gdn(const maskpack_comm *comm) {
    const int n = comm->size;
    const int64_t lengths[5] = {37, 5, 64, 20, 3};
    maskpack_layout *L = aligned(lengths, 5, 1, 2 * n);
    CHECK(L != NULL);
    if (!L) return;
    maskpack_error e;
    /* K, V in whole 16-float blocks: the correction runs the vector GEMMs (test_cp_local takes the reference) */
    const int64_t T = maskpack_layout_q_width(L), N = 5, H = 2, HV = 4, K = 16, V = 32, tl = T / n;
    size_t nq = (size_t)(T * H * K), nv = (size_t)(T * HV * V), ng = (size_t)(T * HV), ns = (size_t)(N * HV * K * V);
    float *q = malloc(nq * 4), *k = malloc(nq * 4), *v = malloc(nv * 4), *g = malloc(ng * 4), *b = malloc(ng * 4);
    float *h0 = malloc(ns * 4), *dout = malloc(nv * 4), *dfin = malloc(ns * 4);
    uint64_t seed = 99;
    for (size_t i = 0; i < nq; i++) q[i] = rnd(&seed), k[i] = rnd(&seed);
    for (size_t i = 0; i < nv; i++) v[i] = rnd(&seed), dout[i] = rnd(&seed);
    for (size_t i = 0; i < ng; i++) g[i] = -0.2f * (rnd(&seed) + 1.0f), b[i] = 0.5f + 0.4f * rnd(&seed);
    for (size_t i = 0; i < ns; i++) h0[i] = 0.1f * rnd(&seed), dfin[i] = rnd(&seed);
    /* the whole batch in one process */
    int64_t sq[3] = {T, H, K}, sv[3] = {T, HV, V}, sg[2] = {T, HV}, ss[4] = {N, HV, K, V};
    maskpack_tensor tq = maskpack_tensor_contiguous(q, MASKPACK_F32, 3, sq),
                    tk = maskpack_tensor_contiguous(k, MASKPACK_F32, 3, sq);
    maskpack_tensor tv = maskpack_tensor_contiguous(v, MASKPACK_F32, 3, sv),
                    tg = maskpack_tensor_contiguous(g, MASKPACK_F32, 2, sg);
    maskpack_tensor tb = maskpack_tensor_contiguous(b, MASKPACK_F32, 2, sg),
                    th = maskpack_tensor_contiguous(h0, MASKPACK_F32, 4, ss);
    float *o = malloc(nv * 4), *fin = malloc(ns * 4), *dq = malloc(nq * 4), *dk = malloc(nq * 4), *dv = malloc(nv * 4);
    float *dg = malloc(ng * 4), *db = malloc(ng * 4), *dh = malloc(ns * 4);
    maskpack_tensor to = maskpack_tensor_contiguous(o, MASKPACK_F32, 3, sv),
                    tf = maskpack_tensor_contiguous(fin, MASKPACK_F32, 4, ss);
    maskpack_tensor tdo = maskpack_tensor_contiguous(dout, MASKPACK_F32, 3, sv),
                    tdf = maskpack_tensor_contiguous(dfin, MASKPACK_F32, 4, ss);
    maskpack_tensor tdq = maskpack_tensor_contiguous(dq, MASKPACK_F32, 3, sq),
                    tdk = maskpack_tensor_contiguous(dk, MASKPACK_F32, 3, sq);
    maskpack_tensor tdv = maskpack_tensor_contiguous(dv, MASKPACK_F32, 3, sv),
                    tdg = maskpack_tensor_contiguous(dg, MASKPACK_F32, 2, sg);
    maskpack_tensor tdb = maskpack_tensor_contiguous(db, MASKPACK_F32, 2, sg),
                    tdh = maskpack_tensor_contiguous(dh, MASKPACK_F32, 4, ss);
    maskpack_gdn_inputs in = {&tq, &tk, &tv, &tg, &tb, &th};
    maskpack_gdn_options opts = maskpack_gdn_options_default();
    CHECK(maskpack_gdn_forward(L, &in, &opts, &to, &tf, NULL, 0, &e) == MASKPACK_OK);
    maskpack_gdn_grads gr = {&tdq, &tdk, &tdv, &tdg, &tdb, &tdh};
    CHECK(maskpack_gdn_backward(L, &in, &tdo, &tdf, &opts, &gr, NULL, 0, &e) == MASKPACK_OK);
    /* this rank's shard */
    int64_t *idx = malloc((size_t)tl * sizeof *idx);
    maskpack_tensor ti = maskpack_tensor_contiguous(idx, MASKPACK_I64, 1, &tl);
    CHECK(maskpack_cp_shard_indices(L, n, comm->rank, MASKPACK_CP_ZIGZAG, &ti, &e) == MASKPACK_OK);
    float *lq = malloc((size_t)(tl * H * K) * 4), *lk = malloc((size_t)(tl * H * K) * 4),
          *lv = malloc((size_t)(tl * HV * V) * 4);
    float *lg = malloc((size_t)(tl * HV) * 4), *lb = malloc((size_t)(tl * HV) * 4),
          *ldo = malloc((size_t)(tl * HV * V) * 4);
    for (int64_t i = 0; i < tl; i++) {
        memcpy(lq + i * H * K, q + idx[i] * H * K, (size_t)(H * K) * 4);
        memcpy(lk + i * H * K, k + idx[i] * H * K, (size_t)(H * K) * 4);
        memcpy(lv + i * HV * V, v + idx[i] * HV * V, (size_t)(HV * V) * 4);
        memcpy(ldo + i * HV * V, dout + idx[i] * HV * V, (size_t)(HV * V) * 4);
        memcpy(lg + i * HV, g + idx[i] * HV, (size_t)HV * 4);
        memcpy(lb + i * HV, b + idx[i] * HV, (size_t)HV * 4);
    }
    int64_t lsq[3] = {tl, H, K}, lsv[3] = {tl, HV, V}, lsg[2] = {tl, HV};
    maskpack_tensor uq = maskpack_tensor_contiguous(lq, MASKPACK_F32, 3, lsq),
                    uk = maskpack_tensor_contiguous(lk, MASKPACK_F32, 3, lsq);
    maskpack_tensor uv = maskpack_tensor_contiguous(lv, MASKPACK_F32, 3, lsv),
                    ug = maskpack_tensor_contiguous(lg, MASKPACK_F32, 2, lsg);
    maskpack_tensor ub = maskpack_tensor_contiguous(lb, MASKPACK_F32, 2, lsg),
                    udo = maskpack_tensor_contiguous(ldo, MASKPACK_F32, 3, lsv);
    float *mo = malloc((size_t)(tl * HV * V) * 4), *mfin = malloc(ns * 4), *mdq = malloc((size_t)(tl * H * K) * 4);
    float *mdk = malloc((size_t)(tl * H * K) * 4), *mdv = malloc((size_t)(tl * HV * V) * 4),
          *mdg = malloc((size_t)(tl * HV) * 4);
    float *mdb = malloc((size_t)(tl * HV) * 4), *mdh = malloc(ns * 4), *sdh = malloc(ns * 4);
    maskpack_tensor uo = maskpack_tensor_contiguous(mo, MASKPACK_F32, 3, lsv),
                    uf = maskpack_tensor_contiguous(mfin, MASKPACK_F32, 4, ss);
    maskpack_tensor udq = maskpack_tensor_contiguous(mdq, MASKPACK_F32, 3, lsq),
                    udk = maskpack_tensor_contiguous(mdk, MASKPACK_F32, 3, lsq);
    maskpack_tensor udv = maskpack_tensor_contiguous(mdv, MASKPACK_F32, 3, lsv),
                    udg = maskpack_tensor_contiguous(mdg, MASKPACK_F32, 2, lsg);
    maskpack_tensor udb = maskpack_tensor_contiguous(mdb, MASKPACK_F32, 2, lsg),
                    udh = maskpack_tensor_contiguous(mdh, MASKPACK_F32, 4, ss);
    maskpack_gdn_inputs lin = {&uq, &uk, &uv, &ug, &ub, &th};
    maskpack_status st = maskpack_cp_gdn_forward(comm, L, MASKPACK_CP_ZIGZAG, &lin, &opts, &uo, &uf, &e);
    CHECK(st == MASKPACK_OK);
    if (st) fprintf(stderr, "rank %d: cp gdn forward: %s\n", rank_, e.message);
    maskpack_gdn_grads lgr = {&udq, &udk, &udv, &udg, &udb, &udh};
    st = maskpack_cp_gdn_backward(comm, L, MASKPACK_CP_ZIGZAG, &lin, &udo, &tdf, &opts, &lgr, &e);
    CHECK(st == MASKPACK_OK);
    if (st) fprintf(stderr, "rank %d: cp gdn backward: %s\n", rank_, e.message);
    MPI_Allreduce(mdh, sdh, (int)ns, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    int64_t bad[7] = {0};
    for (int64_t i = 0; i < tl; i++) {
        for (int64_t x = 0; x < HV * V; x++) {
            bad[0] += !close_to(mo[i * HV * V + x], o[idx[i] * HV * V + x], 1e-4f);
            bad[1] += !close_to(mdv[i * HV * V + x], dv[idx[i] * HV * V + x], 1e-3f);
        }
        for (int64_t x = 0; x < H * K; x++) {
            bad[2] += !close_to(mdq[i * H * K + x], dq[idx[i] * H * K + x], 1e-3f);
            bad[2] += !close_to(mdk[i * H * K + x], dk[idx[i] * H * K + x], 1e-3f);
        }
        for (int64_t x = 0; x < HV; x++) {
            bad[3] += !close_to(mdg[i * HV + x], dg[idx[i] * HV + x], 1e-3f);
            bad[3] += !close_to(mdb[i * HV + x], db[idx[i] * HV + x], 1e-3f);
        }
    }
    for (size_t x = 0; x < ns; x++) {
        bad[4] += !close_to(mfin[x], fin[x], 1e-4f);
        bad[5] += !close_to(sdh[x], dh[x], 1e-3f);
    }
    CHECK(bad[0] == 0 && bad[1] == 0 && bad[2] == 0 && bad[3] == 0 && bad[4] == 0 && bad[5] == 0);
    if (bad[0] || bad[1] || bad[2] || bad[3] || bad[4] || bad[5])
        fprintf(stderr, "rank %d: cp gdn differs: o %lld, dv %lld, dq/dk %lld, dg/dbeta %lld, final %lld, dh0 %lld\n",
                rank_, (long long)bad[0], (long long)bad[1], (long long)bad[2], (long long)bad[3], (long long)bad[4],
                (long long)bad[5]);
    /* a padded layout is refused on every rank alike */
    maskpack_layout *pad = aligned(lengths, 5, 0, 2 * n);
    st = maskpack_cp_gdn_forward(comm, pad, MASKPACK_CP_ZIGZAG, &lin, &opts, &uo, NULL, &e);
    CHECK(st == MASKPACK_ERR_UNSUPPORTED && strstr(e.message, "packed (THD) layout") != NULL);
    maskpack_layout_free(pad);
    free(q), free(k), free(v), free(g), free(b), free(h0), free(dout), free(dfin), free(o), free(fin), free(dq),
        free(dk);
    free(dv), free(dg), free(db), free(dh), free(idx), free(lq), free(lk), free(lv), free(lg), free(lb), free(ldo),
        free(mo);
    free(mfin), free(mdq), free(mdk), free(mdv), free(mdg), free(mdb), free(mdh), free(sdh);
    maskpack_layout_free(L);
}

/* maskpack_cp_causal_conv1d / _backward against the single-process conv: y and conv_state bitwise,
 * dx of the shard, dweight and d_prefix summed over the ranks. The 3- and 5-token sequences leave
 * pieces shorter than the kernel at 4 ranks, so prefixes reach back over several pieces. */
static void check_conv(const maskpack_comm *comm) {
    const int n = comm->size;
    const int64_t lengths[5] = {37, 5, 64, 20, 3};
    maskpack_layout *L = aligned(lengths, 5, 1, 2 * n);
    CHECK(L != NULL);
    if (!L) return;
    maskpack_error e;
    const int64_t T = maskpack_layout_q_width(L), N = 5, C = 6, W = 4, tl = T / n;
    float *x = malloc((size_t)(T * C) * 4), *w = malloc((size_t)(C * W) * 4), *pre = malloc((size_t)(N * C * 3) * 4);
    float *dy = malloc((size_t)(T * C) * 4), *dst = malloc((size_t)(N * C * 3) * 4);
    uint64_t seed = 5;
    for (int64_t i = 0; i < T * C; i++) x[i] = rnd(&seed), dy[i] = rnd(&seed);
    for (int64_t i = 0; i < C * W; i++) w[i] = 0.5f * rnd(&seed);
    for (int64_t i = 0; i < N * C * 3; i++) pre[i] = rnd(&seed), dst[i] = rnd(&seed);
    int64_t sx[2] = {T, C}, sw[2] = {C, W}, sp[3] = {N, C, 3};
    maskpack_tensor tx = maskpack_tensor_contiguous(x, MASKPACK_F32, 2, sx),
                    tw = maskpack_tensor_contiguous(w, MASKPACK_F32, 2, sw);
    maskpack_tensor tp = maskpack_tensor_contiguous(pre, MASKPACK_F32, 3, sp),
                    tdy = maskpack_tensor_contiguous(dy, MASKPACK_F32, 2, sx);
    maskpack_tensor tds = maskpack_tensor_contiguous(dst, MASKPACK_F32, 3, sp);
    float *y = malloc((size_t)(T * C) * 4), *st = malloc((size_t)(N * C * 3) * 4), *dx = malloc((size_t)(T * C) * 4);
    float *dw = malloc((size_t)(C * W) * 4), *dp = malloc((size_t)(N * C * 3) * 4);
    maskpack_tensor ty = maskpack_tensor_contiguous(y, MASKPACK_F32, 2, sx),
                    tst = maskpack_tensor_contiguous(st, MASKPACK_F32, 3, sp);
    maskpack_tensor tdx = maskpack_tensor_contiguous(dx, MASKPACK_F32, 2, sx),
                    tdw = maskpack_tensor_contiguous(dw, MASKPACK_F32, 2, sw);
    maskpack_tensor tdp = maskpack_tensor_contiguous(dp, MASKPACK_F32, 3, sp);
    CHECK(maskpack_causal_conv1d(L, &tx, &tw, &tp, 1, NULL, &ty, &tst, &e) == MASKPACK_OK);
    CHECK(maskpack_causal_conv1d_backward(L, &tx, &tw, &tp, 1, &tdy, &tds, NULL, &tdx, &tdw, &tdp, &e) == MASKPACK_OK);
    int64_t *idx = malloc((size_t)tl * sizeof *idx);
    maskpack_tensor ti = maskpack_tensor_contiguous(idx, MASKPACK_I64, 1, &tl);
    CHECK(maskpack_cp_shard_indices(L, n, comm->rank, MASKPACK_CP_ZIGZAG, &ti, &e) == MASKPACK_OK);
    float *lx = malloc((size_t)(tl * C) * 4), *ldy = malloc((size_t)(tl * C) * 4);
    for (int64_t i = 0; i < tl; i++) {
        memcpy(lx + i * C, x + idx[i] * C, (size_t)C * 4);
        memcpy(ldy + i * C, dy + idx[i] * C, (size_t)C * 4);
    }
    int64_t lsx[2] = {tl, C};
    float *my = malloc((size_t)(tl * C) * 4), *mst = malloc((size_t)(N * C * 3) * 4),
          *mdx = malloc((size_t)(tl * C) * 4);
    float *mdw = malloc((size_t)(C * W) * 4), *mdp = malloc((size_t)(N * C * 3) * 4);
    float *sdw = malloc((size_t)(C * W) * 4), *sdp = malloc((size_t)(N * C * 3) * 4);
    maskpack_tensor ux = maskpack_tensor_contiguous(lx, MASKPACK_F32, 2, lsx),
                    udy = maskpack_tensor_contiguous(ldy, MASKPACK_F32, 2, lsx);
    maskpack_tensor uy = maskpack_tensor_contiguous(my, MASKPACK_F32, 2, lsx),
                    ust = maskpack_tensor_contiguous(mst, MASKPACK_F32, 3, sp);
    maskpack_tensor udx = maskpack_tensor_contiguous(mdx, MASKPACK_F32, 2, lsx),
                    udw = maskpack_tensor_contiguous(mdw, MASKPACK_F32, 2, sw);
    maskpack_tensor udp = maskpack_tensor_contiguous(mdp, MASKPACK_F32, 3, sp);
    maskpack_status s = maskpack_cp_causal_conv1d(comm, L, MASKPACK_CP_ZIGZAG, &ux, &tw, &tp, 1, NULL, &uy, &ust, &e);
    CHECK(s == MASKPACK_OK);
    if (s) fprintf(stderr, "rank %d: cp conv: %s\n", rank_, e.message);
    s = maskpack_cp_causal_conv1d_backward(comm, L, MASKPACK_CP_ZIGZAG, &ux, &tw, &tp, 1, &udy, &tds, NULL, &udx, &udw,
                                           &udp, &e);
    CHECK(s == MASKPACK_OK);
    if (s) fprintf(stderr, "rank %d: cp conv backward: %s\n", rank_, e.message);
    MPI_Allreduce(mdw, sdw, (int)(C * W), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(mdp, sdp, (int)(N * C * 3), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    int64_t bad_y = 0, bad_g = 0;
    for (int64_t i = 0; i < tl; i++)
        for (int64_t c = 0; c < C; c++) {
            bad_y += my[i * C + c] != y[idx[i] * C + c]; /* the same kernel over the same inputs: bitwise */
            bad_g += !close_to(mdx[i * C + c], dx[idx[i] * C + c], 1e-5f);
        }
    for (int64_t i = 0; i < N * C * 3; i++) {
        bad_y += mst[i] != st[i];
        bad_g += !close_to(sdp[i], dp[i], 1e-5f);
    }
    for (int64_t i = 0; i < C * W; i++) bad_g += !close_to(sdw[i], dw[i], 1e-4f);
    CHECK(bad_y == 0 && bad_g == 0);
    if (bad_y || bad_g)
        fprintf(stderr, "rank %d: cp conv differs: y/state %lld, gradients %lld\n", rank_, (long long)bad_y,
                (long long)bad_g);
    free(x), free(w), free(pre), free(dy), free(dst), free(y), free(st), free(dx), free(dw), free(dp), free(idx);
    free(lx), free(ldy), free(my), free(mst), free(mdx), free(mdw), free(mdp), free(sdw), free(sdp);
    maskpack_layout_free(L);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm world = MPI_COMM_WORLD;
    maskpack_comm comm;
    maskpack_error e;
    CHECK(maskpack_comm_from_mpi(&world, &comm, &e) == MASKPACK_OK);
    rank_ = comm.rank;
    const int n = comm.size;
    const int64_t lengths[4] = {7, 2, 12, 5};

    /* the whole batch from every rank's shard: packed (zigzag, contiguous) and padded (zigzag) */
    maskpack_layout *packed = aligned(lengths, 4, 1, 2 * n);
    maskpack_layout *padded = aligned(lengths, 4, 0, 2 * n);
    CHECK(packed && padded);
    if (packed && padded) {
        check_gather(&comm, packed, MASKPACK_CP_ZIGZAG);
        check_gather(&comm, packed, MASKPACK_CP_CONTIGUOUS);
        check_gather(&comm, padded, MASKPACK_CP_ZIGZAG);
        CHECK(maskpack_cp_check(&comm, packed, MASKPACK_CP_ZIGZAG, &e) == MASKPACK_OK);
    }

    /* the last rank holds another batch: every rank fails, naming it */
    const int64_t other[4] = {7, 2, 12, 7};
    maskpack_layout *mine = comm.rank == n - 1 ? aligned(other, 4, 1, 2 * n) : aligned(lengths, 4, 1, 2 * n);
    maskpack_status st = maskpack_cp_check(&comm, mine, MASKPACK_CP_ZIGZAG, &e);
    CHECK(st == MASKPACK_ERR_INVALID_ARGUMENT);
    char want[96];
    snprintf(want, sizeof want, "rank %d holds", n - 1);
    CHECK(strstr(e.message, want) != NULL);
    /* another scheme on rank 0 only */
    st = maskpack_cp_check(&comm, packed, comm.rank == 0 ? MASKPACK_CP_CONTIGUOUS : MASKPACK_CP_ZIGZAG, &e);
    CHECK(st == MASKPACK_ERR_INVALID_ARGUMENT && strstr(e.message, "scheme: rank 1 uses CP scheme") != NULL);
    maskpack_layout_free(mine);

    /* rank 0 passes a part of the wrong length: it fails on its own check, the others with it */
    if (packed) {
        int64_t T = maskpack_layout_q_width(packed), tl = T / n + (comm.rank == 0 ? 1 : 0);
        int64_t *part = calloc((size_t)tl, sizeof *part), *whole = calloc((size_t)T, sizeof *whole);
        maskpack_tensor tp = maskpack_tensor_contiguous(part, MASKPACK_I64, 1, &tl);
        maskpack_tensor tw = maskpack_tensor_contiguous(whole, MASKPACK_I64, 1, &T);
        st = maskpack_cp_all_gather(&comm, packed, MASKPACK_CP_ZIGZAG, &tp, &tw, NULL, &e);
        CHECK(st == MASKPACK_ERR_SHAPE);
        CHECK(comm.rank == 0 ? strstr(e.message, "part: expected this rank's shard (rank 0 of") != NULL
                             : strstr(e.message, "rank 0 refused its arguments (MASKPACK_ERR_SHAPE)") != NULL);
        free(part);
        free(whole);
    }
    maskpack_layout_free(packed);
    maskpack_layout_free(padded);
    ring_tests(&comm);
    check_gdn(&comm);
    check_conv(&comm);

    int total = 0;
    MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (comm.rank == 0) printf("test_cp_mpi: %d ranks, %s\n", n, total ? "FAILED" : "all checks passed");
    MPI_Finalize();
    return total ? 1 : 0;
}
