// text/utf8.cpp — UTF-8 validation and repair with maximal-subpart replacement, and the
// streaming decoder that never splits a character.
#include "text/utf8.h"

namespace k3::text {
namespace {

// What a lead byte promises: the total length and the range of the second byte (the only
// continuation byte whose range depends on the lead; later ones are always 80..BF).
struct Lead {
  int length = 0;  // 0: the byte can never start a sequence
  unsigned char second_lo = 0x80, second_hi = 0xBF;
};

Lead lead_of(unsigned char b) {
  if (b < 0x80) return {1};
  if (b >= 0xC2 && b <= 0xDF) return {2};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};  // no surrogates
  if (b >= 0xE1 && b <= 0xEF) return {3};
  if (b == 0xF0) return {4, 0x90, 0xBF};  // no overlong 4-byte forms
  if (b >= 0xF1 && b <= 0xF3) return {4};
  if (b == 0xF4) return {4, 0x80, 0x8F};  // nothing above U+10FFFF
  return {0};
}

// Length of the valid prefix of a sequence starting at s[0]: returns the full length when the
// sequence is complete and valid; otherwise sets `complete` false and returns how many bytes
// (≥ 1) form a valid but unfinished or broken prefix.
enum class Scan { valid, truncated, invalid };
Scan scan_sequence(const unsigned char* s, size_t available, size_t& consumed) {
  const Lead lead = lead_of(s[0]);
  if (lead.length == 0) {
    consumed = 1;
    return Scan::invalid;
  }
  size_t k = 1;
  for (; k < static_cast<size_t>(lead.length); ++k) {
    if (k == available) {
      consumed = k;
      return Scan::truncated;
    }
    const unsigned char lo = k == 1 ? lead.second_lo : 0x80, hi = k == 1 ? lead.second_hi : 0xBF;
    if (s[k] < lo || s[k] > hi) {
      consumed = k;
      return Scan::invalid;
    }
  }
  consumed = k;
  return Scan::valid;
}

void append_replacement(std::string& out) {
  out.append("\xEF\xBF\xBD");
}

}  // namespace

bool is_valid_utf8(std::string_view bytes) {
  const auto* s = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  size_t i = 0;
  while (i < n) {
    if (s[i] < 0x80) {
      ++i;
      continue;
    }
    size_t consumed = 0;
    if (scan_sequence(s + i, n - i, consumed) != Scan::valid) return false;
    i += consumed;
  }
  return true;
}

std::string repair_utf8(std::string_view bytes, size_t* replaced) {
  size_t count = 0;
  if (is_valid_utf8(bytes)) {
    if (replaced) *replaced = 0;
    return std::string(bytes);
  }
  std::string out;
  out.reserve(bytes.size() + 16);
  const auto* s = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  size_t i = 0;
  while (i < n) {
    size_t consumed = 0;
    if (scan_sequence(s + i, n - i, consumed) == Scan::valid) {
      out.append(bytes.substr(i, consumed));
    } else {
      append_replacement(out);
      ++count;
    }
    i += consumed;
  }
  if (replaced) *replaced = count;
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

void decode_utf8(std::string_view valid, std::vector<char32_t>& out) {
  const auto* s = reinterpret_cast<const unsigned char*>(valid.data());
  const size_t n = valid.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char b = s[i];
    if (b < 0x80) {
      out.push_back(b);
      i += 1;
    } else if (b < 0xE0) {
      out.push_back((char32_t(b & 0x1F) << 6) | (s[i + 1] & 0x3F));
      i += 2;
    } else if (b < 0xF0) {
      out.push_back((char32_t(b & 0x0F) << 12) | (char32_t(s[i + 1] & 0x3F) << 6) |
                    (s[i + 2] & 0x3F));
      i += 3;
    } else {
      out.push_back((char32_t(b & 0x07) << 18) | (char32_t(s[i + 1] & 0x3F) << 12) |
                    (char32_t(s[i + 2] & 0x3F) << 6) | (s[i + 3] & 0x3F));
      i += 4;
    }
  }
}

std::string Utf8StreamDecoder::push(std::string_view bytes) {
  pending_.append(bytes);
  std::string out;
  const auto* s = reinterpret_cast<const unsigned char*>(pending_.data());
  const size_t n = pending_.size();
  size_t i = 0;
  while (i < n) {
    if (s[i] < 0x80) {
      out.push_back(static_cast<char>(s[i++]));
      continue;
    }
    size_t consumed = 0;
    const Scan scan = scan_sequence(s + i, n - i, consumed);
    if (scan == Scan::truncated) break;  // may still complete: hold it back
    if (scan == Scan::valid) {
      out.append(pending_, i, consumed);
    } else {
      append_replacement(out);
    }
    i += consumed;
  }
  pending_.erase(0, i);
  return out;
}

std::string Utf8StreamDecoder::finish() {
  std::string out;
  if (!pending_.empty()) append_replacement(out);  // an unfinished sequence is one subpart
  pending_.clear();
  return out;
}

}  // namespace k3::text
