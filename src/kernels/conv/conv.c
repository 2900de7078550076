/* conv.c: the causal depthwise conv1d of the Gated DeltaNet layer over a layout (with a
 * per-segment prefix = cache or CP halo, and the final conv state), and its backward. The conv runs
 * per segment, so no window ever reaches into another sequence; threads split the channels (each
 * thread owns its channels' dweight, so no reduction across threads).
 * The conv's kernel table (CONV_KERNELS) has the portable loops (REF) and rows of 8-lane AVX2 + FMA
 * vectors (AVX2), which also serve AVX-512 requests (every AVX-512 CPU has AVX2; the conv is
 * memory-bound, wider vectors would not pay); the rows run when x and y (dy, dx) are f32 or bf16
 * with contiguous channels. A bf16 row is widened to f32 on load (exact) and an f32 result rounded
 * to bf16 (nearest even, as mp_f32_to_bf16) on store, around the very f32 rows: every product and
 * sum is the f32 kernel's, so a bf16 result is bit for bit the f32 kernel's on the widened inputs,
 * rounded. */
#include "../gdn/gdn_common.h"
#include "../kernel_table.h"

#include <stdlib.h>
#include <string.h>

#define CONV_CB 64 /* channels per block: the window (4 x 64 floats) and weights stay in registers/L1 */

typedef struct conv_job {
    const maskpack_layout *L;
    mp_token_view x, y, dy, dx;
    const maskpack_tensor *weight;
    gdn_sview prefix, state, dstate, dprefix;
    float *dweight; /* [C][W] f32 (contiguous, owned by the caller of the job) */
    int64_t C, W;
    int silu;
    int vec; /* 1: the AVX2 rows (f32 or bf16 tensors with contiguous channels, see conv_vec_ok) */
    int64_t c0, c1;
} conv_job;

static inline float sigm(float x) { return 1.0f / (1.0f + expf(-x)); }

/* The token rows of a channel block sit C elements apart, each on its own page for large C: the
 * hardware prefetchers do not follow them, so the rows a few tokens ahead are requested here (a
 * hint only; results do not depend on it). */
#define CONV_PF_AHEAD 8
static inline void conv_pf(const mp_token_view *v, int64_t off, int64_t nb, int write) {
#if defined(__GNUC__) || defined(__clang__)
    if (!v->base || v->s_h != 1) return;
    const int64_t es = v->dt == MASKPACK_F32 ? 4 : 2;
    const char *p = v->base + off * es;
    for (int64_t b = 0; b < nb * es; b += 64) {
        if (write)
            __builtin_prefetch(p + b, 1, 3);
        else
            __builtin_prefetch(p + b, 0, 3);
    }
#else
    (void)v;
    (void)off;
    (void)nb;
    (void)write;
#endif
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CONV_HAVE_AVX2 1
#include "../isa/target_avx2.h"
#include "../isa/avx2_math.h"

static inline __m256i conv_lanes(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* the pre-activation sum_k wt[k] win[k] of 8 channels, k in order (as the portable loop) */
static inline __m256 conv_pre8(const float wt[MASKPACK_GDN_MAX_CONV][CONV_CB],
                               const float win[MASKPACK_GDN_MAX_CONV][CONV_CB], int64_t W, int64_t c) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t k = 0; k < W; k++) acc = _mm256_fmadd_ps(_mm256_loadu_ps(wt[k] + c), _mm256_loadu_ps(win[k] + c), acc);
    return acc;
}

/* 1 / (1 + exp(-a)) (exp256 clamps, so no inf: a very negative a gives a tiny positive value) */
static inline __m256 conv_sigm8(__m256 a) {
    const __m256 one = _mm256_set1_ps(1.0f);
    return _mm256_div_ps(one, _mm256_add_ps(one, exp256(_mm256_sub_ps(_mm256_setzero_ps(), a))));
}

/* One token of a channel block (nb channels; the arrays are CONV_CB wide and zero past nb): the
 * x row goes into win[W-1], the y row gets act(sum_k wt[k] win[k]). */
static void conv_fwd_row_avx2(const float wt[MASKPACK_GDN_MAX_CONV][CONV_CB], float win[MASKPACK_GDN_MAX_CONV][CONV_CB],
                              int64_t W, int64_t nb, const float *xr, float *yr, int silu) {
    for (int64_t c = 0; c < nb; c += 8) {
        const __m256i m = conv_lanes(nb - c);
        _mm256_storeu_ps(win[W - 1] + c, _mm256_maskload_ps(xr + c, m));
        __m256 a = conv_pre8(wt, win, W, c);
        if (silu) {
            /* a * sigm(a); NaN stays NaN (exp256 gives 0 for it, a * 1 = NaN) */
            const __m256 nan = _mm256_cmp_ps(a, a, _CMP_UNORD_Q);
            a = _mm256_blendv_ps(_mm256_mul_ps(a, conv_sigm8(a)), a, nan);
        }
        _mm256_maskstore_ps(yr + c, m, a);
    }
}

/* Backward of one token of a channel block: dp[0] = the gradient of the pre-activation from the dy
 * row, dw[k] += dp[0] win[k] in double (the products of two floats are exact in double, so the fused
 * multiply-add gives the portable loop's bits). win[W-1] must hold the x row. */
static void conv_bwd_row_avx2(const float wt[MASKPACK_GDN_MAX_CONV][CONV_CB],
                              const float win[MASKPACK_GDN_MAX_CONV][CONV_CB], float dp0[CONV_CB],
                              double dw[MASKPACK_GDN_MAX_CONV][CONV_CB], int64_t W, int64_t nb, const float *dyr,
                              int silu) {
    const __m256 one = _mm256_set1_ps(1.0f);
    for (int64_t c = 0; c < nb; c += 8) {
        __m256 d = _mm256_maskload_ps(dyr + c, conv_lanes(nb - c));
        if (silu) {
            const __m256 a = conv_pre8(wt, win, W, c), sg = conv_sigm8(a);
            d = _mm256_mul_ps(d, _mm256_mul_ps(sg, _mm256_fmadd_ps(a, _mm256_sub_ps(one, sg), one)));
        }
        _mm256_storeu_ps(dp0 + c, d);
        const __m256d dlo = _mm256_cvtps_pd(_mm256_castps256_ps128(d)),
                      dhi = _mm256_cvtps_pd(_mm256_extractf128_ps(d, 1));
        for (int64_t k = 0; k < W; k++) {
            const __m256 x = _mm256_loadu_ps(win[k] + c);
            _mm256_storeu_pd(dw[k] + c, _mm256_fmadd_pd(dlo, _mm256_cvtps_pd(_mm256_castps256_ps128(x)),
                                                        _mm256_loadu_pd(dw[k] + c)));
            _mm256_storeu_pd(dw[k] + c + 4, _mm256_fmadd_pd(dhi, _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)),
                                                            _mm256_loadu_pd(dw[k] + c + 4)));
        }
    }
}

/* dxr[c] = sum_k wt[k][c] dp[k][c] for the nb channels of a block */
static void conv_dx_row_avx2(const float wt[MASKPACK_GDN_MAX_CONV][CONV_CB],
                             const float dp[MASKPACK_GDN_MAX_CONV][CONV_CB], int64_t W, int64_t nb, float *dxr) {
    for (int64_t c = 0; c < nb; c += 8) {
        __m256 acc = _mm256_setzero_ps();
        for (int64_t k = 0; k < W; k++)
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(wt[k] + c), _mm256_loadu_ps(dp[k] + c), acc);
        _mm256_maskstore_ps(dxr + c, conv_lanes(nb - c), acc);
    }
}

/* (bf16 src[n]) -> f32 dst[n]: the exact widening (the bits shifted up), 8 lanes at a time, the
 * tail as mp_bf16_to_f32 */
static void conv_widen_avx2(const uint16_t *src, int64_t n, float *dst) {
    int64_t c = 0;
    for (; c + 8 <= n; c += 8) {
        const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + c)));
        _mm256_storeu_ps(dst + c, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
    }
    for (; c < n; c++) dst[c] = mp_bf16_to_f32(src[c]);
}

/* (f32 src[n]) -> bf16 dst[n] rounded to nearest even with NaN kept quiet: mp_f32_to_bf16's bits,
 * 8 lanes at a time (the tail by mp_f32_to_bf16 itself) */
static void conv_narrow_avx2(const float *src, int64_t n, uint16_t *dst) {
    const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1), quiet = _mm256_set1_epi32(0x40);
    int64_t c = 0;
    for (; c + 8 <= n; c += 8) {
        const __m256 f = _mm256_loadu_ps(src + c);
        const __m256i u = _mm256_castps_si256(f), hi = _mm256_srli_epi32(u, 16);
        /* (u + 0x7fff + lsb) >> 16 wraps as the scalar uint32 sum does (only for NaNs, replaced below) */
        const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(bias, _mm256_and_si256(hi, one))), 16);
        const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q));
        const __m256i v = _mm256_blendv_epi8(r, _mm256_or_si256(hi, quiet), nan);
        /* the 8 lanes (each < 2^16) packed to 16 bits: packus works per 128-bit half, the permute
         * brings both halves' results into the low 128 bits */
        const __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(v, v), 0xD8);
        _mm_storeu_si128((__m128i *)(dst + c), _mm256_castsi256_si128(p));
    }
    for (; c < n; c++) dst[c] = mp_f32_to_bf16(src[c]);
}

#include "../isa/target_pop.h"

/* (view, element offset of a row, nb, scratch[CONV_CB]) -> the row's nb channels as f32: the
 * tensor's own memory for f32, else the bf16 row widened into scratch */
static inline const float *conv_row_in(const mp_token_view *v, int64_t off, int64_t nb, float *scratch) {
    if (v->dt == MASKPACK_F32) return (const float *)v->base + off;
    conv_widen_avx2((const uint16_t *)v->base + off, nb, scratch);
    return scratch;
}

/* (view, element offset of a row, scratch[CONV_CB]) -> where the f32 row kernel writes the row: the
 * tensor itself for f32, else scratch (conv_row_out_done then rounds it into the tensor) */
static inline float *conv_row_out(const mp_token_view *v, int64_t off, float *scratch) {
    return v->dt == MASKPACK_F32 ? (float *)v->base + off : scratch;
}

/* (view, element offset of a row, nb, scratch[CONV_CB]) -> the row in scratch rounded to the bf16
 * tensor; nothing for f32 (the kernel wrote it in place) */
static inline void conv_row_out_done(const mp_token_view *v, int64_t off, int64_t nb, const float *scratch) {
    if (v->dt != MASKPACK_F32) conv_narrow_avx2(scratch, nb, (uint16_t *)v->base + off);
}
#endif

/* Whether a view can take the AVX2 rows: f32 or bf16 with contiguous channels (or absent). */
static int conv_vec_ok(const mp_token_view *v) {
    return !v->base || ((v->dt == MASKPACK_F32 || v->dt == MASKPACK_BF16) && v->s_h == 1);
}

static void load_weights(const maskpack_tensor *w, int64_t c0, int64_t nb, int64_t W,
                         float wt[MASKPACK_GDN_MAX_CONV][CONV_CB]) {
    for (int64_t k = 0; k < W; k++)
        for (int64_t c = 0; c < nb; c++)
            wt[k][c] = gdn_get(w->dtype, (const char *)w->data, (c0 + c) * w->strides[0] + k * w->strides[1]);
}

static void conv_forward_job(const conv_job *J) {
    const maskpack_layout *L = J->L;
    const int64_t W = J->W;
    float wt[MASKPACK_GDN_MAX_CONV][CONV_CB], win[MASKPACK_GDN_MAX_CONV][CONV_CB], out[CONV_CB];
#ifdef CONV_HAVE_AVX2
    float xin[CONV_CB]; /* a bf16 x row widened for the vector rows */
#endif
    /* the vector rows read whole 8-lane groups: lanes past nb must hold numbers */
    memset(wt, 0, sizeof wt);
    memset(win, 0, sizeof win);
    for (int64_t c0 = J->c0; c0 < J->c1; c0 += CONV_CB) {
        const int64_t nb = J->c1 - c0 < CONV_CB ? J->c1 - c0 : CONV_CB;
        load_weights(J->weight, c0, nb, W, wt);
        for (size_t s = 0; s < L->n_segments; s++) {
            const maskpack_segment *g = &L->segs[s];
            const int64_t row = L->packed ? 0 : g->row;
            for (int64_t i = 0; i < W - 1; i++)
                for (int64_t c = 0; c < nb; c++)
                    win[i][c] = J->prefix.base
                                    ? gdn_get(J->prefix.dt, J->prefix.base,
                                              (int64_t)s * J->prefix.s_n + (c0 + c) * J->prefix.s_h + i * J->prefix.s_k)
                                    : 0.0f;
            for (int64_t t = 0; t < g->q_len; t++) {
                const int64_t col = g->q_start + t;
                const int64_t xo = row * J->x.s_row + col * J->x.s_col + c0 * J->x.s_h;
                const int64_t yo = row * J->y.s_row + col * J->y.s_col + c0 * J->y.s_h;
                if (t + CONV_PF_AHEAD < g->q_len) {
                    conv_pf(&J->x, xo + CONV_PF_AHEAD * J->x.s_col, nb, 0);
                    conv_pf(&J->y, yo + CONV_PF_AHEAD * J->y.s_col, nb, 1);
                }
#ifdef CONV_HAVE_AVX2
                if (J->vec) {
                    float *yr = conv_row_out(&J->y, yo, out);
                    conv_fwd_row_avx2((const float(*)[CONV_CB])wt, win, W, nb, conv_row_in(&J->x, xo, nb, xin), yr,
                                      J->silu);
                    conv_row_out_done(&J->y, yo, nb, yr);
                    for (int64_t k = 0; k + 1 < W; k++) memcpy(win[k], win[k + 1], (size_t)nb * sizeof(float));
                    continue;
                }
#endif
                for (int64_t c = 0; c < nb; c++) win[W - 1][c] = gdn_get(J->x.dt, J->x.base, xo + c * J->x.s_h);
                for (int64_t c = 0; c < nb; c++) {
                    float acc = 0.0f;
                    for (int64_t k = 0; k < W; k++) acc += wt[k][c] * win[k][c];
                    out[c] = J->silu ? acc * sigm(acc) : acc;
                }
                for (int64_t c = 0; c < nb; c++) gdn_put(J->y.dt, J->y.base, yo + c * J->y.s_h, out[c]);
                for (int64_t k = 0; k + 1 < W; k++) memcpy(win[k], win[k + 1], (size_t)nb * sizeof(float));
            }
            if (J->state.base)
                for (int64_t i = 0; i < W - 1; i++)
                    for (int64_t c = 0; c < nb; c++)
                        gdn_put(J->state.dt, J->state.base,
                                (int64_t)s * J->state.s_n + (c0 + c) * J->state.s_h + i * J->state.s_k, win[i][c]);
        }
    }
}

/* Backward of one channel range. With xx = prefix ++ x (length len + W - 1) and
 * pre[t] = sum_w w[w] xx[t + w]: d xx[i] = sum_w w[w] dpre[i - w] (+ d state[i - len] for the
 * last W - 1 entries), dweight[w] = sum_t dpre[t] xx[t + w]. One forward sweep with a lag of
 * W - 1 finalises each xx entry as soon as the outputs it feeds are known. */
static void conv_backward_job(const conv_job *J) {
    const maskpack_layout *L = J->L;
    const int64_t W = J->W;
    float wt[MASKPACK_GDN_MAX_CONV][CONV_CB], win[MASKPACK_GDN_MAX_CONV][CONV_CB], dp[MASKPACK_GDN_MAX_CONV][CONV_CB];
    double dw[MASKPACK_GDN_MAX_CONV][CONV_CB];
#ifdef CONV_HAVE_AVX2
    float rowbuf[CONV_CB]; /* a bf16 dy row widened, or a dx row before its rounding, for the vector rows */
#endif
    /* the vector rows read whole 8-lane groups: lanes past nb must hold numbers */
    memset(wt, 0, sizeof wt);
    memset(win, 0, sizeof win);
    for (int64_t c0 = J->c0; c0 < J->c1; c0 += CONV_CB) {
        const int64_t nb = J->c1 - c0 < CONV_CB ? J->c1 - c0 : CONV_CB;
        load_weights(J->weight, c0, nb, W, wt);
        memset(dw, 0, sizeof dw);
        for (size_t s = 0; s < L->n_segments; s++) {
            const maskpack_segment *g = &L->segs[s];
            const int64_t row = L->packed ? 0 : g->row, len = g->q_len;
            for (int64_t i = 0; i < W - 1; i++)
                for (int64_t c = 0; c < nb; c++)
                    win[i][c] = J->prefix.base
                                    ? gdn_get(J->prefix.dt, J->prefix.base,
                                              (int64_t)s * J->prefix.s_n + (c0 + c) * J->prefix.s_h + i * J->prefix.s_k)
                                    : 0.0f;
            memset(dp, 0, sizeof dp);
            for (int64_t t = 0; t < len + W - 1; t++) {
                /* dp[j] = dpre[t - j] */
                for (int64_t j = W - 1; j > 0; j--) memcpy(dp[j], dp[j - 1], (size_t)nb * sizeof(float));
                if (t < len) {
                    const int64_t col = g->q_start + t;
                    const int64_t xo = row * J->x.s_row + col * J->x.s_col + c0 * J->x.s_h;
                    const int64_t yo = row * J->dy.s_row + col * J->dy.s_col + c0 * J->dy.s_h;
                    if (t + CONV_PF_AHEAD < len) {
                        conv_pf(&J->x, xo + CONV_PF_AHEAD * J->x.s_col, nb, 0);
                        conv_pf(&J->dy, yo + CONV_PF_AHEAD * J->dy.s_col, nb, 0);
                        if (J->dx.base)
                            conv_pf(&J->dx,
                                    row * J->dx.s_row + (col + CONV_PF_AHEAD - (W - 1)) * J->dx.s_col + c0 * J->dx.s_h,
                                    nb, 1);
                    }
#ifdef CONV_HAVE_AVX2
                    if (J->vec) {
                        if (J->x.dt == MASKPACK_F32)
                            memcpy(win[W - 1], (const float *)J->x.base + xo, (size_t)nb * sizeof(float));
                        else
                            conv_widen_avx2((const uint16_t *)J->x.base + xo, nb, win[W - 1]);
                    } else
#endif
                        for (int64_t c = 0; c < nb; c++) win[W - 1][c] = gdn_get(J->x.dt, J->x.base, xo + c * J->x.s_h);
#ifdef CONV_HAVE_AVX2
                    if (J->vec)
                        conv_bwd_row_avx2((const float(*)[CONV_CB])wt, (const float(*)[CONV_CB])win, dp[0], dw, W, nb,
                                          conv_row_in(&J->dy, yo, nb, rowbuf), J->silu);
                    else
#endif
                        for (int64_t c = 0; c < nb; c++) {
                            float acc = 0.0f;
                            for (int64_t k = 0; k < W; k++) acc += wt[k][c] * win[k][c];
                            float d = gdn_get(J->dy.dt, J->dy.base, yo + c * J->dy.s_h);
                            if (J->silu) {
                                const float sg = sigm(acc);
                                d *= sg * (1.0f + acc * (1.0f - sg));
                            }
                            dp[0][c] = d;
                            for (int64_t k = 0; k < W; k++) dw[k][c] += (double)d * (double)win[k][c];
                        }
                } else {
                    memset(dp[0], 0, (size_t)nb * sizeof(float));
                }
                /* xx[t] is final: its gradient goes to the prefix or to x[t - (W - 1)] */
#ifdef CONV_HAVE_AVX2
                if (J->vec && t >= W - 1 && t < len) {
                    /* the common case: no state gradient term, a dx row (or none) */
                    if (J->dx.base) {
                        const int64_t col = g->q_start + t - (W - 1);
                        const int64_t dxo = row * J->dx.s_row + col * J->dx.s_col + c0;
                        float *dxr = conv_row_out(&J->dx, dxo, rowbuf);
                        conv_dx_row_avx2((const float(*)[CONV_CB])wt, (const float(*)[CONV_CB])dp, W, nb, dxr);
                        conv_row_out_done(&J->dx, dxo, nb, dxr);
                    }
                    for (int64_t k = 0; k + 1 < W; k++) memcpy(win[k], win[k + 1], (size_t)nb * sizeof(float));
                    continue;
                }
#endif
                for (int64_t c = 0; c < nb; c++) {
                    float d = 0.0f;
                    for (int64_t k = 0; k < W; k++) d += wt[k][c] * dp[k][c];
                    if (t >= len && J->dstate.base)
                        d += gdn_get(J->dstate.dt, J->dstate.base,
                                     (int64_t)s * J->dstate.s_n + (c0 + c) * J->dstate.s_h + (t - len) * J->dstate.s_k);
                    if (t < W - 1) {
                        if (J->dprefix.base)
                            gdn_put(J->dprefix.dt, J->dprefix.base,
                                    (int64_t)s * J->dprefix.s_n + (c0 + c) * J->dprefix.s_h + t * J->dprefix.s_k, d);
                    } else if (J->dx.base) {
                        const int64_t col = g->q_start + t - (W - 1);
                        gdn_put(J->dx.dt, J->dx.base, row * J->dx.s_row + col * J->dx.s_col + (c0 + c) * J->dx.s_h, d);
                    }
                }
                if (t < len)
                    for (int64_t k = 0; k + 1 < W; k++) memcpy(win[k], win[k + 1], (size_t)nb * sizeof(float));
            }
        }
        if (J->dweight)
            for (int64_t c = 0; c < nb; c++)
                for (int64_t k = 0; k < W; k++) J->dweight[(c0 + c) * W + k] = (float)dw[k][c];
    }
}

/* The channel ranges of a call, claimed one at a time by the participants of a team: range i is
 * [i * per, min((i + 1) * per, C)). Each range owns its channels' outputs (dweight included), so
 * who runs it never changes a result. */
typedef struct conv_share {
    const conv_job *proto;
    int backward;
    int64_t per;
} conv_share;

static maskpack_status conv_range(void *ctx, int64_t i, int participant) {
    (void)participant;
    const conv_share *S = ctx;
    conv_job J = *S->proto;
    J.c0 = i * S->per;
    J.c1 = (i + 1) * S->per < J.C ? (i + 1) * S->per : J.C;
    if (S->backward)
        conv_backward_job(&J);
    else
        conv_forward_job(&J);
    return MASKPACK_OK;
}

/* (channels, threads) -> the channel ranges: n_threads of them, sizes multiples of 16 where
 * possible (fewer when the channels run out). */
static int conv_ranges(int64_t C, int n_threads, int64_t *per_out) {
    int64_t per = (C + n_threads - 1) / n_threads;
    per = (per + 15) & ~(int64_t)15;
    if (per < 16) per = 16;
    int64_t nr = (C + per - 1) / per;
    *per_out = per;
    return nr < 1 ? 1 : (int)nr;
}

/* Runs the job's channels split for n_threads threads: on the team, or (start_team) on a team of
 * as many threads as ranges started for this call (one that cannot start leaves its work to the
 * caller, with the same results). */
static void conv_run(const conv_job *proto, int backward, int n_threads, maskpack_workers *team, int start_team) {
    conv_share S = {proto, backward, 0};
    const int n_ranges = conv_ranges(proto->C, n_threads, &S.per);
    mp_parallel_for(start_team ? NULL : team, start_team ? n_ranges : 1, n_ranges, conv_range, &S);
}

/* The conv's kernel table: the portable loops and the AVX2 rows (vec). Both take f32 and bf16
 * natively: the AVX2 rows read and write bf16 rows themselves (widened on load, rounded on store
 * around the f32 arithmetic), so AUTO picks them for bf16 as for f32. */
typedef struct conv_kernel {
    mp_kernel_desc desc;
    int vec; /* 1: the AVX2 rows where the tensors allow (conv_vec_ok: f32 or bf16, contiguous
              * channels), else the portable loops */
} conv_kernel;

static const conv_kernel CONV_KERNELS[] = {
    {{MASKPACK_KERNEL_CONV, MASKPACK_ISA_REF, "conv/ref", GDN_FLOAT_DTYPES, GDN_FLOAT_DTYPES}, 0},
    {{MASKPACK_KERNEL_CONV, MASKPACK_ISA_AVX2, "conv/avx2", GDN_FLOAT_DTYPES, GDN_FLOAT_DTYPES}, 1},
};
enum { N_CONV_KERNELS = sizeof CONV_KERNELS / sizeof CONV_KERNELS[0] };

const mp_kernel_desc *conv_kernel_desc(size_t i) { return i < N_CONV_KERNELS ? &CONV_KERNELS[i].desc : NULL; }

static maskpack_status conv_common(const maskpack_layout *L, const maskpack_tensor *x, const maskpack_tensor *weight,
                                   const maskpack_tensor *prefix, int silu, maskpack_isa isa, int n_threads,
                                   conv_job *J, maskpack_error *err) {
    MP_CHECK_NULL(err, L, "layout");
    MP_CHECK_NULL(err, x, "x");
    MP_CHECK_NULL(err, weight, "weight");
    memset(J, 0, sizeof *J);
    J->L = L;
    int64_t cd[1] = {-1};
    maskpack_status s = mp_token_view_check(L, x, "x", 1, cd, GDN_FLOAT_DTYPES, &J->x, err);
    if (s) return s;
    if ((s = mp_check_tensor(weight, "weight", 2, 2, err))) return s;
    if (!(GDN_FLOAT_DTYPES & MP_DT(weight->dtype)))
        return mp_fail(err, MASKPACK_ERR_DTYPE, "weight", -1, -1, "weight: expected float32 or bfloat16, found %s",
                       maskpack_dtype_name(weight->dtype));
    if (weight->shape[0] != cd[0])
        return mp_fail(err, MASKPACK_ERR_SHAPE, "weight", -1, -1,
                       "weight: expected [C, W] with C = %lld (the channels of x), found [%lld, %lld]",
                       (long long)cd[0], (long long)weight->shape[0], (long long)weight->shape[1]);
    if (weight->shape[1] < 1 || weight->shape[1] > MASKPACK_GDN_MAX_CONV)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "weight", -1, -1,
                       "weight: expected a kernel size W in [1, %d], found %lld", MASKPACK_GDN_MAX_CONV,
                       (long long)weight->shape[1]);
    J->weight = weight;
    J->C = cd[0];
    J->W = weight->shape[1];
    if (prefix && (s = gdn_conv_state_view(L, prefix, "prefix", J->C, J->W, &J->prefix, err))) return s;
    if (silu != 0 && silu != 1)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "silu", -1, -1, "silu: expected 0 or 1, found %d", silu);
    if ((s = mp_check_threads(n_threads, "n_threads", err))) return s;
    J->silu = silu;
    size_t k;
    if ((s = mp_kernel_pick(MASKPACK_KERNEL_CONV, x->dtype, isa, &k, err))) return s;
#ifdef CONV_HAVE_AVX2
    J->vec = CONV_KERNELS[k].vec;
#else
    (void)k;
    J->vec = 0;
#endif
    return MASKPACK_OK;
}

/* The backward's workspace: the dweight sums of every channel ([C][W] f32, each range writing its
 * own channels), when dweight is asked for; the forward needs none. */
static size_t conv_ws_need(int64_t C, int64_t W, int with_dweight, float **dw, void *block) {
    if (!with_dweight) return 0;
    mp_carve c = block ? mp_carve_over(block) : mp_carve_counter();
    float *p = mp_carve_take(&c, (size_t)C, (size_t)W * sizeof(float), 64); /* C * W: a validated numel */
    if (dw) *dw = p;
    return mp_carve_size(&c);
}

/* The workspace convention of every kernel (mp_take_workspace), except that a call needing none
 * allocates nothing. */
static maskpack_status conv_take_ws(void *workspace, size_t workspace_bytes, size_t need, void **block, void **owned,
                                    maskpack_error *err) {
    if (need == 0 && !workspace && workspace_bytes == 0) {
        *block = *owned = NULL;
        return MASKPACK_OK;
    }
    return mp_take_workspace(workspace, workspace_bytes, need, "maskpack_causal_conv1d_workspace_size", block, owned,
                             err);
}

maskpack_status maskpack_causal_conv1d_workspace_size(const maskpack_layout *layout, const maskpack_tensor *x,
                                                      const maskpack_tensor *weight, int backward, size_t *bytes,
                                                      maskpack_error *err) {
    MP_CHECK_NULL(err, bytes, "bytes");
    conv_job J;
    maskpack_status s = conv_common(layout, x, weight, NULL, 0, MASKPACK_ISA_REF, 1, &J, err);
    if (s) return s;
    *bytes = conv_ws_need(J.C, J.W, backward != 0, NULL, NULL);
    return mp_ok(err);
}

/* The (isa, thread count) a call runs with: opts or the defaults (NULL), and on a team its
 * participant count in place of opts.n_threads. */
static maskpack_kernel_options conv_options(const maskpack_kernel_options *opts, maskpack_workers *team, int on_team) {
    maskpack_kernel_options o = opts ? *opts : maskpack_kernel_options_default();
    if (on_team) o.n_threads = maskpack_workers_threads(team);
    return o;
}

static maskpack_status conv_forward_call(const maskpack_layout *layout, const maskpack_tensor *x,
                                         const maskpack_tensor *weight, const maskpack_tensor *prefix, int silu,
                                         const maskpack_kernel_options *opts, maskpack_workers *team, int on_team,
                                         maskpack_tensor *y, maskpack_tensor *conv_state, void *workspace,
                                         size_t workspace_bytes, maskpack_error *err) {
    const maskpack_kernel_options o = conv_options(opts, team, on_team);
    const int n_threads = o.n_threads;
    conv_job J;
    maskpack_status s = conv_common(layout, x, weight, prefix, silu, o.isa, n_threads, &J, err);
    if (s) return s;
    MP_CHECK_NULL(err, y, "y");
    int64_t cd[1] = {J.C};
    if ((s = mp_token_view_check(layout, y, "y", 1, cd, GDN_FLOAT_DTYPES, &J.y, err))) return s;
    if (conv_state && (s = gdn_conv_state_view(layout, conv_state, "conv_state", J.C, J.W, &J.state, err))) return s;
    const maskpack_tensor *ins[3] = {x, weight, prefix};
    maskpack_tensor *outs[2] = {y, conv_state};
    const char *names[2] = {"y", "conv_state"};
    if ((s = gdn_check_overlap(ins, 3, outs, names, 2, err))) return s;
    void *block, *owned;
    if ((s = conv_take_ws(workspace, workspace_bytes, 0, &block, &owned, err))) return s;
    J.vec = J.vec && conv_vec_ok(&J.x) && conv_vec_ok(&J.y);
    gdn_zero_pads(layout, &J.y, J.C, 1);
    conv_run(&J, 0, n_threads, team, !on_team);
    free(owned);
    return mp_ok(err);
}

maskpack_status maskpack_causal_conv1d(const maskpack_layout *layout, const maskpack_tensor *x,
                                       const maskpack_tensor *weight, const maskpack_tensor *prefix, int silu,
                                       const maskpack_kernel_options *opts, maskpack_tensor *y,
                                       maskpack_tensor *conv_state, maskpack_error *err) {
    return conv_forward_call(layout, x, weight, prefix, silu, opts, NULL, 0, y, conv_state, NULL, 0, err);
}

maskpack_status maskpack_causal_conv1d_on(const maskpack_layout *layout, const maskpack_tensor *x,
                                          const maskpack_tensor *weight, const maskpack_tensor *prefix, int silu,
                                          const maskpack_kernel_options *opts, maskpack_workers *team,
                                          maskpack_tensor *y, maskpack_tensor *conv_state, void *workspace,
                                          size_t workspace_bytes, maskpack_error *err) {
    return conv_forward_call(layout, x, weight, prefix, silu, opts, team, 1, y, conv_state, workspace, workspace_bytes,
                             err);
}

static maskpack_status conv_backward_call(const maskpack_layout *layout, const maskpack_tensor *x,
                                          const maskpack_tensor *weight, const maskpack_tensor *prefix, int silu,
                                          const maskpack_tensor *dy, const maskpack_tensor *d_conv_state,
                                          const maskpack_kernel_options *opts, maskpack_workers *team, int on_team,
                                          maskpack_tensor *dx, maskpack_tensor *dweight, maskpack_tensor *d_prefix,
                                          void *workspace, size_t workspace_bytes, maskpack_error *err) {
    const maskpack_kernel_options o = conv_options(opts, team, on_team);
    const int n_threads = o.n_threads;
    conv_job J;
    maskpack_status s = conv_common(layout, x, weight, prefix, silu, o.isa, n_threads, &J, err);
    if (s) return s;
    MP_CHECK_NULL(err, dy, "dy");
    int64_t cd[1] = {J.C};
    if ((s = mp_token_view_check(layout, dy, "dy", 1, cd, GDN_FLOAT_DTYPES, &J.dy, err))) return s;
    if (d_conv_state && (s = gdn_conv_state_view(layout, d_conv_state, "d_conv_state", J.C, J.W, &J.dstate, err)))
        return s;
    if (dx && (s = mp_token_view_check(layout, dx, "dx", 1, cd, GDN_FLOAT_DTYPES, &J.dx, err))) return s;
    if (dweight) {
        int64_t ws[2] = {J.C, J.W};
        if ((s = mp_check_output(dweight, "dweight", MP_DT(MASKPACK_F32), 2, ws, err))) return s;
    }
    if (d_prefix && (s = gdn_conv_state_view(layout, d_prefix, "d_prefix", J.C, J.W, &J.dprefix, err))) return s;
    const maskpack_tensor *ins[5] = {x, weight, prefix, dy, d_conv_state};
    maskpack_tensor *outs[3] = {dx, dweight, d_prefix};
    const char *names[3] = {"dx", "dweight", "d_prefix"};
    if ((s = gdn_check_overlap(ins, 5, outs, names, 3, err))) return s;
    void *block, *owned;
    const size_t need = conv_ws_need(J.C, J.W, dweight != NULL, NULL, NULL);
    if ((s = conv_take_ws(workspace, workspace_bytes, need, &block, &owned, err))) return s;
    float *dw = NULL;
    if (dweight) conv_ws_need(J.C, J.W, 1, &dw, block);
    J.dweight = dw;
    J.vec = J.vec && conv_vec_ok(&J.x) && conv_vec_ok(&J.dy) && conv_vec_ok(&J.dx);
    if (J.dx.base) gdn_zero_pads(layout, &J.dx, J.C, 1);
    conv_run(&J, 1, n_threads, team, !on_team);
    if (dweight)
        for (int64_t c = 0; c < J.C; c++)
            for (int64_t k = 0; k < J.W; k++)
                ((float *)dweight->data)[c * dweight->strides[0] + k * dweight->strides[1]] = dw[c * J.W + k];
    free(owned);
    return mp_ok(err);
}

maskpack_status maskpack_causal_conv1d_backward(const maskpack_layout *layout, const maskpack_tensor *x,
                                                const maskpack_tensor *weight, const maskpack_tensor *prefix, int silu,
                                                const maskpack_tensor *dy, const maskpack_tensor *d_conv_state,
                                                const maskpack_kernel_options *opts, maskpack_tensor *dx,
                                                maskpack_tensor *dweight, maskpack_tensor *d_prefix,
                                                maskpack_error *err) {
    return conv_backward_call(layout, x, weight, prefix, silu, dy, d_conv_state, opts, NULL, 0, dx, dweight, d_prefix,
                              NULL, 0, err);
}

maskpack_status maskpack_causal_conv1d_backward_on(
    const maskpack_layout *layout, const maskpack_tensor *x, const maskpack_tensor *weight,
    const maskpack_tensor *prefix, int silu, const maskpack_tensor *dy, const maskpack_tensor *d_conv_state,
    const maskpack_kernel_options *opts, maskpack_workers *team, maskpack_tensor *dx, maskpack_tensor *dweight,
    maskpack_tensor *d_prefix, void *workspace, size_t workspace_bytes, maskpack_error *err) {
    return conv_backward_call(layout, x, weight, prefix, silu, dy, d_conv_state, opts, team, 1, dx, dweight, d_prefix,
                              workspace, workspace_bytes, err);
}
