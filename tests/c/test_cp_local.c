/* test_cp_local.c: the context-parallel algorithms written over maskpack_comm (ring attention,
 * sequence-parallel Gated DeltaNet and conv) with 1, 2 and 3 ranks as threads of this process, over
 * the in-process comm of local_comm.h (a barrier for the collectives, mailboxes for the point-to-point
 * messages). It runs in the plain C suite, so the sanitizer run checks these algorithms for leaks and
 * bad accesses as well (the mpirun tests cannot: Open MPI's own allocations drown a leak report).
 * Every rank's result is compared with the single-process kernel on the whole batch. Also: the
 * key-block segments' validation and the refusals every rank reaches alike. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "check.h"
#include "local_comm.h"

#define MAXR 3

/* ---- inputs and references ---------------------------------------------------------------------- */

static float rnd(uint64_t *s) { return (float)((double)(test_lcg_next(s) >> 40) / (double)(1ULL << 24) * 2.0 - 1.0); }

static int close_to(float a, float b, float tol) {
    if (a == b) return 1;
    float d = fabsf(a - b);
    return d <= tol * (1.0f + fabsf(b));
}

static maskpack_layout *aligned(int n, int packed) {
    const int64_t lengths[5] = {37, 5, 64, 20, 3};
    maskpack_error e;
    maskpack_layout *L = NULL, *A = NULL;
    CHECK_OK(maskpack_layout_from_lengths(lengths, 5, packed ? MASKPACK_PLACE_PACKED : MASKPACK_PLACE_RIGHT,
                                          packed ? 0 : 64, NULL, &L, &e),
             e);
    CHECK_OK(maskpack_layout_pad_to_multiple(L, 2 * n, &A, &e), e);
    maskpack_layout_free(L);
    return A;
}

enum { HQ = 4, HK = 2, D = 8, H = 2, HV = 4, K = 8, V = 4, C = 6, W = 4, NSEQ = 5 };

typedef struct job {
    int n, rank;
    local_hub *h;
    const maskpack_layout *L, *Lpad;
    int64_t T;
    /* whole-batch inputs and references (shared, read-only) */
    const float *q, *k, *v, *dout, *out, *lse, *dq, *dk, *dv; /* attention */
    const float *gq, *gk, *gv, *gg, *gb, *h0, *gdo, *dfin, *go, *gfin, *gdq, *gdk, *gdv, *gdg, *gdb, *gdh; /* gdn */
    const float *x, *w, *pre, *dy, *dst, *y, *st, *dx, *dw, *dp;                                           /* conv */
    /* this rank's shares of the replicated gradients, summed by the caller */
    float dh_share[NSEQ * HV * K * V], dw_share[C * W], dp_share[NSEQ * C * 3];
    int64_t bad[10];
} job;

static void gather_rows(float *dst, const float *src, const int64_t *idx, int64_t n, int64_t row) {
    for (int64_t i = 0; i < n; i++) memcpy(dst + i * row, src + idx[i] * row, (size_t)row * sizeof(float));
}

/* ---- the _on entry points: a team gives the bits of its participant count ---------------------- */

static void serial_host(void *host, maskpack_task_fn task, void *ctx, int n) {
    (void)host;
    for (int t = n - 1; t >= 0; t--) task(ctx, t);
}

static float *rows_of(const float *src, const int64_t *idx, int64_t n, int64_t row) {
    float *p = malloc((size_t)(n * row) * sizeof *p);
    gather_rows(p, src, idx, n, row);
    return p;
}
static float *zeros(int64_t n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(float)); }
static int64_t differ(const float *a, const float *b, int64_t n) { return memcmp(a, b, (size_t)n * sizeof *a) != 0; }

/* A rank's [tl, row] rows against the whole batch's reference rows idx (stride 1), or, with
 * tokens_last, a [row, tl] output against the reference's [row, T] (the lse): 1 when any is off. */
static int64_t off_ref(const float *got, const float *ref, const int64_t *idx, int64_t tl, int64_t row, int64_t T,
                       int tokens_last, float tol) {
    for (int64_t i = 0; i < tl; i++)
        for (int64_t c = 0; c < row; c++) {
            float g = tokens_last ? got[c * tl + i] : got[i * row + c];
            float r = tokens_last ? ref[c * T + idx[i]] : ref[idx[i] * row + c];
            if (!close_to(g, r, tol)) return 1;
        }
    return 0;
}
static int64_t off_all(const float *got, const float *ref, int64_t n, float tol) {
    for (int64_t i = 0; i < n; i++)
        if (!close_to(got[i], ref[i], tol)) return 1;
    return 0;
}

/* Ring attention, the rule and the conv with n_threads = 2 (the plain calls), then on a team of 2 of
 * maskpack's own threads and on one hosted by a serial host: every output equal bit for bit. The plain
 * call starts the same kind of team as the own-team arm (mp_team_for_call), so bit equality alone
 * could not catch a fault shared by the two: every arm is also held to the single-process whole-batch
 * reference, with the tolerances rank_main uses. */
static int64_t teams_match(job *J, const maskpack_comm *comm, const int64_t *idx, int64_t tl) {
    maskpack_error e;
    maskpack_workers *teams[2] = {NULL, NULL};
    int64_t bad = maskpack_workers_create(2, &teams[0], &e) != 0;
    bad += maskpack_workers_create_hosted(2, serial_host, NULL, &teams[1], &e) != 0;
    /* ring attention: out, lse, dq, dk, dv of 3 runs */
    float *q = rows_of(J->q, idx, tl, HQ * D), *k = rows_of(J->k, idx, tl, HK * D), *v = rows_of(J->v, idx, tl, HK * D);
    float *dout = rows_of(J->dout, idx, tl, HQ * D);
    const int64_t nq = tl * HQ * D, nk = tl * HK * D, nl = tl * HQ;
    int64_t sq[3] = {tl, HQ, D}, sk[3] = {tl, HK, D}, sl[2] = {HQ, tl};
    maskpack_tensor uq = maskpack_tensor_contiguous(q, MASKPACK_F32, 3, sq),
                    uk = maskpack_tensor_contiguous(k, MASKPACK_F32, 3, sk);
    maskpack_tensor uv = maskpack_tensor_contiguous(v, MASKPACK_F32, 3, sk),
                    udo = maskpack_tensor_contiguous(dout, MASKPACK_F32, 3, sq);
    float *ro[3][5];
    for (int run = 0; run < 3; run++) {
        float **r = ro[run];
        r[0] = zeros(nq), r[1] = zeros(nl), r[2] = zeros(nq), r[3] = zeros(nk), r[4] = zeros(nk);
        maskpack_tensor o = maskpack_tensor_contiguous(r[0], MASKPACK_F32, 3, sq),
                        l = maskpack_tensor_contiguous(r[1], MASKPACK_F32, 2, sl);
        maskpack_tensor dq = maskpack_tensor_contiguous(r[2], MASKPACK_F32, 3, sq),
                        dk = maskpack_tensor_contiguous(r[3], MASKPACK_F32, 3, sk);
        maskpack_tensor dv = maskpack_tensor_contiguous(r[4], MASKPACK_F32, 3, sk);
        if (run == 0) {
            bad += maskpack_cp_attention_forward(comm, J->L, MASKPACK_CP_ZIGZAG, &uq, &uk, &uv, 0, 0, &o, &l,
                                                 OPTS_NT(2), &e) != 0;
            bad += maskpack_cp_attention_backward(comm, J->L, MASKPACK_CP_ZIGZAG, &udo, &uq, &uk, &uv, &o, &l, 0, 0,
                                                  &dq, &dk, &dv, OPTS_NT(2), &e) != 0;
        } else {
            bad += maskpack_cp_attention_forward_on(comm, J->L, MASKPACK_CP_ZIGZAG, &uq, &uk, &uv, 0, 0, &o, &l, NULL,
                                                    teams[run - 1], &e) != 0;
            bad += maskpack_cp_attention_backward_on(comm, J->L, MASKPACK_CP_ZIGZAG, &udo, &uq, &uk, &uv, &o, &l, 0, 0,
                                                     &dq, &dk, &dv, NULL, teams[run - 1], &e) != 0;
        }
    }
    const int64_t an[5] = {nq, nl, nq, nk, nk};
    for (int run = 1; run < 3; run++)
        for (int i = 0; i < 5; i++) bad += differ(ro[0][i], ro[run][i], an[i]);
    for (int run = 0; run < 3; run++) {
        bad += off_ref(ro[run][0], J->out, idx, tl, HQ * D, J->T, 0, 1e-5f);
        bad += off_ref(ro[run][1], J->lse, idx, tl, HQ, J->T, 1, 1e-5f);
        bad += off_ref(ro[run][2], J->dq, idx, tl, HQ * D, J->T, 0, 1e-4f);
        bad += off_ref(ro[run][3], J->dk, idx, tl, HK * D, J->T, 0, 1e-4f);
        bad += off_ref(ro[run][4], J->dv, idx, tl, HK * D, J->T, 0, 1e-4f);
    }
    for (int run = 0; run < 3; run++)
        for (int i = 0; i < 5; i++) free(ro[run][i]);
    free(q), free(k), free(v), free(dout);
    /* the rule: o, final state, dq, dk, dv, dg, dbeta, d_initial_state share */
    float *gq = rows_of(J->gq, idx, tl, H * K), *gk = rows_of(J->gk, idx, tl, H * K),
          *gv = rows_of(J->gv, idx, tl, HV * V);
    float *gg = rows_of(J->gg, idx, tl, HV), *gb = rows_of(J->gb, idx, tl, HV), *gdo = rows_of(J->gdo, idx, tl, HV * V);
    int64_t s3q[3] = {tl, H, K}, s3v[3] = {tl, HV, V}, s2[2] = {tl, HV}, s4[4] = {NSEQ, HV, K, V};
    maskpack_tensor tq = maskpack_tensor_contiguous(gq, MASKPACK_F32, 3, s3q),
                    tk = maskpack_tensor_contiguous(gk, MASKPACK_F32, 3, s3q);
    maskpack_tensor tv = maskpack_tensor_contiguous(gv, MASKPACK_F32, 3, s3v),
                    tg = maskpack_tensor_contiguous(gg, MASKPACK_F32, 2, s2);
    maskpack_tensor tb = maskpack_tensor_contiguous(gb, MASKPACK_F32, 2, s2),
                    tdo = maskpack_tensor_contiguous(gdo, MASKPACK_F32, 3, s3v);
    maskpack_tensor th0 = maskpack_tensor_contiguous((void *)J->h0, MASKPACK_F32, 4, s4);
    maskpack_tensor tdf = maskpack_tensor_contiguous((void *)J->dfin, MASKPACK_F32, 4, s4);
    maskpack_gdn_inputs in = {&tq, &tk, &tv, &tg, &tb, &th0};
    maskpack_gdn_options opts = maskpack_gdn_options_default();
    opts.n_threads = 2;
    const int64_t gn[8] = {tl * HV * V, NSEQ * HV * K * V, tl * H * K, tl * H * K,
                           tl * HV * V, tl * HV,           tl * HV,    NSEQ * HV * K * V};
    const int gd[8] = {3, 4, 3, 3, 3, 2, 2, 4};
    const int64_t *gs[8] = {s3v, s4, s3q, s3q, s3v, s2, s2, s4};
    float *rg[3][8];
    for (int run = 0; run < 3; run++) {
        maskpack_tensor t[8];
        for (int i = 0; i < 8; i++) {
            rg[run][i] = zeros(gn[i]);
            t[i] = maskpack_tensor_contiguous(rg[run][i], MASKPACK_F32, gd[i], gs[i]);
        }
        maskpack_gdn_grads gr = {&t[2], &t[3], &t[4], &t[5], &t[6], &t[7]};
        maskpack_workers *team = run ? teams[run - 1] : NULL;
        bad += (run ? maskpack_cp_gdn_forward_on(comm, J->L, MASKPACK_CP_ZIGZAG, &in, &opts, &t[0], &t[1], team, &e)
                    : maskpack_cp_gdn_forward(comm, J->L, MASKPACK_CP_ZIGZAG, &in, &opts, &t[0], &t[1], &e)) != 0;
        bad += (run ? maskpack_cp_gdn_backward_on(comm, J->L, MASKPACK_CP_ZIGZAG, &in, &tdo, &tdf, &opts, &gr, team, &e)
                    : maskpack_cp_gdn_backward(comm, J->L, MASKPACK_CP_ZIGZAG, &in, &tdo, &tdf, &opts, &gr, &e)) != 0;
    }
    for (int run = 1; run < 3; run++)
        for (int i = 0; i < 8; i++) bad += differ(rg[0][i], rg[run][i], gn[i]);
    for (int run = 0; run < 3; run++) {
        bad += off_ref(rg[run][0], J->go, idx, tl, HV * V, J->T, 0, 1e-4f);
        bad += off_all(rg[run][1], J->gfin, NSEQ * HV * K * V, 1e-4f);
        bad += off_ref(rg[run][2], J->gdq, idx, tl, H * K, J->T, 0, 1e-3f);
        bad += off_ref(rg[run][3], J->gdk, idx, tl, H * K, J->T, 0, 1e-3f);
        bad += off_ref(rg[run][4], J->gdv, idx, tl, HV * V, J->T, 0, 1e-3f);
        bad += off_ref(rg[run][5], J->gdg, idx, tl, HV, J->T, 0, 1e-3f);
        bad += off_ref(rg[run][6], J->gdb, idx, tl, HV, J->T, 0, 1e-3f);
    }
    for (int run = 0; run < 3; run++)
        for (int i = 0; i < 8; i++) free(rg[run][i]);
    free(gq), free(gk), free(gv), free(gg), free(gb), free(gdo);
    /* the conv: y, state, dx, dweight share, d_prefix share */
    float *cx = rows_of(J->x, idx, tl, C), *cdy = rows_of(J->dy, idx, tl, C);
    int64_t sx[2] = {tl, C}, sw[2] = {C, W}, sp[3] = {NSEQ, C, 3};
    maskpack_tensor ux = maskpack_tensor_contiguous(cx, MASKPACK_F32, 2, sx),
                    uw = maskpack_tensor_contiguous((void *)J->w, MASKPACK_F32, 2, sw);
    maskpack_tensor up = maskpack_tensor_contiguous((void *)J->pre, MASKPACK_F32, 3, sp),
                    udy = maskpack_tensor_contiguous(cdy, MASKPACK_F32, 2, sx);
    maskpack_tensor uds = maskpack_tensor_contiguous((void *)J->dst, MASKPACK_F32, 3, sp);
    const int64_t cn[5] = {tl * C, NSEQ * C * 3, tl * C, C * W, NSEQ * C * 3};
    float *rc[3][5];
    for (int run = 0; run < 3; run++) {
        for (int i = 0; i < 5; i++) rc[run][i] = zeros(cn[i]);
        maskpack_tensor y = maskpack_tensor_contiguous(rc[run][0], MASKPACK_F32, 2, sx),
                        st = maskpack_tensor_contiguous(rc[run][1], MASKPACK_F32, 3, sp);
        maskpack_tensor dx = maskpack_tensor_contiguous(rc[run][2], MASKPACK_F32, 2, sx),
                        dw = maskpack_tensor_contiguous(rc[run][3], MASKPACK_F32, 2, sw);
        maskpack_tensor dp = maskpack_tensor_contiguous(rc[run][4], MASKPACK_F32, 3, sp);
        maskpack_workers *team = run ? teams[run - 1] : NULL;
        bad += (run ? maskpack_cp_causal_conv1d_on(comm, J->L, MASKPACK_CP_ZIGZAG, &ux, &uw, &up, 1, NULL, team, &y,
                                                   &st, &e)
                    : maskpack_cp_causal_conv1d(comm, J->L, MASKPACK_CP_ZIGZAG, &ux, &uw, &up, 1, OPTS_NT(2), &y, &st,
                                                &e)) != 0;
        bad += (run ? maskpack_cp_causal_conv1d_backward_on(comm, J->L, MASKPACK_CP_ZIGZAG, &ux, &uw, &up, 1, &udy,
                                                            &uds, NULL, team, &dx, &dw, &dp, &e)
                    : maskpack_cp_causal_conv1d_backward(comm, J->L, MASKPACK_CP_ZIGZAG, &ux, &uw, &up, 1, &udy, &uds,
                                                         OPTS_NT(2), &dx, &dw, &dp, &e)) != 0;
    }
    for (int run = 1; run < 3; run++)
        for (int i = 0; i < 5; i++) bad += differ(rc[0][i], rc[run][i], cn[i]);
    for (int run = 0; run < 3; run++) {
        bad += off_ref(rc[run][0], J->y, idx, tl, C, J->T, 0, 1e-6f);
        bad += off_all(rc[run][1], J->st, NSEQ * C * 3, 0.0f);
        bad += off_ref(rc[run][2], J->dx, idx, tl, C, J->T, 0, 1e-5f);
    }
    for (int run = 0; run < 3; run++)
        for (int i = 0; i < 5; i++) free(rc[run][i]);
    free(cx), free(cdy);
    maskpack_workers_free(teams[0]);
    maskpack_workers_free(teams[1]);
    return bad;
}

/* ---- an explicit ISA reaches the CP kernels --------------------------------------------------- */

/* The error a call gave, to hold another call's to it. */
static int64_t same_error(const maskpack_error *a, maskpack_status sa, const maskpack_error *b, maskpack_status sb) {
    return sa != sb || sa == MASKPACK_OK || strcmp(a->argument, b->argument) != 0 ||
           strcmp(a->message, b->message) != 0;
}

/* Ring attention and the conv with opts.isa = REF (plain and _on): the single-process whole-batch
 * reference (AUTO) within rank_main's tolerances, the conv bitwise the single-process REF conv; where
 * AUTO runs another attention kernel, REF's bits differ from AUTO's (the ISA reached the kernel). An
 * ISA out of range, and one this CPU lacks (where there is one), fail every rank with the error the
 * single-process call gives. */
static int64_t isa_reaches(job *J, const maskpack_comm *comm, const int64_t *idx, int64_t tl) {
    maskpack_error e, le;
    int64_t bad = 0;
    float *q = rows_of(J->q, idx, tl, HQ * D), *k = rows_of(J->k, idx, tl, HK * D), *v = rows_of(J->v, idx, tl, HK * D);
    float *dout = rows_of(J->dout, idx, tl, HQ * D);
    const int64_t nq = tl * HQ * D, nk = tl * HK * D, nl = tl * HQ;
    int64_t sq[3] = {tl, HQ, D}, sk[3] = {tl, HK, D}, sl[2] = {HQ, tl};
    maskpack_tensor uq = maskpack_tensor_contiguous(q, MASKPACK_F32, 3, sq),
                    uk = maskpack_tensor_contiguous(k, MASKPACK_F32, 3, sk);
    maskpack_tensor uv = maskpack_tensor_contiguous(v, MASKPACK_F32, 3, sk),
                    udo = maskpack_tensor_contiguous(dout, MASKPACK_F32, 3, sq);
    /* the backwards take the reference's out and lse, so that their bits depend on their own ISA alone */
    float *wo = rows_of(J->out, idx, tl, HQ * D), *wl = zeros(nl);
    for (int64_t h = 0; h < HQ; h++)
        for (int64_t i = 0; i < tl; i++) wl[h * tl + i] = J->lse[h * J->T + idx[i]];
    maskpack_tensor ro_t = maskpack_tensor_contiguous(wo, MASKPACK_F32, 3, sq),
                    rl_t = maskpack_tensor_contiguous(wl, MASKPACK_F32, 2, sl);
    const maskpack_isa isas[3] = {MASKPACK_ISA_REF, MASKPACK_ISA_REF, MASKPACK_ISA_AUTO};
    float *ro[3][5];
    for (int run = 0; run < 3; run++) {
        const int64_t n5[5] = {nq, nl, nq, nk, nk};
        for (int i = 0; i < 5; i++) ro[run][i] = zeros(n5[i]);
        maskpack_tensor o = maskpack_tensor_contiguous(ro[run][0], MASKPACK_F32, 3, sq);
        maskpack_tensor l = maskpack_tensor_contiguous(ro[run][1], MASKPACK_F32, 2, sl);
        maskpack_tensor dq = maskpack_tensor_contiguous(ro[run][2], MASKPACK_F32, 3, sq);
        maskpack_tensor dk = maskpack_tensor_contiguous(ro[run][3], MASKPACK_F32, 3, sk);
        maskpack_tensor dv = maskpack_tensor_contiguous(ro[run][4], MASKPACK_F32, 3, sk);
        const maskpack_kernel_options *opts = OPTS_ISA(1, isas[run]);
        if (run == 1) {
            bad += maskpack_cp_attention_forward_on(comm, J->L, MASKPACK_CP_ZIGZAG, &uq, &uk, &uv, 0, 0, &o, &l, opts,
                                                    NULL, &e) != 0;
            bad += maskpack_cp_attention_backward_on(comm, J->L, MASKPACK_CP_ZIGZAG, &udo, &uq, &uk, &uv, &ro_t, &rl_t,
                                                     0, 0, &dq, &dk, &dv, opts, NULL, &e) != 0;
        } else {
            bad += maskpack_cp_attention_forward(comm, J->L, MASKPACK_CP_ZIGZAG, &uq, &uk, &uv, 0, 0, &o, &l, opts,
                                                 &e) != 0;
            bad += maskpack_cp_attention_backward(comm, J->L, MASKPACK_CP_ZIGZAG, &udo, &uq, &uk, &uv, &ro_t, &rl_t, 0,
                                                  0, &dq, &dk, &dv, opts, &e) != 0;
        }
        bad += off_ref(ro[run][0], J->out, idx, tl, HQ * D, J->T, 0, 1e-5f);
        bad += off_ref(ro[run][1], J->lse, idx, tl, HQ, J->T, 1, 1e-5f);
        bad += off_ref(ro[run][2], J->dq, idx, tl, HQ * D, J->T, 0, 1e-4f);
        bad += off_ref(ro[run][3], J->dk, idx, tl, HK * D, J->T, 0, 1e-4f);
        bad += off_ref(ro[run][4], J->dv, idx, tl, HK * D, J->T, 0, 1e-4f);
    }
    for (int i = 0; i < 5; i++) bad += differ(ro[0][i], ro[1][i], i == 0 ? nq : i == 1 ? nl : i == 2 ? nq : nk);
    maskpack_isa best;
    bad += maskpack_isa_resolve(MASKPACK_KERNEL_ATTENTION, MASKPACK_F32, MASKPACK_ISA_AUTO, &best, &e) != 0;
    if (best != MASKPACK_ISA_REF && tl > 0) bad += !differ(ro[0][0], ro[2][0], nq) + !differ(ro[0][2], ro[2][2], nq);
    /* the conv: REF on the whole batch, then the CP conv with REF */
    float *yref = zeros(J->T * C), *sref = zeros(NSEQ * C * 3);
    int64_t sxw[2] = {J->T, C}, sx[2] = {tl, C}, sw[2] = {C, W}, sp[3] = {NSEQ, C, 3};
    maskpack_tensor wx = maskpack_tensor_contiguous((void *)J->x, MASKPACK_F32, 2, sxw);
    maskpack_tensor uw = maskpack_tensor_contiguous((void *)J->w, MASKPACK_F32, 2, sw);
    maskpack_tensor up = maskpack_tensor_contiguous((void *)J->pre, MASKPACK_F32, 3, sp);
    maskpack_tensor wy = maskpack_tensor_contiguous(yref, MASKPACK_F32, 2, sxw);
    maskpack_tensor ws = maskpack_tensor_contiguous(sref, MASKPACK_F32, 3, sp);
    bad += maskpack_causal_conv1d(J->L, &wx, &uw, &up, 1, OPTS_ISA(1, MASKPACK_ISA_REF), &wy, &ws, &e) != 0;
    float *cx = rows_of(J->x, idx, tl, C), *cdy = rows_of(J->dy, idx, tl, C);
    float *cy = zeros(tl * C), *cst = zeros(NSEQ * C * 3), *cdx = zeros(tl * C), *cdw = zeros(C * W),
          *cdp = zeros(NSEQ * C * 3);
    maskpack_tensor ux = maskpack_tensor_contiguous(cx, MASKPACK_F32, 2, sx),
                    udy = maskpack_tensor_contiguous(cdy, MASKPACK_F32, 2, sx);
    maskpack_tensor uds = maskpack_tensor_contiguous((void *)J->dst, MASKPACK_F32, 3, sp);
    maskpack_tensor y = maskpack_tensor_contiguous(cy, MASKPACK_F32, 2, sx),
                    st = maskpack_tensor_contiguous(cst, MASKPACK_F32, 3, sp);
    maskpack_tensor dx = maskpack_tensor_contiguous(cdx, MASKPACK_F32, 2, sx),
                    dw = maskpack_tensor_contiguous(cdw, MASKPACK_F32, 2, sw);
    maskpack_tensor dp = maskpack_tensor_contiguous(cdp, MASKPACK_F32, 3, sp);
    bad += maskpack_cp_causal_conv1d(comm, J->L, MASKPACK_CP_ZIGZAG, &ux, &uw, &up, 1, OPTS_ISA(1, MASKPACK_ISA_REF),
                                     &y, &st, &e) != 0;
    bad += maskpack_cp_causal_conv1d_backward_on(comm, J->L, MASKPACK_CP_ZIGZAG, &ux, &uw, &up, 1, &udy, &uds,
                                                 OPTS_ISA(1, MASKPACK_ISA_REF), NULL, &dx, &dw, &dp, &e) != 0;
    for (int64_t i = 0; i < tl; i++) bad += differ(cy + i * C, yref + idx[i] * C, C);
    bad += differ(cst, sref, NSEQ * C * 3);
    bad += off_ref(cdx, J->dx, idx, tl, C, J->T, 0, 1e-5f);
    /* refusals: every rank gives the single-process call's error (the ranks share one CPU here) */
    maskpack_isa refused[2] = {(maskpack_isa)77, MASKPACK_ISA_AUTO};
    const maskpack_isa vec[4] = {MASKPACK_ISA_AVX2, MASKPACK_ISA_AVX512, MASKPACK_ISA_AVX512_BF16, MASKPACK_ISA_AMX};
    for (int i = 0; i < 4 && refused[1] == MASKPACK_ISA_AUTO; i++)
        if (maskpack_isa_resolve(MASKPACK_KERNEL_ATTENTION, MASKPACK_F32, vec[i], &best, &e) ==
            MASKPACK_ERR_UNSUPPORTED)
            refused[1] = vec[i];
    for (int i = 0; i < 2 && refused[i] != MASKPACK_ISA_AUTO; i++) {
        const maskpack_kernel_options *opts = OPTS_ISA(1, refused[i]);
        float *wout = zeros(J->T * HQ * D);
        int64_t aq[3] = {J->T, HQ, D}, ak[3] = {J->T, HK, D};
        maskpack_tensor tq = maskpack_tensor_contiguous((void *)J->q, MASKPACK_F32, 3, aq);
        maskpack_tensor tk = maskpack_tensor_contiguous((void *)J->k, MASKPACK_F32, 3, ak);
        maskpack_tensor tv = maskpack_tensor_contiguous((void *)J->v, MASKPACK_F32, 3, ak);
        maskpack_tensor to = maskpack_tensor_contiguous(wout, MASKPACK_F32, 3, aq);
        maskpack_status ls = maskpack_attention_forward(J->L, &tq, &tk, &tv, 0, 0, &to, NULL, opts, NULL, 0, &le);
        maskpack_tensor o = maskpack_tensor_contiguous(ro[2][0], MASKPACK_F32, 3, sq);
        maskpack_tensor l = maskpack_tensor_contiguous(ro[2][1], MASKPACK_F32, 2, sl);
        maskpack_tensor dq = maskpack_tensor_contiguous(ro[2][2], MASKPACK_F32, 3, sq);
        maskpack_tensor dk = maskpack_tensor_contiguous(ro[2][3], MASKPACK_F32, 3, sk);
        maskpack_tensor dv = maskpack_tensor_contiguous(ro[2][4], MASKPACK_F32, 3, sk);
        maskpack_status s =
            maskpack_cp_attention_forward(comm, J->L, MASKPACK_CP_ZIGZAG, &uq, &uk, &uv, 0, 0, &o, &l, opts, &e);
        bad += same_error(&e, s, &le, ls);
        s = maskpack_cp_attention_forward_on(comm, J->L, MASKPACK_CP_ZIGZAG, &uq, &uk, &uv, 0, 0, &o, &l, opts, NULL,
                                             &e);
        bad += same_error(&e, s, &le, ls);
        s = maskpack_cp_attention_backward(comm, J->L, MASKPACK_CP_ZIGZAG, &udo, &uq, &uk, &uv, &o, &l, 0, 0, &dq, &dk,
                                           &dv, opts, &e);
        bad += same_error(&e, s, &le, ls);
        ls = maskpack_causal_conv1d(J->L, &wx, &uw, &up, 1, opts, &wy, &ws, &le);
        s = maskpack_cp_causal_conv1d(comm, J->L, MASKPACK_CP_ZIGZAG, &ux, &uw, &up, 1, opts, &y, &st, &e);
        bad += same_error(&e, s, &le, ls);
        s = maskpack_cp_causal_conv1d_backward(comm, J->L, MASKPACK_CP_ZIGZAG, &ux, &uw, &up, 1, &udy, &uds, opts, &dx,
                                               &dw, &dp, &e);
        bad += same_error(&e, s, &le, ls);
        free(wout);
    }
    for (int run = 0; run < 3; run++)
        for (int i = 0; i < 5; i++) free(ro[run][i]);
    free(q), free(k), free(v), free(dout), free(wo), free(wl), free(yref), free(sref);
    free(cx), free(cdy), free(cy), free(cst), free(cdx), free(cdw), free(cdp);
    return bad;
}

static void *rank_main(void *arg) {
    job *J = arg;
    local_rank rc = {J->h, J->rank};
    maskpack_comm comm = local_comm(&rc);
    maskpack_error e;
    const int64_t T = J->T, tl = T / J->n;
    int64_t *idx = malloc((size_t)tl * sizeof *idx);
    maskpack_tensor ti = maskpack_tensor_contiguous(idx, MASKPACK_I64, 1, &tl);
    J->bad[7] += maskpack_cp_shard_indices(J->L, J->n, J->rank, MASKPACK_CP_ZIGZAG, &ti, &e) != MASKPACK_OK;
    /* ring attention */
    float *lq = malloc((size_t)(tl * HQ * D) * 4), *lk = malloc((size_t)(tl * HK * D) * 4),
          *lv = malloc((size_t)(tl * HK * D) * 4);
    float *ldo = malloc((size_t)(tl * HQ * D) * 4), *lo = malloc((size_t)(tl * HQ * D) * 4),
          *ll = malloc((size_t)(tl * HQ) * 4);
    float *ldq = malloc((size_t)(tl * HQ * D) * 4), *ldk = malloc((size_t)(tl * HK * D) * 4),
          *ldv = malloc((size_t)(tl * HK * D) * 4);
    gather_rows(lq, J->q, idx, tl, HQ * D), gather_rows(lk, J->k, idx, tl, HK * D),
        gather_rows(lv, J->v, idx, tl, HK * D);
    gather_rows(ldo, J->dout, idx, tl, HQ * D);
    int64_t sq[3] = {tl, HQ, D}, sk[3] = {tl, HK, D}, sl[2] = {HQ, tl};
    maskpack_tensor uq = maskpack_tensor_contiguous(lq, MASKPACK_F32, 3, sq),
                    uk = maskpack_tensor_contiguous(lk, MASKPACK_F32, 3, sk);
    maskpack_tensor uv = maskpack_tensor_contiguous(lv, MASKPACK_F32, 3, sk),
                    udo = maskpack_tensor_contiguous(ldo, MASKPACK_F32, 3, sq);
    maskpack_tensor uo = maskpack_tensor_contiguous(lo, MASKPACK_F32, 3, sq),
                    ul = maskpack_tensor_contiguous(ll, MASKPACK_F32, 2, sl);
    maskpack_tensor udq = maskpack_tensor_contiguous(ldq, MASKPACK_F32, 3, sq),
                    udk = maskpack_tensor_contiguous(ldk, MASKPACK_F32, 3, sk);
    maskpack_tensor udv = maskpack_tensor_contiguous(ldv, MASKPACK_F32, 3, sk);
    J->bad[7] +=
        maskpack_cp_attention_forward(&comm, J->L, MASKPACK_CP_ZIGZAG, &uq, &uk, &uv, 0, 0, &uo, &ul, NULL, &e) != 0;
    J->bad[7] += maskpack_cp_attention_backward(&comm, J->L, MASKPACK_CP_ZIGZAG, &udo, &uq, &uk, &uv, &uo, &ul, 0, 0,
                                                &udq, &udk, &udv, NULL, &e) != 0;
    for (int64_t i = 0; i < tl; i++) {
        for (int64_t c = 0; c < HQ * D; c++) {
            J->bad[0] += !close_to(lo[i * HQ * D + c], J->out[idx[i] * HQ * D + c], 1e-5f);
            J->bad[1] += !close_to(ldq[i * HQ * D + c], J->dq[idx[i] * HQ * D + c], 1e-4f);
        }
        for (int64_t c = 0; c < HK * D; c++) {
            J->bad[1] += !close_to(ldk[i * HK * D + c], J->dk[idx[i] * HK * D + c], 1e-4f);
            J->bad[1] += !close_to(ldv[i * HK * D + c], J->dv[idx[i] * HK * D + c], 1e-4f);
        }
        for (int64_t h = 0; h < HQ; h++) J->bad[0] += !close_to(ll[h * tl + i], J->lse[h * T + idx[i]], 1e-5f);
    }
    free(lq), free(lk), free(lv), free(ldo), free(lo), free(ll), free(ldq), free(ldk), free(ldv);
    /* sequence-parallel gated delta rule */
    float *aq = malloc((size_t)(tl * H * K) * 4), *ak = malloc((size_t)(tl * H * K) * 4),
          *av = malloc((size_t)(tl * HV * V) * 4);
    float *ag = malloc((size_t)(tl * HV) * 4), *ab = malloc((size_t)(tl * HV) * 4),
          *ado = malloc((size_t)(tl * HV * V) * 4);
    float *ao = malloc((size_t)(tl * HV * V) * 4), *afin = malloc((size_t)(NSEQ * HV * K * V) * 4);
    float *adq = malloc((size_t)(tl * H * K) * 4), *adk = malloc((size_t)(tl * H * K) * 4),
          *adv = malloc((size_t)(tl * HV * V) * 4);
    float *adg = malloc((size_t)(tl * HV) * 4), *adb = malloc((size_t)(tl * HV) * 4);
    gather_rows(aq, J->gq, idx, tl, H * K), gather_rows(ak, J->gk, idx, tl, H * K),
        gather_rows(av, J->gv, idx, tl, HV * V);
    gather_rows(ag, J->gg, idx, tl, HV), gather_rows(ab, J->gb, idx, tl, HV), gather_rows(ado, J->gdo, idx, tl, HV * V);
    int64_t s3q[3] = {tl, H, K}, s3v[3] = {tl, HV, V}, s2[2] = {tl, HV}, s4[4] = {NSEQ, HV, K, V};
    maskpack_tensor tq = maskpack_tensor_contiguous(aq, MASKPACK_F32, 3, s3q),
                    tk = maskpack_tensor_contiguous(ak, MASKPACK_F32, 3, s3q);
    maskpack_tensor tv = maskpack_tensor_contiguous(av, MASKPACK_F32, 3, s3v),
                    tg = maskpack_tensor_contiguous(ag, MASKPACK_F32, 2, s2);
    maskpack_tensor tb = maskpack_tensor_contiguous(ab, MASKPACK_F32, 2, s2),
                    tdo = maskpack_tensor_contiguous(ado, MASKPACK_F32, 3, s3v);
    maskpack_tensor th0 = maskpack_tensor_contiguous((void *)J->h0, MASKPACK_F32, 4, s4);
    maskpack_tensor tdf = maskpack_tensor_contiguous((void *)J->dfin, MASKPACK_F32, 4, s4);
    maskpack_tensor to = maskpack_tensor_contiguous(ao, MASKPACK_F32, 3, s3v),
                    tf = maskpack_tensor_contiguous(afin, MASKPACK_F32, 4, s4);
    maskpack_tensor tdq = maskpack_tensor_contiguous(adq, MASKPACK_F32, 3, s3q),
                    tdk = maskpack_tensor_contiguous(adk, MASKPACK_F32, 3, s3q);
    maskpack_tensor tdv = maskpack_tensor_contiguous(adv, MASKPACK_F32, 3, s3v),
                    tdg = maskpack_tensor_contiguous(adg, MASKPACK_F32, 2, s2);
    maskpack_tensor tdb = maskpack_tensor_contiguous(adb, MASKPACK_F32, 2, s2),
                    tdh = maskpack_tensor_contiguous(J->dh_share, MASKPACK_F32, 4, s4);
    maskpack_gdn_inputs in = {&tq, &tk, &tv, &tg, &tb, &th0};
    maskpack_gdn_options opts = maskpack_gdn_options_default();
    maskpack_gdn_grads gr = {&tdq, &tdk, &tdv, &tdg, &tdb, &tdh};
    J->bad[7] += maskpack_cp_gdn_forward(&comm, J->L, MASKPACK_CP_ZIGZAG, &in, &opts, &to, &tf, &e) != 0;
    J->bad[7] += maskpack_cp_gdn_backward(&comm, J->L, MASKPACK_CP_ZIGZAG, &in, &tdo, &tdf, &opts, &gr, &e) != 0;
    for (int64_t i = 0; i < tl; i++) {
        for (int64_t c = 0; c < HV * V; c++) {
            J->bad[2] += !close_to(ao[i * HV * V + c], J->go[idx[i] * HV * V + c], 1e-4f);
            J->bad[3] += !close_to(adv[i * HV * V + c], J->gdv[idx[i] * HV * V + c], 1e-3f);
        }
        for (int64_t c = 0; c < H * K; c++) {
            J->bad[3] += !close_to(adq[i * H * K + c], J->gdq[idx[i] * H * K + c], 1e-3f);
            J->bad[3] += !close_to(adk[i * H * K + c], J->gdk[idx[i] * H * K + c], 1e-3f);
        }
        for (int64_t c = 0; c < HV; c++) {
            J->bad[3] += !close_to(adg[i * HV + c], J->gdg[idx[i] * HV + c], 1e-3f);
            J->bad[3] += !close_to(adb[i * HV + c], J->gdb[idx[i] * HV + c], 1e-3f);
        }
    }
    for (int64_t c = 0; c < NSEQ * HV * K * V; c++) J->bad[2] += !close_to(afin[c], J->gfin[c], 1e-4f);
    free(aq), free(ak), free(av), free(ag), free(ab), free(ado), free(ao), free(afin), free(adq), free(adk), free(adv);
    free(adg), free(adb);
    /* sequence-parallel conv */
    float *cx = malloc((size_t)(tl * C) * 4), *cdy = malloc((size_t)(tl * C) * 4), *cy = malloc((size_t)(tl * C) * 4);
    float *cst = malloc((size_t)(NSEQ * C * 3) * 4), *cdx = malloc((size_t)(tl * C) * 4);
    gather_rows(cx, J->x, idx, tl, C), gather_rows(cdy, J->dy, idx, tl, C);
    int64_t sx[2] = {tl, C}, sw[2] = {C, W}, sp[3] = {NSEQ, C, 3};
    maskpack_tensor ux = maskpack_tensor_contiguous(cx, MASKPACK_F32, 2, sx),
                    uw = maskpack_tensor_contiguous((void *)J->w, MASKPACK_F32, 2, sw);
    maskpack_tensor up = maskpack_tensor_contiguous((void *)J->pre, MASKPACK_F32, 3, sp),
                    udy = maskpack_tensor_contiguous(cdy, MASKPACK_F32, 2, sx);
    maskpack_tensor uds = maskpack_tensor_contiguous((void *)J->dst, MASKPACK_F32, 3, sp),
                    uy = maskpack_tensor_contiguous(cy, MASKPACK_F32, 2, sx);
    maskpack_tensor ust = maskpack_tensor_contiguous(cst, MASKPACK_F32, 3, sp),
                    udx = maskpack_tensor_contiguous(cdx, MASKPACK_F32, 2, sx);
    maskpack_tensor udw = maskpack_tensor_contiguous(J->dw_share, MASKPACK_F32, 2, sw),
                    udp = maskpack_tensor_contiguous(J->dp_share, MASKPACK_F32, 3, sp);
    J->bad[7] += maskpack_cp_causal_conv1d(&comm, J->L, MASKPACK_CP_ZIGZAG, &ux, &uw, &up, 1, NULL, &uy, &ust, &e) != 0;
    J->bad[7] += maskpack_cp_causal_conv1d_backward(&comm, J->L, MASKPACK_CP_ZIGZAG, &ux, &uw, &up, 1, &udy, &uds, NULL,
                                                    &udx, &udw, &udp, &e) != 0;
    for (int64_t i = 0; i < tl; i++)
        for (int64_t c = 0; c < C; c++) {
            J->bad[4] += cy[i * C + c] != J->y[idx[i] * C + c];
            J->bad[5] += !close_to(cdx[i * C + c], J->dx[idx[i] * C + c], 1e-5f);
        }
    for (int64_t c = 0; c < NSEQ * C * 3; c++) J->bad[4] += cst[c] != J->st[c];
    free(cx), free(cdy), free(cy), free(cst), free(cdx);
    J->bad[8] += teams_match(J, &comm, idx, tl);
    J->bad[9] += isa_reaches(J, &comm, idx, tl);
    free(idx);
    /* refusals every rank reaches alike: a padded layout for the GDN, bf16 for the ring */
    maskpack_status s = maskpack_cp_gdn_forward(&comm, J->Lpad, MASKPACK_CP_ZIGZAG, &in, &opts, &to, NULL, &e);
    J->bad[6] += s != MASKPACK_ERR_UNSUPPORTED;
    maskpack_tensor bq = uq;
    if (J->rank == 0) bq.dtype = MASKPACK_BF16;
    s = maskpack_cp_attention_forward(&comm, J->L, MASKPACK_CP_ZIGZAG, &bq, &uk, &uv, 0, 0, &uo, NULL, NULL, &e);
    J->bad[6] += s != MASKPACK_ERR_DTYPE;
    return NULL;
}

static float *filled(size_t n, uint64_t *seed, float scale, float shift) {
    float *p = malloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = shift + scale * rnd(seed);
    return p;
}

static void run_ranks(int n) {
    maskpack_error e;
    maskpack_layout *L = aligned(n, 1), *Lpad = aligned(n, 0);
    const int64_t T = maskpack_layout_q_width(L);
    uint64_t seed = 17 + (uint64_t)n;
    job base;
    memset(&base, 0, sizeof base);
    base.L = L, base.Lpad = Lpad, base.T = T;
    /* attention reference */
    float *q = filled((size_t)(T * HQ * D), &seed, 1, 0), *k = filled((size_t)(T * HK * D), &seed, 1, 0);
    float *v = filled((size_t)(T * HK * D), &seed, 1, 0), *dout = filled((size_t)(T * HQ * D), &seed, 1, 0);
    float *out = malloc((size_t)(T * HQ * D) * 4), *lse = malloc((size_t)(T * HQ) * 4),
          *dq = malloc((size_t)(T * HQ * D) * 4);
    float *dk = malloc((size_t)(T * HK * D) * 4), *dv = malloc((size_t)(T * HK * D) * 4);
    int64_t aq[3] = {T, HQ, D}, ak[3] = {T, HK, D}, al[2] = {HQ, T};
    maskpack_tensor tq = maskpack_tensor_contiguous(q, MASKPACK_F32, 3, aq),
                    tk = maskpack_tensor_contiguous(k, MASKPACK_F32, 3, ak);
    maskpack_tensor tv = maskpack_tensor_contiguous(v, MASKPACK_F32, 3, ak),
                    tdo = maskpack_tensor_contiguous(dout, MASKPACK_F32, 3, aq);
    maskpack_tensor to = maskpack_tensor_contiguous(out, MASKPACK_F32, 3, aq),
                    tl = maskpack_tensor_contiguous(lse, MASKPACK_F32, 2, al);
    maskpack_tensor tdq = maskpack_tensor_contiguous(dq, MASKPACK_F32, 3, aq),
                    tdk = maskpack_tensor_contiguous(dk, MASKPACK_F32, 3, ak);
    maskpack_tensor tdv = maskpack_tensor_contiguous(dv, MASKPACK_F32, 3, ak);
    CHECK_OK(maskpack_attention_forward(L, &tq, &tk, &tv, 0, 0, &to, &tl, NULL, NULL, 0, &e), e);
    CHECK_OK(maskpack_attention_backward(L, &tdo, &tq, &tk, &tv, &to, &tl, 0, 0, &tdq, &tdk, &tdv, NULL, NULL, 0, &e),
             e);
    base.q = q, base.k = k, base.v = v, base.dout = dout, base.out = out, base.lse = lse, base.dq = dq, base.dk = dk;
    base.dv = dv;
    /* gated delta rule reference */
    float *gq = filled((size_t)(T * H * K), &seed, 1, 0), *gk = filled((size_t)(T * H * K), &seed, 1, 0);
    float *gv = filled((size_t)(T * HV * V), &seed, 1, 0), *gg = filled((size_t)(T * HV), &seed, 0.2f, -0.25f);
    float *gb = filled((size_t)(T * HV), &seed, 0.4f, 0.5f), *h0 = filled(NSEQ * HV * K * V, &seed, 0.1f, 0);
    float *gdo = filled((size_t)(T * HV * V), &seed, 1, 0), *dfin = filled(NSEQ * HV * K * V, &seed, 1, 0);
    float *go = malloc((size_t)(T * HV * V) * 4), *gfin = malloc(NSEQ * HV * K * V * 4),
          *gdq = malloc((size_t)(T * H * K) * 4);
    float *gdk = malloc((size_t)(T * H * K) * 4), *gdv = malloc((size_t)(T * HV * V) * 4),
          *gdg = malloc((size_t)(T * HV) * 4);
    float *gdb = malloc((size_t)(T * HV) * 4), *gdh = malloc(NSEQ * HV * K * V * 4);
    int64_t s3q[3] = {T, H, K}, s3v[3] = {T, HV, V}, s2[2] = {T, HV}, s4[4] = {NSEQ, HV, K, V};
    maskpack_tensor a = maskpack_tensor_contiguous(gq, MASKPACK_F32, 3, s3q),
                    b = maskpack_tensor_contiguous(gk, MASKPACK_F32, 3, s3q);
    maskpack_tensor c = maskpack_tensor_contiguous(gv, MASKPACK_F32, 3, s3v),
                    d = maskpack_tensor_contiguous(gg, MASKPACK_F32, 2, s2);
    maskpack_tensor f = maskpack_tensor_contiguous(gb, MASKPACK_F32, 2, s2),
                    hh = maskpack_tensor_contiguous(h0, MASKPACK_F32, 4, s4);
    maskpack_tensor o = maskpack_tensor_contiguous(go, MASKPACK_F32, 3, s3v),
                    fin = maskpack_tensor_contiguous(gfin, MASKPACK_F32, 4, s4);
    maskpack_tensor xdo = maskpack_tensor_contiguous(gdo, MASKPACK_F32, 3, s3v),
                    xdf = maskpack_tensor_contiguous(dfin, MASKPACK_F32, 4, s4);
    maskpack_tensor xq = maskpack_tensor_contiguous(gdq, MASKPACK_F32, 3, s3q),
                    xk = maskpack_tensor_contiguous(gdk, MASKPACK_F32, 3, s3q);
    maskpack_tensor xv = maskpack_tensor_contiguous(gdv, MASKPACK_F32, 3, s3v),
                    xg = maskpack_tensor_contiguous(gdg, MASKPACK_F32, 2, s2);
    maskpack_tensor xb = maskpack_tensor_contiguous(gdb, MASKPACK_F32, 2, s2),
                    xh = maskpack_tensor_contiguous(gdh, MASKPACK_F32, 4, s4);
    maskpack_gdn_inputs in = {&a, &b, &c, &d, &f, &hh};
    maskpack_gdn_options opts = maskpack_gdn_options_default();
    maskpack_gdn_grads gr = {&xq, &xk, &xv, &xg, &xb, &xh};
    CHECK_OK(maskpack_gdn_forward(L, &in, &opts, &o, &fin, NULL, 0, &e), e);
    CHECK_OK(maskpack_gdn_backward(L, &in, &xdo, &xdf, &opts, &gr, NULL, 0, &e), e);
    base.gq = gq, base.gk = gk, base.gv = gv, base.gg = gg, base.gb = gb, base.h0 = h0, base.gdo = gdo,
    base.dfin = dfin;
    base.go = go, base.gfin = gfin, base.gdq = gdq, base.gdk = gdk, base.gdv = gdv, base.gdg = gdg, base.gdb = gdb;
    base.gdh = gdh;
    /* conv reference */
    float *x = filled((size_t)(T * C), &seed, 1, 0), *w = filled(C * W, &seed, 0.5f, 0),
          *pre = filled(NSEQ * C * 3, &seed, 1, 0);
    float *dy = filled((size_t)(T * C), &seed, 1, 0), *dst = filled(NSEQ * C * 3, &seed, 1, 0);
    float *y = malloc((size_t)(T * C) * 4), *st = malloc(NSEQ * C * 3 * 4), *dx = malloc((size_t)(T * C) * 4);
    float *dw = malloc(C * W * 4), *dp = malloc(NSEQ * C * 3 * 4);
    int64_t sx[2] = {T, C}, sw[2] = {C, W}, sp[3] = {NSEQ, C, 3};
    maskpack_tensor cx = maskpack_tensor_contiguous(x, MASKPACK_F32, 2, sx),
                    cw = maskpack_tensor_contiguous(w, MASKPACK_F32, 2, sw);
    maskpack_tensor cp = maskpack_tensor_contiguous(pre, MASKPACK_F32, 3, sp),
                    cdy = maskpack_tensor_contiguous(dy, MASKPACK_F32, 2, sx);
    maskpack_tensor cds = maskpack_tensor_contiguous(dst, MASKPACK_F32, 3, sp),
                    cy = maskpack_tensor_contiguous(y, MASKPACK_F32, 2, sx);
    maskpack_tensor cst = maskpack_tensor_contiguous(st, MASKPACK_F32, 3, sp),
                    cdx = maskpack_tensor_contiguous(dx, MASKPACK_F32, 2, sx);
    maskpack_tensor cdw = maskpack_tensor_contiguous(dw, MASKPACK_F32, 2, sw),
                    cdp = maskpack_tensor_contiguous(dp, MASKPACK_F32, 3, sp);
    CHECK_OK(maskpack_causal_conv1d(L, &cx, &cw, &cp, 1, NULL, &cy, &cst, &e), e);
    CHECK_OK(maskpack_causal_conv1d_backward(L, &cx, &cw, &cp, 1, &cdy, &cds, NULL, &cdx, &cdw, &cdp, &e), e);
    base.x = x, base.w = w, base.pre = pre, base.dy = dy, base.dst = dst, base.y = y, base.st = st, base.dx = dx;
    base.dw = dw, base.dp = dp;
    /* the ranks */
    local_hub h;
    local_hub_init(&h, n);
    job *jobs = calloc((size_t)n, sizeof *jobs);
    pthread_t th[MAXR];
    for (int r = 0; r < n; r++) {
        jobs[r] = base;
        jobs[r].n = n, jobs[r].rank = r, jobs[r].h = &h;
        pthread_create(&th[r], NULL, rank_main, &jobs[r]);
    }
    for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
    /* the replicated gradients: each rank's share summed */
    int64_t bad_sum = 0;
    for (int64_t i = 0; i < NSEQ * HV * K * V; i++) {
        float s = 0;
        for (int r = 0; r < n; r++) s += jobs[r].dh_share[i];
        bad_sum += !close_to(s, gdh[i], 1e-3f);
    }
    for (int64_t i = 0; i < C * W; i++) {
        float s = 0;
        for (int r = 0; r < n; r++) s += jobs[r].dw_share[i];
        bad_sum += !close_to(s, dw[i], 1e-4f);
    }
    for (int64_t i = 0; i < NSEQ * C * 3; i++) {
        float s = 0;
        for (int r = 0; r < n; r++) s += jobs[r].dp_share[i];
        bad_sum += !close_to(s, dp[i], 1e-5f);
    }
    for (int r = 0; r < n; r++) {
        const char *what[10] = {"attention out/lse",
                                "attention grads",
                                "gdn out/final",
                                "gdn grads",
                                "conv y/state",
                                "conv dx",
                                "refusals",
                                "call statuses",
                                "a team's bits against n_threads'",
                                "an explicit ISA in opts"};
        for (int i = 0; i < 10; i++) {
            if (jobs[r].bad[i])
                fprintf(stderr, "%d ranks, rank %d: %s: %lld bad\n", n, r, what[i], (long long)jobs[r].bad[i]);
            CHECK_EQ(jobs[r].bad[i], 0);
        }
    }
    CHECK_EQ(bad_sum, 0);
    local_hub_destroy(&h);
    free(jobs);
    free(q), free(k), free(v), free(dout), free(out), free(lse), free(dq), free(dk), free(dv);
    free(gq), free(gk), free(gv), free(gg), free(gb), free(h0), free(gdo), free(dfin), free(go), free(gfin), free(gdq);
    free(gdk), free(gdv), free(gdg), free(gdb), free(gdh);
    free(x), free(w), free(pre), free(dy), free(dst), free(y), free(st), free(dx), free(dw), free(dp);
    maskpack_layout_free(L);
    maskpack_layout_free(Lpad);
}

/* ---- key-block segments ----------------------------------------------------------------------- */

static void test_key_blocks(void) {
    maskpack_error e;
    maskpack_layout *L = NULL;
    maskpack_rule r = maskpack_rule_default();
    /* queries at positions [20, 24) against a key block at [8, 16): causal, all 8 keys visible */
    maskpack_segment s = {.row = 0,
                          .q_start = 0,
                          .q_len = 4,
                          .kv_start = 0,
                          .kv_len = 8,
                          .flags = MASKPACK_SEGMENT_EXPLICIT_POS | MASKPACK_SEGMENT_KEY_BLOCK,
                          .q_pos = 20,
                          .kv_pos = 8};
    CHECK_OK(maskpack_layout_from_segments(&s, 1, 1, 4, 8, 1, &r, &L, &e), e);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 8; j++) CHECK_EQ(maskpack_allowed(L, 0, 0, i, j), 1);
    /* the same block after the queries: nothing visible; partly overlapping: the causal diagonal */
    maskpack_layout *L2 = NULL, *L3 = NULL;
    s.q_pos = 2;
    CHECK_OK(maskpack_layout_from_segments(&s, 1, 1, 4, 8, 1, &r, &L2, &e), e);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 8; j++) CHECK_EQ(maskpack_allowed(L2, 0, 0, i, j), 0);
    s.q_pos = 10;
    CHECK_OK(maskpack_layout_from_segments(&s, 1, 1, 4, 8, 1, &r, &L3, &e), e);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 8; j++) CHECK_EQ(maskpack_allowed(L3, 0, 0, i, j), 8 + j <= 10 + i);
    /* tensors do not move through a layout of key blocks */
    maskpack_relayout_plan *plan = NULL;
    const maskpack_layout *srcs[1] = {L3};
    CHECK_STATUS(maskpack_relayout_plan_create(srcs, 1, L3, &plan, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "key blocks");
    maskpack_layout_free(L), maskpack_layout_free(L2), maskpack_layout_free(L3);
    /* refusals: KEY_BLOCK without EXPLICIT_POS, kv_pos without KEY_BLOCK, negative positions, spans */
    maskpack_layout *bad = NULL;
    maskpack_segment t = s;
    t.flags = MASKPACK_SEGMENT_KEY_BLOCK;
    CHECK_STATUS(maskpack_layout_from_segments(&t, 1, 1, 4, 8, 1, &r, &bad, &e), MASKPACK_ERR_VALUE, e);
    CHECK_MSG(e, "segments[0].flags");
    t = s;
    t.flags = MASKPACK_SEGMENT_EXPLICIT_POS;
    t.q_pos = 0;
    CHECK_STATUS(maskpack_layout_from_segments(&t, 1, 1, 4, 8, 1, &r, &bad, &e), MASKPACK_ERR_VALUE, e);
    CHECK_MSG(e, "kv_pos: expected 0 without MASKPACK_SEGMENT_KEY_BLOCK");
    t = s;
    t.kv_pos = -1;
    CHECK_STATUS(maskpack_layout_from_segments(&t, 1, 1, 4, 8, 1, &r, &bad, &e), MASKPACK_ERR_VALUE, e);
    CHECK_MSG(e, "a key block needs 0 <= q_pos, kv_pos");
    maskpack_span sp = {0, 0, 2};
    r.spans = &sp;
    r.n_spans = 1;
    CHECK_STATUS(maskpack_layout_from_segments(&s, 1, 1, 4, 8, 1, &r, &bad, &e), MASKPACK_ERR_RULE, e);
    CHECK_MSG(e, "spans need the keys from the sequence start");
    r = maskpack_rule_default();
    int64_t prefix[1] = {2};
    r.prefix = prefix;
    r.n_prefix = 1;
    CHECK_STATUS(maskpack_layout_from_segments(&s, 1, 1, 4, 8, 1, &r, &bad, &e), MASKPACK_ERR_RULE, e);
    CHECK_MSG(e, "a prefix needs the keys from the sequence start");
}

int main(void) {
    test_key_blocks();
    for (int n = 1; n <= MAXR; n++) run_ranks(n);
    return check_report("test_cp_local");
}
