// options/tool_cli.cpp — the tools' command lines (options/tool_cli.h): CLI11 parses, this file
// words the help and the errors like the option table's programs (options.cpp), with the same
// layout (help_layout.h) and the same "did you mean" (nearest_name, options.h).
#include "options/tool_cli.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <set>
#include <sstream>

#include "help_layout.h"
#include "options/options.h"
#include "util/error.h"

namespace k3 {
namespace {

// "k3_bench decode": the names from the tool down to `app`.
std::string full_name(const CLI::App& app) {
  std::string name = app.get_name();
  for (const CLI::App* p = app.get_parent(); p; p = p->get_parent())
    name = p->get_name() + " " + name;
  return name;
}

std::vector<const CLI::App*> all_subcommands(const CLI::App& app) {
  return app.get_subcommands([](const CLI::App*) { return true; });
}

// The deepest subcommand the parse chose (the tool itself when none).
CLI::App* selected(CLI::App& app) {
  CLI::App* at = &app;
  while (!at->get_subcommands().empty()) at = at->get_subcommands().front();
  return at;
}

bool is_help_or_version(const CLI::App& app, const CLI::Option* o) {
  return o == app.get_help_ptr() || o == app.get_version_ptr();
}

// "<tiny|demo|slice>", "<dir>", "<int>": CLI11's type name, its member list as a|b|c.
std::string value_text(const CLI::Option& o) {
  std::string type = o.get_type_name();
  const size_t open = type.find('{'), close = type.rfind('}');
  if (open != std::string::npos && close != std::string::npos && close > open) {
    type = type.substr(open + 1, close - open - 1);
    std::replace(type.begin(), type.end(), ',', '|');
  } else {
    type = type.substr(0, type.find(':'));
    std::transform(type.begin(), type.end(), type.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (type.empty()) type = "text";
  }
  return "<" + type + ">";
}

std::string names_text(const CLI::Option& o) {
  std::string out;
  for (const std::string& s : o.get_snames()) out += (out.empty() ? "-" : ", -") + s;
  for (const std::string& l : o.get_lnames()) out += (out.empty() ? "--" : ", --") + l;
  return out;
}

std::string help_for(const CLI::App& app, const std::set<const CLI::Option*>& required) {
  std::ostringstream out;
  const std::vector<const CLI::App*> commands = all_subcommands(app);
  const std::vector<const CLI::Option*> options = app.get_options();
  out << "usage: " << full_name(app);
  if (!commands.empty()) out << " <command>";
  for (const CLI::Option* o : options)
    if (!o->get_positional() && required.count(o))
      out << " " << names_text(*o) << " " << value_text(*o);
  for (const CLI::Option* o : options)
    if (o->get_positional())
      out << (required.count(o) ? " <" + o->get_name() + ">" : " [<" + o->get_name() + ">]");
  out << (commands.empty() ? " [options]\n" : " [command options]\n");
  // The paragraph, wrapped at 100 columns.
  std::istringstream words(app.get_description());
  size_t column = 0;
  for (std::string w; words >> w;) {
    if (column > 0 && column + 1 + w.size() > help_layout::kWidth) {
      out << "\n";
      column = 0;
    } else if (column > 0) {
      out << ' ';
      ++column;
    }
    out << w;
    column += w.size();
  }
  out << "\n";
  if (!commands.empty()) {
    out << "\ncommands:\n";
    for (const CLI::App* c : commands)
      help_layout::entry(out, "  " + c->get_name(), c->get_description(), "");
    out << "\n`" << full_name(app) << " <command> --help` lists the command's options.\n";
  }
  auto tail = [&](const CLI::Option& o) {
    if (required.count(&o)) return std::string("[required]");
    std::string d = o.get_default_str();
    if (d.empty()) d = o.get_expected_max() == 0 ? "off" : "none";
    return "[default " + d + "]";
  };
  bool any_positional = false;
  for (const CLI::Option* o : options) {
    if (!o->get_positional() || o->get_group().empty()) continue;
    if (!any_positional) out << "\narguments:\n";
    any_positional = true;
    help_layout::entry(out, "  <" + o->get_name() + ">", o->get_description(), tail(*o));
  }
  // Groups in the order of their first option.
  std::vector<std::string> groups;
  for (const CLI::Option* o : options)
    if (!o->get_positional() && !o->get_group().empty() && !is_help_or_version(app, o) &&
        std::find(groups.begin(), groups.end(), o->get_group()) == groups.end())
      groups.push_back(o->get_group());
  for (const std::string& g : groups) {
    out << "\n" << (g == "Options" ? "options" : g) << ":\n";  // CLI11's default group
    for (const CLI::Option* o : options) {
      if (o->get_positional() || o->get_group() != g || is_help_or_version(app, o)) continue;
      std::string left = "  " + names_text(*o);
      if (o->get_expected_max() != 0) left += " " + value_text(*o);
      help_layout::entry(out, left, o->get_description(), tail(*o));
    }
  }
  help_layout::other(out);
  return out.str();
}

// The flags `app` takes, with their dashes, its own before its parents'.
std::vector<std::string> flags_of(const CLI::App& app, bool value_only = false) {
  std::vector<std::string> names;
  for (const CLI::App* a = &app; a; a = a->get_parent())
    for (const CLI::Option* o : a->get_options()) {
      if (o->get_positional() || (value_only && o->get_expected_max() == 0)) continue;
      for (const std::string& s : o->get_snames()) names.push_back("-" + s);
      for (const std::string& l : o->get_lnames()) names.push_back("--" + l);
    }
  return names;
}

std::string command_list(const CLI::App& app) {
  std::string list;
  for (const CLI::App* c : all_subcommands(app)) list += (list.empty() ? "" : ", ") + c->get_name();
  return "commands: " + list + " (`" + full_name(app) + " --help` says what each does)\n";
}

ToolArgs usage_error(const CLI::App& app, const std::string& message) {
  return {2, "", full_name(app) + ": " + message + "\n"};
}

}  // namespace

std::string tool_help(const CLI::App& app) {
  std::set<const CLI::Option*> required;
  for (const CLI::Option* o : app.get_options())
    if (o->get_required()) required.insert(o);
  return help_for(app, required);
}

int ToolArgs::finish() const {
  std::fputs(out.c_str(), stdout);
  std::fputs(err.c_str(), stderr);
  return status;
}

ToolArgs parse_tool_args(CLI::App& app, const std::vector<std::string>& args) {
  // CLI11 would stop at a missing required option before it looks at an unknown one: required
  // options (and commands) are checked below instead, after the unknown arguments.
  std::set<const CLI::Option*> required;
  std::vector<CLI::App*> apps = {&app};
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) apps.push_back(sub);
  for (CLI::App* a : apps) {
    a->allow_extras();
    for (CLI::Option* o : a->get_options())
      if (o->get_required()) {
        required.insert(o);
        o->required(false);
      }
  }
  const bool needs_command = app.get_require_subcommand_min() > 0;
  app.require_subcommand(0);

  // A tool with commands: the first argument names one.
  CLI::App* command = &app;
  if (!all_subcommands(app).empty()) {
    const std::string first = args.empty() ? "" : args.front();
    if (first == "-h" || first == "--help") return {0, help_for(app, required), ""};
    if (first != "--version") {
      if (args.empty())
        return {2, "", full_name(app) + ": a command is required\n" + command_list(app)};
      CLI::App* found = nullptr;
      for (CLI::App* sub : apps)
        if (sub != &app && sub->get_name() == first) found = sub;
      if (!found) {
        std::vector<std::string> names;
        for (const CLI::App* c : all_subcommands(app)) names.push_back(c->get_name());
        std::string message;
        if (first.starts_with("-")) {
          message = unknown_argument_message(first, flags_of(app)) + ": the command comes first (" +
                    full_name(app) + " <command> [options])";
        } else {
          const std::string near = nearest_name(first, names);
          message = "unknown command '" + first + "'" +
                    (near.empty() ? "" : " (did you mean '" + near + "'?)");
        }
        return {2, "", full_name(app) + ": " + message + "\n" + command_list(app)};
      }
      command = found;
    }
  }
  try {
    std::vector<std::string> long_names;
    for (const std::string& n : flags_of(*command))
      if (n.starts_with("--")) long_names.push_back(n);
    check_single_dash(args, long_names, flags_of(*command, true));
  } catch (const Error& e) {
    return usage_error(*command, e.what());
  }

  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    return {0, help_for(*selected(app), required), ""};
  } catch (const CLI::CallForVersion& e) {
    return {0, std::string(e.what()) + "\n", ""};
  } catch (const CLI::ArgumentMismatch& e) {
    // CLI11 says "--out: 1 required TEXT missing".
    const std::string what = e.what();
    const size_t colon = what.find(':');
    if (what.starts_with("-") && colon != std::string::npos && what.ends_with(" missing"))
      return usage_error(*selected(app), what.substr(0, colon) + " needs a value");
    return usage_error(*selected(app), what);
  } catch (const CLI::ParseError& e) {
    return usage_error(*selected(app), e.what());
  }
  CLI::App& chosen = *selected(app);
  const std::vector<std::string> extras = app.remaining(true);
  if (!extras.empty()) {
    // A positional after an unknown flag is most likely its value: name the flag.
    const auto flag = std::find_if(extras.begin(), extras.end(), [](const std::string& e) {
      return e.size() > 1 && e[0] == '-';
    });
    return usage_error(
        chosen,
        unknown_argument_message(flag != extras.end() ? *flag : extras.front(), flags_of(chosen)));
  }
  if (needs_command && &chosen == &app) return usage_error(app, "a command is required");
  for (const CLI::Option* o : chosen.get_options())
    if (required.count(o) && o->count() == 0)
      return usage_error(chosen, "missing " +
                                     (o->get_positional() ? "<" + o->get_name() + ">"
                                                          : names_text(*o) + " " + value_text(*o)) +
                                     ": " + o->get_description() + " (`" + full_name(chosen) +
                                     " --help` lists the options)");
  return {};
}

}  // namespace k3
