// text/output_parser.cpp — the streaming demux of generated ids into reasoning, content and
// tool calls: a stack of open XTML elements driven by the four structural ids, with tag
// headers parsed from their decoded text (see output_parser.h for the rules).
#include "text/output_parser.h"

#include <nlohmann/json.hpp>

#include "text/tokenizer.h"

namespace k3::text {
namespace {

// ---- header text --------------------------------------------------------------------------

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

// `&quot;` → `"`, `&amp;` → `&`, left to right in one pass (the inverse of the renderer, which
// escapes `&` first); any other `&` stays as written.
std::string unescape_attribute(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (size_t i = 0; i < value.size();) {
    if (value.compare(i, 6, "&quot;") == 0) {
      out += '"';
      i += 6;
    } else if (value.compare(i, 5, "&amp;") == 0) {
      out += '&';
      i += 5;
    } else {
      out += value[i++];
    }
  }
  return out;
}

struct ParsedHeader {
  std::string name;
  std::vector<std::pair<std::string, std::string>> attributes;
};

// `TAG( KEY="VALUE")*`, whitespace around the parts tolerated. False when the text has any
// other shape.
bool parse_header(std::string_view text, ParsedHeader& out) {
  const size_t n = text.size();
  size_t i = 0;
  const auto skip_space = [&] {
    while (i < n && is_space(text[i])) ++i;
  };
  const auto read_word = [&] {
    const size_t start = i;
    while (i < n && !is_space(text[i]) && text[i] != '=' && text[i] != '"') ++i;
    return text.substr(start, i - start);
  };
  skip_space();
  out.name = std::string(read_word());
  if (out.name.empty()) return false;
  for (;;) {
    skip_space();
    if (i == n) return true;
    const std::string_view key = read_word();
    if (key.empty()) return false;
    skip_space();
    if (i == n || text[i] != '=') return false;
    ++i;
    skip_space();
    if (i == n || text[i] != '"') return false;
    ++i;
    const size_t quote = text.find('"', i);
    if (quote == std::string_view::npos) return false;
    out.attributes.emplace_back(std::string(key), unescape_attribute(text.substr(i, quote - i)));
    i = quote + 1;
  }
}

const std::string* find_attribute(
    const std::vector<std::pair<std::string, std::string>>& attributes, std::string_view key) {
  for (const auto& [name, value] : attributes)
    if (name == key) return &value;
  return nullptr;
}

// A decimal of at most 9 digits, else -1.
int parse_index(const std::string* text) {
  if (!text || text->empty() || text->size() > 9) return -1;
  int value = 0;
  for (char c : *text) {
    if (c < '0' || c > '9') return -1;
    value = value * 10 + (c - '0');
  }
  return value;
}

// ---- JSON text ----------------------------------------------------------------------------

// A JSON string literal as json.dumps(s, ensure_ascii=False) writes it (`s` is valid UTF-8).
std::string json_string(std::string_view utf8) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(utf8.size() + 2);
  out += '"';
  for (char c : utf8) {
    const auto byte = static_cast<unsigned char>(c);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (byte < 0x20) {
          out += "\\u00";
          out += kHex[byte >> 4];
          out += kHex[byte & 15];
        } else {
          out += c;
        }
    }
  }
  out += '"';
  return out;
}

std::string_view trim_json_space(std::string_view text) {
  while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
  return text;
}

// The JSON value an argument contributes: strings (and untyped values) quoted; any other type
// verbatim when it is valid JSON (strict RFC 8259: no NaN, no trailing garbage), else quoted so
// nothing is lost.
std::string argument_json(const std::string& type, bool has_type, const std::string& value) {
  if (!has_type || type == "string") return json_string(value);
  const std::string_view trimmed = trim_json_space(value);
  // accept() runs the parser with exceptions off and an explicit stack (no recursion).
  // nlohmann skips a leading byte-order mark that strict parsers reject: such text is a string.
  const bool bom = trimmed.size() >= 3 && trimmed.substr(0, 3) == "\xEF\xBB\xBF";
  if (!trimmed.empty() && !bom && nlohmann::json::accept(trimmed)) return std::string(trimmed);
  return json_string(value);
}

}  // namespace

// ---- OutputParser -------------------------------------------------------------------------

int OutputParser::level_of(Tag tag) {
  switch (tag) {
    case Tag::message:
      return 0;
    case Tag::think:
    case Tag::response:
    case Tag::tools:
      return 1;
    case Tag::call:
      return 2;
    case Tag::argument:
    case Tag::json:
      return 3;
  }
  return 3;
}

OutputParser::OutputParser(const Tokenizer& tokenizer, bool starts_in_think)
    : tokenizer_(&tokenizer) {
  // A vocabulary without these names leaves them at -1: everything is then text.
  open_id_ = tokenizer.special_id("<|open|>").value_or(-1);
  close_id_ = tokenizer.special_id("<|close|>").value_or(-1);
  sep_id_ = tokenizer.special_id("<|sep|>").value_or(-1);
  end_id_ = tokenizer.special_id("<|end_of_msg|>").value_or(-1);
  if (sep_id_ >= 0) sep_name_ = std::string(tokenizer.token_bytes(sep_id_));
  stack_ = {Tag::message, starts_in_think ? Tag::think : Tag::response};
}

void OutputParser::push(int32_t id, std::vector<OutputEvent>& events) {
  if (finished_) return;
  merge_from_ = events.size();
  push_one(id, events);
}

void OutputParser::push(std::span<const int32_t> ids, std::vector<OutputEvent>& events) {
  if (finished_) return;
  merge_from_ = events.size();
  for (int32_t id : ids) push_one(id, events);
}

void OutputParser::finish(std::vector<OutputEvent>& events) {
  if (finished_) return;
  merge_from_ = events.size();
  if (in_header_) abandon_header(events);
  pop_all(events);
  flush_channels(events);
  raw_text_ += raw_decoder_.finish();
  finished_ = true;
}

void OutputParser::push_one(int32_t id, std::vector<OutputEvent>& events) {
  const std::string_view bytes = tokenizer_->token_bytes(id);  // empty when out of range
  raw_text_ += raw_decoder_.push(bytes);
  if (tokenizer_->is_special(id)) {
    on_special(id, bytes, events);
  } else if (in_header_) {
    header_.append(bytes);
    if (header_.size() > kMaxHeaderBytes) abandon_header(events);
  } else {
    write_text(bytes, events);
  }
}

void OutputParser::on_special(int32_t id, std::string_view name, std::vector<OutputEvent>& events) {
  // A special's name is ASCII, so a UTF-8 sequence held back now can never complete (§5).
  flush_channels(events);
  const bool structural = id == open_id_ || id == close_id_ || id == end_id_;
  if (in_header_) {
    if (id == sep_id_) {
      on_header_end(events);
      flush_channels(events);
      return;
    }
    if (!structural) {  // another special inside a header: part of its (odd) text
      header_.append(name);
      if (header_.size() > kMaxHeaderBytes) abandon_header(events);
      return;
    }
    abandon_header(events);
    flush_channels(events);
  }
  if (id == open_id_ || id == close_id_) {
    in_header_ = true;
    header_closes_ = id == close_id_;
    header_.clear();
  } else if (id == end_id_) {
    end_message(events);
  } else {  // a stray `<|sep|>` or a non-structural special: text
    write_text(name, events);
    flush_channels(events);
  }
}

void OutputParser::on_header_end(std::vector<OutputEvent>& events) {
  in_header_ = false;
  const std::string_view prefix = tokenizer_->token_bytes(header_closes_ ? close_id_ : open_id_);
  std::string literal;
  literal.reserve(prefix.size() + header_.size() + sep_name_.size());
  literal.append(prefix).append(header_).append(sep_name_);

  static constexpr std::pair<std::string_view, Tag> kTags[] = {
      {"message", Tag::message}, {"think", Tag::think}, {"response", Tag::response},
      {"tools", Tag::tools},     {"call", Tag::call},   {"argument", Tag::argument},
      {"json", Tag::json}};
  ParsedHeader header;
  const bool parsed = parse_header(repair_utf8(header_), header);
  header_.clear();
  if (parsed) {
    for (const auto& [name, tag] : kTags) {
      if (header.name != name) continue;
      if (header_closes_) {
        close_element(tag, literal, events);
      } else {
        open_element(tag, header.attributes, literal, events);
      }
      return;
    }
  }
  write_text(literal, events);  // unknown tag or malformed header
}

void OutputParser::abandon_header(std::vector<OutputEvent>& events) {
  in_header_ = false;
  std::string literal(tokenizer_->token_bytes(header_closes_ ? close_id_ : open_id_));
  literal += header_;
  header_.clear();
  write_text(literal, events);
}

void OutputParser::open_element(Tag tag, const Attributes& attributes, std::string_view literal,
                                std::vector<OutputEvent>& events) {
  const int level = level_of(tag);
  // The element this one would nest in: the innermost open element of a lower level.
  const Tag* parent = nullptr;
  for (auto it = stack_.rbegin(); it != stack_.rend(); ++it) {
    if (level_of(*it) < level) {
      parent = &*it;
      break;
    }
  }
  bool placeable = true;
  if (tag == Tag::call) placeable = parent && *parent == Tag::tools;
  if (tag == Tag::argument) placeable = parent && *parent == Tag::call && !call_.has_json_block;
  if (tag == Tag::json) {
    placeable = parent && *parent == Tag::call && !call_.has_json_block && !call_.has_argument;
  }
  if (!placeable) {
    write_text(literal, events);
    return;
  }
  // Close what this element cannot nest in (an unclosed think before response, a call left
  // open before the next one, ...).
  while (!stack_.empty() && level_of(stack_.back()) >= level) {
    pop_element(/*explicit_close=*/false, events);
  }
  switch (tag) {
    case Tag::call: {
      call_ = CallBuilder{};
      const std::string* name = find_attribute(attributes, "tool");
      if (name) call_.name = *name;
      call_.declared_index = parse_index(find_attribute(attributes, "index"));
      break;
    }
    case Tag::argument: {
      argument_ = ArgumentBuilder{};
      const std::string* key = find_attribute(attributes, "key");
      const std::string* type = find_attribute(attributes, "type");
      if (key) argument_.key = *key;
      if (type) argument_.type = *type;
      argument_.has_type = type != nullptr;
      call_.has_argument = true;
      break;
    }
    case Tag::json:
      json_body_.clear();
      call_.has_json_block = true;
      break;
    default:
      break;
  }
  stack_.push_back(tag);
}

void OutputParser::close_element(Tag tag, std::string_view literal,
                                 std::vector<OutputEvent>& events) {
  size_t depth = stack_.size();
  while (depth > 0 && stack_[depth - 1] != tag) --depth;
  if (depth == 0) {  // not open: the close is text
    write_text(literal, events);
    return;
  }
  while (stack_.size() > depth) pop_element(/*explicit_close=*/false, events);
  pop_element(/*explicit_close=*/true, events);
}

void OutputParser::pop_element(bool explicit_close, std::vector<OutputEvent>& events) {
  const Tag tag = stack_.back();
  stack_.pop_back();
  switch (tag) {
    case Tag::argument: {
      const std::string value = repair_utf8(argument_.value);
      std::string json = argument_json(argument_.type, argument_.has_type, value);
      std::string key = repair_utf8(argument_.key);
      bool replaced = false;
      for (auto& [existing, existing_json] : call_.arguments) {
        if (existing == key) {
          existing_json = std::move(json);
          replaced = true;
          break;
        }
      }
      if (!replaced) call_.arguments.emplace_back(std::move(key), std::move(json));
      argument_ = ArgumentBuilder{};
      break;
    }
    case Tag::json:
      call_.json_block = repair_utf8(json_body_);
      json_body_.clear();
      break;
    case Tag::call: {
      OutputEvent event;
      event.kind = OutputEvent::Kind::tool_call;
      ToolCallOut& call = event.call;
      call.name = repair_utf8(call_.name);
      call.index = calls_emitted_++;
      call.declared_index = call_.declared_index;
      call.complete = explicit_close;
      if (call_.has_json_block) {
        call.arguments_json = std::move(call_.json_block);
      } else {
        std::string object(1, '{');
        for (size_t i = 0; i < call_.arguments.size(); ++i) {
          if (i) object += ',';
          object += json_string(call_.arguments[i].first);
          object += ':';
          object += call_.arguments[i].second;
        }
        object += '}';
        call.arguments_json = std::move(object);
      }
      call_ = CallBuilder{};
      events.push_back(std::move(event));
      break;
    }
    default:
      break;
  }
}

void OutputParser::pop_all(std::vector<OutputEvent>& events) {
  while (!stack_.empty()) pop_element(/*explicit_close=*/false, events);
}

void OutputParser::end_message(std::vector<OutputEvent>& events) {
  pop_all(events);
  flush_channels(events);
  OutputEvent event;
  event.kind = OutputEvent::Kind::end_of_message;
  events.push_back(std::move(event));
  saw_end_of_message_ = true;
}

bool OutputParser::think_open() const {
  for (Tag tag : stack_)
    if (tag == Tag::think) return true;
  return false;
}

bool OutputParser::writes_content(int32_t id) const {
  if (in_header_ || finished_ || id == open_id_ || id == close_id_ || id == end_id_) return false;
  if (!stack_.empty() && (stack_.back() == Tag::argument || stack_.back() == Tag::json))
    return false;
  return !think_open();
}

void OutputParser::write_text(std::string_view bytes, std::vector<OutputEvent>& events) {
  if (bytes.empty()) return;
  if (!stack_.empty() && stack_.back() == Tag::argument) {
    argument_.value.append(bytes);
  } else if (!stack_.empty() && stack_.back() == Tag::json) {
    json_body_.append(bytes);
  } else if (think_open()) {
    emit_text(OutputEvent::Kind::reasoning, reasoning_decoder_.push(bytes), events);
  } else {
    emit_text(OutputEvent::Kind::content, content_decoder_.push(bytes), events);
  }
}

void OutputParser::flush_channels(std::vector<OutputEvent>& events) {
  if (reasoning_decoder_.pending()) {
    emit_text(OutputEvent::Kind::reasoning, reasoning_decoder_.finish(), events);
  }
  if (content_decoder_.pending()) {
    emit_text(OutputEvent::Kind::content, content_decoder_.finish(), events);
  }
}

void OutputParser::emit_text(OutputEvent::Kind kind, std::string text,
                             std::vector<OutputEvent>& events) {
  if (text.empty()) return;
  if (events.size() > merge_from_ && events.back().kind == kind) {
    events.back().text += text;
    return;
  }
  OutputEvent event;
  event.kind = kind;
  event.text = std::move(text);
  events.push_back(std::move(event));
}

// ---- whole output -------------------------------------------------------------------------

ParsedOutput parse_output(const Tokenizer& tokenizer, std::span<const int32_t> ids,
                          bool starts_in_think) {
  OutputParser parser(tokenizer, starts_in_think);
  std::vector<OutputEvent> events;
  parser.push(ids, events);
  parser.finish(events);
  ParsedOutput out;
  for (OutputEvent& event : events) {
    switch (event.kind) {
      case OutputEvent::Kind::reasoning:
        out.reasoning += event.text;
        break;
      case OutputEvent::Kind::content:
        out.content += event.text;
        break;
      case OutputEvent::Kind::tool_call:
        out.tool_calls.push_back(std::move(event.call));
        break;
      case OutputEvent::Kind::end_of_message:
        break;
    }
  }
  out.raw_text = parser.raw_text();
  out.saw_end_of_message = parser.saw_end_of_message();
  return out;
}

}  // namespace k3::text
