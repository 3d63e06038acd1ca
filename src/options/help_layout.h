// options/help_layout.h (private to src/options/) — one --help entry as every program prints it:
// the flags in a 34-column left column, then the help's words and a "[default X, env V]" tail
// kept whole, wrapped at 100 columns. options.cpp (the option table's programs) and tool_cli.cpp
// (k3_synth, k3_repack, k3_bench) both print with it, so their help looks the same.
#pragma once

#include <iomanip>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

namespace k3::help_layout {

constexpr size_t kLeft = 34, kWidth = 100;

// `left` ("  -n, --ngen <0..>"), then `help` word by word and `tail` as one word.
inline void entry(std::ostream& out, const std::string& left, const std::string& help,
                  const std::string& tail) {
  out << std::left << std::setw(kLeft) << left;
  if (left.size() >= kLeft) out << "\n" << std::string(kLeft, ' ');
  std::vector<std::string> words;
  std::istringstream help_words(help);
  for (std::string w; help_words >> w;) words.push_back(w);
  if (!tail.empty()) words.push_back(tail);
  size_t column = kLeft;
  for (const std::string& w : words) {
    if (column > kLeft && column + 1 + w.size() > kWidth) {
      out << "\n" << std::string(kLeft, ' ');
      column = kLeft;
    } else if (column > kLeft) {
      out << ' ';
      ++column;
    }
    out << w;
    column += w.size();
  }
  out << "\n";
}

// The closing lines every program's help ends with.
inline void other(std::ostream& out) {
  out << "\nother:\n";
  entry(out, "  -h, --help", "print this help", "");
  entry(out, "  --version", "print the version, git hash, ISA and build type", "");
}

}  // namespace k3::help_layout
