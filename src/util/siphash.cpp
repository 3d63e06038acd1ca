// util/siphash.cpp — SipHash-2-4 as its paper specifies it: a 128-bit key k0 || k1 (little
// endian), v0..v3 initialised from "somepseudorandomlygeneratedbytes", two SipRounds per 8-byte
// word, the length byte in the last word, 0xff into v2, four finalisation rounds.
#include "util/siphash.h"

#include <sys/random.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "util/error.h"

namespace k3 {
namespace {

constexpr uint64_t rotl(uint64_t x, int b) {
  return (x << b) | (x >> (64 - b));
}

uint64_t load_le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void sip_round(uint64_t& v0, uint64_t& v1, uint64_t& v2, uint64_t& v3) {
  v0 += v1;
  v1 = rotl(v1, 13);
  v1 ^= v0;
  v0 = rotl(v0, 32);
  v2 += v3;
  v3 = rotl(v3, 16);
  v3 ^= v2;
  v0 += v3;
  v3 = rotl(v3, 21);
  v3 ^= v0;
  v2 += v1;
  v1 = rotl(v1, 17);
  v1 ^= v2;
  v2 = rotl(v2, 32);
}

}  // namespace

SipHash24::SipHash24(const SipKey& key) {
  const uint64_t k0 = load_le64(key.data()), k1 = load_le64(key.data() + 8);
  v0_ = k0 ^ 0x736f6d6570736575ull;
  v1_ = k1 ^ 0x646f72616e646f6dull;
  v2_ = k0 ^ 0x6c7967656e657261ull;
  v3_ = k1 ^ 0x7465646279746573ull;
}

void SipHash24::compress(uint64_t m) {
  v3_ ^= m;
  sip_round(v0_, v1_, v2_, v3_);
  sip_round(v0_, v1_, v2_, v3_);
  v0_ ^= m;
}

void SipHash24::update(const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  total_ += size;
  if (tail_size_ > 0) {
    const size_t take = std::min(size, 8 - tail_size_);
    std::memcpy(tail_ + tail_size_, p, take);
    tail_size_ += take;
    p += take;
    size -= take;
    if (tail_size_ < 8) return;
    compress(load_le64(tail_));
    tail_size_ = 0;
  }
  for (; size >= 8; p += 8, size -= 8) compress(load_le64(p));
  std::memcpy(tail_, p, size);
  tail_size_ = size;
}

uint64_t SipHash24::final() {
  uint8_t last[8] = {};
  std::memcpy(last, tail_, tail_size_);
  last[7] = static_cast<uint8_t>(total_ & 0xff);
  compress(load_le64(last));
  v2_ ^= 0xff;
  for (int i = 0; i < 4; ++i) sip_round(v0_, v1_, v2_, v3_);
  return v0_ ^ v1_ ^ v2_ ^ v3_;
}

uint64_t siphash24(const SipKey& key, const void* data, size_t size) {
  SipHash24 h(key);
  h.update(data, size);
  return h.final();
}

SipKey random_sip_key() {
  SipKey key{};
  size_t done = 0;
  while (done < key.size()) {
    const ssize_t n = ::getrandom(key.data() + done, key.size() - done, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(std::string("getrandom: cannot draw a checkpoint key: ") + std::strerror(errno));
    }
    done += static_cast<size_t>(n);
  }
  return key;
}

}  // namespace k3
