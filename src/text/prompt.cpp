// text/prompt.cpp — segments → ids, and the one-turn conversation of the CLI.
#include "text/prompt.h"

namespace k3::text {

void encode_segments(const Tokenizer& tokenizer, const std::vector<Segment>& segments,
                     std::vector<int32_t>& out) {
  for (const Segment& segment : segments) tokenizer.encode(segment.text, segment.special, out);
}

Result<std::vector<Segment>> one_turn_segments(const std::string& system, const std::string& user,
                                               bool thinking, const std::string& effort) {
  PyValue::Array messages;
  if (!system.empty())
    messages.push_back(PyValue::object(
        {{"role", PyValue::string("system")}, {"content", PyValue::string(system)}}));
  messages.push_back(
      PyValue::object({{"role", PyValue::string("user")}, {"content", PyValue::string(user)}}));
  ChatOptions options;
  options.thinking = thinking;
  if (thinking && !effort.empty() && effort != "none")
    options.thinking_effort = PyValue::string(effort);
  return build_chat_segments(PyValue::array(std::move(messages)), PyValue(), options);
}

}  // namespace k3::text
