// engine/generate.h — the generation loop shared by the CLI and (later) the server: prefill the
// prompt, then sample one token at a time until a stop id, the token budget, or the caller
// cancels. The stop token itself is reported but never fed back into the model.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "engine/engine.h"
#include "engine/sampler.h"

namespace k3 {

enum class FinishReason { stop, length, cancelled };
const char* finish_reason_name(FinishReason reason);  // "stop", "length", "cancelled"

struct GenerateSettings {
  int64_t max_new_tokens = 16;
  std::vector<int64_t> stop_ids;  // see stop_ids()
};

struct GenerateResult {
  std::vector<int64_t> tokens;  // generated ids, the stop id included when one ended the run
  FinishReason finish = FinishReason::length;
  double prefill_seconds = 0;
  double decode_seconds = 0;
  int64_t decode_steps = 0;     // tokens fed back (the first token comes from the prefill)
};

// The ids that end a reply: `<|end_of_msg|>` read from the snapshot's tokenizer (163586 in the
// release) plus every eos_token_id of config.json, without duplicates.
std::vector<int64_t> stop_ids(const Engine& engine);

// Feeds `prompt`, then generates. `on_token` sees every generated id in order and may return
// false to stop before the next one (FinishReason::cancelled). Throws k3::Error from the model.
GenerateResult generate(Session& session, std::span<const int64_t> prompt, Sampler& sampler,
                        const GenerateSettings& settings, const std::function<bool(int64_t)>& on_token,
                        const PrefillHooks& hooks = {});

}  // namespace k3
