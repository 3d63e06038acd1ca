#include "test_util.h"

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "io/file.h"
#include "io/model_files.h"
#include "synth_lib.h"

namespace k3::testing {

std::string poisoned_copy(const std::string& source, const std::string& dir,
                          const std::string& tensor, uint64_t index, const std::string& bytes) {
  namespace fs = std::filesystem;
  std::string shard;
  uint64_t at = 0;
  {
    const ModelFiles files(source);
    const LocatedTensor t = files.find(tensor);
    if (t.info == nullptr) throw Error(source + ": no tensor " + tensor + " to poison");
    if (index * dtype_size(t.info->dtype) + bytes.size() > t.info->nbytes)
      throw Error(tensor + ": element " + std::to_string(index) + " is past its end");
    shard = fs::path(t.shard->path()).filename().string();
    at = t.info->file_offset + index * dtype_size(t.info->dtype);
  }
  for (const auto& e : fs::directory_iterator(source)) {
    const fs::path to = fs::path(dir) / e.path().filename();
    if (e.path().filename() == shard)
      fs::copy_file(e.path(), to);
    else
      fs::create_symlink(fs::absolute(e.path()), to);
  }
  const std::string path = (fs::path(dir) / shard).string();
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(at));
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw Error(path + ": cannot write the poisoned bytes");
  return path;
}

CommandResult run_command(const std::string& command) {
  CommandResult r;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) r.out.append(buf.data(), n);
  const int raw = ::pclose(pipe);
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  return r;
}

CommandResult run_split(const std::string& command, const std::string& stdin_path) {
  static int counter = 0;
  const std::filesystem::path err_path =
      std::filesystem::temp_directory_path() /
      ("k3_test_err_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  const std::string full =
      command + " <" + (stdin_path.empty() ? "/dev/null" : stdin_path) + " 2>" + err_path.string();
  CommandResult r;
  FILE* pipe = ::popen(full.c_str(), "r");
  if (!pipe) return r;
  std::array<char, 65536> buf{};
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) r.out.append(buf.data(), n);
  const int raw = ::pclose(pipe);
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  std::error_code ec;
  if (std::filesystem::exists(err_path, ec)) r.err = k3::read_text_file(err_path.string());
  std::filesystem::remove(err_path, ec);
  return r;
}

namespace {
bool twin_isa_tests = false;
}

bool twin_isa_tests_defined() {
  twin_isa_tests = true;
  return true;
}

std::string isa_left_out(Isa isa) {
  if (!isa_supported(isa)) return "not available on this CPU";
  // K3_ISA=avx2 (as for the engine) caps the variants too, so that a run with it checks what an
  // AVX2-only machine checks and says so.
  Isa cap = Isa::kAvx512;
  const char* forced = std::getenv("K3_ISA");
  if (forced && std::string(forced) != "auto" && parse_isa(forced, &cap) &&
      static_cast<int>(isa) > static_cast<int>(cap))
    return "excluded by K3_ISA=" + std::string(forced);
  return "";
}

std::vector<Isa> twin_isas() {
  EXPECT_TRUE(twin_isa_tests) << "this test binary calls twin_isas() without K3_TWIN_ISA_TESTS(): "
                                 "the variants it leaves out would not show as skipped tests";
  std::vector<Isa> out;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512})
    if (isa_left_out(isa).empty()) out.push_back(isa);
  return out;
}

std::vector<Isa> simd_isas() {
  std::vector<Isa> out = twin_isas();
  out.erase(std::remove(out.begin(), out.end(), Isa::kScalar), out.end());
  return out;
}

void check_twin_isa(Isa isa) {
  const std::string why = isa_left_out(isa);
  if (!why.empty())
    GTEST_SKIP() << "ISA " << isa_name(isa) << ": " << why << ", its twin tests did not run";
  EXPECT_EQ(kernel_table(isa).isa, isa) << isa_name(isa);
}

void write_tiny_synth(const std::string& dir, int64_t experts, uint64_t seed) {
  synth::SynthSpec spec = synth::preset_spec("tiny");
  synth::apply_overrides(&spec, -1, experts);
  spec.seed = seed;
  spec.progress = false;
  synth::write_checkpoint(spec, dir);
}

void select_lavapipe() {
  setenv("VK_ICD_FILENAMES", K3_LAVAPIPE_ICD, 0);
  setenv("XDG_RUNTIME_DIR", K3_BINARY_DIR "/tests", 0);
}

}  // namespace k3::testing
