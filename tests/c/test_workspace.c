/* test_workspace.c: the kernels' one workspace convention and their size queries.
 *
 *  - The size queries of the attention and the gated delta rule allocate nothing (counted by
 *    interposing malloc, calloc and realloc: glibc builds without AddressSanitizer, which owns
 *    those names itself; elsewhere that part says it did not run).
 *  - The backward's key groups counted without memory (attn_count_groups, what the size query
 *    uses) are the groups the backward builds (attn_build_groups), on random layouts, CP shards of
 *    them and hand-built rows whose key starts fall.
 *  - One convention for both families: NULL and 0 = the call allocates, NULL with a size is
 *    MASKPACK_ERR_NULL_ARGUMENT, a buffer one byte short is MASKPACK_ERR_BUFFER_TOO_SMALL naming the
 *    size needed, and a failed call writes nothing; a buffer of exactly the queried size works. */
#include "check.h"

#include "../../src/kernels/attention/attn_internal.h"

#include <stdlib.h>

/* ---- counting allocations ------------------------------------------------------------------ */

#if defined(__SANITIZE_ADDRESS__)
#define COUNT_ALLOCS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(memory_sanitizer)
#define COUNT_ALLOCS 0
#endif
#endif
#if !defined(COUNT_ALLOCS) && defined(__GLIBC__)
#define COUNT_ALLOCS 1
#endif
#ifndef COUNT_ALLOCS
#define COUNT_ALLOCS 0
#endif

static volatile long n_allocs = 0;

#if COUNT_ALLOCS
/* glibc's own entry points: every allocation of the process comes through these overrides */
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
void *malloc(size_t n) {
    n_allocs++;
    return __libc_malloc(n);
}
void *calloc(size_t a, size_t b) {
    n_allocs++;
    return __libc_calloc(a, b);
}
void *realloc(void *p, size_t n) {
    n_allocs++;
    return __libc_realloc(p, n);
}
void free(void *p) { __libc_free(p); }
#endif

/* ---- problems ---------------------------------------------------------------------------------- */

static test_rng rng = {0x9e3779b97f4a7c15ull};
static uint64_t rnd(void) { return test_rng_next(&rng); }

static maskpack_tensor heads(const maskpack_layout *L, void *buf, int kv, int64_t H, int64_t D) {
    int64_t W = kv ? maskpack_layout_kv_width(L) : maskpack_layout_q_width(L);
    if (maskpack_layout_is_packed(L)) {
        int64_t s[3] = {W, H, D};
        return maskpack_tensor_contiguous(buf, MASKPACK_F32, 3, s);
    }
    int64_t s[4] = {maskpack_layout_n_rows(L), W, H, D};
    return maskpack_tensor_contiguous(buf, MASKPACK_F32, 4, s);
}

/* ---- groups ------------------------------------------------------------------------------------- */

static void check_groups(const maskpack_layout *L, const char *what) {
    size_t n = maskpack_layout_n_segments(L);
    size_t *perm = calloc(n + 1, sizeof *perm);
    attn_kgroup *groups = calloc(n + 1, sizeof *groups);
    int64_t w_built = -1, w_counted = -2;
    size_t ng_built = attn_build_groups(L, perm, groups, &w_built);
    const long before = n_allocs;
    size_t ng_counted = attn_count_groups(L, &w_counted);
    CHECK_EQ(n_allocs, before);
    CHECK_EQ(ng_counted, ng_built);
    CHECK_EQ(w_counted, w_built);
    if (ng_counted != ng_built || w_counted != w_built)
        fprintf(stderr, "%s: counted %zu groups (widest %lld), built %zu (widest %lld)\n", what, ng_counted,
                (long long)w_counted, ng_built, (long long)w_built);
    free(perm);
    free(groups);
}

static void test_groups(void) {
    maskpack_error e;
    int shards = 0;
    for (int it = 0; it < 200; it++) {
        int64_t lens[12];
        size_t n = 1 + rnd() % 12;
        for (size_t i = 0; i < n; i++) lens[i] = (int64_t)(rnd() % 40);
        maskpack_rule r = maskpack_rule_default();
        r.causal = (int)(rnd() % 2);
        maskpack_placement pl = (maskpack_placement)(rnd() % 3);
        maskpack_layout *L = NULL;
        if (maskpack_layout_from_lengths(lens, n, pl, pl == MASKPACK_PLACE_PACKED && rnd() % 2 ? 64 : 0, &r, &L, &e))
            continue; /* a length above the row capacity */
        check_groups(L, "random layout");
        /* its CP shards: pieces with explicit positions that share their sequence's keys */
        maskpack_layout *P = NULL, *S = NULL;
        if (maskpack_layout_pad_to_multiple(L, 8, &P, &e) == MASKPACK_OK &&
            maskpack_layout_cp_shard(P, 4, (int64_t)(rnd() % 4), (maskpack_cp_scheme)(rnd() % 2), &S, &e) ==
                MASKPACK_OK) {
            check_groups(S, "CP shard");
            shards++;
        }
        maskpack_layout_free(S);
        maskpack_layout_free(P);
        maskpack_layout_free(L);
    }
    CHECK(shards > 50);
    /* a hand-built row of pieces whose key starts fall (the selection walk), with overlaps and a tie */
    maskpack_segment s[5];
    memset(s, 0, sizeof s);
    const int64_t kv[5][2] = {{40, 10}, {0, 20}, {15, 10}, {40, 5}, {70, 4}};
    for (int i = 0; i < 5; i++) {
        s[i].row = 0;
        s[i].q_start = 4 * i;
        s[i].q_len = 4;
        s[i].kv_start = kv[i][0];
        s[i].kv_len = kv[i][1];
        s[i].flags = MASKPACK_SEGMENT_EXPLICIT_POS;
        s[i].q_pos = 0;
        s[i].origin = i;
    }
    maskpack_rule r = maskpack_rule_default();
    maskpack_layout *U = NULL;
    CHECK_OK(maskpack_layout_from_segments(s, 5, 1, 20, 80, 1, &r, &U, &e), e);
    if (U) {
        check_groups(U, "falling key starts");
        int64_t w;
        CHECK_EQ(attn_count_groups(U, &w), 3); /* [0, 25), [40, 50), [70, 74) */
        CHECK_EQ(w, 25);
    }
    maskpack_layout_free(U);
}

/* ---- size queries and the convention -------------------------------------------------------------- */

static void test_attention_workspace(void) {
    maskpack_error e;
    const int64_t lens[4] = {7, 64, 1, 100};
    maskpack_rule r = maskpack_rule_default();
    maskpack_layout *L = NULL;
    CHECK_OK(maskpack_layout_from_lengths(lens, 4, MASKPACK_PLACE_RIGHT, 0, &r, &L, &e), e);
    if (!L) return;
    const int64_t H = 2, D = 16, nq = 4 * 100 * H * D, nl = 4 * H * 100;
    float *q = calloc((size_t)nq, 4), *o = calloc((size_t)nq, 4), *lse = calloc((size_t)nl, 4);
    float *dq = calloc((size_t)nq, 4), *dk = calloc((size_t)nq, 4), *dv = calloc((size_t)nq, 4);
    for (int64_t i = 0; i < nq; i++) q[i] = (float)((int64_t)(rnd() % 200) - 100) / 64.0f;
    maskpack_tensor tq = heads(L, q, 0, H, D), to = heads(L, o, 0, H, D);
    maskpack_tensor tdq = heads(L, dq, 0, H, D), tdk = heads(L, dk, 1, H, D), tdv = heads(L, dv, 1, H, D);
    int64_t ls[3] = {4, H, 100};
    maskpack_tensor tl = maskpack_tensor_contiguous(lse, MASKPACK_F32, 3, ls);
    size_t fwd = 0, bwd = 0;
    const long before = n_allocs;
    CHECK_OK(maskpack_attention_forward_workspace(L, &tq, &tq, &tq, OPTS_NT(2), &fwd, &e), e);
    CHECK_OK(maskpack_attention_backward_workspace(L, &tq, &tq, &tq, OPTS_NT(3), &bwd, &e), e);
    CHECK_EQ(n_allocs, before); /* the size queries allocate nothing */
    char *ws = malloc(fwd > bwd ? fwd : bwd);
    /* NULL with a size, one byte short: refused, nothing written */
    for (int64_t i = 0; i < nq; i++) o[i] = dq[i] = 7.0f;
    CHECK_STATUS(maskpack_attention_forward(L, &tq, &tq, &tq, 0, 0, &to, &tl, OPTS_NT(2), NULL, 16, &e),
                 MASKPACK_ERR_NULL_ARGUMENT, e);
    CHECK(strcmp(e.argument, "workspace") == 0);
    CHECK_STATUS(maskpack_attention_forward(L, &tq, &tq, &tq, 0, 0, &to, &tl, OPTS_NT(2), ws, fwd - 1, &e),
                 MASKPACK_ERR_BUFFER_TOO_SMALL, e);
    char need[32];
    snprintf(need, sizeof need, "at least %zu bytes", fwd);
    CHECK_MSG(e, need);
    int untouched = 1;
    for (int64_t i = 0; i < nq; i++) untouched &= o[i] == 7.0f;
    CHECK(untouched);
    /* exactly the queried size, and NULL with 0 */
    CHECK_OK(maskpack_attention_forward(L, &tq, &tq, &tq, 0, 0, &to, &tl, OPTS_NT(2), ws, fwd, &e), e);
    CHECK_OK(maskpack_attention_forward(L, &tq, &tq, &tq, 0, 0, &to, &tl, OPTS_NT(2), NULL, 0, &e), e);
    CHECK_STATUS(maskpack_attention_backward(L, &to, &tq, &tq, &tq, &to, &tl, 0, 0, &tdq, &tdk, &tdv, OPTS_NT(3), ws,
                                             bwd - 1, &e),
                 MASKPACK_ERR_BUFFER_TOO_SMALL, e);
    snprintf(need, sizeof need, "at least %zu bytes", bwd);
    CHECK_MSG(e, need);
    untouched = 1;
    for (int64_t i = 0; i < nq; i++) untouched &= dq[i] == 7.0f;
    CHECK(untouched);
    CHECK_STATUS(
        maskpack_attention_backward(L, &to, &tq, &tq, &tq, &to, &tl, 0, 0, &tdq, &tdk, &tdv, OPTS_NT(3), NULL, 8, &e),
        MASKPACK_ERR_NULL_ARGUMENT, e);
    CHECK_OK(
        maskpack_attention_backward(L, &to, &tq, &tq, &tq, &to, &tl, 0, 0, &tdq, &tdk, &tdv, OPTS_NT(3), ws, bwd, &e),
        e);
    free(ws);
    /* the work lists come out of the workspace: on a running team (or the caller alone) with a
     * caller workspace the _on calls allocate nothing */
    maskpack_workers *team = NULL;
    CHECK_OK(maskpack_workers_create(2, &team, &e), e);
    CHECK_OK(maskpack_attention_forward_workspace(L, &tq, &tq, &tq, OPTS_NT(2), &fwd, &e), e);
    CHECK_OK(maskpack_attention_backward_workspace(L, &tq, &tq, &tq, OPTS_NT(2), &bwd, &e), e);
    ws = malloc(fwd > bwd ? fwd : bwd);
    long at = n_allocs;
    CHECK_OK(maskpack_attention_forward_on(L, &tq, &tq, &tq, 0, 0, &to, &tl, NULL, team, ws, fwd, &e), e);
    CHECK_OK(maskpack_attention_backward_on(L, &to, &tq, &tq, &tq, &to, &tl, 0, 0, &tdq, &tdk, &tdv, NULL, team, ws,
                                            bwd, &e),
             e);
    CHECK_OK(maskpack_attention_forward_on(L, &tq, &tq, &tq, 0, 0, &to, &tl, NULL, NULL, ws, fwd, &e), e);
    CHECK_EQ(n_allocs, at);
    CHECK_STATUS(maskpack_attention_forward_on(L, &tq, &tq, &tq, 0, 0, &to, &tl, NULL, team, ws, fwd - 1, &e),
                 MASKPACK_ERR_BUFFER_TOO_SMALL, e);
    CHECK_MSG(e, "maskpack_attention_forward_workspace");
    free(ws);
    /* the operator: its size query allocates nothing; a run on a running team with a caller
     * workspace, and a run in the op's own workspace once it exists, allocate nothing */
    maskpack_attention_op *aop = NULL;
    CHECK_OK(maskpack_attention_op_create(L, H, H, D, MASKPACK_F32, OPTS_NT(2), &aop, &e), e);
    size_t ofwd = 0, obwd = 0;
    at = n_allocs;
    CHECK_OK(maskpack_attention_op_workspace_size(aop, 0, &ofwd, &e), e);
    CHECK_OK(maskpack_attention_op_workspace_size(aop, 1, &obwd, &e), e);
    CHECK_EQ(n_allocs, at);
    CHECK(ofwd > 0 && obwd > 0 && ofwd < fwd); /* the work list is the op's, not the workspace's */
    ws = malloc(ofwd > obwd ? ofwd : obwd);
    at = n_allocs;
    CHECK_OK(maskpack_attention_op_forward(aop, &tq, &tq, &tq, 0, 0, &to, &tl, team, ws, ofwd, &e), e);
    CHECK_OK(
        maskpack_attention_op_backward(aop, &to, &tq, &tq, &tq, &to, &tl, 0, 0, &tdq, &tdk, &tdv, team, ws, obwd, &e),
        e);
    CHECK_EQ(n_allocs, at);
    CHECK_OK(
        maskpack_attention_op_backward(aop, &to, &tq, &tq, &tq, &to, &tl, 0, 0, &tdq, &tdk, &tdv, team, NULL, 0, &e),
        e); /* allocates the op's own, sized for both directions */
    at = n_allocs;
    CHECK_OK(maskpack_attention_op_forward(aop, &tq, &tq, &tq, 0, 0, &to, &tl, team, NULL, 0, &e), e);
    CHECK_OK(
        maskpack_attention_op_backward(aop, &to, &tq, &tq, &tq, &to, &tl, 0, 0, &tdq, &tdk, &tdv, team, NULL, 0, &e),
        e);
    CHECK_EQ(n_allocs, at);
    free(ws);
    maskpack_attention_op_free(aop);
    /* The op's own workspace is sized for both directions whichever runs first: which one needs more
     * depends on the CPU (an AMX host's forward areas outgrow the backward's), so a fresh op whose
     * first own-workspace run is the forward allocates exactly once, and its backward nothing. */
    aop = NULL;
    CHECK_OK(maskpack_attention_op_create(L, H, H, D, MASKPACK_F32, OPTS_NT(2), &aop, &e), e);
    for (int first = 0; first < 2 && aop; first++) {
        at = n_allocs;
        for (int run = 0; run < 2; run++) {
            if ((first + run) % 2 == 0)
                CHECK_OK(maskpack_attention_op_forward(aop, &tq, &tq, &tq, 0, 0, &to, &tl, team, NULL, 0, &e), e);
            else
                CHECK_OK(maskpack_attention_op_backward(aop, &to, &tq, &tq, &tq, &to, &tl, 0, 0, &tdq, &tdk, &tdv, team,
                                                        NULL, 0, &e),
                         e);
        }
        CHECK_EQ(n_allocs, at + (first == 0 && COUNT_ALLOCS ? 1 : 0)); /* the one keep, on the very first run */
    }
    maskpack_attention_op_free(aop);
    maskpack_workers_free(team);
    free(q), free(o), free(lse), free(dq), free(dk), free(dv);
    maskpack_layout_free(L);
}

static void test_gdn_workspace(void) {
    maskpack_error e;
    const int64_t lens[3] = {70, 5, 64};
    maskpack_rule r = maskpack_rule_default();
    maskpack_layout *L = NULL;
    CHECK_OK(maskpack_layout_from_lengths(lens, 3, MASKPACK_PLACE_PACKED, 0, &r, &L, &e), e);
    if (!L) return;
    const int64_t T = 139, H = 1, HV = 2, K = 16, V = 16;
    float *q = calloc((size_t)(T * H * K), 4), *v = calloc((size_t)(T * HV * V), 4), *g = calloc((size_t)(T * HV), 4);
    float *o = calloc((size_t)(T * HV * V), 4);
    for (int64_t i = 0; i < T * H * K; i++) q[i] = (float)(rnd() % 100) / 100.0f;
    for (int64_t i = 0; i < T * HV * V; i++) v[i] = (float)(rnd() % 100) / 100.0f;
    for (int64_t i = 0; i < T * HV; i++) g[i] = -0.1f;
    int64_t sq[3] = {T, H, K}, sv[3] = {T, HV, V}, sg[2] = {T, HV};
    maskpack_tensor tq = maskpack_tensor_contiguous(q, MASKPACK_F32, 3, sq),
                    tv = maskpack_tensor_contiguous(v, MASKPACK_F32, 3, sv);
    maskpack_tensor tg = maskpack_tensor_contiguous(g, MASKPACK_F32, 2, sg),
                    to = maskpack_tensor_contiguous(o, MASKPACK_F32, 3, sv);
    maskpack_gdn_inputs in = {&tq, &tq, &tv, &tg, &tg, NULL};
    maskpack_gdn_options op = maskpack_gdn_options_default();
    op.n_threads = 2;
    size_t fwd = 0, bwd = 0;
    const long before = n_allocs;
    CHECK_OK(maskpack_gdn_workspace_size(L, &in, &op, 0, &fwd, &e), e);
    CHECK_OK(maskpack_gdn_workspace_size(L, &in, &op, 1, &bwd, &e), e);
    CHECK_EQ(n_allocs, before);
    CHECK(bwd >= fwd);
    char *ws = malloc(fwd);
    for (int64_t i = 0; i < T * HV * V; i++) o[i] = 7.0f;
    CHECK_STATUS(maskpack_gdn_forward(L, &in, &op, &to, NULL, NULL, 16, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
    CHECK(strcmp(e.argument, "workspace") == 0);
    CHECK_STATUS(maskpack_gdn_forward(L, &in, &op, &to, NULL, ws, fwd - 1, &e), MASKPACK_ERR_BUFFER_TOO_SMALL, e);
    char need[32];
    snprintf(need, sizeof need, "at least %zu bytes", fwd);
    CHECK_MSG(e, need);
    int untouched = 1;
    for (int64_t i = 0; i < T * HV * V; i++) untouched &= o[i] == 7.0f;
    CHECK(untouched);
    CHECK_OK(maskpack_gdn_forward(L, &in, &op, &to, NULL, ws, fwd, &e), e);
    CHECK_OK(maskpack_gdn_forward(L, &in, &op, &to, NULL, NULL, 0, &e), e);
    free(ws);
    /* the work list comes out of the workspace: on the caller's thread with a caller workspace the
     * call allocates nothing (one thread: no team is started either) */
    op.n_threads = 1;
    CHECK_OK(maskpack_gdn_workspace_size(L, &in, &op, 0, &fwd, &e), e);
    ws = malloc(fwd);
    long at = n_allocs;
    CHECK_OK(maskpack_gdn_forward(L, &in, &op, &to, NULL, ws, fwd, &e), e);
    CHECK_EQ(n_allocs, at);
    free(ws);
    /* the operator: its size query allocates nothing; a run on a running team with a caller
     * workspace, and a run in the op's own workspace once it exists, allocate nothing */
    op.n_threads = 2;
    maskpack_gdn_op *gop = NULL;
    maskpack_workers *team = NULL;
    CHECK_OK(maskpack_gdn_op_create(L, H, HV, K, V, &op, &gop, &e), e);
    CHECK_OK(maskpack_workers_create(2, &team, &e), e);
    size_t ofwd = 0, obwd = 0;
    at = n_allocs;
    CHECK_OK(maskpack_gdn_op_workspace_size(gop, 0, &ofwd, &e), e);
    CHECK_OK(maskpack_gdn_op_workspace_size(gop, 1, &obwd, &e), e);
    CHECK_EQ(n_allocs, at);
    CHECK(obwd >= ofwd && ofwd > 0);
    ws = malloc(ofwd);
    CHECK_STATUS(maskpack_gdn_op_forward(gop, &in, &to, NULL, team, ws, ofwd - 1, &e), MASKPACK_ERR_BUFFER_TOO_SMALL,
                 e);
    snprintf(need, sizeof need, "at least %zu bytes", ofwd);
    CHECK_MSG(e, need);
    CHECK_MSG(e, "maskpack_gdn_op_workspace_size");
    CHECK_STATUS(maskpack_gdn_op_forward(gop, &in, &to, NULL, team, NULL, 8, &e), MASKPACK_ERR_NULL_ARGUMENT, e);
    at = n_allocs;
    CHECK_OK(maskpack_gdn_op_forward(gop, &in, &to, NULL, team, ws, ofwd, &e), e);
    CHECK_EQ(n_allocs, at);
    CHECK_OK(maskpack_gdn_op_forward(gop, &in, &to, NULL, team, NULL, 0, &e), e); /* allocates the op's own */
    at = n_allocs;
    CHECK_OK(maskpack_gdn_op_forward(gop, &in, &to, NULL, team, NULL, 0, &e), e);
    CHECK_EQ(n_allocs, at);
    free(ws);
    maskpack_gdn_op_free(gop);
    maskpack_workers_free(team);
    free(q), free(v), free(g), free(o);
    maskpack_layout_free(L);
}

/* The conv: the forward needs no workspace, the backward's dweight sums come out of it; with a
 * caller workspace the backward allocates nothing, and the convention is every kernel's. */
static void test_conv_workspace(void) {
    maskpack_error e;
    const int64_t lens[2] = {9, 4};
    maskpack_rule r = maskpack_rule_default();
    maskpack_layout *L = NULL;
    CHECK_OK(maskpack_layout_from_lengths(lens, 2, MASKPACK_PLACE_PACKED, 0, &r, &L, &e), e);
    if (!L) return;
    const int64_t T = 13, C = 24, W = 4;
    float x[13 * 24], dy[13 * 24], dx[13 * 24], w[24 * 4], dw[24 * 4];
    for (int i = 0; i < T * C; i++) x[i] = (float)(rnd() % 100) / 100.0f, dy[i] = (float)(rnd() % 100) / 100.0f;
    for (int i = 0; i < C * W; i++) w[i] = (float)(rnd() % 100) / 100.0f, dw[i] = 7.0f;
    int64_t sx[2] = {T, C}, sw[2] = {C, W};
    maskpack_tensor tx = maskpack_tensor_contiguous(x, MASKPACK_F32, 2, sx),
                    tdy = maskpack_tensor_contiguous(dy, MASKPACK_F32, 2, sx);
    maskpack_tensor tdx = maskpack_tensor_contiguous(dx, MASKPACK_F32, 2, sx),
                    tw = maskpack_tensor_contiguous(w, MASKPACK_F32, 2, sw);
    maskpack_tensor tdw = maskpack_tensor_contiguous(dw, MASKPACK_F32, 2, sw);
    size_t fwd = 1, bwd = 0;
    long at = n_allocs;
    CHECK_OK(maskpack_causal_conv1d_workspace_size(L, &tx, &tw, 0, &fwd, &e), e);
    CHECK_OK(maskpack_causal_conv1d_workspace_size(L, &tx, &tw, 1, &bwd, &e), e);
    CHECK_EQ(n_allocs, at);
    CHECK_EQ(fwd, (size_t)0);
    CHECK(bwd >= (size_t)(C * W) * sizeof(float));
    char *ws = malloc(bwd);
    CHECK_STATUS(maskpack_causal_conv1d_backward_on(L, &tx, &tw, NULL, 1, &tdy, NULL, NULL, NULL, &tdx, &tdw, NULL, ws,
                                                    bwd - 1, &e),
                 MASKPACK_ERR_BUFFER_TOO_SMALL, e);
    CHECK_MSG(e, "maskpack_causal_conv1d_workspace_size");
    CHECK(dw[0] == 7.0f);
    CHECK_STATUS(
        maskpack_causal_conv1d_backward_on(L, &tx, &tw, NULL, 1, &tdy, NULL, NULL, NULL, &tdx, &tdw, NULL, NULL, 4, &e),
        MASKPACK_ERR_NULL_ARGUMENT, e);
    at = n_allocs;
    CHECK_OK(
        maskpack_causal_conv1d_backward_on(L, &tx, &tw, NULL, 1, &tdy, NULL, NULL, NULL, &tdx, &tdw, NULL, ws, bwd, &e),
        e);
    CHECK_EQ(n_allocs, at);
    float want[24 * 4];
    memcpy(want, dw, sizeof want);
    for (int i = 0; i < C * W; i++) dw[i] = 7.0f;
    CHECK_OK(maskpack_causal_conv1d_backward(L, &tx, &tw, NULL, 1, &tdy, NULL, NULL, &tdx, &tdw, NULL, &e), e);
    CHECK(memcmp(want, dw, sizeof want) == 0);
    free(ws);
    maskpack_layout_free(L);
}

int main(void) {
    /* the counter itself counts (else "allocates nothing" would pass vacuously) */
    const long before = n_allocs;
    void *p = malloc(32);
    const int counting = n_allocs == before + 1;
    free(p);
    CHECK(counting == COUNT_ALLOCS);
    test_groups();
    test_attention_workspace();
    test_gdn_workspace();
    test_conv_workspace();
    return check_report_note("test_workspace",
                             counting ? "" : "allocation counts NOT checked (no glibc, or a sanitizer build)");
}
