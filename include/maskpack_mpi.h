/* maskpack_mpi.h: maskpack's communicator over MPI (the optional libmaskpack_mpi, built when an MPI
 * implementation is present). maskpack never calls MPI_Init or MPI_Finalize: the caller owns MPI.
 *
 *     MPI_Comm world = MPI_COMM_WORLD;
 *     maskpack_comm comm;
 *     maskpack_comm_from_mpi(&world, &comm, &err);
 *     maskpack_cp_all_gather(&comm, layout, MASKPACK_CP_ZIGZAG, &part, &whole, NULL, &err);
 */
#ifndef MASKPACK_MPI_H
#define MASKPACK_MPI_H

#include <mpi.h>

#include "maskpack.h"

#ifdef __cplusplus
extern "C" {
#endif

/* (an MPI communicator, initialised; *mpi must outlive the table) -> *out: rank and size from MPI, the
 * collectives as MPI_Allgather / MPI_Alltoall of bytes. A collective of more than INT_MAX bytes per rank
 * fails (MASKPACK_ERR_COMM from the calling function). */
MASKPACK_API maskpack_status maskpack_comm_from_mpi(const MPI_Comm *mpi, maskpack_comm *out, maskpack_error *err);

#ifdef __cplusplus
}
#endif

#endif /* MASKPACK_MPI_H */
