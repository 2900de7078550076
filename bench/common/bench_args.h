/* bench_args.h: the shape options of the C benchmark programs, checked (one copy for all of them).
 *
 * A program's default shapes are a table of bench/shapes.json, given as options by the generated
 * bench_shapes.h (BENCH_SHAPES_<TABLE>); it parses them with the same parser as its command line,
 * first, so the command line wins and a bad value in the file is caught like a bad option. Every
 * message is one line, "prog: --option[ (where)]: what was wrong", and the caller exits 2. */
#ifndef MASKPACK_BENCH_ARGS_H
#define MASKPACK_BENCH_ARGS_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Where the defaults come from, for the messages about them. */
#define BENCH_SHAPES_WHERE " (bench/shapes.json, as built into bench_shapes.h)"

/* Parses text as a whole decimal integer in [lo, hi] into *out: 0, or -1 after a one-line message
 * naming the option (where: "" on the command line, BENCH_SHAPES_WHERE for the defaults). */
static inline int bench_arg_int(const char *prog, const char *opt, const char *where, const char *text, int64_t lo,
                                int64_t hi, int64_t *out) {
    char *end = NULL;
    errno = 0;
    long long v = text ? strtoll(text, &end, 10) : 0;
    if (!text || end == text || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "%s: %s%s: expected an integer in [%lld, %lld], got '%s'\n", prog, opt, where, (long long)lo,
                (long long)hi, text ? text : "(nothing)");
        return -1;
    }
    *out = (int64_t)v;
    return 0;
}

/* Parses a comma-separated list of at most max integers in [lo, hi] into out[0..*n): 0, or -1 after a
 * one-line message naming the option. */
static inline int bench_arg_ints(const char *prog, const char *opt, const char *where, const char *text, int64_t lo,
                                 int64_t hi, int64_t *out, size_t max, size_t *n) {
    *n = 0;
    const char *p = text;
    for (;;) {
        char *end = NULL;
        errno = 0;
        long long v = p ? strtoll(p, &end, 10) : 0;
        if (!p || end == p || (*end && *end != ',') || errno || v < lo || v > hi || *n == max) {
            fprintf(stderr,
                    "%s: %s%s: expected a comma-separated list of at most %zu integers in [%lld, %lld], got '%s'\n",
                    prog, opt, where, max, (long long)lo, (long long)hi, text ? text : "(nothing)");
            return -1;
        }
        out[(*n)++] = (int64_t)v;
        if (!*end) return 0;
        p = end + 1;
    }
}

/* Checks that the defaults set a shape option (one that a table of shapes.json lacks stays 0): 0, or
 * -1 after a one-line message naming the option and the table. */
static inline int bench_require(const char *prog, const char *table, const char *opt, int64_t value) {
    if (value) return 0;
    fprintf(stderr, "%s: %s: not set: bench/shapes.json's table '%s' (as built into bench_shapes.h) lacks it\n", prog,
            opt, table);
    return -1;
}

/* One integer option of a program: --name N, N in [lo, hi], into *value. */
typedef struct {
    const char *name;
    int64_t *value;
    int64_t lo, hi;
} bench_int_opt;

/* If argv[*i] names one of the n options, parses its value (argv[*i + 1]) and steps *i past it:
 * 1; 0 when argv[*i] is none of them; -1 after a one-line message when its value is bad. */
static inline int bench_parse_int_opt(const char *prog, const char *where, const bench_int_opt *opts, size_t n,
                                      int argc, const char *const *argv, int *i) {
    for (size_t k = 0; k < n; k++) {
        if (strcmp(argv[*i], opts[k].name)) continue;
        const char *v = *i + 1 < argc ? argv[*i + 1] : NULL;
        if (bench_arg_int(prog, opts[k].name, where, v, opts[k].lo, opts[k].hi, opts[k].value)) return -1;
        *i += 1;
        return 1;
    }
    return 0;
}

#endif
