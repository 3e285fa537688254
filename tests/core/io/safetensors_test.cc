// Safetensors: bit-exact round trips, the file layout, a file written by the Python reference
// implementation, and malformed or corrupted files (each an error, never a crash).
#include "core/io/safetensors.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "tests/core/io/io_test_util.h"

namespace {

using starling::DType;
using starling::Shape;
using starling::StatusCode;
using starling::Tensor;
using starling::io::load_safetensors;
using starling::io::parse_safetensors;
using starling::io::SafetensorsFile;
using starling::io::save_safetensors;
using starling::io::StateDict;
using starling::io::testing::list_dir;
using starling::io::testing::read_bytes;
using starling::io::testing::TempDir;
using starling::io::testing::write_bytes;

std::vector<uint8_t> contiguous_bytes(const Tensor& t) {
  REQUIRE(t.is_contiguous());
  const auto* p = static_cast<const uint8_t*>(t.raw_data());
  return {p, p + t.nbytes()};
}

// Bytes of a 2-D view in row-major order, read through its strides.
std::vector<uint8_t> view_bytes_2d(const Tensor& t) {
  REQUIRE(t.dim() == 2);
  const size_t es = starling::dtype_size(t.dtype());
  const auto* base = static_cast<const uint8_t*>(t.impl()->storage->data());
  std::vector<uint8_t> out;
  for (int64_t i = 0; i < t.size(0); ++i) {
    for (int64_t j = 0; j < t.size(1); ++j) {
      const int64_t off = t.offset() + i * t.strides()[0] + j * t.strides()[1];
      out.insert(out.end(), base + off * static_cast<int64_t>(es),
                 base + (off + 1) * static_cast<int64_t>(es));
    }
  }
  return out;
}

Tensor random_bits(const Shape& shape, DType dtype, std::mt19937_64& rng) {
  Tensor t = Tensor::empty(shape, dtype);
  auto* p = static_cast<uint8_t*>(t.raw_data());
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<uint8_t>(rng());
  return t;
}

// A signaling NaN (or, for integers, a value that double cannot hold) in element 1 of `t`.
void put_tricky_value(Tensor& t) {
  auto* p = static_cast<uint8_t*>(t.raw_data()) + starling::dtype_size(t.dtype());
  auto put = [p](auto bits) { std::memcpy(p, &bits, sizeof(bits)); };
  switch (t.dtype()) {
    case DType::kF32:
      put(uint32_t{0x7f800001u});
      break;
    case DType::kF64:
      put(uint64_t{0x7ff0000000000001u});
      break;
    case DType::kBF16:
      put(uint16_t{0x7f81u});
      break;
    case DType::kF16:
      put(uint16_t{0x7c01u});
      break;
    case DType::kI64:
      put(int64_t{(int64_t{1} << 53) + 1});
      break;
    default:
      break;
  }
}

template <typename T>
std::vector<T> values_of(const Tensor& t) {
  std::vector<T> v(static_cast<size_t>(t.numel()));
  if (!v.empty()) std::memcpy(v.data(), t.raw_data(), t.nbytes());
  return v;
}

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

const Tensor& find(const SafetensorsFile& f, const std::string& name) {
  for (const auto& [n, t] : f.tensors) {
    if (n == name) return t;
  }
  FAIL("no tensor " << name);
  static Tensor none;
  return none;
}

std::vector<uint8_t> file_from(const std::string& header, size_t data_size) {
  std::vector<uint8_t> bytes(8);
  for (int i = 0; i < 8; ++i)
    bytes[static_cast<size_t>(i)] = static_cast<uint8_t>(header.size() >> (8 * i));
  bytes.insert(bytes.end(), header.begin(), header.end());
  bytes.resize(bytes.size() + data_size, 0xAB);
  return bytes;
}

StateDict sample_state_dict() {
  std::mt19937_64 rng(5);
  Tensor w = random_bits({4, 3}, DType::kF32, rng);
  Tensor b = random_bits({3}, DType::kBF16, rng);
  Tensor ids = random_bits({2, 2}, DType::kI64, rng);
  Tensor s = random_bits({}, DType::kU8, rng);
  return {{"h.0.attn.weight", w}, {"h.0.attn.bias", b}, {"ids", ids}, {"step", s}};
}

std::vector<uint8_t> sample_file_bytes() {
  TempDir dir;
  REQUIRE(save_safetensors(dir / "x.safetensors", sample_state_dict(), {{"step", "100"}}).ok());
  return read_bytes(dir / "x.safetensors");
}

}  // namespace

TEST_CASE("safetensors round trip is bit-exact for every dtype and for views", "[io]") {
  const DType dtype = GENERATE(DType::kF32, DType::kF64, DType::kBF16, DType::kF16, DType::kI32,
                               DType::kI64, DType::kI8, DType::kU8);
  CAPTURE(starling::dtype_name(dtype));
  std::mt19937_64 rng(1000 + static_cast<int>(dtype));
  TempDir dir;
  Tensor a = random_bits({3, 5}, dtype, rng);
  Tensor base = random_bits({4, 6}, dtype, rng);
  put_tricky_value(base);
  Tensor transposed = base.transpose(0, 1);  // (6, 4)
  Tensor sliced = base.slice(1, 1, 6, 2);    // (4, 3), columns 1, 3, 5
  REQUIRE_FALSE(transposed.is_contiguous());
  REQUIRE_FALSE(sliced.is_contiguous());
  Tensor scalar = random_bits({}, dtype, rng);
  Tensor empty = Tensor::zeros({0, 7}, dtype);
  const StateDict sd = {{"a", a},
                        {"transposed", transposed},
                        {"sliced", sliced},
                        {"scalar", scalar},
                        {"empty", empty}};
  const auto path = dir / "model.safetensors";
  REQUIRE(save_safetensors(path, sd).ok());

  auto loaded = load_safetensors(path);
  REQUIRE(loaded.ok());
  REQUIRE(loaded->metadata.empty());
  REQUIRE(loaded->tensors.size() == sd.size());
  for (size_t i = 0; i < sd.size(); ++i) {
    const auto& [name, t] = loaded->tensors[i];
    CAPTURE(name);
    REQUIRE(name == sd[i].first);
    REQUIRE(t.dtype() == dtype);
    REQUIRE(t.shape() == sd[i].second.shape());
    REQUIRE(t.is_contiguous());
  }
  REQUIRE(contiguous_bytes(loaded->tensors[0].second) == contiguous_bytes(a));
  REQUIRE(contiguous_bytes(loaded->tensors[1].second) == view_bytes_2d(transposed));
  REQUIRE(contiguous_bytes(loaded->tensors[2].second) == view_bytes_2d(sliced));
  REQUIRE(contiguous_bytes(loaded->tensors[3].second) == contiguous_bytes(scalar));
  REQUIRE(loaded->tensors[4].second.numel() == 0);
  REQUIRE(list_dir(dir.path()) == std::vector<std::string>{"model.safetensors"});
}

TEST_CASE("safetensors metadata round trips", "[io]") {
  TempDir dir;
  const std::map<std::string, std::string> meta = {{"format", "pt"},
                                                   {"step", "1200"},
                                                   {"note", "quotes \" and \\ and \xc3\xbc"},
                                                   {"", "empty key"}};
  REQUIRE(save_safetensors(dir / "m.safetensors", {{"x", Tensor::ones({2})}}, meta).ok());
  auto loaded = load_safetensors(dir / "m.safetensors");
  REQUIRE(loaded.ok());
  REQUIRE(loaded->metadata == meta);
}

TEST_CASE("safetensors file layout: length prefix then padded JSON header then packed data",
          "[io]") {
  TempDir dir;
  Tensor w = Tensor::from_vector(std::vector<float>{1, 2, 3, 4}, {2, 2});
  Tensor n = Tensor::from_vector(std::vector<int32_t>{7}, {1});
  REQUIRE(save_safetensors(dir / "l.safetensors", {{"w", w}, {"n", n}}, {{"k", "v"}}).ok());
  const auto bytes = read_bytes(dir / "l.safetensors");
  uint64_t len = 0;
  for (int i = 7; i >= 0; --i) len = (len << 8) | bytes[static_cast<size_t>(i)];
  REQUIRE(len % 8 == 0);
  REQUIRE(bytes.size() == 8 + len + 16 + 4);
  const std::string header(bytes.begin() + 8, bytes.begin() + 8 + static_cast<int64_t>(len));
  REQUIRE(header.front() == '{');
  REQUIRE(header.find_last_not_of(' ') == header.find_last_of('}'));
  const auto j = nlohmann::json::parse(header);
  REQUIRE(j["__metadata__"] == nlohmann::json{{"k", "v"}});
  REQUIRE(j["w"] == nlohmann::json{{"dtype", "F32"}, {"shape", {2, 2}}, {"data_offsets", {0, 16}}});
  REQUIRE(j["n"] == nlohmann::json{{"dtype", "I32"}, {"shape", {1}}, {"data_offsets", {16, 20}}});
  float f[4];
  std::memcpy(f, bytes.data() + 8 + len, 16);
  REQUIRE(f[3] == 4.0f);
  REQUIRE(bytes.back() == 0);  // 7 as little-endian int32: 07 00 00 00
  REQUIRE(bytes[bytes.size() - 4] == 7);
}

TEST_CASE("safetensors reads a file written by the Python safetensors package", "[io]") {
  // tests/core/io/fixtures/make_fixture.py wrote it; the values below are the ones it holds.
  auto f = load_safetensors(STARLING_SOURCE_DIR "/tests/core/io/fixtures/reference.safetensors");
  REQUIRE(f.ok());
  REQUIRE(f->metadata ==
          std::map<std::string, std::string>{{"format", "np"}, {"written_by", "make_fixture.py"}});
  std::vector<std::string> names;
  for (const auto& [name, t] : f->tensors) names.push_back(name);
  // File order (the reference writer sorts by alignment, then name).
  REQUIRE(names == std::vector<std::string>{"i64", "f64", "empty", "f32", "scalar", "i32",
                                            "layer.0/weight", "bf16", "f16", "i8", "u8"});

  const Tensor& f32 = find(*f, "f32");
  REQUIRE(f32.dtype() == DType::kF32);
  REQUIRE(f32.shape() == Shape{2, 3});
  REQUIRE(same_bits(values_of<float>(f32), {0.0f, 1.5f, -2.25f, 3.0e38f, -0.0f, 1e-45f}));
  const Tensor& f64 = find(*f, "f64");
  REQUIRE(same_bits(values_of<double>(f64), {1.0 / 3.0, -1e300, 5e-324}));
  const Tensor& f16 = find(*f, "f16");
  REQUIRE(f16.shape() == Shape{2, 2});
  REQUIRE(values_of<uint16_t>(f16) == std::vector<uint16_t>{0x3C00, 0xC000, 0x7BFF, 0x0001});
  const Tensor& bf16 = find(*f, "bf16");
  REQUIRE(bf16.dtype() == DType::kBF16);
  REQUIRE(values_of<uint16_t>(bf16) == std::vector<uint16_t>{0x3F80, 0xC000, 0x7F80, 0x0001});
  REQUIRE(values_of<int32_t>(find(*f, "i32")) == std::vector<int32_t>{INT32_MIN, INT32_MAX, 0, -1});
  REQUIRE(values_of<int64_t>(find(*f, "i64")) ==
          std::vector<int64_t>{INT64_MIN, INT64_MAX, (int64_t{1} << 53) + 1});
  REQUIRE(values_of<int8_t>(find(*f, "i8")) == std::vector<int8_t>{-128, 127, 0});
  const Tensor& u8 = find(*f, "u8");
  REQUIRE(u8.shape() == Shape{2, 2, 3});
  REQUIRE(values_of<uint8_t>(u8) == std::vector<uint8_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  const Tensor& scalar = find(*f, "scalar");
  REQUIRE(scalar.shape().empty());
  REQUIRE(values_of<float>(scalar) == std::vector<float>{7.0f});
  REQUIRE(find(*f, "empty").shape() == Shape{0, 3});
  REQUIRE(values_of<int32_t>(find(*f, "layer.0/weight")) == std::vector<int32_t>{5});
}

TEST_CASE("safetensors save rejects bad arguments and keeps the old file", "[io]") {
  TempDir dir;
  const auto path = dir / "keep.safetensors";
  REQUIRE(save_safetensors(path, {{"x", Tensor::ones({1})}}).ok());
  const auto before = read_bytes(path);
  const Tensor t = Tensor::ones({2});
  struct Case {
    const char* what;
    StateDict sd;
    std::map<std::string, std::string> meta;
    const char* needle;
  };
  const std::vector<Case> cases = {
      {"duplicate name", {{"a", t}, {"a", t}}, {}, "duplicate name"},
      {"empty name", {{"", t}}, {}, "empty name"},
      {"reserved name", {{"__metadata__", t}}, {}, "reserved"},
      {"undefined tensor", {{"a", Tensor()}}, {}, "undefined"},
      {"name not UTF-8", {{"a\xff", t}}, {}, "UTF-8"},
      {"metadata not UTF-8", {{"a", t}}, {{"k", "\xc3"}}, "UTF-8"},
  };
  for (const auto& c : cases) {
    DYNAMIC_SECTION(c.what) {
      const auto s = save_safetensors(path, c.sd, c.meta);
      REQUIRE(s.code() == StatusCode::kInvalidArgument);
      REQUIRE(s.message().find(c.needle) != std::string::npos);
      REQUIRE(s.message().find("keep.safetensors") != std::string::npos);
      REQUIRE(read_bytes(path) == before);
      REQUIRE(list_dir(dir.path()) == std::vector<std::string>{"keep.safetensors"});
    }
  }
  SECTION("missing directory") {
    REQUIRE(save_safetensors(dir / "nope/x.safetensors", {{"a", t}}).code() ==
            StatusCode::kNotFound);
  }
}

TEST_CASE("safetensors load of a missing file or a directory", "[io]") {
  TempDir dir;
  auto missing = load_safetensors(dir / "absent.safetensors");
  REQUIRE(missing.status().code() == StatusCode::kNotFound);
  REQUIRE(missing.status().message().find("absent.safetensors") != std::string::npos);
  REQUIRE(load_safetensors(dir.path()).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("safetensors rejects each malformed header with a precise error", "[io]") {
  const std::string f32_entry = R"({"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
  struct Case {
    const char* what;
    std::string header;
    size_t data_size;
    StatusCode code;
    std::vector<std::string> needles;
  };
  const std::vector<Case> cases = {
      {"empty header", "", 0, StatusCode::kDataLoss, {"not valid JSON"}},
      {"not JSON", R"({"w": )", 0, StatusCode::kDataLoss, {"not valid JSON"}},
      {"invalid UTF-8", "{\"w\xff\":1}", 0, StatusCode::kDataLoss, {"not valid JSON"}},
      {"NUL in header", std::string("{\0}", 3), 0, StatusCode::kDataLoss, {"not valid JSON"}},
      {"not an object", "[1, 2]", 0, StatusCode::kDataLoss, {"not an object"}},
      {"entry not an object", R"({"w": 5})", 0, StatusCode::kDataLoss, {"'w'", "not an object"}},
      {"missing dtype",
       R"({"w":{"shape":[1],"data_offsets":[0,4]}})",
       4,
       StatusCode::kDataLoss,
       {"'w'", "missing field 'dtype'"}},
      {"missing shape",
       R"({"w":{"dtype":"F32","data_offsets":[0,4]}})",
       4,
       StatusCode::kDataLoss,
       {"'w'", "missing field 'shape'"}},
      {"missing data_offsets",
       R"({"w":{"dtype":"F32","shape":[1]}})",
       4,
       StatusCode::kDataLoss,
       {"'w'", "missing field 'data_offsets'"}},
      {"extra field",
       R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}})",
       4,
       StatusCode::kDataLoss,
       {"'w'", "unexpected field 'x'"}},
      {"unknown dtype",
       R"({"w":{"dtype":"Q7","shape":[1],"data_offsets":[0,4]}})",
       4,
       StatusCode::kInvalidArgument,
       {"'w'", "unsupported dtype 'Q7'"}},
      {"unsupported dtype",
       R"({"w":{"dtype":"BOOL","shape":[4],"data_offsets":[0,4]}})",
       4,
       StatusCode::kInvalidArgument,
       {"'w'", "unsupported dtype 'BOOL'"}},
      {"lower-case dtype",
       R"({"w":{"dtype":"f32","shape":[1],"data_offsets":[0,4]}})",
       4,
       StatusCode::kInvalidArgument,
       {"'w'", "unsupported dtype 'f32'"}},
      {"dtype not a string",
       R"({"w":{"dtype":4,"shape":[1],"data_offsets":[0,4]}})",
       4,
       StatusCode::kDataLoss,
       {"'w'", "dtype is a JSON number"}},
      {"shape not a list",
       R"({"w":{"dtype":"F32","shape":1,"data_offsets":[0,4]}})",
       4,
       StatusCode::kDataLoss,
       {"'w'", "shape is a JSON number"}},
      {"negative dimension",
       R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})",
       4,
       StatusCode::kDataLoss,
       {"'w'", "shape[0] = -1"}},
      {"fractional dimension",
       R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})",
       4,
       StatusCode::kDataLoss,
       {"'w'", "shape[0] = 1.5"}},
      {"string dimension",
       R"({"w":{"dtype":"F32","shape":[1,"2"],"data_offsets":[0,4]}})",
       4,
       StatusCode::kDataLoss,
       {"'w'", "shape[1]"}},
      {"overflowing shape",
       R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,0],"data_offsets":[0,0]}})",
       0,
       StatusCode::kDataLoss,
       {"'w'", "too many elements"}},
      {"offsets not a pair",
       R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}})",
       4,
       StatusCode::kDataLoss,
       {"'w'", "not [begin, end]"}},
      {"offsets not integers",
       R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,"4"]}})",
       4,
       StatusCode::kDataLoss,
       {"'w'", "not [begin, end]"}},
      {"negative offset",
       R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})",
       4,
       StatusCode::kDataLoss,
       {"'w'", "not [begin, end]"}},
      {"reversed offsets",
       R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}})",
       4,
       StatusCode::kDataLoss,
       {"'w'", "reversed"}},
      {"size mismatch",
       R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,8]}})",
       8,
       StatusCode::kDataLoss,
       {"'w'", "hold 8 bytes", "need 4"}},
      {"out of bounds",
       R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
       4,
       StatusCode::kDataLoss,
       {"'w'", "past the end"}},
      {"overlap",
       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
       8,
       StatusCode::kDataLoss,
       {"'b'", "overlap tensor 'a'"}},
      {"gap",
       R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
       12,
       StatusCode::kDataLoss,
       {"'b'", "[4, 8)", "unused"}},
      {"data does not start at 0",
       R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
       8,
       StatusCode::kDataLoss,
       {"'w'", "[0, 4)", "unused"}},
      {"trailing garbage",
       "{\"w\":" + f32_entry + "}",
       9,
       StatusCode::kDataLoss,
       {"5 bytes of trailing data"}},
      {"duplicate name",
       "{\"w\":" + f32_entry + ",\"w\":" + f32_entry + "}",
       4,
       StatusCode::kDataLoss,
       {"'w'", "twice"}},
      {"duplicate field",
       R"({"w":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
       4,
       StatusCode::kDataLoss,
       {"'w'", "'dtype' twice"}},
      {"metadata not an object",
       R"({"__metadata__": 3})",
       0,
       StatusCode::kDataLoss,
       {"__metadata__", "not an object"}},
      {"metadata value not a string",
       R"({"__metadata__": {"k": 1}})",
       0,
       StatusCode::kDataLoss,
       {"__metadata__", "'k'", "not a string"}},
  };
  for (const auto& c : cases) {
    DYNAMIC_SECTION(c.what) {
      const auto r = parse_safetensors(file_from(c.header, c.data_size), "bad.safetensors");
      REQUIRE_FALSE(r.ok());
      CAPTURE(r.status().to_string());
      REQUIRE(r.status().code() == c.code);
      REQUIRE(r.status().message().rfind("bad.safetensors: ", 0) == 0);
      for (const auto& n : c.needles) REQUIRE(r.status().message().find(n) != std::string::npos);
    }
  }
}

TEST_CASE("safetensors survives deeply nested JSON headers", "[io]") {
  const size_t depth = 200000;
  const std::string closed = std::string(depth, '[') + std::string(depth, ']');
  auto r = parse_safetensors(file_from(closed, 0), "deep.safetensors");
  REQUIRE(r.status().code() == StatusCode::kDataLoss);
  REQUIRE_THAT(r.status().message(), Catch::Contains("not an object"));
  std::string objects;
  for (size_t i = 0; i < depth; ++i) objects += "{\"a\":";
  r = parse_safetensors(file_from(objects, 0), "deep.safetensors");
  REQUIRE(r.status().code() == StatusCode::kDataLoss);
  REQUIRE_THAT(r.status().message(), Catch::Contains("not valid JSON"));
}

TEST_CASE("safetensors rejects bad header lengths", "[io]") {
  auto code_and_message = [](const std::vector<uint8_t>& bytes) {
    const auto r = parse_safetensors(bytes, "bad.safetensors");
    REQUIRE_FALSE(r.ok());
    REQUIRE(r.status().code() == StatusCode::kDataLoss);
    return r.status().message();
  };
  REQUIRE_THAT(code_and_message({}), Catch::Contains("0 bytes, shorter than"));
  REQUIRE_THAT(code_and_message({2, 0, 0, 0, 0, 0, 0}), Catch::Contains("7 bytes, shorter than"));
  auto bytes = file_from("{}", 0);
  bytes[0] = 3;  // one byte more than the file holds
  REQUIRE_THAT(code_and_message(bytes), Catch::Contains("exceeds the 2 bytes"));
  bytes[0] = 0x01;
  bytes[3] = 0x10;  // 268 MB
  REQUIRE_THAT(code_and_message(bytes), Catch::Contains("exceeds the limit"));
  std::fill(bytes.begin(), bytes.begin() + 8, 0xff);
  REQUIRE_THAT(code_and_message(bytes), Catch::Contains("exceeds the limit"));
}

TEST_CASE("safetensors survives truncation and corruption anywhere", "[io]") {
  const std::vector<uint8_t> good = sample_file_bytes();
  REQUIRE(parse_safetensors(good, "good").ok());
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | good[static_cast<size_t>(i)];
  const size_t data_start = 8 + header_len;

  // A corrupt file must give an error; a file that still parses must be self-consistent.
  auto check = [](const std::vector<uint8_t>& bytes) {
    const auto r = parse_safetensors(bytes, "corrupt");
    if (!r.ok()) {
      const StatusCode c = r.status().code();
      REQUIRE((c == StatusCode::kDataLoss || c == StatusCode::kInvalidArgument));
      return false;
    }
    size_t total = 0;
    std::set<std::string> names;
    for (const auto& [name, t] : r->tensors) {
      REQUIRE(names.insert(name).second);
      total += t.nbytes();
    }
    REQUIRE(total < bytes.size());
    return true;
  };

  SECTION("every truncation is an error") {
    for (size_t n = 0; n < good.size(); ++n) {
      CAPTURE(n);
      REQUIRE_FALSE(check({good.begin(), good.begin() + static_cast<int64_t>(n)}));
    }
  }
  SECTION("appended bytes are an error") {
    auto bytes = good;
    bytes.push_back(0);
    REQUIRE_FALSE(check(bytes));
  }
  SECTION("every header byte replaced by many values") {
    size_t accepted = 0;
    for (size_t pos = 0; pos < data_start; ++pos) {
      for (int v : std::initializer_list<int>{0x00, 0x01, 0x20, '"', ',', '-', '0', '9', ':', '[',
                                              ']', '{', '}', 'e', 0x7f, 0x80, 0xc3, 0xff}) {
        auto bytes = good;
        if (bytes[pos] == v) continue;
        bytes[pos] = static_cast<uint8_t>(v);
        CAPTURE(pos, v);
        accepted += check(bytes) ? 1 : 0;
      }
      for (int bit = 0; bit < 8; ++bit) {
        auto bytes = good;
        bytes[pos] ^= static_cast<uint8_t>(1 << bit);
        CAPTURE(pos, bit);
        accepted += check(bytes) ? 1 : 0;
      }
    }
    // Some edits are harmless (padding, metadata text); most are not.
    REQUIRE(accepted > 0);
  }
  SECTION("random multi-byte corruption of the header") {
    std::mt19937_64 rng(17);
    for (int iter = 0; iter < 3000; ++iter) {
      auto bytes = good;
      const int flips = 1 + static_cast<int>(rng() % 4);
      for (int k = 0; k < flips; ++k) bytes[rng() % data_start] = static_cast<uint8_t>(rng());
      check(bytes);
    }
  }
  SECTION("data bytes are opaque: a flip loads and changes exactly that byte") {
    for (size_t pos = data_start; pos < good.size(); pos += 3) {
      auto bytes = good;
      bytes[pos] ^= 0x5a;
      const auto r = parse_safetensors(bytes, "flipped");
      REQUIRE(r.ok());
      std::vector<uint8_t> data;
      for (const auto& [name, t] : r->tensors) {
        const auto b = contiguous_bytes(t);
        data.insert(data.end(), b.begin(), b.end());
      }
      REQUIRE(
          std::equal(data.begin(), data.end(), bytes.begin() + static_cast<int64_t>(data_start)));
    }
  }
  SECTION("truncated files on disk") {
    TempDir dir;
    for (size_t n :
         {size_t{0}, size_t{5}, size_t{8}, data_start - 1, data_start, good.size() - 1}) {
      const auto path = dir / ("t" + std::to_string(n) + ".safetensors");
      write_bytes(path, {good.begin(), good.begin() + static_cast<int64_t>(n)});
      const auto r = load_safetensors(path);
      CAPTURE(n, r.status().to_string());
      REQUIRE(r.status().code() == StatusCode::kDataLoss);
      REQUIRE(r.status().message().find(path.string()) != std::string::npos);
    }
  }
}
