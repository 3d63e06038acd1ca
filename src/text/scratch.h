// text/scratch.h — the per-thread scratch vectors of the tokenizer (tokenizer.cpp,
// pretokenizer.cpp): kept between calls, so the steady state allocates nothing, but only up to
// kKeepScratchBytes each (a prompt of ~16k characters). A call that grew one past it frees it on
// return: every connection thread of `coli serve` tokenizes its own request, and a thread that
// once tokenized a large prompt kept its scratch (~1.5 MB for one 400k-character slice) for life:
// ten concurrent 7 MB bodies per round grew RSS by ~40 MB a round, never returned, with 72
// connection threads to fill (docs/serving.md §4.4). Freeing costs one allocation per large call.
#pragma once

#include <cstddef>
#include <vector>

namespace k3::text {

inline constexpr size_t kKeepScratchBytes = size_t{64} << 10;

// Frees `v` when it is destroyed (the end of the call's scope) if its capacity is over the cap.
template <class T>
class ScratchGuard {
 public:
  explicit ScratchGuard(std::vector<T>& v) : v_(v) {}
  ~ScratchGuard() {
    if (v_.capacity() * sizeof(T) > kKeepScratchBytes) std::vector<T>().swap(v_);
  }
  ScratchGuard(const ScratchGuard&) = delete;
  ScratchGuard& operator=(const ScratchGuard&) = delete;

 private:
  std::vector<T>& v_;
};

}  // namespace k3::text
