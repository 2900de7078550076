/*
 * _teams.c: the worker teams of maskpack._maskpack: one extension type, Team (a maskpack_workers the package
 * keeps per thread count and pool, so consecutive calls reuse running threads), made of maskpack's own
 * threads or hosted by the OpenMP pool already in the process (torch's). Every binding that runs on a team
 * takes this type (mpx_parse_team, ext_common.c).
 */
#include "ext_common.h"

#include <limits.h>
#if defined(__linux__) || defined(__FreeBSD__)
#define MPX_HAVE_PHDR 1 /* dl_iterate_phdr: the loaded objects, to find an OpenMP runtime */
#include <dlfcn.h>
#include <link.h>
#endif
#include <stdlib.h>
#include <string.h>

/* ---- the team handle ----------------------------------------------------------------------------- */

/* host: a hosted team's pool entry points (NULL for a team of maskpack's own), freed after the team. */
static void Team_dealloc(mpx_HandleObject *self) {
    maskpack_workers_free(self->ptr);
    PyMem_RawFree(self->host);
    self->ptr = self->host = NULL;
    Py_TYPE(self)->tp_free((PyObject *)self);
}

MPX_HANDLE_TYPE(mpx_TeamType, "Team", "Opaque handle to a maskpack_workers team (made by workers_create).",
                Team_dealloc);

/* (n_threads) -> team handle */
static PyObject *py_workers_create(PyObject *Py_UNUSED(m), PyObject *args) {
    int n;
    if (!PyArg_ParseTuple(args, "i", &n)) return NULL;
    maskpack_workers *w = NULL;
    maskpack_error err;
    maskpack_status s = maskpack_workers_create(n, &w, &err);
    if (s) return mpx_raise_status(s, &err);
    PyObject *h = mpx_new_handle(&mpx_TeamType, w, NULL);
    if (!h) maskpack_workers_free(w);
    return h;
}

/* ---- a team on the OpenMP pool already in the process (torch's) ----------------------------------

   torch runs its CPU operators on an OpenMP pool whose idle threads spin for milliseconds after each
   region. A team of maskpack's own threads started right after a torch operator then shares every
   core with a spinning thread and runs at half speed; a team hosted by that pool runs on those very
   threads, which take the work at once. The pool is reached through the runtime's own entry points
   (GOMP_parallel: GNU's libgomp, and LLVM's and Intel's runtimes, which export it too), found in the
   runtime library the process has already loaded: the extension links no OpenMP of its own. */

#if defined(MPX_HAVE_PHDR)
typedef void (*gomp_parallel_fn)(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags);
typedef int (*omp_thread_num_fn)(void);
typedef struct {
    gomp_parallel_fn parallel;
    omp_thread_num_fn thread_num;
} omp_pool;
typedef struct {
    const omp_pool *pool;
    maskpack_task_fn task;
    void *ctx;
} omp_region;

static void omp_region_body(void *p) {
    omp_region *r = p;
    r->task(r->ctx, r->pool->thread_num());
}

static void omp_pool_parallel(void *host, maskpack_task_fn task, void *ctx, int n) {
    omp_region r = {host, task, ctx};
    ((omp_pool *)host)->parallel(omp_region_body, &r, (unsigned)n, 0);
}

typedef struct {
    const char *dir; /* only runtimes loaded from this folder (NULL: any) */
    omp_pool pool;
    int found;
} omp_search;

static int omp_search_object(struct dl_phdr_info *info, size_t size, void *p) {
    (void)size;
    omp_search *S = p;
    const char *name = info->dlpi_name;
    if (S->found || !name || !*name) return 0;
    const char *base = strrchr(name, '/');
    base = base ? base + 1 : name;
    if (!strstr(base, "gomp") && !strstr(base, "omp5") && strncmp(base, "libomp", 6) != 0) return 0;
    if (S->dir) { /* the folder as the caller resolved it: compare real paths */
        char real[PATH_MAX];
        if (!realpath(name, real) || strncmp(real, S->dir, strlen(S->dir)) != 0) return 0;
    }
    void *h = dlopen(name, RTLD_NOW | RTLD_NOLOAD); /* already loaded: a reference, never a new copy */
    if (!h) return 0;
    void *par = dlsym(h, "GOMP_parallel"), *num = dlsym(h, "omp_get_thread_num");
    if (par && num) {
        /* function pointers through a data pointer (dlsym's contract on POSIX) */
        memcpy(&S->pool.parallel, &par, sizeof par);
        memcpy(&S->pool.thread_num, &num, sizeof num);
        S->found = 1; /* the reference stays: the runtime outlives every team made on it */
        return 1;
    }
    dlclose(h);
    return 0;
}

#endif

/* (n_threads, folder or None) -> team handle on the OpenMP runtime loaded from that folder (None:
   the first loaded), or None when the process has no such runtime */
static PyObject *py_workers_create_openmp(PyObject *Py_UNUSED(m), PyObject *args) {
    int n;
    const char *dir = NULL;
    if (!PyArg_ParseTuple(args, "iz", &n, &dir)) return NULL;
#if !defined(MPX_HAVE_PHDR)
    (void)n;
    (void)dir;
    Py_RETURN_NONE; /* no way to list the loaded objects here: maskpack's own threads */
#else
    omp_search S;
    memset(&S, 0, sizeof S);
    S.dir = dir;
    dl_iterate_phdr(omp_search_object, &S);
    if (!S.found) Py_RETURN_NONE;
    omp_pool *pool = PyMem_RawMalloc(sizeof *pool);
    if (!pool) return PyErr_NoMemory();
    *pool = S.pool;
    maskpack_workers *w = NULL;
    maskpack_error err;
    maskpack_status s = maskpack_workers_create_hosted(n, omp_pool_parallel, pool, &w, &err);
    if (s) {
        PyMem_RawFree(pool);
        return mpx_raise_status(s, &err);
    }
    PyObject *h = mpx_new_handle(&mpx_TeamType, w, pool);
    if (!h) {
        maskpack_workers_free(w);
        PyMem_RawFree(pool);
    }
    return h;
#endif
}

/* (team handle) -> "openmp" (hosted by the OpenMP pool) or "own" (maskpack's threads) */
static PyObject *py_workers_pool(PyObject *m, PyObject *team) {
    (void)m;
    if (!mpx_handle_ptr(team, &mpx_TeamType, "team")) return NULL;
    return PyUnicode_FromString(((mpx_HandleObject *)team)->host ? "openmp" : "own");
}


static PyMethodDef methods[] = {
    {"workers_create", py_workers_create, METH_VARARGS, "(n_threads) -> worker team handle"},
    {"workers_create_openmp", py_workers_create_openmp, METH_VARARGS,
     "(n_threads, folder or None) -> team handle on the loaded OpenMP runtime, or None"},
    {"workers_pool", py_workers_pool, METH_O, "(team handle) -> 'openmp' or 'own'"},
    {NULL, NULL, 0, NULL},
};

int mpx_init_teams(PyObject *m) {
    if (PyType_Ready(&mpx_TeamType) < 0) return -1;
    Py_INCREF(&mpx_TeamType);
    if (PyModule_AddObject(m, "Team", (PyObject *)&mpx_TeamType) < 0) {
        Py_DECREF(&mpx_TeamType);
        return -1;
    }
    return PyModule_AddFunctions(m, methods);
}
