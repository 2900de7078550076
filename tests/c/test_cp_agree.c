/* test_cp_agree.c: ranks that make different context-parallel calls, or the same call with different
 * settings, get an error on every rank (naming the setting, both values and the first rank that
 * differs from rank 0), never a hang or a crash; and a rank whose own part fails, before or after the
 * agreement, makes every rank fail with it. 2 and 4 ranks as threads of this process over the
 * in-process comm of local_comm.h (test_cp_local's too); a watchdog turns a hang into a failure. */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "check.h"
#include "local_comm.h"

#define MAXR LOCAL_COMM_MAX_RANKS

/* ---- tensors ------------------------------------------------------------------------------------ */

#define SENT 12345.0f

typedef struct bufs {
    float *p[64];
    int n;
} bufs;

static float *grab(bufs *b, int64_t n, float lo, float hi, uint64_t seed) {
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof *p);
    for (int64_t i = 0; i < n; i++)
        p[i] = lo + (hi - lo) * (float)((double)(test_lcg_next(&seed) >> 40) / (double)(1ULL << 24));
    b->p[b->n++] = p;
    return p;
}

static maskpack_tensor ten(bufs *b, int nd, int64_t d0, int64_t d1, int64_t d2, int64_t d3, float lo, float hi) {
    int64_t sh[4] = {d0, d1, d2, d3}, n = 1;
    for (int i = 0; i < nd; i++) n *= sh[i];
    return maskpack_tensor_contiguous(grab(b, n, lo, hi, (uint64_t)n * 7919u + (uint64_t)b->n), MASKPACK_F32, nd, sh);
}

static int untouched(const maskpack_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    for (int64_t i = 0; i < n; i++)
        if (((const float *)t->data)[i] != SENT) return 0;
    return 1;
}

static void sentinel(maskpack_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    for (int64_t i = 0; i < n; i++) ((float *)t->data)[i] = SENT;
}

/* ---- the calls ------------------------------------------------------------------------------------ */

enum { ATT_FWD, ATT_BWD, GDN_FWD, GDN_BWD, CONV_FWD, CONV_BWD, GATHER };

/* How a rank deviates from the common call. */
typedef struct twist {
    int kv_heads, head_dim, value_heads, part_width, silu; /* 0 = the common value */
    int part_f64, scheme, scale, positive_gate, bad_dy, bad_out, null_layout;
} twist;

typedef struct result {
    maskpack_status status;
    char argument[MASKPACK_ERROR_ARGUMENT_SIZE];
    char message[MASKPACK_ERROR_MESSAGE_SIZE];
    int64_t index0;
    int outputs_untouched;
} result;

static maskpack_layout *aligned(int n) {
    const int64_t lengths[5] = {37, 5, 64, 20, 3};
    maskpack_error e;
    maskpack_layout *L = NULL, *A = NULL;
    CHECK_OK(maskpack_layout_from_lengths(lengths, 5, MASKPACK_PLACE_PACKED, 0, NULL, &L, &e), e);
    CHECK_OK(maskpack_layout_pad_to_multiple(L, 2 * n, &A, &e), e);
    maskpack_layout_free(L);
    return A;
}

/* One rank's call `what` with its twist; the result recorded. */
static void one_call(const maskpack_comm *comm, const maskpack_layout *L, int what, const twist *tw, result *res) {
    bufs b = {{0}, 0};
    maskpack_error e;
    memset(&e, 0, sizeof e);
    const int64_t tl = maskpack_layout_q_width(L) / comm->size;
    const maskpack_layout *lay = tw->null_layout ? NULL : L;
    maskpack_cp_scheme scheme = tw->scheme ? MASKPACK_CP_CONTIGUOUS : MASKPACK_CP_ZIGZAG;
    maskpack_status s = MASKPACK_OK;
    /* an output that must stay as it was when the call fails: a copy of its view (the tensors are
     * declared in the blocks below; their buffers live until the end of this function) */
    maskpack_tensor watched, *watch = NULL;
    if (what == ATT_FWD || what == ATT_BWD) {
        const int64_t HQ = 4, HK = tw->kv_heads ? tw->kv_heads : 2, D = tw->head_dim ? tw->head_dim : 8;
        maskpack_tensor q = ten(&b, 3, tl, HQ, D, 0, -1, 1), k = ten(&b, 3, tl, HK, D, 0, -1, 1);
        maskpack_tensor v = ten(&b, 3, tl, HK, D, 0, -1, 1), o = ten(&b, 3, tl + (tw->bad_out ? 1 : 0), HQ, D, 0, 0, 0);
        maskpack_tensor lse = ten(&b, 2, HQ, tl, 0, 0, 0, 0);
        double scale = tw->scale ? 0.5 : 0.0;
        if (what == ATT_FWD) {
            sentinel(&o);
            watched = o, watch = &watched;
            s = maskpack_cp_attention_forward(comm, lay, scheme, &q, &k, &v, scale, 0, &o, &lse, NULL, &e);
        } else {
            maskpack_tensor dout = ten(&b, 3, tl, HQ, D, 0, -1, 1), dq = ten(&b, 3, tl, HQ, D, 0, 0, 0);
            maskpack_tensor dk = ten(&b, 3, tl, HK, D, 0, 0, 0), dv = ten(&b, 3, tl, HK, D, 0, 0, 0);
            sentinel(&dq);
            watched = dq, watch = &watched;
            s = maskpack_cp_attention_backward(comm, lay, scheme, &dout, &q, &k, &v, &o, &lse, scale, 0, &dq, &dk, &dv,
                                               NULL, &e);
        }
    } else if (what == GDN_FWD || what == GDN_BWD) {
        const int64_t H = 2, HV = tw->value_heads ? tw->value_heads : 4, K = 8, V = 4;
        const int64_t N = (int64_t)maskpack_layout_n_segments(L);
        maskpack_tensor q = ten(&b, 3, tl, H, K, 0, -1, 1), k = ten(&b, 3, tl, H, K, 0, -1, 1);
        maskpack_tensor v = ten(&b, 3, tl, HV, V, 0, -1, 1);
        maskpack_tensor g =
            ten(&b, 2, tl, HV, 0, 0, tw->positive_gate ? 0.1f : -0.4f, tw->positive_gate ? 0.3f : -0.1f);
        maskpack_tensor beta = ten(&b, 2, tl, HV, 0, 0, 0.1f, 0.9f);
        maskpack_gdn_inputs in = {&q, &k, &v, &g, &beta, NULL};
        maskpack_gdn_options opts = maskpack_gdn_options_default();
        if (tw->scale) opts.scale = 0.5;
        maskpack_tensor o = ten(&b, 3, tl, HV, V, 0, 0, 0), fin = ten(&b, 4, N, HV, K, V, 0, 0);
        if (what == GDN_FWD) {
            sentinel(&o);
            watched = o, watch = &watched;
            s = maskpack_cp_gdn_forward(comm, lay, scheme, &in, &opts, &o, &fin, &e);
        } else {
            maskpack_tensor dq = ten(&b, 3, tl, H, K, 0, 0, 0), dk = ten(&b, 3, tl, H, K, 0, 0, 0);
            maskpack_tensor dv = ten(&b, 3, tl, HV, V, 0, 0, 0), dg = ten(&b, 2, tl, HV, 0, 0, 0, 0);
            maskpack_tensor db = ten(&b, 2, tl, HV, 0, 0, 0, 0), d_o = ten(&b, 3, tl, HV, V, 0, -1, 1);
            maskpack_gdn_grads gr = {&dq, &dk, &dv, &dg, &db, NULL};
            sentinel(&dq);
            watched = dq, watch = &watched;
            s = maskpack_cp_gdn_backward(comm, lay, scheme, &in, &d_o, NULL, &opts, &gr, &e);
        }
    } else if (what == CONV_FWD || what == CONV_BWD) {
        const int64_t C = 6, W = 4, N = (int64_t)maskpack_layout_n_segments(L);
        maskpack_tensor x = ten(&b, 2, tl, C, 0, 0, -1, 1), w = ten(&b, 2, C, W, 0, 0, -0.5f, 0.5f);
        maskpack_tensor y = ten(&b, 2, tl, C, 0, 0, 0, 0), st = ten(&b, 3, N, C, W - 1, 0, 0, 0);
        int silu = tw->silu ? 0 : 1;
        if (what == CONV_FWD) {
            sentinel(&y);
            watched = y, watch = &watched;
            s = maskpack_cp_causal_conv1d(comm, lay, scheme, &x, &w, NULL, silu, NULL, &y, &st, &e);
        } else {
            maskpack_tensor dy = ten(&b, 2, tl - (tw->bad_dy ? 1 : 0), C, 0, 0, -1, 1),
                            dx = ten(&b, 2, tl, C, 0, 0, 0, 0);
            maskpack_tensor dw = ten(&b, 2, C, W, 0, 0, 0, 0);
            sentinel(&dx);
            watched = dx, watch = &watched;
            s = maskpack_cp_causal_conv1d_backward(comm, lay, scheme, &x, &w, NULL, silu, &dy, NULL, NULL, &dx, &dw,
                                                   NULL, &e);
        }
    } else {
        const int64_t width = tw->part_width ? tw->part_width : 3, T = maskpack_layout_q_width(L);
        maskpack_tensor part = ten(&b, 2, tl, width, 0, 0, -1, 1), whole = ten(&b, 2, T, width, 0, 0, 0, 0);
        double p64[4096], w64[4096];
        if (tw->part_f64) { /* the same bytes per token as two float32 columns would be: a dtype to catch */
            int64_t s2[2] = {tl, width}, s3[2] = {T, width};
            part = maskpack_tensor_contiguous(p64, MASKPACK_F64, 2, s2);
            whole = maskpack_tensor_contiguous(w64, MASKPACK_F64, 2, s3);
            memset(p64, 0, sizeof p64);
            for (int64_t i = 0; i < T * width; i++) w64[i] = SENT;
        } else {
            sentinel(&whole);
        }
        s = maskpack_cp_all_gather(comm, lay, scheme, &part, &whole, NULL, &e);
        res->outputs_untouched = tw->part_f64 ? w64[0] == SENT && w64[T * width - 1] == SENT : untouched(&whole);
    }
    if (watch) res->outputs_untouched = untouched(watch);
    res->status = s;
    memcpy(res->argument, e.argument, sizeof e.argument);
    memcpy(res->message, e.message, sizeof e.message);
    res->index0 = e.index[0];
    for (int i = 0; i < b.n; i++) free(b.p[i]);
}

typedef struct job {
    local_hub *h;
    int rank, n;
    const maskpack_layout *L;
    int what;
    twist tw;
    result res;
} job;

static void *rank_main(void *arg) {
    job *J = arg;
    local_rank rc = {J->h, J->rank};
    maskpack_comm comm = local_comm(&rc);
    one_call(&comm, J->L, J->what, &J->tw, &J->res);
    return NULL;
}

/* n ranks: rank `odd` makes call what_odd with twist tw_odd, the others call what with no twist. */
static void run(int n, int what, int what_odd, twist tw_odd, int odd, result *out, int *mismatch) {
    maskpack_layout *L = aligned(n);
    local_hub h;
    local_hub_init(&h, n);
    job jobs[MAXR];
    pthread_t th[MAXR];
    for (int r = 0; r < n; r++) {
        memset(&jobs[r], 0, sizeof jobs[r]);
        jobs[r] = (job){&h, r, n, L, r == odd ? what_odd : what, {0}, {0}};
        if (r == odd) jobs[r].tw = tw_odd;
        pthread_create(&th[r], NULL, rank_main, &jobs[r]);
    }
    for (int r = 0; r < n; r++) {
        pthread_join(th[r], NULL);
        out[r] = jobs[r].res;
    }
    *mismatch = h.size_mismatch;
    local_hub_destroy(&h);
    maskpack_layout_free(L);
}

static const char *g_case = "";

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "test_cp_agree: a case hung (a rank waits in a collective its peers left): ";
    if (write(2, msg, sizeof msg - 1) < 0) _exit(3);
    if (write(2, g_case, strlen(g_case)) < 0) _exit(3);
    if (write(2, "\n", 1) < 0) _exit(3);
    _exit(2);
}

/* Every rank fails with `status`: the same argument and message on every rank (the odd rank's own where
 * own_arg is set: its own refusal), naming rank `odd` (index 0) and containing each of want[]; the
 * watched outputs untouched; no collective with mismatched sizes. */
static void expect_all(const char *name, int n, int what, int what_odd, twist tw, int odd, maskpack_status status,
                       const char *argument, const char *own_arg, const char *const *want, int n_want) {
    result res[MAXR];
    int mismatch = 0;
    char label[160];
    snprintf(label, sizeof label, "%s, %d ranks", name, n);
    g_case = label;
    alarm(60);
    run(n, what, what_odd, tw, odd, res, &mismatch);
    alarm(0);
    CHECK(!mismatch);
    for (int r = 0; r < n; r++) {
        int own = own_arg && r == odd;
        int ok = res[r].status == status && strcmp(res[r].argument, own ? own_arg : argument) == 0 &&
                 (own || res[r].index0 == (odd ? odd : 1)) && res[r].outputs_untouched;
        for (int i = 0; ok && !own && i < n_want; i++) ok = strstr(res[r].message, want[i]) != NULL;
        if (!own && r > 0) ok = ok && strcmp(res[r].message, res[0 == odd ? 1 : 0].message) == 0;
        if (!ok)
            fprintf(stderr, "%s: rank %d: %s naming '%s' (index %lld, outputs %s): %s\n", label, r,
                    maskpack_status_name(res[r].status), res[r].argument, (long long)res[r].index0,
                    res[r].outputs_untouched ? "untouched" : "WRITTEN", res[r].message);
        CHECK(ok);
    }
}

static void cases(int n) {
    const int last = n - 1;
    twist none = {0};
    char rl[64];
    snprintf(rl, sizeof rl, "on rank %d, ", last);
    /* ranks in different collectives: the call named, rank 1's and rank 0's (rank 0 in the ring, every
     * other rank in the GDN: rank 1 is the first that differs) */
    expect_all("ring against GDN", n, GDN_FWD, ATT_FWD, none, 0, MASKPACK_ERR_INVALID_ARGUMENT, "comm", NULL,
               (const char *[]){"comm: rank 1 disagrees with rank 0 about the collective call",
                                "maskpack_cp_gdn_forward on rank 1, maskpack_cp_attention_forward on rank 0"},
               2);
    expect_all("ring forward against ring backward", n, ATT_FWD, ATT_BWD, none, last, MASKPACK_ERR_INVALID_ARGUMENT,
               "comm", NULL,
               (const char *[]){"maskpack_cp_attention_backward", rl, "maskpack_cp_attention_forward on rank 0"}, 3);
    expect_all("GDN against conv", n, GDN_FWD, CONV_FWD, none, last, MASKPACK_ERR_INVALID_ARGUMENT, "comm", NULL,
               (const char *[]){"maskpack_cp_causal_conv1d", rl, "maskpack_cp_gdn_forward on rank 0"}, 3);
    expect_all("all-gather against ring", n, ATT_FWD, GATHER, none, last, MASKPACK_ERR_INVALID_ARGUMENT, "comm", NULL,
               (const char *[]){"maskpack_cp_all_gather", rl, "maskpack_cp_attention_forward on rank 0"}, 3);
    expect_all("GDN backward against conv backward", n, CONV_BWD, GDN_BWD, none, last, MASKPACK_ERR_INVALID_ARGUMENT,
               "comm", NULL,
               (const char *[]){"maskpack_cp_gdn_backward", rl, "maskpack_cp_causal_conv1d_backward on rank 0"}, 3);
    /* the same call, one setting apart: the setting, both values */
    twist t = none;
    t.kv_heads = 1;
    expect_all("ring, key heads", n, ATT_FWD, ATT_FWD, t, last, MASKPACK_ERR_INVALID_ARGUMENT, "k", NULL,
               (const char *[]){"about the k per-token shape [heads, head dim]: [1, 8] ", rl, "[2, 8] on rank 0"}, 3);
    t = none;
    t.head_dim = 16;
    expect_all("ring backward, head dim", n, ATT_BWD, ATT_BWD, t, last, MASKPACK_ERR_INVALID_ARGUMENT, "q", NULL,
               (const char *[]){"about the q per-token shape [heads, head dim]: [4, 16] ", rl, "[4, 8] on rank 0"}, 3);
    t = none;
    t.scale = 1;
    expect_all("ring, scale", n, ATT_FWD, ATT_FWD, t, last, MASKPACK_ERR_INVALID_ARGUMENT, "scale", NULL,
               (const char *[]){"about the scale value: 0.5 ", rl, "0 on rank 0"}, 3);
    t = none;
    t.part_f64 = 1;
    expect_all("all-gather, dtype", n, GATHER, GATHER, t, last, MASKPACK_ERR_INVALID_ARGUMENT, "part", NULL,
               (const char *[]){"about the part dtype: float64 ", rl, "float32 on rank 0"}, 3);
    t = none;
    t.part_width = 5;
    expect_all("all-gather, payload", n, GATHER, GATHER, t, last, MASKPACK_ERR_INVALID_ARGUMENT, "part", NULL,
               (const char *[]){"about the part per-token shape: [5] ", rl, "[3] on rank 0"}, 3);
    t = none;
    t.scheme = 1;
    expect_all("all-gather, scheme", n, GATHER, GATHER, t, last, MASKPACK_ERR_INVALID_ARGUMENT, "scheme", NULL,
               (const char *[]){"uses CP scheme 1, rank 0 scheme 0"}, 1);
    t = none;
    t.value_heads = 2;
    expect_all("GDN, value heads", n, GDN_FWD, GDN_FWD, t, last, MASKPACK_ERR_INVALID_ARGUMENT, "v", NULL,
               (const char *[]){"about the v per-token shape [heads, head dim]: [2, 4] ", rl, "[4, 4] on rank 0"}, 3);
    t = none;
    t.scale = 1;
    expect_all("GDN backward, scale", n, GDN_BWD, GDN_BWD, t, last, MASKPACK_ERR_INVALID_ARGUMENT, "opts", NULL,
               (const char *[]){"about the opts scale: 0.5 ", rl, "0 on rank 0"}, 3);
    t = none;
    t.silu = 1;
    expect_all("conv, activation", n, CONV_FWD, CONV_FWD, t, last, MASKPACK_ERR_INVALID_ARGUMENT, "silu", NULL,
               (const char *[]){"about the silu value: 0 ", rl, "1 on rank 0"}, 3);
    /* one rank's own failure, before the agreement (refused there) or after it (in an exchange's trailer) */
    t = none;
    t.bad_out = 1;
    expect_all("ring, one rank's out", n, ATT_FWD, ATT_FWD, t, last, MASKPACK_ERR_SHAPE, "comm", "out",
               (const char *[]){"refused its arguments (MASKPACK_ERR_SHAPE) at its argument 'out'"}, 1);
    t = none;
    t.bad_dy = 1;
    expect_all("conv backward, one rank's dy", n, CONV_BWD, CONV_BWD, t, last, MASKPACK_ERR_SHAPE, "comm", "dy",
               (const char *[]){"refused its arguments (MASKPACK_ERR_SHAPE) at its argument 'dy'"}, 1);
    t = none;
    t.null_layout = 1;
    expect_all("all-gather, one rank's NULL layout", n, GATHER, GATHER, t, last, MASKPACK_ERR_NULL_ARGUMENT, "comm",
               "layout",
               (const char *[]){"refused its arguments (MASKPACK_ERR_NULL_ARGUMENT) at its argument 'layout'"}, 1);
    t = none;
    t.positive_gate = 1; /* the kernel refuses it inside the call, after the agreement */
    expect_all("GDN, one rank's gate", n, GDN_FWD, GDN_FWD, t, last, MASKPACK_ERR_VALUE, "comm", "g",
               (const char *[]){"failed its part before the exchange of the pieces' transitions (MASKPACK_ERR_VALUE at "
                                "its argument 'g')"},
               1);
}

int main(void) {
    signal(SIGALRM, on_alarm);
    cases(2);
    cases(4);
    return check_report("test_cp_agree");
}
