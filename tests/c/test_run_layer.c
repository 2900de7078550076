/* test_run_layer.c: the run layer of src/core/run.c (mp_parallel_for and its parts): every item runs
 * exactly once whatever the threads, with a team given or started for the call; no item for an
 * empty loop; an item's failure stops the claims and comes back as the lowest failing index's
 * status; the checked team start of the context-parallel calls; an op's kept workspace; the one
 * overlap test. */
#include "check.h"
#include "internal.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

enum { MAX_ITEMS = 2000, MAX_PARTS = 8 };

typedef struct counts {
    _Atomic int ran[MAX_ITEMS];
    _Atomic int by[MAX_PARTS]; /* items per participant */
    _Atomic int bad_participant;
    int64_t fail_a, fail_b; /* items that fail (-1: none) */
    maskpack_status st_a, st_b;
    int slow; /* a few microseconds per item, so that workers join in */
} counts;

static void spin_us(int us) {
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do clock_gettime(CLOCK_MONOTONIC, &t);
    while ((t.tv_sec - t0.tv_sec) * 1000000 + (t.tv_nsec - t0.tv_nsec) / 1000 < us);
}

static maskpack_status item(void *ctx, int64_t i, int participant) {
    counts *c = ctx;
    if (i < 0 || i >= MAX_ITEMS) return MASKPACK_ERR_INVALID_ARGUMENT;
    atomic_fetch_add(&c->ran[i], 1);
    if (participant < 0 || participant >= MAX_PARTS)
        atomic_store(&c->bad_participant, 1);
    else
        atomic_fetch_add(&c->by[participant], 1);
    if (c->slow) spin_us(c->slow);
    if (i == c->fail_a) return c->st_a;
    if (i == c->fail_b) return c->st_b;
    return MASKPACK_OK;
}

static counts *fresh(void) {
    counts *c = calloc(1, sizeof *c);
    c->fail_a = c->fail_b = -1;
    return c;
}

/* every item of [0, n) ran once, none past n; participants below nt */
static void check_once(const counts *c, int64_t n, int nt) {
    int64_t wrong = 0;
    for (int64_t i = 0; i < MAX_ITEMS; i++) wrong += atomic_load(&c->ran[i]) != (i < n ? 1 : 0);
    CHECK_EQ(wrong, 0);
    CHECK_EQ(atomic_load(&c->bad_participant), 0);
    for (int p = nt; p < MAX_PARTS; p++) CHECK_EQ(atomic_load(&c->by[p]), 0);
}

static void test_all_once(void) {
    const int threads[] = {1, 2, 4};
    const int64_t sizes[] = {0, 1, 2, 7, 1000, MAX_ITEMS};
    maskpack_error e;
    for (size_t a = 0; a < 3; a++) {
        const int nt = threads[a];
        maskpack_workers *team = NULL;
        CHECK_OK(maskpack_workers_create(nt, &team, &e), e);
        for (size_t b = 0; b < sizeof sizes / sizeof sizes[0]; b++) {
            const int64_t n = sizes[b];
            /* no team: one started for the call (n_threads), or the caller alone */
            counts *c = fresh();
            c->slow = n <= 100 ? 20 : 0;
            CHECK_OK(mp_parallel_for(NULL, nt, n, item, c), e);
            check_once(c, n, nt);
            free(c);
            /* the caller's team; n_threads is then not used */
            c = fresh();
            c->slow = n <= 100 ? 20 : 0;
            CHECK_OK(mp_parallel_for(team, 64, n, item, c), e);
            check_once(c, n, nt);
            free(c);
            /* guided claims, on the team and alone */
            mp_run run;
            mp_run_begin(&run, team, 1, n);
            CHECK(run.team == team && run.started == NULL);
            c = fresh();
            CHECK_OK(mp_run_for_guided(&run, n, item, c), e);
            check_once(c, n, nt);
            /* several loops on one run (the attention backward's form) */
            for (int64_t i = 0; i < MAX_ITEMS; i++) atomic_store(&c->ran[i], 0);
            CHECK_OK(mp_run_for(&run, n, item, c), e);
            check_once(c, n, nt);
            for (int64_t i = 0; i < MAX_ITEMS; i++) atomic_store(&c->ran[i], 0);
            CHECK_OK(mp_run_for(&run, n, item, c), e);
            check_once(c, n, nt);
            mp_run_end(&run);
            free(c);
        }
        maskpack_workers_free(team);
    }
    /* a per-call team has no more threads than items; none for one thread or one item */
    mp_run run;
    mp_run_begin(&run, NULL, 4, 3);
    CHECK(run.team != NULL && run.team == run.started);
    CHECK_EQ(maskpack_workers_threads(run.team), 3);
    mp_run_end(&run);
    CHECK(run.team == NULL && run.started == NULL);
    mp_run_begin(&run, NULL, 4, 1);
    CHECK(run.team == NULL);
    mp_run_end(&run);
    mp_run_begin(&run, NULL, 1, 100);
    CHECK(run.team == NULL);
    mp_run_end(&run);
    /* with many slow items and a team of 4, more than one participant takes part (a worker that
     * never joins is allowed, so this only holds that the items are shared at all, over tries) */
    int shared = 0;
    for (int t = 0; t < 20 && !shared; t++) {
        counts *c = fresh();
        c->slow = 200;
        CHECK_OK(mp_parallel_for(NULL, 4, 64, item, c), e);
        check_once(c, 64, 4);
        shared = atomic_load(&c->by[0]) < 64;
        free(c);
    }
    CHECK(shared);
}

/* An item's failure: the lowest failing index's status comes back; items below it all ran once;
 * none ran twice; alone, nothing after it ran. */
static void test_errors(void) {
    const int threads[] = {1, 2, 4};
    maskpack_error e;
    for (size_t a = 0; a < 3; a++) {
        const int nt = threads[a];
        for (int given = 0; given < 2; given++) {
            maskpack_workers *team = NULL;
            if (given) CHECK_OK(maskpack_workers_create(nt, &team, &e), e);
            for (int rep = 0; rep < 5; rep++) {
                counts *c = fresh();
                c->fail_a = 700;
                c->st_a = MASKPACK_ERR_VALUE;
                c->fail_b = 300;
                c->st_b = MASKPACK_ERR_SHAPE;
                c->slow = rep & 1 ? 5 : 0;
                CHECK_EQ(mp_parallel_for(team, nt, 1000, item, c), MASKPACK_ERR_SHAPE);
                int64_t below = 0, twice = 0, after = 0;
                for (int64_t i = 0; i < 1000; i++) {
                    below += i <= 300 && atomic_load(&c->ran[i]) != 1;
                    twice += atomic_load(&c->ran[i]) > 1;
                    after += i > 300 && atomic_load(&c->ran[i]) != 0;
                }
                CHECK_EQ(below, 0);
                CHECK_EQ(twice, 0);
                if (nt == 1) CHECK_EQ(after, 0);
                free(c);
            }
            /* the guided claims: a failure comes back, nothing runs twice */
            mp_run run;
            mp_run_begin(&run, team, nt, 1000);
            counts *c = fresh();
            c->fail_a = 10;
            c->st_a = MASKPACK_ERR_OVERLAP;
            CHECK_EQ(mp_run_for_guided(&run, 1000, item, c), MASKPACK_ERR_OVERLAP);
            int64_t twice = 0;
            for (int64_t i = 0; i < 1000; i++) twice += atomic_load(&c->ran[i]) > 1;
            CHECK_EQ(twice, 0);
            CHECK_EQ(atomic_load(&c->ran[10]), 1);
            free(c);
            mp_run_end(&run);
            maskpack_workers_free(team);
        }
    }
    /* an empty loop runs nothing and succeeds, whatever its items would say */
    counts *c = fresh();
    c->fail_a = 0;
    c->st_a = MASKPACK_ERR_VALUE;
    CHECK_EQ(mp_parallel_for(NULL, 4, 0, item, c), MASKPACK_OK);
    CHECK_EQ(mp_parallel_for(NULL, 4, -3, item, c), MASKPACK_OK);
    CHECK_EQ(atomic_load(&c->ran[0]), 0);
    free(c);
}

/* The checked start of the context-parallel calls: n_threads checked and named; 1: no team. */
static void test_checked_start(void) {
    maskpack_error e;
    mp_run run;
    CHECK_STATUS(mp_run_begin_checked(&run, 0, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK(strcmp(e.argument, "n_threads") == 0);
    CHECK(run.team == NULL);
    mp_run_end(&run);
    CHECK_STATUS(mp_run_begin_checked(&run, MASKPACK_MAX_THREADS + 1, &e), MASKPACK_ERR_INVALID_ARGUMENT, e);
    CHECK(run.team == NULL);
    mp_run_end(&run);
    CHECK_OK(mp_run_begin_checked(&run, 1, &e), e);
    CHECK(run.team == NULL);
    mp_run_end(&run);
    CHECK_OK(mp_run_begin_checked(&run, 3, &e), e);
    CHECK(run.team != NULL);
    CHECK_EQ(maskpack_workers_threads(run.team), 3);
    counts *c = fresh();
    CHECK_OK(mp_run_for(&run, 500, item, c), e);
    check_once(c, 500, 3);
    free(c);
    mp_run_end(&run);
}

/* The claim alone: each index once, then none. */
static void test_claim(void) {
    mp_claim c;
    mp_claim_init(&c, 5);
    int64_t i, got = 0, sum = 0;
    while (mp_claim_take(&c, &i)) got++, sum += i;
    CHECK_EQ(got, 5);
    CHECK_EQ(sum, 10);
    CHECK(!mp_claim_take(&c, &i));
    mp_claim_init(&c, 5);
    CHECK(mp_claim_take(&c, &i) && i == 0);
    mp_claim_stop(&c);
    CHECK(!mp_claim_take(&c, &i));
}

/* An op's kept workspace: taken by a call that brings none, not by one that brings one nor while
 * held; grown, never shrunk. */
static void test_op_ws(void) {
    mp_op_ws k;
    mp_op_ws_init(&k);
    void *ws = NULL;
    size_t bytes = 0;
    CHECK(mp_op_ws_take(&k, 100, &ws, &bytes));
    CHECK(ws != NULL && bytes == 100);
    void *ws2 = NULL;
    size_t bytes2 = 0;
    CHECK(!mp_op_ws_take(&k, 100, &ws2, &bytes2)); /* held: the second call allocates its own */
    CHECK(ws2 == NULL && bytes2 == 0);
    mp_op_ws_release(&k);
    char mine[8];
    ws2 = mine;
    bytes2 = sizeof mine;
    CHECK(!mp_op_ws_take(&k, 100, &ws2, &bytes2)); /* the caller's own */
    CHECK(ws2 == mine && bytes2 == sizeof mine);
    ws2 = NULL;
    bytes2 = 0;
    CHECK(mp_op_ws_take(&k, 50, &ws2, &bytes2)); /* smaller: the kept block as it is */
    CHECK(bytes2 == 100);
    mp_op_ws_release(&k);
    ws2 = NULL;
    bytes2 = 0;
    CHECK(mp_op_ws_take(&k, 4000, &ws2, &bytes2)); /* larger: grown */
    CHECK(ws2 != NULL && bytes2 == 4000);
    memset(ws2, 1, bytes2);
    mp_op_ws_release(&k);
    mp_op_ws_free(&k);
}

/* The one overlap test: extents of either stride sign, empty tensors and NULL meet nothing. */
static void test_overlap(void) {
    float buf[64];
    int64_t shape[2] = {4, 4};
    maskpack_tensor a = maskpack_tensor_contiguous(buf, MASKPACK_F32, 2, shape);
    maskpack_tensor b = maskpack_tensor_contiguous(buf + 16, MASKPACK_F32, 2, shape);
    maskpack_tensor c = maskpack_tensor_contiguous(buf + 15, MASKPACK_F32, 2, shape);
    CHECK(!mp_tensors_overlap(&a, &b));
    CHECK(mp_tensors_overlap(&a, &c));
    CHECK(mp_tensors_overlap(&c, &b));
    CHECK(!mp_tensors_overlap(&a, NULL));
    uintptr_t lo, hi;
    mp_tensor_extent(&a, &lo, &hi);
    CHECK(lo == (uintptr_t)buf && hi == (uintptr_t)(buf + 16));
    /* reversed rows: data at the last row, a negative row stride */
    maskpack_tensor r = a;
    r.data = buf + 44;
    r.strides[0] = -4;
    mp_tensor_extent(&r, &lo, &hi);
    CHECK(lo == (uintptr_t)(buf + 32) && hi == (uintptr_t)(buf + 48));
    CHECK(!mp_tensors_overlap(&r, &b));
    CHECK(mp_tensors_overlap(&r, &(maskpack_tensor){0}) == 0);
    int64_t empty_shape[2] = {0, 4};
    maskpack_tensor z = maskpack_tensor_contiguous(buf, MASKPACK_F32, 2, empty_shape);
    CHECK(!mp_tensors_overlap(&a, &z));
    CHECK(mp_extents_meet(0, 10, 9, 20) && !mp_extents_meet(0, 10, 10, 20) && !mp_extents_meet(5, 5, 0, 20));
}

int main(void) {
    test_all_once();
    test_errors();
    test_checked_start();
    test_claim();
    test_op_ws();
    test_overlap();
    return check_report("test_run_layer");
}
