// The answer's grammar enforced while sampling (engine/constraint.h).
#include "engine/constraint.h"

#include <chrono>
#include <limits>

#include "engine/generate.h"
#include "engine/internal.h"
#include "grammar/grammar.h"
#include "grammar/matcher.h"

namespace k3 {

namespace {

std::shared_ptr<const grammar::Vocabulary> vocabulary_of(const Engine& engine) {
  const Engine::Impl& e = engine.impl();
  std::call_once(e.vocabulary_once, [&] {
    const text::Tokenizer& tok = *e.tokenizer;
    std::vector<std::string> bytes(static_cast<size_t>(tok.vocab_size()));
    std::vector<bool> special(bytes.size(), false);
    for (size_t id = 0; id < bytes.size(); ++id) {
      special[id] = tok.is_special(static_cast<int32_t>(id));
      bytes[id] = std::string(tok.token_bytes(static_cast<int32_t>(id)));
    }
    e.vocabulary =
        std::make_shared<const grammar::Vocabulary>(std::move(bytes), std::move(special));
  });
  return e.vocabulary;
}

// A GBNF literal of plain text.
std::string literal(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

struct OutputConstraint::Impl {
  explicit Impl(grammar::Matcher m) : matcher(std::move(m)) {}
  grammar::Matcher matcher;
  int32_t open = -1, sep = -1;
  std::vector<int64_t> stops;
  bool active = false, broken = false;
  bool watching = false;  // inside an <|open|> header, before the answer began
  std::string header;
  const text::Tokenizer* tokenizer = nullptr;
  uint64_t masks = 0;
  double mask_seconds = 0;
};

Result<std::unique_ptr<OutputConstraint>> OutputConstraint::create(const Engine& engine,
                                                                   const ConstraintSpec& spec) {
  const text::Tokenizer* tok = engine.tokenizer();
  if (!tok) return Status::invalid("a grammar needs the model's tokenizer (tiktoken.model)");
  auto id_of = [&](const char* name) -> std::optional<int32_t> { return tok->special_id(name); };
  const auto open = id_of("<|open|>"), close = id_of("<|close|>"), sep = id_of("<|sep|>"),
             eom = id_of("<|end_of_msg|>");
  if (!eom) return Status::invalid("a grammar needs the tokenizer's <|end_of_msg|>");
  if (!spec.raw && (!open || !close || !sep))
    return Status::invalid("a grammar on a chat answer needs <|open|>, <|close|> and <|sep|>");
  auto tokref = [](int32_t id) { return "<[" + std::to_string(id) + "]>"; };
  std::string top;
  if (spec.raw) {
    top = "root " + tokref(*eom);
  } else {
    const std::string O = tokref(*open), C = tokref(*close), S = tokref(*sep);
    const std::string end_message = C + " \"message\" " + S + " " + tokref(*eom);
    if (spec.tools.empty()) {
      top = "root " + C + " \"response\" " + S + " " + end_message;
    } else {
      // <|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool="NAME" index="1"<|sep|>
      // <|open|>json type="object"<|sep|> ARGS <|close|>json<|sep|><|close|>call<|sep|>
      // <|close|>tools<|sep|> and the message's end (docs/chat_format.md §6.8).
      std::string calls;
      for (size_t i = 0; i < spec.tools.size(); ++i)
        calls += std::string(i ? " | " : "") + O + " " +
                 literal("call tool=\"" + spec.tools[i] + "\" index=\"1\"") + " " + S + " " + O +
                 " " + literal("json type=\"object\"") + " " + S + " tool-" + std::to_string(i);
      top = C + " \"response\" " + S + " " + O + " \"tools\" " + S + " ( " + calls + " ) " + C +
            " \"json\" " + S + " " + C + " \"call\" " + S + " " + C + " \"tools\" " + S + " " +
            end_message;
    }
  }
  std::unique_ptr<Impl> impl;
  try {
    auto g = std::make_shared<const grammar::Grammar>(
        grammar::Grammar::parse(spec.gbnf + "\nk3-answer ::= " + top + "\n", "k3-answer"));
    impl = std::make_unique<Impl>(grammar::Matcher(g, vocabulary_of(engine)));
  } catch (const grammar::GrammarError& e) {
    return Status::invalid(e.what());
  }
  impl->open = open.value_or(-1);
  impl->sep = sep.value_or(-1);
  impl->stops = stop_ids(engine);
  impl->active = spec.raw || spec.answer_open;
  impl->tokenizer = tok;
  return std::unique_ptr<OutputConstraint>(new OutputConstraint(std::move(impl)));
}

OutputConstraint::OutputConstraint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
OutputConstraint::~OutputConstraint() = default;

void OutputConstraint::mask(std::span<float> logits) {
  Impl& m = *impl_;
  if (m.broken) return;
  if (!m.active) {
    // The think channel is free, but the message may not end before the answer.
    for (int64_t id : m.stops)
      if (id >= 0 && static_cast<size_t>(id) < logits.size())
        logits[static_cast<size_t>(id)] = -std::numeric_limits<float>::infinity();
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  m.matcher.mask(logits);
  m.mask_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ++m.masks;
}

const std::vector<uint64_t>* OutputConstraint::allowed_next() {
  Impl& m = *impl_;
  if (m.broken || !m.active) return nullptr;
  // Built here (and counted in mask_seconds), then reused by mask() for the same state.
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<uint64_t>& allowed = m.matcher.allowed();
  m.mask_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return &allowed;
}

void OutputConstraint::accept(int64_t id) {
  Impl& m = *impl_;
  if (m.broken) return;
  if (m.active) {
    if (!m.matcher.accept_token(static_cast<int32_t>(id))) m.broken = true;
    return;
  }
  // Waiting for <|open|>response<|sep|>.
  if (id == m.open) {
    m.watching = true;
    m.header.clear();
  } else if (m.watching && id == m.sep) {
    m.watching = false;
    if (m.header == "response") m.active = true;
  } else if (m.watching) {
    if (m.tokenizer->is_special(static_cast<int32_t>(id)) || m.header.size() > 64)
      m.watching = false;
    else
      m.header += m.tokenizer->token_bytes(static_cast<int32_t>(id));
  }
}

bool OutputConstraint::active() const {
  return impl_->active;
}
bool OutputConstraint::complete() const {
  return impl_->active && impl_->matcher.finished();
}
bool OutputConstraint::broken() const {
  return impl_->broken;
}
uint64_t OutputConstraint::masks() const {
  return impl_->masks;
}
double OutputConstraint::mask_seconds() const {
  return impl_->mask_seconds;
}
size_t OutputConstraint::states() const {
  return impl_->matcher.state_count();
}

}  // namespace k3
