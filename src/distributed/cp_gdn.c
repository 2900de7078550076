/* cp_gdn.c: sequence-parallel Gated DeltaNet over a maskpack_comm. The recurrence is affine in the
 * state, and jointly linear in (values, incoming state): a piece of a sequence maps its incoming
 * state S_in [K, V] (per value head) to
 *     S_out = P S_in + B,        o_t = o1_t + S_in^T phi_t
 * with P [K, K] its decays and rank-1 updates, B and o1 the piece run from a zero state, and phi_t [K]
 * the output it gives from an identity state with zero values. So no rank waits for the piece before
 * its own: every rank runs its pieces once, through the initial states (I | 0) with the values (0 | v)
 * (K + V value columns: the chunks' own work, their inverses and Q K^T, is done once for both), which
 * gives (P | B) and (phi | o1); the small (P, B) of every piece are all-gathered, each rank composes
 * them in sequence order up to its pieces, and corrects its outputs with the true incoming states:
 * phi (K) times S_in (K x V) per token and head, the only state-dependent product left. The backward
 * is the adjoint of the same steps: the kernel's own backward of the one pass, the correction's and
 * the composition's transposes, with the gradients of other ranks' transitions returned to their
 * owners by one all-to-all. MPI programs and the Python binding run this same code. */
#include "cp_internal.h"
#include "../kernels/gdn/gdn_internal.h" /* the GDN kernel table: its GEMMs run the correction */
#include "../kernels/kernel_table.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct gdn_piece {
    int64_t seq, pos, start, len; /* sequence (segment of the whole layout), position in it, local tokens */
} gdn_piece;

typedef struct gdn_plan {
    int n, rank;
    maskpack_layout *mine;
    gdn_piece *pieces; /* every rank's pieces, rank after rank */
    size_t *first;     /* [n + 1]: rank r's pieces are pieces[first[r] .. first[r+1]) */
    size_t width;      /* the most pieces a rank holds */
    size_t n_seq;
    size_t *chain_begin; /* [n_seq + 1] */
    size_t *chain;       /* indices into pieces, each sequence's in position order */
} gdn_plan;

static void plan_free(gdn_plan *P) {
    maskpack_layout_free(P->mine);
    free(P->pieces);
    free(P->first);
    free(P->chain_begin);
    free(P->chain);
    memset(P, 0, sizeof *P);
}

static maskpack_status plan_build(const maskpack_comm *comm, const maskpack_layout *L, maskpack_cp_scheme scheme,
                                  gdn_plan *P, maskpack_error *err) {
    memset(P, 0, sizeof *P);
    P->n = comm->size;
    P->rank = comm->rank;
    P->n_seq = L->n_segments;
    if (!L->packed)
        return mp_fail(err, MASKPACK_ERR_UNSUPPORTED, "layout", -1, -1,
                       "layout: sequence-parallel Gated DeltaNet takes a packed (THD) layout (a padded batch's rows "
                       "are whole sequences: split the heads instead)");
    P->first = mp_calloc_array((size_t)P->n + 1, sizeof *P->first);
    P->chain_begin = mp_calloc_array(P->n_seq + 1, sizeof *P->chain_begin);
    maskpack_status s = (!P->first || !P->chain_begin)
                            ? mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "layout", -1, -1, "out of memory")
                            : MASKPACK_OK;
    size_t total = 0, cap = 0;
    for (int r = 0; r < P->n && !s; r++) {
        maskpack_layout *S = NULL;
        s = maskpack_layout_cp_shard(L, P->n, r, scheme, &S, err);
        if (s) break;
        if (total + S->n_segments > cap) {
            size_t nc = (total + S->n_segments) * 2 + 8;
            gdn_piece *np = mp_alloc_array(nc, sizeof *np);
            if (!np) {
                maskpack_layout_free(S);
                s = mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "layout", -1, -1, "out of memory");
                break;
            }
            if (total) memcpy(np, P->pieces, total * sizeof *np);
            free(P->pieces);
            P->pieces = np;
            cap = nc;
        }
        for (size_t k = 0; k < S->n_segments; k++) {
            const maskpack_segment *g = &S->segs[k];
            P->pieces[total++] = (gdn_piece){g->origin, g->q_pos, g->q_start, g->q_len};
            P->chain_begin[g->origin + 1]++;
        }
        P->first[r + 1] = total;
        if (S->n_segments > P->width) P->width = S->n_segments;
        if (r == P->rank)
            P->mine = S;
        else
            maskpack_layout_free(S);
    }
    if (!s) {
        for (size_t q = 0; q < P->n_seq; q++) P->chain_begin[q + 1] += P->chain_begin[q];
        P->chain = mp_alloc_array(total ? total : 1, sizeof *P->chain);
        size_t *fill = mp_calloc_array(P->n_seq + 1, sizeof *fill);
        if (!P->chain || !fill) {
            free(fill);
            s = mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "layout", -1, -1, "out of memory");
        } else {
            for (size_t i = 0; i < total; i++) { /* insertion by position: a chain holds a few pieces */
                int64_t q = P->pieces[i].seq;
                size_t *c = P->chain + P->chain_begin[q], m = fill[q]++;
                while (m > 0 && P->pieces[c[m - 1]].pos > P->pieces[i].pos) {
                    c[m] = c[m - 1];
                    m--;
                }
                c[m] = i;
            }
            free(fill);
        }
    }
    if (s) plan_free(P);
    return s;
}

/* The rank and local index of global piece i. */
static void owner_of(const gdn_plan *P, size_t i, int *r, size_t *local) {
    int a = 0;
    while (P->first[a + 1] <= i) a++;
    *r = a;
    *local = i - P->first[a];
}

/* ---- small dense algebra on [HV, K, *] blocks ------------------------------------------------------- */
/* Cloned for AVX-512 / AVX2 (MP_CLONES): a composition step is HV*K*K*V multiply-adds, as much as a
 * chunk of the kernel, so it runs at vector width, not the baseline's. */

/* c[h] = a[h] (K x K) @ b[h] (K x V) + d[h] (K x V) per head; i-k-j order so the inner loop streams rows. */
MP_CLONES static void gemm_add(float *c, const float *a, size_t lda, const float *b, size_t ldb, const float *d,
                               size_t ldd, int64_t HV, int64_t K, int64_t V) {
    for (int64_t h = 0; h < HV; h++) {
        float *ch = c + h * K * V;
        const float *ah = a + h * K * lda, *bh = b + h * K * ldb, *dh = d + h * K * ldd;
        for (int64_t i = 0; i < K; i++) {
            float *row = ch + i * V;
            for (int64_t j = 0; j < V; j++) row[j] = dh[i * ldd + j];
            for (int64_t t = 0; t < K; t++) {
                float x = ah[i * lda + t];
                const float *br = bh + t * ldb;
                for (int64_t j = 0; j < V; j++) row[j] += x * br[j];
            }
        }
    }
}

/* dP[h] += G[h] (K x V) @ S[h]^T (V x K); the adjoint of S -> P S with respect to P. */
MP_CLONES static void gemm_gst(float *dp, size_t ldp, const float *G, const float *S, int64_t HV, int64_t K,
                               int64_t V) {
    for (int64_t h = 0; h < HV; h++)
        for (int64_t i = 0; i < K; i++)
            for (int64_t t = 0; t < K; t++) {
                const float *gi = G + (h * K + i) * V, *st = S + (h * K + t) * V;
                float acc = 0.0f;
                for (int64_t j = 0; j < V; j++) acc += gi[j] * st[j];
                dp[(h * K + i) * ldp + t] += acc;
            }
}

/* out[h] = P[h]^T (K x K) @ G[h] (K x V); the adjoint of S -> P S with respect to S. */
MP_CLONES static void gemm_ptg(float *out, const float *p, size_t ldp, const float *G, int64_t HV, int64_t K,
                               int64_t V) {
    memset(out, 0, (size_t)(HV * K * V) * sizeof *out);
    for (int64_t h = 0; h < HV; h++)
        for (int64_t t = 0; t < K; t++) {
            const float *gt = G + (h * K + t) * V;
            for (int64_t i = 0; i < K; i++) {
                float x = p[(h * K + t) * ldp + i];
                float *oi = out + (h * K + i) * V;
                for (int64_t j = 0; j < V; j++) oi[j] += x * gt[j];
            }
        }
}

/* The GEMM the correction runs: the GDN kernel's own (C = cs * Cin + alpha * A B, flags GDN_GEMM_*) of
 * the ISA the options ask for, whose vector entries take head dims in whole 16-float blocks; other
 * dims take the reference entry's. */
typedef void (*gemm_fn)(int64_t m, int64_t n, int64_t kd, float alpha, const float *A, int64_t lda, const float *B,
                        int64_t ldb, float *C, int64_t ldc, unsigned flags, gdn_pf *pf, const float *Cin, float cs);

static gemm_fn pick_gemm(const maskpack_gdn_options *opts, int64_t K, int64_t V) {
    size_t n, i = 0;
    const gdn_kernel *table = gdn_kernels(&n);
    if (K % 16 || V % 16 || mp_kernel_pick(MASKPACK_KERNEL_GDN, MASKPACK_F32, opts->isa, &i, NULL)) i = 0;
    return table[i].gemm_x;
}

/* The correction of a piece's len tokens, per value head h: O_h += Phi_h S_h, with O [len, HV, V] (holding
 * o1), Phi [len, HV, K] inside the pass's outputs [len, HV, K + V] and S its true incoming state
 * [HV, K, V]: one [len x K] x [K x V] product per head. */
static void correct(gemm_fn gemm, float *o, const float *phi, const float *S, int64_t len, int64_t HV, int64_t K,
                    int64_t V) {
    const int64_t W = K + V;
    for (int64_t h = 0; h < HV; h++)
        gemm(len, V, K, 1.0f, phi + h * W, HV * W, S + h * K * V, V, o + h * V, HV * V, GDN_GEMM_ACC, NULL, o + h * V,
             1.0f);
}

/* The correction's adjoint over a piece's tokens, per value head: dPhi_h = dO_h S_h^T and
 * dS_h += Phi_h^T dO_h (Phi and dPhi laid out as the pass's outputs, [len, HV, K + V]). St: scratch of
 * K * V floats (S_h transposed). */
static void correct_adjoint(gemm_fn gemm, float *dphi, float *dS, const float *phi, const float *dO, const float *S,
                            float *St, int64_t len, int64_t HV, int64_t K, int64_t V) {
    const int64_t W = K + V, ldp = HV * W;
    for (int64_t h = 0; h < HV; h++) {
        const float *Sh = S + h * K * V;
        for (int64_t d = 0; d < K; d++)
            for (int64_t j = 0; j < V; j++) St[j * K + d] = Sh[d * V + j];
        gemm(len, K, V, 1.0f, dO + h * V, HV * V, St, K, dphi + h * W, ldp, 0u, NULL, dphi + h * W, 0.0f);
        gemm(K, V, len, 1.0f, phi + h * W, ldp, dO + h * V, HV * V, dS + h * K * V, V, GDN_GEMM_ACC | GDN_GEMM_AT, NULL,
             dS + h * K * V, 1.0f);
    }
}

/* rows x cols floats from src (row stride lds) into dst (row stride ldd), copied or added: the V
 * columns of the pass's (K | V)-wide rows and records, out of them and back. */
static void copy_rows(float *dst, size_t ldd, const float *src, size_t lds, size_t rows, size_t cols) {
    for (size_t r = 0; r < rows; r++) memcpy(dst + r * ldd, src + r * lds, cols * sizeof(float));
}

static void add_rows(float *dst, size_t ldd, const float *src, size_t lds, size_t rows, size_t cols) {
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++) dst[r * ldd + c] += src[r * lds + c];
}

/* a * b * c floats, the product checked (NULL on overflow or when memory runs out), zeroed or not. */
static float *floats(size_t a, size_t b, size_t c, int zero) {
    size_t ab, n;
    if (mp_mul_size(a ? a : 1, b ? b : 1, &ab) || mp_mul_size(ab, c ? c : 1, &n)) return NULL;
    return zero ? mp_calloc_array(n, sizeof(float)) : mp_alloc_array(n, sizeof(float));
}

/* ---- a status folded into an exchange ----------------------------------------------------------------
 * A rank whose own part fails after the agreement (a kernel's refusal, memory) still enters the exchanges
 * that follow, so no peer waits for it; each record it sends ends in a trailer of TRAILER floats holding
 * its status and the argument refused, so every rank that receives it fails too instead of going on with
 * a missing contribution. */

#define TRAILER 8 /* floats: the status (an int32), then the argument's first 27 bytes */

static void put_trailer(float *at, maskpack_status s, const maskpack_error *err) {
    char b[TRAILER * sizeof(float)];
    memset(b, 0, sizeof b);
    int32_t st = (int32_t)s;
    memcpy(b, &st, sizeof st);
    for (size_t i = 0; s && err && i + 1 < sizeof b - sizeof st && err->argument[i]; i++)
        b[sizeof st + i] = err->argument[i];
    memcpy(at, b, sizeof b);
}

/* The first of n records (stride floats each, trailer last) whose sender failed, as this rank's error
 * (OK when none). what: the exchange, for the message. */
static maskpack_status read_trailers(const float *all, size_t stride, int n, const char *what, maskpack_error *err) {
    for (int r = 0; r < n; r++) {
        char b[TRAILER * sizeof(float)];
        memcpy(b, all + (size_t)r * stride + stride - TRAILER, sizeof b);
        int32_t st;
        memcpy(&st, b, sizeof st);
        if (st == 0) continue;
        b[sizeof b - 1] = 0;
        return mp_fail(err, (maskpack_status)st, "comm", r, -1,
                       "comm: rank %d failed its part before the %s (%s at its argument '%s'); every rank stops with "
                       "it",
                       r, what, maskpack_status_name((maskpack_status)st), b + sizeof st);
    }
    return MASKPACK_OK;
}

/* ---- the shared forward steps ----------------------------------------------------------------------- */

typedef struct gdn_run {
    gdn_plan P;
    int64_t T, H, HV, K, V, np;
    size_t st, sk, blk; /* floats of a state [HV,K,V], a transition [HV,K,K], a (P | B) record */
    size_t stride;      /* floats of one rank's records in every: width * blk and the trailer */
    float *hx;          /* [np, HV, K, K + V]: the pass's initial states (I | h0), h0 a first piece's
                             * true initial state, zeros elsewhere */
    float *vx;          /* [T, HV, K + V]: the pass's values (0 | v) */
    float *every;       /* [n, stride]: every piece's (P | B), [width, HV, K, K + V] and a trailer */
    float *states;      /* [np, HV, K, V]: each of this rank's pieces' true incoming state */
    float *ox;          /* [T, HV, K + V]: the pass's outputs (phi | o1): phi the outputs' linear part in
                             * the incoming state, o1 the outputs from zero states (a first piece: its own) */
    float *chainS;      /* per sequence, the state entering each chain element up to ours */
    size_t *chainS_at;  /* [n_seq + 1]: offsets into chainS in states */
    maskpack_tensor hx_t, vx_t, states_t;
} gdn_run;

static void run_free(gdn_run *R) {
    plan_free(&R->P);
    free(R->hx);
    free(R->vx);
    free(R->every);
    free(R->states);
    free(R->ox);
    free(R->chainS);
    free(R->chainS_at);
    memset(R, 0, sizeof *R);
}

static int f32_contiguous(const maskpack_tensor *t) { return t && t->dtype == MASKPACK_F32 && mp_is_contiguous(t); }

/* Local argument checks (no communication). */
static maskpack_status check_args(const maskpack_gdn_inputs *in, maskpack_error *err) {
    MP_CHECK_NULL(err, in, "inputs");
    const maskpack_tensor *t[5] = {in->q, in->k, in->v, in->g, in->beta};
    const char *names[5] = {"q", "k", "v", "g", "beta"};
    for (int i = 0; i < 5; i++) {
        MP_CHECK_NULL(err, t[i], names[i]);
        if (!f32_contiguous(t[i]))
            return mp_fail(err, MASKPACK_ERR_DTYPE, names[i], -1, -1,
                           "%s: sequence-parallel Gated DeltaNet takes contiguous float32 tensors (the passes' "
                           "gradients add up in f32)",
                           names[i]);
    }
    if (in->q->ndim != 3 || in->v->ndim != 3)
        return mp_fail(err, MASKPACK_ERR_SHAPE, "q", -1, -1,
                       "q: expected this rank's packed shard q [T_local, H, K] and v [T_local, HV, V]");
    if (in->initial_state && !f32_contiguous(in->initial_state))
        return mp_fail(err, MASKPACK_ERR_DTYPE, "initial_state", -1, -1,
                       "initial_state: expected a contiguous float32 tensor [N, HV, K, V]");
    return MASKPACK_OK;
}

static const float *rec_of(const gdn_run *R, size_t gi) {
    int r;
    size_t l;
    owner_of(&R->P, gi, &r, &l);
    return R->every + (size_t)r * R->stride + l * R->blk;
}

/* Passes 1 and 2, the exchange and the composition: what the correction and the backward need.
 * Collective: every rank agrees first (layout, scheme, each rank's own checks), so every rank either
 * fails here alike or enters the same exchanges. The kernel runs on team (NULL: the caller alone):
 * the caller's, or one the entry points without a team start for the whole call. */
/* The settings every rank must share for a GDN call: q, k, v, g, beta (dtype, per-token shape), whether
 * an initial state is given, the options that change the values (scale, l2norm). */
static void gdn_settings(mp_cp_call *c, const maskpack_gdn_inputs *in, const maskpack_gdn_options *opts) {
    const maskpack_tensor *t[5] = {NULL, NULL, NULL, NULL, NULL};
    if (in) t[0] = in->q, t[1] = in->k, t[2] = in->v, t[3] = in->g, t[4] = in->beta;
    const char *names[5] = {"q", "k", "v", "g", "beta"};
    for (int i = 0; i < 5; i++)
        mp_cp_tensor(c, names[i], t[i], 1,
                     i < 3 ? "per-token shape [heads, head dim]" : "per-token shape [value heads]");
    mp_cp_set(c, "initial_state", "presence", MP_CP_FLAG, in && in->initial_state);
    int64_t bits = 0;
    if (opts) memcpy(&bits, &opts->scale, sizeof bits);
    mp_cp_set(c, "opts", "scale", MP_CP_REAL, bits);
    mp_cp_set(c, "opts", "l2norm", MP_CP_INT, opts ? opts->l2norm : -1);
}

/* Passes 1 and 2, the exchange and the composition: what the correction and the backward need.
 * Collective: every rank agrees first (the call, layout, scheme, settings, each rank's own checks, with
 * the caller's own `more` checks among them), so every rank either fails here alike or enters the same
 * exchanges; a kernel failure after that travels in the exchange's trailer. The kernel runs on team
 * (NULL: the caller alone): the caller's, or one the entry points without a team start for the whole
 * call. */
static maskpack_status run_prepare(const maskpack_comm *comm, const maskpack_layout *layout, maskpack_cp_scheme scheme,
                                   const maskpack_gdn_inputs *in, const maskpack_gdn_options *opts,
                                   maskpack_workers *team, mp_cp_call *call,
                                   maskpack_status (*more)(const gdn_plan *P, const void *ctx, maskpack_error *err),
                                   const void *more_ctx, gdn_run *R, maskpack_error *err) {
    memset(R, 0, sizeof *R);
    maskpack_status c = mp_cp_check_comm(comm, 0, err);
    if (c) return c;
    maskpack_status local = MASKPACK_OK;
    if (!layout)
        local = mp_fail(err, MASKPACK_ERR_NULL_ARGUMENT, "layout", -1, -1,
                        "layout: expected a non-NULL pointer, found NULL");
    if (!local && !opts)
        local =
            mp_fail(err, MASKPACK_ERR_NULL_ARGUMENT, "opts", -1, -1, "opts: expected a non-NULL pointer, found NULL");
    if (!local) local = check_args(in, err);
    if (!local) local = plan_build(comm, layout, scheme, &R->P, err);
    if (!local) {
        const maskpack_layout *M = R->P.mine;
        const int64_t HV = in->v->shape[1];
        if (in->q->shape[0] != M->q_width || in->v->shape[0] != M->q_width)
            local = mp_fail(err, MASKPACK_ERR_SHAPE, "q", -1, -1,
                            "q: expected this rank's shard (rank %d of %d) of %lld tokens, found %lld", comm->rank,
                            comm->size, (long long)M->q_width, (long long)in->q->shape[0]);
        else if (in->k->ndim != 3 || memcmp(in->k->shape, in->q->shape, 3 * sizeof(int64_t)))
            local = mp_fail(err, MASKPACK_ERR_SHAPE, "k", -1, -1, "k: expected q's shape [%lld, %lld, %lld]",
                            (long long)in->q->shape[0], (long long)in->q->shape[1], (long long)in->q->shape[2]);
        else if (in->g->ndim != 2 || in->g->shape[0] != M->q_width || in->g->shape[1] != HV)
            local = mp_fail(err, MASKPACK_ERR_SHAPE, "g", -1, -1, "g: expected [%lld, %lld] (tokens, value heads)",
                            (long long)M->q_width, (long long)HV);
        else if (in->beta->ndim != 2 || in->beta->shape[0] != M->q_width || in->beta->shape[1] != HV)
            local = mp_fail(err, MASKPACK_ERR_SHAPE, "beta", -1, -1,
                            "beta: expected [%lld, %lld] (tokens, value heads)", (long long)M->q_width, (long long)HV);
        else if (in->initial_state &&
                 (in->initial_state->ndim != 4 || in->initial_state->shape[0] != (int64_t)layout->n_segments ||
                  in->initial_state->shape[1] != in->v->shape[1] || in->initial_state->shape[2] != in->q->shape[2] ||
                  in->initial_state->shape[3] != in->v->shape[2]))
            local = mp_fail(err, MASKPACK_ERR_SHAPE, "initial_state", -1, -1,
                            "initial_state: expected [%zu, HV, K, V] (one state per sequence of the whole batch)",
                            layout->n_segments);
    }
    if (!local && more) local = more(&R->P, more_ctx, err);
    gdn_settings(call, in, opts);
    maskpack_status s = mp_cp_agree_call(comm, layout, scheme, call, local, err);
    if (s) {
        run_free(R);
        return s;
    }
    const gdn_plan *P = &R->P;
    R->T = in->q->shape[0], R->H = in->q->shape[1], R->K = in->q->shape[2];
    R->HV = in->v->shape[1], R->V = in->v->shape[2];
    R->np = (int64_t)(P->first[P->rank + 1] - P->first[P->rank]);
    const int64_t HV = R->HV, K = R->K, V = R->V, np = R->np, T = R->T;
    size_t hk;
    if (mp_mul_size((size_t)HV, (size_t)K, &hk) || mp_mul_size(hk, (size_t)V, &R->st) ||
        mp_mul_size(hk, (size_t)K, &R->sk) || mp_mul_size(hk, (size_t)(K + V), &R->blk)) {
        run_free(R);
        return mp_fail(err, MASKPACK_ERR_OVERFLOW, "q", -1, -1, "q: the state sizes HV * K * (K + V) overflow");
    }
    size_t np1 = (size_t)np + 1, w1 = P->width ? P->width : 1, W = (size_t)(K + V);
    R->hx = floats(np1, R->blk, 1, 1);
    R->vx = floats((size_t)T, (size_t)HV, W, 0);
    R->ox = floats((size_t)T, (size_t)HV, W, 0);
    if (mp_mul_size(w1, R->blk, &R->stride) || R->stride > SIZE_MAX / 8) { /* the same on every rank */
        run_free(R);
        return mp_fail(err, MASKPACK_ERR_OVERFLOW, "q", -1, -1, "q: the pieces' transitions overflow");
    }
    R->stride += TRAILER;
    R->every = floats((size_t)P->n, R->stride, 1, 0);
    R->states = floats(np1, R->st, 1, 1);
    R->chainS_at = mp_calloc_array(P->n_seq + 1, sizeof *R->chainS_at);
    float *rec = floats(R->stride, 1, 1, 1); /* the pass's final states: this rank's (P | B), as exchanged */
    if (!R->hx || !R->vx || !R->ox || !R->every || !R->states || !R->chainS_at || !rec)
        s = mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "q", -1, -1, "out of memory");
    const gdn_piece *mine = s ? NULL : P->pieces + P->first[P->rank];
    for (int64_t i = 0; !s && i < np; i++)
        for (int64_t x = 0; x < HV * K; x++) { /* row d of head h: (e_d | h0 row d) */
            float *row = R->hx + (size_t)i * R->blk + (size_t)x * W;
            row[x % K] = 1.0f;
            if (mine[i].pos == 0 && in->initial_state)
                memcpy(row + K, (const float *)in->initial_state->data + mine[i].seq * (int64_t)R->st + x * V,
                       (size_t)V * sizeof(float));
        }
    if (!s) {
        memset(R->vx, 0, (size_t)T * (size_t)HV * W * sizeof(float));
        copy_rows(R->vx + K, W, in->v->data, (size_t)V, (size_t)(T * HV), (size_t)V);
    }
    int64_t x4[4] = {np, HV, K, K + V}, s4[4] = {np, HV, K, V}, x3[3] = {T, HV, K + V};
    R->hx_t = maskpack_tensor_contiguous(R->hx, MASKPACK_F32, 4, x4);
    R->vx_t = maskpack_tensor_contiguous(R->vx, MASKPACK_F32, 3, x3);
    R->states_t = maskpack_tensor_contiguous(R->states, MASKPACK_F32, 4, s4);
    maskpack_tensor ox_t = maskpack_tensor_contiguous(R->ox, MASKPACK_F32, 3, x3);
    maskpack_tensor rec_t = maskpack_tensor_contiguous(rec, MASKPACK_F32, 4, x4);
    /* the pass: every piece through the identity (P, phi) and from a zero state (B, o1) at once, one
     * kernel run over K + V value columns, so the chunks' own work (their inverses, Q K^T) is done once;
     * a sequence's first piece runs from its true initial state */
    maskpack_gdn_inputs inx = *in;
    inx.v = &R->vx_t;
    inx.initial_state = &R->hx_t;
    if (!s) s = maskpack_gdn_forward_on(P->mine, &inx, opts, &ox_t, &rec_t, team, NULL, 0, err);
    /* a local failure above (the kernel's refusal, memory) still enters the exchange, or the others would
     * wait: its status travels in the record's trailer and every rank fails with it */
    if (rec) put_trailer(rec + R->stride - TRAILER, s, err);
    if (!rec || !R->every) {
        /* nothing to send with: the transport must end the others (as any rank lost mid-call would) */
    } else if (comm->all_gather(comm->ctx, rec, R->every, R->stride * sizeof(float)) != 0) {
        s = mp_fail(err, MASKPACK_ERR_COMM, "comm", -1, -1,
                    "comm: all_gather of the pieces' transitions failed on "
                    "rank %d",
                    comm->rank);
    } else if (!s) {
        s = read_trailers(R->every, R->stride, P->n, "exchange of the pieces' transitions", err);
    }
    /* the composition in sequence order, up to this rank's last piece of each sequence */
    size_t total = 0;
    for (size_t q = 0; !s && q < P->n_seq; q++) {
        R->chainS_at[q] = total;
        total += P->chain_begin[q + 1] - P->chain_begin[q];
    }
    if (!s) {
        R->chainS_at[P->n_seq] = total;
        R->chainS = floats(total, R->st, 1, 0);
        if (!R->chainS) s = mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "q", -1, -1, "out of memory");
    }
    for (size_t q = 0; !s && q < P->n_seq; q++) {
        const size_t *c = P->chain + P->chain_begin[q];
        size_t m = P->chain_begin[q + 1] - P->chain_begin[q], want = 0;
        int any = 0;
        for (size_t j = 0; j < m; j++) {
            int r;
            size_t l;
            owner_of(P, c[j], &r, &l);
            if (r == P->rank) want = j, any = 1;
        }
        if (!any) continue;
        float *S = R->chainS + R->chainS_at[q] * R->st; /* slot j: the state entering element j (j >= 1) */
        for (size_t j = 0; j <= want; j++) {
            int r;
            size_t l;
            owner_of(P, c[j], &r, &l);
            if (r == P->rank && j > 0) memcpy(R->states + l * R->st, S + j * R->st, R->st * sizeof(float));
            if (r == P->rank && j == 0) /* the first piece's h0 */
                copy_rows(R->states + l * R->st, (size_t)V, R->hx + l * R->blk + K, W, (size_t)(HV * K), (size_t)V);
            if (j == want) break;
            const float *pb = rec_of(R, c[j]);
            if (j == 0) { /* S_1 = B_0 (the first piece ran from the true initial state) */
                copy_rows(S + R->st, (size_t)V, pb + K, W, (size_t)(HV * K), (size_t)V);
            } else {
                gemm_add(S + (j + 1) * R->st, pb, (size_t)(K + V), S + j * R->st, (size_t)V, pb + K, (size_t)(K + V),
                         HV, K, V);
            }
        }
    }
    free(rec);
    if (s) run_free(R);
    return s;
}

/* Each sequence's state after its last piece, [N, rec] floats: from the rank holding that piece
 * (per_piece: its pieces' states, `rec` floats each), all-gathered so every rank holds all of them.
 * Collective: every rank enters the exchange, even one whose own call already failed (`failed`, with
 * *err filled): its status travels in the trailer and every rank fails with it. out may be NULL. */
static maskpack_status gather_last_states(const maskpack_comm *comm, const gdn_plan *P, const float *per_piece,
                                          size_t rec, float *out, const char *what, maskpack_status failed,
                                          maskpack_error *err) {
    size_t N = P->n_seq, w = N ? N : 1, stride = w * rec + TRAILER;
    float *mine = floats(stride, 1, 1, 1), *all = floats((size_t)P->n, stride, 1, 0);
    maskpack_status s = failed;
    if (!s && (!mine || !all)) s = mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, what, -1, -1, "out of memory");
    for (size_t q = 0; !s && per_piece && q < N; q++) {
        if (P->chain_begin[q + 1] == P->chain_begin[q]) continue;
        int r;
        size_t l;
        owner_of(P, P->chain[P->chain_begin[q + 1] - 1], &r, &l);
        if (r == P->rank) memcpy(mine + q * rec, per_piece + l * rec, rec * sizeof(float));
    }
    if (mine && all) {
        put_trailer(mine + stride - TRAILER, s, err);
        if (comm->all_gather(comm->ctx, mine, all, stride * sizeof(float)) != 0) {
            if (!s)
                s = mp_fail(err, MASKPACK_ERR_COMM, "comm", -1, -1, "comm: all_gather of the %s failed on rank %d",
                            what, comm->rank);
        } else if (!s) {
            char where[64];
            snprintf(where, sizeof where, "exchange of the %s", what);
            s = read_trailers(all, stride, P->n, where, err);
        }
    }
    for (size_t q = 0; !s && out && q < N; q++) {
        int r = 0;
        size_t l;
        if (P->chain_begin[q + 1] > P->chain_begin[q]) owner_of(P, P->chain[P->chain_begin[q + 1] - 1], &r, &l);
        memcpy(out + q * rec, all + (size_t)r * stride + q * rec, rec * sizeof(float));
    }
    free(mine);
    free(all);
    return s;
}

/* t is a contiguous float32 tensor of exactly `shape` (nd dims). */
static int f32_shaped(const maskpack_tensor *t, int nd, const int64_t *shape) {
    return f32_contiguous(t) && t->ndim == nd && !memcmp(t->shape, shape, (size_t)nd * sizeof *shape);
}

static maskpack_status want_shape(const maskpack_tensor *t, const char *name, int nd, const int64_t *shape,
                                  int required, maskpack_error *err) {
    if (!t && !required) return MASKPACK_OK;
    if (t && f32_shaped(t, nd, shape)) return MASKPACK_OK;
    char want[200], found[200];
    mp_format_shape(want, sizeof want, nd, shape);
    if (t) mp_format_shape(found, sizeof found, t->ndim, t->shape);
    const maskpack_status st = !t                         ? MASKPACK_ERR_NULL_ARGUMENT
                               : t->dtype != MASKPACK_F32 ? MASKPACK_ERR_DTYPE
                                                          : MASKPACK_ERR_SHAPE;
    return mp_fail(err, st, name, -1, -1, "%s: expected a contiguous float32 tensor %s, found %s%s", name, want,
                   t ? found : "NULL", t && !f32_contiguous(t) ? " (not contiguous float32)" : "");
}

/* The outputs and gradients of a GDN call, checked before the agreement (cp_gdn's `more`). */
typedef struct gdn_outs {
    const maskpack_gdn_inputs *in;
    const maskpack_tensor *o, *final_state, *d_o, *d_final_state;
    const maskpack_gdn_grads *grads;
    int backward;
} gdn_outs;

static maskpack_status gdn_more(const gdn_plan *P, const void *ctx, maskpack_error *err) {
    const gdn_outs *x = ctx;
    const maskpack_gdn_inputs *in = x->in;
    const int64_t T = in->v->shape[0], HV = in->v->shape[1], V = in->v->shape[2], K = in->q->shape[2];
    const int64_t vs[3] = {T, HV, V}, hs[4] = {(int64_t)P->n_seq, HV, K, V};
    maskpack_status s;
    if (!x->backward) {
        if ((s = want_shape(x->o, "o", 3, vs, 1, err))) return s;
        return want_shape(x->final_state, "final_state", 4, hs, 0, err);
    }
    if (!x->grads)
        return mp_fail(err, MASKPACK_ERR_NULL_ARGUMENT, "grads", -1, -1,
                       "grads: expected a non-NULL pointer, found NULL");
    const maskpack_tensor *outs[5] = {x->grads->dq, x->grads->dk, x->grads->dv, x->grads->dg, x->grads->dbeta};
    const maskpack_tensor *like[5] = {in->q, in->k, in->v, in->g, in->beta};
    const char *names[5] = {"dq", "dk", "dv", "dg", "dbeta"};
    for (int i = 0; i < 5; i++)
        if ((s = want_shape(outs[i], names[i], like[i]->ndim, like[i]->shape, 1, err))) return s;
    if ((s = want_shape(x->d_o, "d_o", 3, vs, 1, err))) return s;
    if ((s = want_shape(x->d_final_state, "d_final_state", 4, hs, 0, err))) return s;
    return want_shape(x->grads->d_initial_state, "d_initial_state", 4, hs, 0, err);
}

static maskpack_status gdn_sp_forward(const maskpack_comm *comm, const maskpack_layout *layout,
                                      maskpack_cp_scheme scheme, const maskpack_gdn_inputs *in,
                                      const maskpack_gdn_options *opts, maskpack_tensor *o,
                                      maskpack_tensor *final_state, maskpack_workers *team, maskpack_error *err) {
    gdn_run R;
    mp_cp_call call = mp_cp_call_of(MP_CP_CALL_GDN_FORWARD);
    gdn_outs x = {in, o, final_state, NULL, NULL, NULL, 0};
    maskpack_status s = run_prepare(comm, layout, scheme, in, opts, team, &call, gdn_more, &x, &R, err);
    if (s) return s;
    const int64_t HV = R.HV, K = R.K, V = R.V, np = R.np;
    float *ht = floats((size_t)np + 1, R.st, 1, 0);
    if (!s && !ht) s = mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "o", -1, -1, "out of memory");
    const gdn_piece *mine = R.P.pieces + R.P.first[R.P.rank];
    const gemm_fn gemm = pick_gemm(opts, K, V);
    const size_t W = (size_t)(K + V);
    if (!s) /* o = o1 (exact for first pieces and pads) */
        copy_rows(o->data, (size_t)V, R.ox + K, W, (size_t)(R.T * HV), (size_t)V);
    for (int64_t i = 0; !s && i < np; i++) {
        const float *pb = rec_of(&R, R.P.first[R.P.rank] + (size_t)i), *Sin = R.states + (size_t)i * R.st;
        if (mine[i].pos == 0) { /* ran from its true initial state in the pass: S_out = B */
            copy_rows(ht + (size_t)i * R.st, (size_t)V, pb + K, W, (size_t)(HV * K), (size_t)V);
            continue;
        }
        size_t at = (size_t)mine[i].start * (size_t)HV;
        correct(gemm, (float *)o->data + at * (size_t)V, R.ox + at * W, Sin, mine[i].len, HV, K, V);
        gemm_add(ht + (size_t)i * R.st, pb, (size_t)(K + V), Sin, (size_t)V, pb + K, (size_t)(K + V), HV, K, V);
    }
    /* every rank enters the final exchange (a failure here is local: shapes or memory) */
    s = gather_last_states(comm, &R.P, s ? NULL : ht, R.st, s || !final_state ? NULL : final_state->data,
                           "final states", s, err);
    free(ht);
    run_free(&R);
    return s ? s : mp_ok(err);
}

static maskpack_status gdn_sp_backward(const maskpack_comm *comm, const maskpack_layout *layout,
                                       maskpack_cp_scheme scheme, const maskpack_gdn_inputs *in,
                                       const maskpack_tensor *d_o, const maskpack_tensor *d_final_state,
                                       const maskpack_gdn_options *opts, maskpack_gdn_grads *grads,
                                       maskpack_workers *team, maskpack_error *err) {
    gdn_run R;
    mp_cp_call call = mp_cp_call_of(MP_CP_CALL_GDN_BACKWARD);
    gdn_outs x = {in, NULL, NULL, d_o, d_final_state, grads, 1};
    maskpack_status s = run_prepare(comm, layout, scheme, in, opts, team, &call, gdn_more, &x, &R, err);
    if (s) return s;
    const gdn_plan *P = &R.P;
    const int64_t HV = R.HV, K = R.K, V = R.V, T = R.T, np = R.np;
    const size_t np1 = (size_t)np + 1;
    maskpack_tensor *outs[5] = {grads->dq, grads->dk, grads->dv, grads->dg, grads->dbeta};
    const size_t W = (size_t)(K + V);
    float *dS = floats(np1, R.st, 1, 1), *dht = floats(np1, R.st, 1, 1);
    float *dpb = floats((size_t)P->n, R.stride, 1, 1), *recv = floats((size_t)P->n, R.stride, 1, 0);
    float *G = floats(R.st, 1, 1, 0), *G2 = floats(R.st, 1, 1, 0);
    float *dfx = floats(np1, R.blk, 1, 1);            /* the pass's final states' gradient (dP | dB) */
    float *dox = floats((size_t)T, (size_t)HV, W, 1); /* its outputs' gradient (dphi | d_o); dphi 0 on first pieces */
    float *dvx = floats((size_t)T, (size_t)HV, W, 0), *dhx = floats(np1, R.blk, 1, 0);
    float *St = floats((size_t)K, (size_t)V, 1, 0);
    const gemm_fn gemm = pick_gemm(opts, K, V);
    if (!s && (!dS || !dht || !dpb || !recv || !G || !G2 || !dfx || !dox || !dvx || !dhx || !St))
        s = mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "q", -1, -1, "out of memory");
    const gdn_piece *mine = s ? NULL : P->pieces + P->first[P->rank];
    /* the final states' gradient reaches each sequence's last piece, where this rank holds it */
    for (size_t q = 0; !s && d_final_state && q < P->n_seq; q++) {
        if (P->chain_begin[q + 1] == P->chain_begin[q]) continue;
        int r;
        size_t l;
        owner_of(P, P->chain[P->chain_begin[q + 1] - 1], &r, &l);
        if (r == P->rank) memcpy(dht + l * R.st, (const float *)d_final_state->data + q * R.st, R.st * 4);
    }
    if (!s) copy_rows(dox + K, W, d_o->data, (size_t)V, (size_t)(T * HV), (size_t)V);
    /* the correction's and the final states' adjoints, piece by piece: dphi, the incoming states'
     * gradient dS, and the local parts of dP and dB:
     *     o = o1 + phi S_in,   S_out = P S_in + B   (a first piece: S_in is the pass's own, o = o1, S_out = B) */
    if (!s && grads->d_initial_state) memset(grads->d_initial_state->data, 0, P->n_seq * R.st * 4);
    for (int64_t i = 0; !s && i < np; i++) {
        float *dfi = dfx + (size_t)i * R.blk, *dhti = dht + (size_t)i * R.st;
        add_rows(dfi + K, W, dhti, (size_t)V, (size_t)(HV * K), (size_t)V); /* dB += dS_out */
        if (mine[i].pos == 0) continue;
        const float *pb = rec_of(&R, P->first[P->rank] + (size_t)i), *Sin = R.states + (size_t)i * R.st;
        size_t at = (size_t)mine[i].start * (size_t)HV;
        float *dSi = dS + (size_t)i * R.st;
        gemm_ptg(dSi, pb, W, dhti, HV, K, V);  /* P^T dS_out */
        gemm_gst(dfi, W, dhti, Sin, HV, K, V); /* dP += dS_out S_in^T */
        correct_adjoint(gemm, dox + at * W, dSi, R.ox + at * W, (const float *)d_o->data + at * (size_t)V, Sin, St,
                        mine[i].len, HV, K, V);
    }
    /* the composition's adjoint, piece by piece back along its chain */
    for (int64_t i = 0; !s && i < np; i++) {
        int64_t q = mine[i].seq;
        const size_t *c = P->chain + P->chain_begin[q];
        size_t m = 0;
        while (c[m] != P->first[P->rank] + (size_t)i) m++;
        if (m == 0) continue; /* a first piece: its state enters the pass itself, whose adjoint takes it */
        memcpy(G, dS + i * R.st, R.st * 4);
        const float *S = R.chainS + R.chainS_at[q] * R.st;
        for (size_t j = m - 1; j >= 1; j--) { /* S_{j+1} = P_j S_j + B_j */
            int r;
            size_t l;
            owner_of(P, c[j], &r, &l);
            float *rec = dpb + (size_t)r * R.stride + l * R.blk;
            const float *pb = rec_of(&R, c[j]);
            add_rows(rec + K, W, G, (size_t)V, (size_t)(HV * K), (size_t)V); /* dB_j += G */
            gemm_gst(rec, W, G, S + j * R.st, HV, K, V);
            gemm_ptg(G2, pb, W, G, HV, K, V);
            memcpy(G, G2, R.st * 4);
        }
        int r; /* S_1 = B_0 */
        size_t l;
        owner_of(P, c[0], &r, &l);
        float *rec = dpb + (size_t)r * R.stride + l * R.blk;
        add_rows(rec + K, W, G, (size_t)V, (size_t)(HV * K), (size_t)V);
    }
    /* each owner receives every rank's gradient of its transitions (records laid out as dfx) and sums them */
    /* (every rank enters it: a failure above travels in each block's trailer) */
    for (int r = 0; dpb && r < P->n; r++) put_trailer(dpb + (size_t)(r + 1) * R.stride - TRAILER, s, err);
    if (dpb && recv) {
        if (comm->all_to_all(comm->ctx, dpb, recv, R.stride * 4) != 0) {
            if (!s)
                s = mp_fail(err, MASKPACK_ERR_COMM, "comm", -1, -1,
                            "comm: all_to_all of the transitions' gradients failed on rank %d", comm->rank);
        } else if (!s) {
            s = read_trailers(recv, R.stride, P->n, "exchange of the transitions' gradients", err);
        }
    }
    for (int r = 0; !s && r < P->n; r++)
        for (int64_t i = 0; i < np; i++) {
            const float *src = recv + (size_t)r * R.stride + (size_t)i * R.blk;
            float *dfi = dfx + (size_t)i * R.blk;
            for (size_t x = 0; x < R.blk; x++) dfi[x] += src[x];
        }
    /* the pass's adjoint, once: q, k, g, beta straight into the caller's gradients; v's from its columns */
    int64_t x4[4] = {np, HV, K, K + V}, x3[3] = {T, HV, K + V};
    maskpack_tensor dfx_t = maskpack_tensor_contiguous(dfx, MASKPACK_F32, 4, x4);
    maskpack_tensor dox_t = maskpack_tensor_contiguous(dox, MASKPACK_F32, 3, x3);
    maskpack_tensor dvx_t = maskpack_tensor_contiguous(dvx, MASKPACK_F32, 3, x3);
    maskpack_tensor dhx_t = maskpack_tensor_contiguous(dhx, MASKPACK_F32, 4, x4);
    maskpack_gdn_inputs inx = *in;
    inx.v = &R.vx_t;
    inx.initial_state = &R.hx_t;
    maskpack_gdn_grads gx = {outs[0], outs[1], &dvx_t, outs[3], outs[4], &dhx_t};
    if (!s) s = maskpack_gdn_backward_on(P->mine, &inx, &dox_t, &dfx_t, opts, &gx, team, NULL, 0, err);
    if (!s) copy_rows(outs[2]->data, (size_t)V, dvx + K, W, (size_t)(T * HV), (size_t)V);
    for (int64_t i = 0; !s && grads->d_initial_state && i < np; i++)
        if (mine[i].pos == 0) /* a first piece's initial state: the h0 columns of the pass's */
            add_rows((float *)grads->d_initial_state->data + mine[i].seq * (int64_t)R.st, (size_t)V,
                     dhx + (size_t)i * R.blk + K, W, (size_t)(HV * K), (size_t)V);
    free(dS), free(dht), free(dpb), free(recv), free(G), free(G2), free(dfx), free(dox), free(dvx), free(dhx), free(St);
    run_free(&R);
    return s ? s : mp_ok(err);
}

/* ---- the causal conv1d of a sequence-parallel GDN layer ---------------------------------------------
 * Each piece that continues a sequence needs the W-1 inputs before it, which lie on other ranks: every
 * rank all-gathers each of its pieces' last W-1 inputs (its tail), and each piece's prefix is the last
 * W-1 entries of [the caller's prefix of the sequence, the tails of the pieces before it], in sequence
 * order. The kernel then runs unchanged on the rank's pieces: bitwise the single-process result. */

/* Where column c of piece i's prefix comes from: piece (global index) src_piece[c] >= 0 at its tail
 * column src_col[c], or the caller's prefix of the sequence at src_col[c] (src_piece[c] = -1). */
static void prefix_sources(const gdn_plan *P, size_t gi, int64_t Wm1, int64_t *src_piece, int64_t *src_col) {
    const gdn_piece *pc = &P->pieces[gi];
    const size_t *c = P->chain + P->chain_begin[pc->seq];
    size_t m = 0;
    while (c[m] != gi) m++;
    int64_t col = Wm1 - 1, L = 0;
    for (size_t j = m; j-- > 0 && col >= 0;) {
        int64_t keep = P->pieces[c[j]].len < Wm1 ? P->pieces[c[j]].len : Wm1;
        for (int64_t t = 0; t < keep && col >= 0; t++, col--, L++) {
            src_piece[col] = (int64_t)c[j];
            src_col[col] = Wm1 - 1 - t; /* tails are right-aligned: their last column is the last token */
        }
    }
    for (; col >= 0; col--) {
        src_piece[col] = -1;
        src_col[col] = col + L;
    }
}

typedef struct conv_run {
    gdn_plan P;
    int64_t C, Wm1, np;
    size_t tail;   /* floats of one piece's tail: C * (W-1) */
    size_t stride; /* floats of one rank's tails in every: width * tail and the trailer */
    float *every;  /* [n, stride]: [width, C, W-1] and a trailer */
    float *prefix; /* [np, C, W-1]: this rank's pieces' prefixes */
    maskpack_tensor prefix_t;
} conv_run;

static void conv_free(conv_run *R) {
    plan_free(&R->P);
    free(R->every);
    free(R->prefix);
    memset(R, 0, sizeof *R);
}

/* The conv's outputs and gradients, checked before the agreement. */
typedef struct conv_outs {
    const maskpack_tensor *y, *conv_state, *dy, *d_conv_state, *dx, *dweight, *d_prefix;
    int backward;
} conv_outs;

static maskpack_status conv_more(const gdn_plan *P, const maskpack_tensor *x, const maskpack_tensor *weight,
                                 const conv_outs *o, maskpack_error *err) {
    const int64_t C = x->shape[1], W = weight->shape[1];
    const int64_t xs[2] = {x->shape[0], C}, ws[2] = {C, W}, ss[3] = {(int64_t)P->n_seq, C, W - 1};
    maskpack_status s;
    if (!o->backward) {
        if ((s = want_shape(o->y, "y", 2, xs, 1, err))) return s;
        return want_shape(o->conv_state, "conv_state", 3, ss, 0, err);
    }
    if ((s = want_shape(o->dy, "dy", 2, xs, 1, err))) return s;
    if ((s = want_shape(o->d_conv_state, "d_conv_state", 3, ss, 0, err))) return s;
    if ((s = want_shape(o->dx, "dx", 2, xs, 1, err))) return s;
    if ((s = want_shape(o->dweight, "dweight", 2, ws, 0, err))) return s;
    return want_shape(o->d_prefix, "d_prefix", 3, ss, 0, err);
}

static maskpack_status conv_prepare(const maskpack_comm *comm, const maskpack_layout *layout, maskpack_cp_scheme scheme,
                                    const maskpack_tensor *x, const maskpack_tensor *weight,
                                    const maskpack_tensor *prefix, int silu, const maskpack_kernel_options *opts,
                                    const conv_outs *outs, conv_run *R, maskpack_error *err) {
    memset(R, 0, sizeof *R);
    maskpack_status c = mp_cp_check_comm(comm, 0, err);
    if (c) return c;
    maskpack_status local = MASKPACK_OK;
    if (!layout)
        local = mp_fail(err, MASKPACK_ERR_NULL_ARGUMENT, "layout", -1, -1,
                        "layout: expected a non-NULL pointer, found NULL");
    else if (!x || !weight)
        local = mp_fail(err, MASKPACK_ERR_NULL_ARGUMENT, x ? "weight" : "x", -1, -1,
                        "%s: expected a "
                        "tensor, found NULL",
                        x ? "weight" : "x");
    else if (!f32_contiguous(x) || x->ndim != 2 || !f32_contiguous(weight) || weight->ndim != 2 ||
             weight->shape[0] != x->shape[1] || weight->shape[1] < 1 || weight->shape[1] > MASKPACK_GDN_MAX_CONV)
        local = mp_fail(err, MASKPACK_ERR_SHAPE, "x", -1, -1,
                        "x: expected this rank's packed shard [T_local, C] and weight [C, W] (1 <= W <= %d), both "
                        "contiguous float32",
                        MASKPACK_GDN_MAX_CONV);
    else if (prefix &&
             (!f32_contiguous(prefix) || prefix->ndim != 3 || prefix->shape[0] != (int64_t)layout->n_segments ||
              prefix->shape[1] != x->shape[1] || prefix->shape[2] != weight->shape[1] - 1))
        local = mp_fail(err, MASKPACK_ERR_SHAPE, "prefix", -1, -1,
                        "prefix: expected a contiguous float32 [%zu, C, W-1] (per sequence of the whole batch)",
                        layout->n_segments);
    if (!local) local = plan_build(comm, layout, scheme, &R->P, err);
    if (!local && x->shape[0] != R->P.mine->q_width)
        local = mp_fail(err, MASKPACK_ERR_SHAPE, "x", -1, -1,
                        "x: expected this rank's shard (rank %d of %d) of %lld tokens, found %lld", comm->rank,
                        comm->size, (long long)R->P.mine->q_width, (long long)x->shape[0]);
    if (!local) local = conv_more(&R->P, x, weight, outs, err);
    size_t pick; /* opts.isa, refused here as the local call refuses it, before the ranks agree */
    if (!local)
        local = mp_kernel_pick(MASKPACK_KERNEL_CONV, MASKPACK_F32, opts ? opts->isa : MASKPACK_ISA_AUTO, &pick, err);
    /* agreed: the call, the layout, x's and weight's dtypes and shapes (channels, width), a prefix, SiLU */
    mp_cp_call call = mp_cp_call_of(outs->backward ? MP_CP_CALL_CONV_BACKWARD : MP_CP_CALL_CONV_FORWARD);
    mp_cp_tensor(&call, "x", x, 1, "per-token shape [channels]");
    mp_cp_tensor(&call, "weight", weight, 0, "shape [channels, width]");
    mp_cp_set(&call, "prefix", "presence", MP_CP_FLAG, prefix != NULL);
    mp_cp_set(&call, "silu", "value", MP_CP_INT, silu);
    maskpack_status s = mp_cp_agree_call(comm, layout, scheme, &call, local, err);
    if (s) {
        conv_free(R);
        return s;
    }
    gdn_plan *P = &R->P;
    R->C = x->shape[1], R->Wm1 = weight->shape[1] - 1;
    R->np = (int64_t)(P->first[P->rank + 1] - P->first[P->rank]);
    R->tail = (size_t)(R->C * R->Wm1); /* C is a tensor extent and W-1 <= 3: no overflow */
    size_t w1 = P->width ? P->width : 1;
    R->stride = w1 * R->tail + TRAILER; /* tail <= 3 C floats of a tensor's extent: no overflow */
    float *rec = floats(R->stride, 1, 1, 1);
    R->every = floats((size_t)P->n, R->stride, 1, 0);
    R->prefix = floats((size_t)R->np + 1, R->tail, 1, 1);
    if (!rec || !R->every || !R->prefix) s = mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "x", -1, -1, "out of memory");
    const gdn_piece *mine = P->pieces + P->first[P->rank];
    const float *xd = x->data;
    for (int64_t i = 0; !s && i < R->np; i++) {
        int64_t keep = mine[i].len < R->Wm1 ? mine[i].len : R->Wm1;
        for (int64_t t = 0; t < keep; t++) /* the piece's t-th last token at tail column W-2-t */
            for (int64_t ch = 0; ch < R->C; ch++)
                rec[(size_t)i * R->tail + (size_t)(ch * R->Wm1 + R->Wm1 - 1 - t)] =
                    xd[(mine[i].start + mine[i].len - 1 - t) * R->C + ch];
    }
    if (rec) put_trailer(rec + R->stride - TRAILER, s, err); /* a failure here still joins: memory */
    if (rec && R->every) {
        if (comm->all_gather(comm->ctx, rec, R->every, R->stride * sizeof(float)) != 0) {
            if (!s)
                s = mp_fail(err, MASKPACK_ERR_COMM, "comm", -1, -1,
                            "comm: all_gather of the conv tails failed on rank %d", comm->rank);
        } else if (!s) {
            s = read_trailers(R->every, R->stride, P->n, "exchange of the conv tails", err);
        }
    }
    int64_t sp[MASKPACK_GDN_MAX_CONV], sc[MASKPACK_GDN_MAX_CONV];
    for (int64_t i = 0; !s && i < R->np; i++) {
        prefix_sources(P, P->first[P->rank] + (size_t)i, R->Wm1, sp, sc);
        for (int64_t c = 0; c < R->Wm1; c++)
            for (int64_t ch = 0; ch < R->C; ch++) {
                float val = 0.0f;
                if (sp[c] >= 0) {
                    int r;
                    size_t l;
                    owner_of(P, (size_t)sp[c], &r, &l);
                    val = R->every[(size_t)r * R->stride + l * R->tail + (size_t)(ch * R->Wm1 + sc[c])];
                } else if (prefix) {
                    val = ((const float *)prefix->data)[(mine[i].seq * R->C + ch) * R->Wm1 + sc[c]];
                }
                R->prefix[(size_t)i * R->tail + (size_t)(ch * R->Wm1 + c)] = val;
            }
    }
    int64_t s3[3] = {R->np, R->C, R->Wm1};
    R->prefix_t = maskpack_tensor_contiguous(R->prefix, MASKPACK_F32, 3, s3);
    free(rec);
    if (s) conv_free(R);
    return s;
}

static maskpack_status conv_sp_forward(const maskpack_comm *comm, const maskpack_layout *layout,
                                       maskpack_cp_scheme scheme, const maskpack_tensor *x,
                                       const maskpack_tensor *weight, const maskpack_tensor *prefix, int silu,
                                       const maskpack_kernel_options *opts, maskpack_workers *team, maskpack_tensor *y,
                                       maskpack_tensor *conv_state, maskpack_error *err) {
    conv_run R;
    conv_outs outs = {y, conv_state, NULL, NULL, NULL, NULL, NULL, 0};
    maskpack_status s = conv_prepare(comm, layout, scheme, x, weight, prefix, silu, opts, &outs, &R, err);
    if (s) return s;
    const gdn_plan *P = &R.P;
    float *st = floats((size_t)R.np + 1, R.tail, 1, 0);
    if (!st) s = mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "x", -1, -1, "out of memory");
    int64_t s3[3] = {R.np, R.C, R.Wm1};
    maskpack_tensor st_t = maskpack_tensor_contiguous(st, MASKPACK_F32, 3, s3);
    if (!s) s = maskpack_causal_conv1d_on(P->mine, x, weight, &R.prefix_t, silu, opts, team, y, &st_t, NULL, 0, err);
    /* each sequence's final conv state from the rank holding its last piece (every rank exchanges) */
    s = gather_last_states(comm, P, s ? NULL : st, R.tail, s || !conv_state ? NULL : conv_state->data, "conv states", s,
                           err);
    free(st);
    conv_free(&R);
    return s ? s : mp_ok(err);
}

static maskpack_status conv_sp_backward(const maskpack_comm *comm, const maskpack_layout *layout,
                                        maskpack_cp_scheme scheme, const maskpack_tensor *x,
                                        const maskpack_tensor *weight, const maskpack_tensor *prefix, int silu,
                                        const maskpack_tensor *dy, const maskpack_tensor *d_conv_state,
                                        const maskpack_kernel_options *opts, maskpack_workers *team,
                                        maskpack_tensor *dx, maskpack_tensor *dweight, maskpack_tensor *d_prefix,
                                        maskpack_error *err) {
    conv_run R;
    conv_outs outs = {NULL, NULL, dy, d_conv_state, dx, dweight, d_prefix, 1};
    maskpack_status s = conv_prepare(comm, layout, scheme, x, weight, prefix, silu, opts, &outs, &R, err);
    if (s) return s;
    const gdn_plan *P = &R.P;
    float *dst = floats((size_t)R.np + 1, R.tail, 1, 1), *dpre = floats((size_t)R.np + 1, R.tail, 1, 0);
    float *dtail = floats((size_t)P->n, R.stride, 1, 1), *recv = floats((size_t)P->n, R.stride, 1, 0);
    if (!s && (!dst || !dpre || !dtail || !recv))
        s = mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "x", -1, -1, "out of memory");
    /* the final states' gradient reaches each sequence's last piece where this rank holds it */
    for (size_t q = 0; !s && d_conv_state && q < P->n_seq; q++) {
        if (P->chain_begin[q + 1] == P->chain_begin[q]) continue;
        int r;
        size_t l;
        owner_of(P, P->chain[P->chain_begin[q + 1] - 1], &r, &l);
        if (r == P->rank)
            memcpy(dst + l * R.tail, (const float *)d_conv_state->data + q * R.tail, R.tail * sizeof(float));
    }
    int64_t s3[3] = {R.np, R.C, R.Wm1};
    maskpack_tensor dst_t = maskpack_tensor_contiguous(dst, MASKPACK_F32, 3, s3);
    maskpack_tensor dpre_t = maskpack_tensor_contiguous(dpre, MASKPACK_F32, 3, s3);
    if (!s)
        s = maskpack_causal_conv1d_backward_on(P->mine, x, weight, &R.prefix_t, silu, dy, &dst_t, opts, team, dx,
                                               dweight, &dpre_t, NULL, 0, err);
    if (!s && d_prefix) memset(d_prefix->data, 0, P->n_seq * R.tail * sizeof(float));
    /* each prefix column's gradient goes back where the column came from */
    const gdn_piece *mine = P->pieces + P->first[P->rank];
    int64_t sp[MASKPACK_GDN_MAX_CONV], sc[MASKPACK_GDN_MAX_CONV];
    for (int64_t i = 0; !s && i < R.np; i++) {
        prefix_sources(P, P->first[P->rank] + (size_t)i, R.Wm1, sp, sc);
        for (int64_t c = 0; c < R.Wm1; c++)
            for (int64_t ch = 0; ch < R.C; ch++) {
                float gval = dpre[(size_t)i * R.tail + (size_t)(ch * R.Wm1 + c)];
                if (sp[c] >= 0) {
                    int r;
                    size_t l;
                    owner_of(P, (size_t)sp[c], &r, &l);
                    dtail[(size_t)r * R.stride + l * R.tail + (size_t)(ch * R.Wm1 + sc[c])] += gval;
                } else if (d_prefix) {
                    ((float *)d_prefix->data)[(mine[i].seq * R.C + ch) * R.Wm1 + sc[c]] += gval;
                }
            }
    }
    /* owners receive the gradients of their tails and add them to their pieces' last tokens */
    /* (every rank enters it, W = 1 too: a failure above, the kernel's refusal, travels in each block's
     * trailer and every rank fails with it) */
    for (int r = 0; dtail && r < P->n; r++) put_trailer(dtail + (size_t)(r + 1) * R.stride - TRAILER, s, err);
    if (dtail && recv) {
        if (comm->all_to_all(comm->ctx, dtail, recv, R.stride * sizeof(float)) != 0) {
            if (!s)
                s = mp_fail(err, MASKPACK_ERR_COMM, "comm", -1, -1,
                            "comm: all_to_all of the conv tails' gradients "
                            "failed on rank %d",
                            comm->rank);
        } else if (!s) {
            s = read_trailers(recv, R.stride, P->n, "exchange of the conv tails' gradients", err);
        }
    }
    float *dxd = s ? NULL : dx->data;
    for (int r = 0; !s && R.tail && r < P->n; r++)
        for (int64_t i = 0; i < R.np; i++) {
            int64_t keep = mine[i].len < R.Wm1 ? mine[i].len : R.Wm1;
            const float *src = recv + (size_t)r * R.stride + (size_t)i * R.tail;
            for (int64_t t = 0; t < keep; t++)
                for (int64_t ch = 0; ch < R.C; ch++)
                    dxd[(mine[i].start + mine[i].len - 1 - t) * R.C + ch] += src[ch * R.Wm1 + R.Wm1 - 1 - t];
        }
    free(dst);
    free(dpre);
    free(dtail);
    free(recv);
    conv_free(&R);
    return s ? s : mp_ok(err);
}

/* ---- the entry points: a team started per call (opts.n_threads) or the caller's ---------------- */

maskpack_status maskpack_cp_gdn_forward(const maskpack_comm *comm, const maskpack_layout *layout,
                                        maskpack_cp_scheme scheme, const maskpack_gdn_inputs *in,
                                        const maskpack_gdn_options *opts, maskpack_tensor *o,
                                        maskpack_tensor *final_state, maskpack_error *err) {
    mp_run run;
    maskpack_status s = mp_run_begin_checked(&run, opts ? opts->n_threads : 1, err);
    if (!s) s = gdn_sp_forward(comm, layout, scheme, in, opts, o, final_state, run.team, err);
    mp_run_end(&run);
    return s;
}

maskpack_status maskpack_cp_gdn_forward_on(const maskpack_comm *comm, const maskpack_layout *layout,
                                           maskpack_cp_scheme scheme, const maskpack_gdn_inputs *in,
                                           const maskpack_gdn_options *opts, maskpack_tensor *o,
                                           maskpack_tensor *final_state, maskpack_workers *team, maskpack_error *err) {
    return gdn_sp_forward(comm, layout, scheme, in, opts, o, final_state, team, err);
}

maskpack_status maskpack_cp_gdn_backward(const maskpack_comm *comm, const maskpack_layout *layout,
                                         maskpack_cp_scheme scheme, const maskpack_gdn_inputs *in,
                                         const maskpack_tensor *d_o, const maskpack_tensor *d_final_state,
                                         const maskpack_gdn_options *opts, maskpack_gdn_grads *grads,
                                         maskpack_error *err) {
    mp_run run;
    maskpack_status s = mp_run_begin_checked(&run, opts ? opts->n_threads : 1, err);
    if (!s) s = gdn_sp_backward(comm, layout, scheme, in, d_o, d_final_state, opts, grads, run.team, err);
    mp_run_end(&run);
    return s;
}

maskpack_status maskpack_cp_gdn_backward_on(const maskpack_comm *comm, const maskpack_layout *layout,
                                            maskpack_cp_scheme scheme, const maskpack_gdn_inputs *in,
                                            const maskpack_tensor *d_o, const maskpack_tensor *d_final_state,
                                            const maskpack_gdn_options *opts, maskpack_gdn_grads *grads,
                                            maskpack_workers *team, maskpack_error *err) {
    return gdn_sp_backward(comm, layout, scheme, in, d_o, d_final_state, opts, grads, team, err);
}

maskpack_status maskpack_cp_causal_conv1d(const maskpack_comm *comm, const maskpack_layout *layout,
                                          maskpack_cp_scheme scheme, const maskpack_tensor *x,
                                          const maskpack_tensor *weight, const maskpack_tensor *prefix, int silu,
                                          const maskpack_kernel_options *opts, maskpack_tensor *y,
                                          maskpack_tensor *conv_state, maskpack_error *err) {
    mp_run run;
    maskpack_status s = mp_run_begin_checked(&run, opts ? opts->n_threads : 1, err);
    if (!s) s = conv_sp_forward(comm, layout, scheme, x, weight, prefix, silu, opts, run.team, y, conv_state, err);
    mp_run_end(&run);
    return s;
}

maskpack_status maskpack_cp_causal_conv1d_on(const maskpack_comm *comm, const maskpack_layout *layout,
                                             maskpack_cp_scheme scheme, const maskpack_tensor *x,
                                             const maskpack_tensor *weight, const maskpack_tensor *prefix, int silu,
                                             const maskpack_kernel_options *opts, maskpack_workers *team,
                                             maskpack_tensor *y, maskpack_tensor *conv_state, maskpack_error *err) {
    return conv_sp_forward(comm, layout, scheme, x, weight, prefix, silu, opts, team, y, conv_state, err);
}

maskpack_status maskpack_cp_causal_conv1d_backward(
    const maskpack_comm *comm, const maskpack_layout *layout, maskpack_cp_scheme scheme, const maskpack_tensor *x,
    const maskpack_tensor *weight, const maskpack_tensor *prefix, int silu, const maskpack_tensor *dy,
    const maskpack_tensor *d_conv_state, const maskpack_kernel_options *opts, maskpack_tensor *dx,
    maskpack_tensor *dweight, maskpack_tensor *d_prefix, maskpack_error *err) {
    mp_run run;
    maskpack_status s = mp_run_begin_checked(&run, opts ? opts->n_threads : 1, err);
    if (!s)
        s = conv_sp_backward(comm, layout, scheme, x, weight, prefix, silu, dy, d_conv_state, opts, run.team, dx,
                             dweight, d_prefix, err);
    mp_run_end(&run);
    return s;
}

maskpack_status maskpack_cp_causal_conv1d_backward_on(
    const maskpack_comm *comm, const maskpack_layout *layout, maskpack_cp_scheme scheme, const maskpack_tensor *x,
    const maskpack_tensor *weight, const maskpack_tensor *prefix, int silu, const maskpack_tensor *dy,
    const maskpack_tensor *d_conv_state, const maskpack_kernel_options *opts, maskpack_workers *team,
    maskpack_tensor *dx, maskpack_tensor *dweight, maskpack_tensor *d_prefix, maskpack_error *err) {
    return conv_sp_backward(comm, layout, scheme, x, weight, prefix, silu, dy, d_conv_state, opts, team, dx, dweight,
                            d_prefix, err);
}
