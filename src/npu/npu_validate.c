/* npu_validate.c: checks a hand-built npu_fusion_attention call against the operator's contract
 * (docs/conventions.md section 6) and, when the caller says which layout the call is meant to compute,
 * against that layout's predicate. Every violation is reported, not just the first: a call that is
 * wrong in three ways should be fixed once.
 *
 * The predicate a call computes (used for the fully-masked-row and `intended` checks):
 *   - atten_mask None: the operator ignores sparse_mode, pre and next: every pair of an item.
 *   - otherwise per item (TND) or batch (B*S), local row i and key j: the key interval of
 *     mp_npu_key_range for the mode (band item of modes 7/8 included), and for the full-mask modes
 *     0, 1 and 5 also mask == 0 (a TND full mask is indexed with the item-local (i, j)).
 *   - the compressed masks are assumed to be what the operator expects; their content is checked
 *     separately (a keep-polarity or lower-triangular compressed mask is a MASK_MISMATCH).
 * Rows that are padding in the intended layout are not compared: their output is discarded anyway.
 * Content scans (full masks, predicate comparison) are skipped without a finding beyond 2^26 cells.
 *
 * Readings of the contract this file commits to:
 *   - "non-empty" item of modes 7/8 = Sq > 0 and Skv > 0 (an item with no pair computes nothing).
 *   - the origin of mode 0's pre/next when Sq != Skv is undocumented: we evaluate it top-left and
 *     report any clipping pre/next on such an item, since no reading of it is safe.
 *   - a leading 0 in actual_seq_* is reported as the likely TE form, unless `intended` is given and
 *     its own NPU-form lists (mp_npu_tnd_items) are exactly the ones passed: then the first item is
 *     genuinely empty.
 *   - a single trailing 0 after a positive end is CANN 9.0's "trailing tokens belong to no item". */
#include "npu_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WORK_CAP (INT64_C(1) << 26)

typedef struct {
    maskpack_npu_report *r;
} findings;

static void add(findings *f, int32_t code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

static void add(findings *f, int32_t code, const char *fmt, ...) {
    maskpack_npu_report *r = f->r;
    if (r->n_findings < MASKPACK_NPU_MAX_FINDINGS) {
        maskpack_npu_finding *x = &r->findings[r->n_findings++];
        x->code = code;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(x->message, sizeof x->message, fmt, ap);
        va_end(ap);
    }
    if (r->n_total < INT32_MAX) r->n_total++;
}

static void fmt_shape(char *buf, size_t cap, const maskpack_tensor *t) {
    size_t used = (size_t)snprintf(buf, cap, "[");
    for (int32_t d = 0; d < t->ndim && used < cap; d++)
        used += (size_t)snprintf(buf + used, cap - used, d ? ", %lld" : "%lld", (long long)t->shape[d]);
    if (used < cap) snprintf(buf + used, cap - used, "]");
}

static int64_t sat_mul(int64_t a, int64_t b) {
    int64_t r;
    if (a < 0 || b < 0) return 0;
    return mp_mul_overflow(a, b, &r) ? INT64_MAX : r;
}

static int64_t sat_add(int64_t a, int64_t b) {
    int64_t r;
    return mp_add_overflow(a, b, &r) ? (b > 0 ? INT64_MAX : INT64_MIN) : r;
}

/* ---- the actual_seq lists and prefix ------------------------------------------------------------ */

typedef struct seq_list {
    int present;
    int64_t *v;
    int64_t n_raw; /* entries as passed */
    int64_t n;     /* items (a CANN 9.0 trailing 0 terminator is not an item) */
    int terminator;
    int ok; /* non-negative and non-decreasing: items can be derived */
} seq_list;

static maskpack_status read_ints(const maskpack_tensor *t, const char *name, int64_t **out, int64_t *n,
                                 maskpack_error *err) {
    maskpack_status s = mp_check_tensor(t, name, 1, 1, err);
    if (s) return s;
    if (!mp_dtype_is_integer(t->dtype) || t->dtype == MASKPACK_BOOL)
        return mp_fail(err, MASKPACK_ERR_DTYPE, name, -1, -1, "%s: expected an integer list (int32/int64), found %s",
                       name, maskpack_dtype_name(t->dtype));
    int64_t len = t->shape[0];
    int64_t *v = mp_alloc_array((size_t)(len > 0 ? len : 1), sizeof *v);
    if (!v) return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, name, -1, -1, "out of memory");
    for (int64_t k = 0; k < len; k++) v[k] = mp_read_i64(t->dtype, t->data, k * t->strides[0]);
    *out = v;
    *n = len;
    return MASKPACK_OK;
}

/* Checks one list's form; `canonical` = it equals the intended layout's own NPU-form list, in which
 * case a leading 0 is a real empty first item and not the TE form. */
static void check_list(findings *f, const char *name, seq_list *l, int64_t total, int canonical) {
    l->ok = 1;
    l->n = l->n_raw;
    if (l->n_raw == 0) {
        add(f, MASKPACK_NPU_NOT_CUMULATIVE, "%s is empty: expected one cumulative end per item", name);
        l->ok = 0;
        return;
    }
    /* CANN 9.0: trailing tokens that belong to no sequence are declared by ending the list with 0 */
    if (l->n_raw >= 2 && l->v[l->n_raw - 1] == 0 && l->v[l->n_raw - 2] > 0) {
        l->terminator = 1;
        l->n = l->n_raw - 1;
    }
    if (l->v[0] == 0 && !canonical)
        add(f, MASKPACK_NPU_LEADING_ZERO,
            "%s[0] is 0: most likely the TE/flash-attn form [0, e1, ..., eN] where the NPU form [e1, ..., eN] is "
            "needed (as passed, the operator reads an empty first item)",
            name);
    for (int64_t k = 0; k < l->n; k++) {
        if (l->v[k] < 0) {
            add(f, MASKPACK_NPU_NOT_CUMULATIVE, "%s[%lld]: expected a cumulative end >= 0, found %lld", name,
                (long long)k, (long long)l->v[k]);
            l->ok = 0;
            return;
        }
        if (k > 0 && l->v[k] < l->v[k - 1]) {
            add(f, MASKPACK_NPU_NOT_CUMULATIVE,
                "%s[%lld]: expected >= %lld (cumulative ends never decrease), found %lld (lengths instead of "
                "cumulative ends?)",
                name, (long long)k, (long long)l->v[k - 1], (long long)l->v[k]);
            l->ok = 0;
            return;
        }
    }
    int64_t last = l->v[l->n - 1];
    if (total > 0) {
        if (l->terminator && last > total)
            add(f, MASKPACK_NPU_NOT_CUMULATIVE, "%s: last end %lld exceeds the %lld tokens of the tensor", name,
                (long long)last, (long long)total);
        else if (!l->terminator && last != total)
            add(f, MASKPACK_NPU_NOT_CUMULATIVE, "%s: expected the last cumulative end to be T = %lld, found %lld%s",
                name, (long long)total, (long long)last,
                last < total ? " (trailing tokens belong to no item: declare them as a pad item, or end the list "
                               "with 0 on CANN >= 9.0)"
                             : "");
    }
}

/* ---- the call's predicate ------------------------------------------------------------------------- */

typedef struct sem {
    int tnd;
    int32_t mode;
    int64_t pre, next;
    int64_t n;                   /* items (TND) or batches */
    int64_t *sq, *skv;           /* [n] */
    int64_t *q_off, *kv_off;     /* [n] first token of each item (TND); 0 for batches */
    const int64_t *prefix;       /* [n] or NULL */
    int64_t band;                /* band item of modes 7/8, else -1 */
    int mask_none;               /* atten_mask None: bidirectional */
    const maskpack_tensor *full; /* the full mask of modes 0/1/5, else NULL */
    int64_t heads;               /* heads along which the full mask varies (1 unless BNSS) */
} sem;

static int full_masked(const sem *s, int64_t item, int64_t h, int64_t i, int64_t j) {
    const maskpack_tensor *m = s->full;
    int64_t off;
    if (m->ndim == 4)
        off = (m->shape[0] == 1 ? 0 : item) * m->strides[0] + (m->shape[1] == 1 ? 0 : h) * m->strides[1] +
              i * m->strides[2] + j * m->strides[3];
    else
        off = i * m->strides[0] + j * m->strides[1];
    return ((const uint8_t *)m->data)[off] != 0;
}

static void sem_range(const sem *s, int64_t item, int64_t i, int64_t *lo, int64_t *hi) {
    if (s->mask_none) {
        *lo = 0;
        *hi = s->skv[item];
        return;
    }
    mp_npu_key_range(s->mode, s->pre, s->next, s->sq[item], s->skv[item], s->prefix ? s->prefix[item] : 0,
                     item == s->band, i, lo, hi);
}

static int sem_allowed(const sem *s, int64_t item, int64_t h, int64_t i, int64_t j) {
    if (i < 0 || i >= s->sq[item] || j < 0 || j >= s->skv[item]) return 0;
    int64_t lo, hi;
    sem_range(s, item, i, &lo, &hi);
    if (j < lo || j >= hi) return 0;
    return s->full ? !full_masked(s, item, h, i, j) : 1;
}

/* ---- mask shape classification ------------------------------------------------------------------ */

static int is_2d(const maskpack_tensor *t, int64_t a, int64_t b) {
    return t->ndim == 2 && t->shape[0] == a && t->shape[1] == b;
}

/* One of the full-size forms the operator accepts for this call (section 2 table); -1 = unknown. */
static int full_form(const maskpack_npu_call *c, int tnd, int items_ok, int64_t max_sq, int64_t max_skv,
                     const maskpack_tensor *t, int b1ss_only) {
    if (tnd) return items_ok ? is_2d(t, max_sq, max_skv) : -1;
    int64_t B = c->batch, N = c->heads_q;
    if (t->ndim == 4 && t->shape[2] == c->q_len && t->shape[3] == c->kv_len) {
        if (t->shape[0] == B && (t->shape[1] == 1 || (N > 0 && t->shape[1] == N))) return 1;
        if (!b1ss_only && t->shape[0] == 1 && t->shape[1] == 1) return 1;
        return 0;
    }
    return !b1ss_only && is_2d(t, c->q_len, c->kv_len);
}

static int full_mode(int32_t mode, int mask) { return mode == 1 || mode == 5 || (mode == 0 && mask); }

/* ---- the validator ------------------------------------------------------------------------------- */

typedef struct state {
    const maskpack_npu_call *c;
    findings f;
    int tnd, known_layout, mode_ok;
    seq_list lq, lk;
    int items_ok;
    int64_t n_items, max_sq, max_skv;
    int64_t *pf;
    int64_t n_pf;
    int prefix_ok;
    int mask_ok; /* atten_mask present with a dtype and shape this mode accepts */
} state;

static void check_mask(state *st) {
    const maskpack_npu_call *c = st->c;
    const maskpack_tensor *m = c->atten_mask;
    int32_t mode = c->sparse_mode;
    findings *f = &st->f;
    if (!m) {
        if (mode >= 1 && mode <= 8) {
            add(f, MASKPACK_NPU_CAUSAL_WITHOUT_MASK,
                "sparse_mode %d with atten_mask=None: without a mask the operator ignores sparse_mode, pre_tokens "
                "and next_tokens, so the call silently becomes bidirectional; pass the %s",
                (int)mode,
                mode == 1 || mode == 5 ? "full mask"
                : mode == 6            ? "compressed [3072, 2048] prefix mask"
                                       : "compressed [2048, 2048] triu(ones, 1) mask");
        } else if (mode == 0) {
            int64_t sq = st->tnd ? st->max_sq : c->q_len, skv = st->tnd ? st->max_skv : c->kv_len;
            if ((st->tnd && !st->items_ok) || sq <= 0 || skv <= 0) return;
            if (c->pre_tokens < sq - 1 || c->next_tokens < skv - 1)
                add(f, MASKPACK_NPU_CAUSAL_WITHOUT_MASK,
                    "sparse_mode 0 with pre_tokens=%lld next_tokens=%lld but atten_mask=None: the operator ignores "
                    "pre/next without a mask, so the call silently becomes bidirectional",
                    (long long)c->pre_tokens, (long long)c->next_tokens);
        }
        return;
    }
    int dtype_ok = m->dtype == MASKPACK_BOOL || m->dtype == MASKPACK_U8;
    if (!dtype_ok)
        add(f, MASKPACK_NPU_BAD_MASK_DTYPE, "atten_mask dtype %s: expected bool or uint8 (M-mask, 1 = excluded)",
            maskpack_dtype_name(m->dtype));
    char got[160];
    fmt_shape(got, sizeof got, m);
    int c2048 = is_2d(m, MP_NPU_COMPRESSED, MP_NPU_COMPRESSED);
    int c3072 = is_2d(m, MP_NPU_COMPRESSED + MP_NPU_PREFIX_ROWS, MP_NPU_COMPRESSED);
    int ff = full_form(c, st->tnd, st->items_ok, st->max_sq, st->max_skv, m, 0);
    char want_full[200];
    if (st->tnd)
        snprintf(want_full, sizeof want_full, "[maxSq, maxSkv] = [%lld, %lld] (the only full form in TND)",
                 (long long)st->max_sq, (long long)st->max_skv);
    else
        snprintf(want_full, sizeof want_full,
                 "[B,N,Sq,Skv], [B,1,Sq,Skv], [1,1,Sq,Skv] or [Sq,Skv] with B=%lld N=%lld Sq=%lld Skv=%lld",
                 (long long)c->batch, (long long)c->heads_q, (long long)c->q_len, (long long)c->kv_len);
    int shape_ok = 0;
    if (!st->mode_ok) {
        shape_ok = 0; /* the mode's finding already stands; no shape expectation to compare with */
    } else if (mode == 2 || mode == 3 || mode == 4 || mode == 7 || mode == 8 || mode == 6) {
        int want_c = mode == 6 ? c3072 : c2048;
        const char *want = mode == 6 ? "[3072, 2048]" : "[2048, 2048]";
        if (want_c)
            shape_ok = 1;
        else if (ff == 1)
            add(f, MASKPACK_NPU_DENSE_FOR_COMPRESSED,
                "atten_mask %s is a full-size mask but sparse_mode %d takes the compressed %s mask (it never "
                "depends on S)",
                got, (int)mode, want);
        else
            add(f, MASKPACK_NPU_BAD_MASK_SHAPE,
                "atten_mask shape %s: sparse_mode %d needs exactly %s (other shapes fail with error 561103, "
                "unsupported atten_mask shape)",
                got, (int)mode, want);
    } else { /* 0, 1, 5: a full mask */
        int ok = mode == 5 ? full_form(c, st->tnd, st->items_ok, st->max_sq, st->max_skv, m, 1) : ff;
        if (ok == 1)
            shape_ok = 1;
        else if (ok == -1)
            shape_ok = 0; /* TND lists unusable: their findings stand, the expected shape is unknown */
        else if (c2048 || c3072)
            add(f, MASKPACK_NPU_DENSE_FOR_COMPRESSED,
                "atten_mask %s is a compressed mask but sparse_mode %d reads it as a full mask of %s", got, (int)mode,
                want_full);
        else if (mode == 5 && ff == 1)
            add(f, MASKPACK_NPU_BAD_MASK_SHAPE,
                "atten_mask shape %s: sparse_mode 5 needs a BNSS or B1SS mask [B, N or 1, Sq, Skv] (error 561103)",
                got);
        else {
            int padding_like = (m->ndim == 2 && m->shape[0] == c->batch && m->shape[1] == c->kv_len) ||
                               (m->ndim == 4 && m->shape[2] == 1) || (m->ndim == 2 && m->shape[0] == 1);
            add(f, MASKPACK_NPU_BAD_MASK_SHAPE,
                "atten_mask shape %s is not accepted (error 561103, unsupported atten_mask shape): expected %s%s", got,
                want_full,
                padding_like ? "; a [B,S]/[B,1,1,S]/[1,S] padding mask must be expanded to [B,1,Sq,Skv]" : "");
        }
    }
    st->mask_ok = dtype_ok && shape_ok;
}

/* The compressed masks have one correct content; anything else computes another rule. */
static void check_compressed_content(state *st) {
    const maskpack_tensor *m = st->c->atten_mask;
    const uint8_t *d = m->data;
    for (int64_t i = 0; i < m->shape[0]; i++)
        for (int64_t j = 0; j < m->shape[1]; j++) {
            int want = i < MP_NPU_COMPRESSED ? j > i : j >= MP_NPU_COMPRESSED / 2;
            int got = d[i * m->strides[0] + j * m->strides[1]] != 0;
            if (got != want) {
                add(&st->f, MASKPACK_NPU_MASK_MISMATCH,
                    "atten_mask for sparse_mode %d must be the compressed M-mask %s; element (%lld, %lld) is %d, "
                    "expected %d (%s)",
                    (int)st->c->sparse_mode,
                    m->shape[0] == MP_NPU_COMPRESSED ? "triu(ones(2048, 2048), 1)"
                                                     : "triu(ones(2048, 2048), 1) over a [1024, 2048] block (left "
                                                       "half 0, right half 1)",
                    (long long)i, (long long)j, got, want,
                    got && j <= i ? "keep polarity or a lower triangle?" : "wrong content");
                return;
            }
        }
}

static void check_pre_next(state *st, const sem *s) {
    const maskpack_npu_call *c = st->c;
    findings *f = &st->f;
    int32_t mode = c->sparse_mode;
    int has_mask = c->atten_mask != NULL;
    int band_used = mode == 4 || ((mode == 7 || mode == 8) && s && s->band >= 0);
    /* without a mask the operator ignores pre/next altogether (check_mask reports that) */
    if (!has_mask || !(mode == 0 || band_used)) return;
    if (sat_add(c->pre_tokens, c->next_tokens) < 0)
        add(f, MASKPACK_NPU_PRE_NEXT_MISMATCH,
            "pre_tokens %lld + next_tokens %lld < 0: the band is empty, every query row is fully masked",
            (long long)c->pre_tokens, (long long)c->next_tokens);
    int64_t max_s =
        st->tnd ? (st->max_sq > st->max_skv ? st->max_sq : st->max_skv) : (c->q_len > c->kv_len ? c->q_len : c->kv_len);
    if (c->pre_tokens == 65536 && max_s > 65536)
        add(f, MASKPACK_NPU_PRE_NEXT_MISMATCH,
            "pre_tokens 65536 (MindSpeed's default) with sequences of %lld tokens: keys further back than 65536 "
            "are silently dropped; pass 2147483647 for unbounded",
            (long long)max_s);
    if (!s) return;
    if ((mode == 7 || mode == 8) && s->band >= 0) {
        int64_t k = s->band, bsq = s->sq[k], bskv = s->skv[k];
        if (c->pre_tokens < bskv)
            add(f, MASKPACK_NPU_PRE_NEXT_MISMATCH,
                "sparse_mode %d: pre_tokens %lld must be >= the Skv %lld of the band item %lld (the %s non-empty "
                "item)",
                (int)mode, (long long)c->pre_tokens, (long long)bskv, (long long)k, mode == 7 ? "last" : "first");
        if (mode == 7 && (c->next_tokens > 0 || c->next_tokens < bsq - bskv))
            add(f, MASKPACK_NPU_PRE_NEXT_MISMATCH,
                "sparse_mode 7: next_tokens %lld must lie in [Sq - Skv, 0] = [%lld, 0] for the band item %lld",
                (long long)c->next_tokens, (long long)(bsq - bskv), (long long)k);
        if (mode == 8 && c->next_tokens < bsq - bskv)
            add(f, MASKPACK_NPU_PRE_NEXT_MISMATCH,
                "sparse_mode 8: next_tokens %lld must be >= Sq - Skv = %lld for the band item %lld",
                (long long)c->next_tokens, (long long)(bsq - bskv), (long long)k);
    }
    if (mode == 0 && has_mask) {
        /* the origin of pre/next for Sq != Skv is not documented: only unbounded values are safe */
        for (int64_t k = 0; k < s->n; k++)
            if (s->sq[k] != s->skv[k] && (c->pre_tokens < s->sq[k] - 1 || c->next_tokens < s->skv[k] - 1)) {
                add(f, MASKPACK_NPU_PRE_NEXT_MISMATCH,
                    "sparse_mode 0 with Sq %lld != Skv %lld (%s %lld) and a clipping pre/next (%lld, %lld): the "
                    "origin is not documented; pass 2147483647/2147483647 and let the mask decide, or use mode 4",
                    (long long)s->sq[k], (long long)s->skv[k], st->tnd ? "item" : "batch", (long long)k,
                    (long long)c->pre_tokens, (long long)c->next_tokens);
                break;
            }
        /* pre/next must not drop pairs the mask allows (e.g. next_tokens 0 with a non-causal mask) */
        if (!s->full) return;
        int64_t work = 0;
        for (int64_t k = 0; k < s->n; k++) work = sat_add(work, sat_mul(sat_mul(s->sq[k], s->skv[k]), s->heads));
        if (work > WORK_CAP) return;
        for (int64_t k = 0; k < s->n; k++)
            for (int64_t h = 0; h < s->heads; h++)
                for (int64_t i = 0; i < s->sq[k]; i++)
                    for (int64_t j = 0; j < s->skv[k]; j++) {
                        if (full_masked(s, k, h, i, j)) continue;
                        if (j - i > c->next_tokens || i - j > c->pre_tokens) {
                            add(f, MASKPACK_NPU_PRE_NEXT_MISMATCH,
                                "atten_mask allows (%s %lld, head %lld, i %lld, j %lld) but pre_tokens %lld / "
                                "next_tokens %lld drop it (j - i = %lld): the mask and pre/next disagree",
                                st->tnd ? "item" : "b", (long long)k, (long long)h, (long long)i, (long long)j,
                                (long long)c->pre_tokens, (long long)c->next_tokens, (long long)(j - i));
                            return;
                        }
                    }
    }
}

static void check_fully_masked(state *st, const sem *s) {
    const maskpack_npu_call *c = st->c;
    if (!s->full) return; /* compressed modes: the operator detects such rows itself */
    if (!st->tnd && c->inner_precise == 2) return;
    int64_t work = 0;
    for (int64_t k = 0; k < s->n; k++) work = sat_add(work, sat_mul(sat_mul(s->sq[k], s->skv[k] + 1), s->heads));
    if (work > WORK_CAP) return;
    for (int64_t k = 0; k < s->n; k++)
        for (int64_t h = 0; h < s->heads; h++)
            for (int64_t i = 0; i < s->sq[k]; i++) {
                int64_t lo, hi, j;
                sem_range(s, k, i, &lo, &hi);
                for (j = lo; j < hi; j++)
                    if (!full_masked(s, k, h, i, j)) break;
                if (j < hi) continue;
                if (st->tnd)
                    add(&st->f, MASKPACK_NPU_FULLY_MASKED_ROW,
                        "TND full mask: row %lld of item %lld sees no key; the operator forbids fully masked rows "
                        "in a TND full mask (use a compressed sparse mode)",
                        (long long)i, (long long)k);
                else
                    add(&st->f, MASKPACK_NPU_FULLY_MASKED_ROW,
                        "query row (b %lld, head %lld, i %lld) sees no key but inner_precise is %d: pass "
                        "inner_precise=2 (pad rows of a padded batch are such rows)",
                        (long long)k, (long long)h, (long long)i, (int)c->inner_precise);
                return;
            }
}

static void compare_intended(state *st, const sem *s) {
    const maskpack_npu_call *c = st->c;
    const maskpack_layout *L = c->intended;
    findings *f = &st->f;
    int64_t B = st->tnd ? 1 : c->batch;
    int64_t tq = 0, tk = 0;
    if (st->tnd) {
        int64_t eq = st->n_items ? s->q_off[s->n - 1] + s->sq[s->n - 1] : 0;
        int64_t ek = st->n_items ? s->kv_off[s->n - 1] + s->skv[s->n - 1] : 0;
        tq = c->total_q > eq ? c->total_q : eq;
        tk = c->total_kv > ek ? c->total_kv : ek;
    } else {
        tq = c->q_len;
        tk = c->kv_len;
    }
    if (L->n_rows != B || L->q_width != tq || L->kv_width != tk) {
        add(f, MASKPACK_NPU_MASK_MISMATCH,
            "the intended layout is %lld rows x %lld query / %lld key columns but the call describes %lld x %lld / "
            "%lld",
            (long long)L->n_rows, (long long)L->q_width, (long long)L->kv_width, (long long)B, (long long)tq,
            (long long)tk);
        return;
    }
    /* work estimate first: skip silently when the comparison would be too expensive */
    int64_t work = 0;
    if (st->tnd) {
        for (int64_t k = 0; k < s->n; k++) work = sat_add(work, sat_mul(s->sq[k], s->skv[k]));
        for (size_t k = 0; k < L->n_segments; k++) work = sat_add(work, sat_mul(L->segs[k].q_len, L->segs[k].kv_len));
    } else {
        work = sat_mul(sat_mul(sat_mul(B, tq), tk), s->heads);
    }
    if (work > WORK_CAP) return;
    int64_t item = 0, steps = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < tq; i++) {
            int64_t seg = maskpack_segment_of_query(L, b, i);
            if (seg < 0) continue;   /* an intended pad row: its output is discarded */
            int64_t ci = -1, li = 0; /* the call's item of this row and its local row */
            if (st->tnd) {
                while (item < s->n && i >= s->q_off[item] + s->sq[item]) item++;
                if (item < s->n && i >= s->q_off[item]) {
                    ci = item;
                    li = i - s->q_off[item];
                }
            } else {
                ci = b;
                li = i;
            }
            /* columns outside both the call item's keys and the intended segment's keys are 0 on both sides */
            int64_t j0 = L->segs[seg].kv_start, j1 = j0 + L->segs[seg].kv_len;
            if (ci >= 0) {
                int64_t a0 = s->kv_off[ci], a1 = a0 + s->skv[ci];
                if (a1 > a0) {
                    if (j1 == j0) {
                        j0 = a0;
                        j1 = a1;
                    } else {
                        if (a0 < j0) j0 = a0;
                        if (a1 > j1) j1 = a1;
                    }
                }
            }
            /* the hull of two distant ranges (shifted lists) can be wide: bound the total effort */
            steps = sat_add(steps, sat_mul(j1 - j0, s->heads));
            if (steps > 4 * WORK_CAP) return;
            for (int64_t h = 0; h < s->heads; h++)
                for (int64_t j = j0; j < j1; j++) {
                    int want = maskpack_allowed(L, b, h, i, j);
                    int got = ci >= 0 ? sem_allowed(s, ci, h, li, j - s->kv_off[ci]) : 0;
                    if (want == got) continue;
                    add(f, MASKPACK_NPU_MASK_MISMATCH,
                        "the call and the intended layout first disagree at (b %lld, head %lld, i %lld, j %lld)%s: "
                        "the call (sparse_mode %d) %s it, the intended layout %s it",
                        (long long)b, (long long)h, (long long)i, (long long)j, st->tnd ? " (a TND token pair)" : "",
                        (int)c->sparse_mode, got ? "allows" : "excludes", want ? "allows" : "excludes");
                    int64_t ipre, inext;
                    int band_mode = c->sparse_mode == 4 || (c->sparse_mode == 0 && c->atten_mask);
                    if (band_mode && mp_npu_layout_band(L, &ipre, &inext)) {
                        /* values beyond the longest item are all "unbounded" */
                        int64_t cap = sat_add(st->tnd ? st->max_sq : c->q_len, st->tnd ? st->max_skv : c->kv_len);
                        int64_t p0 = c->pre_tokens > cap ? cap : c->pre_tokens, p1 = ipre > cap ? cap : ipre;
                        int64_t n0 = c->next_tokens > cap ? cap : c->next_tokens, n1 = inext > cap ? cap : inext;
                        if (p0 != p1 || n0 != n1)
                            add(f, MASKPACK_NPU_PRE_NEXT_MISMATCH,
                                "the intended rule (window left %lld, right %lld, %s) needs pre_tokens %lld and "
                                "next_tokens %lld in band mode 4, found %lld and %lld",
                                (long long)L->window_left, (long long)L->window_right,
                                L->causal ? "causal" : "bidirectional", (long long)ipre, (long long)inext,
                                (long long)c->pre_tokens, (long long)c->next_tokens);
                    }
                    return;
                }
        }
}

/* The intended layout's own NPU-form lists equal the call's: a leading 0 is then a genuine empty item. */
static int lists_canonical(const maskpack_layout *L, const seq_list *lq, const seq_list *lk, maskpack_status *st,
                           maskpack_error *err) {
    *st = MASKPACK_OK;
    if (!L || !L->packed || !lq->present || !lk->present) return 0;
    mp_npu_items it;
    maskpack_status s = mp_npu_tnd_items(L, &it, err);
    if (s == MASKPACK_ERR_OUT_OF_MEMORY) *st = s;
    if (s) return 0; /* keys shared between pieces: the layout has no TND lists to compare with */
    int same = it.n == lq->n_raw && it.n == lk->n_raw;
    int64_t eq = 0, ek = 0;
    for (int64_t k = 0; same && k < it.n; k++) {
        eq += it.q_len[k];
        ek += it.kv_len[k];
        same = lq->v[k] == eq && lk->v[k] == ek;
    }
    mp_npu_items_free(&it);
    return same;
}

static maskpack_status run(state *st, maskpack_error *err) {
    const maskpack_npu_call *c = st->c;
    findings *f = &st->f;
    int32_t mode = c->sparse_mode;

    /* layout and mode */
    if (!st->known_layout)
        add(f, MASKPACK_NPU_BAD_LAYOUT, "input_layout %d: expected BSH, SBH, BSND, BNSD or TND", (int)c->input_layout);
    if (st->tnd && (!st->lq.present || !st->lk.present))
        add(f, MASKPACK_NPU_BAD_LAYOUT, "input_layout TND needs both actual_seq_qlen and actual_seq_kvlen, %s",
            !st->lq.present && !st->lk.present ? "neither was passed"
            : !st->lq.present                  ? "actual_seq_qlen is missing"
                                               : "actual_seq_kvlen is missing");
    st->mode_ok = mode >= 0 && mode <= 8;
    if (!st->mode_ok)
        add(f, MASKPACK_NPU_BAD_SPARSE_MODE, "sparse_mode %d: expected 0..8", (int)mode);
    else if (st->tnd && mode == 5) {
        add(f, MASKPACK_NPU_BAD_SPARSE_MODE,
            "sparse_mode 5 (prefix with a full mask) is not supported with TND; use 6");
        st->mode_ok = 0;
    } else if (st->known_layout && !st->tnd && (mode == 7 || mode == 8)) {
        add(f, MASKPACK_NPU_BAD_SPARSE_MODE, "sparse_mode %d exists only for varlen (TND) calls", (int)mode);
        st->mode_ok = 0;
    }

    /* heads and scale */
    if (c->heads_q < 1 || c->heads_kv < 1)
        add(f, MASKPACK_NPU_BAD_HEADS, "heads: expected heads_q, heads_kv >= 1, found %lld, %lld",
            (long long)c->heads_q, (long long)c->heads_kv);
    else if (c->heads_q % c->heads_kv != 0)
        add(f, MASKPACK_NPU_BAD_HEADS, "heads: heads_q %lld is not a multiple of heads_kv %lld (Nq %% Nkv must be 0)",
            (long long)c->heads_q, (long long)c->heads_kv);
    if (c->head_dim < 1 || c->head_dim > MP_NPU_MAX_HEAD_DIM)
        add(f, MASKPACK_NPU_BAD_HEADS, "head_dim %lld: expected 1..%d", (long long)c->head_dim, MP_NPU_MAX_HEAD_DIM);
    if (isnan(c->scale))
        add(f, MASKPACK_NPU_SCALE_DEFAULT, "scale not passed: the operator then uses 1.0, not 1/sqrt(head_dim)%s",
            c->head_dim > 0 ? "; pass it explicitly" : "");

    /* TND lists */
    if (st->tnd) {
        maskpack_status s;
        int canonical = lists_canonical(c->intended, &st->lq, &st->lk, &s, err);
        if (s) return s;
        if (st->lq.present) check_list(f, "actual_seq_qlen", &st->lq, c->total_q, canonical);
        if (st->lk.present) check_list(f, "actual_seq_kvlen", &st->lk, c->total_kv, canonical);
        st->items_ok = st->lq.present && st->lk.present && st->lq.ok && st->lk.ok;
        if (st->items_ok && st->lq.n != st->lk.n) {
            add(f, MASKPACK_NPU_NOT_CUMULATIVE,
                "actual_seq_qlen has %lld items but actual_seq_kvlen %lld: they must pair up item by item",
                (long long)st->lq.n, (long long)st->lk.n);
            st->items_ok = 0;
        }
        int64_t n = st->lq.present ? st->lq.n : st->lk.n;
        if (n > MASKPACK_NPU_MAX_ITEMS)
            add(f, MASKPACK_NPU_TOO_MANY_ITEMS, "%lld TND items: the operator takes at most %d", (long long)n,
                MASKPACK_NPU_MAX_ITEMS);
        else if (c->prefix && n > MP_NPU_MAX_ITEMS_PREFIX)
            add(f, MASKPACK_NPU_TOO_MANY_ITEMS, "%lld TND items with prefix: the operator takes at most %d",
                (long long)n, MP_NPU_MAX_ITEMS_PREFIX);
        if (st->items_ok) {
            st->n_items = st->lq.n;
            for (int64_t k = 0; k < st->n_items; k++) {
                int64_t q = st->lq.v[k] - (k ? st->lq.v[k - 1] : 0), kv = st->lk.v[k] - (k ? st->lk.v[k - 1] : 0);
                if (q > st->max_sq) st->max_sq = q;
                if (kv > st->max_skv) st->max_skv = kv;
            }
        }
    }

    /* prefix modes */
    st->prefix_ok = 1;
    if (st->mode_ok && (mode == 5 || mode == 6)) {
        int64_t want = st->tnd ? (st->items_ok ? st->n_items : -1) : c->batch;
        if (!c->prefix) {
            add(f, MASKPACK_NPU_BAD_SPARSE_MODE, "sparse_mode %d needs prefix (one length per %s), none passed",
                (int)mode, st->tnd ? "item" : "batch");
            st->prefix_ok = 0;
        } else if (want >= 0 && st->n_pf != want) {
            add(f, MASKPACK_NPU_BAD_SPARSE_MODE, "prefix has %lld entries, expected %lld (one per %s)",
                (long long)st->n_pf, (long long)want, st->tnd ? "item" : "batch");
            st->prefix_ok = 0;
        } else {
            for (int64_t k = 0; k < st->n_pf; k++)
                if (st->pf[k] < 0) {
                    add(f, MASKPACK_NPU_BAD_SPARSE_MODE, "prefix[%lld]: expected >= 0, found %lld", (long long)k,
                        (long long)st->pf[k]);
                    st->prefix_ok = 0;
                    break;
                }
        }
        if (!st->tnd && c->batch > MP_NPU_MAX_PREFIX_BATCH)
            add(f, MASKPACK_NPU_TOO_MANY_ITEMS, "sparse_mode %d with B = %lld: prefix modes take at most %d batches",
                (int)mode, (long long)c->batch, MP_NPU_MAX_PREFIX_BATCH);
    }

    /* atten_mask */
    check_mask(st);
    if (st->mask_ok && (mode == 2 || mode == 3 || mode == 4 || mode == 6 || mode == 7 || mode == 8))
        check_compressed_content(st);

    /* the call's predicate, when the description allows one */
    /* per-item semantics need one entry per batch item: a batch beyond 2^20 (no real call has one)
     * skips the content checks rather than allocating gigabytes for a fuzzed description */
    int computable = st->known_layout && st->mode_ok && (!st->tnd || st->items_ok) && (!c->atten_mask || st->mask_ok) &&
                     (mode != 5 && mode != 6 ? 1 : st->prefix_ok) && (st->tnd || c->batch <= (INT64_C(1) << 20));
    if (!computable) {
        check_pre_next(st, NULL);
        return MASKPACK_OK;
    }
    sem s;
    memset(&s, 0, sizeof s);
    s.tnd = st->tnd;
    s.mode = mode;
    s.pre = c->pre_tokens;
    s.next = c->next_tokens;
    s.n = st->tnd ? st->n_items : c->batch;
    s.mask_none = c->atten_mask == NULL;
    s.full = !s.mask_none && full_mode(mode, 1) ? c->atten_mask : NULL;
    s.heads = s.full && s.full->ndim == 4 ? s.full->shape[1] : 1;
    size_t nn = (size_t)(s.n > 0 ? s.n : 1);
    s.sq = mp_alloc_array(nn, sizeof(int64_t));
    s.skv = mp_alloc_array(nn, sizeof(int64_t));
    s.q_off = mp_alloc_array(nn, sizeof(int64_t));
    s.kv_off = mp_alloc_array(nn, sizeof(int64_t));
    maskpack_status rs = MASKPACK_OK;
    if (!s.sq || !s.skv || !s.q_off || !s.kv_off) {
        rs = mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "call", -1, -1, "out of memory");
        goto done;
    }
    for (int64_t k = 0; k < s.n; k++) {
        if (st->tnd) {
            s.q_off[k] = k ? st->lq.v[k - 1] : 0;
            s.kv_off[k] = k ? st->lk.v[k - 1] : 0;
            s.sq[k] = st->lq.v[k] - s.q_off[k];
            s.skv[k] = st->lk.v[k] - s.kv_off[k];
        } else {
            s.q_off[k] = s.kv_off[k] = 0;
            s.sq[k] = c->q_len;
            s.skv[k] = c->kv_len;
        }
    }
    s.prefix = (mode == 5 || mode == 6) ? st->pf : NULL;
    s.band = mp_npu_band_item(mode, s.sq, s.skv, s.n);
    if (mode == 7)
        for (int64_t k = 0; k < s.n; k++)
            if (k != s.band && s.sq[k] > s.skv[k]) {
                add(f, MASKPACK_NPU_BAD_SPARSE_MODE,
                    "sparse_mode 7: item %lld has Sq %lld > Skv %lld; only the band item may (mode 3 items need Sq "
                    "<= Skv)",
                    (long long)k, (long long)s.sq[k], (long long)s.skv[k]);
                break;
            }
    check_pre_next(st, &s);
    check_fully_masked(st, &s);
    if (mode == 5 && s.full && s.prefix) {
        /* the full mask of mode 5 must be the bottom-right causal + prefix rule it claims */
        int64_t work = sat_mul(sat_mul(sat_mul(s.n, c->q_len), c->kv_len), s.heads);
        for (int64_t k = 0; work <= WORK_CAP && k < s.n; k++)
            for (int64_t h = 0; h < s.heads; h++)
                for (int64_t i = 0; i < s.sq[k]; i++)
                    for (int64_t j = 0; j < s.skv[k]; j++) {
                        int rule = j <= i + s.skv[k] - s.sq[k] || j < s.prefix[k];
                        if (rule == !full_masked(&s, k, h, i, j)) continue;
                        add(f, MASKPACK_NPU_MASK_MISMATCH,
                            "sparse_mode 5: atten_mask (b %lld, head %lld, i %lld, j %lld) is %d but bottom-right "
                            "causal with prefix %lld says %d",
                            (long long)k, (long long)h, (long long)i, (long long)j, full_masked(&s, k, h, i, j),
                            (long long)s.prefix[k], !rule);
                        goto mode5_done;
                    }
    mode5_done:;
    }
    if (c->intended) compare_intended(st, &s);
done:
    free(s.sq);
    free(s.skv);
    free(s.q_off);
    free(s.kv_off);
    return rs;
}

maskpack_status maskpack_validate_npu_args(const maskpack_npu_call *call, maskpack_npu_report *report,
                                           maskpack_error *err) {
    MP_CHECK_NULL(err, call, "call");
    MP_CHECK_NULL(err, report, "report");
    state st;
    memset(&st, 0, sizeof st);
    st.c = call;
    st.known_layout = (int)call->input_layout >= MASKPACK_NPU_BSND && (int)call->input_layout <= MASKPACK_NPU_TND;
    st.tnd = call->input_layout == MASKPACK_NPU_TND;
    maskpack_status s = MASKPACK_OK;
    /* the description itself must be readable; these are errors, not findings */
    if (call->atten_mask) {
        s = mp_check_tensor(call->atten_mask, "atten_mask", 0, MASKPACK_MAX_DIMS, err);
        if (s) return s;
    }
    if (st.known_layout && !st.tnd && (call->batch < 1 || call->q_len < 1 || call->kv_len < 1))
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "call", -1, -1,
                       "call: a B*S input_layout needs batch, q_len, kv_len >= 1, found %lld, %lld, %lld",
                       (long long)call->batch, (long long)call->q_len, (long long)call->kv_len);
    if (call->total_q < 0 || call->total_kv < 0)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "call", -1, -1,
                       "call: total_q / total_kv must be >= 0 (0 = unknown), found %lld, %lld",
                       (long long)call->total_q, (long long)call->total_kv);
    if (call->actual_seq_qlen) {
        s = read_ints(call->actual_seq_qlen, "actual_seq_qlen", &st.lq.v, &st.lq.n_raw, err);
        if (s) goto out;
        st.lq.present = 1;
    }
    if (call->actual_seq_kvlen) {
        s = read_ints(call->actual_seq_kvlen, "actual_seq_kvlen", &st.lk.v, &st.lk.n_raw, err);
        if (s) goto out;
        st.lk.present = 1;
    }
    if (call->prefix) {
        s = read_ints(call->prefix, "prefix", &st.pf, &st.n_pf, err);
        if (s) goto out;
    }
    maskpack_npu_report local;
    memset(&local, 0, sizeof local);
    st.f.r = &local;
    s = run(&st, err);
    if (s) goto out;
    *report = local; /* written only once everything was checked */
    if (local.n_total > 0) {
        s = mp_fail(err, MASKPACK_ERR_NPU_CONTRACT, "call", -1, -1, "%s", local.findings[0].message);
    } else {
        s = mp_ok(err);
    }
out:
    free(st.lq.v);
    free(st.lk.v);
    free(st.pf);
    return s;
}
