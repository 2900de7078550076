/* comm_mpi.c: the maskpack_comm table over MPI (libmaskpack_mpi). Byte collectives map one to one
 * onto MPI's; MPI's own error handling applies (by default a failing collective aborts the job, which
 * is what ends the other ranks too instead of leaving them waiting). */
#include "maskpack_mpi.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Fills *err as the library's own calls do (the public struct; this file uses the public API only). */
static maskpack_status fail(maskpack_error *err, maskpack_status status, const char *argument, const char *message) {
    if (err) {
        memset(err, 0, sizeof *err);
        err->status = status;
        for (int i = 0; i < 4; i++) err->index[i] = -1;
        snprintf(err->argument, sizeof err->argument, "%s", argument);
        snprintf(err->message, sizeof err->message, "%s", message);
    }
    return status;
}

static int mpi_all_gather(void *ctx, const void *send, void *recv, size_t bytes) {
    if (bytes > INT_MAX) return 2;
    return MPI_Allgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, *(const MPI_Comm *)ctx) == MPI_SUCCESS
               ? 0
               : 1;
}

static int mpi_all_to_all(void *ctx, const void *send, void *recv, size_t bytes) {
    if (bytes > INT_MAX) return 2;
    return MPI_Alltoall(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, *(const MPI_Comm *)ctx) == MPI_SUCCESS
               ? 0
               : 1;
}

/* A started exchange: its two MPI requests (either MPI_REQUEST_NULL when that half is absent). */
typedef struct mpi_pair {
    MPI_Request req[2];
} mpi_pair;

static int mpi_sendrecv_start(void *ctx, const void *send, size_t send_bytes, int to, void *recv, size_t recv_bytes,
                              int from, int tag, void **request) {
    if (send_bytes > INT_MAX || recv_bytes > INT_MAX) return 2; /* MPI counts are int: 2 GiB per message */
    MPI_Comm comm = *(const MPI_Comm *)ctx;
    mpi_pair *p = malloc(sizeof *p);
    if (!p) return 3;
    p->req[0] = p->req[1] = MPI_REQUEST_NULL;
    int rc = MPI_SUCCESS;
    /* the receive first, so a message that arrives early lands in place (no unexpected-message copy) */
    if (from >= 0) rc = MPI_Irecv(recv, (int)recv_bytes, MPI_BYTE, from, tag, comm, &p->req[1]);
    if (rc == MPI_SUCCESS && to >= 0) rc = MPI_Isend(send, (int)send_bytes, MPI_BYTE, to, tag, comm, &p->req[0]);
    if (rc != MPI_SUCCESS) {
        MPI_Waitall(2, p->req, MPI_STATUSES_IGNORE);
        free(p);
        return 1;
    }
    *request = p;
    return 0;
}

static int mpi_wait(void *ctx, void *request) {
    (void)ctx;
    mpi_pair *p = request;
    int rc = MPI_Waitall(2, p->req, MPI_STATUSES_IGNORE);
    free(p);
    return rc == MPI_SUCCESS ? 0 : 1;
}

maskpack_status maskpack_comm_from_mpi(const MPI_Comm *mpi, maskpack_comm *out, maskpack_error *err) {
    if (!mpi) return fail(err, MASKPACK_ERR_NULL_ARGUMENT, "mpi", "mpi: expected a non-NULL pointer, found NULL");
    if (!out) return fail(err, MASKPACK_ERR_NULL_ARGUMENT, "out", "out: expected a non-NULL pointer, found NULL");
    int rank = -1, size = 0, inited = 0;
    MPI_Initialized(&inited);
    if (!inited)
        return fail(err, MASKPACK_ERR_COMM, "mpi",
                    "mpi: MPI is not initialised (the caller calls MPI_Init; maskpack never does)");
    if (MPI_Comm_rank(*mpi, &rank) != MPI_SUCCESS || MPI_Comm_size(*mpi, &size) != MPI_SUCCESS)
        return fail(err, MASKPACK_ERR_COMM, "mpi", "mpi: MPI_Comm_rank or MPI_Comm_size failed on this communicator");
    out->ctx = (void *)mpi;
    out->rank = rank;
    out->size = size;
    out->all_gather = mpi_all_gather;
    out->all_to_all = mpi_all_to_all;
    out->sendrecv_start = mpi_sendrecv_start;
    out->wait = mpi_wait;
    if (err) memset(err, 0, sizeof *err);
    return MASKPACK_OK;
}
