// decode_alloc_test — a decode step (Session::step: Model::forward over one row, the head)
// allocates nothing once the session is warm: every global operator new in this binary is
// counted while the steps run (the k3-tiny fixture, experts in memory, default and exact
// precision).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace {

std::atomic<bool> g_counting{false};
std::atomic<uint64_t> g_allocations{0};

}  // namespace

__attribute__((noinline)) void* operator new(size_t size) {
  if (g_counting.load(std::memory_order_relaxed))
    g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(size ? size : 1)) return p;
  throw std::bad_alloc();
}
__attribute__((noinline)) void operator delete(void* p) noexcept {
  std::free(p);
}
__attribute__((noinline)) void operator delete(void* p, size_t) noexcept {
  std::free(p);
}

namespace {

const std::string kFixture = std::string(K3_SOURCE_DIR) + "/tests/data/k3-tiny";

uint64_t allocations_of_steps(const k3::LoadOptions& load) {
  const k3::Engine engine(kFixture, load);
  k3::Session session(engine, 64);
  const std::vector<int64_t> prompt = {1, 5, 9, 14, 2, 7, 3, 11, 4};
  session.prefill(prompt);
  for (int64_t id : {3, 8}) session.step(id);  // warm: per-thread kernel scratch grows once
  g_allocations = 0;
  g_counting = true;
  for (int64_t id = 0; id < 16; ++id) session.step((id * 7 + 2) % engine.info().vocab_size);
  g_counting = false;
  return g_allocations.load();
}

TEST(DecodeStep, AllocatesNothingOnceWarm) {
  k3::LoadOptions load;
  load.experts_in_memory = true;
  EXPECT_EQ(allocations_of_steps(load), 0u) << "default precision";
  k3::LoadOptions exact = k3::LoadOptions::exact();
  exact.experts_in_memory = true;
  EXPECT_EQ(allocations_of_steps(exact), 0u) << "exact";
}

}  // namespace
