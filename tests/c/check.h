/* check.h: a tiny assertion harness for the C tests. Each failed check prints file:line and the
 * expression and is counted; a test program exits non-zero when any check failed. */
#ifndef MASKPACK_CHECK_H
#define MASKPACK_CHECK_H

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "maskpack.h"
#include "test_rng.h"

static int check_failures = 0;
static int check_count = 0;

#define CHECK(cond)                                                                                                    \
    do {                                                                                                               \
        check_count++;                                                                                                 \
        if (!(cond)) {                                                                                                 \
            check_failures++;                                                                                          \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);                                   \
        }                                                                                                              \
    } while (0)

#define CHECK_EQ(a, b)                                                                                                 \
    do {                                                                                                               \
        long long check_a_ = (long long)(a), check_b_ = (long long)(b);                                                \
        check_count++;                                                                                                 \
        if (check_a_ != check_b_) {                                                                                    \
            check_failures++;                                                                                          \
            fprintf(stderr, "%s:%d: CHECK_EQ failed: %s == %s (%lld vs %lld)\n", __FILE__, __LINE__, #a, #b, check_a_, \
                    check_b_);                                                                                         \
        }                                                                                                              \
    } while (0)

/* Checks a call's status; prints the error message on mismatch. `err` is a maskpack_error. */
#define CHECK_STATUS(call, expected, err)                                                                              \
    do {                                                                                                               \
        maskpack_status check_s_ = (call);                                                                             \
        check_count++;                                                                                                 \
        if (check_s_ != (expected)) {                                                                                  \
            check_failures++;                                                                                          \
            fprintf(stderr, "%s:%d: %s returned %s, expected %s (message: %s)\n", __FILE__, __LINE__, #call,           \
                    maskpack_status_name(check_s_), maskpack_status_name(expected), (err).message);                    \
        }                                                                                                              \
    } while (0)

#define CHECK_OK(call, err) CHECK_STATUS(call, MASKPACK_OK, err)

/* Checks that an error message mentions a fragment (the argument name, expected/found values). */
#define CHECK_MSG(err, fragment)                                                                                       \
    do {                                                                                                               \
        check_count++;                                                                                                 \
        if (!strstr((err).message, (fragment))) {                                                                      \
            check_failures++;                                                                                          \
            fprintf(stderr, "%s:%d: message \"%s\" lacks \"%s\"\n", __FILE__, __LINE__, (err).message, (fragment));    \
        }                                                                                                              \
    } while (0)

/* The options of an attention or conv call: n threads, AUTO / n threads and an ISA. */
#define OPTS_NT(n)       (&(maskpack_kernel_options){(n), MASKPACK_ISA_AUTO})
#define OPTS_ISA(n, isa) (&(maskpack_kernel_options){(n), (isa)})

static inline int check_report(const char *name) {
    if (check_failures)
        fprintf(stderr, "%s: %d of %d checks failed\n", name, check_failures, check_count);
    else
        printf("%s: all %d checks passed\n", name, check_count);
    return check_failures ? 1 : 0;
}

/* check_report with a note in the summary line (e.g. the kernels this CPU could not run, so a pass
 * that checked less says so where it is read). */
static inline int check_report_note(const char *name, const char *note) {
    if (!note || !*note) return check_report(name);
    if (check_failures)
        fprintf(stderr, "%s: %d of %d checks failed; %s\n", name, check_failures, check_count, note);
    else
        printf("%s: all %d checks passed; %s\n", name, check_count, note);
    return check_failures ? 1 : 0;
}

#endif
