// text/prompt.h — rendered chat segments to token ids (docs/chat_format.md §6.2): each segment is
// encoded on its own (segment borders are token borders); control segments with special
// spellings allowed, ordinary ones as plain text with the 400k/25k chunking.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "text/chat.h"
#include "text/tokenizer.h"

namespace k3::text {

void encode_segments(const Tokenizer& tokenizer, const std::vector<Segment>& segments,
                     std::vector<int32_t>& out);

// One CLI chat turn: optional system message, one user message, the generation prompt with the
// think channel open (`thinking`) or the response channel, and the thinking-effort message
// ("low" | "high" | "max"; "none" or empty for no message; ignored without thinking).
Result<std::vector<Segment>> one_turn_segments(const std::string& system, const std::string& user,
                                               bool thinking, const std::string& effort);

}  // namespace k3::text
