/* test_labels.c: label shifting inside sequences, loss weights that agree between padded, packed and
 * CP-sharded batches, and the CP rank holding each sequence's last token. */
#include "check.h"
#include "cp_expect.h"

#include <math.h>
#include <stdlib.h>

static test_rng rng = {0xd1b54a32d192ed03ull};
static int64_t rnd_in(int64_t lo, int64_t hi) { return test_rng_in(&rng, lo, hi); }

static void test_shift_golden(void) {
    maskpack_error e;
    /* packed [3, 2] + 1 trailing pad */
    maskpack_segment s[2] = {{0, 0, 3, 0, 3}, {0, 3, 2, 3, 2}};
    maskpack_layout *L = NULL;
    CHECK_OK(maskpack_layout_from_segments(s, 2, 1, 6, 6, 1, NULL, &L, &e), e);
    int64_t lab[6] = {10, 11, 12, 20, 21, 99}, out[6], want[6] = {11, 12, -100, 21, -100, -100};
    int64_t n = 6;
    maskpack_tensor lt = maskpack_tensor_contiguous(lab, MASKPACK_I64, 1, &n);
    maskpack_tensor ot = maskpack_tensor_contiguous(out, MASKPACK_I64, 1, &n);
    CHECK_OK(maskpack_shift_labels(L, &lt, -100, &ot, &e), e);
    for (int i = 0; i < 6; i++) CHECK_EQ(out[i], want[i]);
    CHECK_STATUS(maskpack_shift_labels(L, &lt, -100, &lt, &e), MASKPACK_ERR_OVERLAP, e);
    maskpack_layout_free(L);

    /* left-padded rows, int32, custom ignore index */
    maskpack_segment p[2] = {{0, 1, 3, 1, 3}, {1, 3, 1, 3, 1}};
    CHECK_OK(maskpack_layout_from_segments(p, 2, 2, 4, 4, 0, NULL, &L, &e), e);
    int32_t l2[8] = {0, 5, 6, 7, 0, 0, 0, 9}, o2[8];
    int32_t w2[8] = {-1, 6, 7, -1, -1, -1, -1, -1};
    int64_t sh[2] = {2, 4};
    maskpack_tensor l2t = maskpack_tensor_contiguous(l2, MASKPACK_I32, 2, sh);
    maskpack_tensor o2t = maskpack_tensor_contiguous(o2, MASKPACK_I32, 2, sh);
    CHECK_OK(maskpack_shift_labels(L, &l2t, -1, &o2t, &e), e);
    for (int i = 0; i < 8; i++) CHECK_EQ(o2[i], w2[i]);
    CHECK_STATUS(maskpack_shift_labels(L, &l2t, (int64_t)1 << 40, &o2t, &e), MASKPACK_ERR_OVERFLOW, e);
    maskpack_tensor o2bad = o2t;
    o2bad.dtype = MASKPACK_I64;
    CHECK_STATUS(maskpack_shift_labels(L, &l2t, -1, &o2bad, &e), MASKPACK_ERR_DTYPE, e);
    /* shards refuse: the next token of a piece may be on another rank */
    maskpack_layout *S = NULL;
    CHECK_OK(maskpack_layout_cp_shard(L, 2, 0, MASKPACK_CP_ZIGZAG, &S, &e), e);
    if (S) {
        int32_t l4[4], o4[4];
        int64_t s4[2] = {2, 2};
        maskpack_tensor a = maskpack_tensor_contiguous(l4, MASKPACK_I32, 2, s4);
        maskpack_tensor b = maskpack_tensor_contiguous(o4, MASKPACK_I32, 2, s4);
        CHECK_STATUS(maskpack_shift_labels(S, &a, -1, &b, &e), MASKPACK_ERR_UNSUPPORTED, e);
        CHECK_MSG(e, "shift labels on the unsharded layout");
        double d;
        float w[4];
        maskpack_tensor wt = maskpack_tensor_contiguous(w, MASKPACK_F32, 2, s4);
        CHECK_STATUS(maskpack_loss_weights(S, NULL, -1, MASKPACK_LOSS_TOKEN, &wt, &d, &e), MASKPACK_ERR_UNSUPPORTED, e);
    }
    maskpack_layout_free(S);
    maskpack_layout_free(L);
}

/* The same batch padded, packed and CP-sharded: the weighted loss sums agree with a direct mean. */
static void test_loss_agreement(void) {
    for (int iter = 0; iter < 150; iter++) {
        maskpack_error e;
        int64_t n = rnd_in(1, 5), width = 0, lens[8];
        for (int64_t k = 0; k < n; k++) {
            lens[k] = rnd_in(0, 16);
            if (lens[k] > width) width = lens[k];
        }
        maskpack_layout *Pd = NULL, *Pk = NULL, *G = NULL;
        CHECK_OK(maskpack_layout_from_lengths(lens, (size_t)n, iter % 2 ? MASKPACK_PLACE_LEFT : MASKPACK_PLACE_RIGHT, 0,
                                              NULL, &Pd, &e),
                 e);
        if (!Pd) continue;
        CHECK_OK(maskpack_layout_packed_of(Pd, &Pk, &e), e);
        int64_t cp = (int64_t)1 << rnd_in(0, 2);
        CHECK_OK(maskpack_layout_pad_to_multiple(Pk, 2 * cp, &G, &e), e);
        if (!G) continue;
        int64_t B = maskpack_layout_n_rows(Pd), S = maskpack_layout_q_width(Pd), T = maskpack_layout_q_width(G);
        int64_t *lab = malloc(sizeof(int64_t) * (size_t)(B * S + 1)),
                *sl = malloc(sizeof(int64_t) * (size_t)(B * S + 1));
        double *loss = malloc(sizeof(double) * (size_t)(B * S + 1)), *w = malloc(sizeof(double) * (size_t)(B * S + 1));
        for (int64_t t = 0; t < B * S; t++) {
            lab[t] = rnd_in(0, 4) == 0 ? -100 : rnd_in(0, 1000); /* prompt tokens carry -100 */
            loss[t] = (double)rnd_in(1, 1000) / 100.0;
        }
        int64_t ps[2] = {B, S};
        maskpack_tensor lt = maskpack_tensor_contiguous(lab, MASKPACK_I64, 2, ps);
        maskpack_tensor st = maskpack_tensor_contiguous(sl, MASKPACK_I64, 2, ps);
        maskpack_tensor wt = maskpack_tensor_contiguous(w, MASKPACK_F64, 2, ps);
        CHECK_OK(maskpack_shift_labels(Pd, &lt, -100, &st, &e), e);
        for (int mode = 0; mode < 2; mode++) {
            double denom = -1, sum = 0;
            CHECK_OK(maskpack_loss_weights(Pd, &st, -100, (maskpack_loss_mode)mode, &wt, &denom, &e), e);
            for (int64_t t = 0; t < B * S; t++) sum += loss[t] * w[t];
            /* direct reference: mean over labelled tokens, or mean of per-sequence means */
            double ref = 0, cnt = 0;
            for (int64_t b = 0; b < B; b++) {
                double ssum = 0, sc = 0;
                for (int64_t c = 0; c < S; c++) {
                    int64_t k = maskpack_segment_of_query(Pd, b, c);
                    if (k < 0 || sl[b * S + c] == -100) continue;
                    ssum += loss[b * S + c];
                    sc += 1;
                }
                if (mode == 0) {
                    ref += ssum;
                    cnt += sc;
                } else if (sc > 0) {
                    ref += ssum / sc;
                    cnt += 1;
                }
            }
            CHECK(denom == cnt);
            if (cnt > 0) CHECK(fabs(sum - ref / cnt) < 1e-9);
            /* move loss and weights into the CP shards of the packed layout: the per-rank sums add up */
            double total = 0;
            for (int64_t r = 0; r < cp; r++) {
                maskpack_layout *Sh = NULL;
                CHECK_OK(maskpack_layout_cp_shard(G, cp, r, MASKPACK_CP_ZIGZAG, &Sh, &e), e);
                if (!Sh) continue;
                int64_t local = T / cp;
                double *ls = malloc(sizeof(double) * (size_t)(local + 1)),
                       *ws = malloc(sizeof(double) * (size_t)(local + 1));
                maskpack_tensor lst = maskpack_tensor_contiguous(ls, MASKPACK_F64, 1, &local);
                maskpack_tensor wst = maskpack_tensor_contiguous(ws, MASKPACK_F64, 1, &local);
                maskpack_tensor lossp = maskpack_tensor_contiguous(loss, MASKPACK_F64, 2, ps);
                CHECK_OK(maskpack_relayout(Pd, Sh, &lossp, &lst, NULL, 1, &e), e);
                CHECK_OK(maskpack_relayout(Pd, Sh, &wt, &wst, NULL, 1, &e), e);
                for (int64_t t = 0; t < local; t++) total += ls[t] * ws[t];
                free(ls);
                free(ws);
                maskpack_layout_free(Sh);
            }
            CHECK(fabs(total - sum) < 1e-9);
        }
        /* NULL labels: every real token but each sequence's last is labelled */
        double denom = 0;
        CHECK_OK(maskpack_loss_weights(Pd, NULL, -100, MASKPACK_LOSS_TOKEN, &wt, &denom, &e), e);
        int64_t expect = 0;
        for (int64_t k = 0; k < n; k++) expect += lens[k] > 0 ? lens[k] - 1 : 0;
        CHECK(denom == (double)expect);
        CHECK_STATUS(maskpack_loss_weights(Pd, NULL, -100, (maskpack_loss_mode)7, &wt, &denom, &e),
                     MASKPACK_ERR_INVALID_ARGUMENT, e);

        /* last tokens: the rank and local index named agree with the shard's index map */
        int64_t rk[8], lc[8], nseg = n;
        maskpack_tensor rt = maskpack_tensor_contiguous(rk, MASKPACK_I64, 1, &nseg);
        maskpack_tensor ct = maskpack_tensor_contiguous(lc, MASKPACK_I64, 1, &nseg);
        maskpack_cp_scheme sch = iter % 3 ? MASKPACK_CP_ZIGZAG : MASKPACK_CP_CONTIGUOUS;
        maskpack_layout *Lc = G;
        maskpack_layout *Pad2 = NULL;
        if (iter % 2) { /* the padded batch, rows padded to a multiple */
            CHECK_OK(maskpack_layout_pad_to_multiple(Pd, 2 * cp, &Pad2, &e), e);
            Lc = Pad2;
        }
        if (Lc && !(maskpack_layout_is_packed(Lc) && sch == MASKPACK_CP_CONTIGUOUS && T % cp)) {
            CHECK_OK(maskpack_cp_last_token(Lc, cp, sch, &rt, &ct, &e), e);
            int64_t last[8];
            maskpack_tensor lt2 = maskpack_tensor_contiguous(last, MASKPACK_I64, 1, &nseg);
            CHECK_OK(maskpack_last_token_index(Lc, &lt2, &e), e);
            int64_t local = maskpack_layout_n_rows(Lc) * maskpack_layout_q_width(Lc) / cp;
            int64_t *idx = malloc(sizeof(int64_t) * (size_t)(local + 1));
            for (int64_t k = 0; k < n; k++) {
                if (lens[k] == 0) {
                    CHECK_EQ(rk[k], -1);
                    CHECK_EQ(lc[k], -1);
                    continue;
                }
                CHECK(rk[k] >= 0 && rk[k] < cp);
                if (rk[k] < 0 || rk[k] >= cp) continue;
                /* the rank's tokens from the scheme's definition (not the library's shard indices) */
                CHECK_EQ(expected_indices(Lc, cp, rk[k], sch, idx), local);
                CHECK(lc[k] >= 0 && lc[k] < local);
                if (lc[k] >= 0 && lc[k] < local) CHECK_EQ(idx[lc[k]], last[k]);
            }
            free(idx);
        }
        maskpack_layout_free(Pad2);
        free(lab);
        free(sl);
        free(loss);
        free(w);
        maskpack_layout_free(Pd);
        maskpack_layout_free(Pk);
        maskpack_layout_free(G);
    }
}

int main(void) {
    test_shift_golden();
    test_loss_agreement();
    return check_report("test_labels");
}
