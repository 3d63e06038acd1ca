// text/pretokenizer.cpp — the release's pre-chunking (400,000-code-point slices, 25,000-run cuts)
// and the Kimi split pattern as a hand-written scanner (docs/tokenizer.md §2.1–§2.5).
//
// The scanner decodes the text once into two byte arrays per code point: a class (the sets the
// pattern tests, below) and a key (the ASCII value, or a marker for U+017F and for the UTF-8
// length of anything else). Every rule then works on those arrays; rule A's backtracking is
// replaced by the closed form of §2.4 ("the largest s").
#include "text/pretokenizer.h"

#include <array>
#include <cstdint>

#include "scratch.h"
#include "text/unicode.h"

namespace k3::text {
namespace {

// The character sets of the pattern, one bit each.
enum CodePointClass : uint8_t {
  kUpperish = 1 << 0,  // S1 = [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]
  kLowerish = 1 << 1,  // S2 = [\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]
  kPrefix = 1 << 2,    // [^\r\n\p{L}\p{N}]: the optional first character of rules A and B
  kPunct = 1 << 3,     // [^\s\p{L}\p{N}]: rule D
  kSpace = 1 << 4,     // \s = White_Space
  kCrLf = 1 << 5,      // [\r\n]
  kHanClass = 1 << 6,  // \p{Han} = Script=Han
  kDigit = 1 << 7,     // \p{N}
};

// Keys: code points below 0x80 are their own key; the rest say only what the scanner needs.
constexpr uint8_t kKeyLongS = 0x80;  // U+017F LATIN SMALL LETTER LONG S (folds to 's')
constexpr uint8_t kKeyTwoBytes = 0x81;
constexpr uint8_t kKeyThreeBytes = 0x82;
constexpr uint8_t kKeyFourBytes = 0x83;

// The scanner's class of a code point with property flags `flags` (CR/LF handled by the caller).
constexpr uint8_t class_of_flags(uint16_t flags) {
  const bool han = flags & kHan;
  const bool letter = flags & kLetter;
  const bool number = flags & kNumber;
  const bool space = flags & kWhiteSpace;
  uint8_t c = 0;
  if (!han && (flags & (kLu | kLt | kLm | kLo | kMark))) c |= kUpperish;
  if (!han && (flags & (kLl | kLm | kLo | kMark))) c |= kLowerish;
  if (!letter && !number) c |= kPrefix;
  if (!space && !letter && !number) c |= kPunct;
  if (space) c |= kSpace;
  if (han) c |= kHanClass;
  if (number) c |= kDigit;
  return c;
}

// Class of every possible flag set (flags use 10 bits) and of every ASCII code point.
struct ClassTables {
  std::array<uint8_t, 1024> of_flags{};
  std::array<uint8_t, 128> of_ascii{};
  ClassTables() {
    for (uint16_t f = 0; f < of_flags.size(); ++f) of_flags[f] = class_of_flags(f);
    for (char32_t cp = 0; cp < 0x80; ++cp) of_ascii[cp] = class_of_flags(unicode_flags(cp));
    for (char32_t cp : {U'\r', U'\n'}) of_ascii[cp] = (of_ascii[cp] & ~kPrefix) | kCrLf;
  }
};
// kAsciiFlags is constant-initialised, so reading it during this dynamic initialisation is safe.
const ClassTables kClassTables;

// UTF-8 length of the code point with key `key`.
inline size_t utf8_length_of_key(uint8_t key) {
  return key < 0x80 ? 1 : key <= kKeyTwoBytes ? 2 : key == kKeyThreeBytes ? 3 : 4;
}

// The decoded text: class and key of each code point.
struct Decoded {
  std::vector<uint8_t> classes;
  std::vector<uint8_t> keys;
};

// Decodes valid UTF-8 into `decoded` (reusing its storage).
void decode_classes(std::string_view text, Decoded& decoded) {
  decoded.classes.resize(text.size());
  decoded.keys.resize(text.size());
  uint8_t* classes = decoded.classes.data();
  uint8_t* keys = decoded.keys.data();
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  const size_t size = text.size();
  size_t n = 0;
  for (size_t b = 0; b < size;) {
    const unsigned char lead = bytes[b];
    if (lead < 0x80) {
      classes[n] = kClassTables.of_ascii[lead];
      keys[n++] = lead;
      ++b;
      continue;
    }
    char32_t cp;
    uint8_t key;
    if (lead < 0xE0) {
      cp = (char32_t(lead & 0x1F) << 6) | (bytes[b + 1] & 0x3F);
      key = cp == 0x17F ? kKeyLongS : kKeyTwoBytes;
      b += 2;
    } else if (lead < 0xF0) {
      cp = (char32_t(lead & 0x0F) << 12) | (char32_t(bytes[b + 1] & 0x3F) << 6) |
           (bytes[b + 2] & 0x3F);
      key = kKeyThreeBytes;
      b += 3;
    } else {
      cp = (char32_t(lead & 0x07) << 18) | (char32_t(bytes[b + 1] & 0x3F) << 12) |
           (char32_t(bytes[b + 2] & 0x3F) << 6) | (bytes[b + 3] & 0x3F);
      key = kKeyFourBytes;
      b += 4;
    }
    classes[n] = kClassTables.of_flags[unicode_flags(cp) & 0x3FF];
    keys[n++] = key;
  }
  decoded.classes.resize(n);
  decoded.keys.resize(n);
}

// The scanner over one decoded text of n code points; every match function returns the end of
// its match, or kNoMatch (every match is non-empty, so 0 is never a real end).
class Scanner {
 public:
  static constexpr size_t kNoMatch = 0;

  Scanner(const uint8_t* classes, const uint8_t* keys, size_t n)
      : classes_(classes), keys_(keys), n_(n) {}

  // End of the piece that starts at code point i (docs/tokenizer.md §2.4, rules in order).
  size_t piece_end(size_t i) const {
    const uint8_t c = classes_[i];
    if (c & kHanClass) return run_end(i + 1, kHanClass);  // H
    const bool prefix = (c & kPrefix) && i + 1 < n_;
    size_t end = kNoMatch;
    if (prefix) end = lower_letters(i + 1);                     // A with the prefix
    if (end == kNoMatch) end = lower_letters(i);                // A without
    if (end == kNoMatch && prefix) end = upper_letters(i + 1);  // B with the prefix
    if (end == kNoMatch) end = upper_letters(i);                // B without
    if (end != kNoMatch) return end;
    if (c & kDigit) return digits(i);       // C
    if (c & kPunct) return punctuation(i);  // D
    if (keys_[i] == ' ' && i + 1 < n_ && (classes_[i + 1] & kPunct)) return punctuation(i + 1);
    return whitespace(i);  // E, F, G: everything else is White_Space
  }

 private:
  // First index >= j whose class lacks every bit of `mask`.
  size_t run_end(size_t j, uint8_t mask) const {
    while (j < n_ && (classes_[j] & mask)) ++j;
    return j;
  }

  // Rule A's letters from j0: S1* S2+ (greedy, with backtracking) then the contraction.
  // Backtracking S1* to the largest s in [j0, m] with cp[s] in S2 is the first success.
  size_t lower_letters(size_t j0) const {
    const size_t m = run_end(j0, kUpperish);
    size_t k;
    if (m < n_ && (classes_[m] & kLowerish)) {
      k = run_end(m + 1, kLowerish);
    } else {
      // cp[s] for s < m is S1 ∩ S2; nothing after it up to m is S2, so S2+ takes just it.
      size_t s = m;
      while (s > j0 && !(classes_[s - 1] & kLowerish)) --s;
      if (s == j0) return kNoMatch;
      k = s;
    }
    return contraction_end(k);
  }

  // Rule B's letters from j0: S1+ S2* then the contraction.
  size_t upper_letters(size_t j0) const {
    if (j0 >= n_ || !(classes_[j0] & kUpperish)) return kNoMatch;
    const size_t m = run_end(j0 + 1, kUpperish);
    return contraction_end(run_end(m, kLowerish));
  }

  // (?i:'s|'t|'re|'ve|'m|'ll|'d)? at k with simple case folding (U+017F folds to s).
  size_t contraction_end(size_t k) const {
    if (k + 1 >= n_ || keys_[k] != '\'') return k;
    const uint8_t first = lower_ascii(keys_[k + 1]);
    if (first == 's' || first == 't' || first == 'm' || first == 'd' || keys_[k + 1] == kKeyLongS)
      return k + 2;
    if (k + 2 >= n_) return k;
    const uint8_t second = lower_ascii(keys_[k + 2]);
    if ((first == 'r' && second == 'e') || (first == 'v' && second == 'e') ||
        (first == 'l' && second == 'l')) {
      return k + 3;
    }
    return k;
  }

  static uint8_t lower_ascii(uint8_t key) { return key >= 'A' && key <= 'Z' ? key | 0x20 : key; }

  // Rule C: \p{N}{1,3}.
  size_t digits(size_t i) const {
    size_t end = i + 1;
    while (end < n_ && end < i + 3 && (classes_[end] & kDigit)) ++end;
    return end;
  }

  // Rule D from the first punct character j: [^\s\p{L}\p{N}]+[\r\n]*.
  size_t punctuation(size_t j) const { return run_end(run_end(j + 1, kPunct), kCrLf); }

  // Rules E, F, G on the White_Space run that starts with cp[i].
  size_t whitespace(size_t i) const {
    size_t last_newline = (classes_[i] & kCrLf) ? i + 1 : kNoMatch;
    size_t r = i + 1;
    for (; r < n_ && (classes_[r] & kSpace); ++r) {
      if (classes_[r] & kCrLf) last_newline = r + 1;
    }
    if (last_newline != kNoMatch) return last_newline;  // E: \s*[\r\n]+
    if (r == n_ || r - i < 2) return r;                 // F at the end of text, or G
    return r - 1;                                       // F: leave one space for the next piece
  }

  const uint8_t* classes_;
  const uint8_t* keys_;
  size_t n_;
};

}  // namespace

// Walks the code points once: a cut where a new 400,000 slice begins and where a character would
// make its isspace() class's run 25,001 long (docs/tokenizer.md §2.5).
void chunk_text(std::string_view valid_utf8, std::vector<Piece>& out) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(valid_utf8.data());
  const size_t size = valid_utf8.size();
  size_t piece_begin = 0;
  size_t slice_length = 0;  // code points so far in the current 400,000 slice
  size_t run_length = 0;    // length of the current isspace()/not run (0: none yet)
  bool run_is_space = false;
  for (size_t b = 0; b < size;) {
    const unsigned char lead = bytes[b];
    char32_t cp;
    size_t length;
    if (lead < 0x80) {
      cp = lead;
      length = 1;
    } else if (lead < 0xE0) {
      cp = (char32_t(lead & 0x1F) << 6) | (bytes[b + 1] & 0x3F);
      length = 2;
    } else if (lead < 0xF0) {
      cp = (char32_t(lead & 0x0F) << 12) | (char32_t(bytes[b + 1] & 0x3F) << 6) |
           (bytes[b + 2] & 0x3F);
      length = 3;
    } else {
      cp = (char32_t(lead & 0x07) << 18) | (char32_t(bytes[b + 1] & 0x3F) << 12) |
           (char32_t(bytes[b + 2] & 0x3F) << 6) | (bytes[b + 3] & 0x3F);
      length = 4;
    }
    const bool is_space = unicode_flags(cp) & kPySpace;
    bool cut = false;
    if (slice_length == kSliceCodePoints) {  // a new slice: run lengths start afresh
      cut = true;
      slice_length = 0;
      run_length = 0;
    }
    if (run_length > 0 && is_space == run_is_space) {
      if (run_length == kMaxRunCodePoints) {  // this character would make the run 25,001 long
        cut = true;
        run_length = 0;
      }
      ++run_length;
    } else {
      run_is_space = is_space;
      run_length = 1;
    }
    if (cut && b > piece_begin) {
      out.push_back({piece_begin, b});
      piece_begin = b;
    }
    ++slice_length;
    b += length;
  }
  if (size > piece_begin) out.push_back({piece_begin, size});
}

// Decodes once, then emits the scanner's pieces, turning code point indices into byte offsets.
void pretokenize(std::string_view valid_utf8, std::vector<Piece>& out) {
  thread_local Decoded decoded;  // reused between calls: no allocation in the steady state
  const ScratchGuard<uint8_t> release_classes(decoded.classes), release_keys(decoded.keys);
  decode_classes(valid_utf8, decoded);
  const uint8_t* keys = decoded.keys.data();
  const size_t n = decoded.classes.size();
  const Scanner scanner(decoded.classes.data(), keys, n);
  if (n == valid_utf8.size()) {  // all ASCII: code point indices are byte offsets
    for (size_t i = 0; i < n;) {
      const size_t end = scanner.piece_end(i);
      out.push_back({i, end});
      i = end;
    }
    return;
  }
  size_t byte = 0;
  for (size_t i = 0; i < n;) {
    const size_t end = scanner.piece_end(i);
    const size_t begin_byte = byte;
    for (; i < end; ++i) byte += utf8_length_of_key(keys[i]);
    out.push_back({begin_byte, byte});
  }
}

}  // namespace k3::text
