/* test_plan.c: the packing planner: placement invariants, CP alignment, splitting, errors, determinism,
 * the two best-fit indexes against each other and against naive reference packers, balanced
 * Karmarkar-Karp against exhaustive search, row layouts and the report, the ranges of the options
 * and of the attention coefficient's arguments. */
#include "check.h"
#include "internal.h"
#include "../../src/plan/plan_internal.h"

#include <math.h>
#include <stdlib.h>
#include <time.h>

/* ---- helpers ------------------------------------------------------------------------------------ */

static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

static maskpack_plan *make(const int64_t *len, size_t n, const maskpack_plan_options *o) {
    maskpack_plan *p = NULL;
    maskpack_error e;
    CHECK_OK(maskpack_plan_create(len, n, o, &p, &e), e);
    return p;
}

typedef struct seen {
    int64_t seq, off, len;
} seen;

static int cmp_seen(const void *pa, const void *pb) {
    const seen *a = pa, *b = pb;
    if (a->seq != b->seq) return a->seq < b->seq ? -1 : 1;
    return (a->off > b->off) - (a->off < b->off);
}

/* The old pointer-style access for the checks below: copies row r into one of two buffers used in
 * turn (so two rows can be compared), valid until the next-but-one call. */
static maskpack_status row_get(const maskpack_plan *p, int64_t r, const maskpack_plan_piece **pc, size_t *cnt,
                               maskpack_error *e) {
    static maskpack_plan_piece *buf[2];
    static size_t cap[2];
    static int turn;
    turn ^= 1;
    maskpack_status s = maskpack_plan_row(p, r, NULL, 0, cnt, e);
    if (s) return s;
    if (*cnt > cap[turn]) {
        free(buf[turn]);
        cap[turn] = *cnt * 2;
        buf[turn] = malloc(cap[turn] * sizeof *buf[turn]);
    }
    if (*cnt) s = maskpack_plan_row(p, r, buf[turn], cap[turn], cnt, e);
    *pc = buf[turn];
    return s;
}

/* Checks every invariant a plan must satisfy for its input; returns the number of violations found. */
static int verify_plan(const maskpack_plan *p, const int64_t *len, size_t n, const maskpack_plan_options *o) {
    int bad0 = check_failures;
    maskpack_error e;
    maskpack_plan_report rep;
    CHECK_OK(maskpack_plan_get_report(p, &rep, &e), e);
    int64_t m = maskpack_plan_multiple(p);
    int64_t R = maskpack_plan_n_rows(p);
    CHECK_EQ(R, rep.n_rows);
    CHECK_EQ(maskpack_plan_n_sequences(p), (int64_t)n);
    /* equal row counts: every (rank, micro-batch) owns rows_per_microbatch consecutive rows */
    CHECK_EQ(R, o->dp * o->micro_batches * rep.rows_per_microbatch);
    CHECK_EQ(rep.rows_per_rank, o->micro_batches * rep.rows_per_microbatch);
    CHECK(rep.rows_per_microbatch >= 1);
    CHECK_EQ(rep.n_packed_rows + rep.n_empty_rows, R);
    /* as few rows per micro-batch as the packing needs: the rows of the same packing on one rank,
     * over dp * micro_batches, rounded up (balancing moves sequences, never adds rows) */
    {
        maskpack_plan_options one = *o;
        one.dp = one.micro_batches = 1;
        one.progress = NULL;
        maskpack_plan *q = NULL;
        CHECK_OK(maskpack_plan_create(len, n, &one, &q, &e), e);
        if (q) {
            maskpack_plan_report r1;
            maskpack_plan_get_report(q, &r1, &e);
            int64_t G = o->dp * o->micro_batches, want = (r1.n_packed_rows + G - 1) / G;
            CHECK_EQ(rep.rows_per_microbatch, want < 1 ? 1 : want);
            maskpack_plan_free(q);
        }
    }
    int64_t *rank_rows = calloc((size_t)o->dp, sizeof *rank_rows);
    int64_t *covered = calloc(n ? n : 1, sizeof *covered);   /* tokens of each sequence seen */
    int64_t *next_off = calloc(n ? n : 1, sizeof *next_off); /* pieces must tile [0, L) */
    int64_t *pieces_of = calloc(n ? n : 1, sizeof *pieces_of);
    double *rank_cost = calloc((size_t)o->dp, sizeof *rank_cost);
    double *rank_tok = calloc((size_t)o->dp, sizeof *rank_tok), *rank_att = calloc((size_t)o->dp, sizeof *rank_att);
    int64_t real = 0, nonempty = 0, align_pad = 0;
    double a = rep.attention_a;
    size_t total_pieces = 0;
    for (int64_t r = 0; r < R; r++) {
        const maskpack_plan_piece *pc;
        size_t cnt;
        CHECK_OK(row_get(p, r, &pc, &cnt, &e), e);
        total_pieces += cnt;
    }
    CHECK_EQ(total_pieces, rep.n_pieces);
    seen *all = calloc(total_pieces ? total_pieces : 1, sizeof *all);
    size_t t = 0;
    for (int64_t r = 0; r < R; r++) {
        const maskpack_plan_piece *pc;
        size_t cnt;
        CHECK_OK(row_get(p, r, &pc, &cnt, &e), e);
        int64_t rank = maskpack_plan_rank_of_row(p, r), mb = maskpack_plan_microbatch_of_row(p, r);
        CHECK_EQ(rank, r / rep.rows_per_rank);
        CHECK_EQ(mb, (r % rep.rows_per_rank) / rep.rows_per_microbatch);
        if (rank >= 0 && rank < o->dp) rank_rows[rank]++;
        int64_t used = 0;
        double cost = 0;
        for (size_t i = 0; i < cnt; i++) {
            int64_t s = pc[i].sequence;
            CHECK(s >= 0 && s < (int64_t)n);
            if (s < 0 || s >= (int64_t)n) continue;
            CHECK(pc[i].length >= 0 && pc[i].offset >= 0 && pc[i].offset + pc[i].length <= len[s]);
            CHECK_EQ(pc[i].slot, round_up(pc[i].length, m)); /* CP alignment padding included */
            CHECK_EQ(pc[i].slot % m, 0);
            if (i > 0) CHECK(pc[i - 1].sequence < s || (pc[i - 1].sequence == s && pc[i - 1].offset < pc[i].offset));
            used += pc[i].slot;
            real += pc[i].length;
            align_pad += pc[i].slot - pc[i].length;
            cost += o->objective == MASKPACK_PLAN_ATTENTION
                        ? a * (double)pc[i].slot + (double)pc[i].slot * (double)pc[i].slot
                        : (double)pc[i].slot;
            covered[s] += pc[i].length;
            pieces_of[s]++;
            if (rank >= 0 && rank < o->dp) {
                rank_tok[rank] += (double)pc[i].slot;
                rank_att[rank] += a * (double)pc[i].slot + (double)pc[i].slot * (double)pc[i].slot;
            }
            all[t++] = (seen){s, pc[i].offset, pc[i].length};
        }
        CHECK(used <= o->capacity); /* no row over capacity */
        CHECK_EQ(used, maskpack_plan_row_used(p, r));
        CHECK(fabs(cost - maskpack_plan_row_cost(p, r)) <= 1e-9 * (cost + 1));
        if (rank >= 0 && rank < o->dp) rank_cost[rank] += cost;
        if (cnt) nonempty++;
    }
    /* every sequence placed exactly once: its pieces tile [0, L) without overlap */
    for (size_t s = 0; s < n; s++) {
        CHECK_EQ(covered[s], len[s]);
        CHECK(pieces_of[s] >= 1);
        if (!o->allow_split) CHECK_EQ(pieces_of[s], 1);
    }
    /* the pieces of each sequence tile [0, L): sorted by (sequence, offset), each starts where the
     * previous one ended */
    qsort(all, total_pieces, sizeof *all, cmp_seen);
    for (size_t q = 0; q < total_pieces; q++) {
        int64_t s = all[q].seq;
        if (s < 0 || s >= (int64_t)n) continue;
        CHECK_EQ(all[q].off, next_off[s]);
        next_off[s] = all[q].off + all[q].len;
    }
    for (size_t s = 0; s < n; s++) CHECK_EQ(next_off[s], len[s]);
    for (int64_t q = 0; q < o->dp; q++) {
        CHECK_EQ(rank_rows[q], rep.rows_per_rank);
        CHECK(fabs(rank_cost[q] - maskpack_plan_rank_cost(p, q)) <= 1e-9 * (rank_cost[q] + 1));
    }
    int64_t total_len = 0;
    for (size_t s = 0; s < n; s++) total_len += len[s];
    CHECK_EQ(real, total_len);
    CHECK_EQ(rep.real_tokens, total_len);
    CHECK_EQ(rep.alignment_padding, align_pad);
    CHECK(nonempty <= rep.n_packed_rows);
    if (rep.n_packed_rows > 0)
        CHECK(fabs(rep.fill - (double)total_len / ((double)o->capacity * (double)rep.n_packed_rows)) < 1e-12);
    CHECK_EQ(nonempty, rep.n_packed_rows); /* packed rows are the rows holding pieces */
    CHECK(rep.fill_nonempty_rows == rep.fill);
    CHECK(fabs(rep.fill_all_rows - (double)total_len / ((double)o->capacity * (double)R)) < 1e-12);
    /* both imbalances from the rows, whichever objective was balanced */
    double tmax = 0, tsum = 0, amax = 0, asum = 0;
    for (int64_t q = 0; q < o->dp; q++) {
        tsum += rank_tok[q];
        asum += rank_att[q];
        if (rank_tok[q] > tmax) tmax = rank_tok[q];
        if (rank_att[q] > amax) amax = rank_att[q];
    }
    double tmean = tsum / (double)o->dp, amean = asum / (double)o->dp;
    CHECK(fabs(rep.rank_tokens_max - tmax) <= 1e-9 * (tmax + 1));
    CHECK(fabs(rep.rank_tokens_mean - tmean) <= 1e-9 * (tmean + 1));
    CHECK(fabs(rep.token_imbalance - (tmean > 0 ? tmax / tmean - 1 : 0)) < 1e-9);
    CHECK(fabs(rep.attention_imbalance - (amean > 0 ? amax / amean - 1 : 0)) < 1e-9);
    free(rank_tok);
    free(rank_att);
    free(rank_rows);
    free(covered);
    free(next_off);
    free(pieces_of);
    free(rank_cost);
    free(all);
    return check_failures - bad0;
}

/* Same rows holding the same (sequence, offset) pieces. */
static int same_plan(const maskpack_plan *a, const maskpack_plan *b) {
    if (maskpack_plan_n_rows(a) != maskpack_plan_n_rows(b)) return 0;
    maskpack_error e;
    for (int64_t r = 0; r < maskpack_plan_n_rows(a); r++) {
        const maskpack_plan_piece *pa, *pb;
        size_t na, nb;
        if (row_get(a, r, &pa, &na, &e) || row_get(b, r, &pb, &nb, &e)) return 0;
        if (na != nb) return 0;
        for (size_t i = 0; i < na; i++)
            if (pa[i].sequence != pb[i].sequence || pa[i].offset != pb[i].offset) return 0;
    }
    return 1;
}

/* ---- basic placement, alignment, layouts ----------------------------------------------------------- */

static void test_small_plan(void) {
    /* capacity 10: BFD decreasing 7,6,5,4,3,2,1 -> 7+3, 6+4, 5+2+1... check the exact rows */
    int64_t len[] = {3, 7, 1, 6, 5, 2, 4};
    maskpack_plan_options o = maskpack_plan_options_default(10);
    maskpack_plan *p = make(len, 7, &o);
    if (!p) return;
    verify_plan(p, len, 7, &o);
    maskpack_plan_report rep;
    maskpack_error e;
    CHECK_OK(maskpack_plan_get_report(p, &rep, &e), e);
    CHECK_EQ(rep.n_packed_rows, 3); /* 28 tokens: 3 rows of 10 is optimal */
    CHECK_EQ(rep.n_rows, 3);
    CHECK_EQ(rep.n_empty_rows, 0);
    CHECK_EQ(rep.tail_padding, 2);
    CHECK(fabs(rep.fill - 28.0 / 30.0) < 1e-12);
    /* best fit, decreasing: 7 -> r0 (3 left); 6 -> r1 (4); 5 -> r2 (5); 4 -> r1 (0); 3 -> r0 (0); 2 -> r2 (3);
     * 1 -> r2 (2). Rows list sequence ids sorted. */
    const maskpack_plan_piece *pc;
    size_t cnt;
    int64_t want[3][3] = {{0, 1, -1}, {3, 6, -1}, {2, 4, 5}};
    for (int64_t r = 0; r < 3; r++) {
        CHECK_OK(row_get(p, r, &pc, &cnt, &e), e);
        size_t expect = want[r][2] < 0 ? 2 : 3;
        CHECK_EQ(cnt, expect);
        for (size_t i = 0; i < cnt && i < 3; i++) CHECK_EQ(pc[i].sequence, want[r][i]);
    }
    /* row layout: packed, one row of capacity, segments back to back in sequence order */
    maskpack_layout *L = NULL;
    CHECK_OK(maskpack_plan_row_layout(p, 2, NULL, &L, &e), e);
    if (L) {
        CHECK(maskpack_layout_is_packed(L));
        CHECK_EQ(maskpack_layout_q_width(L), 10);
        CHECK_EQ(maskpack_layout_n_segments(L), 3);
        maskpack_segment g;
        int64_t starts[3] = {0, 1, 6}, lens[3] = {1, 5, 2};
        for (size_t k = 0; k < 3; k++) {
            CHECK_OK(maskpack_layout_segment(L, k, &g, &e), e);
            CHECK_EQ(g.q_start, starts[k]);
            CHECK_EQ(g.q_len, lens[k]);
        }
        maskpack_layout_free(L);
    }
    /* copy-out access: sizing, a short buffer, the row count */
    {
        maskpack_plan_piece buf[3], keep = {-7, -7, -7, -7};
        size_t n = 99;
        CHECK_OK(maskpack_plan_row(p, 2, NULL, 0, &n, &e), e);
        CHECK_EQ(n, 3);
        CHECK_EQ(maskpack_plan_row_count(p, 2), 3);
        CHECK_EQ(maskpack_plan_row_count(p, 3), -1);
        buf[0] = keep;
        CHECK_STATUS(maskpack_plan_row(p, 2, buf, 2, &n, &e), MASKPACK_ERR_BUFFER_TOO_SMALL, e);
        CHECK(buf[0].sequence == -7); /* nothing written */
        CHECK_STATUS(maskpack_plan_row(p, 2, NULL, 3, &n, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
        CHECK_OK(maskpack_plan_row(p, 2, buf, 3, &n, &e), e);
        CHECK(buf[1].sequence == 4 && buf[1].offset == 0 && buf[1].length == 5 && buf[1].slot == 5);
        CHECK_STATUS(maskpack_plan_row(p, -1, buf, 3, &n, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    }
    /* out-of-range accessors */
    CHECK_EQ(maskpack_plan_rank_of_row(p, 3), -1);
    CHECK_EQ(maskpack_plan_microbatch_of_row(p, -1), -1);
    CHECK(maskpack_plan_row_cost(p, 99) < 0);
    CHECK(maskpack_plan_rank_cost(p, 1) < 0);
    L = (maskpack_layout *)0x1;
    CHECK_STATUS(maskpack_plan_row_layout(p, 3, NULL, &L, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK(L == (maskpack_layout *)0x1); /* nothing written on failure */
    CHECK_EQ(e.index[0], 3);
    maskpack_plan_free(p);
    maskpack_plan_free(NULL);
}

static void test_cp_alignment(void) {
    /* cp 2, tp 1, verl: multiple 4; capacity 32 */
    int64_t len[] = {5, 9, 3, 12, 1, 7, 8, 2, 13, 6};
    maskpack_plan_options o = maskpack_plan_options_default(32);
    o.cp = 2;
    maskpack_plan *p = make(len, 10, &o);
    if (!p) return;
    CHECK_EQ(maskpack_plan_multiple(p), 4);
    verify_plan(p, len, 10, &o);
    maskpack_plan_report rep;
    maskpack_error e;
    CHECK_OK(maskpack_plan_get_report(p, &rep, &e), e);
    int64_t pad = 0;
    for (int k = 0; k < 10; k++) pad += round_up(len[k], 4) - len[k];
    CHECK_EQ(rep.alignment_padding, pad);
    /* each row's layout shards for CP: every slot divides by 2*cp, the CP shard succeeds and holds
     * exactly half of the row's columns */
    for (int64_t r = 0; r < rep.n_rows; r++) {
        maskpack_layout *L = NULL, *S = NULL;
        CHECK_OK(maskpack_plan_row_layout(p, r, NULL, &L, &e), e);
        if (!L) continue;
        size_t ns = maskpack_layout_n_segments(L);
        int32_t cu[16];
        int64_t shape[1] = {(int64_t)ns + 1};
        maskpack_tensor t = maskpack_tensor_contiguous(cu, MASKPACK_I32, 1, shape);
        CHECK_OK(maskpack_cu_seqlens_padded(L, &t, &e), e);
        for (size_t k = 0; k <= ns; k++) CHECK_EQ(cu[k] % 4, 0);
        CHECK_EQ(cu[ns], 32);
        CHECK_OK(maskpack_layout_cp_shard(L, 2, 1, MASKPACK_CP_ZIGZAG, &S, &e), e);
        if (S) CHECK_EQ(maskpack_layout_q_width(S), 16);
        maskpack_layout_free(S);
        maskpack_layout_free(L);
    }
    maskpack_plan_free(p);

    /* minimal alignment with tp 3: cp * lcm(2, tp) = 2 * 6 = 12 */
    o = maskpack_plan_options_default(48);
    o.cp = 2;
    o.tp = 3;
    o.align = MASKPACK_CP_ALIGN_MINIMAL;
    p = make(len, 10, &o);
    if (p) {
        CHECK_EQ(maskpack_plan_multiple(p), 12);
        verify_plan(p, len, 10, &o);
        maskpack_plan_free(p);
    }
    /* explicit multiple, rows of the used width: capacity need not divide */
    o = maskpack_plan_options_default(30);
    o.multiple = 8;
    o.row_width = MASKPACK_PLAN_WIDTH_USED;
    p = make(len, 10, &o);
    if (p) {
        CHECK_EQ(maskpack_plan_multiple(p), 8);
        verify_plan(p, len, 10, &o);
        maskpack_layout *L = NULL;
        CHECK_OK(maskpack_plan_row_layout(p, 0, NULL, &L, &e), e);
        if (L) {
            CHECK_EQ(maskpack_layout_q_width(L), maskpack_plan_row_used(p, 0));
            CHECK_EQ(maskpack_layout_q_width(L) % 8, 0);
            maskpack_layout_free(L);
        }
        maskpack_plan_free(p);
    }
    /* cp = tp = 1: no padding whatever the alignment rule */
    o = maskpack_plan_options_default(31);
    p = make(len, 10, &o);
    if (p) {
        CHECK_EQ(maskpack_plan_multiple(p), 1);
        maskpack_plan_free(p);
    }
}

static void test_microbatch_layout(void) {
    int64_t len[40];
    test_rng g = {12345};
    for (int k = 0; k < 40; k++) len[k] = test_rng_in(&g, 1, 60);
    maskpack_plan_options o = maskpack_plan_options_default(64);
    o.dp = 2;
    o.micro_batches = 3;
    maskpack_plan *p = make(len, 40, &o);
    if (!p) return;
    verify_plan(p, len, 40, &o);
    maskpack_plan_report rep;
    maskpack_error e;
    CHECK_OK(maskpack_plan_get_report(p, &rep, &e), e);
    int64_t seen_tokens = 0;
    for (int64_t q = 0; q < 2; q++) {
        double rank_sum = 0;
        for (int64_t j = 0; j < 3; j++) {
            maskpack_layout *L = NULL;
            CHECK_OK(maskpack_plan_microbatch_layout(p, q, j, NULL, &L, &e), e);
            if (!L) continue;
            CHECK_EQ(maskpack_layout_n_rows(L), rep.rows_per_microbatch);
            CHECK_EQ(maskpack_layout_q_width(L), 64);
            CHECK(!maskpack_layout_is_packed(L));
            seen_tokens += maskpack_layout_n_tokens(L);
            /* row t of the micro-batch layout is plan row first + t */
            int64_t first = (q * 3 + j) * rep.rows_per_microbatch;
            size_t k = 0;
            for (int64_t t = 0; t < rep.rows_per_microbatch; t++) {
                const maskpack_plan_piece *pc;
                size_t cnt;
                CHECK_OK(row_get(p, first + t, &pc, &cnt, &e), e);
                for (size_t i = 0; i < cnt; i++, k++) {
                    maskpack_segment sg;
                    CHECK_OK(maskpack_layout_segment(L, k, &sg, &e), e);
                    CHECK_EQ(sg.row, t);
                    CHECK_EQ(sg.q_len, pc[i].length);
                }
                CHECK_EQ(maskpack_plan_microbatch_of_row(p, first + t), j);
                CHECK_EQ(maskpack_plan_rank_of_row(p, first + t), q);
            }
            CHECK_EQ(k, maskpack_layout_n_segments(L));
            rank_sum += maskpack_plan_microbatch_cost(p, q, j);
            maskpack_layout_free(L);
        }
        CHECK(fabs(rank_sum - maskpack_plan_rank_cost(p, q)) < 1e-9);
    }
    CHECK_EQ(seen_tokens, rep.real_tokens);
    maskpack_layout *L = NULL;
    CHECK_STATUS(maskpack_plan_microbatch_layout(p, 2, 0, NULL, &L, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_STATUS(maskpack_plan_microbatch_layout(p, 0, 3, NULL, &L, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK(L == NULL);
    maskpack_plan_free(p);
}

/* ---- errors and splitting ------------------------------------------------------------------------ */

static void test_errors(void) {
    maskpack_error e;
    maskpack_plan *p = (maskpack_plan *)0x1;
    int64_t len[] = {4, 9, 11, 2};
    maskpack_plan_options o = maskpack_plan_options_default(10);
    CHECK_STATUS(maskpack_plan_create(len, 4, &o, &p, &e), MASKPACK_ERR_VALUE, e);
    CHECK(p == (maskpack_plan *)0x1);
    CHECK_EQ(e.index[0], 2);
    CHECK(strcmp(e.argument, "lengths") == 0);
    CHECK_MSG(e, "lengths[2]");
    CHECK_MSG(e, "sequence 2");
    CHECK_MSG(e, "11");
    CHECK_MSG(e, "capacity 10");
    /* alignment pushes a fitting length over: 9 -> slot 12 > 10 with multiple 4 ... capacity must divide */
    o = maskpack_plan_options_default(12);
    o.multiple = 4;
    int64_t len2[] = {12, 13};
    CHECK_STATUS(maskpack_plan_create(len2, 2, &o, &p, &e), MASKPACK_ERR_VALUE, e);
    CHECK_EQ(e.index[0], 1);
    CHECK_MSG(e, "slot of 16");
    o = maskpack_plan_options_default(10);
    o.multiple = 4;
    CHECK_STATUS(maskpack_plan_create(len, 4, &o, &p, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK(strcmp(e.argument, "capacity") == 0);
    CHECK_MSG(e, "use 8");
    int64_t neg[] = {3, -1};
    o = maskpack_plan_options_default(10);
    CHECK_STATUS(maskpack_plan_create(neg, 2, &o, &p, &e), MASKPACK_ERR_VALUE, e);
    CHECK_EQ(e.index[0], 1);
    CHECK_STATUS(maskpack_plan_create(NULL, 2, &o, &p, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
    CHECK_STATUS(maskpack_plan_create(len, 1, NULL, &p, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
    CHECK_STATUS(maskpack_plan_create(len, 1, &o, NULL, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
    maskpack_plan_options bad = o;
    bad.capacity = 0;
    CHECK_STATUS(maskpack_plan_create(len, 1, &bad, &p, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    bad = o;
    bad.dp = 0;
    CHECK_STATUS(maskpack_plan_create(len, 1, &bad, &p, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK(strcmp(e.argument, "dp") == 0);
    bad = o;
    bad.micro_batches = -2;
    CHECK_STATUS(maskpack_plan_create(len, 1, &bad, &p, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    bad = o;
    bad.cp = 0;
    CHECK_STATUS(maskpack_plan_create(len, 1, &bad, &p, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    bad = o;
    bad.align = (maskpack_cp_align)7;
    CHECK_STATUS(maskpack_plan_create(len, 1, &bad, &p, &e), MASKPACK_ERR_CONVENTION, e);
    bad = o;
    bad.algorithm = (maskpack_plan_algorithm)9;
    CHECK_STATUS(maskpack_plan_create(len, 1, &bad, &p, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    bad = o;
    bad.objective = (maskpack_plan_objective)5;
    CHECK_STATUS(maskpack_plan_create(len, 1, &bad, &p, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    bad = o;
    bad.attention_a = NAN;
    CHECK_STATUS(maskpack_plan_create(len, 1, &bad, &p, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    bad = o;
    bad.allow_split = 2;
    CHECK_STATUS(maskpack_plan_create(len, 1, &bad, &p, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    bad = o;
    bad.multiple = 16; /* larger than the capacity */
    CHECK_STATUS(maskpack_plan_create(len, 1, &bad, &p, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK(p == (maskpack_plan *)0x1);
    /* int64 overflow of the sum */
    int64_t huge[] = {INT64_MAX, 1};
    bad = maskpack_plan_options_default(INT64_MAX);
    CHECK_STATUS(maskpack_plan_create(huge, 2, &bad, &p, &e), MASKPACK_ERR_OVERFLOW, e);
    CHECK(p == (maskpack_plan *)0x1);
}

static void test_split(void) {
    /* capacity 10, splitting: 25 -> pieces 10, 10, 5 at offsets 0, 10, 20 */
    int64_t len[] = {25, 3, 10, 0};
    maskpack_plan_options o = maskpack_plan_options_default(10);
    o.allow_split = 1;
    maskpack_plan *p = make(len, 4, &o);
    if (!p) return;
    verify_plan(p, len, 4, &o);
    maskpack_plan_report rep;
    maskpack_error e;
    CHECK_OK(maskpack_plan_get_report(p, &rep, &e), e);
    CHECK_EQ(rep.n_split, 1);
    CHECK_EQ(rep.n_pieces, 6);
    int64_t offs[3] = {-1, -1, -1};
    for (int64_t r = 0; r < rep.n_rows; r++) {
        const maskpack_plan_piece *pc;
        size_t cnt;
        CHECK_OK(row_get(p, r, &pc, &cnt, &e), e);
        for (size_t i = 0; i < cnt; i++)
            if (pc[i].sequence == 0) {
                int64_t k = pc[i].offset / 10;
                CHECK(k >= 0 && k < 3 && pc[i].offset % 10 == 0);
                if (k >= 0 && k < 3) {
                    offs[k] = pc[i].length;
                    CHECK_EQ(pc[i].length, k < 2 ? 10 : 5);
                }
            }
    }
    CHECK(offs[0] == 10 && offs[1] == 10 && offs[2] == 5);
    maskpack_plan_free(p);

    /* with a multiple: capacity 12, multiple 4, 30 -> 12, 12, 6 (slot 8) */
    int64_t len2[] = {30, 5};
    o = maskpack_plan_options_default(12);
    o.multiple = 4;
    o.allow_split = 1;
    o.algorithm = MASKPACK_PLAN_NEXTFIT;
    p = make(len2, 2, &o);
    if (!p) return;
    verify_plan(p, len2, 2, &o);
    const maskpack_plan_piece *pc;
    size_t cnt;
    /* next-fit keeps input order: row 0 = piece 0, row 1 = piece 1, row 2 = piece 2 (slot 8) then no room
     * for 5 (slot 8) -> row 3 */
    CHECK_OK(maskpack_plan_get_report(p, &rep, &e), e);
    CHECK_EQ(rep.n_packed_rows, 4);
    CHECK_OK(row_get(p, 2, &pc, &cnt, &e), e);
    CHECK_EQ(cnt, 1);
    if (cnt == 1) {
        CHECK_EQ(pc[0].offset, 24);
        CHECK_EQ(pc[0].length, 6);
        CHECK_EQ(pc[0].slot, 8);
    }
    maskpack_plan_free(p);
}

/* ---- determinism and the seed ------------------------------------------------------------------ */

static void test_determinism(void) {
    enum { N = 3000 };
    int64_t *len = malloc(N * sizeof *len);
    test_rng g = {777};
    for (int k = 0; k < N; k++) len[k] = test_rng_in(&g, 1, 8) * 64; /* many ties */
    maskpack_plan_options o = maskpack_plan_options_default(1024);
    o.dp = 4;
    o.micro_batches = 2;
    o.objective = MASKPACK_PLAN_ATTENTION;
    for (int alg = 0; alg < 3; alg++) {
        o.algorithm = (maskpack_plan_algorithm)alg;
        o.seed = 0;
        maskpack_plan *a = make(len, N, &o), *b = make(len, N, &o);
        o.seed = 42;
        maskpack_plan *c = make(len, N, &o), *d = make(len, N, &o);
        o.seed = 43;
        maskpack_plan *f = make(len, N, &o);
        if (a && b && c && d && f) {
            CHECK(same_plan(a, b));
            CHECK(same_plan(c, d));
            if (alg != MASKPACK_PLAN_NEXTFIT) {
                CHECK(!same_plan(a, c)); /* a seed reorders ties */
                CHECK(!same_plan(c, f));
            }
            o.seed = 0;
            verify_plan(a, len, N, &o);
            o.seed = 42;
            verify_plan(c, len, N, &o);
            /* same quality: the packer sees the same multiset of sizes */
            maskpack_plan_report ra, rc;
            maskpack_error e;
            maskpack_plan_get_report(a, &ra, &e);
            maskpack_plan_get_report(c, &rc, &e);
            CHECK_EQ(ra.n_packed_rows, rc.n_packed_rows);
        }
        maskpack_plan_free(a);
        maskpack_plan_free(b);
        maskpack_plan_free(c);
        maskpack_plan_free(d);
        maskpack_plan_free(f);
    }
    free(len);
}

/* ---- packers against naive references ------------------------------------------------------------ */

/* O(n * rows) best fit with the documented tie rule: among rows with the least sufficient free space,
 * the one updated last. Returns rows; bin[i] for items in `order`. */
static size_t ref_bfd(const int64_t *size, const uint32_t *order, size_t n, int64_t cap, int32_t *bin) {
    int64_t *free_ = malloc((n + 1) * sizeof *free_);
    uint64_t *stamp = malloc((n + 1) * sizeof *stamp);
    size_t rows = 0;
    uint64_t clock = 0;
    for (size_t j = 0; j < n; j++) {
        uint32_t i = order[j];
        int64_t best = -1;
        for (size_t r = 0; r < rows; r++) {
            if (free_[r] < size[i]) continue;
            if (best < 0 || free_[r] < free_[best] || (free_[r] == free_[best] && stamp[r] > stamp[best]))
                best = (int64_t)r;
        }
        if (best < 0) {
            best = (int64_t)rows++;
            free_[best] = cap;
        }
        free_[best] -= size[i];
        stamp[best] = ++clock;
        bin[i] = (int32_t)best;
    }
    free(free_);
    free(stamp);
    return rows;
}

static size_t ref_ffd(const int64_t *size, const uint32_t *order, size_t n, int64_t cap, int32_t *bin) {
    int64_t *free_ = malloc((n + 1) * sizeof *free_);
    size_t rows = 0;
    for (size_t j = 0; j < n; j++) {
        uint32_t i = order[j];
        size_t r = 0;
        while (r < rows && free_[r] < size[i]) r++;
        if (r == rows) free_[rows++] = cap;
        free_[r] -= size[i];
        bin[i] = (int32_t)r;
    }
    free(free_);
    return rows;
}

static void test_packers_vs_reference(void) {
    test_rng g = {99};
    for (int trial = 0; trial < 60; trial++) {
        size_t n = (size_t)test_rng_in(&g, 1, 400);
        int64_t cap = trial % 3 == 0 ? test_rng_in(&g, 1, 20) : test_rng_in(&g, 20, 5000);
        int64_t *size = malloc(n * sizeof *size);
        uint64_t *tie = malloc(n * sizeof *tie);
        uint32_t *order = malloc(n * sizeof *order);
        int64_t *sorted = malloc(n * sizeof *sorted);
        int32_t *b1 = malloc(n * sizeof *b1), *b2 = malloc(n * sizeof *b2), *b3 = malloc(n * sizeof *b3);
        for (size_t i = 0; i < n; i++) {
            size[i] =
                trial % 5 == 0 ? test_rng_in(&g, 0, cap) : test_rng_in(&g, 1, cap / 2 + 1 > cap ? cap : cap / 2 + 1);
            tie[i] = mp_plan_tie(trial % 2 ? 0 : 1234567, 1, i);
        }
        maskpack_error e;
        CHECK_OK(mp_plan_order_decreasing(size, tie, n, cap, order, sorted, &e), e);
        for (size_t j = 0; j < n; j++) CHECK_EQ(sorted[j], size[order[j]]);
        for (size_t j = 1; j < n; j++)
            CHECK(size[order[j - 1]] > size[order[j]] ||
                  (size[order[j - 1]] == size[order[j]] && tie[order[j - 1]] < tie[order[j]]));
        size_t r1, r2, r3;
        /* the packers give the row of each processing position, the references of each item */
        CHECK_OK(mp_plan_pack(sorted, n, cap, MASKPACK_PLAN_BFD, MP_PLAN_INDEX_BUCKETS, NULL, b1, &r1, &e), e);
        CHECK_OK(mp_plan_pack(sorted, n, cap, MASKPACK_PLAN_BFD, MP_PLAN_INDEX_TREE, NULL, b2, &r2, &e), e);
        r3 = ref_bfd(size, order, n, cap, b3);
        CHECK_EQ(r1, r3);
        CHECK_EQ(r2, r3);
        int same12 = 1, same13 = 1;
        for (size_t j = 0; j < n; j++) {
            same12 &= b1[j] == b2[j];
            same13 &= b1[j] == b3[order[j]];
        }
        CHECK(same12);
        CHECK(same13);
        CHECK_OK(mp_plan_pack(sorted, n, cap, MASKPACK_PLAN_FFD, 0, NULL, b1, &r1, &e), e);
        r3 = ref_ffd(size, order, n, cap, b3);
        CHECK_EQ(r1, r3);
        same13 = 1;
        for (size_t j = 0; j < n; j++) same13 &= b1[j] == b3[order[j]];
        CHECK(same13);
        /* lower bound and the decreasing-fit guarantee against next-fit on the same order */
        int64_t sum = 0;
        for (size_t i = 0; i < n; i++) sum += size[i];
        CHECK((int64_t)r3 >= (sum + cap - 1) / cap);
        free(size);
        free(tie);
        free(order);
        free(sorted);
        free(b1);
        free(b2);
        free(b3);
    }
}

/* Exhaustive optimum of bin packing for tiny inputs: the fewest bins (branch over the bin of each item). */
static int opt_bins_rec(const int64_t *s, int n, int i, int64_t cap, int64_t *loads, int used, int best) {
    if (used >= best) return best;
    if (i == n) return used;
    for (int b = 0; b < used; b++) {
        if (loads[b] + s[i] > cap) continue;
        loads[b] += s[i];
        best = opt_bins_rec(s, n, i + 1, cap, loads, used, best);
        loads[b] -= s[i];
    }
    loads[used] = s[i];
    best = opt_bins_rec(s, n, i + 1, cap, loads, used + 1, best);
    loads[used] = 0;
    return best;
}

static void test_bfd_quality_small(void) {
    test_rng g = {4242};
    for (int trial = 0; trial < 300; trial++) {
        int n = (int)test_rng_in(&g, 1, 9);
        int64_t cap = 100, len[9], loads[10] = {0};
        for (int i = 0; i < n; i++) len[i] = test_rng_in(&g, 5, 100);
        int opt = opt_bins_rec(len, n, 0, cap, loads, 0, n + 1);
        for (int alg = 0; alg < 2; alg++) {
            maskpack_plan_options o = maskpack_plan_options_default(cap);
            o.algorithm = (maskpack_plan_algorithm)alg;
            maskpack_plan *p = make(len, (size_t)n, &o);
            if (!p) continue;
            maskpack_plan_report rep;
            maskpack_error e;
            maskpack_plan_get_report(p, &rep, &e);
            CHECK(rep.n_packed_rows >= opt);
            /* FFD and BFD: at most 11/9 OPT + 6/9 rows (Dosa 2007) */
            CHECK(9 * rep.n_packed_rows <= 11 * opt + 6);
            maskpack_plan_free(p);
        }
    }
}

/* ---- balancing against exhaustive search --------------------------------------------------------- */

/* Least possible largest part over balanced partitions of cost[n] into k parts of n/k items. */
static void opt_balanced_rec(const double *c, int n, int i, int k, int per, double *sum, int *cnt, double *best) {
    if (i == n) {
        double mx = 0;
        for (int j = 0; j < k; j++) mx = sum[j] > mx ? sum[j] : mx;
        if (mx < *best) *best = mx;
        return;
    }
    for (int j = 0; j < k; j++) {
        if (cnt[j] == per) continue;
        if (j > 0 && cnt[j] == 0 && cnt[j - 1] == 0) break; /* empty parts are interchangeable */
        sum[j] += c[i];
        cnt[j]++;
        if (sum[j] < *best) opt_balanced_rec(c, n, i + 1, k, per, sum, cnt, best);
        sum[j] -= c[i];
        cnt[j]--;
    }
}

static double kk_bound(int per, int k) {
    /* worst-case ratio of the balanced differencing method (Michiels, Korst, Aarts, van Leeuwen 2003):
     * exact for <= 2 items per part; 4/3, 19/12, 103/60 for 3, 4, 5; at most 2 - 1/k */
    double by_items = per <= 2 ? 1.0 : per == 3 ? 4.0 / 3 : per == 4 ? 19.0 / 12 : per == 5 ? 103.0 / 60 : 2.0;
    double by_parts = 2.0 - 1.0 / k;
    return by_items < by_parts ? by_items : by_parts;
}

static void test_kk_exhaustive(void) {
    test_rng g = {2024};
    int exact_hits = 0, trials = 0;
    for (int trial = 0; trial < 400; trial++) {
        int k = (int)test_rng_in(&g, 2, 3);
        int per = (int)test_rng_in(&g, 1, k == 2 ? 5 : 3);
        int n = k * per; /* <= 10 rows */
        double c[10];
        uint64_t tie[10];
        int32_t part[10];
        for (int i = 0; i < n; i++) {
            c[i] = (double)(trial % 4 == 0 ? test_rng_in(&g, 1, 5) : test_rng_in(&g, 1, 1000));
            tie[i] = (uint64_t)i;
        }
        maskpack_error e;
        CHECK_OK(mp_plan_kk(c, tie, (size_t)n, (size_t)k, part, &e), e);
        double sum[3] = {0}, mx = 0;
        int cnt[3] = {0};
        for (int i = 0; i < n; i++) {
            CHECK(part[i] >= 0 && part[i] < k);
            if (part[i] < 0 || part[i] >= k) continue;
            sum[part[i]] += c[i];
            cnt[part[i]]++;
        }
        for (int j = 0; j < k; j++) {
            CHECK_EQ(cnt[j], per); /* equal counts */
            mx = sum[j] > mx ? sum[j] : mx;
        }
        for (int j = 1; j < k; j++) CHECK(sum[j - 1] >= sum[j]); /* part 0 heaviest */
        double best = INFINITY, s2[3] = {0};
        int c2[3] = {0};
        opt_balanced_rec(c, n, 0, k, per, s2, c2, &best);
        CHECK(mx >= best - 1e-9);
        CHECK(mx <= kk_bound(per, k) * best + 1e-9);
        if (per <= 2) CHECK(fabs(mx - best) < 1e-9); /* exact there */
        exact_hits += fabs(mx - best) < 1e-9;
        trials++;
    }
    /* the differencing method is optimal on most small random instances */
    CHECK(exact_hits * 10 >= trials * 7);

    /* the same through the public API: lengths > capacity/2 give one sequence per row, so row costs are
     * the sequences' costs; compare the largest rank cost with the exhaustive optimum */
    for (int trial = 0; trial < 150; trial++) {
        int k = (int)test_rng_in(&g, 2, 3);
        int n = (int)test_rng_in(&g, 2, k == 2 ? 10 : 9);
        int64_t len[10];
        for (int i = 0; i < n; i++) len[i] = test_rng_in(&g, 501, 1000);
        maskpack_plan_options o = maskpack_plan_options_default(1000);
        o.dp = k;
        o.objective = trial % 2 ? MASKPACK_PLAN_ATTENTION : MASKPACK_PLAN_TOKENS;
        maskpack_plan *p = make(len, (size_t)n, &o);
        if (!p) continue;
        verify_plan(p, len, (size_t)n, &o);
        maskpack_plan_report rep;
        maskpack_error e;
        maskpack_plan_get_report(p, &rep, &e);
        int rows = (int)rep.n_rows, per = (int)rep.rows_per_rank;
        CHECK_EQ(rep.n_empty_rows, rows - n); /* padding rows reported */
        CHECK(rows % k == 0 && rows - n < k);
        double c[12] = {0}, best = INFINITY, s2[3] = {0};
        int c2[3] = {0};
        for (int i = 0; i < n; i++)
            c[i] = o.objective == MASKPACK_PLAN_ATTENTION ? 24576.0 * (double)len[i] + (double)len[i] * (double)len[i]
                                                          : (double)len[i];
        opt_balanced_rec(c, rows, 0, k, per, s2, c2, &best);
        CHECK(rep.rank_cost_max >= best - 1e-6);
        CHECK(rep.rank_cost_max <= kk_bound(per, k) * best * (1 + 1e-12));
        if (per <= 2) CHECK(fabs(rep.rank_cost_max - best) <= 1e-9 * best);
        maskpack_plan_free(p);
    }
}

static void test_kk_large_balance(void) {
    /* 10^4 rows over 64 ranks (costs like packed rows: near-equal with a tail): equal counts, tight balance */
    enum { N = 10240, K = 64 };
    double *c = malloc(N * sizeof *c);
    uint64_t *tie = malloc(N * sizeof *tie);
    int32_t *part = malloc(N * sizeof *part);
    test_rng g = {5};
    for (int i = 0; i < N; i++) {
        c[i] = (double)test_rng_in(&g, 7000, 8192) * 30000.0 + (double)test_rng_in(&g, 0, 8192 * 8192);
        tie[i] = (uint64_t)i;
    }
    maskpack_error e;
    CHECK_OK(mp_plan_kk(c, tie, N, K, part, &e), e);
    double sum[K] = {0}, total = 0, mx = 0;
    int cnt[K] = {0};
    for (int i = 0; i < N; i++) {
        sum[part[i]] += c[i];
        cnt[part[i]]++;
        total += c[i];
    }
    for (int j = 0; j < K; j++) {
        CHECK_EQ(cnt[j], N / K);
        mx = sum[j] > mx ? sum[j] : mx;
    }
    CHECK(mx / (total / K) - 1 < 0.01);
    CHECK_STATUS(mp_plan_kk(c, tie, 10, 3, part, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    free(c);
    free(tie);
    free(part);
}

/* ---- costs, report, progress, edge cases ----------------------------------------------------------- */

static void test_attention_coefficient(void) {
    double a = 0;
    maskpack_error e;
    CHECK_OK(maskpack_plan_attention_coefficient(4096, 0, 0, 0, 0, 0, &a, &e), e);
    CHECK(a == 24576.0); /* verl's constant: 6 * hidden */
    CHECK(a == MASKPACK_PLAN_DEFAULT_ATTENTION_A);
    CHECK_OK(maskpack_plan_attention_coefficient(4096, 0, 0, 0, 0, 1, &a, &e), e);
    CHECK(a == 2 * 24576.0); /* a causal kernel does half the quadratic work */
    /* Llama-3-8B-like: hidden 4096, intermediate 14336, 32 q heads * 128, 8 kv heads * 128, SwiGLU:
     * W = 4096*(4096 + 2*1024) + 4096*4096 + 3*4096*14336; a = W / (2*4096) */
    CHECK_OK(maskpack_plan_attention_coefficient(4096, 14336, 4096, 1024, 1, 0, &a, &e), e);
    double W = 4096.0 * (4096 + 2 * 1024) + 4096.0 * 4096 + 3.0 * 4096 * 14336;
    CHECK(fabs(a - W / 8192.0) < 1e-9);
    CHECK_STATUS(maskpack_plan_attention_coefficient(0, 0, 0, 0, 0, 0, &a, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_STATUS(maskpack_plan_attention_coefficient(64, -1, 0, 0, 0, 0, &a, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_STATUS(maskpack_plan_attention_coefficient(64, 0, 0, 0, 2, 0, &a, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_STATUS(maskpack_plan_attention_coefficient(64, 0, 0, 0, 0, 0, NULL, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
}

static void test_report_and_objective(void) {
    int64_t len[] = {100, 900, 400, 600, 300, 700, 50, 950};
    maskpack_plan_options o = maskpack_plan_options_default(1000);
    o.dp = 2;
    o.objective = MASKPACK_PLAN_ATTENTION;
    o.attention_a = 1000.0;
    maskpack_plan *p = make(len, 8, &o);
    if (!p) return;
    verify_plan(p, len, 8, &o);
    maskpack_plan_report rep;
    maskpack_error e;
    CHECK_OK(maskpack_plan_get_report(p, &rep, &e), e);
    CHECK(rep.attention_a == 1000.0);
    CHECK_EQ(rep.n_packed_rows, 4); /* 900+100, 950+50, 700+300, 600+400 */
    CHECK_EQ(rep.tail_padding, 0);
    CHECK(rep.fill == 1.0);
    double c0 = maskpack_plan_rank_cost(p, 0), c1 = maskpack_plan_rank_cost(p, 1);
    double mean = (c0 + c1) / 2, mx = c0 > c1 ? c0 : c1;
    CHECK(fabs(rep.rank_cost_mean - mean) < 1e-6);
    CHECK(rep.rank_cost_max == mx);
    CHECK(fabs(rep.imbalance - (mx / mean - 1)) < 1e-12);
    /* rows' attention costs: 1000*1000 + (L1^2 + L2^2 + 1000*... ) -- just check one row by hand */
    const maskpack_plan_piece *pc;
    size_t cnt;
    CHECK_OK(row_get(p, 0, &pc, &cnt, &e), e);
    double want = 0;
    for (size_t i = 0; i < cnt; i++) want += 1000.0 * (double)pc[i].slot + (double)pc[i].slot * (double)pc[i].slot;
    CHECK(fabs(maskpack_plan_row_cost(p, 0) - want) < 1e-6);
    maskpack_plan_free(p);
}

typedef struct progress_log {
    int calls, pack_done, balance_done, bad;
    double last;
} progress_log;

static void on_progress(void *ctx, const char *stage, double f) {
    progress_log *l = ctx;
    l->calls++;
    if (f < 0 || f > 1) l->bad++;
    if (strcmp(stage, "pack") == 0 && f == 1.0) l->pack_done++;
    if (strcmp(stage, "balance") == 0 && f == 1.0) l->balance_done++;
    if (strcmp(stage, "pack") != 0 && strcmp(stage, "balance") != 0) l->bad++;
}

static void test_progress_and_edges(void) {
    enum { N = 200000 };
    int64_t *len = malloc(N * sizeof *len);
    test_rng g = {31337};
    for (int k = 0; k < N; k++) len[k] = test_rng_in(&g, 16, 2048);
    progress_log log = {0};
    maskpack_plan_options o = maskpack_plan_options_default(8192);
    o.dp = 8;
    o.progress = on_progress;
    o.progress_ctx = &log;
    maskpack_plan *p = make(len, N, &o);
    if (p) {
        maskpack_plan_report rep;
        maskpack_error e;
        maskpack_plan_get_report(p, &rep, &e);
        CHECK(rep.fill > 0.99);
        CHECK(log.calls >= 3);
        CHECK_EQ(log.pack_done, 1);
        CHECK_EQ(log.balance_done, 1);
        CHECK_EQ(log.bad, 0);
        verify_plan(p, len, N, &o);
        maskpack_plan_free(p);
    }
    free(len);

    /* no sequences: every micro-batch of every rank still has one (empty) row */
    maskpack_plan_options o2 = maskpack_plan_options_default(16);
    o2.dp = 3;
    o2.micro_batches = 2;
    maskpack_plan *q = make(NULL, 0, &o2);
    if (q) {
        verify_plan(q, NULL, 0, &o2);
        CHECK_EQ(maskpack_plan_n_rows(q), 6);
        maskpack_layout *L = NULL;
        maskpack_error e;
        CHECK_OK(maskpack_plan_row_layout(q, 5, NULL, &L, &e), e);
        if (L) {
            CHECK_EQ(maskpack_layout_n_segments(L), 0);
            maskpack_layout_free(L);
        }
        maskpack_plan_free(q);
    }
    /* zero-length sequences are placed (and cost nothing) */
    int64_t z[] = {0, 5, 0, 16, 0};
    for (int alg = 0; alg < 3; alg++) {
        o2.algorithm = (maskpack_plan_algorithm)alg;
        q = make(z, 5, &o2);
        if (q) {
            verify_plan(q, z, 5, &o2);
            maskpack_plan_free(q);
        }
    }
    /* the treap index on a capacity above the bucket limit agrees with the same plan scaled down */
    int64_t big[64], small[64];
    for (int k = 0; k < 64; k++) {
        small[k] = test_rng_in(&g, 1, 100);
        big[k] = small[k] << 23;
    }
    maskpack_plan_options ob = maskpack_plan_options_default((int64_t)100 << 23);
    maskpack_plan_options os = maskpack_plan_options_default(100);
    maskpack_plan *pb = NULL, *ps = make(small, 64, &os);
    maskpack_error e;
    CHECK_OK(maskpack_plan_create(big, 64, &ob, &pb, &e), e); /* 100 * 2^23 units > 2^22: treap */
    if (pb && ps) {
        CHECK(same_plan(pb, ps));
        verify_plan(pb, big, 64, &ob);
    }
    maskpack_plan_free(pb);
    maskpack_plan_free(ps);
}

static void test_random_invariants(void) {
    test_rng g = {8080};
    for (int trial = 0; trial < 120; trial++) {
        size_t n = (size_t)test_rng_in(&g, 0, 300);
        int64_t *len = malloc((n ? n : 1) * sizeof *len);
        maskpack_plan_options o = maskpack_plan_options_default(0);
        o.cp = test_rng_in(&g, 1, 3);
        o.tp = test_rng_in(&g, 1, 2);
        o.align = (maskpack_cp_align)(trial % 2);
        int64_t m = o.cp == 1 ? o.tp : (o.align == MASKPACK_CP_ALIGN_VERL ? 2 * o.cp * o.tp : o.cp * 2);
        o.capacity = m * test_rng_in(&g, 2, 200);
        o.dp = test_rng_in(&g, 1, 6);
        o.micro_batches = test_rng_in(&g, 1, 3);
        o.algorithm = (maskpack_plan_algorithm)(trial % 3);
        o.objective = (maskpack_plan_objective)((trial / 3) % 2);
        o.allow_split = trial % 4 == 0;
        o.seed = (uint64_t)(trial % 5);
        o.row_width = (maskpack_plan_width)((trial / 2) % 2);
        for (size_t k = 0; k < n; k++)
            len[k] = o.allow_split ? test_rng_in(&g, 0, 3 * o.capacity) : test_rng_in(&g, 0, o.capacity - m + 1);
        maskpack_plan *p = make(len, n, &o);
        if (p) {
            CHECK_EQ(maskpack_plan_multiple(p), m);
            verify_plan(p, len, n, &o);
            /* every row layout builds and has the row's segments */
            maskpack_error e;
            for (int64_t r = 0; r < maskpack_plan_n_rows(p); r++) {
                maskpack_layout *L = NULL;
                CHECK_OK(maskpack_plan_row_layout(p, r, NULL, &L, &e), e);
                if (!L) continue;
                const maskpack_plan_piece *pc;
                size_t cnt;
                row_get(p, r, &pc, &cnt, &e);
                CHECK_EQ(maskpack_layout_n_segments(L), cnt);
                int64_t tok = 0;
                for (size_t i = 0; i < cnt; i++) tok += pc[i].length;
                CHECK_EQ(maskpack_layout_n_tokens(L), tok);
                maskpack_layout_free(L);
            }
            maskpack_plan_free(p);
        }
        free(len);
    }
}

static double seconds_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Placing the rows into micro-batches is one pass over a rank's rows: it scanned every row once per
 * micro-batch (O(rows x micro-batches): 200k rows into 50k micro-batches took ~10^10 steps, minutes;
 * 3e6 sequences at 1e5 micro-batches over 120 s). The bound is generous (20x the time of one
 * micro-batch, plus a second), and the old behaviour misses it by orders of magnitude. */
static void test_many_microbatches_linear(void) {
    const size_t n = 200000;
    int64_t *len = malloc(n * sizeof *len);
    if (!len) return;
    for (size_t i = 0; i < n; i++) len[i] = 1;
    maskpack_plan_options o = maskpack_plan_options_default(1);
    double t0 = seconds_now();
    maskpack_plan *p = make(len, n, &o);
    double one = seconds_now() - t0;
    maskpack_plan_free(p);
    o.micro_batches = 50000;
    t0 = seconds_now();
    p = make(len, n, &o);
    double many = seconds_now() - t0;
    CHECK(many < 20 * one + 1.0);
    if (!(many < 20 * one + 1.0)) fprintf(stderr, "plan: %.3f s with 50000 micro-batches, %.3f s with 1\n", many, one);
    if (p) {
        CHECK_EQ(verify_plan(p, len, n, &o), 0);
        CHECK_EQ(maskpack_plan_n_rows(p), (int64_t)n);
        CHECK_EQ(maskpack_plan_microbatch_of_row(p, 0), 0);
        CHECK_EQ(maskpack_plan_microbatch_of_row(p, (int64_t)n - 1), 49999);
        maskpack_plan_free(p);
    }
    free(len);
}

/* ---- sequence-level balance --------------------------------------------------------------------- */

/* lognormal lengths (median 600, sigma 1) clipped to [16, cap] */
static void sft_lengths(test_rng *g, int64_t *len, size_t n, int64_t cap) {
    for (size_t i = 0; i < n; i++) {
        double u1 = ((double)(test_rng_next(g) >> 11) + 0.5) / 9007199254740992.0,
               u2 = (double)(test_rng_next(g) >> 11) / 9007199254740992.0;
        double x = floor(exp(log(600.0) + sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2)));
        len[i] = x < 16 ? 16 : x > (double)cap ? cap : (int64_t)x;
    }
}

static void test_sequence_balance(void) {
    maskpack_error e;
    /* three packed rows of 6+4 over two ranks: dealt whole 20 vs 10 tokens; the sequences give 16 vs 14 */
    {
        int64_t len[] = {6, 6, 6, 4, 4, 4};
        maskpack_plan_options o = maskpack_plan_options_default(10);
        o.dp = 2;
        maskpack_plan *p = make(len, 6, &o);
        if (p) {
            verify_plan(p, len, 6, &o);
            maskpack_plan_report rep;
            maskpack_plan_get_report(p, &rep, &e);
            CHECK_EQ(rep.rows_per_rank, 2);
            CHECK(rep.rank_tokens_max == 16.0);
            CHECK(fabs(rep.token_imbalance - (16.0 / 15.0 - 1)) < 1e-12);
            CHECK(fabs(rep.fill_all_rows - 0.75) < 1e-12);
            maskpack_plan_free(p);
        }
    }
    /* lognormal at scale over 8 and 64 ranks (the row count not a multiple of dp): both objectives
     * balance to well under 0.5%, with no more rows per rank than first-fit-decreasing's rows dealt
     * round-robin (NeMo-RL's way) */
    enum { N = 20000 };
    int64_t *len = malloc(N * sizeof *len);
    test_rng g = {2718};
    sft_lengths(&g, len, N, 8192);
    maskpack_plan_options f = maskpack_plan_options_default(8192);
    f.algorithm = MASKPACK_PLAN_FFD;
    maskpack_plan *ffd = make(len, N, &f);
    maskpack_plan_report fr;
    if (ffd) maskpack_plan_get_report(ffd, &fr, &e);
    for (int dpi = 0; dpi < 2; dpi++) {
        for (int obj = 0; obj < 2; obj++) {
            maskpack_plan_options o = maskpack_plan_options_default(8192);
            o.dp = dpi ? 64 : 8;
            o.objective = (maskpack_plan_objective)obj;
            maskpack_plan *p = make(len, N, &o);
            if (!p) continue;
            verify_plan(p, len, N, &o);
            maskpack_plan_report rep;
            maskpack_plan_get_report(p, &rep, &e);
            CHECK(rep.imbalance < 0.005);
            if (obj == 0)
                CHECK(rep.token_imbalance < 0.005);
            else
                CHECK(rep.attention_imbalance < 0.005);
            if (ffd) CHECK(rep.rows_per_rank <= (fr.n_packed_rows + o.dp - 1) / o.dp);
            maskpack_plan_free(p);
        }
    }
    /* micro-batches: ranks first, then each rank's micro-batches, both balanced */
    {
        maskpack_plan_options o = maskpack_plan_options_default(8192);
        o.dp = 4;
        o.micro_batches = 3;
        o.objective = MASKPACK_PLAN_ATTENTION;
        maskpack_plan *p = make(len, 6000, &o);
        if (p) {
            verify_plan(p, len, 6000, &o);
            maskpack_plan_report rep;
            maskpack_plan_get_report(p, &rep, &e);
            CHECK(rep.imbalance < 0.005);
            CHECK(rep.microbatch_imbalance < 0.01);
            maskpack_plan_free(p);
        }
    }
    /* more micro-batches than sequences: the sequences still spread over the ranks first */
    {
        int64_t few[] = {50, 40, 30, 20, 10, 5};
        maskpack_plan_options o = maskpack_plan_options_default(100);
        o.dp = 3;
        o.micro_batches = 4;
        maskpack_plan *p = make(few, 6, &o);
        if (p) {
            verify_plan(p, few, 6, &o);
            maskpack_plan_report rep;
            maskpack_plan_get_report(p, &rep, &e);
            CHECK(rep.rank_cost_max <= 55.0); /* {50, 5}, {40, 10}, {30, 20}: the optimum */
            maskpack_plan_free(p);
        }
    }
    maskpack_plan_free(ffd);
    free(len);
}

/* mp_plan_spread and mp_plan_improve on their own: capacity kept, every item placed, improvement never
 * raises the heaviest group and strictly lowers the sum of squares when it moves anything. */
static void test_spread_and_improve(void) {
    test_rng g = {777};
    int spread_fail = 0;
    for (int trial = 0; trial < 300; trial++) {
        size_t n = (size_t)test_rng_in(&g, 0, 200), G = (size_t)test_rng_in(&g, 1, 9);
        int64_t cap = test_rng_in(&g, 10, 400);
        int64_t *size = malloc((n ? n : 1) * sizeof *size);
        double *cost = malloc((n ? n : 1) * sizeof *cost);
        int32_t *row = malloc((n ? n : 1) * sizeof *row);
        int64_t sum = 0;
        for (size_t i = 0; i < n; i++) size[i] = test_rng_in(&g, 0, trial % 3 ? cap / 3 : cap);
        for (size_t i = 1; i < n; i++) /* decreasing, as the planner hands them over */
            for (size_t k = i; k > 0 && size[k - 1] < size[k]; k--) {
                int64_t t = size[k];
                size[k] = size[k - 1];
                size[k - 1] = t;
            }
        for (size_t i = 0; i < n; i++) {
            cost[i] = trial % 2 ? (double)size[i] : 7.0 * (double)size[i] + (double)(size[i] * size[i]);
            sum += size[i];
        }
        size_t T = (size_t)((sum / cap + 1) / (int64_t)G + (size_t)test_rng_in(&g, 0, 2));
        if (T == 0) T = 1;
        int ok = mp_plan_spread(size, cost, n, cap, G, T, row);
        CHECK(ok == 0 || ok == 1);
        if (ok != 1) {
            spread_fail++;
            free(size);
            free(cost);
            free(row);
            continue;
        }
        int64_t *load = calloc(G * T, sizeof *load);
        double *gc = calloc(G, sizeof *gc), before_max = 0, before_sq = 0;
        for (size_t i = 0; i < n; i++) {
            CHECK(row[i] >= 0 && (size_t)row[i] < G * T);
            load[row[i]] += size[i];
            gc[(size_t)row[i] / T] += cost[i];
        }
        for (size_t r = 0; r < G * T; r++) CHECK(load[r] <= cap);
        for (size_t q = 0; q < G; q++) {
            before_max = gc[q] > before_max ? gc[q] : before_max;
            before_sq += gc[q] * gc[q];
        }
        CHECK_EQ(mp_plan_improve(size, cost, n, cap, G, T, row, 0.0), 1);
        memset(load, 0, G * T * sizeof *load);
        memset(gc, 0, G * sizeof *gc);
        double after_max = 0, after_sq = 0;
        for (size_t i = 0; i < n; i++) {
            CHECK(row[i] >= 0 && (size_t)row[i] < G * T);
            load[row[i]] += size[i];
            gc[(size_t)row[i] / T] += cost[i];
        }
        for (size_t r = 0; r < G * T; r++) CHECK(load[r] <= cap);
        for (size_t q = 0; q < G; q++) {
            after_max = gc[q] > after_max ? gc[q] : after_max;
            after_sq += gc[q] * gc[q];
        }
        CHECK(after_max <= before_max * (1 + 1e-12));
        CHECK(after_sq <= before_sq * (1 + 1e-12));
        free(load);
        free(gc);
        free(size);
        free(cost);
        free(row);
    }
    CHECK(spread_fail < 300); /* most instances fit */
    /* three items of 6 cannot go into two rows of 10: the spread says so */
    int64_t six[] = {6, 6, 6};
    double c6[] = {6, 6, 6};
    int32_t r6[3];
    CHECK_EQ(mp_plan_spread(six, c6, 3, 10, 1, 2, r6), 0);
    CHECK_EQ(mp_plan_spread(six, c6, 3, 10, 3, 1, r6), 1);
    CHECK(r6[0] != r6[1] && r6[1] != r6[2] && r6[0] != r6[2]);
}

static void test_balance_options_and_errors(void) {
    maskpack_error e;
    maskpack_plan *p = (maskpack_plan *)0x1;
    int64_t len[] = {3, 4};
    /* a dp x micro-batch count that cannot get rows of their own names both numbers */
    maskpack_plan_options o = maskpack_plan_options_default(10);
    o.dp = (int64_t)1 << 20;
    o.micro_batches = (int64_t)1 << 10;
    CHECK_STATUS(maskpack_plan_create(len, 2, &o, &p, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "dp 1048576");
    CHECK_MSG(e, "micro_batches 1024");
    CHECK(p == (maskpack_plan *)0x1);
    o = maskpack_plan_options_default(10);
    o.hidden = -1;
    CHECK_STATUS(maskpack_plan_create(len, 2, &o, &p, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK(strcmp(e.argument, "hidden") == 0);
    /* a from the hidden size (6 * hidden); a given attention_a wins */
    o = maskpack_plan_options_default(10);
    o.objective = MASKPACK_PLAN_ATTENTION;
    o.hidden = 1024;
    maskpack_plan_report rep;
    p = make(len, 2, &o);
    if (p) {
        maskpack_plan_get_report(p, &rep, &e);
        CHECK(rep.attention_a == 6144.0);
        CHECK(fabs(maskpack_plan_row_cost(p, 0) - (6144.0 * 7 + 9 + 16)) < 1e-9);
        maskpack_plan_free(p);
    }
    o.attention_a = 3.0;
    p = make(len, 2, &o);
    if (p) {
        maskpack_plan_get_report(p, &rep, &e);
        CHECK(rep.attention_a == 3.0);
        maskpack_plan_free(p);
    }
}

/* the attention coefficient's and the options' ranges: each refusal with its message */
static void test_plan_argument_ranges(void) {
    double a = -1.0;
    maskpack_error e;
    CHECK_STATUS(maskpack_plan_attention_coefficient(1024, 0, -1, 0, 0, 0, &a, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "q_dim: expected in [0, 2^30] (0 = hidden), found -1");
    CHECK_STATUS(maskpack_plan_attention_coefficient(1024, 0, 0, -5, 0, 0, &a, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "kv_dim: expected in [0, 2^30] (0 = q_dim), found -5");
    CHECK_STATUS(maskpack_plan_attention_coefficient(1024, 0, 0, 0, 0, 2, &a, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "causal: expected 0 or 1, found 2");
    CHECK(a == -1.0); /* untouched on error */

    const int64_t lens[3] = {5, 9, 3};
    maskpack_plan *p = NULL;
    maskpack_plan_options o = maskpack_plan_options_default(16);
    o.dp = 1 << 20;
    o.micro_batches = 1 << 10;
    CHECK_STATUS(maskpack_plan_create(lens, 3, &o, &p, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "dp 1048576 and micro_batches 1024");
    CHECK_MSG(e, "dp * micro_batches = 1073741824 groups exceeds the limit 2^28");
    o = maskpack_plan_options_default(16);
    o.multiple = -2;
    CHECK_STATUS(maskpack_plan_create(lens, 3, &o, &p, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "multiple: expected 0 (derive from cp, tp, align) or in [1, 2^40], found -2");
    o = maskpack_plan_options_default(16);
    o.row_width = (maskpack_plan_width)7;
    CHECK_STATUS(maskpack_plan_create(lens, 3, &o, &p, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK_MSG(e, "row_width: expected CAPACITY (0) or USED (1), found 7");
    CHECK(p == NULL);
}

int main(void) {
    test_small_plan();
    test_cp_alignment();
    test_microbatch_layout();
    test_errors();
    test_split();
    test_determinism();
    test_packers_vs_reference();
    test_bfd_quality_small();
    test_kk_exhaustive();
    test_kk_large_balance();
    test_attention_coefficient();
    test_plan_argument_ranges();
    test_report_and_objective();
    test_progress_and_edges();
    test_random_invariants();
    test_many_microbatches_linear();
    test_sequence_balance();
    test_spread_and_improve();
    test_balance_options_and_errors();
    return check_report("test_plan");
}
