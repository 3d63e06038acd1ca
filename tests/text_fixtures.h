// tests/text_fixtures.h — the released tokenizer (tests/data/k3-release/README.md),
// shared by the text front end's tests: loaded once per test process.
#pragma once

#include <string>

#include "text/tokenizer.h"

namespace k3::testing {

inline const std::string kReleaseDir = std::string(K3_SOURCE_DIR) + "/tests/data/k3-release";

inline const text::Tokenizer& release_tokenizer() {
  static const text::Tokenizer tokenizer = text::Tokenizer::load(kReleaseDir);
  return tokenizer;
}

}  // namespace k3::testing
