#include "ggml_peer.h"

#include <dlfcn.h>

#include <filesystem>
#include <system_error>

namespace k3bench {
namespace {

namespace fs = std::filesystem;

std::string dl_error() {
  const char* e = dlerror();
  return e ? e : "unknown dlerror";
}

// The directory holding libggml-base.so under `root` (recursive), or "" when there is none.
std::string find_base_dir(const std::string& root) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return "";
  for (auto it = fs::recursive_directory_iterator(root, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (it->path().filename() == "libggml-base.so") return it->path().parent_path().string();
  }
  return "";
}

}  // namespace

GgmlPeer::GgmlPeer(const std::string& bins_root) {
  dir_ = find_base_dir(bins_root);
  if (dir_.empty()) {
    why_ = "no libggml-base.so under " + bins_root + " (run `npm ci --prefix bench`)";
    return;
  }
  // RTLD_GLOBAL so that the CPU variants resolve their libggml-base symbols against this copy.
  base_ = dlopen((dir_ + "/libggml-base.so").c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (!base_) {
    why_ = "dlopen libggml-base.so: " + dl_error();
    return;
  }
  dequantize_row_mxfp4 = reinterpret_cast<DequantizeRow>(dlsym(base_, "dequantize_row_mxfp4"));

  int best_score = 0;
  std::string best_name;
  std::string failures;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("libggml-cpu-", 0) != 0 || entry.path().extension() != ".so") continue;
    void* h = dlopen(entry.path().c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      failures += " " + name + ": " + dl_error() + ";";
      continue;
    }
    auto score_fn = reinterpret_cast<int (*)()>(dlsym(h, "ggml_backend_score"));
    const int score = score_fn ? score_fn() : 0;  // 0: this CPU lacks the variant's features
    if (score > best_score && dlsym(h, "ggml_vec_dot_mxfp4_q8_0") &&
        dlsym(h, "quantize_row_q8_0")) {
      if (cpu_) dlclose(cpu_);
      cpu_ = h;
      best_score = score;
      best_name = name;
    } else {
      dlclose(h);
    }
  }
  if (!cpu_) {
    why_ = "no libggml-cpu-*.so in " + dir_ + " runs on this CPU" + failures;
    return;
  }
  vec_dot_mxfp4_q8_0 = reinterpret_cast<VecDot>(dlsym(cpu_, "ggml_vec_dot_mxfp4_q8_0"));
  quantize_row_q8_0 = reinterpret_cast<QuantizeRow>(dlsym(cpu_, "quantize_row_q8_0"));
  // Initialises ggml's fp16 tables (used by the generic paths); harmless when unused.
  if (auto init = reinterpret_cast<void (*)()>(dlsym(cpu_, "ggml_cpu_init"))) init();
  variant_ = best_name + " (score " + std::to_string(best_score) + ")";
  ok_ = vec_dot_mxfp4_q8_0 && quantize_row_q8_0;
  if (!ok_) why_ = "missing symbols in " + best_name;
}

GgmlPeer::~GgmlPeer() {
  // The libraries stay loaded: ggml registers atexit/TLS state, unloading early is not worth it.
}

std::vector<uint8_t> repack_mxfp4_for_ggml(const uint8_t* packed, const uint8_t* scales,
                                           size_t rows, size_t cols, int exponent_offset) {
  const size_t groups = cols / 32;
  std::vector<uint8_t> out(rows * groups * kGgmlMxfp4Block);
#pragma omp parallel for schedule(static)
  for (size_t o = 0; o < rows; ++o) {
    for (size_t g = 0; g < groups; ++g) {
      const uint8_t* src = packed + o * (cols / 2) + g * 16;  // elements 32g .. 32g+31
      uint8_t* dst = out.data() + (o * groups + g) * kGgmlMxfp4Block;
      dst[0] = static_cast<uint8_t>(static_cast<int>(scales[o * groups + g]) + exponent_offset);
      auto nib = [src](size_t e) -> uint8_t {
        const uint8_t b = src[e / 2];
        return (e & 1) ? static_cast<uint8_t>(b >> 4) : static_cast<uint8_t>(b & 0xF);
      };
      for (size_t j = 0; j < 16; ++j)
        dst[1 + j] = static_cast<uint8_t>(nib(j) | (nib(j + 16) << 4));
    }
  }
  return out;
}

}  // namespace k3bench
