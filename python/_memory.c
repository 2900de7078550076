/*
 * _memory.c: a cache of large output buffers for the torch binding.
 *
 * Why: the kernels' large outputs (a Gated DeltaNet layer's o is T x HV x V floats, 64 MiB in the
 * benchmark) were fresh torch.empty buffers on every call. glibc returns blocks above its mmap
 * threshold (at most 32 MiB) to the OS on free, so every call faulted its output in again and the
 * OS cleared each page first: measured on a 2-core KVM guest, 13-19 % of the chunked GDN forward
 * (out= with a reused buffer: 121-130 ms; fresh: 137-154 ms). A training loop allocates the same
 * outputs step after step, so the binding keeps the blocks its outputs held once torch frees them
 * and hands them out again, already mapped (like the caching allocators GPU frameworks use).
 *
 * How: a block is an anonymous mapping (2 MiB aligned and sized, with a transparent-huge-page
 * hint, followed by one inaccessible guard page) wrapped in a DLPack capsule that torch.from_dlpack
 * turns into a tensor. When torch frees the tensor's storage (possibly on another thread, without
 * the GIL) the DLPack deleter gives the block back: kept in the cache while the cache stays under
 * its byte limit (the least recently freed blocks go first), else unmapped. A request takes the
 * smallest cached block that fits and wastes at most a quarter of it (packed batches change length
 * from step to step), else maps a new one. A block is never handed out while any tensor or view of
 * it lives: only the deleter returns it. The contents of a reused block are stale data of this
 * process, as torch.empty's may be: every caller writes each element.
 *
 * The cache is process state by nature (like an allocator), guarded by one mutex; fork() is made
 * safe with pthread_atfork (the child never inherits a held lock).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__unix__) || defined(__APPLE__)
#include <sys/mman.h>
#include <unistd.h>
#define MPM_HAVE_MMAP 1
#endif

/* ---- the DLPack ABI (v0.8 unversioned, capsule name "dltensor"), as the standard defines it --- */

typedef struct {
    int32_t device_type; /* 1: CPU */
    int32_t device_id;
} mpm_dl_device;

typedef struct {
    uint8_t code; /* 2: IEEE float, 4: bfloat */
    uint8_t bits;
    uint16_t lanes;
} mpm_dl_dtype;

typedef struct {
    void *data;
    mpm_dl_device device;
    int32_t ndim;
    mpm_dl_dtype dtype;
    int64_t *shape;
    int64_t *strides; /* in elements */
    uint64_t byte_offset;
} mpm_dl_tensor;

typedef struct mpm_dl_managed {
    mpm_dl_tensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct mpm_dl_managed *self);
} mpm_dl_managed;

/* ---- the cache -------------------------------------------------------------------------------- */

#define MPM_ALIGN ((size_t)2 << 20) /* 2 MiB: one transparent huge page */
#define MPM_MAX_FREE 256            /* cached blocks at most (a bound on the linear searches) */
#define MPM_MAX_DIMS 16

typedef struct {
    void *p;
    size_t bytes;
    uint64_t freed_at; /* the cache clock when it came back: smaller = freed longer ago */
} mpm_block;

static struct {
    pthread_mutex_t mu;
    mpm_block free_[MPM_MAX_FREE];
    int n_free;
    size_t cached_bytes, limit, live_bytes;
    uint64_t clock, hits, misses, live_blocks;
} C = {PTHREAD_MUTEX_INITIALIZER, {{0}}, 0, 0, (size_t)1 << 30, 0, 0, 0, 0, 0};

static void mpm_lock(void) { pthread_mutex_lock(&C.mu); }
static void mpm_unlock(void) { pthread_mutex_unlock(&C.mu); }

static void mpm_atfork_prepare(void) { mpm_lock(); }
static void mpm_atfork_parent(void) { mpm_unlock(); }
static void mpm_atfork_child(void) { mpm_unlock(); }

/* The inaccessible page kept right after every mapped block. Why: torch leaves a tensor whose resize_
 * failed (our storages cannot grow) with the larger shape over the old storage; reading or writing
 * it runs off the block's end, and blocks are mapped next to each other, so without this page such
 * a tensor would silently read or overwrite another live output. With it, the overrun faults. */
static size_t mpm_page = 4096; /* set once from sysconf in PyInit__memory, before any block exists */

static size_t mpm_guard(void) {
#ifdef MPM_HAVE_MMAP
    return mpm_page;
#else
    return 0;
#endif
}

/* A new block of `bytes` (a multiple of MPM_ALIGN), MPM_ALIGN-aligned, followed by a PROT_NONE guard
 * page (mpm_guard()), or NULL. */
static void *mpm_map(size_t bytes) {
#ifdef MPM_HAVE_MMAP
    /* over-map by one alignment unit (and the guard) and trim both ends, so the block starts on a
     * huge-page boundary */
    const size_t guard = mpm_guard();
    const size_t span = bytes + MPM_ALIGN + guard;
    char *raw = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return NULL;
    char *p = (char *)(((uintptr_t)raw + MPM_ALIGN - 1) & ~(uintptr_t)(MPM_ALIGN - 1));
    if (p > raw) munmap(raw, (size_t)(p - raw));
    const size_t tail = (size_t)(raw + span - (p + bytes + guard));
    if (tail) munmap(p + bytes + guard, tail);
    if (mprotect(p + bytes, guard, PROT_NONE) != 0) {
        munmap(p, bytes + guard);
        return NULL;
    }
#ifdef MADV_HUGEPAGE
    (void)madvise(p, bytes, MADV_HUGEPAGE); /* a hint: 512x fewer first-touch faults where honoured */
#endif
    return p;
#else
    void *p = NULL;
    return posix_memalign(&p, MPM_ALIGN, bytes) == 0 ? p : NULL;
#endif
}

/* Releases a block of mpm_map (and its guard page). */
static void mpm_unmap(void *p, size_t bytes) {
#ifdef MPM_HAVE_MMAP
    munmap(p, bytes + mpm_guard());
#else
    (void)bytes;
    free(p);
#endif
}

/* Removes the least recently freed cached block (there is one) and returns it. Locked. */
static mpm_block mpm_pop_oldest_locked(void) {
    int old = 0;
    for (int i = 1; i < C.n_free; i++)
        if (C.free_[i].freed_at < C.free_[old].freed_at) old = i;
    const mpm_block b = C.free_[old];
    C.cached_bytes -= b.bytes;
    C.free_[old] = C.free_[--C.n_free];
    return b;
}

/* Drops the least recently freed cached blocks until the cache holds at most `keep` bytes; the
 * dropped ones go to out[] (the caller unmaps them outside the lock). Returns how many. Locked. */
static int mpm_trim_locked(size_t keep, mpm_block *out) {
    int n_out = 0;
    while (C.n_free > 0 && C.cached_bytes > keep) out[n_out++] = mpm_pop_oldest_locked();
    return n_out;
}

/* A block of at least `need` bytes (a multiple of MPM_ALIGN): the smallest cached one that wastes
 * at most a quarter of itself, else a new mapping. *bytes gets its size. NULL when out of memory. */
static void *mpm_take(size_t need, size_t *bytes) {
    mpm_lock();
    int best = -1;
    for (int i = 0; i < C.n_free; i++) {
        const size_t b = C.free_[i].bytes;
        if (b >= need && b - need <= b / 4 && (best < 0 || b < C.free_[best].bytes)) best = i;
    }
    if (best >= 0) {
        void *p = C.free_[best].p;
        *bytes = C.free_[best].bytes;
        C.cached_bytes -= *bytes;
        C.free_[best] = C.free_[--C.n_free];
        C.hits++;
        C.live_blocks++;
        C.live_bytes += *bytes;
        mpm_unlock();
        return p;
    }
    C.misses++;
    mpm_unlock();
    void *p = mpm_map(need);
    if (!p) return NULL;
    *bytes = need;
    mpm_lock();
    C.live_blocks++;
    C.live_bytes += need;
    mpm_unlock();
    return p;
}

/* Gives a block back: cached if it fits under the limit (older blocks make room), else unmapped. */
static void mpm_give(void *p, size_t bytes) {
    mpm_block drop[MPM_MAX_FREE + 1];
    int n_drop = 0, keep = 0;
    mpm_lock();
    C.live_blocks--;
    C.live_bytes -= bytes;
    if (bytes <= C.limit) {
        /* room under the limit and a free slot: the oldest cached blocks go first */
        n_drop = mpm_trim_locked(C.limit - bytes, drop);
        if (C.n_free == MPM_MAX_FREE) drop[n_drop++] = mpm_pop_oldest_locked();
        C.free_[C.n_free++] = (mpm_block){p, bytes, ++C.clock};
        C.cached_bytes += bytes;
        keep = 1;
    }
    mpm_unlock();
    for (int i = 0; i < n_drop; i++) mpm_unmap(drop[i].p, drop[i].bytes);
    if (!keep) mpm_unmap(p, bytes);
}

/* ---- the DLPack side ---------------------------------------------------------------------------- */

typedef struct {
    mpm_dl_managed m;
    size_t bytes;
    int64_t shape[MPM_MAX_DIMS], strides[MPM_MAX_DIMS];
} mpm_export;

/* Called by the consumer (torch) when the storage dies, maybe on a thread without the GIL: no
 * Python API here. */
static void mpm_deleter(mpm_dl_managed *self) {
    mpm_export *e = (mpm_export *)self;
    mpm_give(e->m.dl_tensor.data, e->bytes);
    free(e);
}

/* The capsule was never consumed (an error between creating it and torch.from_dlpack): give the
 * block back. A consumed capsule is renamed "used_dltensor" and is not ours to free. */
static void mpm_capsule_destructor(PyObject *cap) {
    if (!PyCapsule_IsValid(cap, "dltensor")) return;
    mpm_dl_managed *m = PyCapsule_GetPointer(cap, "dltensor");
    if (m && m->deleter) m->deleter(m);
}

/* empty(shape, dtype_code, dtype_bits) -> a "dltensor" capsule of a contiguous C-order tensor of
 * that shape, dtype (code 2 float / 4 bfloat, bits), on the CPU, from the cache. */
static PyObject *py_empty(PyObject *mod, PyObject *args) {
    (void)mod;
    PyObject *shape_obj;
    int code, bits;
    if (!PyArg_ParseTuple(args, "Oii", &shape_obj, &code, &bits)) return NULL;
    if (!((code == 2 && (bits == 16 || bits == 32 || bits == 64)) || (code == 4 && bits == 16))) {
        PyErr_Format(PyExc_ValueError, "empty(): unsupported DLPack dtype (code %d, bits %d)", code, bits);
        return NULL;
    }
    PyObject *seq = PySequence_Fast(shape_obj, "empty(): shape must be a sequence of ints");
    if (!seq) return NULL;
    const Py_ssize_t nd = PySequence_Fast_GET_SIZE(seq);
    if (nd > MPM_MAX_DIMS) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "empty(): at most %d dimensions, found %zd", MPM_MAX_DIMS, nd);
        return NULL;
    }
    mpm_export *e = calloc(1, sizeof *e);
    if (!e) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    /* span: the product with zero extents counted as 1, which the outermost stride reaches; bounding
     * it (not just the element count, 0 for an empty shape) keeps every stride and byte count in range */
    size_t count = 1, span = 1;
    for (Py_ssize_t i = 0; i < nd; i++) {
        const long long d = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
        if (d == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            free(e);
            return NULL;
        }
        if (d < 0 || span > SIZE_MAX / 8 / (size_t)(d > 0 ? d : 1)) {
            Py_DECREF(seq);
            free(e);
            PyErr_Format(PyExc_ValueError, "empty(): dimension %zd is %lld (negative or too large)", i, d);
            return NULL;
        }
        e->shape[i] = d;
        count *= (size_t)d;
        span *= (size_t)(d > 0 ? d : 1);
    }
    Py_DECREF(seq);
    for (Py_ssize_t i = nd - 1, s = 1; i >= 0; i--) {
        e->strides[i] = s;
        s *= e->shape[i] > 0 ? e->shape[i] : 1;
    }
    const size_t nbytes = count * (size_t)(bits / 8);
    const size_t need = nbytes == 0 ? MPM_ALIGN : (nbytes + MPM_ALIGN - 1) & ~(MPM_ALIGN - 1);
    if (need < nbytes) {
        free(e);
        return PyErr_NoMemory();
    }
    void *p;
    size_t got = 0;
    Py_BEGIN_ALLOW_THREADS /* a new mapping may take a while; other Python threads may run */
    p = mpm_take(need, &got);
    Py_END_ALLOW_THREADS
    if (!p) {
        free(e);
        return PyErr_NoMemory();
    }
    e->bytes = got;
    e->m.dl_tensor = (mpm_dl_tensor){p, {1, 0}, (int32_t)nd, {(uint8_t)code, (uint8_t)bits, 1}, e->shape, e->strides, 0};
    e->m.manager_ctx = NULL;
    e->m.deleter = mpm_deleter;
    PyObject *cap = PyCapsule_New(&e->m, "dltensor", mpm_capsule_destructor);
    if (!cap) mpm_deleter(&e->m);
    return cap;
}

/* info() -> dict(cached_bytes, cached_blocks, live_bytes, live_blocks, limit, hits, misses). */
static PyObject *py_info(PyObject *mod, PyObject *noargs) {
    (void)mod;
    (void)noargs;
    mpm_lock();
    const unsigned long long cb = C.cached_bytes, nb = (unsigned long long)C.n_free, lb = C.live_bytes,
                             ln = C.live_blocks, lim = C.limit, h = C.hits, m = C.misses;
    mpm_unlock();
    return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K,s:K}", "cached_bytes", cb, "cached_blocks", nb, "live_bytes", lb,
                         "live_blocks", ln, "limit", lim, "hits", h, "misses", m);
}

/* limit() -> the byte limit (0: the cache is off); no dict, for the per-call check. */
static PyObject *py_limit(PyObject *mod, PyObject *noargs) {
    (void)mod;
    (void)noargs;
    mpm_lock();
    const unsigned long long lim = C.limit;
    mpm_unlock();
    return PyLong_FromUnsignedLongLong(lim);
}

/* set_limit(bytes) -> the previous limit; cached blocks beyond the new limit are unmapped now. */
static PyObject *py_set_limit(PyObject *mod, PyObject *args) {
    (void)mod;
    unsigned long long lim;
    if (!PyArg_ParseTuple(args, "K", &lim)) return NULL;
    mpm_block drop[MPM_MAX_FREE];
    mpm_lock();
    const unsigned long long old = C.limit;
    C.limit = (size_t)lim;
    const int n = mpm_trim_locked(C.limit, drop);
    mpm_unlock();
    for (int i = 0; i < n; i++) mpm_unmap(drop[i].p, drop[i].bytes);
    return PyLong_FromUnsignedLongLong(old);
}

/* empty_cache() -> bytes unmapped: every cached block goes back to the OS (live ones stay). */
static PyObject *py_empty_cache(PyObject *mod, PyObject *noargs) {
    (void)mod;
    (void)noargs;
    mpm_block drop[MPM_MAX_FREE];
    mpm_lock();
    const size_t before = C.cached_bytes;
    const int n = mpm_trim_locked(0, drop);
    mpm_unlock();
    for (int i = 0; i < n; i++) mpm_unmap(drop[i].p, drop[i].bytes);
    return PyLong_FromSize_t(before);
}

/* advise(data_ptr, nbytes): a transparent-huge-page hint for the 2 MiB-aligned interior of a
 * fresh torch.empty output (used when the cache is off): its first touch then faults 2 MiB at a
 * time. A hint only: failures and other systems are ignored. */
static PyObject *py_advise(PyObject *mod, PyObject *args) {
    (void)mod;
    unsigned long long addr, nbytes;
    if (!PyArg_ParseTuple(args, "KK", &addr, &nbytes)) return NULL;
#if defined(MPM_HAVE_MMAP) && defined(MADV_HUGEPAGE)
    if (nbytes >= 2 * MPM_ALIGN) {
        const uintptr_t lo = ((uintptr_t)addr + MPM_ALIGN - 1) & ~(uintptr_t)(MPM_ALIGN - 1);
        const uintptr_t hi = ((uintptr_t)addr + (uintptr_t)nbytes) & ~(uintptr_t)(MPM_ALIGN - 1);
        if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
    }
#else
    (void)addr;
    (void)nbytes;
#endif
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"advise", py_advise, METH_VARARGS, "hint huge pages for a fresh output buffer"},
    {"empty", py_empty, METH_VARARGS, "a DLPack capsule of an uninitialised CPU tensor from the output cache"},
    {"info", py_info, METH_NOARGS, "the output cache's counters"},
    {"limit", py_limit, METH_NOARGS, "the cache's byte limit (0: off)"},
    {"set_limit", py_set_limit, METH_VARARGS, "bytes the cache may keep; returns the previous limit"},
    {"empty_cache", py_empty_cache, METH_NOARGS, "unmap every cached block; returns the bytes released"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "_memory", "The output-buffer cache of the torch binding (use maskpack.output_cache_*).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__memory(void) {
    static int atfork_done = 0; /* set under the GIL, once per process */
    if (!atfork_done) {
        if (pthread_atfork(mpm_atfork_prepare, mpm_atfork_parent, mpm_atfork_child) != 0) {
            PyErr_SetString(PyExc_OSError, "maskpack._memory: pthread_atfork failed");
            return NULL;
        }
        atfork_done = 1;
#ifdef MPM_HAVE_MMAP
        const long ps = sysconf(_SC_PAGESIZE);
        if (ps > 0) mpm_page = (size_t)ps;
#endif
    }
    return PyModule_Create(&moduledef);
}
