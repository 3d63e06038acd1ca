// options/tool_cli.h — the command lines of the tools (k3_synth, k3_repack, k3_bench), whose
// options are CLI11 apps of their own rather than rows of the option table (options.h): the same
// help layout as the table's programs (usage line, one paragraph, groups, "[default X]" on every
// option) and the same errors for what they do not take ("unknown option --ot (did you mean
// --out?)", "unknown command 'decod' (did you mean 'decode'?)"). The tools link CLI11 themselves;
// this header only names its App.
#pragma once

#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace k3 {

// What a tool's main does after parse_tool_args: `status` < 0 — run; else print `out` on stdout
// and `err` on stderr and return `status` (0 after --help or --version, 2 after a usage error).
struct ToolArgs {
  int status = -1;
  std::string out, err;
  // Prints `out` and `err` and returns `status`; a main does `if (parsed.status >= 0) return
  // parsed.finish();`.
  int finish() const;
};

// Parses `args` (argv[0] excluded) with `app`, whose name is the program's. An option in the
// group "" is a hidden testing hook. Required options and a required subcommand are checked after
// the unknown arguments, so a misspelt --out is named as such, not as a missing --out. An option
// without a default of its own shows `->default_str("...")` ("the preset's"), else "none".
ToolArgs parse_tool_args(CLI::App& app, const std::vector<std::string>& args);

// `app`'s help (a tool, or one of its subcommands: "usage: k3_bench decode [<model_dir>]
// [options]"), laid out like the option table's programs.
std::string tool_help(const CLI::App& app);

}  // namespace k3
