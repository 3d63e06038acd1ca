// grammar/json_schema.h — JSON Schema to a grammar of compact JSON (docs/structured_output.md §4).
//
// Every instance the grammar accepts validates against the schema (the grammar may accept a
// subset: properties come in the schema's order, no whitespace, no additional properties unless
// the schema allows them). A keyword that cannot be enforced is refused, never ignored.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace k3::grammar {

// A schema the converter refuses: `where` is the JSON pointer of the sub-schema ("#/properties/
// a"), `keyword` the keyword at fault ("" when the schema itself is malformed).
class SchemaError : public std::runtime_error {
 public:
  SchemaError(std::string where, std::string keyword, const std::string& what);
  const std::string& where() const { return where_; }
  const std::string& keyword() const { return keyword_; }

 private:
  std::string where_, keyword_;
};

// The GBNF of the JSON texts `schema_json` (a JSON Schema, draft 2020-12 keywords) accepts; its
// start rule is `root`. Throws SchemaError.
std::string json_schema_to_gbnf(std::string_view schema_json);

// The rules of several schemas in one grammar: schema i's start rule is `<root_prefix>-<i>`,
// their helper rules distinct, and the shared JSON rules (value, string, ...) once.
std::string json_schemas_to_gbnf(const std::vector<std::string>& schemas_json,
                                 std::string_view root_prefix);

// The GBNF of any JSON object (OpenAI's `json_object` response format).
std::string json_object_gbnf();

}  // namespace k3::grammar
