// util/hash.h against the published FNV-1a test vectors (Noll's FNV reference suite), at compile
// time and at run time, over text and over raw bytes, and as a running hash over pieces.
#include "util/hash.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "util/crc32c.h"
#include "util/sha256.h"
#include "util/siphash.h"

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

// SipHash-2-4 against the vectors of its paper's reference implementation (key 00..0f, message
// 00 01 02 ... of the given length).
TEST(Hash, SipHash24KnownVectors) {
  k3::SipKey key{};
  for (size_t i = 0; i < key.size(); ++i) key[i] = static_cast<uint8_t>(i);
  uint8_t msg[64];
  for (size_t i = 0; i < sizeof msg; ++i) msg[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(k3::siphash24(key, msg, 0), 0x726fdb47dd0e0e31ull);
  EXPECT_EQ(k3::siphash24(key, msg, 1), 0x74f839c593dc67fdull);
  EXPECT_EQ(k3::siphash24(key, msg, 8), 0x93f5f5799a932462ull);
  EXPECT_EQ(k3::siphash24(key, msg, 15), 0xa129ca6149be45e5ull);
}

TEST(Hash, SipHash24PiecesEqualOneCallAndTheKeyMatters) {
  k3::SipKey key{};
  for (size_t i = 0; i < key.size(); ++i) key[i] = static_cast<uint8_t>(3 * i + 1);
  std::vector<uint8_t> msg(77);
  for (size_t i = 0; i < msg.size(); ++i) msg[i] = static_cast<uint8_t>(i * 7 + 3);
  const uint64_t whole = k3::siphash24(key, msg.data(), msg.size());
  for (size_t a = 0; a <= msg.size(); a += 5)
    for (size_t b = a; b <= msg.size(); b += 9) {
      k3::SipHash24 h(key);
      h.update(msg.data(), a);
      h.update(msg.data() + a, b - a);
      h.update(msg.data() + b, msg.size() - b);
      EXPECT_EQ(h.final(), whole) << a << " " << b;
    }
  k3::SipKey other = key;
  other[15] ^= 1;
  EXPECT_NE(k3::siphash24(other, msg.data(), msg.size()), whole);
  EXPECT_NE(k3::random_sip_key(), k3::random_sip_key());
}

}  // namespace

// SHA-256 (util/sha256.h) on the FIPS 180-4 examples, and fed in uneven pieces.
TEST(Sha256, KnownDigests) {
  EXPECT_EQ(k3::sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(k3::sha256_hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(k3::sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  const std::string million(1000000, 'a');
  EXPECT_EQ(k3::sha256_hex(million),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  k3::Sha256 pieces;
  for (size_t at = 0, step = 1; at < million.size(); at += step, step = step * 3 % 997 + 1)
    pieces.update(million.data() + at, std::min(step, million.size() - at));
  EXPECT_EQ(pieces.hex(), k3::sha256_hex(million));
}

namespace {

// CRC-32C against the standard check value and the test patterns of RFC 3720 (iSCSI) B.4, for the
// hardware path and its table-driven twin alike.
TEST(Crc32c, KnownValues) {
  for (auto* f : {&k3::crc32c, &k3::crc32c_scalar}) {
    EXPECT_EQ(f("123456789", 9, 0), 0xE3069283u);
    EXPECT_EQ(f("", 0, 0), 0u);
    std::vector<uint8_t> b(32, 0);
    EXPECT_EQ(f(b.data(), b.size(), 0), 0x8A9136AAu);
    std::fill(b.begin(), b.end(), 0xFF);
    EXPECT_EQ(f(b.data(), b.size(), 0), 0x62A8AB43u);
    for (size_t i = 0; i < 32; ++i) b[i] = static_cast<uint8_t>(i);
    EXPECT_EQ(f(b.data(), b.size(), 0), 0x46DD794Eu);
    for (size_t i = 0; i < 32; ++i) b[i] = static_cast<uint8_t>(31 - i);
    EXPECT_EQ(f(b.data(), b.size(), 0), 0x113FDB5Cu);
  }
}

// The twins agree on random data of awkward lengths and alignments, and a running checksum over
// pieces equals one call over the whole.
TEST(Crc32c, TwinsAgreeAndPiecesEqualTheWhole) {
  std::mt19937_64 rng(28);
  std::vector<uint8_t> data(70000);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  for (const size_t n :
       {size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{63}, size_t{4097}, size_t{65537}}) {
    for (const size_t skew : {size_t{0}, size_t{1}, size_t{3}}) {
      const uint8_t* p = data.data() + skew;
      const uint32_t whole = k3::crc32c(p, n);
      ASSERT_EQ(whole, k3::crc32c_scalar(p, n)) << n << " at +" << skew;
      const size_t cut = n / 3;
      EXPECT_EQ(k3::crc32c(p + cut, n - cut, k3::crc32c(p, cut)), whole);
      EXPECT_EQ(k3::crc32c_scalar(p + cut, n - cut, k3::crc32c_scalar(p, cut)), whole);
    }
  }
}

}  // namespace
