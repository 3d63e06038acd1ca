// dist/mpi_library.cpp — see dist/mpi_library.h.
#include "mpi_library.h"

#include <dlfcn.h>

#include <mutex>
#include <string>

#include "util/error.h"

namespace k3::dist {
namespace {

// The library CMake found at build time (src/CMakeLists.txt), resolved to its versioned file.
constexpr const char* kLibraryPath = K3_MPI_LIBRARY;

void* symbol(void* handle, const char* name) {
  void* p = ::dlsym(handle, name);
  if (p == nullptr)
    throw Error(std::string("--expert-parallel: ") + kLibraryPath + " has no symbol " + name +
                " (not the MPI library this program was built against; rebuild it)");
  return p;
}

template <class F>
void bind(void* handle, const char* name, F& out) {
  out = reinterpret_cast<F>(symbol(handle, name));
}

MpiLibrary load() {
  // RTLD_GLOBAL: Open MPI's own plugins (MCA components) resolve libmpi's symbols through it.
  void* handle = ::dlopen(kLibraryPath, RTLD_NOW | RTLD_GLOBAL);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    // dlerror() names the file and why.
    throw Error(std::string("--expert-parallel: cannot open the MPI library: ") +
                (why != nullptr ? why : kLibraryPath) +
                " (Debian: apt-get install openmpi-bin libopenmpi-dev)");
  }
  MpiLibrary m{};
  bind(handle, "MPI_Init_thread", m.init_thread);
  bind(handle, "MPI_Finalize", m.finalize);
  bind(handle, "MPI_Abort", m.abort);
  bind(handle, "MPI_Error_string", m.error_string);
  bind(handle, "MPI_Comm_set_errhandler", m.comm_set_errhandler);
  bind(handle, "MPI_Comm_dup", m.comm_dup);
  bind(handle, "MPI_Comm_free", m.comm_free);
  bind(handle, "MPI_Comm_rank", m.comm_rank);
  bind(handle, "MPI_Comm_size", m.comm_size);
  bind(handle, "MPI_Send", m.send);
  bind(handle, "MPI_Recv", m.recv);
  bind(handle, "MPI_Isend", m.isend);
  bind(handle, "MPI_Irecv", m.irecv);
  bind(handle, "MPI_Iprobe", m.iprobe);
  bind(handle, "MPI_Test", m.test);
  bind(handle, "MPI_Get_count", m.get_count);
#ifdef OPEN_MPI
  // Open MPI's predefined handles are the addresses of objects in the library.
  m.comm_world = static_cast<MPI_Comm>(symbol(handle, "ompi_mpi_comm_world"));
  m.byte = static_cast<MPI_Datatype>(symbol(handle, "ompi_mpi_byte"));
  m.errors_return = static_cast<MPI_Errhandler>(symbol(handle, "ompi_mpi_errors_return"));
  m.request_null = static_cast<MPI_Request>(symbol(handle, "ompi_request_null"));
#else
  // MPICH's are integer constants.
  m.comm_world = MPI_COMM_WORLD;
  m.byte = MPI_BYTE;
  m.errors_return = MPI_ERRORS_RETURN;
  m.request_null = MPI_REQUEST_NULL;
#endif
  return m;
}

}  // namespace

const MpiLibrary& open_mpi_library() {
  static std::once_flag once;
  static MpiLibrary library;
  std::call_once(once, [] { library = load(); });
  return library;
}

}  // namespace k3::dist
