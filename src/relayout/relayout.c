/* relayout.c: one copy-plan engine for every move of a per-token tensor between layouts (pack,
 * unpack, CP shard, CP gather and their compositions). A plan lists contiguous runs of tokens
 * (source, source token, destination token, length) plus the padding runs of the destination; the
 * execution is a single pass of memcpy-sized copies, split across threads by bytes. */
#include "internal.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(_M_X64)
#include <emmintrin.h>
#define MP_HAVE_STREAM 1
#endif

/* Moves larger than this (in total) bypass the caches with streaming stores: the destination is
 * not read back soon and write-allocate traffic would cost a third of the bandwidth. */
#define MP_STREAM_THRESHOLD ((int64_t)16 << 20)

#ifdef MP_HAVE_STREAM
#include <immintrin.h>
/* AVX-512 variant: 64-byte streaming stores, one cache line each (chosen at run time). */
__attribute__((target("avx512f"))) static void copy_stream_avx512(char *d, const char *s, size_t n) {
    size_t head = (64 - ((uintptr_t)d & 63)) & 63;
    memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    size_t blocks = n / 256;
    for (size_t i = 0; i < blocks; i++, d += 256, s += 256) {
        __m512i a = _mm512_loadu_si512(s), b = _mm512_loadu_si512(s + 64);
        __m512i c = _mm512_loadu_si512(s + 128), e = _mm512_loadu_si512(s + 192);
        _mm512_stream_si512((void *)d, a);
        _mm512_stream_si512((void *)(d + 64), b);
        _mm512_stream_si512((void *)(d + 128), c);
        _mm512_stream_si512((void *)(d + 192), e);
    }
    memcpy(d, s, n - blocks * 256);
}
#endif

#ifdef MP_HAVE_STREAM
__attribute__((target("avx512f"))) static void zero_stream_avx512(char *d, size_t n) {
    size_t head = (64 - ((uintptr_t)d & 63)) & 63;
    if (head > n) head = n;
    memset(d, 0, head);
    d += head;
    n -= head;
    __m512i z = _mm512_setzero_si512();
    size_t lines = n / 64;
    for (size_t i = 0; i < lines; i++, d += 64) _mm512_stream_si512((void *)d, z);
    memset(d, 0, n - lines * 64);
}
#endif

/* memset(0) with streaming stores when the machine has AVX-512 and the block is large. */
static void zero_stream(char *d, size_t n) {
#ifdef MP_HAVE_STREAM
    if (n >= 1024 && __builtin_cpu_supports("avx512f")) {
        zero_stream_avx512(d, n);
        return;
    }
#endif
    memset(d, 0, n);
}

/* memcpy with non-temporal stores for the aligned middle of dst. */
static void copy_stream(char *d, const char *s, size_t n) {
#ifdef MP_HAVE_STREAM
    if (n >= 1024 && __builtin_cpu_supports("avx512f")) {
        copy_stream_avx512(d, s, n);
        return;
    }
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;
    if (n < 256 || head > n) {
        memcpy(d, s, n);
        return;
    }
    memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    size_t blocks = n / 64;
    for (size_t i = 0; i < blocks; i++, d += 64, s += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)s), b = _mm_loadu_si128((const __m128i *)(s + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + 32)), e = _mm_loadu_si128((const __m128i *)(s + 48));
        _mm_stream_si128((__m128i *)d, a);
        _mm_stream_si128((__m128i *)(d + 16), b);
        _mm_stream_si128((__m128i *)(d + 32), c);
        _mm_stream_si128((__m128i *)(d + 48), e);
    }
    memcpy(d, s, n - blocks * 64);
#else
    memcpy(d, s, n);
#endif
}

static void stream_fence(void) {
#ifdef MP_HAVE_STREAM
    _mm_sfence();
#endif
}

typedef struct run {
    int64_t src;     /* source index, -1 for a padding fill */
    int64_t src_tok; /* flattened token index in the source grid (row * width + column) */
    int64_t dst_tok; /* flattened token index in the destination grid */
    int64_t len;     /* tokens */
} run;

typedef struct grid {
    int64_t rows, width;
    int packed;
} grid;

struct maskpack_relayout_plan {
    size_t n_src;
    grid *src; /* [n_src] */
    grid dst;
    run *runs; /* copies then fills, each sorted by dst_tok */
    size_t n_copy, n_fill;
};

/* ---- planning ------------------------------------------------------------------------------------ */

typedef struct piece {
    int64_t seq, pos, len; /* positions [pos, pos + len) of sequence seq */
    int64_t src, tok;      /* source index and flattened token of position pos */
    int64_t full_len;      /* the sequence's whole length as this source knows it */
} piece;

static int64_t seq_of(const maskpack_segment *g, size_t k) {
    return (g->flags & MASKPACK_SEGMENT_EXPLICIT_POS) ? g->origin : (int64_t)k;
}
static int64_t pos_of(const maskpack_segment *g) { return (g->flags & MASKPACK_SEGMENT_EXPLICIT_POS) ? g->q_pos : 0; }
static int64_t full_len_of(const maskpack_segment *g) {
    return (g->flags & MASKPACK_SEGMENT_EXPLICIT_POS) ? g->kv_len : g->q_len;
}

static int cmp_piece(const void *a, const void *b) {
    const piece *x = a, *y = b;
    if (x->seq != y->seq) return x->seq < y->seq ? -1 : 1;
    if (x->pos != y->pos) return x->pos < y->pos ? -1 : 1;
    return 0;
}

void maskpack_relayout_plan_free(maskpack_relayout_plan *P) {
    if (!P) return;
    free(P->src);
    free(P->runs);
    free(P);
}

size_t maskpack_relayout_plan_runs(const maskpack_relayout_plan *P) { return P ? P->n_copy + P->n_fill : 0; }

/* 1 when L is (or may be) a CP shard: it holds pieces, or holds nothing at all (an empty rank). */
static int has_pieces(const maskpack_layout *L) {
    if (L->n_segments == 0) return 1;
    for (size_t k = 0; k < L->n_segments; k++)
        if (L->segs[k].flags & MASKPACK_SEGMENT_EXPLICIT_POS) return 1;
    return 0;
}

maskpack_status maskpack_relayout_plan_create(const maskpack_layout *const *sources, size_t n_src,
                                              const maskpack_layout *dst, maskpack_relayout_plan **out,
                                              maskpack_error *err) {
    MP_CHECK_NULL(err, sources, "sources");
    MP_CHECK_NULL(err, dst, "dst");
    MP_CHECK_NULL(err, out, "out");
    if (n_src == 0)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "n_src", -1, -1, "n_src: expected >= 1 source, found 0");
    size_t n_pieces = 0;
    for (size_t s = 0; s < n_src; s++) {
        if (!sources[s])
            return mp_fail(err, MASKPACK_ERR_NULL_ARGUMENT, "sources", (int64_t)s, -1,
                           "sources[%zu]: expected a layout, found NULL", s);
        if (mp_has_key_blocks(sources[s]))
            return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "sources", (int64_t)s, -1,
                           "sources[%zu]: a layout of key blocks (MASKPACK_SEGMENT_KEY_BLOCK) describes one ring "
                           "step's attention, not where tokens lie; move tensors through the shard layouts",
                           s);
        n_pieces += sources[s]->n_segments;
    }
    if (mp_has_key_blocks(dst))
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "dst", -1, -1,
                       "dst: a layout of key blocks (MASKPACK_SEGMENT_KEY_BLOCK) describes one ring step's "
                       "attention, not where tokens lie; move tensors through the shard layouts");
    /* Two unsharded layouts describe the same batch only with the same sequences, length by length. */
    if (!has_pieces(dst)) {
        for (size_t s = 0; s < n_src; s++) {
            const maskpack_layout *S = sources[s];
            if (has_pieces(S)) continue;
            if (n_src > 1)
                return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "sources", (int64_t)s, -1,
                               "sources[%zu]: several sources must all be CP shards (pieces), this one is unsharded",
                               s);
            if (S->n_segments != dst->n_segments)
                return mp_fail(err, MASKPACK_ERR_SHAPE, "dst", -1, -1,
                               "dst: expected the source's %zu sequences, found %zu", S->n_segments, dst->n_segments);
            for (size_t k = 0; k < S->n_segments; k++)
                if (S->segs[k].q_len != dst->segs[k].q_len)
                    return mp_fail(err, MASKPACK_ERR_SHAPE, "dst", (int64_t)k, -1,
                                   "dst: sequence %zu has %lld tokens, the source's has %lld", k,
                                   (long long)dst->segs[k].q_len, (long long)S->segs[k].q_len);
        }
    }
    piece *pc = mp_alloc_array(n_pieces, sizeof *pc);
    maskpack_relayout_plan *P = calloc(1, sizeof *P);
    if (P) P->src = mp_alloc_array(n_src, sizeof *P->src);
    if (!pc || !P || !P->src) {
        free(pc);
        maskpack_relayout_plan_free(P);
        return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "plan", -1, -1, "out of memory");
    }
    size_t m = 0;
    for (size_t s = 0; s < n_src; s++) {
        const maskpack_layout *S = sources[s];
        P->src[s] = (grid){S->n_rows, S->q_width, S->packed};
        for (size_t k = 0; k < S->n_segments; k++) {
            const maskpack_segment *g = &S->segs[k];
            if (g->q_len == 0) continue;
            pc[m++] = (piece){seq_of(g, k),  pos_of(g), g->q_len, (int64_t)s, g->row * S->q_width + g->q_start,
                              full_len_of(g)};
        }
    }
    P->n_src = n_src;
    P->dst = (grid){dst->n_rows, dst->q_width, dst->packed};
    qsort(pc, m, sizeof *pc, cmp_piece);
    for (size_t t = 1; t < m; t++)
        if (pc[t].seq == pc[t - 1].seq && pc[t - 1].pos + pc[t - 1].len > pc[t].pos) {
            int64_t seq = pc[t].seq, pos = pc[t].pos;
            free(pc);
            maskpack_relayout_plan_free(P);
            return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "sources", seq, pos,
                           "sources: token %lld of sequence %lld is held by two sources", (long long)pos,
                           (long long)seq);
        }
    /* copies: at most one run per (dst segment, piece) boundary; fills: at most one per dst segment + row */
    size_t cap = m + 2 * dst->n_segments + (size_t)dst->n_rows + 1;
    P->runs = mp_alloc_array(cap, sizeof *P->runs);
    if (!P->runs) {
        free(pc);
        maskpack_relayout_plan_free(P);
        return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "plan", -1, -1, "out of memory");
    }
    size_t nr = 0;
    maskpack_status st = MASKPACK_OK;
    for (size_t d = 0; d < dst->n_segments && !st; d++) {
        const maskpack_segment *g = &dst->segs[d];
        if (g->q_len == 0) continue;
        int64_t seq = seq_of(g, d), p = pos_of(g), end = p + g->q_len;
        int64_t tok = g->row * dst->q_width + g->q_start;
        /* first piece of seq with pos + len > p */
        size_t a = 0, z = m;
        while (a < z) {
            size_t mid = a + (z - a) / 2;
            if (pc[mid].seq < seq || (pc[mid].seq == seq && pc[mid].pos + pc[mid].len <= p))
                a = mid + 1;
            else
                z = mid;
        }
        while (p < end) {
            if (a >= m || pc[a].seq != seq || pc[a].pos > p) {
                st = mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "sources", seq, p,
                             "dst token %lld of sequence %lld has no source (is a CP rank's part missing?)",
                             (long long)p, (long long)seq);
                break;
            }
            if ((g->flags & MASKPACK_SEGMENT_EXPLICIT_POS) && pc[a].full_len != full_len_of(g)) {
                st = mp_fail(err, MASKPACK_ERR_SHAPE, "dst", seq, -1,
                             "dst: sequence %lld has %lld tokens in the shard, %lld in the source", (long long)seq,
                             (long long)full_len_of(g), (long long)pc[a].full_len);
                break;
            }
            int64_t take = pc[a].pos + pc[a].len - p;
            if (take > end - p) take = end - p;
            if (nr == cap) { /* guard: the bound above is exact, this cannot trigger */
                st = mp_fail(err, MASKPACK_ERR_OVERFLOW, "plan", -1, -1, "internal run bound exceeded");
                break;
            }
            P->runs[nr++] = (run){pc[a].src, pc[a].tok + (p - pc[a].pos), tok, take};
            tok += take;
            p += take;
            if (p >= pc[a].pos + pc[a].len) a++;
        }
    }
    free(pc);
    if (st) {
        maskpack_relayout_plan_free(P);
        return st;
    }
    P->n_copy = nr;
    /* padding fills of dst: the columns of each row outside real tokens */
    for (int64_t r = 0; r < dst->n_rows; r++) {
        int64_t col = 0;
        for (size_t k = mp_row_begin(dst, r); k <= mp_row_begin(dst, r + 1); k++) {
            int64_t next = k < mp_row_begin(dst, r + 1) ? dst->segs[k].q_start : dst->q_width;
            if (next > col) P->runs[nr++] = (run){-1, 0, r * dst->q_width + col, next - col};
            if (k < mp_row_begin(dst, r + 1)) col = dst->segs[k].q_start + dst->segs[k].q_len;
        }
    }
    P->n_fill = nr - P->n_copy;
    *out = P;
    return mp_ok(err);
}

/* ---- execution ----------------------------------------------------------------------------------- */

typedef struct view {
    char *base;
    int64_t rows, width;  /* token grid */
    int64_t s_row, s_col; /* byte strides of the token dims (s_row unused when packed) */
    int packed;
} view;

static inline char *token_addr(const view *v, int64_t tok) {
    if (v->packed) return v->base + tok * v->s_col;
    return v->base + (tok / v->width) * v->s_row + (tok % v->width) * v->s_col;
}

/* Validates a per-token tensor of grid g; fills the view and the trailing shape. */
static maskpack_status check_token_tensor(const maskpack_tensor *t, const char *name, const grid *g,
                                          maskpack_dtype dtype, view *v, int64_t *inner_elems, maskpack_error *err) {
    maskpack_status s = mp_check_tensor(t, name, g->packed ? 1 : 2, MASKPACK_MAX_DIMS, err);
    if (s) return s;
    int32_t lead = g->packed ? 1 : 2;
    int ok = g->packed ? t->shape[0] == g->width : (t->shape[0] == g->rows && t->shape[1] == g->width);
    if (!ok) { /* the whole shape: which dimension is off is often the question */
        char shape[200];
        mp_format_shape(shape, sizeof shape, t->ndim, t->shape);
        if (g->packed)
            return mp_fail(err, MASKPACK_ERR_SHAPE, name, -1, -1,
                           "%s: expected leading dimension %lld (tokens of a packed layout), found shape %s", name,
                           (long long)g->width, shape);
        return mp_fail(err, MASKPACK_ERR_SHAPE, name, -1, -1,
                       "%s: expected leading dimensions [%lld, %lld] (rows, columns), found shape %s", name,
                       (long long)g->rows, (long long)g->width, shape);
    }
    if (t->dtype != dtype)
        return mp_fail(err, MASKPACK_ERR_DTYPE, name, -1, -1, "%s: expected dtype %s (as out), found %s", name,
                       maskpack_dtype_name(dtype), maskpack_dtype_name(t->dtype));
    int64_t inner = 1, want = 1;
    for (int32_t d = t->ndim - 1; d >= lead; d--) {
        if (t->shape[d] != 1 && t->strides[d] != want)
            return mp_fail(err, MASKPACK_ERR_SHAPE, name, d, -1,
                           "%s: trailing dimension %d must be contiguous (stride %lld), found stride %lld", name,
                           (int)d, (long long)want, (long long)t->strides[d]);
        want *= t->shape[d];
        inner *= t->shape[d];
    }
    for (int32_t d = 0; d < lead; d++)
        if (t->strides[d] < 0)
            return mp_fail(err, MASKPACK_ERR_SHAPE, name, d, -1, "%s: negative strides are not supported", name);
    int64_t es = (int64_t)maskpack_dtype_size(t->dtype);
    v->base = t->data;
    v->rows = g->rows;
    v->width = g->width;
    v->packed = g->packed;
    v->s_row = g->packed ? 0 : t->strides[0] * es;
    v->s_col = t->strides[lead - 1] * es;
    *inner_elems = inner;
    return MASKPACK_OK;
}

static int same_trailing(const maskpack_tensor *a, int32_t la, const maskpack_tensor *b, int32_t lb) {
    if (a->ndim - la != b->ndim - lb) return 0;
    for (int32_t d = 0; d < a->ndim - la; d++)
        if (a->shape[la + d] != b->shape[lb + d]) return 0;
    return 1;
}

typedef struct job {
    const maskpack_relayout_plan *P;
    const view *src;
    const view *dst;
    int64_t inner_bytes;
    const unsigned char *pad; /* inner_bytes of pad pattern, or NULL for zeros */
    int stream;               /* use non-temporal stores */
    size_t run_from, run_to;  /* runs [run_from, run_to) ... */
    int64_t tok_from, tok_to; /* ... starting at token tok_from of run_from, ending before tok_to of run_to-1 */
} job;

static void copy_tokens(const view *sv, int64_t st, const view *dv, int64_t dt, int64_t n, int64_t ib, int stream) {
    if (n <= 0) return;
    char *d = token_addr(dv, dt);
    const char *s = token_addr(sv, st);
    if (sv->s_col == ib && dv->s_col == ib) {
        if (stream)
            copy_stream(d, s, (size_t)(n * ib));
        else
            memcpy(d, s, (size_t)(n * ib));
        return;
    }
    if (stream && ib >= 256) {
        for (int64_t t = 0; t < n; t++) copy_stream(d + t * dv->s_col, s + t * sv->s_col, (size_t)ib);
        return;
    }
    for (int64_t t = 0; t < n; t++) memcpy(d + t * dv->s_col, s + t * sv->s_col, (size_t)ib);
}

static void fill_tokens(const view *dv, int64_t dt, int64_t n, int64_t ib, const unsigned char *pad, int stream) {
    if (n <= 0) return;
    char *d = token_addr(dv, dt);
    if (!pad) {
        if (dv->s_col == ib) {
            if (stream)
                zero_stream(d, (size_t)(n * ib));
            else
                memset(d, 0, (size_t)(n * ib));
            return;
        }
        for (int64_t t = 0; t < n; t++) memset(d + t * dv->s_col, 0, (size_t)ib);
        return;
    }
    for (int64_t t = 0; t < n; t++) memcpy(d + t * dv->s_col, pad, (size_t)ib);
}

static void run_job(const job *J) {
    const maskpack_relayout_plan *P = J->P;
    for (size_t r = J->run_from; r < J->run_to; r++) {
        const run *R = &P->runs[r];
        int64_t a = r == J->run_from ? J->tok_from : 0;
        int64_t b = r + 1 == J->run_to ? J->tok_to : R->len;
        if (R->src >= 0)
            copy_tokens(&J->src[R->src], R->src_tok + a, J->dst, R->dst_tok + a, b - a, J->inner_bytes, J->stream);
        else
            fill_tokens(J->dst, R->dst_tok + a, b - a, J->inner_bytes, J->pad, J->stream);
    }
    if (J->stream) stream_fence(); /* streaming stores are weakly ordered: publish before returning */
}

/* Splits the plan's token total into nj equal shares (jobs[0..nj)), walking the runs. */
static void split_jobs(const maskpack_relayout_plan *P, int64_t total, int nj, job proto, job *jobs) {
    size_t nr = P->n_copy + P->n_fill, r = 0;
    int64_t off = 0;
    for (int t = 0; t < nj; t++) {
        int64_t share = total / nj + (t < total % nj);
        jobs[t] = proto;
        jobs[t].run_from = r;
        jobs[t].tok_from = off;
        int64_t left = share;
        while (left > 0 && r < nr) {
            int64_t avail = P->runs[r].len - off;
            if (avail > left) {
                off += left;
                left = 0;
            } else {
                left -= avail;
                r++;
                off = 0;
            }
        }
        /* job covers runs [run_from, run_to) with the last run ending at token tok_to */
        if (off == 0) {
            jobs[t].run_to = r;
            jobs[t].tok_to = r > 0 ? P->runs[r - 1].len : 0;
        } else {
            jobs[t].run_to = r + 1;
            jobs[t].tok_to = off;
        }
        if (jobs[t].run_to <= jobs[t].run_from) jobs[t].run_to = jobs[t].run_from; /* empty share */
    }
}

/* Chunks of a move taken dynamically by a team (mp_run_for_guided): a worker that wakes late takes
 * fewer chunks. The caller takes chunks from the front and workers from the back, so with a steady
 * worker each core copies the same bytes call after call and finds them still in its own L2. Each
 * take is 1/threads of the chunks left (at least one), so a move of 20 chunks costs a handful of
 * contended atomic operations rather than 20, and the split point stays near the middle from call
 * to call. */
enum { MAX_CHUNKS = 64 };
#define CHUNK_BYTES ((int64_t)16 << 10) /* small enough to balance a 300 KB move between 2 cores */
/* Below this many bytes a move stays on the caller's thread whatever the team. A team's run is as fast as
 * its slowest thread: on torch's OpenMP pool the region's end waits for every thread, and with a core
 * taken by another process a thread the scheduler has not run yet costs a time slice where the move
 * takes microseconds. bench/bench_small_moves.py on 2 cores of a quiet machine (taskset), the pool used
 * for every size, then one core kept busy: every move on the pool took 8 ms or more (64 KB: 0.05 ms idle,
 * 8.0 ms contended; 16 MB: 0.8 ms idle, 7.7 ms contended), while the caller alone took 0.2 ms and 2.1 ms.
 * At 64 MB the pool's contended time (11.7 ms) is within 2x of the caller's idle time (7.9 ms) and the
 * idle pool still gains (6.6 ms); below it the time slice dominates. So a move splits only from
 * 64 MiB up; the environment variable MASKPACK_TEAM_MIN_BYTES (bytes, read once) overrides it. */
#define TEAM_MIN_BYTES_DEFAULT ((int64_t)64 << 20)
static int64_t team_min_bytes(void) {
    static _Atomic int64_t cached = -1;
    int64_t v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (v >= 0) return v;
    v = TEAM_MIN_BYTES_DEFAULT;
    const char *env = getenv("MASKPACK_TEAM_MIN_BYTES");
    if (env && *env) {
        char *end = NULL;
        long long x = strtoll(env, &end, 10);
        if (end && *end == '\0' && x >= 0) v = (int64_t)x;
    }
    atomic_store_explicit(&cached, v, memory_order_relaxed);
    return v;
}
#define TEAM_MIN_BYTES team_min_bytes()
/* One chunk of a move: the run layer's guided claims (mp_run_for_guided) deal them out. */
static maskpack_status run_chunk(void *ctx, int64_t j, int participant) {
    (void)participant;
    run_job(&((job *)ctx)[j]);
    return MASKPACK_OK;
}

/* Validation, then the copy on a team: the caller's, or one of n_threads started for this call. */
static maskpack_status execute(const maskpack_relayout_plan *P, const maskpack_tensor *const *x, maskpack_tensor *out,
                               const void *pad_value, int n_threads, maskpack_workers *workers, maskpack_error *err) {
    MP_CHECK_NULL(err, P, "plan");
    MP_CHECK_NULL(err, x, "x");
    MP_CHECK_NULL(err, out, "out");
    maskpack_status ts = mp_check_threads(n_threads, "n_threads", err);
    if (ts) return ts;
    view dv, sv_stack[8];
    view *sv = P->n_src <= 8 ? sv_stack : mp_alloc_array(P->n_src, sizeof *sv);
    if (!sv) return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "x", -1, -1, "out of memory");
    int64_t inner = 0, inner_s;
    maskpack_status s = MASKPACK_OK;
    if (!out || (s = mp_check_tensor(out, "out", 1, MASKPACK_MAX_DIMS, err))) goto done;
    s = check_token_tensor(out, "out", &P->dst, out->dtype, &dv, &inner, err);
    if (s || (s = mp_check_no_self_overlap(out, "out", err))) goto done;
    /* out's dtype follows the input's: a mismatch is out's fault, named as such */
    if (P->n_src && x[0] && x[0]->dtype != out->dtype) {
        s = mp_fail(err, MASKPACK_ERR_DTYPE, "out", -1, -1, "out: expected dtype %s (as x[0]), found %s",
                    maskpack_dtype_name(x[0]->dtype), maskpack_dtype_name(out->dtype));
        goto done;
    }
    int32_t lead_out = P->dst.packed ? 1 : 2;
    uintptr_t olo, ohi;
    mp_tensor_extent(out, &olo, &ohi);
    for (size_t i = 0; i < P->n_src && !s; i++) {
        /* the argument's name, for messages; formatted only past the common counts (a move of a
         * small tensor takes about a microsecond, and snprintf costs a tenth of that) */
        static const char *const names[] = {"x[0]", "x[1]", "x[2]", "x[3]", "x[4]", "x[5]", "x[6]", "x[7]"};
        char buf[32];
        const char *name = i < 8 ? names[i] : (snprintf(buf, sizeof buf, "x[%zu]", i), buf);
        if (!x[i]) {
            s = mp_fail(err, MASKPACK_ERR_NULL_ARGUMENT, name, (int64_t)i, -1, "%s: expected a tensor, found NULL",
                        name);
            break;
        }
        s = check_token_tensor(x[i], name, &P->src[i], out->dtype, &sv[i], &inner_s, err);
        if (s) break;
        if (!same_trailing(x[i], P->src[i].packed ? 1 : 2, out, lead_out)) {
            s = mp_fail(err, MASKPACK_ERR_SHAPE, name, (int64_t)i, -1,
                        "%s: trailing dimensions (per-token shape) differ from out's", name);
            break;
        }
        uintptr_t lo, hi;
        mp_tensor_extent(x[i], &lo, &hi);
        if (mp_extents_meet(lo, hi, olo, ohi)) {
            s = mp_fail(err, MASKPACK_ERR_OVERLAP, name, (int64_t)i, -1,
                        "%s and out overlap in memory; relayout writes out while reading %s", name, name);
            break;
        }
    }
    if (s) goto done;
    {
        int64_t ib = inner * (int64_t)maskpack_dtype_size(out->dtype);
        const unsigned char *pad = NULL;
        if (pad_value) { /* a repeated element; all-zero bytes take the memset path */
            size_t es = maskpack_dtype_size(out->dtype);
            int zero = 1;
            for (size_t b = 0; b < es; b++) zero &= ((const unsigned char *)pad_value)[b] == 0;
            if (!zero && ib > 0) {
                unsigned char *pat = malloc((size_t)ib);
                if (!pat) {
                    s = mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "pad_value", -1, -1, "out of memory");
                    goto done;
                }
                for (int64_t o = 0; o < ib; o += (int64_t)es) memcpy(pat + o, pad_value, es);
                pad = pat;
            }
        }
        size_t nr = P->n_copy + P->n_fill;
        int64_t total = 0;
        for (size_t r = 0; r < nr; r++) total += P->runs[r].len;
        int64_t bytes = total * ib;
        job proto = {P, sv, &dv, ib, pad, bytes >= MP_STREAM_THRESHOLD, 0, 0, 0, 0};
        /* split over a team (the caller's, or without one with n_threads one started for this
         * call, as the kernels' plain calls start one: below 1 MiB starting threads costs more than
         * the copy saves), else the caller alone; a team that cannot start leaves the chunks to the
         * caller, with the same bytes */
        const int split =
            bytes >= TEAM_MIN_BYTES && total > 1 &&
            (workers ? maskpack_workers_threads(workers) > 1 : n_threads > 1 && bytes >= ((int64_t)1 << 20));
        if (split) {
            job jobs[MAX_CHUNKS];
            int64_t n = bytes / CHUNK_BYTES;
            if (n < 1) n = 1; /* a move under one chunk (MASKPACK_TEAM_MIN_BYTES set that low) is one job */
            if (n > MAX_CHUNKS) n = MAX_CHUNKS;
            if (n > total) n = total;
            split_jobs(P, total, (int)n, proto, jobs);
            mp_run run;
            mp_run_begin(&run, workers, n_threads, n);
            mp_run_for_guided(&run, n, run_chunk, jobs);
            mp_run_end(&run);
        } else {
            job whole;
            split_jobs(P, total, 1, proto, &whole);
            run_job(&whole);
        }
        free((void *)pad);
    }
    s = mp_ok(err);
done:
    if (sv != sv_stack) free(sv);
    return s;
}

maskpack_status maskpack_relayout_execute(const maskpack_relayout_plan *P, const maskpack_tensor *const *x,
                                          maskpack_tensor *out, const void *pad_value, int n_threads,
                                          maskpack_error *err) {
    return execute(P, x, out, pad_value, n_threads, NULL, err);
}

maskpack_status maskpack_relayout_execute_on(const maskpack_relayout_plan *P, const maskpack_tensor *const *x,
                                             maskpack_tensor *out, const void *pad_value, maskpack_workers *workers,
                                             maskpack_error *err) {
    return execute(P, x, out, pad_value, 1, workers, err);
}

maskpack_status maskpack_relayout(const maskpack_layout *src, const maskpack_layout *dst, const maskpack_tensor *x,
                                  maskpack_tensor *out, const void *pad_value, int n_threads, maskpack_error *err) {
    maskpack_relayout_plan *P = NULL;
    const maskpack_layout *srcs[1] = {src};
    MP_CHECK_NULL(err, src, "src");
    maskpack_status s = maskpack_relayout_plan_create(srcs, 1, dst, &P, err);
    if (s) return s;
    const maskpack_tensor *xs[1] = {x};
    s = maskpack_relayout_execute(P, xs, out, pad_value, n_threads, err);
    maskpack_relayout_plan_free(P);
    return s;
}

/* ---- adjoint ------------------------------------------------------------------------------------- */

static int cmp_run_dst(const void *a, const void *b) {
    const run *x = a, *y = b;
    return x->dst_tok < y->dst_tok ? -1 : x->dst_tok > y->dst_tok;
}

maskpack_status maskpack_relayout_plan_adjoint(const maskpack_relayout_plan *P, size_t source,
                                               maskpack_relayout_plan **out, maskpack_error *err) {
    MP_CHECK_NULL(err, P, "plan");
    MP_CHECK_NULL(err, out, "out");
    if (source >= P->n_src)
        return mp_fail(err, MASKPACK_ERR_INVALID_ARGUMENT, "source", (int64_t)source, -1,
                       "source: expected < %zu (the plan's sources), found %zu", P->n_src, source);
    const grid g = P->src[source]; /* the adjoint writes this grid */
    size_t k = 0;
    for (size_t r = 0; r < P->n_copy; r++) k += P->runs[r].src == (int64_t)source;
    /* fills: the gaps between the k copies, split at row ends: at most k + rows of them */
    size_t rows = g.rows > 0 ? (size_t)g.rows : 0, cap;
    if (__builtin_add_overflow(k, k, &cap) || __builtin_add_overflow(cap, rows + 1, &cap) ||
        cap > SIZE_MAX / sizeof(run))
        return mp_fail(err, MASKPACK_ERR_OVERFLOW, "plan", -1, -1, "plan: adjoint run count overflows");
    maskpack_relayout_plan *A = calloc(1, sizeof *A);
    if (A) A->src = malloc(sizeof *A->src);
    if (A) A->runs = mp_alloc_array(cap, sizeof *A->runs);
    if (!A || !A->src || !A->runs) {
        maskpack_relayout_plan_free(A);
        return mp_fail(err, MASKPACK_ERR_OUT_OF_MEMORY, "plan", -1, -1, "out of memory");
    }
    A->n_src = 1;
    A->src[0] = P->dst;
    A->dst = g;
    size_t n = 0;
    for (size_t r = 0; r < P->n_copy; r++)
        if (P->runs[r].src == (int64_t)source)
            A->runs[n++] = (run){0, P->runs[r].dst_tok, P->runs[r].src_tok, P->runs[r].len};
    /* a copy run never crosses a row of either grid (it lies inside one segment of each), so the
     * swapped runs are valid runs of the adjoint; sorted by their new destination for the gaps */
    qsort(A->runs, n, sizeof *A->runs, cmp_run_dst);
    A->n_copy = n;
    int64_t at = 0, end = g.rows * g.width;
    for (size_t r = 0; r <= A->n_copy; r++) {
        int64_t next = r < A->n_copy ? A->runs[r].dst_tok : end;
        while (at < next) { /* the gap [at, next), one fill per row it touches */
            int64_t row_end = (at / g.width + 1) * g.width;
            int64_t stop = next < row_end ? next : row_end;
            A->runs[n++] = (run){-1, 0, at, stop - at};
            at = stop;
        }
        if (r < A->n_copy) at = A->runs[r].dst_tok + A->runs[r].len;
    }
    A->n_fill = n - A->n_copy;
    *out = A;
    return mp_ok(err);
}
