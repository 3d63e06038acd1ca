#include "test_util.h"

#include <sys/wait.h>

#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>

#include "io/file.h"

namespace k3::testing {

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
  const std::filesystem::path err_path = std::filesystem::temp_directory_path() /
      ("k3_test_err_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  const std::string full = command + " <" + (stdin_path.empty() ? "/dev/null" : stdin_path) + " 2>" + err_path.string();
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

}  // namespace k3::testing
