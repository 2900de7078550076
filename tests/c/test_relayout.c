/* test_relayout.c: pack, unpack, CP shard, CP gather and compositions through the copy-plan engine,
 * checked token by token against the layouts' own index maps, plus every error path. */
#include "check.h"
#include "cp_expect.h"

#include <pthread.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static test_rng rng = {0x2545f4914f6cdd1dull};
static int64_t rnd_in(int64_t lo, int64_t hi) { return test_rng_in(&rng, lo, hi); }

/* value of token (row, col), channel c: unique per token so misplaced copies are caught */
static float tokval(int64_t row, int64_t col, int64_t c) { return (float)(row * 100000 + col * 10 + c) + 0.5f; }

static maskpack_layout *padded_layout(int64_t *lens, size_t n, int left, int64_t width) {
    maskpack_segment s[16];
    for (size_t k = 0; k < n; k++) {
        int64_t st = left ? width - lens[k] : 0;
        s[k] = (maskpack_segment){(int64_t)k, st, lens[k], st, lens[k]};
    }
    maskpack_layout *L = NULL;
    maskpack_error e;
    CHECK_OK(maskpack_layout_from_segments(s, n, (int64_t)n, width, width, 0, NULL, &L, &e), e);
    return L;
}

static void test_pack_unpack_roundtrip(void) {
    for (int iter = 0; iter < 200; iter++) {
        size_t n = (size_t)rnd_in(1, 6);
        int64_t lens[16], width = 0;
        for (size_t k = 0; k < n; k++) {
            lens[k] = rnd_in(0, 12);
            if (lens[k] > width) width = lens[k];
        }
        width += rnd_in(0, 3);
        int left = (int)rnd_in(0, 1);
        const int64_t C = 3, pitch = width + rnd_in(0, 2); /* strided rows: pitch >= width */
        maskpack_layout *L = padded_layout(lens, n, left, width), *Pk = NULL;
        maskpack_error e;
        if (!L) continue;
        CHECK_OK(maskpack_layout_packed_of(L, &Pk, &e), e);
        if (!Pk) continue;
        int64_t T = maskpack_layout_q_width(Pk);
        float *x = malloc(sizeof(float) * (size_t)(n * pitch * C + 1));
        float *packed = malloc(sizeof(float) * (size_t)(T * C + 1));
        float *back = malloc(sizeof(float) * (size_t)(n * width * C + 1));
        for (int64_t b = 0; b < (int64_t)n; b++)
            for (int64_t s = 0; s < pitch; s++)
                for (int64_t c = 0; c < C; c++) x[(b * pitch + s) * C + c] = tokval(b, s, c);
        maskpack_tensor xt = {x, MASKPACK_F32, 3, {(int64_t)n, width, C}, {pitch * C, C, 1}};
        int64_t pshape[2] = {T, C}, bshape[3] = {(int64_t)n, width, C};
        maskpack_tensor pt = maskpack_tensor_contiguous(packed, MASKPACK_F32, 2, pshape);
        maskpack_tensor bt = maskpack_tensor_contiguous(back, MASKPACK_F32, 3, bshape);
        CHECK_OK(maskpack_relayout(L, Pk, &xt, &pt, NULL, 1 + iter % 2, &e), e);
        /* packed token t is the t-th real token in row-major order */
        int64_t t = 0;
        for (int64_t b = 0; b < (int64_t)n; b++) {
            int64_t st = left ? width - lens[b] : 0;
            for (int64_t s = st; s < st + lens[b]; s++, t++)
                for (int64_t c = 0; c < C; c++) CHECK(packed[t * C + c] == tokval(b, s, c));
        }
        CHECK_EQ(t, T);
        float pad = -7.25f;
        CHECK_OK(maskpack_relayout(Pk, L, &pt, &bt, &pad, 1, &e), e);
        for (int64_t b = 0; b < (int64_t)n; b++) {
            int64_t st = left ? width - lens[b] : 0;
            for (int64_t s = 0; s < width; s++)
                for (int64_t c = 0; c < C; c++) {
                    float want = (s >= st && s < st + lens[b]) ? tokval(b, s, c) : pad;
                    CHECK(back[(b * width + s) * C + c] == want);
                }
        }
        free(x);
        free(packed);
        free(back);
        maskpack_layout_free(L);
        maskpack_layout_free(Pk);
    }
}

static void test_shard_gather(void) {
    for (int iter = 0; iter < 120; iter++) {
        int64_t cp = (int64_t)1 << rnd_in(0, 2);
        size_t n = (size_t)rnd_in(1, 5);
        int64_t lens[16], width = 0;
        for (size_t k = 0; k < n; k++) {
            lens[k] = rnd_in(0, 20);
            if (lens[k] > width) width = lens[k];
        }
        maskpack_error e;
        maskpack_layout *Pd = padded_layout(lens, n, 0, width), *Pk = NULL, *G = NULL;
        if (!Pd) continue;
        CHECK_OK(maskpack_layout_packed_of(Pd, &Pk, &e), e);
        CHECK_OK(maskpack_layout_pad_to_multiple(Pk, 2 * cp, &G, &e), e); /* the packed, CP-aligned layout */
        if (!G) continue;
        int64_t T = maskpack_layout_q_width(G), local = T / cp;
        int16_t *xg = malloc(sizeof(int16_t) * (size_t)(T + 1));
        int16_t *xpad = malloc(sizeof(int16_t) * (size_t)(n * width + 1));
        for (int64_t t = 0; t < T; t++) xg[t] = (int16_t)(t * 3 + 1);
        for (int64_t t = 0; t < (int64_t)n * width; t++) xpad[t] = (int16_t)(1000 + t);
        maskpack_layout *parts[4] = {0};
        int16_t *shards[4] = {0};
        maskpack_tensor st[4];
        const maskpack_tensor *sp[4];
        int64_t *idx = malloc(sizeof(int64_t) * (size_t)(local + 1));
        for (int64_t r = 0; r < cp; r++) {
            CHECK_OK(maskpack_layout_cp_shard(G, cp, r, MASKPACK_CP_ZIGZAG, &parts[r], &e), e);
            if (!parts[r]) continue;
            shards[r] = malloc(sizeof(int16_t) * (size_t)(local + 1));
            st[r] = maskpack_tensor_contiguous(shards[r], MASKPACK_I16, 1, &local);
            sp[r] = &st[r];
            maskpack_tensor gt = maskpack_tensor_contiguous(xg, MASKPACK_I16, 1, &T);
            int16_t fill = -1;
            CHECK_OK(maskpack_relayout(G, parts[r], &gt, &st[r], &fill, 1, &e), e);
            /* the rank's tokens from the zigzag definition (not the library's shard indices) */
            CHECK_EQ(expected_indices(G, cp, r, MASKPACK_CP_ZIGZAG, idx), local);
            for (int64_t t = 0; t < local; t++) {
                int real = maskpack_segment_of_query(parts[r], 0, t) >= 0;
                CHECK_EQ(shards[r][t], real ? xg[idx[t]] : -1);
            }
            /* composition: the padded batch straight into this rank's shard of the packed layout */
            int16_t *direct = malloc(sizeof(int16_t) * (size_t)(local + 1));
            maskpack_tensor dt = maskpack_tensor_contiguous(direct, MASKPACK_I16, 1, &local);
            int64_t ps[2] = {(int64_t)n, width};
            maskpack_tensor pt = maskpack_tensor_contiguous(xpad, MASKPACK_I16, 2, ps);
            CHECK_OK(maskpack_relayout(Pd, parts[r], &pt, &dt, &fill, 1, &e), e);
            for (int64_t t = 0; t < local; t++) {
                int64_t k = maskpack_segment_of_query(parts[r], 0, t);
                if (k < 0) {
                    CHECK_EQ(direct[t], -1);
                    continue;
                }
                maskpack_segment g;
                maskpack_layout_segment(parts[r], (size_t)k, &g, &e);
                int64_t pos = g.q_pos + (t - g.q_start); /* position in sequence g.origin */
                CHECK_EQ(direct[t], xpad[g.origin * width + pos]);
            }
            free(direct);
        }
        /* gather all parts back into the packed layout */
        int16_t *back = malloc(sizeof(int16_t) * (size_t)(T + 1));
        for (int64_t t = 0; t < T; t++) back[t] = 77;
        maskpack_relayout_plan *P = NULL;
        CHECK_OK(maskpack_relayout_plan_create((const maskpack_layout *const *)parts, (size_t)cp, G, &P, &e), e);
        maskpack_tensor bt = maskpack_tensor_contiguous(back, MASKPACK_I16, 1, &T);
        if (P) {
            CHECK(maskpack_relayout_plan_runs(P) > 0 || T == 0);
            CHECK_OK(maskpack_relayout_execute(P, sp, &bt, NULL, 2, &e), e);
            for (int64_t t = 0; t < T; t++) CHECK_EQ(back[t], maskpack_segment_of_query(G, 0, t) >= 0 ? xg[t] : 0);
            maskpack_relayout_plan_free(P);
        }
        /* a missing rank is an error naming the token without a source */
        if (cp > 1 && maskpack_layout_n_tokens(G) > 0) {
            P = NULL;
            for (int64_t t = 0; t < T; t++) back[t] = 55;
            maskpack_status s =
                maskpack_relayout_plan_create((const maskpack_layout *const *)parts, (size_t)cp - 1, G, &P, &e);
            if (maskpack_layout_n_tokens(parts[cp - 1]) > 0) {
                CHECK_EQ(s, MASKPACK_ERR_INVALID_ARGUMENT);
                CHECK_MSG(e, "has no source");
                CHECK(P == NULL);
            }
            maskpack_relayout_plan_free(P);
        }
        for (int64_t r = 0; r < cp; r++) {
            maskpack_layout_free(parts[r]);
            free(shards[r]);
        }
        free(back);
        free(idx);
        free(xg);
        free(xpad);
        maskpack_layout_free(Pd);
        maskpack_layout_free(Pk);
        maskpack_layout_free(G);
    }
}

static void test_threads_large(void) {
    /* 64 rows x 4096 tokens x 8 floats, random lengths: 2 threads give the same bytes as 1 */
    int64_t n = 64, width = 4096, C = 17;
    maskpack_segment s[64];
    for (int64_t b = 0; b < n; b++) {
        int64_t len = rnd_in(0, width);
        s[b] = (maskpack_segment){b, 0, len, 0, len};
    }
    maskpack_layout *L = NULL, *Pk = NULL;
    maskpack_error e;
    CHECK_OK(maskpack_layout_from_segments(s, (size_t)n, n, width, width, 0, NULL, &L, &e), e);
    CHECK_OK(maskpack_layout_packed_of(L, &Pk, &e), e);
    if (!L || !Pk) return;
    int64_t T = maskpack_layout_q_width(Pk);
    float *x = malloc(sizeof(float) * (size_t)(n * width * C));
    float *a = malloc(sizeof(float) * (size_t)(T * C + 1)), *b = malloc(sizeof(float) * (size_t)(T * C + 1));
    for (int64_t i = 0; i < n * width * C; i++) x[i] = (float)i;
    int64_t xs[3] = {n, width, C}, ps[2] = {T, C};
    maskpack_tensor xt = maskpack_tensor_contiguous(x, MASKPACK_F32, 3, xs);
    maskpack_tensor at = maskpack_tensor_contiguous(a, MASKPACK_F32, 2, ps);
    maskpack_tensor bt = maskpack_tensor_contiguous(b, MASKPACK_F32, 2, ps);
    CHECK_OK(maskpack_relayout(L, Pk, &xt, &at, NULL, 1, &e), e);
    CHECK_OK(maskpack_relayout(L, Pk, &xt, &bt, NULL, 2, &e), e);
    CHECK(memcmp(a, b, sizeof(float) * (size_t)(T * C)) == 0);
    /* unpack writes n*width*C floats (> 16 MiB with C = 17): the streaming-store path, odd token size */
    float *u1 = malloc(sizeof(float) * (size_t)(n * width * C)), *u2 = malloc(sizeof(float) * (size_t)(n * width * C));
    maskpack_tensor u1t = maskpack_tensor_contiguous(u1, MASKPACK_F32, 3, xs);
    maskpack_tensor u2t = maskpack_tensor_contiguous(u2, MASKPACK_F32, 3, xs);
    CHECK_OK(maskpack_relayout(Pk, L, &at, &u1t, NULL, 1, &e), e);
    CHECK_OK(maskpack_relayout(Pk, L, &at, &u2t, NULL, 2, &e), e);
    CHECK(memcmp(u1, u2, sizeof(float) * (size_t)(n * width * C)) == 0);
    int64_t bad = 0;
    for (int64_t r = 0; r < n; r++)
        for (int64_t c = 0; c < width; c++)
            for (int64_t k = 0; k < C; k++) {
                int64_t i = (r * width + c) * C + k;
                bad += u1[i] != (c < s[r].q_len ? x[i] : 0.0f);
            }
    CHECK_EQ(bad, 0);
    free(u1);
    free(u2);
    free(x);
    free(a);
    free(b);
    maskpack_layout_free(L);
    maskpack_layout_free(Pk);
}

static void test_errors(void) {
    int64_t lens[2] = {3, 2};
    maskpack_layout *L = padded_layout(lens, 2, 0, 4), *Pk = NULL, *Other = NULL;
    maskpack_error e;
    if (!L) return;
    CHECK_OK(maskpack_layout_packed_of(L, &Pk, &e), e);
    int64_t lens2[2] = {3, 1};
    Other = padded_layout(lens2, 2, 0, 4);
    float x[8 * 2] = {0}, out[5 * 2], sentinel = 123.0f;
    for (int i = 0; i < 10; i++) out[i] = sentinel;
    int64_t xs[3] = {2, 4, 2}, os[2] = {5, 2}, bad[2] = {4, 2};
    maskpack_tensor xt = maskpack_tensor_contiguous(x, MASKPACK_F32, 3, xs);
    maskpack_tensor ot = maskpack_tensor_contiguous(out, MASKPACK_F32, 2, os);
    maskpack_tensor small = maskpack_tensor_contiguous(out, MASKPACK_F32, 2, bad);
    CHECK_STATUS(maskpack_relayout(L, Pk, &xt, &small, NULL, 1, &e), MASKPACK_ERR_SHAPE, e);
    CHECK_MSG(e, "expected leading dimension 5");
    maskpack_tensor wrongdt = ot;
    wrongdt.dtype = MASKPACK_I32;
    CHECK_STATUS(maskpack_relayout(L, Pk, &xt, &wrongdt, NULL, 1, &e), MASKPACK_ERR_DTYPE, e);
    int64_t os3[2] = {5, 3};
    maskpack_tensor trail = maskpack_tensor_contiguous(out, MASKPACK_F32, 2, os3);
    CHECK_STATUS(maskpack_relayout(L, Pk, &xt, &trail, NULL, 1, &e), MASKPACK_ERR_SHAPE, e);
    maskpack_tensor alias = maskpack_tensor_contiguous(x, MASKPACK_F32, 2, os);
    CHECK_STATUS(maskpack_relayout(L, Pk, &xt, &alias, NULL, 1, &e), MASKPACK_ERR_OVERLAP, e);
    maskpack_tensor strided_inner = {out, MASKPACK_F32, 2, {5, 2}, {1, 5}};
    CHECK_STATUS(maskpack_relayout(L, Pk, &xt, &strided_inner, NULL, 1, &e), MASKPACK_ERR_SHAPE, e);
    CHECK_MSG(e, "contiguous");
    CHECK_STATUS(maskpack_relayout(L, Pk, &xt, &ot, NULL, 0, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    if (Other) {
        CHECK_STATUS(maskpack_relayout(L, Other, &xt, &xt, NULL, 1, &e), MASKPACK_ERR_SHAPE, e);
        CHECK_MSG(e, "sequence 1 has 1 tokens, the source's has 2");
    }
    for (int i = 0; i < 10; i++) CHECK(out[i] == sentinel); /* nothing written by failing calls */
    CHECK_STATUS(maskpack_relayout(NULL, Pk, &xt, &ot, NULL, 1, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
    maskpack_layout *Lp = NULL;
    CHECK_STATUS(maskpack_layout_padded_of(L, MASKPACK_PLACE_RIGHT, 2, &Lp, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_OK(maskpack_layout_padded_of(Pk, MASKPACK_PLACE_LEFT, 0, &Lp, &e), e);
    if (Lp) {
        maskpack_segment g;
        maskpack_layout_segment(Lp, 1, &g, &e);
        CHECK_EQ(g.q_start, 1); /* left padding in a width of 3 */
        CHECK_EQ(maskpack_layout_q_width(Lp), 3);
    }
    maskpack_layout_free(Lp);
    maskpack_layout_free(L);
    maskpack_layout_free(Pk);
    maskpack_layout_free(Other);
}

/* ---- worker team ---------------------------------------------------------------------------- */

typedef struct team_case {
    maskpack_layout *L, *Pk;
    float *x; /* [n, width, C] padded source */
    int64_t n, width, C, T;
    float *expect; /* [T, C] packed, from the single-threaded engine */
} team_case;

static void team_case_init(team_case *tc, int64_t n, int64_t width, int64_t C) {
    maskpack_segment s[16];
    for (int64_t b = 0; b < n; b++) {
        int64_t len = rnd_in(0, width);
        s[b] = (maskpack_segment){b, 0, len, 0, len};
    }
    maskpack_error e;
    tc->L = tc->Pk = NULL;
    CHECK_OK(maskpack_layout_from_segments(s, (size_t)n, n, width, width, 0, NULL, &tc->L, &e), e);
    CHECK_OK(maskpack_layout_packed_of(tc->L, &tc->Pk, &e), e);
    tc->n = n;
    tc->width = width;
    tc->C = C;
    tc->T = tc->Pk ? maskpack_layout_q_width(tc->Pk) : 0;
    tc->x = malloc(sizeof(float) * (size_t)(n * width * C));
    tc->expect = malloc(sizeof(float) * (size_t)(tc->T * C + 1));
    for (int64_t i = 0; i < n * width * C; i++) tc->x[i] = (float)i + 0.25f;
    int64_t xs[3] = {n, width, C}, ps[2] = {tc->T, C};
    maskpack_tensor xt = maskpack_tensor_contiguous(tc->x, MASKPACK_F32, 3, xs);
    maskpack_tensor et = maskpack_tensor_contiguous(tc->expect, MASKPACK_F32, 2, ps);
    CHECK_OK(maskpack_relayout(tc->L, tc->Pk, &xt, &et, NULL, 1, &e), e);
}

static void team_case_free(team_case *tc) {
    maskpack_layout_free(tc->L);
    maskpack_layout_free(tc->Pk);
    free(tc->x);
    free(tc->expect);
}

/* pack on the team; 1 when the bytes equal the single-threaded result */
static int team_pack_matches(const team_case *tc, maskpack_workers *w) {
    maskpack_relayout_plan *P = NULL;
    maskpack_error e;
    const maskpack_layout *srcs[1] = {tc->L};
    if (maskpack_relayout_plan_create(srcs, 1, tc->Pk, &P, &e)) return 0;
    float *out = malloc(sizeof(float) * (size_t)(tc->T * tc->C + 1));
    for (int64_t i = 0; i < tc->T * tc->C; i++) out[i] = -1.0f;
    int64_t xs[3] = {tc->n, tc->width, tc->C}, ps[2] = {tc->T, tc->C};
    maskpack_tensor xt = maskpack_tensor_contiguous(tc->x, MASKPACK_F32, 3, xs);
    maskpack_tensor ot = maskpack_tensor_contiguous(out, MASKPACK_F32, 2, ps);
    const maskpack_tensor *xp[1] = {&xt};
    int ok = maskpack_relayout_execute_on(P, xp, &ot, NULL, w, &e) == MASKPACK_OK &&
             memcmp(out, tc->expect, sizeof(float) * (size_t)(tc->T * tc->C)) == 0;
    free(out);
    maskpack_relayout_plan_free(P);
    return ok;
}

typedef struct team_thread_arg {
    const team_case *tc;
    maskpack_workers *w;
    int failures;
} team_thread_arg;

static void *team_thread(void *p) {
    team_thread_arg *a = p;
    for (int i = 0; i < 50; i++) a->failures += !team_pack_matches(a->tc, a->w);
    return NULL;
}

static void test_workers(void) {
    maskpack_error e;
    maskpack_workers *w = NULL;
    CHECK_STATUS(maskpack_workers_create(0, &w, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "n_threads: expected in [1, 256], found 0");
    CHECK_STATUS(maskpack_workers_create(2, NULL, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
    CHECK_EQ(maskpack_workers_threads(NULL), 1);
    maskpack_workers_free(NULL);
    CHECK_OK(maskpack_workers_create(3, &w, &e), e);
    CHECK_EQ(maskpack_workers_threads(w), 3);

    /* sizes on both sides of the chunk threshold, odd token sizes, more chunks than the cap */
    const int64_t shapes[][3] = {{4, 64, 3}, {8, 512, 33}, {16, 2048, 16}, {16, 4096, 67}};
    for (size_t k = 0; k < sizeof shapes / sizeof *shapes; k++) {
        team_case tc;
        team_case_init(&tc, shapes[k][0], shapes[k][1], shapes[k][2]);
        for (int rep = 0; rep < 20; rep++) {
            CHECK(team_pack_matches(&tc, w));
            CHECK(team_pack_matches(&tc, NULL));
        }
        team_case_free(&tc);
    }

    /* unpack with a pad value and a strided (row-padded) destination on the team */
    {
        team_case tc;
        team_case_init(&tc, 8, 1024, 24);
        maskpack_relayout_plan *P = NULL;
        const maskpack_layout *srcs[1] = {tc.Pk};
        CHECK_OK(maskpack_relayout_plan_create(srcs, 1, tc.L, &P, &e), e);
        int64_t rs = tc.width * tc.C + 40; /* row stride with a gap the engine must not touch */
        float *u = malloc(sizeof(float) * (size_t)(tc.n * rs)), pad = -7.5f;
        for (int64_t i = 0; i < tc.n * rs; i++) u[i] = 99.0f;
        int64_t ps[2] = {tc.T, tc.C};
        maskpack_tensor pt = maskpack_tensor_contiguous(tc.expect, MASKPACK_F32, 2, ps);
        maskpack_tensor ut = {u, MASKPACK_F32, 3, {tc.n, tc.width, tc.C}, {rs, tc.C, 1}};
        const maskpack_tensor *xp[1] = {&pt};
        CHECK_OK(maskpack_relayout_execute_on(P, xp, &ut, &pad, w, &e), e);
        int64_t bad = 0;
        for (int64_t r = 0; r < tc.n; r++) {
            maskpack_segment g;
            maskpack_layout_segment(tc.L, (size_t)r, &g, &e);
            for (int64_t c = 0; c < tc.width; c++)
                for (int64_t ch = 0; ch < tc.C; ch++) {
                    float want = c < g.q_len ? tc.x[(r * tc.width + c) * tc.C + ch] : pad;
                    bad += u[r * rs + c * tc.C + ch] != want;
                }
            for (int64_t gap = tc.width * tc.C; gap < rs; gap++) bad += u[r * rs + gap] != 99.0f;
        }
        CHECK_EQ(bad, 0);
        /* a failing call on the team writes nothing */
        maskpack_tensor small = {u, MASKPACK_F32, 3, {tc.n, tc.width - 1, tc.C}, {rs, tc.C, 1}};
        for (int64_t i = 0; i < tc.n * rs; i++) u[i] = 99.0f;
        CHECK_STATUS(maskpack_relayout_execute_on(P, xp, &small, &pad, w, &e), MASKPACK_ERR_SHAPE, e);
        for (int64_t i = 0; i < tc.n * rs; i++) bad += u[i] != 99.0f;
        CHECK_EQ(bad, 0);
        free(u);
        maskpack_relayout_plan_free(P);
        team_case_free(&tc);
    }

    /* two threads sharing one team: the second runs alone while the team is busy; both correct */
    {
        team_case tc;
        team_case_init(&tc, 8, 2048, 32);
        team_thread_arg a = {&tc, w, 0}, b = {&tc, w, 0};
        pthread_t ta, tb;
        CHECK(pthread_create(&ta, NULL, team_thread, &a) == 0);
        CHECK(pthread_create(&tb, NULL, team_thread, &b) == 0);
        pthread_join(ta, NULL);
        pthread_join(tb, NULL);
        CHECK_EQ(a.failures + b.failures, 0);

        /* after fork() the child has none of the workers: its calls run inline and stay correct */
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            int ok = team_pack_matches(&tc, w) && team_pack_matches(&tc, w);
            maskpack_workers_free(w); /* releases memory only: the threads belong to the parent */
            _exit(ok ? 0 : 3);
        }
        CHECK(pid > 0);
        int status = -1;
        if (pid > 0) waitpid(pid, &status, 0);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        CHECK(team_pack_matches(&tc, w)); /* the parent's team still works */
        team_case_free(&tc);
    }
    maskpack_workers_free(w);

    /* a team of one is the caller alone */
    CHECK_OK(maskpack_workers_create(1, &w, &e), e);
    team_case tc;
    team_case_init(&tc, 8, 2048, 32);
    CHECK(team_pack_matches(&tc, w));
    team_case_free(&tc);
    maskpack_workers_free(w);
}


/* <P x, y> for f64 tensors of int values: exact. x: the sources' grids concatenated. */
static double dot(const double *a, const double *b, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* Executes plan P (sources srcs[n_src]) on random integer x and each adjoint plan on random y:
 * <P x, y> == sum_s <x_s, A_s y> holds exactly for the true transpose, and with random x it fails
 * whenever A_s writes a nonzero into a token the move does not read (padding, tokens outside a
 * shard). Also: the adjoint of an adjoint reproduces the move on every token the move writes. */
static void check_adjoint(const maskpack_layout *const *srcs, size_t n_src, const maskpack_layout *dst) {
    maskpack_error e;
    maskpack_relayout_plan *P = NULL;
    CHECK_OK(maskpack_relayout_plan_create(srcs, n_src, dst, &P, &e), e);
    if (!P) return;
    int64_t nd = maskpack_layout_n_rows(dst) * maskpack_layout_q_width(dst), ns[8], total = 0;
    for (size_t s = 0; s < n_src; s++)
        total += ns[s] = maskpack_layout_n_rows(srcs[s]) * maskpack_layout_q_width(srcs[s]);
    double *x = malloc(sizeof(double) * (size_t)(total + 1)), *y = malloc(sizeof(double) * (size_t)(nd + 1));
    double *px = malloc(sizeof(double) * (size_t)(nd + 1)), *ay = malloc(sizeof(double) * (size_t)(total + 1));
    double *aax = malloc(sizeof(double) * (size_t)(nd + 1));
    for (int64_t i = 0; i < total; i++) x[i] = (double)rnd_in(-50, 50);
    for (int64_t i = 0; i < nd; i++) y[i] = (double)rnd_in(-50, 50);
    maskpack_tensor xt[8], yt, pxt, ayt[8], aaxt;
    const maskpack_tensor *xp[8];
    for (size_t s = 0, off = 0; s < n_src; off += (size_t)ns[s], s++) {
        xt[s] = maskpack_tensor_contiguous(x + off, MASKPACK_F64, 1, &ns[s]);
        ayt[s] = maskpack_tensor_contiguous(ay + off, MASKPACK_F64, 1, &ns[s]);
        xp[s] = &xt[s];
        if (!maskpack_layout_is_packed(srcs[s])) { /* a padded source: [rows, width] */
            int64_t sh[2] = {maskpack_layout_n_rows(srcs[s]), maskpack_layout_q_width(srcs[s])};
            xt[s] = maskpack_tensor_contiguous(x + off, MASKPACK_F64, 2, sh);
            ayt[s] = maskpack_tensor_contiguous(ay + off, MASKPACK_F64, 2, sh);
        }
    }
    int64_t dsh[2] = {maskpack_layout_n_rows(dst), maskpack_layout_q_width(dst)};
    int dpk = maskpack_layout_is_packed(dst);
    yt = maskpack_tensor_contiguous(y, MASKPACK_F64, dpk ? 1 : 2, dpk ? &nd : dsh);
    pxt = maskpack_tensor_contiguous(px, MASKPACK_F64, dpk ? 1 : 2, dpk ? &nd : dsh);
    aaxt = maskpack_tensor_contiguous(aax, MASKPACK_F64, dpk ? 1 : 2, dpk ? &nd : dsh);
    CHECK_OK(maskpack_relayout_execute(P, xp, &pxt, NULL, 1, &e), e);
    double lhs = dot(px, y, nd), rhs = 0;
    for (size_t s = 0; s < n_src; s++) {
        maskpack_relayout_plan *A = NULL, *AA = NULL;
        CHECK_OK(maskpack_relayout_plan_adjoint(P, s, &A, &e), e);
        if (!A) continue;
        const maskpack_tensor *yp[1] = {&yt};
        double fill = 12345.0; /* fills must be exactly the tokens the move does not read */
        CHECK_OK(maskpack_relayout_execute(A, yp, &ayt[s], &fill, 1, &e), e);
        int64_t o = 0;
        for (size_t q = 0; q < s; q++) o += ns[q];
        for (int64_t i = 0; i < ns[s]; i++) {
            if (ay[o + i] == fill) ay[o + i] = 0; /* a filled token: gradient zero */
            rhs += x[o + i] * ay[o + i];
        }
        /* the adjoint's adjoint maps source s's tokens back to dst: equal to the move where s wrote */
        CHECK_OK(maskpack_relayout_plan_adjoint(A, 0, &AA, &e), e);
        if (AA && n_src == 1) {
            CHECK_OK(maskpack_relayout_execute(AA, xp, &aaxt, NULL, 1, &e), e);
            for (int64_t i = 0; i < nd; i++) CHECK(aax[i] == px[i]);
        }
        CHECK_STATUS(maskpack_relayout_plan_adjoint(P, n_src, &AA, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
        maskpack_relayout_plan_free(A);
        maskpack_relayout_plan_free(AA);
    }
    CHECK(lhs == rhs);
    free(x), free(y), free(px), free(ay), free(aax);
    maskpack_relayout_plan_free(P);
}

/* The adjoint of every move (pack, unpack, padded -> padded of another width and side, shard,
 * padded -> shard, gather) is its transpose. */
static void test_adjoint(void) {
    for (int iter = 0; iter < 150; iter++) {
        size_t n = (size_t)rnd_in(1, 6);
        int64_t lens[16], width = 0;
        for (size_t k = 0; k < n; k++) {
            lens[k] = rnd_in(0, 13);
            if (lens[k] > width) width = lens[k];
        }
        maskpack_error e;
        maskpack_layout *Pd = padded_layout(lens, n, (int)rnd_in(0, 1), width + rnd_in(0, 3)), *Pk = NULL, *G = NULL,
                        *Lp = NULL;
        if (!Pd) continue;
        CHECK_OK(maskpack_layout_packed_of(Pd, &Pk, &e), e);
        CHECK_OK(maskpack_layout_padded_of(Pd, MASKPACK_PLACE_LEFT, width + 2, &Lp, &e), e);
        int64_t cp = (int64_t)1 << rnd_in(0, 2);
        CHECK_OK(maskpack_layout_pad_to_multiple(Pk, 2 * cp, &G, &e), e);
        if (!Pk || !G || !Lp) continue;
        const maskpack_layout *one[1];
        one[0] = Pd, check_adjoint(one, 1, Pk); /* pack */
        one[0] = Pk, check_adjoint(one, 1, Pd); /* unpack */
        one[0] = Pd, check_adjoint(one, 1, Lp); /* right -> left padded, another width */
        one[0] = Pd, check_adjoint(one, 1, G);  /* into a layout with padded slots */
        maskpack_layout *parts[4] = {0};
        for (int64_t r = 0; r < cp; r++) {
            CHECK_OK(
                maskpack_layout_cp_shard(G, cp, r, r % 2 ? MASKPACK_CP_CONTIGUOUS : MASKPACK_CP_ZIGZAG, &parts[r], &e),
                e);
            if (!parts[r]) continue;
            one[0] = G, check_adjoint(one, 1, parts[r]);  /* shard */
            one[0] = Pd, check_adjoint(one, 1, parts[r]); /* padded -> a rank's shard */
            one[0] = parts[r], check_adjoint(one, 1, parts[r]);
        }
        for (int64_t r = 0; r < cp; r++) maskpack_layout_free(parts[r]);
        for (int64_t r = 0; r < cp; r++)
            CHECK_OK(maskpack_layout_cp_shard(G, cp, r, MASKPACK_CP_ZIGZAG, &parts[r], &e), e);
        check_adjoint((const maskpack_layout *const *)parts, (size_t)cp, G);  /* gather */
        check_adjoint((const maskpack_layout *const *)parts, (size_t)cp, Pd); /* gather into the padded batch */
        for (int64_t r = 0; r < cp; r++) maskpack_layout_free(parts[r]);
        maskpack_layout_free(Pd), maskpack_layout_free(Pk), maskpack_layout_free(G), maskpack_layout_free(Lp);
    }
    maskpack_error e;
    maskpack_relayout_plan *A = NULL;
    CHECK_STATUS(maskpack_relayout_plan_adjoint(NULL, 0, &A, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
}

int main(void) {
    test_pack_unpack_roundtrip();
    test_shard_gather();
    test_adjoint();
    test_threads_large();
    test_errors();
    test_workers();
    return check_report("test_relayout");
}
