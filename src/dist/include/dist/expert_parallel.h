// dist/expert_parallel.h — expert parallelism over MPI (docs/scale-out.md §2): routed expert e of
// every MoE layer is computed by rank e mod N (or in proportion to --ep-weights). Rank 0 runs
// everything else (embedding, attention, router, shared experts, head, tokenizer, HTTP) and a
// remote executor behind the expert seam (model/expert_executor.h); ranks 1..N-1 load only the
// routed experts and serve MoE steps. Owns: joining and leaving the MPI job, the start-up check,
// the exchange, the worker loop, the per-rank counters. Does not own: the MoE step or its summation
// order (model/latent_moe.cpp), so a pair computed on another rank is added where and when the
// CPU's would be: the bits of one node.
//
// No MPI type appears here: only this module's sources include mpi.h. Built without MPI
// (K3_MPI=OFF), join() refuses and everything else is the one-node behaviour.
//
// Thread-safety: join() and leave() on the main thread; the executor on one thread at a time (the
// engine's); MPI runs at MPI_THREAD_SERIALIZED.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "experts/expert_cache.h"
#include "io/model_files.h"
#include "kernels/isa.h"
#include "model/config.h"
#include "model/expert_executor.h"
#include "options/options.h"

namespace k3::dist {

// This process's place in the job: rank 0 of 1 until join().
struct World {
  int rank = 0;
  int size = 1;
};

// Joins the MPI job (MPI errors returned, never aborting). Call once from main before other
// threads start, and only for --expert-parallel. Without mpirun: rank 0 of 1 (one node). Throws
// k3::Error when the build has no MPI or MPI cannot start.
World join(int* argc, char*** argv);
// The world join() found (rank 0 of 1 before, or without, it).
World world();

// The rank that computes routed expert e (of every layer), for e < num_experts, in a job of
// `size` ranks: with no weights e mod size; with one weight per rank (--ep-weights) each rank's
// share in proportion, interleaved (smooth weighted round robin: equal weights give e mod size).
// Throws k3::Error when the weights are not one per rank.
std::vector<int> expert_owners(int64_t num_experts, int size, std::span<const double> weights);

// A worker rank (world().rank > 0): opens model_dir (and load.extra_dirs), checks it against rank
// 0's (config, shard sizes, kernel variant), loads where its experts are, then computes the pairs
// rank 0 sends until rank 0 says stop. Returns the exit status (0 after a stop). Throws k3::Error
// on a failed load; a failed read is sent to rank 0, which reports it.
int serve_worker(const std::string& model_dir, const LoadOptions& load);

// Rank 0 (world().size > 1): the executor that sends each rank its experts' pairs, after checking
// that every rank sees the same config.json and shard sizes (a mismatch throws k3::Error naming
// the rank and the file). A rank that does not answer within load.ep_timeout seconds, or whose
// MPI link fails, makes the MoE step throw k3::Error naming the rank, and every later step too.
std::shared_ptr<ExpertExecutor> remote_executor(const ModelFiles& files, const K3Config& config,
                                                const LoadOptions& load, Isa isa);

// Rank 0: one line of per-rank counters (pairs, expert hits, misses, MB read, GB/s; rank 0's from
// `own`, its expert cache's) and the exchange time per token over `tokens` tokens; "" without
// expert parallelism.
std::string describe(int64_t tokens, const ExpertCacheStats& own);

// Rank 0's figures for /metrics, without any MPI call (thread-safe): the exchange totals and each
// rank's counters as its latest answer carried them (rank 0's from `own`). ranks == 1 without
// expert parallelism.
struct RankFigures {
  int rank = 0;
  double pairs = 0, hits = 0, misses = 0, bytes_read = 0, drive_bytes = 0, busy_seconds = 0;
};
struct ExchangeFigures {
  int ranks = 1;
  double exchange_seconds = 0;
  uint64_t bytes_sent = 0, bytes_received = 0;
  std::vector<RankFigures> per_rank;  // [ranks] when ranks > 1
};
ExchangeFigures figures(const ExpertCacheStats& own);

// Ends this process's part in the job and returns `status`. Rank 0 stops the workers and leaves
// MPI; when a rank has failed (or the workers do not stop within the timeout) it aborts the job
// instead, which ends every rank. Workers leave MPI. A no-op without join().
int leave(int status);

}  // namespace k3::dist
