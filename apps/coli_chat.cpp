// apps/coli_chat.cpp — `coli chat` (placeholder until the terminal chat lands).
#include "apps/coli_commands.h"

namespace coli {

int chat(const k3::Options&, const std::map<std::string, std::string>&, const std::vector<std::string>&) {
  throw UsageError("coli chat is not built yet");
}

}  // namespace coli
