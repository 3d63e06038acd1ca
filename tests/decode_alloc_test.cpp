// decode_alloc_test — a decode step (Session::step: Model::forward over one row, the head)
// allocates nothing once the session is warm: every global operator new in this binary is
// counted while the steps run (the k3-tiny fixture, experts in memory, default and exact
// precision); so does a batched step (k3::Batch) once a step of as many sessions has run.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "test_util.h"

namespace {

using k3::testing::kTinyDir;

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

uint64_t allocations_of_steps(const k3::LoadOptions& load) {
  const k3::Engine engine(kTinyDir, load);
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

// A Batch of three sessions, then two (one left): warm with a step of three.
uint64_t allocations_of_batched_steps(const k3::LoadOptions& load) {
  const k3::Engine engine(kTinyDir, load);
  const int64_t V = engine.info().vocab_size;
  k3::Session a(engine, 64), b(engine, 48), c(engine, 64);
  a.prefill(std::vector<int64_t>{1, 5, 9});
  b.prefill(std::vector<int64_t>{2, 7, 3, 11, 4});
  c.prefill(std::vector<int64_t>{6});
  k3::Batch batch(engine);
  std::vector<k3::Session*> three = {&a, &b, &c}, two = {&a, &c};
  std::vector<int64_t> ids3 = {3, 8, 1}, ids2 = {0, 0};
  for (int warm = 0; warm < 2; ++warm) batch.step(three, ids3);
  g_allocations = 0;
  g_counting = true;
  for (int64_t id = 0; id < 8; ++id) {
    for (int64_t& x : ids3) x = (x * 7 + id + 2) % V;
    batch.step(three, ids3);
  }
  for (int64_t id = 0; id < 8; ++id) {
    for (int64_t& x : ids2) x = (x * 5 + id + 1) % V;
    batch.step(two, ids2);
  }
  g_counting = false;
  return g_allocations.load();
}

TEST(DecodeStep, BatchedStepAllocatesNothingOnceWarm) {
  k3::LoadOptions load;
  load.experts_in_memory = true;
  EXPECT_EQ(allocations_of_batched_steps(load), 0u) << "default precision";
  k3::LoadOptions exact = k3::LoadOptions::exact();
  exact.experts_in_memory = true;
  EXPECT_EQ(allocations_of_batched_steps(exact), 0u) << "exact";
}

}  // namespace
