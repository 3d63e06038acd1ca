// util/hash.h against the published FNV-1a test vectors (Noll's FNV reference suite), at compile
// time and at run time, over text and over raw bytes, and as a running hash over pieces.
#include "util/hash.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace {

static_assert(k3::fnv1a_32("") == 0x811c9dc5u);
static_assert(k3::fnv1a_32("a") == 0xe40c292cu);
static_assert(k3::fnv1a_32("foobar") == 0xbf9cf968u);
static_assert(k3::fnv1a_64("") == 0xcbf29ce484222325ull);
static_assert(k3::fnv1a_64("a") == 0xaf63dc4c8601ec8cull);
static_assert(k3::fnv1a_64("foobar") == 0x85944171f73967e8ull);

TEST(Hash, Fnv1aKnownVectors) {
  const std::string foobar = "foobar";
  EXPECT_EQ(k3::fnv1a_32(foobar), 0xbf9cf968u);
  EXPECT_EQ(k3::fnv1a_64(foobar), 0x85944171f73967e8ull);
  EXPECT_EQ(k3::fnv1a_32_bytes(foobar.data(), foobar.size()), 0xbf9cf968u);
  EXPECT_EQ(k3::fnv1a_64_bytes(foobar.data(), foobar.size()), 0x85944171f73967e8ull);
  // Bytes, not characters: a NUL and bytes >= 0x80 count like any other.
  const uint8_t zeros[4] = {0, 0, 0, 0};
  EXPECT_EQ(k3::fnv1a_32_bytes(zeros, sizeof zeros), 0x4b95f515u);
  EXPECT_EQ(k3::fnv1a_64_bytes(zeros, sizeof zeros), 0x4d25767f9dce13f5ull);
  const std::vector<int32_t> ids = {1, -1};  // little-endian 01 00 00 00 ff ff ff ff
  EXPECT_EQ(k3::fnv1a_32_bytes(ids.data(), ids.size() * sizeof(int32_t)), 0xec9ef2e0u);
}

TEST(Hash, Fnv1aContinuesARunningHash) {
  EXPECT_EQ(k3::fnv1a_64("bar", k3::fnv1a_64("foo")), k3::fnv1a_64("foobar"));
  EXPECT_EQ(k3::fnv1a_32("bar", k3::fnv1a_32("foo")), k3::fnv1a_32("foobar"));
  EXPECT_EQ(k3::fnv1a_32("", 12345u), 12345u);
}

}  // namespace
