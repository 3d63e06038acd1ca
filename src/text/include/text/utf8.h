// text/utf8.h — UTF-8 validation, repair and incremental decoding.
//
// Repair follows the Unicode "maximal subpart" practice (what Python's
// bytes.decode("utf-8", "replace") and tiktoken's decode do): every maximal ill-formed
// subsequence becomes one U+FFFD. Overlong forms, surrogates (ED A0..BF) and code points above
// U+10FFFF are ill-formed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace k3::text {

inline constexpr char32_t kReplacement = 0xFFFD;

// True when `bytes` is well-formed UTF-8.
bool is_valid_utf8(std::string_view bytes);

// `bytes` with every maximal ill-formed subsequence replaced by U+FFFD; `replaced` (optional)
// receives the number of replacements. Returns the input unchanged when it is valid.
std::string repair_utf8(std::string_view bytes, size_t* replaced = nullptr);

// Appends the UTF-8 encoding of `cp` (a scalar value) to `out`.
void append_utf8(std::string& out, char32_t cp);

// Decodes valid UTF-8 into code points (precondition: is_valid_utf8).
void decode_utf8(std::string_view valid, std::vector<char32_t>& out);

// Streaming bytes → text: push() returns the longest complete, valid UTF-8 text available so
// far and holds back an incomplete trailing sequence (at most 3 bytes). Bytes that can never
// become valid are emitted as U+FFFD at once. finish() flushes what is held as U+FFFD.
// Concatenating every push() and finish() equals repair_utf8 of all bytes pushed.
class Utf8StreamDecoder {
 public:
  std::string push(std::string_view bytes);
  std::string finish();
  // Bytes held back (an incomplete sequence), 0..3.
  size_t pending() const { return pending_.size(); }

 private:
  std::string pending_;
};

}  // namespace k3::text
