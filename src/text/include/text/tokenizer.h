// text/tokenizer.h — the Kimi K3 tokenizer, read straight from a snapshot's `tiktoken.model`
// and `tokenizer_config.json` (docs/tokenizer.md §1–3, §5).
//
//   encode(text, allow_special):
//     repair invalid UTF-8 (→ U+FFFD) → chunk_text (400k / 25k) → per chunk: split at special
//     spellings when allow_special → pretokenize → rank BPE per piece (lowest-rank adjacent
//     pair first, leftmost on ties; whole-piece shortcut) → concatenate.
//   decode(ids) → bytes: base ids give their token bytes, special ids the UTF-8 of their names.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace k3::text {

// The special names the chat format (XTML) is built from, looked up by name: <|open|>,
// <|close|>, <|sep|> and <|end_of_msg|>, which is also the generation stop (docs/tokenizer.md
// §1.3).
inline constexpr std::string_view kChatSpecialNames[4] = {"<|open|>", "<|close|>", "<|sep|>",
                                                          "<|end_of_msg|>"};

class Tokenizer;

// The checks a model's tokenizer must pass before any weight is read (docs/tokenizer.md §1.4):
// its id count (ranks of tiktoken.model + 256 specials) equals config.json's `vocab_size` (a
// file cut at a line boundary still parses, with fewer ranks), and the four chat specials
// resolve to special ids (a tokenizer_config.json without added_tokens_decoder names none of
// them, and `<|open|>` would be encoded as text). `vocab_size` <= 0 skips the size check.
// Throws k3::Error naming the file in `dir` and the expected and actual value.
void check_model_tokenizer(const Tokenizer& tokenizer, const std::filesystem::path& dir,
                           int64_t vocab_size);
// The same with `vocab_size` read from `dir`/config.json (text_config first, then the root);
// without a config.json only the specials are checked (coli tokenize on bare tokenizer files).
void check_model_tokenizer(const Tokenizer& tokenizer, const std::filesystem::path& dir);

class Tokenizer {
 public:
  // Loads `dir`/tiktoken.model and `dir`/tokenizer_config.json. Throws k3::Error naming the
  // file and line on anything malformed (bad base64, duplicate or missing ranks, bad JSON).
  static Tokenizer load(const std::filesystem::path& dir);
  // True when `dir` holds a tiktoken.model (a snapshot without one runs on ids only).
  static bool available(const std::filesystem::path& dir);
  // From the two files' contents (tests); `origin` names them in errors.
  static Tokenizer from_text(std::string_view tiktoken_model,
                             std::string_view tokenizer_config_json, const std::string& origin);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Appends the ids of `text` to `out`. With allow_special every special spelling (all 256,
  // reserved ones included) becomes its id; without, they are ordinary text. Invalid UTF-8 is
  // replaced by U+FFFD first; `replaced` (optional) receives how many sequences were.
  void encode(std::string_view text, bool allow_special, std::vector<int32_t>& out,
              size_t* replaced = nullptr) const;
  std::vector<int32_t> encode(std::string_view text, bool allow_special) const;

  // The BPE of one pre-tokenizer piece; the algorithm can be forced so tests compare tiktoken's
  // vector scan (short pieces) with the heap used for long ones.
  enum class BpeAlgorithm { automatic, vector_scan, heap };
  void bpe_piece(std::string_view piece, BpeAlgorithm algorithm, std::vector<int32_t>& out) const;

  // The bytes of `id` (a special id gives its name). Empty view for an id out of range.
  std::string_view token_bytes(int32_t id) const;
  // Concatenated bytes of `ids` (not necessarily valid UTF-8). Throws k3::Error on a bad id.
  std::string decode_bytes(std::span<const int32_t> ids) const;
  // decode_bytes, then invalid UTF-8 replaced by U+FFFD (tiktoken's decode).
  std::string decode(std::span<const int32_t> ids) const;

  // Id of a special token by name ("<|end_of_msg|>"), if the vocabulary has it.
  std::optional<int32_t> special_id(std::string_view name) const;
  bool is_special(int32_t id) const { return id >= base_vocab_size() && id < vocab_size(); }
  int32_t base_vocab_size() const;  // number of ranks in tiktoken.model (163584)
  int32_t vocab_size() const;       // base + 256 specials (163840)

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace k3::text
