// text/tokenizer.cpp — vocabulary loading (tiktoken.model + tokenizer_config.json), special
// tokens, tiktoken's rank BPE and the encode/decode pipeline of tokenizer.h.
//
// BPE of one piece P (docs/tokenizer.md §3.1): if P is a token, emit it. Otherwise start from
// single bytes and repeatedly merge the adjacent pair whose concatenation has the lowest rank
// (leftmost on ties) until no adjacent concatenation is a token. Short pieces use tiktoken's
// vector scan; long ones a linked list + min-heap on (rank, start) with lazy invalidation, so a
// 25,000-character piece costs O(n log n), not O(n²). Both give identical results.
#include "text/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <queue>
#include <unordered_map>

#include "io/file.h"
#include "scratch.h"
#include "text/pretokenizer.h"
#include "text/utf8.h"
#include "util/error.h"

namespace k3::text {
namespace {

constexpr int32_t kNoRank = std::numeric_limits<int32_t>::max();
constexpr int kReservedSpecialCount = 256;  // num_reserved_special_tokens of the release
constexpr size_t kHeapThreshold = 128;      // pieces at least this long use the heap BPE

uint64_t hash_bytes(const char* data, size_t length) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (length * 0xC2B2AE3D27D4EB4Full);
  while (length >= 8) {
    uint64_t word;
    std::memcpy(&word, data, 8);
    h = (h ^ word) * 0xFF51AFD7ED558CCDull;
    h ^= h >> 32;
    data += 8;
    length -= 8;
  }
  if (length) {
    uint64_t word = 0;
    std::memcpy(&word, data, length);
    h = (h ^ word) * 0xC4CEB9FE1A85EC53ull;
  }
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  return h;
}

int base64_value(unsigned char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

// Strict standard base64 with '=' padding; false on anything else.
bool decode_base64(std::string_view text, std::string& out) {
  out.clear();
  if (text.empty() || text.size() % 4 != 0) return false;
  for (size_t i = 0; i < text.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      const unsigned char c = static_cast<unsigned char>(text[i + k]);
      if (c == '=' && i + 4 == text.size() && k >= 2) {
        v[k] = 0;
        ++pad;
        continue;
      }
      if (pad) return false;  // data after padding
      v[k] = base64_value(c);
      if (v[k] < 0) return false;
    }
    const uint32_t bits =
        (uint32_t(v[0]) << 18) | (uint32_t(v[1]) << 12) | (uint32_t(v[2]) << 6) | uint32_t(v[3]);
    out.push_back(static_cast<char>(bits >> 16));
    if (pad < 2) out.push_back(static_cast<char>((bits >> 8) & 0xFF));
    if (pad < 1) out.push_back(static_cast<char>(bits & 0xFF));
  }
  return true;
}

// Lets the special-name map be searched with a string_view (no allocation per probe).
struct NameHash {
  using is_transparent = void;
  size_t operator()(std::string_view name) const { return std::hash<std::string_view>()(name); }
};

}  // namespace

struct Tokenizer::Impl {
  std::string arena;              // bytes of every token, base ranks then special names
  std::vector<uint32_t> offsets;  // [vocab + 1] into arena
  int32_t base_count = 0;
  std::vector<int32_t> slots;  // open addressing over base tokens: id + 1, 0 = empty
  uint64_t slot_mask = 0;
  std::unordered_map<std::string, int32_t, NameHash, std::equal_to<>> special_by_name;
  std::array<bool, 256> special_first_byte{};
  std::vector<size_t> special_lengths;  // distinct name lengths, longest first (a name that is a
                                        // prefix of another never hides the longer one)

  std::string_view bytes_of(int32_t id) const {
    return std::string_view(arena).substr(offsets[id], offsets[id + 1] - offsets[id]);
  }

  int32_t rank_of(const char* data, size_t length) const {
    uint64_t slot = hash_bytes(data, length) & slot_mask;
    while (true) {
      const int32_t entry = slots[slot];
      if (entry == 0) return kNoRank;
      const int32_t id = entry - 1;
      if (offsets[id + 1] - offsets[id] == length &&
          std::memcmp(arena.data() + offsets[id], data, length) == 0)
        return id;
      slot = (slot + 1) & slot_mask;
    }
  }

  // More than 1.25 slots a token (so at least one stays empty and a probe for absent bytes
  // ends): 262,144 slots (1 MB) for the release's 163,840 tokens, load 0.625. Twice as many
  // slots (2 MB) encoded no faster (k3_tokenizer_bench, 44 MB/s either way).
  void build_table() {
    size_t capacity = 1;
    while (capacity < static_cast<size_t>(base_count) * 5 / 4 + 1) capacity <<= 1;
    slots.assign(capacity, 0);
    slot_mask = capacity - 1;
    for (int32_t id = 0; id < base_count; ++id) {
      const std::string_view b = bytes_of(id);
      uint64_t slot = hash_bytes(b.data(), b.size()) & slot_mask;
      while (slots[slot] != 0) slot = (slot + 1) & slot_mask;
      slots[slot] = id + 1;
    }
  }

  void bpe(const char* piece, size_t length, std::vector<int32_t>& out) const;
  void bpe_small(const char* piece, size_t length, std::vector<int32_t>& out) const;
  void bpe_heap(const char* piece, size_t length, std::vector<int32_t>& out) const;
  void encode_ordinary(std::string_view text, std::vector<int32_t>& out) const;
};

// tiktoken's vector scan: parts[i] = (start of part i, rank of part i merged with part i+1).
void Tokenizer::Impl::bpe_small(const char* piece, size_t length, std::vector<int32_t>& out) const {
  struct Part {
    uint32_t start;
    int32_t rank;
  };
  thread_local std::vector<Part> parts;
  const ScratchGuard<Part> release_parts(parts);
  parts.clear();
  for (size_t i = 0; i + 1 < length; ++i) parts.push_back({uint32_t(i), rank_of(piece + i, 2)});
  parts.push_back({uint32_t(length - 1), kNoRank});
  parts.push_back({uint32_t(length), kNoRank});
  auto rank_at = [&](size_t i) {
    return i + 3 < parts.size()
               ? rank_of(piece + parts[i].start, parts[i + 3].start - parts[i].start)
               : kNoRank;
  };
  while (true) {
    int32_t best = kNoRank;
    size_t at = 0;
    for (size_t i = 0; i + 1 < parts.size(); ++i)
      if (parts[i].rank < best) best = parts[i].rank, at = i;
    if (best == kNoRank) break;
    if (at > 0) parts[at - 1].rank = rank_at(at - 1);
    parts[at].rank = rank_at(at);
    parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(at) + 1);
  }
  for (size_t i = 0; i + 1 < parts.size(); ++i)
    out.push_back(rank_of(piece + parts[i].start, parts[i + 1].start - parts[i].start));
}

// The same merge order with a doubly linked list of parts and a lazy min-heap.
void Tokenizer::Impl::bpe_heap(const char* piece, size_t length, std::vector<int32_t>& out) const {
  constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();
  thread_local std::vector<uint32_t> next, prev;  // [length] linked list over part starts
  thread_local std::vector<int32_t> rank;         // [length] rank of (part, next part) merged
  const ScratchGuard<uint32_t> release_next(next), release_prev(prev);
  const ScratchGuard<int32_t> release_rank(rank);
  next.assign(length, kNone);
  prev.assign(length, kNone);
  rank.assign(length, kNoRank);
  for (uint32_t i = 0; i < length; ++i) {
    next[i] = i + 1 < length ? i + 1 : kNone;
    prev[i] = i > 0 ? i - 1 : kNone;
  }
  auto end_of = [&](uint32_t part) { return next[part] == kNone ? uint32_t(length) : next[part]; };
  auto pair_rank = [&](uint32_t part) {
    if (part == kNone || next[part] == kNone) return kNoRank;
    return rank_of(piece + part, end_of(next[part]) - part);
  };
  using Entry = std::pair<int32_t, uint32_t>;  // (rank, start): smallest first
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  for (uint32_t i = 0; i + 1 < length; ++i) {
    rank[i] = pair_rank(i);
    if (rank[i] != kNoRank) heap.push({rank[i], i});
  }
  std::vector<bool> alive(length, true);
  while (!heap.empty()) {
    const auto [r, at] = heap.top();
    heap.pop();
    if (!alive[at] || rank[at] != r) continue;  // stale entry
    const uint32_t gone = next[at];
    alive[gone] = false;
    next[at] = next[gone];
    if (next[gone] != kNone) prev[next[gone]] = at;
    rank[at] = pair_rank(at);
    if (rank[at] != kNoRank) heap.push({rank[at], at});
    if (prev[at] != kNone) {
      const uint32_t left = prev[at];
      rank[left] = pair_rank(left);
      if (rank[left] != kNoRank) heap.push({rank[left], left});
    }
  }
  for (uint32_t part = 0; part != kNone; part = next[part])
    out.push_back(rank_of(piece + part, end_of(part) - part));
}

void Tokenizer::bpe_piece(std::string_view piece, BpeAlgorithm algorithm,
                          std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (algorithm == BpeAlgorithm::automatic) return impl_->bpe(piece.data(), piece.size(), out);
  const int32_t whole = impl_->rank_of(piece.data(), piece.size());
  if (whole != kNoRank) {
    out.push_back(whole);
  } else if (algorithm == BpeAlgorithm::vector_scan) {
    impl_->bpe_small(piece.data(), piece.size(), out);
  } else {
    impl_->bpe_heap(piece.data(), piece.size(), out);
  }
}

void Tokenizer::Impl::bpe(const char* piece, size_t length, std::vector<int32_t>& out) const {
  const int32_t whole = rank_of(piece, length);
  if (whole != kNoRank) {
    out.push_back(whole);
  } else if (length < kHeapThreshold) {
    bpe_small(piece, length, out);
  } else {
    bpe_heap(piece, length, out);
  }
}

void Tokenizer::Impl::encode_ordinary(std::string_view text, std::vector<int32_t>& out) const {
  thread_local std::vector<Piece> pieces;
  const ScratchGuard<Piece> release_pieces(pieces);
  pieces.clear();
  pretokenize(text, pieces);
  for (const Piece& p : pieces) bpe(text.data() + p.begin, p.end - p.begin, out);
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
void check_model_tokenizer(const Tokenizer& tokenizer, const std::filesystem::path& dir,
                           int64_t vocab_size) {
  const std::string model = (dir / "tiktoken.model").string(),
                    config = (dir / "tokenizer_config.json").string();
  if (vocab_size > 0 && tokenizer.vocab_size() != vocab_size)
    throw Error(model + ": " + std::to_string(tokenizer.base_vocab_size()) + " ranks + " +
                std::to_string(kReservedSpecialCount) + " specials = " +
                std::to_string(tokenizer.vocab_size()) + " ids, but config.json vocab_size is " +
                std::to_string(vocab_size) + " (is the file cut short or from another model?)");
  for (const std::string_view name : kChatSpecialNames) {
    const std::optional<int32_t> id = tokenizer.special_id(name);
    if (!id || !tokenizer.is_special(*id))
      throw Error(config + ": added_tokens_decoder does not name the special token " +
                  std::string(name) + ", which the chat format needs (is the file damaged?)");
  }
}

void check_model_tokenizer(const Tokenizer& tokenizer, const std::filesystem::path& dir) {
  const std::filesystem::path path = dir / "config.json";
  std::error_code ec;
  int64_t vocab_size = 0;
  if (std::filesystem::exists(path, ec)) {
    nlohmann::json root;
    try {
      root = nlohmann::json::parse(read_text_file(path.string()));
    } catch (const nlohmann::json::exception& e) {
      throw Error(path.string() + ": not valid JSON: " + e.what());
    }
    for (const nlohmann::json* obj :
         {root.is_object() && root.contains("text_config") ? &root["text_config"] : nullptr,
          &root}) {
      if (obj == nullptr || !obj->is_object() || !obj->contains("vocab_size")) continue;
      const nlohmann::json& v = (*obj)["vocab_size"];
      if (!v.is_number_integer())
        throw Error(path.string() + ": vocab_size: expected an integer, got " + v.dump());
      vocab_size = v.get<int64_t>();
      break;
    }
  }
  check_model_tokenizer(tokenizer, dir, vocab_size);
}

Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

bool Tokenizer::available(const std::filesystem::path& dir) {
  std::error_code ec;
  return std::filesystem::is_regular_file(dir / "tiktoken.model", ec);
}

Tokenizer Tokenizer::load(const std::filesystem::path& dir) {
  const std::filesystem::path model = dir / "tiktoken.model",
                              config = dir / "tokenizer_config.json";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(model, ec))
    throw Error(model.string() +
                ": missing (the snapshot has no tokenizer; pass token ids with --ids)");
  if (!std::filesystem::is_regular_file(config, ec))
    throw Error(config.string() +
                ": missing (needed for the special-token names next to tiktoken.model)");
  return from_text(read_text_file(model.string()), read_text_file(config.string()), dir.string());
}

Tokenizer Tokenizer::from_text(std::string_view tiktoken_model,
                               std::string_view tokenizer_config_json, const std::string& origin) {
  auto impl = std::make_unique<Impl>();
  const std::string model_name = origin + "/tiktoken.model",
                    config_name = origin + "/tokenizer_config.json";

  // tiktoken.model: "<base64> <rank>" per line; rank = id; ranks must be exactly 0..N-1. Lines
  // end in LF, CRLF or CR and the two fields are separated by ASCII whitespace, as the reference
  // loader (bytes.splitlines(), bytes.split()) reads them.
  // The decoded bytes of every line, in file order, one arena (a pair of rank and std::string per
  // token took ~10 MB more at its peak than the arena for the release's 163,840 tokens).
  std::string line_bytes;
  line_bytes.reserve(tiktoken_model.size() * 3 / 4);
  std::vector<uint32_t> line_offsets;  // [lines + 1] into line_bytes
  std::vector<int32_t> line_ranks;     // [lines]
  std::string decoded;
  size_t line_number = 0, pos = 0;
  const auto is_blank = [](char c) { return c == ' ' || c == '\t' || c == '\v' || c == '\f'; };
  while (pos < tiktoken_model.size()) {
    size_t eol = tiktoken_model.find_first_of("\r\n", pos);
    if (eol == std::string_view::npos) eol = tiktoken_model.size();
    std::string_view line = tiktoken_model.substr(pos, eol - pos);
    pos = eol + (tiktoken_model.compare(eol, 2, "\r\n") == 0 ? 2 : 1);
    ++line_number;
    while (!line.empty() && is_blank(line.front())) line.remove_prefix(1);
    while (!line.empty() && is_blank(line.back())) line.remove_suffix(1);
    if (line.empty()) continue;
    const auto where = [&] { return model_name + ":" + std::to_string(line_number) + ": "; };
    size_t space = 0;
    while (space < line.size() && !is_blank(line[space])) ++space;
    size_t rank_begin = space;
    while (rank_begin < line.size() && is_blank(line[rank_begin])) ++rank_begin;
    const bool two_fields =
        space < line.size() && std::find_if(line.begin() + static_cast<std::ptrdiff_t>(rank_begin),
                                            line.end(), is_blank) == line.end();
    if (!two_fields) throw Error(where() + "expected \"<base64> <rank>\"");
    if (!decode_base64(line.substr(0, space), decoded))
      throw Error(where() + "bad base64 \"" +
                  std::string(line.substr(0, std::min<size_t>(space, 64))) + "\"");
    const std::string_view rank_text = line.substr(rank_begin);
    int64_t rank = 0;
    if (rank_text.empty() || rank_text.size() > 9)
      throw Error(where() + "bad rank \"" + std::string(rank_text) + "\"");
    for (char c : rank_text) {
      if (c < '0' || c > '9') throw Error(where() + "bad rank \"" + std::string(rank_text) + "\"");
      rank = rank * 10 + (c - '0');
    }
    line_offsets.push_back(static_cast<uint32_t>(line_bytes.size()));
    line_bytes.append(decoded);
    line_ranks.push_back(static_cast<int32_t>(rank));
  }
  if (line_ranks.empty()) throw Error(model_name + ": no tokens");
  line_offsets.push_back(static_cast<uint32_t>(line_bytes.size()));
  const int64_t count = static_cast<int64_t>(line_ranks.size());
  std::vector<int32_t> slot_of_rank(count, -1);
  bool in_order = true;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t rank = line_ranks[i];
    in_order = in_order && rank == i;
    if (rank >= count)
      throw Error(model_name + ": rank " + std::to_string(rank) +
                  " out of range (ranks must be 0.." + std::to_string(count - 1) + ")");
    if (slot_of_rank[rank] >= 0)
      throw Error(model_name + ": duplicate rank " + std::to_string(rank));
    slot_of_rank[rank] = static_cast<int32_t>(i);
  }
  impl->base_count = static_cast<int32_t>(count);
  if (in_order) {  // the usual file: lines in rank order, so the arena is already the tokens'
    impl->arena = std::move(line_bytes);
    impl->offsets = std::move(line_offsets);
    impl->offsets.reserve(count + kReservedSpecialCount + 1);
  } else {
    impl->arena.reserve(line_bytes.size());
    impl->offsets.reserve(count + kReservedSpecialCount + 1);
    for (int64_t rank = 0; rank < count; ++rank) {
      const size_t line = static_cast<size_t>(slot_of_rank[rank]);
      impl->offsets.push_back(static_cast<uint32_t>(impl->arena.size()));
      impl->arena.append(line_bytes, line_offsets[line],
                         line_offsets[line + 1] - line_offsets[line]);
    }
    impl->offsets.push_back(static_cast<uint32_t>(impl->arena.size()));
  }
  impl->build_table();
  for (int32_t id = 0; id < impl->base_count; ++id) {
    const std::string_view b = impl->bytes_of(id);
    if (impl->rank_of(b.data(), b.size()) != id)
      throw Error(model_name + ": duplicate token bytes at ranks " +
                  std::to_string(impl->rank_of(b.data(), b.size())) + " and " + std::to_string(id));
  }
  for (int byte = 0; byte < 256; ++byte) {
    const char c = static_cast<char>(byte);
    if (impl->rank_of(&c, 1) == kNoRank)
      throw Error(model_name + ": byte " + std::to_string(byte) +
                  " has no token (every single byte must be one)");
  }

  // Specials: ids base..base+255, named from added_tokens_decoder, else <|reserved_token_ID|>.
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(tokenizer_config_json);
  } catch (const nlohmann::json::exception& e) {
    throw Error(config_name + ": malformed JSON: " + e.what());
  }
  std::unordered_map<int64_t, std::string> named;
  if (!config.is_object()) throw Error(config_name + ": expected a JSON object");
  if (config.contains("added_tokens_decoder")) {
    const auto& decoder = config["added_tokens_decoder"];
    if (!decoder.is_object()) throw Error(config_name + ": added_tokens_decoder is not an object");
    for (const auto& [key, value] : decoder.items()) {
      int64_t id = -1;
      try {
        size_t used = 0;
        id = std::stoll(key, &used);
        if (used != key.size()) id = -1;
      } catch (const std::exception&) {
        id = -1;
      }
      if (id < 0)
        throw Error(config_name + ": added_tokens_decoder key \"" + key + "\" is not a token id");
      if (!value.is_object() || !value.contains("content") || !value["content"].is_string() ||
          value["content"].get<std::string>().empty())
        throw Error(config_name + ": added_tokens_decoder[" + key + "] has no string \"content\"");
      named[id] = value["content"].get<std::string>();
    }
  }
  for (int k = 0; k < kReservedSpecialCount; ++k) {
    const int64_t id = count + k;
    const auto it = named.find(id);
    const std::string name =
        it != named.end() ? it->second : "<|reserved_token_" + std::to_string(id) + "|>";
    if (!impl->special_by_name.emplace(name, static_cast<int32_t>(id)).second)
      throw Error(config_name + ": special token name \"" + name + "\" is used twice");
    impl->arena.append(name);
    impl->offsets.push_back(static_cast<uint32_t>(impl->arena.size()));
    impl->special_first_byte[static_cast<unsigned char>(name[0])] = true;
    impl->special_lengths.push_back(name.size());
  }
  std::sort(impl->special_lengths.begin(), impl->special_lengths.end(), std::greater<>());
  impl->special_lengths.erase(
      std::unique(impl->special_lengths.begin(), impl->special_lengths.end()),
      impl->special_lengths.end());
  return Tokenizer(std::move(impl));
}

void Tokenizer::encode(std::string_view text, bool allow_special, std::vector<int32_t>& out,
                       size_t* replaced) const {
  std::string repaired;
  if (replaced) *replaced = 0;
  if (!is_valid_utf8(text)) {
    repaired = repair_utf8(text, replaced);
    text = repaired;
  }
  thread_local std::vector<Piece> chunks;
  const ScratchGuard<Piece> release_chunks(chunks);
  chunks.clear();
  chunk_text(text, chunks);
  for (const Piece& chunk : chunks) {
    const std::string_view part = text.substr(chunk.begin, chunk.end - chunk.begin);
    if (!allow_special) {
      impl_->encode_ordinary(part, out);
      continue;
    }
    size_t start = 0;
    for (size_t i = 0; i < part.size(); ++i) {
      if (!impl_->special_first_byte[static_cast<unsigned char>(part[i])]) continue;
      for (size_t length : impl_->special_lengths) {
        if (i + length > part.size()) continue;
        const auto it = impl_->special_by_name.find(part.substr(i, length));
        if (it == impl_->special_by_name.end()) continue;
        if (i > start) impl_->encode_ordinary(part.substr(start, i - start), out);
        out.push_back(it->second);
        start = i + length;
        i = start - 1;
        break;
      }
    }
    if (start < part.size()) impl_->encode_ordinary(part.substr(start), out);
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool allow_special) const {
  std::vector<int32_t> out;
  encode(text, allow_special, out);
  return out;
}

std::string_view Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return impl_->bytes_of(id);
}

std::string Tokenizer::decode_bytes(std::span<const int32_t> ids) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size())
      throw Error("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                  std::to_string(vocab_size()) + ")");
    out.append(impl_->bytes_of(id));
  }
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  return repair_utf8(decode_bytes(ids));
}

std::optional<int32_t> Tokenizer::special_id(std::string_view name) const {
  const auto it = impl_->special_by_name.find(name);
  if (it == impl_->special_by_name.end()) return std::nullopt;
  return it->second;
}

int32_t Tokenizer::base_vocab_size() const {
  return impl_->base_count;
}
int32_t Tokenizer::vocab_size() const {
  return impl_->base_count + kReservedSpecialCount;
}

}  // namespace k3::text
