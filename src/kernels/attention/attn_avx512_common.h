/* attn_avx512_common.h: vector helpers shared by the AVX-512 attention kernels (attn_avx512.c,
 * attn_avx512_bwd.c, attn_avx512bf16.c, attn_amx.c), and the row-vector vocabulary that
 * attn_fwd_kernel.inc and attn_bwd_kernel.inc are written over. Included inside each file's
 * AVX-512 target region, after BQ is defined; every function is static inline. */
#ifndef MASKPACK_ATTN_AVX512_COMMON_H
#define MASKPACK_ATTN_AVX512_COMMON_H

/* 2^x for x <= 0 (x = -inf gives 0): 2^round(x) * p(x - round(x)), p a degree-6 fit of 2^f on
 * [-1/2, 1/2] (relative error 2e-9 before f32 rounding). Results below 2^-125 are 0 through the
 * zeroing mask of scalef: letting scalef underflow (a zero or subnormal result, as every masked
 * -inf score would give) costs a microcode assist of ~200 cycles per vector. */
static inline __m512 exp2_ps(__m512 x) {
    __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-125.0f), _CMP_GE_OQ);
    x = _mm512_max_ps(x, _mm512_set1_ps(-125.0f));
    __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(1.5337576831145398e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3399860363060092e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.61851953435526e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5503289975177984e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.40226466087139e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931472056005104e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0000000005920204f));
    return _mm512_maskz_scalef_ps(keep, p, n);
}

/* tanh(x): odd polynomial near 0 (no cancellation), (1 - e)/(1 + e) with e = exp(-2|x|) elsewhere. */
static inline __m512 tanh_ps(__m512 x) {
    __m512 ax = _mm512_abs_ps(x);
    __m512 e = exp2_ps(_mm512_mul_ps(ax, _mm512_set1_ps((float)(-2.0 * LOG2E))));
    __m512 big = _mm512_div_ps(_mm512_sub_ps(_mm512_set1_ps(1.0f), e), _mm512_add_ps(_mm512_set1_ps(1.0f), e));
    __m512 x2 = _mm512_mul_ps(x, x);
    __m512 p = _mm512_set1_ps(-17.0f / 315.0f);
    p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(2.0f / 15.0f));
    p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-1.0f / 3.0f));
    p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(1.0f));
    __m512 small = _mm512_mul_ps(ax, p);
    __m512 r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(ax, _mm512_set1_ps(0.0625f), _CMP_LT_OQ), big, small);
    /* restore the sign */
    return _mm512_castsi512_ps(_mm512_or_si512(
        _mm512_castps_si512(r), _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32((int)0x80000000u))));
}


static inline int64_t round16(int64_t x) { return (x + 15) & ~(int64_t)15; }

/* Lane masks of a partial tile: allowed(i, j) for j = key, all rows at once. */
typedef struct {
    __m512i lo[3], hi[3], slo[3], shi[3], pre[3];
} lane_rule;

static inline void lane_rule_init(lane_rule *R, const attn_rows *rows) {
    for (int c = 0; c < 3; c++) {
        R->lo[c] = _mm512_loadu_si512(rows->lo + 16 * c);
        R->hi[c] = _mm512_loadu_si512(rows->hi + 16 * c);
        R->slo[c] = _mm512_loadu_si512(rows->slo + 16 * c);
        R->shi[c] = _mm512_loadu_si512(rows->shi + 16 * c);
        R->pre[c] = _mm512_loadu_si512(rows->pre + 16 * c);
    }
}

typedef __mmask16 lane_mask;
/* Base-only rows (attn_rows.simple): one interval per row. */
static inline __mmask16 lane_allowed_simple(const lane_rule *R, int c, __m512i jv) {
    return _mm512_cmple_epi32_mask(R->lo[c], jv) & _mm512_cmplt_epi32_mask(jv, R->hi[c]);
}

static inline __mmask16 lane_allowed(const lane_rule *R, int c, int32_t j) {
    __m512i jv = _mm512_set1_epi32(j);
    __mmask16 base = _mm512_cmple_epi32_mask(R->lo[c], jv) & _mm512_cmplt_epi32_mask(jv, R->hi[c]);
    __mmask16 span = _mm512_cmple_epi32_mask(R->slo[c], jv) & _mm512_cmplt_epi32_mask(jv, R->shi[c]);
    __mmask16 pre = _mm512_cmplt_epi32_mask(jv, R->pre[c]);
    return base | span | pre;
}
/* lane i: b where k allows it, else a */
#define lane_blend _mm512_mask_blend_ps

/* The same rule with keys along the lanes (the AMX kernel's scores are row-major): which of keys
 * j0 .. j0 + 15 row x sees, keys at or past kvl (the zero padding of a tile) never; a row past the
 * block's valid count sees none. */
static inline __mmask16 keys_allowed(const attn_rows *rows, int x, int32_t j0, int32_t kvl) {
    if (x >= rows->n) return 0;
    const __m512i j = _mm512_add_epi32(_mm512_set1_epi32(j0),
                                       _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    __mmask16 ok = _mm512_cmpge_epi32_mask(j, _mm512_set1_epi32(rows->lo[x])) &
                   _mm512_cmplt_epi32_mask(j, _mm512_set1_epi32(rows->hi[x]));
    ok |= _mm512_cmplt_epi32_mask(j, _mm512_set1_epi32(rows->pre[x]));
    ok |= _mm512_cmpge_epi32_mask(j, _mm512_set1_epi32(rows->slo[x])) &
          _mm512_cmplt_epi32_mask(j, _mm512_set1_epi32(rows->shi[x]));
    return ok & _mm512_cmplt_epi32_mask(j, _mm512_set1_epi32(kvl));
}

/* In-register transpose of a 16 x 16 f32 block (r[i] = row i -> r[j] = column j). */
static inline void tr16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[4 * i]), _mm512_castps_pd(t[4 * i + 2])));
        r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[4 * i]), _mm512_castps_pd(t[4 * i + 2])));
        r[4 * i + 2] =
            _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[4 * i + 1]), _mm512_castps_pd(t[4 * i + 3])));
        r[4 * i + 3] =
            _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[4 * i + 1]), _mm512_castps_pd(t[4 * i + 3])));
    }
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++) {
            t[8 * i + j] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + j + 4], 0x88);
            t[8 * i + j + 4] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + j + 4], 0xdd);
        }
    for (int j = 0; j < 8; j++) {
        r[j] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88);
        r[j + 8] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0xdd);
    }
}

/* dst[j][i] = src[i][j] * mul for a rows x cols block (both multiples of 16). */
static inline void transpose_scaled(const float *src, int64_t ss, float *dst, int64_t ds, int64_t rows, int64_t cols,
                                    float mul) {
    __m512 m = _mm512_set1_ps(mul), r[16];
    for (int64_t i = 0; i < rows; i += 16)
        for (int64_t j = 0; j < cols; j += 16) {
            for (int t = 0; t < 16; t++) r[t] = _mm512_loadu_ps(src + (i + t) * ss + j);
            tr16(r);
            for (int t = 0; t < 16; t++) _mm512_storeu_ps(dst + (j + t) * ds + i, _mm512_mul_ps(r[t], m));
        }
}

static inline int64_t round8(int64_t x) { return (x + 7) & ~(int64_t)7; }
static inline int64_t round64(int64_t x) { return (x + 63) & ~(int64_t)63; }

/* ---- the row-vector vocabulary of the frameworks (see attn_f32_kernel.inc) ------------------------ */

typedef __m512 vrow; /* RV query rows of one score or accumulator column */
#define RV  16
#define NRV 3 /* BQ / RV */
typedef lane_rule vr_rule;
typedef __mmask16 vr_mask;
typedef __m512i vr_jvec;

#define VR_INL static inline __attribute__((always_inline))
VR_INL vrow vr_zero(void) { return _mm512_setzero_ps(); }
VR_INL vrow vr_set1(float x) { return _mm512_set1_ps(x); }
VR_INL vrow vr_load(const float *p) { return _mm512_load_ps(p); }
VR_INL vrow vr_loadu(const float *p) { return _mm512_loadu_ps(p); }
VR_INL void vr_store(float *p, vrow x) { _mm512_store_ps(p, x); }
VR_INL void vr_storeu(float *p, vrow x) { _mm512_storeu_ps(p, x); }
VR_INL vrow vr_max(vrow a, vrow b) { return _mm512_max_ps(a, b); } /* b where either is NaN */
VR_INL vrow vr_add(vrow a, vrow b) { return _mm512_add_ps(a, b); }
VR_INL vrow vr_sub(vrow a, vrow b) { return _mm512_sub_ps(a, b); }
VR_INL vrow vr_mul(vrow a, vrow b) { return _mm512_mul_ps(a, b); }
VR_INL vrow vr_fmadd(vrow a, vrow b, vrow c) { return _mm512_fmadd_ps(a, b, c); }
VR_INL vrow vr_fnmadd(vrow a, vrow b, vrow c) { return _mm512_fnmadd_ps(a, b, c); }
VR_INL vrow vr_exp2(vrow x) { return exp2_ps(x); }
VR_INL vrow vr_tanh(vrow x) { return tanh_ps(x); }
/* -inf lanes (rows that have seen no key) to 0, the others as they are */
VR_INL vrow vr_unseen0(vrow x) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ), x, _mm512_setzero_ps());
}
VR_INL void vr_rule_init(vr_rule *R, const attn_rows *rows) { lane_rule_init(R, rows); }
VR_INL vr_jvec vr_jset1(int32_t j) { return _mm512_set1_epi32(j); }
VR_INL vr_mask vr_allowed_simple(const vr_rule *R, int c, vr_jvec jv) { return lane_allowed_simple(R, c, jv); }
VR_INL vr_mask vr_allowed(const vr_rule *R, int c, int32_t j) { return lane_allowed(R, c, j); }
/* lane i: x where k allows it, else fill */
VR_INL vrow vr_select(vr_mask k, vrow x, vrow fill) { return _mm512_mask_blend_ps(k, fill, x); }

#endif
