// util/uninit_vector.h — std::vector without the zero-fill: UninitVector<T> is a std::vector whose
// resize() leaves new elements of trivial types uninitialised, for buffers that are written in
// full before they are read (weights loaded in place, caches written row by row). Such a buffer
// costs no memset pass, and its pages are first touched, so faulted in, by the write that fills
// them: a buffer written once is zeroed once (by the kernel, on the fault) instead of twice, and
// the untouched tail of a large one (a context's cache past the position reached) is never
// resident. assign(n, value) and resize(n, value) still fill.
// Blocks of kHugeBufferBytes and more come straight from mmap, 2 MiB-aligned, their whole 2 MiB
// pieces advised for transparent huge pages and the partial last piece kept in 4 KiB pages (so
// only the bytes used of it are resident), and go back to the system when freed.
// Thread-safety: as std::vector.
#pragma once

#include <cstddef>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace k3 {

// Blocks from this size on are mapped (2 MiB-aligned, huge-page-advised) rather than malloc'd.
inline constexpr size_t kHugeBufferBytes = size_t{4} << 20;

// `bytes` of uninitialised memory aligned to 64 bytes (2 MiB from kHugeBufferBytes on). Throws
// std::bad_alloc. free_buffer takes the same byte count back.
void* allocate_buffer(size_t bytes);
void free_buffer(void* p, size_t bytes) noexcept;

template <class T>
struct UninitAllocator {
  using value_type = T;
  UninitAllocator() = default;
  template <class U>
  UninitAllocator(const UninitAllocator<U>&) noexcept {}
  T* allocate(size_t n) { return static_cast<T*>(allocate_buffer(n * sizeof(T))); }
  void deallocate(T* p, size_t n) noexcept { free_buffer(p, n * sizeof(T)); }
  // Value-less construction default-initialises: nothing is written for trivial types.
  template <class U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
  friend bool operator==(const UninitAllocator&, const UninitAllocator&) { return true; }
};

template <class T>
using UninitVector = std::vector<T, UninitAllocator<T>>;

}  // namespace k3
