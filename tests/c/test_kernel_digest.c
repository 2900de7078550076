/* test_kernel_digest.c: the kernels' results, bit for bit, against results recorded from the
 * library before its kernels were reorganised (tests/data/kernel_digests.txt).
 *
 * Every kernel this machine runs (attention forward and backward, the gated delta rule's chunked
 * and recurrent forwards and its backward, the causal conv1d and its backward; each ISA of the
 * vocabulary this CPU runs, asked for per call: ref, avx2, avx512, avx512_bf16, amx) is run on
 * small deterministic problems that sit on the block edges: padded, left-padded, packed and
 * packed-rows layouts, GQA, sliding windows, softcap, cross attention, f32 and bf16, one and
 * several threads. Each output buffer (padding included) is reduced to its SHA-256.
 *
 * Two checks:
 *  - bitwise: where the recorded section's key (CPU identity, compiler, optimisation, native,
 *    emulated AVX-512 or emulated AMX) is this build's, every digest must match. Vector code may round differently
 *    on another CPU (rcp14 and exp approximations, libm's ifuncs), and another compiler may
 *    schedule FMAs differently, so this part applies to the recording machine only; elsewhere the
 *    summary line says so.
 *  - everywhere: every vector kernel against the reference kernel on the same problem, within
 *    tolerances of the existing tests' order (f32: 1e-4 of the output's rms; bf16: 3e-2).
 *
 * `test_kernel_digest --record` prints this build's section for the data file. */
#include "check.h"

#include <math.h>
#include <stdlib.h>
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif

/* ---- SHA-256 (FIPS 180-4) --------------------------------------------------------------------- */

typedef struct {
    uint32_t h[8];
    uint64_t len;
    uint8_t buf[64];
    size_t n;
} sha256;

static const uint32_t K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

static uint32_t ror(uint32_t x, int r) { return (x >> r) | (x << (32 - r)); }

static void sha_block(sha256 *s, const uint8_t *p) {
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ror(w[i - 15], 7) ^ ror(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ror(w[i - 2], 17) ^ ror(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = s->h[0], b = s->h[1], c = s->h[2], d = s->h[3], e = s->h[4], f = s->h[5], g = s->h[6], h = s->h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = h + (ror(e, 6) ^ ror(e, 11) ^ ror(e, 25)) + ((e & f) ^ (~e & g)) + K256[i] + w[i];
        uint32_t t2 = (ror(a, 2) ^ ror(a, 13) ^ ror(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        h = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    s->h[0] += a, s->h[1] += b, s->h[2] += c, s->h[3] += d, s->h[4] += e, s->h[5] += f, s->h[6] += g, s->h[7] += h;
}

static void sha_init(sha256 *s) {
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, h0, sizeof h0);
    s->len = 0;
    s->n = 0;
}

static void sha_update(sha256 *s, const void *data, size_t n) {
    const uint8_t *p = data;
    s->len += n;
    while (n) {
        size_t take = 64 - s->n < n ? 64 - s->n : n;
        memcpy(s->buf + s->n, p, take);
        s->n += take;
        p += take;
        n -= take;
        if (s->n == 64) {
            sha_block(s, s->buf);
            s->n = 0;
        }
    }
}

static void sha_hex(sha256 *s, char out[65]) {
    uint64_t bits = s->len * 8;
    uint8_t pad = 0x80;
    sha_update(s, &pad, 1);
    pad = 0;
    while (s->n != 56) sha_update(s, &pad, 1);
    uint8_t L[8];
    for (int i = 0; i < 8; i++) L[i] = (uint8_t)(bits >> (56 - 8 * i));
    sha_update(s, L, 8);
    for (int i = 0; i < 8; i++) snprintf(out + 8 * i, 9, "%08x", s->h[i]);
}

/* The SHA-256 of "abc" (FIPS 180-4, appendix B.1): the hash itself is checked before it checks anything. */
static void test_sha256(void) {
    sha256 s;
    char hex[65];
    sha_init(&s);
    sha_update(&s, "abc", 3);
    sha_hex(&s, hex);
    CHECK(strcmp(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad") == 0);
}

/* ---- the recording key ----------------------------------------------------------------------- */

static char build_key[512];

static void make_key(void) {
    char cpu[160] = "unknown-cpu";
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    unsigned a, b, c, d, r[12];
    char vendor[13], brand[49];
    __cpuid(0, a, b, c, d);
    memcpy(vendor, &b, 4);
    memcpy(vendor + 4, &d, 4);
    memcpy(vendor + 8, &c, 4);
    vendor[12] = 0;
    __cpuid(1, a, b, c, d);
    unsigned family = (a >> 8) & 0xf, model = (a >> 4) & 0xf, stepping = a & 0xf;
    if (family == 0xf) family += (a >> 20) & 0xff;
    if (family >= 6) model |= ((a >> 16) & 0xf) << 4;
    brand[0] = 0;
    if ((unsigned)__get_cpuid_max(0x80000000u, 0) >= 0x80000004u) {
        for (unsigned l = 0; l < 3; l++) __cpuid(0x80000002u + l, r[4 * l], r[4 * l + 1], r[4 * l + 2], r[4 * l + 3]);
        memcpy(brand, r, 48);
        brand[48] = 0;
    }
    /* brand strings carry trailing blanks; spaces become '_' so the key is one word */
    size_t n = strlen(brand);
    while (n && brand[n - 1] == ' ') brand[--n] = 0;
    snprintf(cpu, sizeof cpu, "%s/%u.%u.%u/%s", vendor, family, model, stepping, brand[0] ? brand : "-");
#endif
#if defined(__SANITIZE_ADDRESS__)
    const char *opt = "sanitized"; /* never recorded: instrumented builds check the tolerances only */
#elif defined(__OPTIMIZE__)
    const char *opt = "optimized";
#else
    const char *opt = "O0";
#endif
#if defined(DIGEST_EMULATED) && defined(DIGEST_EMULATED_AMX)
    const char *mode = "emulated-amx"; /* the AVX512-BF16 and AMX intrinsics carried out in C too */
#elif defined(DIGEST_EMULATED)
    const char *mode = "emulated-avx512";
#else
    const char *mode = "native";
#endif
    snprintf(build_key, sizeof build_key, "%s|%s|%s|%s", cpu, __VERSION__, opt, mode);
    for (char *p = build_key; *p; p++)
        if (*p == ' ') *p = '_';
}

/* ---- records: one line per (case, isa, output) ------------------------------------------------- */

typedef struct {
    char name[96];
    char hex[65];
} record;

enum { MAX_RECORDS = 2048 };
static record recorded[MAX_RECORDS], computed[MAX_RECORDS];
static int n_recorded = 0, n_computed = 0, have_section = 0;
static char other_keys[2048];

static void load_records(void) {
    FILE *f = fopen(MASKPACK_SOURCE_ROOT "/tests/data/kernel_digests.txt", "r");
    CHECK(f != NULL);
    if (!f) return;
    char line[1024];
    int in_mine = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        if (line[0] == '#' || !line[0]) continue;
        if (strncmp(line, "key ", 4) == 0) {
            in_mine = strcmp(line + 4, build_key) == 0;
            if (in_mine)
                have_section = 1;
            else if (strlen(other_keys) + strlen(line) + 4 < sizeof other_keys) {
                strcat(other_keys, "\n  ");
                strcat(other_keys, line + 4);
            }
            continue;
        }
        if (!in_mine || n_recorded >= MAX_RECORDS) continue;
        record *r = &recorded[n_recorded];
        if (sscanf(line, "%95s %64s", r->name, r->hex) == 2) n_recorded++;
    }
    fclose(f);
}

/* Bytes of `n` elements of dtype dt at p -> a record named name. */
static void digest(const char *name, const void *p, size_t bytes) {
    sha256 s;
    sha_init(&s);
    sha_update(&s, p, bytes);
    CHECK(n_computed < MAX_RECORDS);
    if (n_computed >= MAX_RECORDS) return;
    record *r = &computed[n_computed++];
    snprintf(r->name, sizeof r->name, "%s", name);
    sha_hex(&s, r->hex);
}

/* ---- data --------------------------------------------------------------------------------------- */

static test_rng rng;
static float rnd_f(void) { return (float)test_rng_signed(&rng); }

static uint16_t to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
static float from_bf16(uint16_t h) {
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* A buffer of n elements (f32 or bf16) filled with values in [-amp, amp) + off. */
static void *rand_buf(int64_t n, int bf16, float amp, float off) {
    size_t es = bf16 ? 2 : 4;
    void *p = calloc((size_t)(n > 0 ? n : 1), es);
    for (int64_t i = 0; i < n; i++) {
        float f = rnd_f() * amp + off;
        if (bf16)
            ((uint16_t *)p)[i] = to_bf16(f);
        else
            ((float *)p)[i] = f;
    }
    return p;
}

static double elem(const void *p, int bf16, int64_t i) {
    return bf16 ? (double)from_bf16(((const uint16_t *)p)[i]) : (double)((const float *)p)[i];
}

/* Vector kernel output a against the reference's b: non-finite entries must agree exactly, the
 * rest within |a - b| <= abs_tol * rms(b) + rel_tol * |b|: f32 abs 1e-4 (2e-3 for an f32 output of
 * a bf16 problem, whose kernels may round the softmax weights to bf16), bf16 outputs 4 bf16 ulps
 * relative plus 5e-2 of the rms (a vector backward starts from its own forward's rounded out and
 * lse, the reference's from the reference's). bf16_problem 2: a kernel whose products take bf16
 * operands throughout (the rule's AVX512-BF16 and AMX kernels): its f32 outputs (the states) come
 * through the same rounded products as its bf16 outputs, so they get the bf16 outputs' bound. */
static void close_to_ref(const char *name, const void *a, const void *b, int64_t n, int bf16, int bf16_problem) {
    double ss = 0, worst = 0;
    int64_t finite = 0, mismatch = 0;
    for (int64_t i = 0; i < n; i++) {
        double y = elem(b, bf16, i);
        if (isfinite(y)) {
            ss += y * y;
            finite++;
        }
    }
    double rms = finite ? sqrt(ss / (double)finite) : 0;
    if (rms < 1e-30) rms = 1e-30;
    const int bf16_bound = bf16 || bf16_problem == 2;
    const double abs_tol = bf16_bound ? 5e-2 : bf16_problem ? 2e-3 : 1e-4, rel_tol = bf16_bound ? 1.0 / 64 : 0;
    for (int64_t i = 0; i < n; i++) {
        double x = elem(a, bf16, i), y = elem(b, bf16, i);
        if (!isfinite(y) || !isfinite(x)) {
            if (!(x == y || (isnan(x) && isnan(y)))) mismatch++;
            continue;
        }
        double e = fabs(x - y) / (abs_tol * rms + rel_tol * fabs(y));
        if (e > worst) worst = e;
    }
    CHECK(mismatch == 0);
    CHECK(worst <= 1.0);
    if (mismatch || worst > 1.0 || getenv("DIGEST_VERBOSE"))
        fprintf(stderr, "%s: %lld non-finite mismatches, error %.3g of the tolerance\n", name, (long long)mismatch,
                worst);
}

/* ---- ISAs -------------------------------------------------------------------------------------- */

/* Every ISA of the vocabulary, asked for per call; a family without a kernel of it runs its best
 * below (mp_kernel_pick), so each family's every table entry runs (test_cpu_features checks that
 * the tables and the listing agree). An ISA runs here iff some entry of maskpack_kernel_list with
 * it is available. */
static const maskpack_isa ISAS[] = {MASKPACK_ISA_REF, MASKPACK_ISA_AVX2, MASKPACK_ISA_AVX512, MASKPACK_ISA_AVX512_BF16,
                                    MASKPACK_ISA_AMX};
static const char *const ISA_NAMES[] = {"ref", "avx2", "avx512", "avx512_bf16", "amx"};
enum { N_ISA = 5 };
static int isa_ok[N_ISA];
static char not_run[256] = "";

static void find_isas(void) {
    maskpack_kernel_info info[64];
    size_t n = 0;
    maskpack_error e;
    CHECK_OK(maskpack_kernel_list(info, 64, &n, &e), e);
    for (int x = 0; x < N_ISA; x++) {
        CHECK(strcmp(maskpack_isa_name(ISAS[x]), ISA_NAMES[x]) == 0);
        for (size_t i = 0; i < n && i < 64; i++) isa_ok[x] |= info[i].isa == ISAS[x] && info[i].available;
        if (!isa_ok[x]) {
            strcat(not_run, " ");
            strcat(not_run, ISA_NAMES[x]);
        }
    }
    CHECK(isa_ok[0]);
}

/* ---- attention ------------------------------------------------------------------------------------ */

typedef struct {
    const char *name;
    maskpack_layout *L;
    int64_t hq, hkv, d;
    double softcap;
    int threads;
    /* > 0: queries positive and keys growing along the sequence by this much per head dim, so
     * that later keys outscore every earlier one (running maxima that grow chunk after chunk) */
    float ramp;
} acase;

/* Tensor [B,W,H,D] (padded) or [W,H,D] (packed) over buf. */
static maskpack_tensor heads_view(const maskpack_layout *L, void *buf, int bf16, int kv, int64_t H, int64_t D) {
    int64_t W = kv ? maskpack_layout_kv_width(L) : maskpack_layout_q_width(L);
    maskpack_dtype dt = bf16 ? MASKPACK_BF16 : MASKPACK_F32;
    if (maskpack_layout_is_packed(L)) {
        int64_t s[3] = {W, H, D};
        return maskpack_tensor_contiguous(buf, dt, 3, s);
    }
    int64_t s[4] = {maskpack_layout_n_rows(L), W, H, D};
    return maskpack_tensor_contiguous(buf, dt, 4, s);
}

typedef struct {
    void *out, *dq, *dk, *dv;
    float *lse;
} aresult;

static void attention_case(const acase *c, int bf16, uint64_t seed) {
    const maskpack_layout *L = c->L;
    const int64_t B = maskpack_layout_n_rows(L), S = maskpack_layout_q_width(L), Skv = maskpack_layout_kv_width(L);
    const int64_t nq = B * S * c->hq * c->d, nk = B * Skv * c->hkv * c->d, nl = B * c->hq * S;
    const size_t es = bf16 ? 2 : 4;
    rng.s = seed;
    void *q = rand_buf(nq, bf16, 1.5f, c->ramp > 0 ? 1.0f : 0), *k = rand_buf(nk, bf16, 1.5f, 0);
    void *v = rand_buf(nk, bf16, 1.5f, 0);
    for (int64_t i = 0; c->ramp > 0 && i < nk; i++) { /* key position w of [.., W, H, D] */
        int64_t w = (i / (c->hkv * c->d)) % Skv;
        float f = (float)elem(k, bf16, i) + c->ramp * (float)w / (float)Skv;
        if (bf16)
            ((uint16_t *)k)[i] = to_bf16(f);
        else
            ((float *)k)[i] = f;
    }
    void *dout = rand_buf(nq, bf16, 1.0f, 0);
    maskpack_tensor tq = heads_view(L, q, bf16, 0, c->hq, c->d), tk = heads_view(L, k, bf16, 1, c->hkv, c->d);
    maskpack_tensor tv = heads_view(L, v, bf16, 1, c->hkv, c->d), tdo = heads_view(L, dout, bf16, 0, c->hq, c->d);
    aresult res[N_ISA];
    memset(res, 0, sizeof res);
    for (int x = 0; x < N_ISA; x++) {
        if (!isa_ok[x]) continue;
        aresult *r = &res[x];
        r->out = calloc((size_t)nq, es);
        r->dq = calloc((size_t)nq, es);
        r->dk = calloc((size_t)nk, es);
        r->dv = calloc((size_t)nk, es);
        r->lse = calloc((size_t)nl, sizeof(float));
        maskpack_tensor to = heads_view(L, r->out, bf16, 0, c->hq, c->d);
        maskpack_tensor tdq = heads_view(L, r->dq, bf16, 0, c->hq, c->d);
        maskpack_tensor tdk = heads_view(L, r->dk, bf16, 1, c->hkv, c->d);
        maskpack_tensor tdv = heads_view(L, r->dv, bf16, 1, c->hkv, c->d);
        maskpack_tensor tl;
        if (maskpack_layout_is_packed(L)) {
            int64_t s[2] = {c->hq, S};
            tl = maskpack_tensor_contiguous(r->lse, MASKPACK_F32, 2, s);
        } else {
            int64_t s[3] = {B, c->hq, S};
            tl = maskpack_tensor_contiguous(r->lse, MASKPACK_F32, 3, s);
        }
        maskpack_error e;
        CHECK_OK(maskpack_attention_forward(L, &tq, &tk, &tv, 0, c->softcap, &to, &tl, OPTS_ISA(c->threads, ISAS[x]),
                                            NULL, 0, &e),
                 e);
        CHECK_OK(maskpack_attention_backward(L, &tdo, &tq, &tk, &tv, &to, &tl, 0, c->softcap, &tdq, &tdk, &tdv,
                                             OPTS_ISA(c->threads, ISAS[x]), NULL, 0, &e),
                 e);
        char nm[96];
        const char *dt = bf16 ? "bf16" : "f32";
#define DIG(field, n, size)                                                                                            \
    snprintf(nm, sizeof nm, "attn.%s.%s.%s.%s", c->name, dt, ISA_NAMES[x], #field);                                    \
    digest(nm, r->field, (size_t)(n) * (size));
        DIG(out, nq, es)
        DIG(lse, nl, sizeof(float))
        DIG(dq, nq, es)
        DIG(dk, nk, es)
        DIG(dv, nk, es)
#undef DIG
        if (x > 0) {
            char what[128], w2[160];
            snprintf(what, sizeof what, "attn.%s.%s.%s", c->name, dt, ISA_NAMES[x]);
            close_to_ref(strcat(strcpy(w2, what), ".out"), r->out, res[0].out, nq, bf16, bf16);
            close_to_ref(strcat(strcpy(w2, what), ".lse"), r->lse, res[0].lse, nl, 0, bf16);
            close_to_ref(strcat(strcpy(w2, what), ".dq"), r->dq, res[0].dq, nq, bf16, bf16);
            close_to_ref(strcat(strcpy(w2, what), ".dk"), r->dk, res[0].dk, nk, bf16, bf16);
            close_to_ref(strcat(strcpy(w2, what), ".dv"), r->dv, res[0].dv, nk, bf16, bf16);
        }
    }
    for (int x = 0; x < N_ISA; x++) {
        free(res[x].out), free(res[x].dq), free(res[x].dk), free(res[x].dv), free(res[x].lse);
    }
    free(q), free(k), free(v), free(dout);
}

static maskpack_layout *lengths_layout(const int64_t *len, size_t n, maskpack_placement pl, int64_t cap,
                                       const maskpack_rule *rule) {
    maskpack_layout *L = NULL;
    maskpack_error e;
    CHECK_OK(maskpack_layout_from_lengths(len, n, pl, cap, rule, &L, &e), e);
    return L;
}

static void test_attention(void) {
    maskpack_rule causal = maskpack_rule_default(), bidir = maskpack_rule_default(), win = maskpack_rule_default();
    bidir.causal = 0;
    win.window_left = 20;
    win.window_right = 0;
    const int64_t la[] = {1, 47, 48, 49, 97}, lb[] = {64, 65, 130, 7}, lc[] = {50, 40, 96, 10, 63};
    /* long documents: several chunks of key tiles per query block, maxima growing along them */
    const int64_t ld[] = {300, 700};
    acase cases[6];
    memset(cases, 0, sizeof cases);
    cases[0] = (acase){"padded_causal_gqa", lengths_layout(la, 5, MASKPACK_PLACE_RIGHT, 0, &causal), 4, 2, 64, 0, 1};
    cases[1] =
        (acase){"packed_window_softcap", lengths_layout(lb, 4, MASKPACK_PLACE_PACKED, 0, &win), 6, 2, 40, 20.0, 2};
    cases[2] = (acase){"rows_bidir_mqa", lengths_layout(lc, 5, MASKPACK_PLACE_PACKED, 128, &bidir), 3, 1, 128, 0, 3};
    cases[3] = (acase){"left_causal", lengths_layout(la, 5, MASKPACK_PLACE_LEFT, 0, &causal), 2, 2, 16, 0, 1};
    /* cross attention, top-left: rows whose queries see no key */
    {
        maskpack_rule tl = maskpack_rule_default();
        tl.alignment = MASKPACK_ALIGN_TOP_LEFT;
        maskpack_segment seg[3];
        memset(seg, 0, sizeof seg);
        seg[0] = (maskpack_segment){.row = 0, .q_start = 0, .q_len = 70, .kv_start = 0, .kv_len = 33};
        seg[1] = (maskpack_segment){.row = 0, .q_start = 70, .q_len = 20, .kv_start = 33, .kv_len = 90};
        seg[2] = (maskpack_segment){.row = 0, .q_start = 90, .q_len = 1, .kv_start = 123, .kv_len = 5};
        maskpack_layout *L = NULL;
        maskpack_error e;
        CHECK_OK(maskpack_layout_from_segments(seg, 3, 1, 91, 128, 1, &tl, &L, &e), e);
        cases[4] = (acase){"cross_topleft", L, 2, 1, 32, 0, 2};
    }
    cases[5] =
        (acase){"long_causal_ramp", lengths_layout(ld, 2, MASKPACK_PLACE_PACKED, 0, &causal), 2, 1, 64, 0, 2, 3.0f};
    for (int c = 0; c < 6; c++) {
        if (!cases[c].L) continue;
        for (int bf = 0; bf < 2; bf++)
            attention_case(&cases[c], bf, 0x9e3779b97f4a7c15ull * (uint64_t)(c * 2 + bf + 1));
        maskpack_layout_free(cases[c].L);
    }
}

/* ---- gated delta rule -------------------------------------------------------------------------- */

typedef struct {
    const char *name;
    maskpack_layout *L;
    int64_t H, HV, K, V;
    int bf16, l2norm, threads;
} gcase;

/* [B,S,heads,dim] or [T,heads,dim] (dim 0: no last dim). */
static maskpack_tensor tok_view(const maskpack_layout *L, void *buf, maskpack_dtype dt, int64_t heads, int64_t dim) {
    int64_t s[4], n = 0;
    if (!maskpack_layout_is_packed(L)) s[n++] = maskpack_layout_n_rows(L);
    s[n++] = maskpack_layout_q_width(L);
    s[n++] = heads;
    if (dim) s[n++] = dim;
    return maskpack_tensor_contiguous(buf, dt, (int32_t)n, s);
}

static int64_t n_tok(const maskpack_layout *L) { return maskpack_layout_n_rows(L) * maskpack_layout_q_width(L); }


static void gdn_case(const gcase *c, uint64_t seed) {
    const maskpack_layout *L = c->L;
    const int64_t T = n_tok(L), N = (int64_t)maskpack_layout_n_segments(L);
    const maskpack_dtype dt = c->bf16 ? MASKPACK_BF16 : MASKPACK_F32;
    const size_t es = c->bf16 ? 2 : 4;
    rng.s = seed;
    void *q = rand_buf(T * c->H * c->K, c->bf16, 1.0f, 0), *k = rand_buf(T * c->H * c->K, c->bf16, 1.0f, 0);
    void *v = rand_buf(T * c->HV * c->V, c->bf16, 1.0f, 0);
    void *g = rand_buf(T * c->HV, c->bf16, 0.3f, -0.4f), *beta = rand_buf(T * c->HV, c->bf16, 0.4f, 0.5f);
    float *h0 = rand_buf(N * c->HV * c->K * c->V, 0, 0.5f, 0);
    void *dO = rand_buf(T * c->HV * c->V, c->bf16, 1.0f, 0);
    float *dht = rand_buf(N * c->HV * c->K * c->V, 0, 0.5f, 0);
    maskpack_tensor tq = tok_view(L, q, dt, c->H, c->K), tk = tok_view(L, k, dt, c->H, c->K);
    maskpack_tensor tv = tok_view(L, v, dt, c->HV, c->V), tg = tok_view(L, g, dt, c->HV, 0);
    maskpack_tensor tb = tok_view(L, beta, dt, c->HV, 0), tdo = tok_view(L, dO, dt, c->HV, c->V);
    int64_t ss[4] = {N, c->HV, c->K, c->V};
    maskpack_tensor th0 = maskpack_tensor_contiguous(h0, MASKPACK_F32, 4, ss);
    maskpack_tensor tdht = maskpack_tensor_contiguous(dht, MASKPACK_F32, 4, ss);
    maskpack_gdn_inputs in = {&tq, &tk, &tv, &tg, &tb, &th0};
    const int64_t nqk = T * c->H * c->K, nv = T * c->HV * c->V, nh = T * c->HV, ns = N * c->HV * c->K * c->V;
    /* per ISA: o chunked, o recurrent, final state chunked/recurrent, dq, dk, dv, dg, dbeta, dh0 */
    void *outs[N_ISA][10];
    memset(outs, 0, sizeof outs);
    const int64_t counts[10] = {nv, nv, ns, ns, nqk, nqk, nv, nh, nh, ns};
    const int isbf[10] = {c->bf16, c->bf16, 0, 0, c->bf16, c->bf16, c->bf16, c->bf16, c->bf16, 0};
    static const char *const names[10] = {"o_chunk", "o_recur", "ht_chunk", "ht_recur", "dq",
                                          "dk",      "dv",      "dg",       "dbeta",    "dh0"};
    for (int x = 0; x < N_ISA; x++) {
        if (!isa_ok[x]) continue;
        for (int o = 0; o < 10; o++) outs[x][o] = calloc((size_t)counts[o], isbf[o] ? 2 : 4);
        maskpack_gdn_options op = maskpack_gdn_options_default();
        op.isa = ISAS[x];
        /* which kernel the request runs on this problem's dtype (the bf16 ones, AVX512-BF16 and AMX,
         * round their operands) */
        maskpack_isa ran = MASKPACK_ISA_REF;
        maskpack_error re;
        const int bf16_kernel = maskpack_isa_resolve(MASKPACK_KERNEL_GDN, dt, ISAS[x], &ran, &re) == MASKPACK_OK &&
                                (ran == MASKPACK_ISA_AVX512_BF16 || ran == MASKPACK_ISA_AMX);
        op.l2norm = c->l2norm;
        op.n_threads = c->threads;
        maskpack_error e;
        for (int chunked = 1; chunked >= 0; chunked--) {
            op.chunked = chunked;
            maskpack_tensor to = tok_view(L, outs[x][chunked ? 0 : 1], dt, c->HV, c->V);
            maskpack_tensor tht = maskpack_tensor_contiguous(outs[x][chunked ? 2 : 3], MASKPACK_F32, 4, ss);
            CHECK_OK(maskpack_gdn_forward(L, &in, &op, &to, &tht, NULL, 0, &e), e);
        }
        maskpack_tensor tdq = tok_view(L, outs[x][4], dt, c->H, c->K), tdk = tok_view(L, outs[x][5], dt, c->H, c->K);
        maskpack_tensor tdv = tok_view(L, outs[x][6], dt, c->HV, c->V), tdg = tok_view(L, outs[x][7], dt, c->HV, 0);
        maskpack_tensor tdb = tok_view(L, outs[x][8], dt, c->HV, 0);
        maskpack_tensor tdh0 = maskpack_tensor_contiguous(outs[x][9], MASKPACK_F32, 4, ss);
        maskpack_gdn_grads gr = {&tdq, &tdk, &tdv, &tdg, &tdb, &tdh0};
        CHECK_OK(maskpack_gdn_backward(L, &in, &tdo, &tdht, &op, &gr, NULL, 0, &e), e);
        for (int o = 0; o < 10; o++) {
            char nm[96];
            snprintf(nm, sizeof nm, "gdn.%s.%s.%s", c->name, ISA_NAMES[x], names[o]);
            digest(nm, outs[x][o], (size_t)counts[o] * (isbf[o] ? 2 : 4));
            if (x > 0) close_to_ref(nm, outs[x][o], outs[0][o], counts[o], isbf[o], c->bf16 ? 1 + bf16_kernel : 0);
        }
    }
    for (int x = 0; x < N_ISA; x++)
        for (int o = 0; o < 10; o++) free(outs[x][o]);
    free(q), free(k), free(v), free(g), free(beta), free(h0), free(dO), free(dht);
    (void)es;
}

static void conv_case(const char *name, const maskpack_layout *L, int64_t C, int64_t W, int bf16, int silu,
                      int with_prefix, int threads, uint64_t seed) {
    const int64_t T = n_tok(L), N = (int64_t)maskpack_layout_n_segments(L);
    const maskpack_dtype dt = bf16 ? MASKPACK_BF16 : MASKPACK_F32;
    const size_t es = bf16 ? 2 : 4;
    rng.s = seed;
    void *x = rand_buf(T * C, bf16, 1.0f, 0), *w = rand_buf(C * W, bf16, 0.7f, 0);
    void *pre = rand_buf(N * C * (W - 1), bf16, 1.0f, 0), *dy = rand_buf(T * C, bf16, 1.0f, 0);
    void *dst = rand_buf(N * C * (W - 1), bf16, 1.0f, 0);
    maskpack_tensor tx = tok_view(L, x, dt, C, 0), tdy = tok_view(L, dy, dt, C, 0);
    int64_t ws[2] = {C, W}, ps[3] = {N, C, W - 1};
    maskpack_tensor tw = maskpack_tensor_contiguous(w, dt, 2, ws), tp = maskpack_tensor_contiguous(pre, dt, 3, ps);
    maskpack_tensor tds = maskpack_tensor_contiguous(dst, dt, 3, ps);
    void *outs[N_ISA][5];
    memset(outs, 0, sizeof outs);
    const int64_t counts[5] = {T * C, N * C * (W - 1), T * C, C * W, N * C * (W - 1)};
    const int isbf[5] = {bf16, bf16, bf16, 0, bf16};
    static const char *const names[5] = {"y", "state", "dx", "dweight", "dprefix"};
    for (int i = 0; i < N_ISA; i++) {
        if (!isa_ok[i]) continue;
        for (int o = 0; o < 5; o++) outs[i][o] = calloc((size_t)counts[o], isbf[o] ? 2 : 4);
        maskpack_tensor ty = tok_view(L, outs[i][0], dt, C, 0), tdx = tok_view(L, outs[i][2], dt, C, 0);
        maskpack_tensor tst = maskpack_tensor_contiguous(outs[i][1], dt, 3, ps);
        maskpack_tensor tdw = maskpack_tensor_contiguous(outs[i][3], MASKPACK_F32, 2, ws);
        maskpack_tensor tdp = maskpack_tensor_contiguous(outs[i][4], dt, 3, ps);
        maskpack_error e;
        CHECK_OK(maskpack_causal_conv1d(L, &tx, &tw, with_prefix ? &tp : NULL, silu, OPTS_ISA(threads, ISAS[i]), &ty,
                                        &tst, &e),
                 e);
        CHECK_OK(maskpack_causal_conv1d_backward(L, &tx, &tw, with_prefix ? &tp : NULL, silu, &tdy, &tds,
                                                 OPTS_ISA(threads, ISAS[i]), &tdx, &tdw, with_prefix ? &tdp : NULL, &e),
                 e);
        for (int o = 0; o < 5; o++) {
            char nm[96];
            snprintf(nm, sizeof nm, "conv.%s.%s.%s", name, ISA_NAMES[i], names[o]);
            digest(nm, outs[i][o], (size_t)counts[o] * (isbf[o] ? 2 : 4));
            if (i > 0) close_to_ref(nm, outs[i][o], outs[0][o], counts[o], isbf[o], bf16);
        }
    }
    for (int i = 0; i < N_ISA; i++)
        for (int o = 0; o < 5; o++) free(outs[i][o]);
    free(x), free(w), free(pre), free(dy), free(dst);
    (void)es;
}

static void test_gdn(void) {
    maskpack_rule causal = maskpack_rule_default();
    const int64_t la[] = {1, 63, 64, 65, 130}, lb[] = {70, 5, 128, 0};
    maskpack_layout *packed = lengths_layout(la, 5, MASKPACK_PLACE_PACKED, 0, &causal);
    maskpack_layout *padded = lengths_layout(lb, 4, MASKPACK_PLACE_RIGHT, 0, &causal);
    maskpack_layout *rows = lengths_layout(la, 5, MASKPACK_PLACE_PACKED, 160, &causal);
    if (packed) {
        gcase c = {"packed_f32_g2", packed, 2, 4, 32, 48, 0, 1, 1};
        gdn_case(&c, 11);
        conv_case("packed_f32_w4_silu_prefix", packed, 40, 4, 0, 1, 1, 1, 12);
    }
    if (padded) {
        gcase c = {"padded_bf16_nol2", padded, 1, 2, 24, 16, 1, 0, 2};
        gdn_case(&c, 13);
        conv_case("padded_bf16_w3", padded, 24, 3, 1, 0, 0, 2, 14);
        conv_case("padded_f32_w2_silu", padded, 33, 2, 0, 1, 1, 3, 15);
    }
    if (rows) {
        gcase c = {"rows_f32_k128", rows, 1, 1, 128, 64, 0, 1, 3};
        gdn_case(&c, 16);
    }
    maskpack_layout_free(packed);
    maskpack_layout_free(padded);
    maskpack_layout_free(rows);
}

/* ---- comparison ---------------------------------------------------------------------------------- */

/* The recorded line of a computed name. avx512_bf16 was no ISA of its own when the digests were
 * recorded: what it runs was then reached as avx512 (attention's bf16 forward on AVX512-BF16 CPUs,
 * its f32 and backward kernels, the rule's and the conv's AVX-512 requests), so its outputs must
 * equal avx512's records. */
static const record *find_record(const char *name, int *aliased) {
    *aliased = 0;
    for (int j = 0; j < n_recorded; j++)
        if (strcmp(recorded[j].name, name) == 0) return &recorded[j];
    const char *p = strstr(name, ".avx512_bf16.");
    if (!p) return NULL;
    char alt[96];
    snprintf(alt, sizeof alt, "%.*s.avx512.%s", (int)(p - name), name, p + strlen(".avx512_bf16."));
    *aliased = 1;
    for (int j = 0; j < n_recorded; j++)
        if (strcmp(recorded[j].name, alt) == 0) return &recorded[j];
    return NULL;
}

static void compare(void) {
    if (!have_section) return;
    int matched = 0, n_aliased = 0;
    for (int i = 0; i < n_computed; i++) {
        int aliased;
        const record *r = find_record(computed[i].name, &aliased);
        n_aliased += aliased;
        CHECK(r != NULL); /* recorded on this machine: every kernel it runs was recorded */
        if (!r) {
            fprintf(stderr, "%s: not recorded\n", computed[i].name);
            continue;
        }
        CHECK(strcmp(r->hex, computed[i].hex) == 0);
        if (strcmp(r->hex, computed[i].hex) != 0)
            fprintf(stderr, "%s: digest %s, recorded %s\n", computed[i].name, computed[i].hex, r->hex);
        else
            matched++;
    }
    /* and nothing recorded went missing (a kernel that stopped running here) */
    CHECK_EQ(n_computed - n_aliased, n_recorded);
    printf("bitwise: %d of %d outputs equal to the recorded ones (%d of them avx512_bf16's against avx512's)\n",
           matched, n_computed, n_aliased);
}

int main(int argc, char **argv) {
    int record_mode = argc > 1 && strcmp(argv[1], "--record") == 0;
    test_sha256();
    make_key();
    unsetenv("MASKPACK_ISA");
    find_isas();
    test_attention();
    test_gdn();
    if (record_mode) {
        printf("key %s\n", build_key);
        for (int i = 0; i < n_computed; i++) printf("%s %s\n", computed[i].name, computed[i].hex);
        return check_report("test_kernel_digest --record") ? 1 : 0;
    }
    load_records();
    compare();
    char note[3072];
    if (have_section)
        snprintf(note, sizeof note, "bitwise against the outputs recorded on this CPU and build%s%s",
                 not_run[0] ? "; NOT RUN (this CPU lacks them):" : "", not_run);
    else
        snprintf(
            note, sizeof note,
            "bitwise part NOT checked: it applies to the recording CPU and build only (this one: %s; recorded:%s); "
            "vector kernels checked against the reference within tolerance%s%s",
            build_key, other_keys, not_run[0] ? "; NOT RUN (this CPU lacks them):" : "", not_run);
    return check_report_note("test_kernel_digest", note);
}
