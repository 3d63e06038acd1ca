// apps/k3_options_md — docs/options.md's option table, generated from the option table itself
// (options/options.h). docs/options.md holds it between "<!-- options-table -->" and
// "<!-- /options-table -->"; tests/options_test fails when that copy is stale.
//   k3_options_md                 print the table
//   k3_options_md --write FILE    replace the marked section of FILE with it
#include <cstdio>
#include <string>

#include "io/file.h"
#include "options/options.h"
#include "util/error.h"

int main(int argc, char** argv) {
  const std::string table = k3::options_table_markdown();
  if (argc == 2 && std::string(argv[1]) == "--version") {
    std::printf("%s\n", k3::version_text("k3_options_md").c_str());
    return 0;
  }
  if (argc == 1) {
    std::fputs(table.c_str(), stdout);
    return 0;
  }
  if (argc != 3 || std::string(argv[1]) != "--write") {
    std::fprintf(stderr, "usage: k3_options_md [--write docs/options.md]\n");
    return 2;
  }
  try {
    std::string text = k3::read_text_file(argv[2]);
    const std::string open = "<!-- options-table -->\n", close = "<!-- /options-table -->";
    const size_t begin = text.find(open), end = text.find(close);
    if (begin == std::string::npos || end == std::string::npos || end < begin)
      throw k3::Error(std::string(argv[2]) +
                      ": no \"<!-- options-table -->\" ... \"<!-- /options-table -->\" section");
    text.replace(begin + open.size(), end - begin - open.size(), table);
    k3::write_file_atomic(argv[2], text.data(), text.size());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "k3_options_md: %s\n", e.what());
    return 1;
  }
  return 0;
}
