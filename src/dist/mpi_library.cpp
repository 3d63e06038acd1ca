// dist/mpi_library.cpp — see dist/mpi_library.h.
#include "mpi_library.h"

#include <dlfcn.h>

#include <mutex>
#include <string>

#include "util/error.h"

namespace k3::dist {
namespace {

// The library CMake found at build time (src/CMakeLists.txt): by its SONAME, found as the dynamic
// linker finds libraries, then the file of that name in the directory it was found in.
constexpr const char* kLibraryName = K3_MPI_SONAME;
constexpr const char* kLibraryFile = K3_MPI_FILE;

// An opened library and the name it was opened by.
struct Opened {
  void* handle;
  const char* path;

  void* symbol(const char* name) const {
    void* p = ::dlsym(handle, name);
    if (p == nullptr)
      throw Error(std::string("--expert-parallel: ") + path + " has no symbol " + name +
                  " (not the MPI library this program was built against; rebuild it)");
    return p;
  }
  template <class F>
  void bind(const char* name, F& out) const {
    out = reinterpret_cast<F>(symbol(name));
  }
};

Opened open_library() {
  // RTLD_GLOBAL: Open MPI's own plugins (MCA components) resolve libmpi's symbols through it.
  if (void* handle = ::dlopen(kLibraryName, RTLD_NOW | RTLD_GLOBAL)) return {handle, kLibraryName};
  const char* first = ::dlerror();  // names the file and why
  const std::string why = first != nullptr ? first : kLibraryName;
  if (void* handle = ::dlopen(kLibraryFile, RTLD_NOW | RTLD_GLOBAL)) return {handle, kLibraryFile};
  throw Error("--expert-parallel: cannot open the MPI library: " + why + " (nor " + kLibraryFile +
              "; Debian: apt-get install openmpi-bin, which brings libopenmpi3)");
}

MpiLibrary load() {
  const Opened lib = open_library();
  MpiLibrary m{};
  lib.bind("MPI_Init_thread", m.init_thread);
  lib.bind("MPI_Finalize", m.finalize);
  lib.bind("MPI_Abort", m.abort);
  lib.bind("MPI_Error_string", m.error_string);
  lib.bind("MPI_Comm_set_errhandler", m.comm_set_errhandler);
  lib.bind("MPI_Comm_dup", m.comm_dup);
  lib.bind("MPI_Comm_free", m.comm_free);
  lib.bind("MPI_Comm_rank", m.comm_rank);
  lib.bind("MPI_Comm_size", m.comm_size);
  lib.bind("MPI_Send", m.send);
  lib.bind("MPI_Recv", m.recv);
  lib.bind("MPI_Isend", m.isend);
  lib.bind("MPI_Irecv", m.irecv);
  lib.bind("MPI_Iprobe", m.iprobe);
  lib.bind("MPI_Test", m.test);
  lib.bind("MPI_Get_count", m.get_count);
#ifdef OPEN_MPI
  // Open MPI's predefined handles are the addresses of objects in the library.
  m.comm_world = static_cast<MPI_Comm>(lib.symbol("ompi_mpi_comm_world"));
  m.byte = static_cast<MPI_Datatype>(lib.symbol("ompi_mpi_byte"));
  m.errors_return = static_cast<MPI_Errhandler>(lib.symbol("ompi_mpi_errors_return"));
  m.request_null = static_cast<MPI_Request>(lib.symbol("ompi_request_null"));
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
