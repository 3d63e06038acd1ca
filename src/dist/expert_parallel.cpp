// dist/expert_parallel.cpp — expert parallelism over MPI (see dist/expert_parallel.h).
//
// Messages (MPI_BYTE on a duplicate of MPI_COMM_WORLD; rank 0 talks to each worker, workers never
// to each other):
//   kHello   worker → 0   the worker's fingerprint (config.json, kernel variant, shard sizes)
//   kVerdict 0 → worker   "" (go on) or why the job stops
//   kStep    0 → worker   one MoE step's share: {layer, use, groups, pairs, rows}, ids[groups],
//                         counts[groups], row[pairs] (indices into the rows sent), z [rows][R]
//                         (each row once, even when several of the worker's experts chose it)
//   kOut     worker → 0   [pairs][R] f32, one output row per pair in the step's pair order, then
//                         the worker's RankCounters (what /metrics shows, with no extra message)
//   kFailed  worker → 0   the worker's error text (a failed read), instead of kOut
//   kStats / kStop        counters on request; the end of the job
// Every wait polls with a growing pause (at most 0.5 ms) instead of blocking in MPI: Open MPI's
// blocking calls spin, and the ranks share cores with rank 0's compute (docs/scale-out.md §2.3).
#include "dist/expert_parallel.h"

#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "experts/expert_cache.h"
#include "kernels/matmul.h"
#include "model/compute.h"
#include "model/latent_moe.h"
#include "model/weights.h"
#include "mpi_library.h"
#include "util/crc32c.h"
#include "util/error.h"
#include "util/sys.h"

namespace k3::dist {
namespace {

enum Tag : int { kHello = 1, kVerdict, kStep, kOut, kFailed, kStats, kStop };

struct Job {
  bool joined = false;
  World world;
  const MpiLibrary* mpi = nullptr;  // open once the job joins
  MPI_Comm comm{};
  bool have_comm = false;  // comm is a duplicate to free (join() may stop before it is)
  bool failed = false;     // a rank failed: leave() aborts the job
  double timeout = 60;     // seconds (LoadOptions::ep_timeout)
};
Job g_job;

const MpiLibrary& mpi() {
  return *g_job.mpi;
}

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (mpi().error_string(code, text, &len) != MPI_SUCCESS)
    return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<size_t>(len));
}

void check_mpi(int code, const std::string& what) {
  if (code != MPI_SUCCESS) throw Error("expert-parallel: " + what + ": " + mpi_error_text(code));
}

// Sleeps a little longer each call (10 µs doubling to 0.5 ms): a poll loop's pause.
class Backoff {
 public:
  void pause() {
    std::this_thread::sleep_for(std::chrono::microseconds(us_));
    us_ = std::min(us_ * 2, 500);
  }

 private:
  int us_ = 10;
};

// Waits for `request` until `deadline` (now_seconds()). False on timeout (the request is left
// pending); throws on an MPI error.
bool wait_until(MPI_Request& request, MPI_Status* status, double deadline,
                const std::string& what) {
  Backoff backoff;
  for (;;) {
    int done = 0;
    check_mpi(mpi().test(&request, &done, status), what);
    if (done) return true;
    if (now_seconds() > deadline) return false;
    backoff.pause();
  }
}

// The lines two ranks must agree on: config.json, the kernel variant and numerics, the layers run,
// and every shard's size, as "key: value".
std::map<std::string, std::string> fingerprint(const ModelFiles& files, const LoadOptions& load,
                                               Isa isa) {
  std::map<std::string, std::string> f;
  const std::string config = files.config_root().dump();
  f["config.json"] = "crc32c " + std::to_string(crc32c(config.data(), config.size()));
  f["kernel variant"] = isa_name(isa);
  f["K3_IDOT"] = load.idot ? "1" : "0";
  f["K3_LAYERS"] = std::to_string(load.layers);
  for (const auto& shard : files.shards()) {
    const std::filesystem::path path(shard->path());
    f[path.filename().string()] = std::to_string(std::filesystem::file_size(path)) + " bytes";
  }
  return f;
}

std::string encode(const std::map<std::string, std::string>& f) {
  std::string s;
  for (const auto& [k, v] : f) s += k + '\t' + v + '\n';
  return s;
}

std::map<std::string, std::string> decode(const std::string& s) {
  std::map<std::string, std::string> f;
  size_t at = 0;
  while (at < s.size()) {
    const size_t tab = s.find('\t', at), nl = s.find('\n', at);
    if (tab == std::string::npos || nl == std::string::npos || tab > nl) break;
    f[s.substr(at, tab - at)] = s.substr(tab + 1, nl - tab - 1);
    at = nl + 1;
  }
  return f;
}

// Why rank `rank`'s fingerprint differs from rank 0's ("" when it does not).
std::string mismatch(int rank, const std::map<std::string, std::string>& mine,
                     const std::map<std::string, std::string>& theirs) {
  const std::string r = "rank " + std::to_string(rank);
  for (const auto& [k, v] : mine) {
    const auto it = theirs.find(k);
    if (it == theirs.end()) return r + " has no " + k + " (rank 0: " + v + ")";
    if (it->second != v) return r + ": " + k + " is " + it->second + ", on rank 0 " + v;
  }
  for (const auto& [k, v] : theirs)
    if (!mine.count(k)) return r + " has " + k + " (" + v + "), rank 0 has none";
  return "";
}

// Receives one message of any size with `tag` from `source` into `out`, polling until `deadline`.
// False on timeout.
bool receive(int source, int tag, std::vector<uint8_t>& out, double deadline,
             const std::string& what) {
  Backoff backoff;
  for (;;) {
    int flag = 0;
    MPI_Status status;
    check_mpi(mpi().iprobe(source, tag, g_job.comm, &flag, &status), what);
    if (flag) {
      int count = 0;
      check_mpi(mpi().get_count(&status, mpi().byte, &count), what);
      out.resize(static_cast<size_t>(count));
      check_mpi(
          mpi().recv(out.data(), count, mpi().byte, source, tag, g_job.comm, MPI_STATUS_IGNORE),
          what);
      return true;
    }
    if (now_seconds() > deadline) return false;
    backoff.pause();
  }
}

void send_bytes(int dest, int tag, const void* data, size_t bytes, const std::string& what) {
  check_mpi(mpi().send(data, static_cast<int>(bytes), mpi().byte, dest, tag, g_job.comm), what);
}

Isa chosen_isa(const std::string& name) {
  if (name == "auto") return best_isa();
  Isa isa = Isa::kScalar;
  if (!parse_isa(name, &isa)) throw Error("K3_ISA: unknown kernel variant \"" + name + "\"");
  return isa;
}

// Counters a worker reports (kStats), and rank 0 keeps per rank.
struct RankCounters {
  double pairs = 0, steps = 0, hits = 0, misses = 0, bytes_read = 0, drive_bytes = 0,
         busy_seconds = 0, compute_seconds = 0;
};
// The counters at the end of a kOut payload, in floats.
constexpr size_t kCounterFloats = sizeof(RankCounters) / sizeof(float);
static_assert(sizeof(RankCounters) % sizeof(float) == 0);

// ---- rank 0 ---------------------------------------------------------------------------------

class RemoteExecutor final : public ExpertExecutor {
 public:
  RemoteExecutor(const K3Config& config, double timeout, std::vector<int> owners)
      : owners_(std::move(owners)),
        size_(g_job.world.size),
        R_(static_cast<size_t>(config.routed_expert_hidden_size)),
        timeout_(timeout),
        peers_(static_cast<size_t>(size_)) {}

  const char* name() const override { return "ranks"; }

  void issue(const MoeStep& step, std::span<GroupOwner> owner, GroupOwner self) override {
    if (!broken_.empty())
      throw Error("expert-parallel: " + broken_ +
                  "; the job cannot compute its experts (restart it)");
    const double t0 = now_seconds();
    uint64_t sent = 0;
    layer_ = step.layer;
    for (Peer& p : peers_) p.clear();
    // Claim every group another rank owns; one message per rank with the rows its pairs need.
    for (size_t g = 0; g < step.groups(); ++g) {
      const int r = owners_[static_cast<size_t>(step.ids[g])];
      if (r == 0 || owner[g] != kUnowned) continue;
      owner[g] = self;
      Peer& p = peers_[static_cast<size_t>(r)];
      p.groups.push_back(g);
      p.ids.push_back(step.ids[g]);
      p.counts.push_back(static_cast<int64_t>(step.pairs(g)));
      for (size_t k = step.starts[g]; k < step.starts[g + 1]; ++k) {
        const size_t row = step.picks[k].row;
        if (p.local.size() < step.rows) p.local.assign(step.rows, -1);
        if (p.local[row] < 0) {
          p.local[row] = static_cast<int64_t>(p.rows.size());
          p.rows.push_back(row);
        }
        p.pair_rows.push_back(p.local[row]);
      }
    }
    for (int r = 1; r < size_; ++r) {
      Peer& p = peers_[static_cast<size_t>(r)];
      if (p.groups.empty()) continue;
      const int64_t head[5] = {
          step.layer, static_cast<int64_t>(step.use), static_cast<int64_t>(p.groups.size()),
          static_cast<int64_t>(p.pair_rows.size()), static_cast<int64_t>(p.rows.size())};
      p.message.clear();
      const auto put = [&](const void* data, size_t bytes) {
        const auto* b = static_cast<const uint8_t*>(data);
        p.message.insert(p.message.end(), b, b + bytes);
      };
      put(head, sizeof head);
      put(p.ids.data(), p.ids.size() * sizeof(int64_t));
      put(p.counts.data(), p.counts.size() * sizeof(int64_t));
      put(p.pair_rows.data(), p.pair_rows.size() * sizeof(int64_t));
      for (size_t row : p.rows) put(step.z + row * R_, R_ * sizeof(float));
      p.out.resize(std::max<size_t>(p.pair_rows.size() * R_ + kCounterFloats, 1024));
      const std::string what =
          "sending layer " + std::to_string(step.layer) + " to rank " + std::to_string(r);
      post(r, p, what);
      p.counters.pairs += static_cast<double>(p.pair_rows.size());
      p.counters.steps += 1;
      sent += p.message.size();
    }
    std::lock_guard<std::mutex> lock(figures_mutex_);
    bytes_sent_ += sent;
    exchange_seconds_ += now_seconds() - t0;
  }

  bool finish(const MoeStep& step, std::span<const GroupOwner> owner, GroupOwner self,
              PairSink& sink) override {
    const double t0 = now_seconds();
    const double deadline = t0 + timeout_;
    for (int r = 1; r < size_; ++r) {
      Peer& p = peers_[static_cast<size_t>(r)];
      if (p.groups.empty()) continue;
      const std::string rank = "rank " + std::to_string(r);
      const std::string what = "layer " + std::to_string(layer_) + " on " + rank;
      MPI_Status status;
      bool ok = false;
      try {
        ok = wait_until(p.recv, &status, deadline, what) &&
             wait_until(p.send, MPI_STATUS_IGNORE, deadline, what);
      } catch (const Error& e) {
        fail(std::string(e.what()).substr(std::strlen("expert-parallel: ")));
      }
      if (!ok) {
        char seconds[32];
        std::snprintf(seconds, sizeof seconds, "%g", timeout_);
        fail(rank + " sent no answer for MoE layer " + std::to_string(layer_) + " within " +
             seconds + " s (the rank died or hangs; --ep-timeout)");
      }
      if (status.MPI_TAG == kFailed) {
        int count = 0;
        mpi().get_count(&status, mpi().byte, &count);
        fail(rank + " failed: " +
             std::string(reinterpret_cast<const char*>(p.out.data()), static_cast<size_t>(count)));
      }
      size_t at = 0;
      for (size_t j = 0; j < p.groups.size(); ++j) {
        sink.deliver(p.groups[j], p.out.data() + at * R_, true);
        at += static_cast<size_t>(p.counts[j]);
      }
      bytes_received_ += at * R_ * sizeof(float);
      std::lock_guard<std::mutex> lock(figures_mutex_);
      std::memcpy(static_cast<void*>(&latest_[static_cast<size_t>(r)]), p.out.data() + at * R_,
                  sizeof(RankCounters));
    }
    std::lock_guard<std::mutex> lock(figures_mutex_);
    exchange_seconds_ += now_seconds() - t0;
    return true;
  }

  ExchangeFigures figures(const ExpertCacheStats& own) const {
    ExchangeFigures f;
    f.ranks = size_;
    std::lock_guard<std::mutex> lock(figures_mutex_);
    f.exchange_seconds = exchange_seconds_;
    f.bytes_sent = bytes_sent_;
    f.bytes_received = bytes_received_;
    RankFigures mine;
    mine.hits = static_cast<double>(own.hits);
    mine.misses = static_cast<double>(own.misses);
    mine.bytes_read = static_cast<double>(own.bytes_read);
    mine.drive_bytes = static_cast<double>(own.drive_bytes);
    mine.busy_seconds = own.busy_seconds;
    f.per_rank.push_back(mine);
    for (int r = 1; r < size_; ++r) {
      const RankCounters& c = latest_[static_cast<size_t>(r)];
      f.per_rank.push_back(
          {r, c.pairs, c.hits, c.misses, c.bytes_read, c.drive_bytes, c.busy_seconds});
    }
    return f;
  }

  std::string describe(int64_t tokens, const ExpertCacheStats& own) {
    if (!broken_.empty()) return "expert-parallel: " + broken_;
    std::string line;
    char buf[320];
    std::snprintf(buf, sizeof buf,
                  "expert-parallel: %d ranks | exchange %.2f ms/token (%.1f MB sent, %.1f MB back)",
                  size_, tokens > 0 ? exchange_seconds_ * 1e3 / static_cast<double>(tokens) : 0.0,
                  static_cast<double>(bytes_sent_) / 1e6,
                  static_cast<double>(bytes_received_) / 1e6);
    line = buf;
    const auto rank_text = [&](int r, double pairs, const RankCounters& c) {
      std::snprintf(buf, sizeof buf,
                    " | rank %d: %.0f pairs, %.0f hits / %.0f misses, %.1f MB read at %.2f GB/s", r,
                    pairs, c.hits, c.misses, c.bytes_read / 1e6,
                    c.busy_seconds > 0 ? c.drive_bytes / 1e9 / c.busy_seconds : 0.0);
      line += buf;
    };
    RankCounters mine;  // rank 0's own experts: its cache's counters (the pairs are not counted)
    mine.hits = static_cast<double>(own.hits);
    mine.misses = static_cast<double>(own.misses);
    mine.bytes_read = static_cast<double>(own.bytes_read);
    mine.drive_bytes = static_cast<double>(own.drive_bytes);
    mine.busy_seconds = own.busy_seconds;
    std::snprintf(buf, sizeof buf, " | rank 0: %.0f hits / %.0f misses, %.1f MB read at %.2f GB/s",
                  mine.hits, mine.misses, mine.bytes_read / 1e6,
                  mine.busy_seconds > 0 ? mine.drive_bytes / 1e9 / mine.busy_seconds : 0.0);
    line += buf;
    for (int r = 1; r < size_; ++r) {
      RankCounters c;
      if (!stats(r, &c)) {
        line += " | rank " + std::to_string(r) + ": no counters (no answer)";
        continue;
      }
      rank_text(r, c.pairs, c);
    }
    return line;
  }

 private:
  struct Peer {
    std::vector<size_t> groups;      // the step's group indices this rank computes
    std::vector<int64_t> ids;        // [groups] their expert ids
    std::vector<int64_t> counts;     // [groups] pairs per group
    std::vector<int64_t> pair_rows;  // [pairs] index into rows
    std::vector<size_t> rows;        // the step rows sent, each once
    std::vector<int64_t> local;      // [step rows] index into rows, or -1
    std::vector<uint8_t> message;    // the kStep message
    std::vector<float> out;          // [pairs][R] the answer
    MPI_Request send = mpi().request_null, recv = mpi().request_null;
    RankCounters counters;
    void clear() {
      groups.clear();
      ids.clear();
      counts.clear();
      pair_rows.clear();
      rows.clear();
      local.clear();
    }
  };

  void post(int r, Peer& p, const std::string& what) {
    try {
      check_mpi(mpi().irecv(p.out.data(), static_cast<int>(p.out.size() * sizeof(float)),
                            mpi().byte, r, MPI_ANY_TAG, g_job.comm, &p.recv),
                what);
      check_mpi(mpi().isend(p.message.data(), static_cast<int>(p.message.size()), mpi().byte, r,
                            kStep, g_job.comm, &p.send),
                what);
    } catch (const Error& e) {
      fail(std::string(e.what()).substr(std::strlen("expert-parallel: ")));
    }
  }

  [[noreturn]] void fail(const std::string& why) {
    broken_ = why;
    g_job.failed = true;
    throw Error("expert-parallel: " + why);
  }

  bool stats(int r, RankCounters* out) {
    const double deadline = now_seconds() + timeout_;
    try {
      send_bytes(r, kStats, nullptr, 0, "asking rank " + std::to_string(r) + " for its counters");
      std::vector<uint8_t> reply;
      if (!receive(r, kStats, reply, deadline, "rank " + std::to_string(r) + "'s counters") ||
          reply.size() != sizeof(RankCounters))
        return false;
      std::memcpy(out, reply.data(), sizeof(RankCounters));
      return true;
    } catch (const Error&) {
      return false;
    }
  }

  const std::vector<int> owners_;  // [num_experts] the rank of each expert (expert_owners)
  const int size_;
  const size_t R_;
  const double timeout_;
  std::vector<Peer> peers_;  // [size] (0 unused)
  int64_t layer_ = -1;
  std::string broken_;  // why the job cannot go on ("" while it can)
  // Guarded by figures_mutex_ (figures() reads them from the HTTP threads).
  mutable std::mutex figures_mutex_;
  double exchange_seconds_ = 0;
  uint64_t bytes_sent_ = 0, bytes_received_ = 0;
  std::vector<RankCounters> latest_ = std::vector<RankCounters>(static_cast<size_t>(size_));
};

std::weak_ptr<RemoteExecutor> g_executor;

// ---- worker ranks ---------------------------------------------------------------------------

// One kStep message computed through the worker's expert cache: apply() as each expert's bytes
// arrive, every row of a group from the rows sent, the output in the step's pair order.
class WorkerStep final : public ExpertWork {
 public:
  WorkerStep(const K3Config& c, const Compute& compute) : c_(c), compute_(compute) {
    R_ = static_cast<size_t>(c.routed_expert_hidden_size);
    I_ = static_cast<size_t>(c.moe_intermediate_size);
  }

  // Parses `message` and computes its groups with `cache` into out (kOut payload).
  void run(ExpertCache& cache, const std::vector<uint8_t>& message, std::vector<float>& out) {
    int64_t head[5];
    if (message.size() < sizeof head)
      throw Error("a step message of " + std::to_string(message.size()) + " bytes");
    std::memcpy(head, message.data(), sizeof head);
    const int64_t layer = head[0];
    const auto use = static_cast<ExpertUse>(head[1]);
    const size_t groups = static_cast<size_t>(head[2]), pairs = static_cast<size_t>(head[3]),
                 rows = static_cast<size_t>(head[4]);
    const size_t need =
        sizeof head + (2 * groups + pairs) * sizeof(int64_t) + rows * R_ * sizeof(float);
    if (message.size() != need)
      throw Error("a step message of " + std::to_string(message.size()) + " bytes, expected " +
                  std::to_string(need));
    const uint8_t* at = message.data() + sizeof head;
    const auto take = [&](auto& v, size_t n) {
      v.resize(n);
      std::memcpy(v.data(), at, n * sizeof(v[0]));
      at += n * sizeof(v[0]);
    };
    take(ids_, groups);
    take(counts_, groups);
    take(pair_rows_, pairs);
    take(z_, rows * R_);
    starts_.assign(groups + 1, 0);
    for (size_t g = 0; g < groups; ++g)
      starts_[g + 1] = starts_[g] + static_cast<size_t>(counts_[g]);
    if (compute_.idot) {
      // The same bits as rank 0's quantisation of these rows (quantize_q8_32 is per row).
      zq8_.resize(rows * R_);
      zd_.resize(rows * (R_ / 32));
      quantize_q8_32(*compute_.kernels, z_.data(), rows, R_, zq8_.data(), zd_.data());
    }
    out.resize(pairs * R_);
    out_ = out.data();
    cache.run(layer, ids_, use, *this);
    pairs_ += pairs;
  }

  uint64_t pairs() const { return pairs_; }
  double compute_seconds() const { return compute_seconds_; }

 private:
  bool ahead(size_t) override { return true; }  // each group has its own place in out

  void apply(size_t g, const ExpertView& view) override {
    const double t0 = now_seconds();
    const size_t p0 = starts_[g], m = starts_[g + 1] - p0;
    ex_z_.resize(m * R_);
    ex_q8_.resize(m * R_);
    ex_d_.resize(m * (R_ / 32));
    gate_.resize(m * I_);
    up_.resize(m * I_);
    hq8_.resize(m * I_);
    hd_.resize(m * (I_ / 32));
    for (size_t i = 0; i < m; ++i) {
      const size_t t = static_cast<size_t>(pair_rows_[p0 + i]);
      if (compute_.idot) {
        std::copy(zq8_.begin() + t * R_, zq8_.begin() + (t + 1) * R_, ex_q8_.begin() + i * R_);
        std::copy(zd_.begin() + t * (R_ / 32), zd_.begin() + (t + 1) * (R_ / 32),
                  ex_d_.begin() + i * (R_ / 32));
      } else {
        std::copy(z_.begin() + t * R_, z_.begin() + (t + 1) * R_, ex_z_.begin() + i * R_);
      }
    }
    apply_expert(c_, compute_, view, m, ex_z_.data(), ex_q8_.data(), ex_d_.data(), gate_.data(),
                 up_.data(), hq8_.data(), hd_.data(), out_ + p0 * R_);
    compute_seconds_ += now_seconds() - t0;
  }

  std::span<const int64_t> read_ahead(int64_t*) override { return {}; }

  const K3Config& c_;
  const Compute& compute_;
  size_t R_ = 0, I_ = 0;
  std::vector<int64_t> ids_, counts_, pair_rows_;
  std::vector<size_t> starts_;
  std::vector<float> z_, ex_z_, gate_, up_, hd_, ex_d_, zd_;
  std::vector<int8_t> zq8_, ex_q8_, hq8_;
  float* out_ = nullptr;
  uint64_t pairs_ = 0;
  double compute_seconds_ = 0;
};

}  // namespace

World join(int* argc, char*** argv) {
  if (g_job.joined) return g_job.world;
  int provided = 0;
  // MPI starts threads of its own (Open MPI: progress and PMIx threads). They must not take the
  // programs' stop signals: `coli serve` waits for SIGTERM on a thread of its own and drains,
  // and a handler run on an MPI thread would end the process at once. So they start with the
  // stop signals blocked, and this thread gets its mask back. The library is opened here too,
  // not linked (dist/mpi_library.h): its constructors run with the same mask.
  sigset_t stop_signals, before;
  sigemptyset(&stop_signals);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&stop_signals, sig);
  pthread_sigmask(SIG_BLOCK, &stop_signals, &before);
  int started = MPI_SUCCESS + 1;
  try {
    g_job.mpi = &open_mpi_library();
    started = mpi().init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
  } catch (...) {
    pthread_sigmask(SIG_SETMASK, &before, nullptr);
    throw;
  }
  pthread_sigmask(SIG_SETMASK, &before, nullptr);
  if (started != MPI_SUCCESS)
    throw Error("--expert-parallel: MPI could not start (run the program under mpirun)");
  g_job.joined = true;  // leave() finalizes from here on, whatever fails below
  mpi().comm_set_errhandler(mpi().comm_world, mpi().errors_return);
  if (provided < MPI_THREAD_SERIALIZED)
    throw Error("--expert-parallel: this MPI library gives no MPI_THREAD_SERIALIZED support");
  check_mpi(mpi().comm_dup(mpi().comm_world, &g_job.comm), "MPI_Comm_dup");
  g_job.have_comm = true;
  mpi().comm_set_errhandler(g_job.comm, mpi().errors_return);
  mpi().comm_rank(g_job.comm, &g_job.world.rank);
  mpi().comm_size(g_job.comm, &g_job.world.size);
  return g_job.world;
}

World world() {
  return g_job.world;
}

std::shared_ptr<ExpertExecutor> remote_executor(const ModelFiles& files, const K3Config& config,
                                                const LoadOptions& load, Isa isa) {
  if (g_job.world.rank != 0 || g_job.world.size < 2)
    throw Error("expert-parallel: remote_executor() is rank 0's, in a job of 2 or more ranks");
  g_job.timeout = load.ep_timeout;
  std::vector<int> owners = expert_owners(config.num_experts, g_job.world.size, load.ep_weights);
  const std::map<std::string, std::string> mine = fingerprint(files, load, isa);
  // Every worker says what it sees; each gets the verdict once all have answered.
  std::string why;
  for (int r = 1; r < g_job.world.size; ++r) {
    std::vector<uint8_t> hello;
    if (!receive(r, kHello, hello, now_seconds() + load.ep_timeout,
                 "the start-up check of rank " + std::to_string(r))) {
      g_job.failed = true;
      throw Error("expert-parallel: rank " + std::to_string(r) + " did not report within " +
                  std::to_string(static_cast<int>(load.ep_timeout)) +
                  " s at start-up (its model directory may be slow or missing; --ep-timeout)");
    }
    const std::string text(hello.begin(), hello.end());
    std::string m = text.rfind("error\t", 0) == 0
                        ? "rank " + std::to_string(r) + ": " + text.substr(6)
                        : mismatch(r, mine, decode(text));
    if (why.empty()) why = m;
  }
  for (int r = 1; r < g_job.world.size; ++r)
    send_bytes(r, kVerdict, why.data(), why.size(),
               "the start-up verdict for rank " + std::to_string(r));
  if (!why.empty())
    throw Error("expert-parallel: the ranks do not see the same model: " + why +
                " (every rank needs the same config.json and shards)");
  auto executor = std::make_shared<RemoteExecutor>(config, load.ep_timeout, std::move(owners));
  g_executor = executor;
  return executor;
}

std::string describe(int64_t tokens, const ExpertCacheStats& own) {
  const std::shared_ptr<RemoteExecutor> e = g_executor.lock();
  return e ? e->describe(tokens, own) : std::string();
}

ExchangeFigures figures(const ExpertCacheStats& own) {
  const std::shared_ptr<RemoteExecutor> e = g_executor.lock();
  return e ? e->figures(own) : ExchangeFigures{};
}

// A worker's wait for rank 0's next message (any tag), polling with the growing pause.
static MPI_Status next_from_rank0() {
  int flag = 0;
  MPI_Status status;
  Backoff backoff;
  while (!flag) {
    check_mpi(mpi().iprobe(0, MPI_ANY_TAG, g_job.comm, &flag, &status), "waiting for rank 0");
    if (!flag) backoff.pause();
  }
  return status;
}

int serve_worker(const std::string& model_dir, const LoadOptions& load) {
  const int rank = g_job.world.rank;
  std::vector<uint8_t> message;
  const auto forever = [] { return now_seconds() + 1e12; };
  // Start-up: what this rank sees goes to rank 0, which says whether the job goes on.
  std::unique_ptr<ModelFiles> files;
  K3Config config;
  Isa isa = Isa::kScalar;
  std::string hello;
  try {
    files = std::make_unique<ModelFiles>(model_dir, load.extra_dirs);
    config = parse_k3_config(files->config_root(), model_dir + "/config.json");
    isa = chosen_isa(load.isa);
    hello = encode(fingerprint(*files, load, isa));
  } catch (const std::exception& e) {
    hello = std::string("error\t") + e.what();
  }
  send_bytes(0, kHello, hello.data(), hello.size(), "the start-up check");
  for (;;) {
    const MPI_Status status = next_from_rank0();
    if (status.MPI_TAG == kStop) return 0;
    if (status.MPI_TAG == kVerdict) {
      receive(0, kVerdict, message, forever(), "the start-up verdict");
      if (!message.empty() || !files) return 1;  // rank 0 reports why
      break;
    }
    receive(0, status.MPI_TAG, message, forever(), "a message before the start-up verdict");
  }
  const int64_t num_layers = load.layers > 0 && load.layers < config.num_hidden_layers
                                 ? load.layers
                                 : config.num_hidden_layers;
  const std::unique_ptr<ExpertStore> store = load_expert_store(*files, config, num_layers);
  ExpertCacheSetup setup;
  for (int64_t l = 0; l < num_layers; ++l)
    if (config.ffn[static_cast<size_t>(l)] == FfnKind::kMoE) setup.moe_layers.push_back(l);
  setup.num_experts = config.num_experts;
  setup.history_layers = config.num_hidden_layers;
  ExpertCache cache(*store, load.cache, std::move(setup));
  Compute compute;
  compute.kernels = &kernel_table(isa);
  compute.idot = load.idot;
  WorkerStep step(config, compute);
  std::vector<float> out;
  uint64_t steps = 0;
  const auto counters = [&] {
    const ExpertCacheStats s = cache.stats();
    RankCounters c;
    c.pairs = static_cast<double>(step.pairs());
    c.steps = static_cast<double>(steps);
    c.hits = static_cast<double>(s.hits);
    c.misses = static_cast<double>(s.misses);
    c.bytes_read = static_cast<double>(s.bytes_read);
    c.drive_bytes = static_cast<double>(s.drive_bytes);
    c.busy_seconds = s.busy_seconds;
    c.compute_seconds = step.compute_seconds();
    return c;
  };
  std::fprintf(stderr, "expert-parallel: rank %d of %d serves its experts (pid %d)\n", rank,
               g_job.world.size, static_cast<int>(::getpid()));
  for (;;) {
    const MPI_Status status = next_from_rank0();
    receive(0, status.MPI_TAG, message, forever(), "a message from rank 0");
    switch (status.MPI_TAG) {
      case kStop:
        return 0;
      case kStats: {
        const RankCounters c = counters();
        send_bytes(0, kStats, &c, sizeof c, "the counters");
        break;
      }
      case kStep:
        try {
          step.run(cache, message, out);
          ++steps;
        } catch (const std::exception& e) {
          const std::string why = e.what();
          send_bytes(0, kFailed, why.data(), why.size(), "a failure report");
          break;
        }
        {
          const RankCounters c = counters();
          const size_t n = out.size();
          out.resize(n + kCounterFloats);
          std::memcpy(out.data() + n, &c, sizeof c);
          send_bytes(0, kOut, out.data(), out.size() * sizeof(float), "a step's output");
          out.resize(n);
        }
        break;
      default:
        break;
    }
  }
}

int leave(int status) {
  if (!g_job.joined) return status;
  if (g_job.world.rank == 0 && g_job.world.size > 1) {
    if (g_job.failed) {
      std::fflush(stdout);
      std::fflush(stderr);
      mpi().abort(mpi().comm_world, status != 0 ? status : 1);
    }
    std::vector<MPI_Request> sends(static_cast<size_t>(g_job.world.size - 1), mpi().request_null);
    bool ok = true;
    for (int r = 1; r < g_job.world.size; ++r)
      ok = ok && mpi().isend(nullptr, 0, mpi().byte, r, kStop, g_job.comm,
                             &sends[static_cast<size_t>(r - 1)]) == MPI_SUCCESS;
    const double deadline = now_seconds() + g_job.timeout;
    for (MPI_Request& s : sends) {
      try {
        ok = ok && wait_until(s, MPI_STATUS_IGNORE, deadline, "stopping the ranks");
      } catch (const Error&) {
        ok = false;
      }
    }
    if (!ok) {
      std::fprintf(stderr, "expert-parallel: the ranks did not take the stop; ending the job\n");
      std::fflush(stderr);
      mpi().abort(mpi().comm_world, status != 0 ? status : 1);
    }
  }
  if (g_job.have_comm) mpi().comm_free(&g_job.comm);
  g_job.have_comm = false;
  mpi().finalize();
  g_job.joined = false;
  return status;
}

}  // namespace k3::dist
