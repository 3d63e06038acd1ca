// engine/generate.cpp — prefill, then sample/step until stop, budget or cancel.
#include "engine/generate.h"

#include <algorithm>

#include "text/tokenizer.h"
#include "util/error.h"
#include "util/sys.h"

namespace k3 {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::cancelled: return "cancelled";
  }
  return "?";
}

std::vector<int64_t> stop_ids(const Engine& engine) {
  std::vector<int64_t> ids;
  if (const text::Tokenizer* tokenizer = engine.tokenizer())
    if (const auto end_of_message = tokenizer->special_id("<|end_of_msg|>")) ids.push_back(*end_of_message);
  for (int64_t id : engine.config().eos_token_ids)
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  return ids;
}

GenerateResult generate(Session& session, std::span<const int64_t> prompt, Sampler& sampler,
                        const GenerateSettings& settings, const std::function<bool(int64_t)>& on_token,
                        const PrefillHooks& hooks) {
  GenerateResult result;
  const double t0 = now_seconds();
  std::vector<float> logits = session.prefill(prompt, hooks);
  const double t1 = now_seconds();
  result.prefill_seconds = t1 - t0;
  if (settings.max_new_tokens > 0 && logits.empty())
    throw Error("the snapshot has no lm_head, so nothing can be generated");
  for (int64_t j = 0; j < settings.max_new_tokens; ++j) {
    const int64_t id = sampler.sample(logits);
    result.tokens.push_back(id);
    const bool keep_going = on_token(id);
    if (std::find(settings.stop_ids.begin(), settings.stop_ids.end(), id) != settings.stop_ids.end()) {
      result.finish = FinishReason::stop;
      break;
    }
    if (!keep_going) {
      result.finish = FinishReason::cancelled;
      break;
    }
    if (j + 1 == settings.max_new_tokens) break;  // the budget is spent: no wasted step
    logits = session.step(id);
    ++result.decode_steps;
  }
  result.decode_seconds = now_seconds() - t1;
  return result;
}

}  // namespace k3
