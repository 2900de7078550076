/* cp_internal.h: the agreement every collective context-parallel call starts with (cp_comm.c), shared
 * by cp_comm.c, cp_ring.c and cp_gdn.c.
 *
 * Before any payload moves, every rank all-gathers one fixed-size record of its call: which collective
 * (ranks that call different ones would otherwise pair a ring's messages with an all-gather), the
 * group, the layout's fingerprint and the scheme, the status of the rank's own argument checks, and up
 * to MP_CP_SETTINGS settings of the call (dtypes, heads and head dims, payload sizes, options). Every
 * rank compares the same records and so returns the same verdict, naming the first rank that differs
 * from rank 0, the setting, and both values. The record has the same size for every call, so ranks in
 * different collectives still meet in this one exchange. */
#ifndef MASKPACK_CP_INTERNAL_H
#define MASKPACK_CP_INTERNAL_H

#include "internal.h"

#include <string.h>

#define MP_CP_SETTINGS 14

/* Which collective (the record's call field; cp_comm.c names them). */
enum {
    MP_CP_CALL_CHECK = 1,
    MP_CP_CALL_ALL_GATHER,
    MP_CP_CALL_ATTENTION_FORWARD,
    MP_CP_CALL_ATTENTION_BACKWARD,
    MP_CP_CALL_GDN_FORWARD,
    MP_CP_CALL_GDN_BACKWARD,
    MP_CP_CALL_CONV_FORWARD,
    MP_CP_CALL_CONV_BACKWARD,
    MP_CP_CALL_COUNT
};

/* How a setting's value reads in a message. */
typedef enum mp_cp_kind {
    MP_CP_INT = 0, /* a count or size */
    MP_CP_DTYPE,   /* a maskpack_dtype, -1 = no tensor */
    MP_CP_FLAG,    /* 0 / 1: given or not, on or off */
    MP_CP_REAL,    /* a double's bits */
    MP_CP_SHAPE    /* a tensor's per-token shape, packed by mp_cp_tensor (-1 = no tensor) */
} mp_cp_kind;

typedef struct mp_cp_setting {
    const char *argument; /* the argument named in the error: "q", "opts", ... */
    const char *what;     /* the setting: "q dtype", "value heads", ... */
    mp_cp_kind kind;
    int64_t value;
} mp_cp_setting;

typedef struct mp_cp_call {
    int id; /* MP_CP_CALL_* */
    int n;  /* settings in use */
    mp_cp_setting s[MP_CP_SETTINGS];
} mp_cp_call;

static inline mp_cp_call mp_cp_call_of(int id) {
    mp_cp_call c;
    memset(&c, 0, sizeof c);
    c.id = id;
    return c;
}

/* Adds a setting (silently ignored past MP_CP_SETTINGS: a programming error the tests catch). */
void mp_cp_set(mp_cp_call *c, const char *argument, const char *what, mp_cp_kind kind, int64_t value);

/* Adds t's dtype ("<argument> dtype") and its shape past the `lead` leading (token) dimensions
 * ("<argument> <shape_what>"): the payload each token carries. t may be NULL (both -1). */
void mp_cp_tensor(mp_cp_call *c, const char *argument, const maskpack_tensor *t, int lead, const char *shape_what);

/* The agreement: the call's record all-gathered and compared. local: this rank's own argument checks
 * (*err filled when not OK); layout may be NULL (then local must say so). Returns OK on every rank, or
 * on every rank an error: the same one for a group, call, layout, scheme or settings mismatch, this
 * rank's own error where its own checks failed, and "rank r refused its arguments" on the others. */
maskpack_status mp_cp_agree_call(const maskpack_comm *comm, const maskpack_layout *layout, maskpack_cp_scheme scheme,
                                 const mp_cp_call *call, maskpack_status local, maskpack_error *err);

/* The local checks' leading token dimensions of layout's per-token tensors: 1 packed, 2 padded. */
static inline int mp_cp_lead(const maskpack_layout *layout) { return layout && !layout->packed ? 2 : 1; }

#endif
