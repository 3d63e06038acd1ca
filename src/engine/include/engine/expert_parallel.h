// engine/expert_parallel.h — what the programs call for --expert-parallel (docs/scale-out.md §2):
// joining the MPI job, a worker rank's life, and leaving. The work is dist/'s
// (dist/expert_parallel.h), which the programs do not see: only engine/ reaches dist/ and only
// dist/ includes mpi.h.
//
// Thread-safety: join and leave on the main thread, before other threads start and after they end.
#pragma once

#include <string>

#include "options/options.h"

namespace k3 {

// Joins the MPI job (mpirun -np N) and returns this process's rank (0 without mpirun). Call once,
// from main, only for --expert-parallel. Throws k3::Error when the build has no MPI (K3_MPI=OFF).
int expert_parallel_join(int* argc, char*** argv);

// A rank > 0: loads its experts of model_dir, checks what it sees against rank 0, and computes the
// pairs rank 0 sends until rank 0 stops it. Returns the exit status. Throws k3::Error on a failed
// load.
int expert_parallel_worker(const std::string& model_dir, const LoadOptions& load);

// Ends this process's part in the job and returns `status`: rank 0 stops the other ranks (or ends
// the job when one failed). A no-op without expert_parallel_join().
int expert_parallel_leave(int status);

}  // namespace k3
