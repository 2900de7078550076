"""group= as an mpi4py communicator: ring attention and sequence-parallel Gated DeltaNet run the library's
C algorithms over MPI from Python. The worker runs under mpirun with 2 and 4 ranks (oversubscribed)."""

import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("mpi4py")
MPIRUN = shutil.which("mpirun") or shutil.which("mpiexec")
WORKER = os.path.join(os.path.dirname(__file__), "mpi", "mpi4py_worker.py")


@pytest.mark.skipif(MPIRUN is None, reason="no mpirun on this machine (Open MPI comes with tools/install_deps.sh)")
@pytest.mark.parametrize("world", [2, 4])
def test_ring_and_sequence_gdn_over_mpi4py(world):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    r = subprocess.run([MPIRUN, "--oversubscribe", "-np", str(world), sys.executable, WORKER], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{world} ranks, all checks passed" in r.stdout
