// dist/mpi_library.h — the MPI library, opened (dlopen) when a job joins instead of linked.
//
// Linked, Open MPI and what it pulls in (open-pal, open-rte, hwloc, libevent, udev, zlib) cost
// every process ~1.2 MB of resident memory before main() (relocations and constructors), whether
// or not it ever runs expert parallelism: kimi_k3's peak on assets/k3-mini went from 37.3-37.4 to
// 36.0-36.4 MB without it (docs/streaming.md §1.11). Only `--expert-parallel` needs it, so
// dist/expert_parallel.cpp reaches MPI through this table, and the programs do not link it.
// mpi.h still gives the types and constants; its predefined handles that are link-time objects
// in Open MPI (MPI_COMM_WORLD, MPI_BYTE, ...) come from the library as well.
#pragma once

#include <mpi.h>

namespace k3::dist {

struct MpiLibrary {
  decltype(&MPI_Init_thread) init_thread;
  decltype(&MPI_Finalize) finalize;
  decltype(&MPI_Abort) abort;
  decltype(&MPI_Error_string) error_string;
  decltype(&MPI_Comm_set_errhandler) comm_set_errhandler;
  decltype(&MPI_Comm_dup) comm_dup;
  decltype(&MPI_Comm_free) comm_free;
  decltype(&MPI_Comm_rank) comm_rank;
  decltype(&MPI_Comm_size) comm_size;
  decltype(&MPI_Send) send;
  decltype(&MPI_Recv) recv;
  decltype(&MPI_Isend) isend;
  decltype(&MPI_Irecv) irecv;
  decltype(&MPI_Iprobe) iprobe;
  decltype(&MPI_Test) test;
  decltype(&MPI_Get_count) get_count;
  MPI_Comm comm_world;
  MPI_Datatype byte;
  MPI_Errhandler errors_return;
  MPI_Request request_null;
};

// Opens the library the programs were built against (once; later calls return the same table).
// Throws Error naming the library and why it could not be opened or lacks a symbol.
const MpiLibrary& open_mpi_library();

}  // namespace k3::dist
