// engine/generate.cpp — the one generation loop: prefill, then sample/step until stop, budget or
// cancel.
#include "engine/generate.h"

#include <algorithm>

#include "engine/constraint.h"
#include "util/error.h"
#include "util/sys.h"

namespace k3 {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::stop:
      return "stop";
    case FinishReason::length:
      return "length";
    case FinishReason::tool_calls:
      return "tool_calls";
    case FinishReason::cancelled:
      return "cancelled";
  }
  return "?";
}

std::vector<int64_t> stop_ids(const Engine& engine) {
  std::vector<int64_t> ids;
  if (const auto end_of_message = engine.info().end_of_message_id) ids.push_back(*end_of_message);
  for (int64_t id : engine.info().eos_token_ids)
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  return ids;
}

GenerateResult generate(Session& session, std::span<const int64_t> ids, Sampler& sampler,
                        const GenerateSettings& settings, const GenerateHooks& hooks) {
  GenerateResult result;
  const double t0 = now_seconds();
  const int64_t n = static_cast<int64_t>(ids.size());
  // The session's own logits (valid until its next prefill or step): no copy of the vocabulary.
  std::span<const float> logits;
  try {
    session.set_interrupt(settings.cancel);
    if (settings.prefill_piece <= 0 && settings.splits.empty()) {
      logits = session.prefill(ids, hooks.prefill);
      if (hooks.on_prefilled) hooks.on_prefilled(n);
    } else {
      for (int64_t p = 0; p < n;) {
        int64_t end = settings.prefill_piece > 0 ? std::min(n, p + settings.prefill_piece) : n;
        for (int64_t split : settings.splits)
          if (split > p && split < end) end = split;
        logits = session.prefill(ids.subspan(static_cast<size_t>(p), static_cast<size_t>(end - p)),
                                 hooks.prefill);
        p = end;
        if (hooks.on_prefilled) hooks.on_prefilled(p);
      }
    }
    session.set_interrupt(nullptr);
  } catch (const Interrupted&) {
    session.set_interrupt(nullptr);
    result.finish = FinishReason::cancelled;
    result.cancelled_in_prefill = true;
    result.prefill_seconds = now_seconds() - t0;
    session.release_prefill_buffers();
    return result;
  } catch (...) {
    session.set_interrupt(nullptr);
    session.release_prefill_buffers();
    throw;
  }
  const double t1 = now_seconds();
  result.prefill_seconds = t1 - t0;
  session.release_prefill_buffers();  // decode steps are one row each (not timed as prefill)
  if (settings.max_new_tokens > 0 && logits.empty())
    throw Error("the model has no lm_head, so nothing can be generated");
  if (hooks.on_prefill_done) hooks.on_prefill_done();
  const auto cancelled = [&] { return settings.cancel && settings.cancel->load(); };
  for (int64_t j = 0; j < settings.max_new_tokens; ++j) {
    const int64_t id = static_cast<size_t>(j) < settings.scripted.size()
                           ? settings.scripted[static_cast<size_t>(j)]
                           : sampler.sample(logits);
    sampler.accept(id);
    if (hooks.on_logits) hooks.on_logits(id, logits);
    result.tokens.push_back(id);
    const TokenVerdict verdict = hooks.on_token(id);
    if (std::find(settings.stop_ids.begin(), settings.stop_ids.end(), id) !=
            settings.stop_ids.end() ||
        verdict == TokenVerdict::stop) {
      result.finish = FinishReason::stop;
      break;
    }
    if (verdict == TokenVerdict::cancel || cancelled()) {
      result.finish = FinishReason::cancelled;
      break;
    }
    if (j + 1 == settings.max_new_tokens) break;  // the budget is spent: no wasted step
    if (hooks.between_tokens) hooks.between_tokens();
    if (cancelled()) {
      result.finish = FinishReason::cancelled;
      break;
    }
    // Under a grammar the step's head computes only the ids it allows next (the sampler masks
    // the rest anyway), unless a hook reads every logit or a scripted token may leave it.
    if (!hooks.on_logits && settings.scripted.empty() && sampler.constraint())
      if (const std::vector<uint64_t>* allowed = sampler.constraint()->allowed_next())
        session.restrict_next_logits(*allowed);
    logits = session.step(id);
    ++result.decode_steps;
  }
  result.decode_seconds = now_seconds() - t1;
  return result;
}

GenerateResult generate(Session& session, std::span<const int64_t> prompt, Sampler& sampler,
                        const GenerateSettings& settings,
                        const std::function<bool(int64_t)>& on_token, const PrefillHooks& prefill) {
  GenerateHooks hooks;
  hooks.on_token = [&](int64_t id) {
    return on_token(id) ? TokenVerdict::next : TokenVerdict::cancel;
  };
  hooks.prefill = prefill;
  return generate(session, prompt, sampler, settings, hooks);
}

}  // namespace k3
