// engine/generate.h — the one generation loop, used by kimi_k3 (the CLI) and by the service's
// worker (coli serve, coli chat): prefill the ids, then sample one token at a time until a stop
// id, the token budget, or the caller stops or cancels. The stop token itself is reported but
// never fed back into the model. What differs between the callers (the output demux, stop
// strings, progress events, checkpoints, cancellation) are the hooks.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "engine/engine.h"
#include "engine/sampler.h"

namespace k3 {

// Why a generation ended. tool_calls: a stop after the reply made tool calls (set by the
// service's demux, never by the loop itself).
enum class FinishReason { stop, length, tool_calls, cancelled };
const char* finish_reason_name(FinishReason reason);  // "stop", "length", "tool_calls", "cancelled"

// What the caller says after seeing a generated id.
enum class TokenVerdict { next, stop, cancel };

struct GenerateSettings {
  int64_t max_new_tokens = 16;
  std::vector<int64_t> stop_ids;  // see stop_ids()
  // Prefill in pieces of this many ids (0 = all in one call); each of `splits` (offsets into the
  // ids, ascending; those outside (0, ids) are ignored) is also a piece boundary. The pieces
  // change when on_prefilled runs, never a logit.
  int64_t prefill_piece = 0;
  std::vector<int64_t> splits;
  // Polled before every layer of the prefill and between tokens (nullptr = never cancelled).
  const std::atomic<bool>* cancel = nullptr;
  // Tests: generated ids taken from this script (in order, then the sampler) instead of sampled.
  std::span<const int64_t> scripted;
};

// No hook may feed the session (prefill, step): generate reads the session's logits in place.
struct GenerateHooks {
  // Sees every generated id in order (required).
  std::function<TokenVerdict(int64_t id)> on_token;
  // Before on_token: the model's logits the id was chosen from (before the sampler's penalties),
  // e.g. for log-probabilities. Unset: nothing is done per token.
  std::function<void(int64_t id, std::span<const float> logits)> on_logits;
  // After each prefill piece, with the count of ids fed so far.
  std::function<void(int64_t fed)> on_prefilled;
  // After the prefill, before the first token is sampled.
  std::function<void()> on_prefill_done;
  // Between two generated tokens, before the next step (e.g. a debug delay).
  std::function<void()> between_tokens;
  PrefillHooks prefill;  // validation hooks of the prefill
};

struct GenerateResult {
  std::vector<int64_t> tokens;  // generated ids, the stop id included when one ended the run
  FinishReason finish = FinishReason::length;
  bool cancelled_in_prefill =
      false;  // finish == cancelled before any token: the session is part-fed
  double prefill_seconds = 0;
  double decode_seconds = 0;
  int64_t decode_steps = 0;  // tokens fed back (the first token comes from the prefill)
};

// The ids that end a reply: `<|end_of_msg|>` read from the model's tokenizer (163586 in the
// release) plus every eos_token_id of config.json, without duplicates.
std::vector<int64_t> stop_ids(const Engine& engine);

// Feeds `ids`, then generates. A cancel during the prefill returns finish cancelled with
// cancelled_in_prefill (the session is part-advanced: restore or reset it). Throws k3::Error
// from the model.
GenerateResult generate(Session& session, std::span<const int64_t> ids, Sampler& sampler,
                        const GenerateSettings& settings, const GenerateHooks& hooks);

// The CLI's form: `on_token` may return false to stop before the next token (cancelled).
GenerateResult generate(Session& session, std::span<const int64_t> prompt, Sampler& sampler,
                        const GenerateSettings& settings,
                        const std::function<bool(int64_t)>& on_token,
                        const PrefillHooks& hooks = {});

}  // namespace k3
