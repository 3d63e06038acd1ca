// safetensors_test — header parsing and validation of one shard (io/safetensors.h) on in-memory
// files, and the snapshot directory (io/model_files.h) on the k3-tiny fixture and damaged copies.
// Suite names start with Safetensors or ModelFiles (the sanitizer target filters on them).
#include "io/safetensors.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/file.h"
#include "io/model_files.h"
#include "test_util.h"
#include "util/error.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using k3::testing::TempDir;

using k3::testing::error_of;

using k3::testing::kTinyDir;
const std::string kVisionShard = "model-00010-of-000010.safetensors";
const std::string kPath = "mem/test-shard.safetensors";

// 8-byte little-endian length + header + data.
std::vector<uint8_t> assemble(const std::string& header, const std::vector<uint8_t>& data,
                              uint64_t declared_len) {
  std::vector<uint8_t> out(8 + header.size() + data.size());
  for (size_t i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(declared_len >> (8 * i));
  std::copy(header.begin(), header.end(), out.begin() + 8);
  std::copy(data.begin(), data.end(), out.begin() + 8 + static_cast<ptrdiff_t>(header.size()));
  return out;
}
std::vector<uint8_t> assemble(const std::string& header, const std::vector<uint8_t>& data) {
  return assemble(header, data, header.size());
}

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + 31 * i + (i >> 3));
  return v;
}

json entry(const std::string& dtype, const json& shape, uint64_t begin, uint64_t end) {
  return json{{"dtype", dtype}, {"shape", shape}, {"data_offsets", {begin, end}}};
}

std::unique_ptr<k3::SafetensorsShard> open_mem(const std::vector<uint8_t>& bytes,
                                               int64_t fail_at = -1) {
  return std::make_unique<k3::SafetensorsShard>(
      std::make_unique<k3::MemFile>(kPath, bytes, fail_at));
}

// Error message of opening a shard built from `header` + `data_bytes` zero bytes.
std::string open_error(const json& header, size_t data_bytes) {
  const auto bytes = assemble(header.dump(), std::vector<uint8_t>(data_bytes, 0));
  return error_of([&] { open_mem(bytes); });
}

// ---------------------------------------------------------------------------------------------
// Dtype table

struct DtypeCase {
  const char* name;
  k3::DType dtype;
  size_t size;
};
const DtypeCase kDtypes[] = {
    {"BF16", k3::DType::kBF16, 2},      {"F16", k3::DType::kF16, 2},
    {"F32", k3::DType::kF32, 4},        {"F64", k3::DType::kF64, 8},
    {"I64", k3::DType::kI64, 8},        {"I32", k3::DType::kI32, 4},
    {"I16", k3::DType::kI16, 2},        {"I8", k3::DType::kI8, 1},
    {"U8", k3::DType::kU8, 1},          {"BOOL", k3::DType::kBool, 1},
    {"F8_E4M3", k3::DType::kF8E4M3, 1}, {"F8_E5M2", k3::DType::kF8E5M2, 1},
    {"F8_E8M0", k3::DType::kF8E8M0, 1},
};

TEST(SafetensorsDtype, TableNamesAndSizes) {
  for (const auto& c : kDtypes) {
    k3::DType d{};
    ASSERT_TRUE(k3::parse_dtype(c.name, &d)) << c.name;
    EXPECT_EQ(d, c.dtype) << c.name;
    EXPECT_EQ(k3::dtype_size(c.dtype), c.size) << c.name;
    EXPECT_STREQ(k3::dtype_name(c.dtype), c.name);
  }
  k3::DType d = k3::DType::kF32;
  EXPECT_FALSE(k3::parse_dtype("bf16", &d));
  EXPECT_FALSE(k3::parse_dtype("F4", &d));
  EXPECT_FALSE(k3::parse_dtype("", &d));
  EXPECT_EQ(d, k3::DType::kF32);  // untouched on failure
}

// ---------------------------------------------------------------------------------------------
// Valid shards

TEST(SafetensorsShard, EveryDtypeRoundTrips) {
  json header = json::object();
  std::vector<uint8_t> data;
  struct Want {
    std::string name;
    k3::DType dtype;
    std::vector<int64_t> shape;
    uint64_t begin;
    std::vector<uint8_t> bytes;
  };
  std::vector<Want> want;
  uint8_t seed = 1;
  for (const auto& c : kDtypes) {
    const std::vector<int64_t> shape = {3, 2};
    const std::vector<uint8_t> bytes = pattern(6 * c.size, seed++);
    const std::string name = std::string("t.") + c.name;
    header[name] = entry(c.name, shape, data.size(), data.size() + bytes.size());
    want.push_back({name, c.dtype, shape, data.size(), bytes});
    data.insert(data.end(), bytes.begin(), bytes.end());
  }
  const std::string h = header.dump();
  const auto shard = open_mem(assemble(h, data));
  EXPECT_EQ(shard->path(), kPath);
  ASSERT_EQ(shard->tensors().size(), want.size());
  // Tensors come back in data order (here the order they were laid out in).
  for (size_t i = 0; i < want.size(); ++i) {
    const k3::TensorInfo& t = shard->tensors()[i];
    EXPECT_EQ(t.name, want[i].name);
    EXPECT_EQ(t.dtype, want[i].dtype) << t.name;
    EXPECT_EQ(t.shape, want[i].shape) << t.name;
    EXPECT_EQ(t.numel(), 6u) << t.name;
    EXPECT_EQ(t.nbytes, want[i].bytes.size()) << t.name;
    EXPECT_EQ(t.file_offset, 8 + h.size() + want[i].begin) << t.name;
    const k3::TensorInfo* found = shard->find(want[i].name);
    ASSERT_NE(found, nullptr) << t.name;
    EXPECT_EQ(found, &t);
    std::vector<uint8_t> got(t.nbytes, 0xEE);
    shard->read(t, got.data());
    EXPECT_EQ(got, want[i].bytes) << t.name;
  }
  EXPECT_EQ(shard->find("t.missing"), nullptr);
  EXPECT_EQ(shard->find("t.bf16"), nullptr);  // names are case-sensitive
}

TEST(SafetensorsShard, TensorsAreReturnedInDataOrder) {
  // JSON key order (alphabetical here) differs from data order.
  json header;
  header["a"] = entry("F32", {2}, 16, 24);
  header["b"] = entry("F32", {2}, 0, 8);
  header["c"] = entry("U8", {8}, 8, 16);
  const auto data = pattern(24, 7);
  const auto shard = open_mem(assemble(header.dump(), data));
  ASSERT_EQ(shard->tensors().size(), 3u);
  EXPECT_EQ(shard->tensors()[0].name, "b");
  EXPECT_EQ(shard->tensors()[1].name, "c");
  EXPECT_EQ(shard->tensors()[2].name, "a");
  std::vector<uint8_t> got(8);
  shard->read(*shard->find("a"), got.data());
  EXPECT_EQ(got, std::vector<uint8_t>(data.begin() + 16, data.end()));
}

TEST(SafetensorsShard, MetadataIsSkipped) {
  json header;
  header["__metadata__"] = {{"format", "pt"}, {"note", "not a tensor"}};
  header["w"] = entry("BF16", {4}, 0, 8);
  const auto shard = open_mem(assemble(header.dump(), pattern(8, 3)));
  ASSERT_EQ(shard->tensors().size(), 1u);
  EXPECT_EQ(shard->tensors()[0].name, "w");
  EXPECT_EQ(shard->find("__metadata__"), nullptr);
}

TEST(SafetensorsShard, MetadataOnlyHeaderHasNoTensors) {
  json header;
  header["__metadata__"] = {{"format", "pt"}};
  const auto shard = open_mem(assemble(header.dump(), {}));
  EXPECT_TRUE(shard->tensors().empty());
}

TEST(SafetensorsShard, ScalarAndEmptyShapes) {
  json header;
  header["scalar"] = entry("F32", json::array(), 0, 4);
  header["empty"] = entry("F32", {0, 5}, 4, 4);
  header["after"] = entry("I16", {1}, 4, 6);
  const auto data = pattern(6, 9);
  const auto shard = open_mem(assemble(header.dump(), data));
  const k3::TensorInfo* s = shard->find("scalar");
  ASSERT_NE(s, nullptr);
  EXPECT_TRUE(s->shape.empty());
  EXPECT_EQ(s->numel(), 1u);
  EXPECT_EQ(s->nbytes, 4u);
  std::vector<uint8_t> got(4);
  shard->read(*s, got.data());
  EXPECT_EQ(got, std::vector<uint8_t>(data.begin(), data.begin() + 4));
  const k3::TensorInfo* e = shard->find("empty");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->numel(), 0u);
  EXPECT_EQ(e->nbytes, 0u);
  EXPECT_EQ(e->shape, (std::vector<int64_t>{0, 5}));
}

TEST(SafetensorsHeader, ParseDirectlyReportsAbsoluteOffsets) {
  json header;
  header["x"] = entry("F64", {2}, 0, 16);
  header["y"] = entry("I32", {3}, 16, 28);
  const std::string h = header.dump();
  const auto t = k3::parse_safetensors_header(h, 8 + h.size() + 28, kPath);
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].name, "x");
  EXPECT_EQ(t[0].file_offset, 8 + h.size());
  EXPECT_EQ(t[1].name, "y");
  EXPECT_EQ(t[1].file_offset, 8 + h.size() + 16);
  EXPECT_EQ(t[1].nbytes, 12u);
}

// ---------------------------------------------------------------------------------------------
// Rejections: every message names the file and, where there is one, the tensor.

TEST(SafetensorsReject, FileShorterThanEightBytes) {
  for (size_t n : {0, 1, 5, 7}) {
    const std::string msg = error_of([&] { open_mem(std::vector<uint8_t>(n, 0)); });
    EXPECT_HAS(msg, kPath);
  }
}

TEST(SafetensorsReject, HeaderLengthPastEndOfFile) {
  const std::string h = R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})";
  const auto bytes = assemble(h, {0}, 1000);
  const std::string msg = error_of([&] { open_mem(bytes); });
  EXPECT_HAS(msg, kPath);
  EXPECT_HAS(msg, "1000");
  // The same through the header parser: the header alone does not fit the file.
  const std::string msg2 = error_of([&] { k3::parse_safetensors_header(h, h.size() + 7, kPath); });
  EXPECT_HAS(msg2, kPath);
}

TEST(SafetensorsReject, HeaderLengthAboveCap) {
  // Declared length one past the cap; the file is small, the cap must be what is reported.
  const auto bytes = assemble("{}", {}, k3::kMaxHeaderBytes + 1);
  const std::string msg = error_of([&] { open_mem(bytes); });
  EXPECT_HAS(msg, kPath);
  EXPECT_HAS(msg, std::to_string(k3::kMaxHeaderBytes + 1));
  EXPECT_HAS(msg, "cap");
  // An absurd length (would overflow 8 + N) is refused too.
  const std::string msg2 = error_of([&] { open_mem(assemble("{}", {}, UINT64_MAX)); });
  EXPECT_HAS(msg2, kPath);
}

TEST(SafetensorsReject, BadJson) {
  for (const std::string& h : {std::string("{not json"), std::string(R"({"w":{"dtype":"U8",)"),
                               std::string(""), std::string("\xff\xfe")}) {
    const std::string msg = error_of([&] { open_mem(assemble(h, {})); });
    EXPECT_HAS(msg, kPath);
    EXPECT_HAS(msg, "JSON");
  }
}

TEST(SafetensorsReject, JsonNotAnObject) {
  for (const char* h : {"[1,2,3]", "42", "\"str\"", "null"}) {
    const std::string msg = error_of([&] { open_mem(assemble(h, {})); });
    EXPECT_HAS(msg, kPath);
    EXPECT_HAS(msg, "object");
  }
}

TEST(SafetensorsReject, EntryNotAnObject) {
  json header;
  header["weird"] = json::array({1, 2});
  const std::string msg = open_error(header, 0);
  EXPECT_HAS(msg, kPath);
  EXPECT_HAS(msg, "weird");
}

TEST(SafetensorsReject, UnknownDtype) {
  json header;
  header["w"] = entry("F4", {2}, 0, 1);
  const std::string msg = open_error(header, 1);
  EXPECT_HAS(msg, kPath);
  EXPECT_HAS(msg, "tensor w");
  EXPECT_HAS(msg, "F4");
}

TEST(SafetensorsReject, ShapeTimesDtypeDiffersFromByteRange) {
  json header;
  header["w"] = entry("F32", {2, 2}, 0, 12);  // needs 16
  const std::string msg = open_error(header, 16);
  EXPECT_HAS(msg, kPath);
  EXPECT_HAS(msg, "tensor w");
  EXPECT_HAS(msg, "16");
  EXPECT_HAS(msg, "12");
  json header2;
  header2["v"] = entry("BF16", json::array(), 0, 4);  // a BF16 scalar is 2 bytes
  const std::string msg2 = open_error(header2, 4);
  EXPECT_HAS(msg2, "tensor v");
}

TEST(SafetensorsReject, OffsetsOutsideDataRegion) {
  json header;
  header["ok"] = entry("U8", {4}, 0, 4);
  header["w"] = entry("U8", {8}, 4, 12);
  const std::string msg = open_error(header, 8);
  EXPECT_HAS(msg, kPath);
  EXPECT_HAS(msg, "tensor w");
  json header2;
  header2["z"] = entry("U8", {0}, 100, 100);  // even empty, it must lie inside
  const std::string msg2 = open_error(header2, 8);
  EXPECT_HAS(msg2, "tensor z");
}

TEST(SafetensorsReject, EndBeforeBegin) {
  json header;
  header["w"] = entry("U8", {0}, 8, 4);
  const std::string msg = open_error(header, 16);
  EXPECT_HAS(msg, kPath);
  EXPECT_HAS(msg, "tensor w");
}

// The strict rules of the format (huggingface/safetensors README): the data region is exactly
// the tensors' bytes, and a name appears once. Every container k3_repack writes must pass them.
TEST(SafetensorsReject, HolesBetweenBeforeOrAfterTensors) {
  json header;
  header["a"] = entry("U8", {2}, 0, 2);
  header["b"] = entry("U8", {2}, 6, 8);
  const std::string msg = open_error(header, 8);
  EXPECT_HAS(msg, kPath);
  EXPECT_HAS(msg, "4 bytes between tensors a and b");
  json header2;
  header2["late"] = entry("U8", {2}, 2, 4);
  const std::string msg2 = open_error(header2, 4);
  EXPECT_HAS(msg2, "late");
  EXPECT_HAS(msg2, "starts 2 bytes into the data region");
  // Bytes after the last tensor (8 here) are a hole too.
  json header3;
  header3["w"] = entry("U8", {2}, 0, 2);
  EXPECT_HAS(open_error(header3, 10), "8 bytes after the last tensor");
}

TEST(SafetensorsReject, DuplicateTensorNames) {
  const std::string h = R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                        R"("w":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})";
  const std::string msg = error_of([&] { open_mem(assemble(h, pattern(4, 1))); });
  EXPECT_HAS(msg, kPath);
  EXPECT_HAS(msg, "tensor w appears twice");
}

// The header is read in one SAX pass (no DOM): the rules a DOM walk applied still hold for the
// JSON shapes a DOM absorbed silently.
TEST(SafetensorsHeader, StreamedReadKeepsTheDomRules) {
  const auto open_header = [](const std::string& h, size_t data) {
    return open_mem(assemble(h, pattern(data, 3)));
  };
  const auto header_error = [](const std::string& h, size_t data) {
    return error_of([&] { open_mem(assemble(h, pattern(data, 3))); });
  };
  // "-0" is a non-negative integer; a repeated member counts as its last value; unknown members
  // and nested values in them are skipped.
  {
    const auto shard =
        open_header(R"({"w":{"dtype":"F64","shape":[-0],"x":{"shape":[9],"dtype":1},"dtype":"U8",)"
                    R"("shape":[4],"data_offsets":[0,4]}})",
                    4);
    ASSERT_EQ(shard->tensors().size(), 1u);
    EXPECT_EQ(shard->tensors()[0].dtype, k3::DType::kU8);
    EXPECT_EQ(shard->tensors()[0].shape, std::vector<int64_t>{4});
  }
  // Nested containers inside shape / data_offsets are elements that are not integers.
  EXPECT_HAS(header_error(R"({"w":{"dtype":"U8","shape":[[4]],"data_offsets":[0,4]}})", 4),
             "tensor w: shape entries must be non-negative integers");
  EXPECT_HAS(header_error(R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[[0],[4]]}})", 4),
             "tensor w: data_offsets must be non-negative integers");
  EXPECT_HAS(header_error(R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[0,{"a":4}]}})", 4),
             "tensor w: data_offsets must be non-negative integers");
  EXPECT_HAS(header_error(R"({"w":{"dtype":{"a":"U8"},"shape":[4],"data_offsets":[0,4]}})", 4),
             "tensor w: missing or non-string \"dtype\"");
  // The too-large message shows the shape as JSON.
  EXPECT_HAS(header_error(R"({"w":{"dtype":"U8","shape":[2,281474976710657],)"
                          R"("data_offsets":[0,0]}})",
                          0),
             "shape [2,281474976710657] is too large");
  // __metadata__: string members are kept; any other member is named.
  {
    const auto shard = open_header(R"({"__metadata__":{"format":"pt","b":"2","b":"3"},)"
                                   R"("w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})",
                                   2);
    EXPECT_EQ(shard->metadata().at("format"), "pt");
    EXPECT_EQ(shard->metadata().at("b"), "3");
  }
  EXPECT_HAS(header_error(R"({"__metadata__":{"z":{"x":"y"},"k":[1]},)"
                          R"("w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})",
                          2),
             "\"__metadata__\" entry k is not a string");
  EXPECT_HAS(header_error(R"({"__metadata__":["a"]})", 0),
             "\"__metadata__\" is not an object of strings");
  // An empty member name is named too; a repeated member counts as its last value.
  EXPECT_HAS(header_error(R"({"__metadata__":{"":1},)"
                          R"("w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})",
                          2),
             "\"__metadata__\" entry  is not a string");
  {
    const auto shard = open_header(R"({"__metadata__":{"a":1,"a":"x"},)"
                                   R"("w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})",
                                   2);
    EXPECT_EQ(shard->metadata().at("a"), "x");
  }
  // Elements after the one too large are shown as they were written.
  EXPECT_HAS(header_error(R"({"w":{"dtype":"U8","shape":[281474976710657,-1,"x",[2]],)"
                          R"("data_offsets":[0,0]}})",
                          0),
             "shape [281474976710657,-1,\"x\",[...]] is too large");
  // A name seen twice wins over a malformed entry, also when one of the two is the malformed one.
  EXPECT_HAS(header_error(R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"w":7})", 2),
             "tensor w appears twice");
  EXPECT_HAS(header_error(R"({"__metadata__":{},"__metadata__":{}})", 0),
             "tensor __metadata__ appears twice");
  // Of two malformed entries, the one whose name sorts first is reported.
  EXPECT_HAS(header_error(R"({"zz":{"dtype":"Q9","shape":[2],"data_offsets":[0,2]},)"
                          R"("aa":{"dtype":"Q8","shape":[2],"data_offsets":[2,4]}})",
                          4),
             "tensor aa: unknown dtype \"Q8\"");
  // Empty tensors at one offset: every one is kept, in name order.
  {
    const auto shard = open_header(R"({"z":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},)"
                                   R"("m":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                                   R"("a":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}})",
                                   2);
    ASSERT_EQ(shard->tensors().size(), 3u);
    EXPECT_EQ(shard->tensors()[0].name, "a");
    EXPECT_EQ(shard->tensors()[1].name, "z");
    EXPECT_EQ(shard->tensors()[2].name, "m");
    EXPECT_EQ(shard->find("m")->nbytes, 2u);
    EXPECT_EQ(shard->find("q"), nullptr);
  }
}

TEST(SafetensorsReject, HeaderNotStartingWithBrace) {
  const std::string h = R"( {"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})";
  const std::string msg = error_of([&] { open_mem(assemble(h, pattern(2, 1))); });
  EXPECT_HAS(msg, "does not start with '{'");
  EXPECT_HAS(msg, kPath);
}

TEST(SafetensorsReject, OverlappingTensors) {
  json header;
  header["a"] = entry("F32", {2}, 0, 8);
  header["b"] = entry("F32", {2}, 4, 12);
  const std::string msg = open_error(header, 12);
  EXPECT_HAS(msg, kPath);
  EXPECT_HAS(msg, "a");
  EXPECT_HAS(msg, "b");
  EXPECT_HAS(msg, "overlap");
  // Identical ranges overlap too; a zero-size tensor at a boundary does not.
  json header2;
  header2["p"] = entry("U8", {4}, 0, 4);
  header2["q"] = entry("U8", {4}, 0, 4);
  EXPECT_HAS(open_error(header2, 4), "overlap");
  json header3;
  header3["p"] = entry("U8", {4}, 0, 4);
  header3["e"] = entry("U8", {0}, 4, 4);
  header3["q"] = entry("U8", {4}, 4, 8);
  EXPECT_EQ(open_mem(assemble(header3.dump(), pattern(8, 1)))->tensors().size(), 3u);
  // A tensor nested inside another one.
  json header4;
  header4["big"] = entry("U8", {8}, 0, 8);
  header4["small"] = entry("U8", {2}, 2, 4);
  EXPECT_HAS(open_error(header4, 8), "overlap");
}

TEST(SafetensorsReject, BadShapeEntries) {
  for (const json& shape :
       {json{-1}, json{2, -3}, json{1.5}, json{"2"}, json{json::array({2})}, json{true}}) {
    json header;
    header["w"] = entry("U8", shape, 0, 2);
    const std::string msg = open_error(header, 2);
    EXPECT_HAS(msg, kPath);
    EXPECT_HAS(msg, "tensor w");
  }
  json header;
  header["w"] = {{"dtype", "U8"}, {"shape", 4}, {"data_offsets", {0, 4}}};  // not an array
  EXPECT_HAS(open_error(header, 4), "tensor w");
}

TEST(SafetensorsReject, HugeShapeDoesNotOverflow) {
  json header;
  header["w"] = entry("F32", {uint64_t{1} << 40, uint64_t{1} << 40}, 0, 0);
  const std::string msg = open_error(header, 0);
  EXPECT_HAS(msg, "tensor w");
}

TEST(SafetensorsReject, BadDataOffsets) {
  for (const json& offsets :
       {json{0}, json{0, 4, 8}, json{-4, 0}, json{0.0, 4.5}, json{"0", "4"}, json(4)}) {
    json header;
    header["w"] = {{"dtype", "U8"}, {"shape", {4}}, {"data_offsets", offsets}};
    const std::string msg = open_error(header, 8);
    EXPECT_HAS(msg, kPath);
    EXPECT_HAS(msg, "tensor w");
  }
}

TEST(SafetensorsReject, MissingKeys) {
  for (const char* missing : {"dtype", "shape", "data_offsets"}) {
    json e = entry("U8", {4}, 0, 4);
    e.erase(missing);
    json header;
    header["w"] = e;
    const std::string msg = open_error(header, 4);
    EXPECT_HAS(msg, kPath);
    EXPECT_HAS(msg, "tensor w");
    EXPECT_HAS(msg, missing);
  }
  json header;
  header["w"] = {{"dtype", 7}, {"shape", {4}}, {"data_offsets", {0, 4}}};  // dtype not a string
  EXPECT_HAS(open_error(header, 4), "dtype");
}

TEST(SafetensorsReject, TruncatedFile) {
  json header;
  header["a"] = entry("F32", {4}, 0, 16);
  header["b"] = entry("BF16", {4}, 16, 24);
  const auto full = assemble(header.dump(), pattern(24, 5));
  ASSERT_EQ(open_mem(full)->tensors().size(), 2u);
  for (size_t cut : {1, 8, 9, 24}) {
    const std::vector<uint8_t> cut_bytes(full.begin(), full.end() - static_cast<ptrdiff_t>(cut));
    const std::string msg = error_of([&] { open_mem(cut_bytes); });
    EXPECT_HAS(msg, kPath);
    EXPECT_HAS(msg, cut <= 8 ? "tensor b" : "tensor");
  }
  // Cut inside the header.
  const std::vector<uint8_t> in_header(full.begin(), full.begin() + 20);
  EXPECT_HAS(error_of([&] { open_mem(in_header); }), kPath);
}

TEST(SafetensorsReject, ReadErrorNamesTheTensor) {
  json header;
  header["first"] = entry("U8", {4}, 0, 4);
  header["second.weight"] = entry("U8", {4}, 4, 8);
  const std::string h = header.dump();
  const auto bytes = assemble(h, pattern(8, 2));
  const int64_t fail_at = static_cast<int64_t>(8 + h.size() + 5);  // inside "second.weight"
  const auto shard = open_mem(bytes, fail_at);                     // the header still reads
  std::vector<uint8_t> got(4);
  shard->read(*shard->find("first"), got.data());  // does not touch the failing byte
  EXPECT_EQ(got, std::vector<uint8_t>(
                     {pattern(8, 2)[0], pattern(8, 2)[1], pattern(8, 2)[2], pattern(8, 2)[3]}));
  const std::string msg = error_of([&] { shard->read(*shard->find("second.weight"), got.data()); });
  EXPECT_HAS(msg, kPath);
  EXPECT_HAS(msg, "second.weight");
  // A failure inside the header is reported when opening.
  const std::string msg2 = error_of([&] { open_mem(bytes, 10); });
  EXPECT_HAS(msg2, kPath);
}

// ---------------------------------------------------------------------------------------------
// ModelFiles on the k3-tiny fixture

// A copy of the fixture directory.
std::unique_ptr<TempDir> fixture_copy(const std::string& tag) {
  auto dir = std::make_unique<TempDir>(tag);
  for (const auto& e : fs::directory_iterator(kTinyDir))
    fs::copy_file(e.path(), fs::path(dir->path()) / e.path().filename());
  return dir;
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

json read_json(const std::string& path) {
  return json::parse(k3::read_text_file(path));
}

std::vector<std::string> shard_names(const k3::ModelFiles& snap) {
  std::vector<std::string> out;
  for (const auto& s : snap.shards()) out.push_back(fs::path(s->path()).filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::string shard_name(int n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05d-of-000010.safetensors", n);
  return buf;
}

TEST(SnapshotFixture, OpensTextShardsOnly) {
  const k3::ModelFiles snap(kTinyDir);
  EXPECT_EQ(snap.dir(), kTinyDir);
  EXPECT_EQ(snap.prefix(), "language_model.");
  EXPECT_TRUE(snap.config_root().contains("vision_config"));
  EXPECT_EQ(snap.text_config().at("hidden_size").get<int>(), 64);
  EXPECT_EQ(snap.text_config().at("model_type").get<std::string>(), "kimi_linear");
  ASSERT_EQ(snap.shards().size(), 9u);
  std::vector<std::string> want;
  for (int i = 1; i <= 9; ++i) want.push_back(shard_name(i));
  EXPECT_EQ(shard_names(snap), want);
  // Vision tensors are not reachable (with or without the prefix).
  EXPECT_EQ(snap.find("vision_tower.patch_embed.weight").info, nullptr);
}

TEST(SnapshotFixture, FindAndReadTensors) {
  const k3::ModelFiles snap(kTinyDir);
  const k3::LocatedTensor emb = snap.find("model.embed_tokens.weight");
  ASSERT_NE(emb.info, nullptr);
  ASSERT_NE(emb.shard, nullptr);
  EXPECT_EQ(emb.info->name, "language_model.model.embed_tokens.weight");
  EXPECT_EQ(emb.info->dtype, k3::DType::kBF16);
  EXPECT_EQ(emb.info->shape, (std::vector<int64_t>{1024, 64}));
  EXPECT_EQ(fs::path(emb.shard->path()).filename().string(), shard_name(9));
  // Prefixed names are not looked up twice.
  EXPECT_EQ(snap.find("language_model.model.embed_tokens.weight").info, nullptr);
  EXPECT_EQ(snap.find("model.no_such.weight").shard, nullptr);

  // Layer 0's A_log: F32 [16], entries 4..15 are exactly 0 (README), the first 4 are not all 0.
  const k3::LocatedTensor a = snap.require("model.layers.0.self_attn.A_log", k3::DType::kF32, {16});
  EXPECT_EQ(fs::path(a.shard->path()).filename().string(), shard_name(1));
  std::vector<float> v(16, -1.0f);
  k3::ModelFiles::read(a, v.data());
  for (int i = 4; i < 16; ++i) EXPECT_EQ(v[static_cast<size_t>(i)], 0.0f) << i;
  EXPECT_TRUE(v[0] != 0.0f || v[1] != 0.0f || v[2] != 0.0f || v[3] != 0.0f);

  // The experts of layer 7 sit in shard 8.
  const auto e = snap.require_any("model.layers.7.block_sparse_moe.experts.15.w2.weight_scale",
                                  {k3::DType::kF8E8M0, k3::DType::kU8}, {32, 2});
  EXPECT_EQ(fs::path(e.shard->path()).filename().string(), shard_name(8));
  std::vector<uint8_t> scales(64);
  k3::ModelFiles::read(e, scales.data());
  for (uint8_t s : scales) {
    EXPECT_GE(s, 120);
    EXPECT_LE(s, 127);
  }
}

TEST(SnapshotFixture, RequireReportsMismatches) {
  const k3::ModelFiles snap(kTinyDir);
  const std::string name = "model.layers.0.self_attn.A_log";
  const std::string full = "language_model." + name;

  const std::string dtype_msg = error_of([&] { snap.require(name, k3::DType::kBF16, {16}); });
  EXPECT_HAS(dtype_msg, full);
  EXPECT_HAS(dtype_msg, "F32");
  EXPECT_HAS(dtype_msg, "BF16");
  EXPECT_HAS(dtype_msg, shard_name(1));

  const std::string shape_msg = error_of([&] { snap.require(name, k3::DType::kF32, {4, 4}); });
  EXPECT_HAS(shape_msg, full);
  EXPECT_HAS(shape_msg, "[16]");
  EXPECT_HAS(shape_msg, "[4, 4]");

  const std::string missing_msg =
      error_of([&] { snap.require("model.layers.0.self_attn.nope", k3::DType::kF32, {16}); });
  EXPECT_HAS(missing_msg, "language_model.model.layers.0.self_attn.nope");

  const std::string any_msg = error_of([&] {
    snap.require_any(name, {k3::DType::kBF16, k3::DType::kF16}, {16});
  });
  EXPECT_HAS(any_msg, full);
  EXPECT_HAS(any_msg, "BF16");
  EXPECT_HAS(any_msg, "F16");
  EXPECT_HAS(any_msg, "F32");
  EXPECT_NO_THROW(snap.require_any(name, {k3::DType::kBF16, k3::DType::kF32}, {16}));
}

TEST(SnapshotDamaged, GarbageVisionShardIsNeverOpened) {
  const auto dir = fixture_copy("garbage-vision");
  write_bytes(dir->file(kVisionShard), std::string(5000, '\x7f'));
  const k3::ModelFiles snap(dir->path());
  EXPECT_EQ(snap.shards().size(), 9u);
  EXPECT_EQ(snap.prefix(), "language_model.");
  EXPECT_NE(snap.find("model.norm.weight").info, nullptr);
}

TEST(SnapshotDamaged, MissingVisionShardIsFine) {
  const auto dir = fixture_copy("no-vision");
  fs::remove(dir->file(kVisionShard));
  const k3::ModelFiles snap(dir->path());
  EXPECT_EQ(snap.shards().size(), 9u);
}

TEST(SnapshotDamaged, WithoutIndexScansEveryShard) {
  const auto dir = fixture_copy("no-index");
  fs::remove(dir->file("model.safetensors.index.json"));
  // Every *.safetensors of the directory is opened, the vision shard and (in the fixture)
  // golden.safetensors included.
  const k3::ModelFiles snap(dir->path());
  std::vector<std::string> want = {"golden.safetensors"};
  for (int i = 1; i <= 10; ++i) want.push_back(shard_name(i));
  std::sort(want.begin(), want.end());
  EXPECT_EQ(shard_names(snap), want);
  EXPECT_EQ(snap.prefix(), "language_model.");
  const auto t = snap.require("model.layers.3.self_attn.kv_b_proj.weight", k3::DType::kBF16,
                              {4 * (16 + 16), 32});
  EXPECT_EQ(fs::path(t.shard->path()).filename().string(), shard_name(4));
}

TEST(SnapshotDamaged, WithoutIndexAGarbageShardIsReported) {
  const auto dir = fixture_copy("no-index-garbage");
  fs::remove(dir->file("model.safetensors.index.json"));
  write_bytes(dir->file(kVisionShard), std::string(5000, '\x7f'));
  const std::string msg = error_of([&] { k3::ModelFiles snap(dir->path()); });
  EXPECT_HAS(msg, kVisionShard);
}

TEST(SnapshotDamaged, TruncatedLayerShardNamesTheFile) {
  const auto dir = fixture_copy("truncated");
  const std::string victim = shard_name(3);
  fs::resize_file(dir->file(victim), fs::file_size(dir->file(victim)) - 100);
  const std::string msg = error_of([&] { k3::ModelFiles snap(dir->path()); });
  EXPECT_HAS(msg, victim);
  // Cut so short that not even the header survives.
  fs::resize_file(dir->file(victim), 40);
  EXPECT_HAS(error_of([&] { k3::ModelFiles snap(dir->path()); }), victim);
}

// Runs `open` (which must throw) on another thread; when it is still blocked after a generous
// bound, the FIFO at `fifo` is opened for writing once so the blocked open returns, and the test
// fails: the loader must never wait on a FIFO (issue 16, defect 11).
std::string error_without_blocking(const std::string& fifo, const std::function<void()>& open) {
  auto result = std::async(std::launch::async, [&] { return error_of(open); });
  if (result.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    ADD_FAILURE() << "opening the snapshot blocked on the FIFO " << fifo;
    const int w = ::open(fifo.c_str(), O_WRONLY);
    if (w >= 0) ::close(w);
  }
  return result.get();
}

TEST(SnapshotDamaged, FifoNamedLikeAShardIsRefusedWithoutBlocking) {
  const auto dir = fixture_copy("fifo-shard");
  const std::string victim = shard_name(4);
  fs::remove(dir->file(victim));
  ASSERT_EQ(::mkfifo(dir->file(victim).c_str(), 0600), 0) << std::strerror(errno);
  const std::string msg =
      error_without_blocking(dir->file(victim), [&] { k3::ModelFiles snap(dir->path()); });
  EXPECT_HAS(msg, victim);
  EXPECT_HAS(msg, "FIFO");
  EXPECT_HAS(msg, "not a regular file");
}

TEST(SnapshotDamaged, FifoConfigIsRefusedWithoutBlocking) {
  const auto dir = fixture_copy("fifo-config");
  fs::remove(dir->file("config.json"));
  ASSERT_EQ(::mkfifo(dir->file("config.json").c_str(), 0600), 0) << std::strerror(errno);
  const std::string msg =
      error_without_blocking(dir->file("config.json"), [&] { k3::ModelFiles snap(dir->path()); });
  EXPECT_HAS(msg, "config.json");
  EXPECT_HAS(msg, "FIFO");
  // The same for any small file read whole (the tokenizer files, the index).
  const std::string direct = error_without_blocking(
      dir->file("config.json"), [&] { k3::read_text_file(dir->file("config.json")); });
  EXPECT_HAS(direct, "FIFO");
}

TEST(SnapshotDamaged, IndexNamingAMissingShard) {
  const auto dir = fixture_copy("missing-shard");
  const std::string index_path = dir->file("model.safetensors.index.json");
  json index = read_json(index_path);
  index["weight_map"]["language_model.model.norm.weight"] = "model-00042-of-000010.safetensors";
  write_bytes(index_path, index.dump());
  const std::string msg = error_of([&] { k3::ModelFiles snap(dir->path()); });
  EXPECT_HAS(msg, "model-00042-of-000010.safetensors");
}

TEST(SnapshotDamaged, IndexShardDeletedFromDisk) {
  const auto dir = fixture_copy("deleted-shard");
  fs::remove(dir->file(shard_name(5)));
  const std::string msg = error_of([&] { k3::ModelFiles snap(dir->path()); });
  EXPECT_HAS(msg, shard_name(5));
}

TEST(SnapshotDamaged, IndexPathWithSlashIsRefused) {
  for (const char* bad : {"../model-00009-of-000010.safetensors",
                          "sub/model-00009-of-000010.safetensors", "/etc/passwd", ".."}) {
    const auto dir = fixture_copy("slash");
    const std::string index_path = dir->file("model.safetensors.index.json");
    json index = read_json(index_path);
    index["weight_map"]["language_model.model.norm.weight"] = bad;
    write_bytes(index_path, index.dump());
    const std::string msg = error_of([&] { k3::ModelFiles snap(dir->path()); });
    EXPECT_HAS(msg, "model.safetensors.index.json");
    EXPECT_HAS(msg, "language_model.model.norm.weight");
  }
}

TEST(SnapshotDamaged, IndexEntryTheShardDoesNotHold) {
  const auto dir = fixture_copy("wrong-shard");
  const std::string index_path = dir->file("model.safetensors.index.json");
  json index = read_json(index_path);
  index["weight_map"]["language_model.model.layers.0.extra.weight"] = shard_name(1);
  write_bytes(index_path, index.dump());
  const std::string msg = error_of([&] { k3::ModelFiles snap(dir->path()); });
  EXPECT_HAS(msg, "language_model.model.layers.0.extra.weight");
  EXPECT_HAS(msg, shard_name(1));
}

TEST(SnapshotDamaged, IndexEntryNamingTheWrongShard) {
  // The tensor exists, but in another (opened) shard than the index claims.
  const auto dir = fixture_copy("misattributed");
  const std::string index_path = dir->file("model.safetensors.index.json");
  json index = read_json(index_path);
  index["weight_map"]["language_model.model.norm.weight"] = shard_name(2);
  write_bytes(index_path, index.dump());
  const std::string msg = error_of([&] { k3::ModelFiles snap(dir->path()); });
  EXPECT_HAS(msg, "language_model.model.norm.weight");
  EXPECT_HAS(msg, shard_name(2));
}

TEST(SnapshotDamaged, BadIndexAndConfig) {
  {
    const auto dir = fixture_copy("bad-index-json");
    write_bytes(dir->file("model.safetensors.index.json"), "{\"weight_map\": ");
    EXPECT_HAS(error_of([&] { k3::ModelFiles snap(dir->path()); }), "model.safetensors.index.json");
  }
  {
    const auto dir = fixture_copy("no-weight-map");
    write_bytes(dir->file("model.safetensors.index.json"), "{\"metadata\": {}}");
    EXPECT_HAS(error_of([&] { k3::ModelFiles snap(dir->path()); }), "weight_map");
  }
  {
    const auto dir = fixture_copy("no-config");
    fs::remove(dir->file("config.json"));
    EXPECT_HAS(error_of([&] { k3::ModelFiles snap(dir->path()); }), "config.json");
  }
  {
    const auto dir = fixture_copy("bad-config");
    write_bytes(dir->file("config.json"), "{oops");
    EXPECT_HAS(error_of([&] { k3::ModelFiles snap(dir->path()); }), "config.json");
  }
  EXPECT_HAS(error_of([&] { k3::ModelFiles snap(kTinyDir + "/does-not-exist"); }),
             "does-not-exist");
}

// The index is streamed (SAX), not held as a DOM: each shape of damage still names the file and,
// for an entry, the tensor.
TEST(SnapshotDamaged, IndexEntriesAndWeightMapOfTheWrongType) {
  const auto damaged = [](const std::string& tag, const std::function<void(json&)>& edit) {
    const auto dir = fixture_copy(tag);
    const std::string index_path = dir->file("model.safetensors.index.json");
    json index = read_json(index_path);
    edit(index);
    write_bytes(index_path, index.dump());
    return error_of([&] { k3::ModelFiles snap(dir->path()); });
  };
  for (const json& bad : {json(42), json(nullptr), json::object(), json::array({"a"})}) {
    const std::string msg = damaged("entry-type", [&](json& index) {
      index["weight_map"]["language_model.model.norm.weight"] = bad;
    });
    EXPECT_HAS(msg, "model.safetensors.index.json");
    EXPECT_HAS(msg, "weight_map[language_model.model.norm.weight] is not a string");
  }
  for (const json& bad : {json("x"), json::array(), json(1)}) {
    const std::string msg = damaged("map-type", [&](json& index) { index["weight_map"] = bad; });
    EXPECT_HAS(msg, "missing \"weight_map\" object");
  }
  // A top-level member twice is refused (which one a reader takes is not defined).
  {
    const auto dir = fixture_copy("weight-map-twice");
    const std::string index_path = dir->file("model.safetensors.index.json");
    std::string text = read_json(index_path).dump();
    text.insert(1, "\"weight_map\": 5, ");
    write_bytes(index_path, text);
    EXPECT_HAS(error_of([&] { k3::ModelFiles snap(dir->path()); }), "\"weight_map\" appears twice");
  }
  // The container record is checked before the entries; of two failing entries the name that
  // sorts first is reported.
  {
    const std::string msg = damaged("version-first", [](json& index) {
      index["metadata"]["k3_container"] = "999";
      index["weight_map"]["language_model.model.norm.weight"] = 1;
    });
    EXPECT_HAS(msg, "unknown k3_repack container format version \"999\"");
  }
  {
    const std::string msg = damaged("first-name", [](json& index) {
      index["weight_map"]["zzz.weight"] = 1;
      index["weight_map"]["aaa.weight"] = "../x.safetensors";
    });
    EXPECT_HAS(msg, "weight_map[aaa.weight] names a path outside the snapshot");
  }
  // A tensor listed in a shard that does not hold it: the message names the one that does.
  const std::string norm = "language_model.model.norm.weight";
  const std::string holder = read_json(std::string(kTinyDir) + "/model.safetensors.index.json")
                                 .at("weight_map")
                                 .at(norm)
                                 .get<std::string>();
  const std::string other = holder == "model-00010-of-000010.safetensors"
                                ? "model-00009-of-000010.safetensors"
                                : "model-00010-of-000010.safetensors";
  {
    const std::string msg =
        damaged("wrong-shard", [&](json& index) { index["weight_map"][norm] = other; });
    EXPECT_HAS(msg, "tensor " + norm + " is listed in " + other +
                        " but that shard does not hold it (" + holder + " does)");
  }
  // A weight_map name twice is refused, whichever shard each entry names and in which order (a
  // DOM reader would silently take the last).
  for (const auto& [first, second] : std::vector<std::pair<std::string, std::string>>{
           {other, holder}, {holder, other}, {holder, holder}}) {
    SCOPED_TRACE(first + " then " + second);
    const auto dir = fixture_copy("name-twice");
    const std::string index_path = dir->file("model.safetensors.index.json");
    json index = read_json(index_path);
    index["weight_map"][norm] = second;
    std::string text = index.dump();
    const std::string map_start = "\"weight_map\":{";
    ASSERT_NE(text.find(map_start), std::string::npos);
    text.insert(text.find(map_start) + map_start.size(), "\"" + norm + "\":\"" + first + "\",");
    write_bytes(index_path, text);
    EXPECT_HAS(error_of([&] { k3::ModelFiles snap(dir->path()); }),
               "weight_map lists tensor " + norm + " twice");
  }
  // Also a vision tensor, whose shard the text engine never opens.
  {
    const auto dir = fixture_copy("vision-twice");
    const std::string index_path = dir->file("model.safetensors.index.json");
    std::string text = read_json(index_path).dump();
    const std::string map_start = "\"weight_map\":{";
    ASSERT_NE(text.find(map_start), std::string::npos);
    text.insert(text.find(map_start) + map_start.size(),
                "\"vision_tower.patch_embed.weight\":\"" + other +
                    "\",\"vision_tower.patch_embed.weight\":\"" + holder + "\",");
    write_bytes(index_path, text);
    EXPECT_HAS(error_of([&] { k3::ModelFiles snap(dir->path()); }),
               "weight_map lists tensor vision_tower.patch_embed.weight twice");
  }
  {
    const auto dir = fixture_copy("root-array");
    write_bytes(dir->file("model.safetensors.index.json"), "[{\"weight_map\": {}}]");
    EXPECT_HAS(error_of([&] { k3::ModelFiles snap(dir->path()); }), "weight_map");
  }
}

TEST(SnapshotFixture, IndexMetadataOfAnyShapeIsIgnored) {
  // Nested objects, arrays and numbers in "metadata", and unknown top-level members, neither
  // fail nor hide the weight_map that follows them.
  const auto dir = fixture_copy("metadata-shapes");
  const std::string index_path = dir->file("model.safetensors.index.json");
  json index = read_json(index_path);
  index["metadata"]["nested"] = json{{"weight_map", {{"x", 1}}}, {"list", {1, 2, {{"a", "b"}}}}};
  index["metadata"]["total_size"] = 123;
  index["zzz_extra"] = json{{"weight_map", 5}};
  write_bytes(index_path, index.dump());
  k3::ModelFiles snap(dir->path());
  EXPECT_NE(snap.find("model.norm.weight").info, nullptr);
}

TEST(SnapshotDamaged, DuplicateTensorAcrossShardsIsRefused) {
  const auto dir = fixture_copy("duplicate");
  fs::remove(dir->file("model.safetensors.index.json"));
  fs::copy_file(dir->file(shard_name(9)), dir->file("model-00011-of-000010.safetensors"));
  const std::string msg = error_of([&] { k3::ModelFiles snap(dir->path()); });
  EXPECT_HAS(msg, "language_model.");
  EXPECT_HAS(msg, shard_name(9));
}

TEST(SnapshotIsVision, Names) {
  EXPECT_TRUE(k3::is_vision_tensor("vision_tower.patch_embed.weight"));
  EXPECT_TRUE(k3::is_vision_tensor("mm_projector.proj.0.weight"));
  EXPECT_FALSE(k3::is_vision_tensor("language_model.model.norm.weight"));
  EXPECT_FALSE(k3::is_vision_tensor("language_model.vision_tower.x"));
}

}  // namespace
