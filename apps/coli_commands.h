// apps/coli_commands.h — the subcommands of the `coli` launcher that run the engine
// (coli_serve.cpp: serve, web; coli_chat.cpp: chat). coli.cpp parses and dispatches.
#pragma once

#include <stdexcept>
#include <string>

#include "engine/service.h"
#include "options/options.h"
#include "server/api.h"

namespace coli {

// A bad command line or configuration: one line on stderr, exit code 2.
class UsageError : public std::runtime_error {
 public:
  explicit UsageError(const std::string& message) : std::runtime_error(message) {}
};

// The engine service settings from the options (shared by serve and chat).
k3::ServiceOptions service_options(const k3::Options& opt);
// The request defaults: the effective --temp / --top-p / --top-k / --min-p (coli's defaults are
// the model card's 0.6 / 0.95, from the option table).
k3::server::ApiConfig api_config(const k3::Options& opt);

// `coli serve` (web = false) and `coli web`. Returns the exit code.
int serve(const k3::Options& opt, bool web);
// `coli chat`. Returns the exit code.
int chat(const k3::Options& opt);

}  // namespace coli
