// Code point ranges and their UTF-8 byte sequences (grammar/grammar.h: classes match bytes).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace k3::grammar {

using CodeRanges = std::vector<std::pair<uint32_t, uint32_t>>;  // inclusive, code points
using ByteSequence = std::vector<std::pair<uint8_t, uint8_t>>;  // one byte range per position

inline constexpr uint32_t kMaxCodePoint = 0x10FFFF;

inline void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Sorted, merged, without the surrogates (which UTF-8 cannot carry).
inline CodeRanges normalise(CodeRanges r) {
  CodeRanges cut;
  for (auto [lo, hi] : r) {
    hi = std::min(hi, kMaxCodePoint);
    if (lo > hi) continue;
    if (lo < 0xD800 && hi >= 0xD800) {
      cut.push_back({lo, 0xD7FF});
      if (hi > 0xDFFF) cut.push_back({0xE000, hi});
    } else if (lo >= 0xD800 && lo <= 0xDFFF) {
      if (hi > 0xDFFF) cut.push_back({0xE000, hi});
    } else {
      cut.push_back({lo, hi});
    }
  }
  std::sort(cut.begin(), cut.end());
  CodeRanges out;
  for (const auto& x : cut) {
    if (!out.empty() && x.first <= out.back().second + 1)
      out.back().second = std::max(out.back().second, x.second);
    else
      out.push_back(x);
  }
  return out;
}

// Every code point not in `r`.
inline CodeRanges complement(const CodeRanges& r) {
  CodeRanges out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : normalise(r)) {
    if (lo > next) out.push_back({next, lo - 1});
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
  return normalise(out);
}

// The byte sequences whose UTF-8 decoding is exactly the code points of [lo, hi] (one length).
inline void utf8_split(uint32_t lo, uint32_t hi, std::vector<ByteSequence>& out) {
  for (uint32_t limit : {0x7Fu, 0x7FFu, 0xFFFFu})
    if (lo <= limit && hi > limit) {
      utf8_split(lo, limit, out);
      utf8_split(limit + 1, hi, out);
      return;
    }
  const int n = lo < 0x80 ? 1 : lo < 0x800 ? 2 : lo < 0x10000 ? 3 : 4;
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_split(lo, lo | m, out);
        utf8_split((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_split(lo, (hi & ~m) - 1, out);
        utf8_split(hi & ~m, hi, out);
        return;
      }
    }
  }
  std::string a, b;
  append_utf8(a, lo);
  append_utf8(b, hi);
  ByteSequence seq;
  for (size_t i = 0; i < a.size(); ++i)
    seq.push_back({static_cast<uint8_t>(a[i]), static_cast<uint8_t>(b[i])});
  out.push_back(std::move(seq));
}

inline std::vector<ByteSequence> utf8_sequences(const CodeRanges& ranges) {
  std::vector<ByteSequence> out;
  for (const auto& [lo, hi] : normalise(ranges)) utf8_split(lo, hi, out);
  return out;
}

}  // namespace k3::grammar
