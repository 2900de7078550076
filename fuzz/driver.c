/* driver.c: a standalone fuzz driver, linked with a target when it is not built with clang's
 * libFuzzer. It accepts libFuzzer's command line so CI can call both the same way:
 *
 *   fuzz_x [-runs=N] [-max_total_time=S] [-seed=N] [-max_len=N] [-artifact_prefix=P] [FILE|DIR]...
 *
 * It first replays every file given (directories: every regular file in them), then, when -runs or
 * -max_total_time is given, runs random mutations of the corpus (bit flips, byte sets, interesting
 * integers, inserts, deletions, duplications, truncations and splices of two inputs) with a fixed
 * seed, so a run is reproducible. Without coverage feedback it is a plain random walk; its value is
 * running the targets' invariants under the sanitizers on inputs near the seed corpus. Other -flags
 * of libFuzzer are accepted and ignored. When a target crashes (abort, signal or a sanitizer report)
 * the input is written to <artifact_prefix>crash-<hash> and the driver dies the same way.
 * This is a test harness, not library code: it keeps its state in globals for the signal handler. */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../tests/c/test_rng.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* weak: present only when linked with a sanitizer runtime */
void __sanitizer_set_death_callback(void (*callback)(void)) __attribute__((weak));

typedef struct input {
    uint8_t *data;
    size_t len;
} input;

static const uint8_t *volatile g_current;
static volatile size_t g_current_len;
static char g_artifact_prefix[512] = "./";

static uint64_t fnv1a(const uint8_t *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* Writes the running input to the artifact file using only async-signal-safe calls. */
static void save_crash(void) {
    const uint8_t *p = g_current;
    size_t n = g_current_len;
    if (!p && n) return;
    char path[600];
    uint64_t h = fnv1a(p, n);
    size_t k = strlen(g_artifact_prefix);
    memcpy(path, g_artifact_prefix, k);
    memcpy(path + k, "crash-", 6);
    k += 6;
    for (int i = 15; i >= 0; i--) path[k++] = "0123456789abcdef"[(h >> (4 * i)) & 15];
    path[k] = 0;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
        size_t off = 0;
        while (off < n) {
            ssize_t w = write(fd, p + off, n - off);
            if (w <= 0) break;
            off += (size_t)w;
        }
        close(fd);
        static const char msg[] = "\n==driver== crashing input written to ";
        ssize_t ignored = write(2, msg, sizeof msg - 1);
        ignored = write(2, path, k);
        ignored = write(2, "\n", 1);
        (void)ignored;
    }
}

static void on_signal(int sig) {
    save_crash();
    signal(sig, SIG_DFL);
    raise(sig);
}

static void run_one(const uint8_t *data, size_t len) {
    /* the target gets its own heap copy so reads past the end are caught by the sanitizers */
    uint8_t *copy = malloc(len ? len : 1);
    if (!copy) {
        fprintf(stderr, "driver: out of memory\n");
        exit(1);
    }
    if (len) memcpy(copy, data, len);
    g_current = copy;
    g_current_len = len;
    LLVMFuzzerTestOneInput(copy, len);
    g_current = NULL;
    g_current_len = 0;
    free(copy);
}

static int read_whole(const char *path, input *out) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    size_t cap = 4096, len = 0;
    uint8_t *buf = malloc(cap);
    for (;;) {
        if (!buf) break;
        if (len == cap) {
            uint8_t *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (!got) break;
    }
    fclose(f);
    if (!buf) return 0;
    out->data = buf;
    out->len = len;
    return 1;
}

typedef struct pool {
    input *items;
    size_t n, cap;
} pool;

static void pool_add(pool *p, const uint8_t *data, size_t len) {
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 64;
        input *ni = realloc(p->items, cap * sizeof *ni);
        if (!ni) return;
        p->items = ni;
        p->cap = cap;
    }
    uint8_t *copy = malloc(len ? len : 1);
    if (!copy) return;
    if (len) memcpy(copy, data, len);
    p->items[p->n].data = copy;
    p->items[p->n].len = len;
    p->n++;
}

static void load_path(pool *p, const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "driver: cannot stat %s (skipped)\n", path);
        return;
    }
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        if (!d) return;
        /* sorted, so the replay order (and thus a seeded run) does not depend on the file system */
        char **names = NULL;
        size_t n = 0, cap = 0;
        for (struct dirent *e; (e = readdir(d));) {
            if (e->d_name[0] == '.') continue;
            if (n == cap) {
                cap = cap ? cap * 2 : 32;
                char **nn = realloc(names, cap * sizeof *nn);
                if (!nn) break;
                names = nn;
            }
            names[n] = malloc(strlen(path) + strlen(e->d_name) + 2);
            if (!names[n]) break;
            sprintf(names[n], "%s/%s", path, e->d_name);
            n++;
        }
        closedir(d);
        for (size_t i = 1; i < n; i++)
            for (size_t j = i; j > 0 && strcmp(names[j - 1], names[j]) > 0; j--) {
                char *t = names[j];
                names[j] = names[j - 1];
                names[j - 1] = t;
            }
        for (size_t i = 0; i < n; i++) {
            struct stat fs;
            if (stat(names[i], &fs) == 0 && S_ISREG(fs.st_mode)) {
                input in;
                if (read_whole(names[i], &in)) {
                    pool_add(p, in.data, in.len);
                    free(in.data);
                }
            }
            free(names[i]);
        }
        free(names);
        return;
    }
    input in;
    if (read_whole(path, &in)) {
        pool_add(p, in.data, in.len);
        free(in.data);
    }
}

/* xorshift64* (the tests' test_rng.h): small, fast, reproducible */
static test_rng g_rng;
static uint64_t rnd(void) { return test_rng_next_star(&g_rng); }
static size_t rnd_below(size_t n) { return n ? (size_t)(rnd() % n) : 0; }

/* Applies one random mutation to buf[0..*len) (capacity cap). */
static void mutate_once(uint8_t *buf, size_t *len, size_t cap, const pool *p) {
    static const uint64_t interesting[] = {0,
                                           1,
                                           0x7f,
                                           0x80,
                                           0xff,
                                           0x100,
                                           0x7fff,
                                           0x8000,
                                           0xffff,
                                           0x10000,
                                           0x7fffffff,
                                           0x80000000,
                                           0xffffffff,
                                           0x100000000ull,
                                           0x7fffffffffffffffull,
                                           0x8000000000000000ull,
                                           0xffffffffffffffffull};
    size_t n = *len;
    switch (rnd_below(10)) {
    case 0: /* flip a bit */
        if (n) buf[rnd_below(n)] ^= (uint8_t)(1u << rnd_below(8));
        break;
    case 1: /* set a random byte */
        if (n) buf[rnd_below(n)] = (uint8_t)rnd();
        break;
    case 2: /* small add/sub */
        if (n) buf[rnd_below(n)] += (uint8_t)(rnd_below(9) - 4);
        break;
    case 3: { /* interesting little-endian integer of 1, 2, 4 or 8 bytes */
        size_t w = (size_t)1 << rnd_below(4);
        if (n >= w) {
            uint64_t v = interesting[rnd_below(sizeof interesting / sizeof interesting[0])];
            size_t at = rnd_below(n - w + 1);
            for (size_t i = 0; i < w; i++) buf[at + i] = (uint8_t)(v >> (8 * i));
        }
        break;
    }
    case 4: { /* insert random bytes */
        size_t k = 1 + rnd_below(8);
        if (n + k <= cap) {
            size_t at = rnd_below(n + 1);
            memmove(buf + at + k, buf + at, n - at);
            for (size_t i = 0; i < k; i++) buf[at + i] = (uint8_t)rnd();
            *len = n + k;
        }
        break;
    }
    case 5: { /* delete a range */
        if (n) {
            size_t at = rnd_below(n), k = 1 + rnd_below(n - at < 16 ? n - at : 16);
            memmove(buf + at, buf + at + k, n - at - k);
            *len = n - k;
        }
        break;
    }
    case 6: { /* duplicate a range */
        if (n) {
            size_t at = rnd_below(n), k = 1 + rnd_below(n - at < 32 ? n - at : 32);
            if (n + k <= cap) {
                size_t to = rnd_below(n + 1);
                uint8_t tmp[32];
                memcpy(tmp, buf + at, k);
                memmove(buf + to + k, buf + to, n - to);
                memcpy(buf + to, tmp, k);
                *len = n + k;
            }
        }
        break;
    }
    case 7: /* truncate */
        if (n) *len = rnd_below(n);
        break;
    case 8: { /* splice: keep a prefix, append the tail of another input */
        if (p->n) {
            const input *o = &p->items[rnd_below(p->n)];
            size_t keep = rnd_below(n + 1), from = rnd_below(o->len + 1);
            size_t k = o->len - from;
            if (keep + k > cap) k = cap - keep;
            memcpy(buf + keep, o->data + from, k);
            *len = keep + k;
        }
        break;
    }
    default: { /* copy a chunk within the input (overwrite) */
        if (n > 1) {
            size_t a = rnd_below(n), b = rnd_below(n), k = 1 + rnd_below(16);
            if (a + k > n) k = n - a;
            if (b + k > n) k = n - b;
            memmove(buf + b, buf + a, k);
        }
        break;
    }
    }
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int flag_value(const char *arg, const char *name, long long *out) {
    size_t n = strlen(name);
    if (strncmp(arg, name, n) != 0 || arg[n] != '=') return 0;
    char *end = NULL;
    *out = strtoll(arg + n + 1, &end, 10);
    return end != arg + n + 1 && *end == 0;
}

int main(int argc, char **argv) {
    long long runs = -1, max_time = -1, seed = 1, max_len = 4096, v;
    pool corpus = {0};
    size_t n_files = 0;
    signal(SIGSEGV, on_signal);
    signal(SIGABRT, on_signal);
    signal(SIGBUS, on_signal);
    signal(SIGFPE, on_signal);
    signal(SIGILL, on_signal);
    if (__sanitizer_set_death_callback) __sanitizer_set_death_callback(save_crash);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] == '-') {
            if (flag_value(a, "-runs", &v))
                runs = v;
            else if (flag_value(a, "-max_total_time", &v))
                max_time = v;
            else if (flag_value(a, "-seed", &v))
                seed = v;
            else if (flag_value(a, "-max_len", &v))
                max_len = v > 0 ? v : max_len;
            else if (strncmp(a, "-artifact_prefix=", 17) == 0)
                snprintf(g_artifact_prefix, sizeof g_artifact_prefix, "%s", a + 17);
            else if (strcmp(a, "-help=1") == 0 || strcmp(a, "--help") == 0) {
                printf("usage: %s [-runs=N] [-max_total_time=S] [-seed=N] [-max_len=N] [-artifact_prefix=P] "
                       "[FILE|DIR]...\n",
                       argv[0]);
                return 0;
            } else
                fprintf(stderr, "driver: ignoring flag %s\n", a);
            continue;
        }
        load_path(&corpus, a);
        n_files++;
    }
    double t0 = now_seconds();
    for (size_t i = 0; i < corpus.n; i++) run_one(corpus.items[i].data, corpus.items[i].len);
    fprintf(stderr, "driver: replayed %zu inputs from %zu paths\n", corpus.n, n_files);
    size_t seeds = corpus.n;
    long long done = 0;
    if (runs >= 0 || max_time >= 0) {
        g_rng.s = (uint64_t)seed * 0x9e3779b97f4a7c15ull + 1;
        if (!g_rng.s) g_rng.s = 1;
        if (corpus.n == 0) pool_add(&corpus, (const uint8_t *)"", 0);
        size_t cap = (size_t)max_len;
        uint8_t *buf = malloc(cap);
        if (!buf) return 1;
        while ((runs < 0 || done < runs) && (max_time < 0 || now_seconds() - t0 < (double)max_time)) {
            const input *base = &corpus.items[rnd_below(corpus.n)];
            size_t len = base->len < cap ? base->len : cap;
            memcpy(buf, base->data, len);
            for (size_t k = 1 + rnd_below(4); k > 0; k--) mutate_once(buf, &len, cap, &corpus);
            run_one(buf, len);
            done++;
            /* keep a few mutants so later mutations can wander further from the seeds */
            if (corpus.n < 4096 && rnd_below(64) == 0) pool_add(&corpus, buf, len);
        }
        free(buf);
    }
    fprintf(stderr, "driver: #%lld DONE: %lld mutated runs after %zu seeds in %.1f s (seed %lld)\n",
            (long long)(seeds + (size_t)done), done, seeds, now_seconds() - t0, seed);
    for (size_t i = 0; i < corpus.n; i++) free(corpus.items[i].data);
    free(corpus.items);
    return 0;
}
