// text/pretokenizer.h — how Moonshot's release cuts text before BPE (docs/tokenizer.md §2, §2.5).
//
// 1. chunk_text: the release's pre-chunking: slices of 400,000 code points, each cut further so
//    that no piece holds a run of more than 25,000 consecutive code points of one class
//    (Python str.isspace() vs not); run lengths restart in every slice.
// 2. pretokenize: the Kimi split pattern
//      [\p{Han}]+ | letters (two rules, Han removed, optional 's 't 're 've 'm 'll 'd)
//      | \p{N}{1,3} | ' '?punct+[\r\n]* | \s*[\r\n]+ | \s+(?!\S) | \s+
//    as a deterministic scanner with the regex's exact leftmost-first semantics.
// Both work on valid UTF-8 and report byte ranges that tile their input.
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

namespace k3::text {

struct Piece {
  size_t begin = 0;  // byte offset, inclusive
  size_t end = 0;    // byte offset, exclusive
};

inline constexpr size_t kSliceCodePoints = 400000;
inline constexpr size_t kMaxRunCodePoints = 25000;

// Appends the pre-chunks of `valid_utf8` to `out` (nothing for an empty text).
void chunk_text(std::string_view valid_utf8, std::vector<Piece>& out);

// Appends the pre-tokenizer pieces of `valid_utf8` to `out`, offsets relative to its start.
void pretokenize(std::string_view valid_utf8, std::vector<Piece>& out);

}  // namespace k3::text
