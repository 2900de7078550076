/* test_cp.c: context-parallel alignment, padding and shards: TE and Megatron golden vectors, and the
 * property that a rank's shard layout is the original predicate restricted to the rank's queries;
 * the shard's argument checks. */
#include "check.h"
#include "cp_expect.h"

#include <stdlib.h>

static test_rng rng = {0x9e3779b97f4a7c15ull};
static int64_t rnd_in(int64_t lo, int64_t hi) { return test_rng_in(&rng, lo, hi); }

static void shard_indices(const maskpack_layout *L, int64_t cp, int64_t rank, maskpack_cp_scheme scheme, int64_t *idx,
                          int64_t n) {
    maskpack_error e;
    maskpack_tensor t = maskpack_tensor_contiguous(idx, MASKPACK_I64, 1, &n);
    CHECK_OK(maskpack_cp_shard_indices(L, cp, rank, scheme, &t, &e), e);
}

/* Goldens by hand for cp = 4 and slots of unequal lengths (cp = 2 with equal slots cannot tell a
 * swapped chunk or a chunk size taken from another slot). */
static void test_golden_cp4_unequal(void) {
    maskpack_error e;
    /* packed slots of 8 and 16 tokens, cp = 4: chunks of 1 and 2 */
    maskpack_segment s[2] = {{0, 0, 8, 0, 8}, {0, 8, 16, 8, 16}};
    maskpack_layout *L = NULL;
    CHECK_OK(maskpack_layout_from_segments(s, 2, 1, 24, 24, 1, NULL, &L, &e), e);
    const int64_t want[4][6] = {
        {0, 7, 8, 9, 22, 23}, {1, 6, 10, 11, 20, 21}, {2, 5, 12, 13, 18, 19}, {3, 4, 14, 15, 16, 17}};
    int64_t idx[6];
    for (int r = 0; r < 4 && L; r++) {
        shard_indices(L, 4, r, MASKPACK_CP_ZIGZAG, idx, 6);
        for (int i = 0; i < 6; i++) CHECK_EQ(idx[i], want[r][i]);
    }
    /* cp = 2 on the same slots: chunks of 2 and 4 */
    const int64_t want2[2][12] = {{0, 1, 6, 7, 8, 9, 10, 11, 20, 21, 22, 23},
                                  {2, 3, 4, 5, 12, 13, 14, 15, 16, 17, 18, 19}};
    int64_t idx2[12];
    for (int r = 0; r < 2 && L; r++) {
        shard_indices(L, 2, r, MASKPACK_CP_ZIGZAG, idx2, 12);
        for (int i = 0; i < 12; i++) CHECK_EQ(idx2[i], want2[r][i]);
    }
    maskpack_layout_free(L);
    /* two padded rows of 16, cp = 4: each row in 8 chunks of 2 */
    maskpack_segment rows[2] = {{0, 0, 16, 0, 16}, {1, 0, 9, 0, 9}};
    CHECK_OK(maskpack_layout_from_segments(rows, 2, 2, 16, 16, 0, NULL, &L, &e), e);
    const int64_t wantp[8] = {4, 5, 10, 11, 20, 21, 26, 27}; /* rank 2 */
    int64_t idxp[8];
    if (L) {
        shard_indices(L, 4, 2, MASKPACK_CP_ZIGZAG, idxp, 8);
        for (int i = 0; i < 8; i++) CHECK_EQ(idxp[i], wantp[i]);
    }
    maskpack_layout_free(L);
}

static void test_golden(void) {
    maskpack_error e;
    /* TE thd_get_partitioned_indices test: cu_seqlens [0, 8, 16], cp = 2 */
    maskpack_segment s[2] = {{0, 0, 8, 0, 8}, {0, 8, 8, 8, 8}};
    maskpack_layout *L = NULL;
    CHECK_OK(maskpack_layout_from_segments(s, 2, 1, 16, 16, 1, NULL, &L, &e), e);
    int64_t idx[8];
    const int64_t r0[8] = {0, 1, 6, 7, 8, 9, 14, 15}, r1[8] = {2, 3, 4, 5, 10, 11, 12, 13};
    shard_indices(L, 2, 0, MASKPACK_CP_ZIGZAG, idx, 8);
    for (int i = 0; i < 8; i++) CHECK_EQ(idx[i], r0[i]);
    shard_indices(L, 2, 1, MASKPACK_CP_ZIGZAG, idx, 8);
    for (int i = 0; i < 8; i++) CHECK_EQ(idx[i], r1[i]);
    /* the shard of rank 0 has 4 pieces; its first piece of sequence 2 sits at key position 0 and its
     * second at 6: local query 3 (global 7) sees keys 0..7 of sequence 1 */
    maskpack_layout *S0 = NULL;
    CHECK_OK(maskpack_layout_cp_shard(L, 2, 0, MASKPACK_CP_ZIGZAG, &S0, &e), e);
    if (S0) {
        CHECK_EQ(maskpack_layout_n_segments(S0), 4);
        CHECK_EQ(maskpack_layout_q_width(S0), 8);
        CHECK_EQ(maskpack_layout_kv_width(S0), 16);
        CHECK(maskpack_layout_is_packed(S0));
        CHECK(maskpack_allowed(S0, 0, 0, 3, 7));
        CHECK(!maskpack_allowed(S0, 0, 0, 2, 7)); /* global 6 does not see 7 */
        CHECK(!maskpack_allowed(S0, 0, 0, 4, 7)); /* global 8 (sequence 2) does not see sequence 1 */
        CHECK(maskpack_allowed(S0, 0, 0, 7, 8));
        maskpack_segment g;
        CHECK_OK(maskpack_layout_segment(S0, 1, &g, &e), e);
        CHECK_EQ(g.q_pos, 6);
        CHECK_EQ(g.kv_start, 0);
        CHECK_EQ(g.kv_len, 8);
    }
    maskpack_layout_free(S0);
    maskpack_layout_free(L);

    /* Megatron get_batch_on_this_cp_rank: cp = 2, S = 8 -> rank 0 [0,1,6,7], rank 1 [2,3,4,5] */
    maskpack_segment row[1] = {{0, 0, 8, 0, 8}};
    CHECK_OK(maskpack_layout_from_segments(row, 1, 1, 8, 8, 0, NULL, &L, &e), e);
    int64_t m0[4] = {0, 1, 6, 7}, m1[4] = {2, 3, 4, 5};
    shard_indices(L, 2, 0, MASKPACK_CP_ZIGZAG, idx, 4);
    for (int i = 0; i < 4; i++) CHECK_EQ(idx[i], m0[i]);
    shard_indices(L, 2, 1, MASKPACK_CP_ZIGZAG, idx, 4);
    for (int i = 0; i < 4; i++) CHECK_EQ(idx[i], m1[i]);
    shard_indices(L, 2, 1, MASKPACK_CP_CONTIGUOUS, idx, 4);
    for (int i = 0; i < 4; i++) CHECK_EQ(idx[i], 4 + i);
    maskpack_layout_free(L);
}

static void test_alignment_rules(void) {
    maskpack_error e;
    int64_t m = 0;
    CHECK_OK(maskpack_cp_multiple(2, 4, MASKPACK_CP_ALIGN_VERL, &m, &e), e);
    CHECK_EQ(m, 16);
    CHECK_OK(maskpack_cp_multiple(2, 4, MASKPACK_CP_ALIGN_MINIMAL, &m, &e), e);
    CHECK_EQ(m, 8); /* lcm(tp, 2cp) would give 4, which leaves each rank 2 tokens per chunk pair: not /tp */
    CHECK_OK(maskpack_cp_multiple(2, 3, MASKPACK_CP_ALIGN_MINIMAL, &m, &e), e);
    CHECK_EQ(m, 12);
    CHECK_OK(maskpack_cp_multiple(1, 1, MASKPACK_CP_ALIGN_MINIMAL, &m, &e), e);
    CHECK_EQ(m, 1); /* cp = 1: no zigzag halves */
    CHECK_OK(maskpack_cp_multiple(1, 2, MASKPACK_CP_ALIGN_VERL, &m, &e), e);
    CHECK_EQ(m, 2); /* cp = 1: tp alone, the same rule prepare_batch pads by */
    CHECK_OK(maskpack_cp_multiple(1, 3, MASKPACK_CP_ALIGN_MINIMAL, &m, &e), e);
    CHECK_EQ(m, 3);
    CHECK_STATUS(maskpack_cp_multiple(0, 1, MASKPACK_CP_ALIGN_VERL, &m, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_STATUS(maskpack_cp_multiple(2, 0, MASKPACK_CP_ALIGN_VERL, &m, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_STATUS(maskpack_cp_multiple(2, 1, (maskpack_cp_align)9, &m, &e), MASKPACK_ERR_CONVENTION, e);

    /* cu [0, 3, 5]: slots of 3 and 2 tokens; cp = 2 zigzag needs multiples of 4 */
    maskpack_segment s[2] = {{0, 0, 3, 0, 3}, {0, 3, 2, 3, 2}};
    maskpack_layout *L = NULL, *P = NULL, *S = NULL;
    CHECK_OK(maskpack_layout_from_segments(s, 2, 1, 5, 5, 1, NULL, &L, &e), e);
    CHECK_STATUS(maskpack_layout_cp_shard(L, 2, 0, MASKPACK_CP_ZIGZAG, &S, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "not divisible by 2*cp = 4");
    CHECK_MSG(e, "nothing is truncated");
    CHECK(S == NULL);
    CHECK_STATUS(maskpack_layout_cp_shard(L, 2, 2, MASKPACK_CP_ZIGZAG, &S, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "rank: expected in [0, 2)");
    CHECK_STATUS(maskpack_layout_pad_to_multiple(L, 0, &P, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_OK(maskpack_layout_pad_to_multiple(L, 4, &P, &e), e);
    if (P) {
        maskpack_segment g;
        CHECK_EQ(maskpack_layout_q_width(P), 8);
        CHECK_EQ(maskpack_layout_n_tokens(P), 5); /* nothing dropped */
        maskpack_layout_segment(P, 1, &g, &e);
        CHECK_EQ(g.q_start, 4);
        CHECK_EQ(g.q_len, 2);
        CHECK_OK(maskpack_layout_cp_shard(P, 2, 1, MASKPACK_CP_ZIGZAG, &S, &e), e);
        /* slots [0,4) and [4,8), chunks of 1: rank 1 holds columns 1, 2 (sequence 0) and 5, 6 (only 5 is real) */
        if (S) CHECK_EQ(maskpack_layout_n_tokens(S), 3);
    }
    /* shards of shards are refused: their segments already carry explicit positions */
    maskpack_layout *SS = NULL;
    if (S) CHECK_STATUS(maskpack_layout_cp_shard(S, 1, 0, MASKPACK_CP_ZIGZAG, &SS, &e), MASKPACK_ERR_UNSUPPORTED, e);
    maskpack_layout_free(S);
    maskpack_layout_free(P);
    maskpack_layout_free(L);

    /* padded rows: width 6 with cp = 2 zigzag needs a multiple of 4 */
    maskpack_segment rows[2] = {{0, 0, 6, 0, 6}, {1, 2, 4, 2, 4}};
    CHECK_OK(maskpack_layout_from_segments(rows, 2, 2, 6, 6, 0, NULL, &L, &e), e);
    CHECK_STATUS(maskpack_layout_cp_shard(L, 2, 0, MASKPACK_CP_ZIGZAG, &S, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "row width 6");
    CHECK_OK(maskpack_layout_pad_to_multiple(L, 4, &P, &e), e);
    if (P) CHECK_EQ(maskpack_layout_q_width(P), 8);
    maskpack_layout_free(P);
    maskpack_layout_free(L);
}

/* Random self-attention layout (padded rows or packed), random rule. */
static maskpack_layout *random_layout(int packed) {
    maskpack_segment segs[64];
    maskpack_span spans[64];
    int64_t prefix[64];
    size_t n = 0, ns = 0;
    int64_t rows = packed ? 1 : rnd_in(1, 4), width = rnd_in(1, 40);
    if (packed) width = 0;
    for (int64_t b = 0; b < rows; b++) {
        int64_t col = 0, nseg = rnd_in(0, packed ? 6 : 3);
        for (int64_t t = 0; t < nseg && n < 60; t++) {
            int64_t gap = rnd_in(0, 3) == 0 ? rnd_in(0, 3) : 0;
            int64_t len = rnd_in(0, 4) == 0 ? rnd_in(0, 1) : rnd_in(1, 14);
            if (!packed && col + gap + len > width) break;
            segs[n] = (maskpack_segment){b, col + gap, len, col + gap, len, 0, 0, 0};
            if (len >= 3 && rnd_in(0, 3) == 0) {
                int64_t a = rnd_in(0, len - 2);
                spans[ns++] = (maskpack_span){(int64_t)n, a, rnd_in(a + 1, len)};
            }
            prefix[n] = rnd_in(0, 3) == 0 ? rnd_in(0, len) : 0;
            col += gap + len;
            n++;
        }
        if (packed) width = col + rnd_in(0, 3);
    }
    maskpack_rule r = maskpack_rule_default();
    r.causal = (int)rnd_in(0, 3) != 0;
    if (rnd_in(0, 2) == 0) {
        r.window_left = rnd_in(-1, 5);
        r.window_right = rnd_in(-1, 3);
    }
    if (rnd_in(0, 2) == 0) {
        r.spans = spans;
        r.n_spans = ns;
    }
    if (rnd_in(0, 2) == 0) {
        r.prefix = prefix;
        r.n_prefix = n;
    }
    maskpack_layout *L = NULL;
    maskpack_error e;
    CHECK_OK(maskpack_layout_from_segments(segs, n, rows, width, width, packed, &r, &L, &e), e);
    return L;
}

static void test_shard_property(void) {
    for (int iter = 0; iter < 400; iter++) {
        maskpack_layout *base = random_layout(iter % 2);
        if (!base) continue;
        int64_t cp = (int64_t)1 << rnd_in(0, 2); /* 1, 2, 4 */
        maskpack_cp_scheme scheme = rnd_in(0, 1) ? MASKPACK_CP_ZIGZAG : MASKPACK_CP_CONTIGUOUS;
        maskpack_layout *L = NULL;
        maskpack_error e;
        int64_t mult = scheme == MASKPACK_CP_ZIGZAG ? 2 * cp : cp;
        CHECK_OK(maskpack_layout_pad_to_multiple(base, mult, &L, &e), e);
        maskpack_layout_free(base);
        if (!L) continue;
        int64_t B = maskpack_layout_n_rows(L), S = maskpack_layout_q_width(L);
        int64_t local = B * S / cp;
        int64_t *idx = malloc((size_t)(local ? local : 1) * sizeof *idx);
        char *seen = calloc((size_t)(B * S > 0 ? B * S : 1), 1);
        int64_t tokens = 0;
        for (int64_t rank = 0; rank < cp; rank++) {
            maskpack_layout *Sh = NULL;
            maskpack_status st = maskpack_layout_cp_shard(L, cp, rank, scheme, &Sh, &e);
            if (maskpack_layout_is_packed(L) && scheme == MASKPACK_CP_CONTIGUOUS && S % cp) {
                CHECK_EQ(st, MASKPACK_ERR_INVALID_ARGUMENT);
                continue;
            }
            CHECK_OK(st, e);
            if (!Sh) continue;
            shard_indices(L, cp, rank, scheme, idx, local);
            /* the indices are the scheme's definition, computed independently */
            int64_t *want = malloc((size_t)(local ? local : 1) * sizeof *want);
            int64_t nw = expected_indices(L, cp, rank, scheme, want), same = nw == local;
            for (int64_t t = 0; same && t < local; t++) same = idx[t] == want[t];
            CHECK(same);
            if (!same)
                fprintf(stderr, "  iter %d cp %lld rank %lld scheme %d: indices differ from the definition\n", iter,
                        (long long)cp, (long long)rank, (int)scheme);
            free(want);
            tokens += maskpack_layout_n_tokens(Sh);
            int64_t ls = maskpack_layout_q_width(Sh);
            for (int64_t t = 0; t < local; t++) {
                CHECK(idx[t] >= 0 && idx[t] < B * S);
                if (idx[t] < 0 || idx[t] >= B * S) continue;
                CHECK(!seen[idx[t]]);
                seen[idx[t]] = 1;
                int64_t b = idx[t] / S, col = idx[t] % S, lb = t / ls, li = t % ls;
                CHECK_EQ(lb, b);
                CHECK_EQ(maskpack_segment_of_query(Sh, lb, li) >= 0, maskpack_segment_of_query(L, b, col) >= 0);
                for (int64_t j = 0; j < S; j++)
                    if (maskpack_allowed(Sh, lb, 0, li, j) != maskpack_allowed(L, b, 0, col, j)) {
                        CHECK(!"shard predicate differs from the original");
                        fprintf(
                            stderr,
                            "  iter %d cp %lld rank %lld scheme %d: local (%lld,%lld) = global (%lld,%lld), key %lld\n",
                            iter, (long long)cp, (long long)rank, (int)scheme, (long long)lb, (long long)li,
                            (long long)b, (long long)col, (long long)j);
                        j = S;
                    }
            }
            maskpack_layout_free(Sh);
        }
        if (!(maskpack_layout_is_packed(L) && scheme == MASKPACK_CP_CONTIGUOUS && S % cp)) {
            CHECK_EQ(tokens, maskpack_layout_n_tokens(L)); /* every token on exactly one rank */
            for (int64_t t = 0; t < B * S; t++) CHECK(seen[t]);
        }
        free(idx);
        free(seen);
        maskpack_layout_free(L);
    }
}

/* the shard's arguments: a cp size out of range, an unknown scheme */
static void test_shard_arguments(void) {
    const int64_t lens[3] = {5, 9, 3};
    maskpack_error e;
    maskpack_layout *L = NULL, *S = NULL;
    CHECK_OK(maskpack_layout_from_lengths(lens, 3, MASKPACK_PLACE_PACKED, 0, NULL, &L, &e), e);
    CHECK_STATUS(maskpack_layout_cp_shard(L, 0, 0, MASKPACK_CP_ZIGZAG, &S, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "cp: expected in [1, 2^20], found 0");
    CHECK_STATUS(maskpack_layout_cp_shard(L, 2, 0, (maskpack_cp_scheme)5, &S, &e), MASKPACK_ERR_CONVENTION, e);
    CHECK_MSG(e, "scheme: expected MASKPACK_CP_ZIGZAG (0) or MASKPACK_CP_CONTIGUOUS (1), found 5");
    CHECK(S == NULL);
    maskpack_layout_free(L);
}

int main(void) {
    test_golden();
    test_golden_cp4_unequal();
    test_alignment_rules();
    test_shard_property();
    test_shard_arguments();
    return check_report("test_cp");
}
