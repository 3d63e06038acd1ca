// The engine service on a demo checkpoint (real tokenizer, random weights): reused prefixes and
// restored checkpoints give the same greedy tokens as a cold run, and the reuse is observed (cached
// counts, restore positions) so the tests cannot pass vacuously; a cancelled prefill leaves the
// session as it was; corrupted disk checkpoints are rejected; admission and cancellation of
// waiters.
#include "engine/service.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "io/model_files.h"
#include "model/config.h"
#include "model/state.h"
#include "server/api.h"
#include "test_util.h"
#include "util/sys.h"

namespace k3 {
namespace {

struct Outcome {
  GenerationStats accepted, done;
  std::string reasoning, content, error;
  std::vector<ServiceEvent> progress;
};

Outcome collect(const std::shared_ptr<RequestHandle>& handle) {
  Outcome out;
  ServiceEvent e;
  for (int waited = 0; waited < 600; ++waited) {
    if (!handle->next(e, std::chrono::milliseconds(100))) continue;
    switch (e.kind) {
      case ServiceEvent::Kind::accepted:
        out.accepted = e.stats;
        break;
      case ServiceEvent::Kind::progress:
        out.progress.push_back(e);
        break;
      case ServiceEvent::Kind::reasoning:
        out.reasoning += e.text;
        break;
      case ServiceEvent::Kind::content:
        out.content += e.text;
        break;
      case ServiceEvent::Kind::done:
        out.done = e.stats;
        return out;
      case ServiceEvent::Kind::error:
        out.error = std::string(k3::service_error_name(e.error)) + ": " + e.text;
        return out;
      default:
        break;
    }
  }
  ADD_FAILURE() << "no done event within 60 s";
  return out;
}

ServiceOptions options(int slots, const std::string& dir = "") {
  ServiceOptions o;
  o.model_dir = testing::kDemoDir;
  o.context = 1024;
  o.ckpt_slots = slots;
  o.ckpt_dir = dir;
  return o;
}

// Prefill chunks of 8 (K3_CHUNK): a prompt prefilled alone then reports progress every 8 tokens,
// which the cancellation tests wait for before they cancel.
ServiceOptions small_chunks(ServiceOptions o) {
  o.load.chunk = 8;
  return o;
}

void wait_ready(EngineService& service) {
  for (int i = 0; i < 600 && !service.engine(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_NE(service.engine(), nullptr) << service.stats().load_error;
}

std::vector<int64_t> encode(EngineService& service, const std::string& text) {
  std::vector<int32_t> ids;
  service.engine()->tokenizer()->encode(text, false, ids);
  return {ids.begin(), ids.end()};
}

ServiceRequest greedy(std::vector<int64_t> prompt, int64_t max_tokens, int64_t anchor = 0) {
  ServiceRequest r;
  r.prompt = std::move(prompt);
  r.starts_in_think = false;  // everything the random model writes is content
  r.max_tokens = max_tokens;
  r.anchor = anchor;
  r.progress_every = 8;
  return r;
}

Outcome run(EngineService& service, ServiceRequest request) {
  auto handle = service.submit(std::move(request));
  EXPECT_TRUE(handle.ok()) << handle.status().message();
  if (!handle.ok()) return {};
  return collect(*handle);
}

// Text whose prompt takes dozens of prefill chunks of 8: there is time to cancel it midway.
std::string many_chunks_of_text() {
  std::string text;
  for (int i = 0; i < 40; ++i) text += " and the river kept flowing past the old mill";
  return text;
}

// Waits up to 60 s for a submitted request's first progress event: its prefill is under way.
bool prefill_started(const auto& handle) {
  ServiceEvent e;
  for (int i = 0; i < 600; ++i)
    if (handle->next(e, std::chrono::milliseconds(100)) && e.kind == ServiceEvent::Kind::progress)
      return true;
  return false;
}

std::vector<int64_t> concat(std::vector<int64_t> a, const std::vector<int64_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(Service, LiveReuseEqualsCold) {
  EngineService warm(options(2)), cold(options(0));
  wait_ready(warm);
  wait_ready(cold);
  const auto p1 = encode(warm, "The history of the printing press begins in");
  const auto p2 = concat(p1, encode(warm, " Mainz, where Gutenberg"));
  const Outcome first = run(warm, greedy(p1, 1));  // one token: nothing fed back, record == p1
  EXPECT_EQ(first.done.completion_tokens, 1);
  const Outcome reused = run(warm, greedy(p2, 12));
  EXPECT_EQ(reused.accepted.reuse, ReuseKind::live);
  EXPECT_EQ(reused.done.cached_tokens, static_cast<int64_t>(p1.size()));
  const Outcome fresh = run(cold, greedy(p2, 12));
  EXPECT_EQ(fresh.done.cached_tokens, 0);
  EXPECT_FALSE(fresh.content.empty());
  EXPECT_EQ(reused.content, fresh.content);
}

TEST(Service, FollowUpAndEditedTurnRestoreCheckpointsAndEqualCold) {
  EngineService warm(options(2)), cold(options(0));
  wait_ready(warm);
  wait_ready(cold);
  const auto head = encode(warm, "System: be brief.\nUser: name three rivers.\nAssistant:");
  const auto turn1 = run(warm, greedy(head, 10));
  EXPECT_EQ(turn1.done.finish, k3::FinishReason::length);
  // A follow-up that does not extend the record (the reply is re-rendered differently): the
  // checkpoint at the anchor (the start of the last message) is the deepest that matches.
  const auto question2 = encode(warm, " The Nile.\nUser: and three lakes?\nAssistant:");
  const auto p2 = concat(head, question2);
  const int64_t anchor2 = static_cast<int64_t>(head.size());
  const Outcome follow = run(warm, greedy(p2, 10, anchor2));
  EXPECT_EQ(follow.accepted.reuse, ReuseKind::checkpoint);
  EXPECT_EQ(follow.done.restored_at, static_cast<int64_t>(head.size()));
  EXPECT_EQ(follow.done.cached_tokens, static_cast<int64_t>(head.size()));
  EXPECT_EQ(follow.content, run(cold, greedy(p2, 10)).content);
  // The last turn edited: resumes at the anchor checkpoint and prefills only the new last message.
  const auto edited =
      concat(head, encode(warm, " The Nile.\nUser: and three mountains?\nAssistant:"));
  const Outcome edit = run(warm, greedy(edited, 10, anchor2));
  EXPECT_EQ(edit.accepted.reuse, ReuseKind::checkpoint);
  EXPECT_EQ(edit.done.cached_tokens, anchor2);
  EXPECT_EQ(edit.content, run(cold, greedy(edited, 10)).content);
  // Regenerate the same prompt: the record is longer than the prompt, the anchor checkpoint serves.
  const Outcome again = run(warm, greedy(edited, 10, anchor2));
  EXPECT_EQ(again.done.cached_tokens, anchor2);
  EXPECT_EQ(again.content, edit.content);
  EXPECT_GE(warm.stats().reuse_checkpoint, 3);
}

// A chat (every turn anchored at its last message) with 2 slots: a follow-up whose history is
// re-rendered differently resumes at the previous prompt's end whatever the reply was (the reply
// differs by ISA), and an edit of the new last message still finds the anchor checkpoint.
TEST(Service, AnchoredFollowUpResumesAtThePreviousPromptsEnd) {
  EngineService warm(options(2)), cold(options(0));
  wait_ready(warm);
  wait_ready(cold);
  const auto head1 = encode(warm, "System: be brief.\n");
  const auto p1 = concat(head1, encode(warm, "User: name three rivers.\nAssistant:"));
  run(warm, greedy(p1, 10, static_cast<int64_t>(head1.size())));
  const auto head2 = concat(p1, encode(warm, " The Nile.\n"));
  const int64_t anchor2 = static_cast<int64_t>(head2.size());
  const auto p2 = concat(head2, encode(warm, "User: and three lakes?\nAssistant:"));
  const Outcome follow = run(warm, greedy(p2, 10, anchor2));
  EXPECT_EQ(follow.accepted.reuse, ReuseKind::checkpoint);
  EXPECT_EQ(follow.done.restored_at, static_cast<int64_t>(p1.size()));
  EXPECT_EQ(follow.content, run(cold, greedy(p2, 10)).content);
  const auto edited = concat(head2, encode(warm, "User: and three mountains?\nAssistant:"));
  const Outcome edit = run(warm, greedy(edited, 10, anchor2));
  EXPECT_EQ(edit.done.restored_at, anchor2);
  EXPECT_EQ(edit.content, run(cold, greedy(edited, 10)).content);
}

TEST(Service, CancelledPrefillRollsBackToWhereItStarted) {
  EngineService warm(small_chunks(options(2))), cold(options(0));
  wait_ready(warm);
  wait_ready(cold);
  const auto p1 = encode(warm, "Once upon a time in a small village");
  run(warm, greedy(p1, 1));  // record == p1
  const std::string long_text = many_chunks_of_text();
  const auto p2 = concat(p1, encode(warm, long_text));
  auto handle = warm.submit(greedy(p2, 4));
  ASSERT_TRUE(handle.ok());
  ASSERT_TRUE(prefill_started(*handle));
  warm.cancel(*handle);
  const Outcome cancelled = collect(*handle);
  EXPECT_EQ(cancelled.done.finish, k3::FinishReason::cancelled);
  // Cancellation is polled before every layer, so the prefill stops inside the chunk in flight:
  // bounded in events (progress reports after the cancel, of the tail's ~50 chunks), not seconds.
  const size_t chunks = (p2.size() - p1.size() + 7) / 8;
  EXPECT_LT(cancelled.progress.size(), chunks / 2) << "the prefill ran on after the cancel";
  if (!cancelled.progress.empty()) {
    EXPECT_LT(cancelled.progress.back().processed, static_cast<int64_t>(p2.size()));
  }
  EXPECT_EQ(warm.stats().cancelled_prefill, 1);
  EXPECT_EQ(warm.stats().fed_tokens, static_cast<int64_t>(p1.size()));  // rolled back, not reset
  // The next request extends p1 again: live reuse of the rolled-back state, same as cold.
  const auto p3 = concat(p1, encode(warm, " there lived a miller"));
  const Outcome next = run(warm, greedy(p3, 8));
  EXPECT_EQ(next.accepted.reuse, ReuseKind::live);
  EXPECT_EQ(next.done.cached_tokens, static_cast<int64_t>(p1.size()));
  EXPECT_EQ(next.content, run(cold, greedy(p3, 8)).content);
}

// A prompt's chunks grow its session's scratch to chunk rows of every stage: the service gives
// them back once the prompt is in (the decode steps run one row) and when a cancel cuts the
// prompt, so an idle session holds what a short prompt left, not a chunk's worth.
TEST(Service, IdleSessionsHoldNoPromptScratch) {
  EngineService service(small_chunks(options(0)));
  wait_ready(service);
  const k3::Engine& engine = *service.engine();
  const k3::ModelFiles files(testing::kDemoDir);
  const uint64_t row = k3::Workspace::row_bytes(
      k3::parse_k3_config(files.config_root(), testing::kDemoDir + "/config.json"));
  // A short prompt and two decode steps: the session's one row, the decode batch's row and its
  // logits.
  run(service, greedy(encode(service, "Hi"), 3));
  const uint64_t idle = engine.memory().activations;
  const std::string long_text = many_chunks_of_text();
  const auto long_prompt = encode(service, long_text);
  ASSERT_GT(long_prompt.size(), 64u);
  const Outcome whole = run(service, greedy(long_prompt, 3));
  EXPECT_EQ(whole.done.completion_tokens, 3);
  EXPECT_LT(engine.memory().activations, idle + 2 * row) << "after a whole prompt";

  auto handle = service.submit(greedy(concat(long_prompt, long_prompt), 3));
  ASSERT_TRUE(handle.ok());
  ASSERT_TRUE(prefill_started(*handle));
  service.cancel(*handle);
  EXPECT_EQ(collect(*handle).done.finish, k3::FinishReason::cancelled);
  // The slot is released just after its last event: wait for the service to be idle.
  for (int i = 0; i < 200 && service.stats().active > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_LT(engine.memory().activations, idle + 2 * row) << "after a cancelled prompt";
}

// ServiceRequest::keep (coli chat: the start and the end of the last user message): the kept
// positions are saved during the prefill and outlive the checkpoints not kept, so with 2 slots a
// regenerate of the same prompt resumes at the end of the user message instead of its start, and
// a cancelled prefill whose own start could not be saved (every slot kept) rolls back to the
// deepest kept checkpoint instead of resetting the session.
TEST(Service, KeptCheckpointsServeARegenerateAndACancelledPrefill) {
  EngineService warm(small_chunks(options(2))), cold(options(0));
  wait_ready(warm);
  wait_ready(cold);
  const auto system = encode(warm, "System: be brief.\n");
  const auto user = concat(system, encode(warm, "User: name three rivers.\n"));
  const auto p1 = concat(user, encode(warm, "Assistant:"));
  const int64_t start_of_user = static_cast<int64_t>(system.size());
  const int64_t end_of_user = static_cast<int64_t>(user.size());
  auto kept = [&](std::vector<int64_t> prompt, int64_t max_tokens) {
    ServiceRequest r = greedy(std::move(prompt), max_tokens, start_of_user);
    r.keep = {start_of_user, end_of_user};
    return r;
  };
  const Outcome first = run(warm, kept(p1, 10));
  const Outcome again = run(warm, kept(p1, 10));
  EXPECT_EQ(again.accepted.reuse, ReuseKind::checkpoint);
  EXPECT_EQ(again.done.restored_at, end_of_user);
  EXPECT_EQ(again.content, first.content);
  EXPECT_EQ(again.content, run(cold, greedy(p1, 10)).content);

  run(warm, kept(p1, 1));  // one token, not fed back: the record is p1
  const std::string long_text = many_chunks_of_text();
  auto handle = warm.submit(kept(concat(p1, encode(warm, long_text)), 4));
  ASSERT_TRUE(handle.ok());
  ASSERT_TRUE(prefill_started(*handle));
  warm.cancel(*handle);
  EXPECT_EQ(collect(*handle).done.finish, k3::FinishReason::cancelled);
  EXPECT_EQ(warm.stats().fed_tokens, end_of_user) << "not rolled back to the kept checkpoint";
  const auto p3 = concat(p1, encode(warm, " there lived a miller"));
  const Outcome next = run(warm, kept(p3, 8));
  EXPECT_EQ(next.accepted.reuse, ReuseKind::live);
  EXPECT_EQ(next.done.cached_tokens, end_of_user);
  EXPECT_EQ(next.content, run(cold, greedy(p3, 8)).content);
}

TEST(Service, DiskCheckpointsArePrivateCheckedAndRemoved) {
  const testing::TempDir root("service-ckpt");
  const std::string dir = root.path() + "/checkpoints";
  {
    EngineService warm(options(2, dir)), cold(options(0));
    wait_ready(warm);
    wait_ready(cold);
    struct stat st {};
    ASSERT_EQ(::stat(dir.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0700u);  // created by the store, so private
    // The files live in the store's own private subdirectory (docs/serving.md §3.10.4).
    std::vector<std::string> subs;
    for (const auto& e : std::filesystem::directory_iterator(dir))
      subs.push_back(e.path().string());
    ASSERT_EQ(subs.size(), 1u);
    const std::string sub = subs[0];
    EXPECT_NE(warm.stats().checkpoints.find(sub), std::string::npos) << warm.stats().checkpoints;
    ASSERT_EQ(::stat(sub.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0700u);
    const auto head = encode(warm, "User: list four colours.\nAssistant:");
    run(warm, greedy(head, 6));
    const auto p2 = concat(head, encode(warm, " Red.\nUser: more?\nAssistant:"));
    const int64_t anchor = static_cast<int64_t>(head.size());
    const Outcome first = run(warm, greedy(p2, 6, anchor));
    EXPECT_EQ(first.done.restored_at, anchor);
    int files = 0;
    for (int slot = 0; slot < 2; ++slot) {
      const std::string path = sub + "/k3_ckpt_" + std::to_string(slot) + ".bin";
      if (::stat(path.c_str(), &st) != 0) continue;
      ++files;
      EXPECT_EQ(st.st_mode & 0777, 0600u) << path;
    }
    EXPECT_EQ(files, 2);
    // Corrupt every checkpoint's payload: a restore must reject them and fall back to a cold
    // prefill.
    for (int slot = 0; slot < 2; ++slot) {
      std::fstream f(sub + "/k3_ckpt_" + std::to_string(slot) + ".bin",
                     std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(100);
      const char junk[8] = {1, 2, 3, 4, 5, 6, 7, 8};
      f.write(junk, sizeof junk);
    }
    const auto edited = concat(head, encode(warm, " Blue.\nUser: why?\nAssistant:"));
    const Outcome after = run(warm, greedy(edited, 6, anchor));
    EXPECT_EQ(after.accepted.reuse, ReuseKind::none);
    EXPECT_GE(warm.stats().ckpt.rejected, 1);
    EXPECT_EQ(after.content, run(cold, greedy(edited, 6)).content);
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << "checkpoints left behind";
}

// Waits until the service is ready or failed; returns its stats.
ServiceStats settled(EngineService& service) {
  for (int i = 0; i < 1200; ++i) {
    const ServiceStats s = service.stats();
    if (s.state != ServiceStats::State::loading) return s;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ADD_FAILURE() << "still loading after 60 s";
  return service.stats();
}

// --ckpt-dir with the default --ckpt auto means disk checkpoints in that directory (issue 28,
// item 8: they stayed in RAM and the directory went unchecked); a directory others may write to,
// or a plain file, stops the start before the weights load, and that is not a load failure.
TEST(Service, CkptDirUnderAutoMeansDiskCheckpointsThere) {
  const testing::TempDir root("service-ckpt-auto");
  const std::string dir = root.file("disk");
  {
    EngineService service(options(-1, dir));
    const ServiceStats s = settled(service);
    ASSERT_EQ(s.state, ServiceStats::State::ready) << s.load_error;
    EXPECT_HAS(s.checkpoints, "disk " + dir + "/k3-ckpt-");
    EXPECT_EQ(s.ckpt_slots, 2);
  }
  const std::string open = root.file("open");
  std::filesystem::create_directory(open);
  ASSERT_EQ(::chmod(open.c_str(), 0777), 0);
  const std::string file = root.file("file");
  std::ofstream(file) << "x";
  for (const auto& [path, why] :
       {std::pair<std::string, std::string>{open, "writable by other users"},
        {file, "not a directory"}}) {
    SCOPED_TRACE(path);
    EngineService service(options(-1, path));
    const ServiceStats s = settled(service);
    EXPECT_EQ(s.state, ServiceStats::State::failed);
    EXPECT_EQ(s.failed_step, "checkpoint directory (--ckpt-dir)");
    EXPECT_HAS(s.load_error, path + ": the checkpoint directory");
    EXPECT_HAS(s.load_error, why);
    EXPECT_EQ(s.load_progress, 0.0) << "refused before the weights load";
  }
  // A model that fails to load is still named as such.
  ServiceOptions missing = options(-1);
  missing.model_dir = root.file("no-model");
  EngineService service(missing);
  const ServiceStats s = settled(service);
  EXPECT_EQ(s.state, ServiceStats::State::failed);
  EXPECT_EQ(s.failed_step, "cannot load " + missing.model_dir);
}

TEST(Service, QueueIsBoundedAndCancelledWaitersLeaveAtOnce) {
  ServiceOptions o = options(0);
  o.max_queue = 1;
  o.token_delay_ms = 20;
  EngineService service(o);
  wait_ready(service);
  const auto prompt = encode(service, "Count slowly:");
  auto active = service.submit(greedy(prompt, 60));
  ASSERT_TRUE(active.ok());
  ServiceEvent e;
  ASSERT_TRUE((*active)->next(e, std::chrono::seconds(30)));
  EXPECT_EQ(e.kind, ServiceEvent::Kind::accepted);
  auto waiter = service.submit(greedy(prompt, 4));
  ASSERT_TRUE(waiter.ok());
  auto refused = service.submit(greedy(prompt, 4));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Status::Code::resource_exhausted);
  EXPECT_NE(refused.status().message().find(
                "1 waiting behind the running request, the limit (--max-queue"),
            std::string::npos)
      << refused.status().message();
  EXPECT_EQ(service.stats().queued, 1u);
  service.cancel(*waiter);
  EXPECT_EQ(service.stats().queued, 0u);  // gone at once, not when the worker gets to it
  const Outcome w = collect(*waiter);
  EXPECT_NE(w.error.find("cancelled"), std::string::npos);
  const Outcome a = collect(*active);
  EXPECT_EQ(a.done.completion_tokens, 60);
  EXPECT_EQ(service.stats().admitted, 1);  // the cancelled waiter never reached the engine
}

TEST(Service, StopStringsAreWithheldAndEndTheReply) {
  EngineService service(options(0));
  wait_ready(service);
  const auto prompt = encode(service, "Write a list:");
  const Outcome full = run(service, greedy(prompt, 24));
  ASSERT_GE(full.content.size(), 12u);
  // A stop string taken from the middle of the greedy text, cut at a UTF-8 boundary.
  size_t from = full.content.size() / 2;
  while (from > 0 && (static_cast<unsigned char>(full.content[from]) & 0xC0) == 0x80) --from;
  size_t to = from + 3;
  while (to < full.content.size() && (static_cast<unsigned char>(full.content[to]) & 0xC0) == 0x80)
    ++to;
  const std::string stop = full.content.substr(from, to - from);
  ServiceRequest r = greedy(prompt, 24);
  r.stop = {"\x01never", stop};
  const Outcome stopped = run(service, r);
  EXPECT_EQ(stopped.done.finish, k3::FinishReason::stop);
  EXPECT_EQ(stopped.content, full.content.substr(0, full.content.find(stop)));
  EXPECT_LT(stopped.done.completion_tokens, 24);
}

TEST(Service, RefusesPromptsThatDoNotFitAndReportsLoading) {
  ServiceOptions o = options(0);
  o.context = 16;
  EngineService service(o);
  auto early = service.submit(greedy({1, 2, 3}, 2));  // may still be loading
  if (!early.ok()) {
    EXPECT_EQ(early.status().code(), Status::Code::unavailable);
  }
  wait_ready(service);
  std::vector<int64_t> long_prompt(16, 100);
  auto refused = service.submit(greedy(long_prompt, 2));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Status::Code::invalid_argument);
  EXPECT_EQ(
      refused.status().message(),
      "the prompt has 16 tokens and the reply needs at least 1 more, 17 in all, but the "
      "context holds 16 (--ctx / COLI_CTX): raise --ctx to 17 or more, or shorten the prompt");
  const Outcome clamped = run(service, greedy(std::vector<int64_t>(12, 100), 100));
  EXPECT_EQ(clamped.done.completion_tokens, 4);  // clamped to the context room
}

// The context refusal every front end shows (the server's context_length_exceeded, coli chat,
// kimi_k3 with --ngen): the prompt's length, the reply's room, the context and the setting.
TEST(Service, ContextOverflowMessageNamesEveryNumberAndTheSetting) {
  EXPECT_EQ(context_overflow_message("the prompt", 11000, 8192),
            "the prompt has 11000 tokens and the reply needs at least 1 more, 11001 in all, but "
            "the context holds 8192 (--ctx / COLI_CTX): raise --ctx to 11001 or more, or shorten "
            "the prompt");
  EXPECT_EQ(context_overflow_message("the prompt", 2, 3, 4, "--ngen 4"),
            "the prompt has 2 tokens and the reply needs 4 more (--ngen 4), 6 in all, but the "
            "context holds 3 (--ctx / COLI_CTX): raise --ctx to 6 or more, or shorten the prompt");
  EXPECT_EQ(context_overflow_message("the conversation", 900, 512),
            "the conversation has 900 tokens and the reply needs at least 1 more, 901 in all, but "
            "the context holds 512 (--ctx / COLI_CTX): raise --ctx to 901 or more, or shorten the "
            "conversation");
  // Beyond the largest --ctx (2^24) only shortening helps.
  const std::string huge = context_overflow_message("the prompt", int64_t{1} << 24, 8192);
  EXPECT_NE(huge.find("shorten the prompt (--ctx goes up to 16777216)"), std::string::npos) << huge;
  EXPECT_EQ(huge.find("raise"), std::string::npos) << huge;
}

TEST(Service, ChatAnchorIsThePrefixBeforeTheLastMessage) {
  EngineService service(options(0));
  wait_ready(service);
  server::ApiConfig api;
  const char* body = R"({"model":"kimi-k3","messages":[
      {"role":"system","content":"Be brief."},
      {"role":"user","content":"Capital of France?"},
      {"role":"assistant","content":"Paris.","reasoning_content":"Easy."},
      {"role":"user","content":"And Italy?"}]})";
  auto parsed = server::parse_chat_request(body, api);
  ASSERT_TRUE(std::holds_alternative<server::ChatRequest>(parsed));
  auto rendered = server::render_chat_prompt(std::get<server::ChatRequest>(parsed),
                                             *service.engine()->tokenizer());
  ASSERT_TRUE(std::holds_alternative<server::RenderedPrompt>(rendered));
  const auto& prompt = std::get<server::RenderedPrompt>(rendered);
  EXPECT_GT(prompt.anchor, 10);
  EXPECT_LT(prompt.anchor, static_cast<int64_t>(prompt.ids.size()) - 5);
}

// Random weights never write a valid call, so the reply is scripted: the service parses it into
// reasoning, content and a tool call, ends with finish_reason tool_calls, and the API layer turns
// that into OpenAI's tool_calls; the request's tool declarations reach the rendered prompt.
TEST(Service, ScriptedToolCallBecomesOpenAIToolCalls) {
  ServiceOptions o = options(0);
  EngineService probe(o);
  wait_ready(probe);
  const text::Tokenizer& tokenizer = *probe.engine()->tokenizer();
  std::vector<int32_t> script32;
  tokenizer.encode(
      "Weather needs a "
      "tool.<|close|>think<|sep|><|open|>response<|sep|>Checking.<|close|>response<|sep|>"
      "<|open|>tools<|sep|><|open|>call tool=\"get_weather\" index=\"1\"<|sep|>"
      "<|open|>argument key=\"city\" type=\"string\"<|sep|>Paris<|close|>argument<|sep|>"
      "<|open|>argument key=\"days\" type=\"number\"<|sep|>2<|close|>argument<|sep|>"
      "<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>",
      true, script32);
  o.scripted_tokens.assign(script32.begin(), script32.end());
  EngineService service(o);
  wait_ready(service);

  server::ApiConfig api;
  auto parsed = server::parse_chat_request(
      R"({"model":"kimi-k3","messages":[{"role":"user","content":"Weather in Paris?"}],
      "tools":[{"type":"function","function":{"name":"get_weather","description":"Current weather",
      "parameters":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"number"}}}}}]})",
      api);
  ASSERT_TRUE(std::holds_alternative<server::ChatRequest>(parsed));
  const auto& request = std::get<server::ChatRequest>(parsed);
  auto rendered = server::render_chat_prompt(request, tokenizer);
  ASSERT_TRUE(std::holds_alternative<server::RenderedPrompt>(rendered));
  std::vector<int32_t> prompt32(std::get<server::RenderedPrompt>(rendered).ids.begin(),
                                std::get<server::RenderedPrompt>(rendered).ids.end());
  const std::string prompt_text = tokenizer.decode(prompt32);
  EXPECT_NE(prompt_text.find("get_weather"), std::string::npos);
  EXPECT_NE(prompt_text.find("Current weather"), std::string::npos);

  ServiceRequest r;
  r.prompt = std::get<server::RenderedPrompt>(rendered).ids;
  r.starts_in_think = true;
  r.max_tokens = 200;
  auto handle = service.submit(r);
  ASSERT_TRUE(handle.ok());
  server::ChatResult result;
  ServiceEvent e;
  for (int i = 0; i < 600; ++i) {
    if (!(*handle)->next(e, std::chrono::milliseconds(100))) continue;
    if (e.kind == ServiceEvent::Kind::reasoning) result.reasoning += e.text;
    if (e.kind == ServiceEvent::Kind::content) result.content += e.text;
    if (e.kind == ServiceEvent::Kind::tool_call) result.tool_calls.push_back(e.call);
    if (e.kind == ServiceEvent::Kind::done) {
      result.stats = e.stats;
      break;
    }
  }
  EXPECT_EQ(result.reasoning, "Weather needs a tool.");
  EXPECT_EQ(result.content, "Checking.");
  EXPECT_EQ(result.stats.finish, k3::FinishReason::tool_calls);
  EXPECT_EQ(result.stats.completion_tokens, static_cast<int64_t>(script32.size()));
  const server::json out =
      server::chat_completion_json(result, request, api, server::new_response_ids());
  ASSERT_EQ(out["choices"][0]["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(out["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(out["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"],
            R"({"city":"Paris","days":2})");
  EXPECT_EQ(out["choices"][0]["finish_reason"], "tool_calls");
}

// An engine fault mid-reply (here: a scripted id outside the vocabulary reaches the model) fails
// that request with engine_error after its text so far, resets the session, and the service
// keeps serving.
TEST(Service, EngineFaultFailsTheRequestAndServingGoesOn) {
  ServiceOptions o = options(2);
  o.scripted_tokens = {1000, 1001, 1002, -5};  // the 4th is fed back and faults
  EngineService service(o);
  wait_ready(service);
  const auto prompt = encode(service, "Tell me a story");
  const Outcome failed = run(service, greedy(prompt, 8));
  EXPECT_NE(failed.error.find("engine_error"), std::string::npos) << failed.error;
  EXPECT_FALSE(failed.content.empty());  // what was generated before the fault was delivered
  EXPECT_EQ(service.stats().failed, 1);
  EXPECT_EQ(service.stats().failed_in_a_row, 1);  // /health reports degraded
  EXPECT_FALSE(service.stats().last_failure.empty());
  EXPECT_EQ(service.stats().fed_tokens, 0);              // reset, not half-fed
  const Outcome next = run(service, greedy(prompt, 3));  // the last token is never fed: no fault
  EXPECT_TRUE(next.error.empty()) << next.error;
  EXPECT_EQ(next.done.completion_tokens, 3);
  EXPECT_EQ(next.done.cached_tokens, 0);
  EXPECT_EQ(service.stats().failed_in_a_row, 0);  // a normal end clears it
}

// --- N sessions (ServiceOptions::parallel, coli serve --parallel) ---

ServiceOptions parallel_options(int parallel, int slots = 2) {
  ServiceOptions o = options(slots);
  o.parallel = parallel;
  return o;
}

// Waits for the accepted event; returns it.
GenerationStats accepted(const std::shared_ptr<RequestHandle>& handle) {
  ServiceEvent e;
  for (int i = 0; i < 600; ++i)
    if (handle->next(e, std::chrono::milliseconds(100))) {
      if (e.kind == ServiceEvent::Kind::accepted) return e.stats;
      ADD_FAILURE() << "first event is not accepted: " << e.text;
      return {};
    }
  ADD_FAILURE() << "no accepted event within 60 s";
  return {};
}

// A service of `parallel` sessions that decode in batches, `token_delay_ms` apart (so that the
// replies overlap however the threads are scheduled), and one that runs each request alone; both
// loaded.
struct BatchedAndSolo {
  BatchedAndSolo(int parallel, int token_delay_ms)
      : batched([&] {
          ServiceOptions o = parallel_options(parallel, 0);
          o.token_delay_ms = token_delay_ms;
          return o;
        }()),
        solo(options(0)) {
    wait_ready(batched);
    wait_ready(solo);
  }
  EngineService batched, solo;
};

// Four requests at once on four sessions: each answer (greedy, seeded sampling with penalties,
// logprobs, a stop string) equals the same request run alone, and the decode steps did batch
// them (a request saw a step of more than one session).
TEST(ServiceParallel, ConcurrentAnswersEqualTheirSoloRuns) {
  BatchedAndSolo services(4, 2);
  auto& [batched, solo] = services;
  std::vector<ServiceRequest> requests;
  requests.push_back(greedy(encode(solo, "The history of the printing press begins in"), 20));
  requests.push_back(greedy(encode(solo, "Rivers:"), 14));  // ends early
  ServiceRequest sampled = greedy(encode(solo,
                                         "A long list of colours, animals and the names of "
                                         "the old towns along the river"),
                                  20);
  sampled.sampling.temperature = 0.9;
  sampled.sampling.top_k = 40;
  sampled.sampling.seed = 1234;
  sampled.penalties.frequency_penalty = 0.5;
  sampled.penalties.repeat_penalty = 1.2;
  requests.push_back(sampled);
  ServiceRequest logprobs = greedy(encode(solo, "Once upon a time"), 18);
  logprobs.top_logprobs = 3;
  requests.push_back(logprobs);
  std::vector<Outcome> alone;
  for (const ServiceRequest& r : requests) alone.push_back(run(solo, r));
  // A stop string from the middle of the first solo answer.
  ASSERT_GE(alone[0].content.size(), 8u);
  size_t from = alone[0].content.size() / 2;
  while (from > 0 && (static_cast<unsigned char>(alone[0].content[from]) & 0xC0) == 0x80) --from;
  requests[0].stop = {alone[0].content.substr(from, 1)};
  alone[0] = run(solo, requests[0]);

  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (const ServiceRequest& r : requests) {
    auto h = batched.submit(r);
    ASSERT_TRUE(h.ok()) << h.status().message();
    handles.push_back(*h);
  }
  std::vector<int> sessions;
  int64_t widest = 0;
  for (size_t i = 0; i < handles.size(); ++i) {
    SCOPED_TRACE(i);
    const Outcome together = collect(handles[i]);
    EXPECT_TRUE(together.error.empty()) << together.error;
    EXPECT_EQ(together.content, alone[i].content);
    EXPECT_EQ(together.reasoning, alone[i].reasoning);
    EXPECT_EQ(together.done.finish, alone[i].done.finish);
    EXPECT_EQ(together.done.completion_tokens, alone[i].done.completion_tokens);
    sessions.push_back(together.done.session);
    widest = std::max(widest, together.done.batch_max);
  }
  std::sort(sessions.begin(), sessions.end());
  EXPECT_EQ(sessions, (std::vector<int>{0, 1, 2, 3}));  // one session each
  EXPECT_GE(widest, 2) << "no decode step fed more than one session";
  const ServiceStats s = batched.stats();
  EXPECT_GT(s.decode_rows, s.decode_steps);
  EXPECT_EQ(s.parallel, 4);
  EXPECT_EQ(s.sessions.size(), 4u);
  EXPECT_EQ(s.completed, 4);
}

// Logprobs of a batched request equal those of its solo run, token for token.
TEST(ServiceParallel, LogprobsWhileBatchedEqualSolo) {
  BatchedAndSolo services(2, 2);
  auto& [batched, solo] = services;
  auto with_logprobs = [&](const std::string& text) {
    ServiceRequest r = greedy(encode(solo, text), 12);
    r.top_logprobs = 2;
    return r;
  };
  int64_t widest = 0;
  auto logprobs_of = [&](const std::shared_ptr<RequestHandle>& h) {
    std::vector<double> out;
    ServiceEvent e;
    for (int i = 0; i < 600; ++i) {
      if (!h->next(e, std::chrono::milliseconds(100))) continue;
      for (const TokenLogprobs& t : e.logprobs) {
        out.push_back(t.chosen.logprob);
        for (const TokenLogprob& a : t.top) out.push_back(a.logprob);
      }
      if (e.kind == ServiceEvent::Kind::done) widest = std::max(widest, e.stats.batch_max);
      if (e.kind == ServiceEvent::Kind::done || e.kind == ServiceEvent::Kind::error) break;
    }
    return out;
  };
  const ServiceRequest a = with_logprobs("Names of rivers:"), b = with_logprobs("Seven seas,");
  const auto alone_a = logprobs_of(*solo.submit(a));
  const auto alone_b = logprobs_of(*solo.submit(b));
  auto ha = batched.submit(a);
  auto hb = batched.submit(b);
  ASSERT_TRUE(ha.ok() && hb.ok());
  EXPECT_EQ(logprobs_of(*ha), alone_a);
  EXPECT_EQ(logprobs_of(*hb), alone_b);
  EXPECT_FALSE(alone_a.empty());
  EXPECT_GE(widest, 2) << "the two requests never shared a decode step";
}

// Under a grammar each decode step's head computes only the ids the grammar allows
// (Session::restrict_next_logits); asking for log-probabilities turns that off. The same seeded
// requests at temperature 1 draw the same tokens either way, alone and two in a batch, whose head
// is restricted to the union of both masks.
TEST(ServiceParallel, GrammarAnswersAreTheSameWithTheHeadRestricted) {
  BatchedAndSolo services(2, 2);
  auto& [batched, solo] = services;
  auto constrained = [&](const std::string& text, const std::string& gbnf, uint64_t seed,
                         int top_logprobs) {
    ServiceRequest r = greedy(encode(solo, text), 40);
    r.sampling.temperature = 1.0;
    r.sampling.seed = seed;
    r.top_logprobs = top_logprobs;
    ConstraintSpec spec;
    spec.gbnf = gbnf;
    spec.raw = true;
    r.constraint = spec;
    return r;
  };
  const std::string numbers = R"(root ::= "[" [0-9]+ ("," " "? [0-9]+)* "]")";
  const std::string words = R"(root ::= ("yes" | "no" | "maybe") (" " [a-z]+)* ".")";
  const ServiceRequest a = constrained("Numbers:", numbers, 7, -1);
  const ServiceRequest b = constrained("Answer:", words, 8, -1);
  const Outcome alone_a = run(solo, a), alone_b = run(solo, b);
  const Outcome free_a = run(solo, constrained("Numbers:", numbers, 7, 0));
  const Outcome free_b = run(solo, constrained("Answer:", words, 8, 0));
  ASSERT_FALSE(alone_a.content.empty());
  EXPECT_EQ(alone_a.content.front(), '[');
  EXPECT_EQ(alone_a.content, free_a.content);
  EXPECT_EQ(alone_b.content, free_b.content);
  EXPECT_GT(alone_a.done.grammar_masks, 10u);
  EXPECT_EQ(alone_a.done.restricted_heads,
            static_cast<uint64_t>(alone_a.done.completion_tokens - 1));
  EXPECT_EQ(free_a.done.restricted_heads, 0u) << "log-probabilities need the whole head";
  auto ha = batched.submit(a);
  auto hb = batched.submit(b);
  ASSERT_TRUE(ha.ok() && hb.ok());
  const Outcome together_a = collect(*ha), together_b = collect(*hb);
  EXPECT_EQ(together_a.content, alone_a.content);
  EXPECT_EQ(together_b.content, alone_b.content);
  EXPECT_GE(std::max(together_a.done.batch_max, together_b.done.batch_max), 2)
      << "the two requests never shared a decode step";
}

// A request cancelled while it decodes in a batch ends at once (finish cancelled); the others of
// the batch go on and still equal their solo runs.
TEST(ServiceParallel, CancelWhileBatchedLeavesTheOthersIntact) {
  BatchedAndSolo services(3, 5);
  auto& [batched, solo] = services;
  const ServiceRequest a = greedy(encode(solo, "Count the stars:"), 24);
  const ServiceRequest b = greedy(encode(solo, "A recipe for bread"), 24);
  const ServiceRequest c = greedy(encode(solo, "Twelve months of the year"), 60);
  const Outcome alone_a = run(solo, a), alone_b = run(solo, b);
  auto ha = batched.submit(a), hb = batched.submit(b), hc = batched.submit(c);
  ASSERT_TRUE(ha.ok() && hb.ok() && hc.ok());
  // Cancel c once it has written three pieces of text (so it has been stepped with the others).
  ServiceEvent e;
  int pieces = 0;
  for (int i = 0; i < 600 && pieces < 3; ++i)
    if ((*hc)->next(e, std::chrono::milliseconds(100)) &&
        (e.kind == ServiceEvent::Kind::content || e.kind == ServiceEvent::Kind::reasoning))
      ++pieces;
  ASSERT_EQ(pieces, 3);
  batched.cancel(*hc);
  const Outcome cancelled = collect(*hc);
  EXPECT_EQ(cancelled.done.finish, k3::FinishReason::cancelled);
  EXPECT_LT(cancelled.done.completion_tokens, 60);
  const Outcome ra = collect(*ha), rb = collect(*hb);
  EXPECT_EQ(ra.content, alone_a.content);
  EXPECT_EQ(rb.content, alone_b.content);
  EXPECT_GE(cancelled.done.batch_max, 2) << "c was never batched with the others";
  EXPECT_EQ(batched.stats().cancelled_decode, 1);
  EXPECT_EQ(batched.stats().completed, 2);
  EXPECT_TRUE(batched.wait_idle(10));
  EXPECT_EQ(batched.stats().active, 0u);
}

// A long prompt arriving while another session decodes is prefilled in pieces of at most the
// prefill chunk (K3_CHUNK), one per decode step, whatever its progress_every: the running stream
// is never stalled for the whole prompt.
TEST(ServiceParallel, APrefillIsCutInChunksWhileOthersDecode) {
  ServiceOptions o = parallel_options(2, 0);
  o.load.chunk = 8;
  o.token_delay_ms = 2;
  EngineService service(o);
  wait_ready(service);
  auto running = service.submit(greedy(encode(service, "Keep talking:"), 400));
  ASSERT_TRUE(running.ok());
  ServiceEvent e;
  bool writing = false;
  for (int i = 0; i < 600 && !writing; ++i)
    writing = (*running)->next(e, std::chrono::milliseconds(100)) &&
              (e.kind == ServiceEvent::Kind::content || e.kind == ServiceEvent::Kind::reasoning);
  ASSERT_TRUE(writing);
  std::string long_text;
  for (int i = 0; i < 12; ++i) long_text += " and the river kept flowing past the old mill";
  ServiceRequest r = greedy(encode(service, long_text), 2);
  r.progress_every = 64;
  ASSERT_GT(r.prompt.size(), 64u);
  const Outcome late = run(service, r);
  ASSERT_FALSE(late.progress.empty());
  int64_t before = 0;
  for (const ServiceEvent& p : late.progress) {
    EXPECT_LE(p.processed - before, 8) << "a piece longer than the chunk while another decodes";
    before = p.processed;
  }
  EXPECT_EQ(before, static_cast<int64_t>(r.prompt.size()));
  EXPECT_EQ(service.stats().active, 1u) << "the running stream ended before the prefill did";
  service.cancel(*running);
  EXPECT_EQ(collect(*running).done.finish, k3::FinishReason::cancelled);
}

// Alone, a long prompt is prefilled in whole chunks (K3_CHUNK) even when progress_every is
// smaller: its experts are read once per chunk, not once per progress_every tokens.
TEST(ServiceParallel, APrefillAloneRunsInWholeChunks) {
  ServiceOptions o = parallel_options(2, 0);
  o.load.chunk = 64;
  EngineService service(o);
  wait_ready(service);
  std::string long_text;
  for (int i = 0; i < 20; ++i) long_text += " and the river kept flowing past the old mill";
  ServiceRequest r = greedy(encode(service, long_text), 2);  // progress_every 8
  ASSERT_GT(r.prompt.size(), 128u);
  const Outcome alone = run(service, r);
  ASSERT_GE(alone.progress.size(), 2u);
  int64_t before = 0;
  for (size_t i = 0; i + 1 < alone.progress.size(); ++i) {
    EXPECT_EQ(alone.progress[i].processed - before, 64) << "piece " << i;
    before = alone.progress[i].processed;
  }
  EXPECT_EQ(alone.progress.back().processed, static_cast<int64_t>(r.prompt.size()));
}

// The agent case (issue 31): conversation A, an unrelated side request (a title, a summary), then
// A's follow-up. The side request goes to another session, so the follow-up reuses A's prefix
// (one session lost all of it to the side request).
TEST(ServiceParallel, SideRequestDoesNotEvictTheConversation) {
  EngineService service(parallel_options(4));
  EngineService cold(options(0));
  wait_ready(service);
  wait_ready(cold);
  const auto head =
      encode(service, "System: you are a coding agent.\nUser: fix the bug.\nAssistant:");
  const Outcome a = run(service, greedy(head, 8));
  const Outcome side =
      run(service, greedy(encode(service, "Write a five-word title for: bread"), 6));
  EXPECT_NE(side.done.session, a.done.session);
  const auto follow = concat(head, encode(service, " Done.\nUser: now add a test.\nAssistant:"));
  const Outcome next = run(service, greedy(follow, 8, static_cast<int64_t>(head.size())));
  EXPECT_EQ(next.done.session, a.done.session);
  EXPECT_GE(next.done.cached_tokens, static_cast<int64_t>(head.size()));
  EXPECT_EQ(next.content, run(cold, greedy(follow, 8)).content);
}

// Session choice: a follow-up goes to the session holding its conversation (live reuse), an
// unrelated request to the least recently used idle one; /slots figures follow.
TEST(ServiceParallel, SessionChoicePrefersTheSharedPrefixThenTheLeastRecentlyUsed) {
  EngineService service(parallel_options(3));
  wait_ready(service);
  const auto pa = encode(service, "Conversation A about rivers");
  const auto pb = encode(service, "Conversation B about mountains");
  const auto pc = encode(service, "Conversation C about lakes");
  const Outcome a = run(service, greedy(pa, 1));  // one token: the record is the prompt
  const Outcome b = run(service, greedy(pb, 1));
  const Outcome c = run(service, greedy(pc, 1));
  EXPECT_NE(a.done.session, b.done.session);
  EXPECT_NE(b.done.session, c.done.session);
  EXPECT_NE(a.done.session, c.done.session);
  // B's follow-up: B's session, live.
  const Outcome b2 = run(service, greedy(concat(pb, encode(service, " and valleys")), 4));
  EXPECT_EQ(b2.done.session, b.done.session);
  EXPECT_EQ(b2.accepted.reuse, ReuseKind::live);
  EXPECT_EQ(b2.done.cached_tokens, static_cast<int64_t>(pb.size()));
  // Something new: the least recently used session, A's.
  const Outcome d = run(service, greedy(encode(service, "Something else entirely"), 2));
  EXPECT_EQ(d.done.session, a.done.session);
  EXPECT_EQ(d.done.cached_tokens, 0);
  const ServiceStats s = service.stats();
  ASSERT_EQ(s.sessions.size(), 3u);
  const auto& sb = s.sessions[static_cast<size_t>(b.done.session)];
  EXPECT_EQ(sb.requests, 2);
  EXPECT_EQ(sb.state, "idle");
  EXPECT_GT(sb.last_used, 0);
  EXPECT_GT(sb.fed_tokens, static_cast<int64_t>(pb.size()));
  EXPECT_EQ(s.sessions[static_cast<size_t>(c.done.session)].requests, 1);
}

// Admission: N run at once, max_queue wait beyond them, the next is refused (the server's 429).
TEST(ServiceParallel, AdmissionRunsNQueuesMaxQueueRefusesTheRest) {
  ServiceOptions o = parallel_options(2, 0);
  o.max_queue = 1;
  o.token_delay_ms = 20;
  EngineService service(o);
  wait_ready(service);
  const auto prompt = encode(service, "Count slowly:");
  auto first = service.submit(greedy(prompt, 40));
  auto second = service.submit(greedy(prompt, 40));
  ASSERT_TRUE(first.ok() && second.ok());
  accepted(*first);
  accepted(*second);  // both running: two sessions
  EXPECT_EQ(service.stats().active, 2u);
  auto waiter = service.submit(greedy(prompt, 2));
  ASSERT_TRUE(waiter.ok()) << waiter.status().message();
  auto refused = service.submit(greedy(prompt, 2));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Status::Code::resource_exhausted);
  EXPECT_HAS(refused.status().message(),
             "1 waiting behind the 2 running requests (--parallel / COLI_PARALLEL), the limit "
             "(--max-queue / COLI_MAX_QUEUE)");
  EXPECT_EQ(service.stats().rejected, 1);
  service.cancel(*first);
  EXPECT_EQ(collect(*first).done.finish, k3::FinishReason::cancelled);
  const Outcome w = collect(*waiter);  // took the freed session
  EXPECT_EQ(w.done.completion_tokens, 2);
  service.cancel(*second);
  collect(*second);
}

// Every session's state is reserved at start: when they do not fit, the start is refused before
// the weights, naming one session's bytes and the settings.
TEST(ServiceParallel, SessionsThatDoNotFitAreRefusedWithTheirSize) {
  ServiceOptions o = parallel_options(64, 0);
  o.context = int64_t{1} << 24;
  EngineService service(o);
  const ServiceStats s = settled(service);
  EXPECT_EQ(s.state, ServiceStats::State::failed);
  EXPECT_HAS(s.load_error,
             "--parallel / COLI_PARALLEL=64: 64 sessions of 16777216 positions need ");
  EXPECT_HAS(s.load_error, "MiB each (");
  EXPECT_HAS(s.load_error, "lower --parallel / COLI_PARALLEL or --ctx");
  EXPECT_EQ(s.load_progress, 0.0) << "refused before the weights load";
}

// --- The prefix cache on disk (ServiceOptions::cache_dir, coli serve --cache-dir) ---

ServiceOptions cached_options(const std::string& dir) {
  ServiceOptions o = parallel_options(2, 0);
  o.cache_dir = dir;
  o.cache_gb = 1;
  return o;
}

std::vector<std::string> prefix_files(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().filename().string().rfind("k3_prefix_", 0) == 0) out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

// A conversation resumes after a restart from the prompt-boundary state written before it (MLA
// rows and all), and gives the cold answer; the files are private and keyed.
TEST(ServicePrefixCache, AConversationResumesAfterARestart) {
  const testing::TempDir root("prefix-cache");
  const std::string dir = root.file("cache");
  EngineService cold(options(0));
  wait_ready(cold);
  const auto head =
      encode(cold, "System: you are a coding agent with a long system prompt.\nUser:");
  const auto follow = concat(head, encode(cold, " fix the failing test.\nAssistant:"));
  {
    EngineService first(cached_options(dir));
    wait_ready(first);
    const Outcome a = run(first, greedy(head, 4));
    EXPECT_EQ(a.done.cached_tokens, 0);
    EXPECT_EQ(first.stats().prefix.saves, 1);
  }
  struct stat st {};
  ASSERT_EQ(::stat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(::stat((dir + "/k3_prefix.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(st.st_size, 16);
  const auto files = prefix_files(dir);
  ASSERT_EQ(files.size(), 1u);
  ASSERT_EQ(::stat(files[0].c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  EngineService restarted(cached_options(dir));
  wait_ready(restarted);
  const Outcome b = run(restarted, greedy(follow, 8));
  EXPECT_EQ(b.accepted.reuse, ReuseKind::disk);
  EXPECT_EQ(b.done.cached_tokens, static_cast<int64_t>(head.size()));
  EXPECT_EQ(b.done.restored_at, static_cast<int64_t>(head.size()));
  EXPECT_EQ(b.content, run(cold, greedy(follow, 8)).content);
  EXPECT_EQ(restarted.stats().prefix.restores, 1);
  EXPECT_EQ(restarted.stats().reuse_disk, 1);
  EXPECT_HAS(restarted.stats().prefix_cache, "disk " + dir + ", 2 entries");
}

// A damaged, truncated or foreign file is refused and removed, never restored: the request then
// runs cold and gives the cold answer.
TEST(ServicePrefixCache, DamagedTruncatedAndForeignFilesAreRefusedAndRemoved) {
  const testing::TempDir root("prefix-cache-bad");
  EngineService cold(options(0));
  wait_ready(cold);
  const auto head = encode(cold, "System: the same long system prompt for every request.\nUser:");
  const auto follow = concat(head, encode(cold, " and now?\nAssistant:"));
  const std::string expected = run(cold, greedy(follow, 6)).content;
  auto write_one = [&](const std::string& dir) {
    EngineService service(cached_options(dir));
    wait_ready(service);
    run(service, greedy(head, 2));
    const auto files = prefix_files(dir);
    EXPECT_EQ(files.size(), 1u);
    return files.empty() ? std::string() : files[0];
  };
  auto resume = [&](const std::string& dir, const char* what, bool refused_at_start) {
    SCOPED_TRACE(what);
    EngineService service(cached_options(dir));
    wait_ready(service);
    if (refused_at_start) {
      EXPECT_EQ(service.stats().prefix.rejected, 1);
    }
    const Outcome r = run(service, greedy(follow, 6));
    EXPECT_NE(r.accepted.reuse, ReuseKind::disk);
    EXPECT_EQ(r.done.cached_tokens, 0);
    EXPECT_EQ(r.content, expected);
    EXPECT_EQ(service.stats().prefix.rejected, 1);
    EXPECT_EQ(service.stats().prefix.restores, 0);
  };
  // Damaged: one payload byte changed; the header is intact, so the tag check at restore refuses.
  {
    const std::string dir = root.file("damaged");
    const std::string file = write_one(dir);
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(0, std::ios::end);
    const std::streamoff size = f.tellg();
    f.seekp(size - 5);
    const char flip = 0x5a;
    f.write(&flip, 1);
    f.close();
    resume(dir, "damaged", false);
    EXPECT_FALSE(std::filesystem::exists(file)) << "the damaged file was not removed";
  }
  // Truncated: refused when the directory is read at start.
  {
    const std::string dir = root.file("truncated");
    const std::string file = write_one(dir);
    std::filesystem::resize_file(file, std::filesystem::file_size(file) - 100);
    resume(dir, "truncated", true);
    EXPECT_FALSE(std::filesystem::exists(file)) << "the truncated file was not removed";
  }
  // Foreign: a valid file of another cache (another key) copied in.
  {
    const std::string other = write_one(root.file("other"));
    const std::string dir = root.file("foreign");
    std::filesystem::create_directory(dir);
    std::filesystem::permissions(dir, std::filesystem::perms::owner_all);
    const std::string copied = dir + "/" + std::filesystem::path(other).filename().string();
    std::filesystem::copy_file(other, copied);
    resume(dir, "foreign", true);
    EXPECT_FALSE(std::filesystem::exists(copied)) << "the foreign file was not removed";
  }
}

// A key file others may read, or a directory others may write to, stops the start before the
// weights load.
TEST(ServicePrefixCache, UnsafeKeyOrDirectoryIsRefused) {
  const testing::TempDir root("prefix-cache-unsafe");
  const std::string dir = root.file("cache");
  {
    EngineService service(cached_options(dir));
    wait_ready(service);
  }
  ASSERT_EQ(::chmod((dir + "/k3_prefix.key").c_str(), 0644), 0);
  {
    EngineService service(cached_options(dir));
    const ServiceStats s = settled(service);
    EXPECT_EQ(s.state, ServiceStats::State::failed);
    EXPECT_EQ(s.failed_step, "prefix cache directory (--cache-dir)");
    EXPECT_HAS(s.load_error, dir + "/k3_prefix.key: the prefix cache key must be");
    EXPECT_EQ(s.load_progress, 0.0);
  }
  const std::string open = root.file("open");
  std::filesystem::create_directory(open);
  ASSERT_EQ(::chmod(open.c_str(), 0777), 0);
  EngineService service(cached_options(open));
  const ServiceStats s = settled(service);
  EXPECT_EQ(s.state, ServiceStats::State::failed);
  EXPECT_HAS(s.load_error, "is writable by other users");
}

}  // namespace
}  // namespace k3
