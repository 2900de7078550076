/* test_cp_mpi.c: the C API across real processes, run under mpirun with 2 and 4 ranks: every rank's
 * zigzag and contiguous shard all-gathered into the whole packed and padded batch equals the
 * single-process tensor; ranks whose layouts disagree, or one rank's wrong part, fail on every rank
 * with the same status (never a hang). Exit status 0 on every rank when every check passed. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "maskpack.h"
#include "maskpack_mpi.h"

static int failures = 0, rank_ = 0;

#define CHECK(cond)                                                                                  \
    do {                                                                                             \
        if (!(cond)) {                                                                               \
            fprintf(stderr, "rank %d: %s:%d: CHECK(%s) failed\n", rank_, __FILE__, __LINE__, #cond); \
            failures++;                                                                              \
        }                                                                                            \
    } while (0)

static maskpack_layout *aligned(const int64_t *lengths, size_t n, int packed, int64_t multiple) {
    maskpack_error e;
    maskpack_layout *L = NULL, *A = NULL;
    int64_t width = 0;
    for (size_t i = 0; i < n; i++) width = lengths[i] > width ? lengths[i] : width;
    maskpack_status s = maskpack_layout_from_lengths(lengths, n, packed ? MASKPACK_PLACE_PACKED
                                                                        : MASKPACK_PLACE_RIGHT,
                                                     packed ? 0 : width, NULL, &L, &e);
    if (!s) s = maskpack_layout_pad_to_multiple(L, multiple, &A, &e);
    if (s) fprintf(stderr, "rank %d: layout: %s\n", rank_, e.message);
    maskpack_layout_free(L);
    return A;
}

/* whole [tokens, 3] int64: token t holds (t, 10t, 100t) for real tokens (the pad value elsewhere) */
static void check_gather(const maskpack_comm *comm, const maskpack_layout *L, maskpack_cp_scheme scheme) {
    maskpack_error e;
    int64_t T = maskpack_layout_n_rows(L) * maskpack_layout_q_width(L), tl = T / comm->size;
    int64_t *idx = calloc((size_t)tl, sizeof *idx), *part = calloc((size_t)(tl * 3), sizeof *part);
    int64_t *whole = calloc((size_t)(T * 3), sizeof *whole), *mask = calloc((size_t)T, sizeof *mask);
    int64_t B = maskpack_layout_n_rows(L), S_local = maskpack_layout_q_width(L) / comm->size;
    int64_t s_idx[1] = {tl}, s_part[2] = {tl, 3}, s_part3[3] = {B, S_local, 3}, s_whole[3] = {maskpack_layout_n_rows(L), maskpack_layout_q_width(L), 3};
    maskpack_tensor ti = maskpack_tensor_contiguous(idx, MASKPACK_I64, 1, s_idx);
    CHECK(maskpack_cp_shard_indices(L, comm->size, comm->rank, scheme, &ti, &e) == MASKPACK_OK);
    for (int64_t i = 0; i < tl; i++)
        for (int c = 0; c < 3; c++) part[i * 3 + c] = idx[i] * (c == 0 ? 1 : c == 1 ? 10 : 100);
    int packed = maskpack_layout_is_packed(L);
    /* the part is a per-token tensor of the rank's shard layout: [T/cp, 3] packed, [B, S/cp, 3] padded */
    maskpack_tensor tp = packed ? maskpack_tensor_contiguous(part, MASKPACK_I64, 2, s_part)
                                : maskpack_tensor_contiguous(part, MASKPACK_I64, 3, s_part3);
    int64_t s_flat[2] = {T, 3};
    maskpack_tensor tw = packed ? maskpack_tensor_contiguous(whole, MASKPACK_I64, 2, s_flat)
                                : maskpack_tensor_contiguous(whole, MASKPACK_I64, 3, s_whole);
    int64_t pad = -7;
    maskpack_status st = maskpack_cp_all_gather(comm, L, scheme, &tp, &tw, &pad, &e);
    CHECK(st == MASKPACK_OK);
    if (st) fprintf(stderr, "rank %d: %s\n", rank_, e.message);
    int64_t s_mask[2] = {maskpack_layout_n_rows(L), maskpack_layout_q_width(L)};
    maskpack_tensor tm = packed ? maskpack_tensor_contiguous(mask, MASKPACK_I64, 1, &T)
                                : maskpack_tensor_contiguous(mask, MASKPACK_I64, 2, s_mask);
    CHECK(maskpack_mask2d(L, &tm, &e) == MASKPACK_OK);
    int64_t wrong = 0;
    for (int64_t t = 0; t < T; t++)
        for (int c = 0; c < 3; c++) {
            int64_t want = mask[t] ? t * (c == 0 ? 1 : c == 1 ? 10 : 100) : pad;
            wrong += whole[t * 3 + c] != want;
        }
    CHECK(wrong == 0);
    free(idx);
    free(part);
    free(whole);
    free(mask);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm world = MPI_COMM_WORLD;
    maskpack_comm comm;
    maskpack_error e;
    CHECK(maskpack_comm_from_mpi(&world, &comm, &e) == MASKPACK_OK);
    rank_ = comm.rank;
    const int n = comm.size;
    const int64_t lengths[4] = {7, 2, 12, 5};

    /* the whole batch from every rank's shard: packed (zigzag, contiguous) and padded (zigzag) */
    maskpack_layout *packed = aligned(lengths, 4, 1, 2 * n);
    maskpack_layout *padded = aligned(lengths, 4, 0, 2 * n);
    CHECK(packed && padded);
    if (packed && padded) {
        check_gather(&comm, packed, MASKPACK_CP_ZIGZAG);
        check_gather(&comm, packed, MASKPACK_CP_CONTIGUOUS);
        check_gather(&comm, padded, MASKPACK_CP_ZIGZAG);
        CHECK(maskpack_cp_check(&comm, packed, MASKPACK_CP_ZIGZAG, &e) == MASKPACK_OK);
    }

    /* the last rank holds another batch: every rank fails, naming it */
    const int64_t other[4] = {7, 2, 12, 7};
    maskpack_layout *mine = comm.rank == n - 1 ? aligned(other, 4, 1, 2 * n) : aligned(lengths, 4, 1, 2 * n);
    maskpack_status st = maskpack_cp_check(&comm, mine, MASKPACK_CP_ZIGZAG, &e);
    CHECK(st == MASKPACK_ERR_INVALID_ARGUMENT);
    char want[96];
    snprintf(want, sizeof want, "rank %d holds", n - 1);
    CHECK(strstr(e.message, want) != NULL);
    /* another scheme on rank 0 only */
    st = maskpack_cp_check(&comm, packed, comm.rank == 0 ? MASKPACK_CP_CONTIGUOUS : MASKPACK_CP_ZIGZAG, &e);
    CHECK(st == MASKPACK_ERR_INVALID_ARGUMENT && strstr(e.message, "scheme: rank 1 uses CP scheme") != NULL);
    maskpack_layout_free(mine);

    /* rank 0 passes a part of the wrong length: it fails on its own check, the others with it */
    if (packed) {
        int64_t T = maskpack_layout_q_width(packed), tl = T / n + (comm.rank == 0 ? 1 : 0);
        int64_t *part = calloc((size_t)tl, sizeof *part), *whole = calloc((size_t)T, sizeof *whole);
        maskpack_tensor tp = maskpack_tensor_contiguous(part, MASKPACK_I64, 1, &tl);
        maskpack_tensor tw = maskpack_tensor_contiguous(whole, MASKPACK_I64, 1, &T);
        st = maskpack_cp_all_gather(&comm, packed, MASKPACK_CP_ZIGZAG, &tp, &tw, NULL, &e);
        CHECK(st == MASKPACK_ERR_SHAPE);
        CHECK(comm.rank == 0 ? strstr(e.message, "part: expected this rank's shard (rank 0 of") != NULL
                             : strstr(e.message, "rank 0 refused its arguments (MASKPACK_ERR_SHAPE)") != NULL);
        free(part);
        free(whole);
    }
    maskpack_layout_free(packed);
    maskpack_layout_free(padded);

    int total = 0;
    MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (comm.rank == 0) printf("test_cp_mpi: %d ranks, %s\n", n, total ? "FAILED" : "all checks passed");
    MPI_Finalize();
    return total ? 1 : 0;
}
