// Safetensors reader and writer. The whole header is validated before any tensor is
// allocated, so a corrupt file can never drive an allocation larger than itself.
#include "core/io/safetensors.h"

#include <sys/stat.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "core/io/file.h"

namespace starling::io {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian data; big-endian hosts are not supported");

namespace fs = std::filesystem;
using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

struct Entry {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  uint64_t begin = 0;  // offsets into the data region, which starts after the header
  uint64_t end = 0;
};

struct Header {
  std::vector<Entry> entries;  // sorted by data offset
  std::map<std::string, std::string> metadata;
};

// Bytes of a corrupt file may be anything: keep quoted text to one printable line.
std::string printable(std::string_view s, size_t max_len = 80) {
  std::string out;
  for (char c : s.substr(0, max_len)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  if (s.size() > max_len) out += "...";
  return out;
}

Status corrupt(std::string_view file, const std::string& what) {
  return data_loss(std::string(file) + ": " + what);
}

Status bad_tensor(std::string_view file, std::string_view name, const std::string& what) {
  return data_loss(std::string(file) + ": tensor '" + printable(name) + "': " + what);
}

std::optional<uint64_t> as_uint(const json& j) {
  if (j.is_number_unsigned()) return j.get<uint64_t>();
  if (j.is_number_integer() && j.get<int64_t>() >= 0)
    return static_cast<uint64_t>(j.get<int64_t>());
  return std::nullopt;
}

std::string offsets_str(uint64_t b, uint64_t e) {
  return "[" + std::to_string(b) + ", " + std::to_string(e) + "]";
}

Result<uint64_t> header_length(std::span<const uint8_t> prefix, uint64_t file_size,
                               std::string_view file) {
  if (file_size < 8) {
    return corrupt(file, "file is " + std::to_string(file_size) +
                             " bytes, shorter than the 8-byte header length");
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | prefix[static_cast<size_t>(i)];
  if (n > kMaxSafetensorsHeaderBytes) {
    return corrupt(file, "header length " + std::to_string(n) + " exceeds the limit of " +
                             std::to_string(kMaxSafetensorsHeaderBytes) + " bytes");
  }
  if (n > file_size - 8) {
    return corrupt(file, "header length " + std::to_string(n) + " exceeds the " +
                             std::to_string(file_size - 8) + " bytes that follow it");
  }
  return n;
}

// Parses the JSON text, rejecting duplicate keys at any depth (nlohmann keeps the last).
Result<json> parse_json(std::string_view text, std::string_view file) {
  std::vector<std::set<std::string>> open_objects;
  std::string top_key, duplicate, duplicate_owner;
  auto callback = [&](int, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case json::parse_event_t::key: {
        if (open_objects.empty() || !parsed.is_string()) break;
        const std::string& key = parsed.get_ref<const std::string&>();
        if (open_objects.size() == 1) top_key = key;
        if (!open_objects.back().insert(key).second && duplicate.empty()) {
          duplicate = key;
          duplicate_owner = open_objects.size() == 1 ? "" : top_key;
        }
        break;
      }
      default:
        break;
    }
    return true;
  };
  json root;
  try {
    root = json::parse(text.begin(), text.end(), callback);
  } catch (const json::exception& e) {
    std::string_view what = e.what();
    if (const size_t p = what.find("] "); p != std::string_view::npos) what.remove_prefix(p + 2);
    return corrupt(file, "header is not valid JSON: " + printable(what, 200));
  }
  if (!duplicate.empty()) {
    if (duplicate_owner.empty()) return bad_tensor(file, duplicate, "name appears twice");
    return corrupt(file, "header entry '" + printable(duplicate_owner) + "' has the field '" +
                             printable(duplicate) + "' twice");
  }
  return root;
}

Status parse_metadata(const json& j, std::string_view file,
                      std::map<std::string, std::string>* out) {
  if (!j.is_object()) {
    return corrupt(file,
                   std::string("__metadata__ is a JSON ") + j.type_name() + ", not an object");
  }
  for (const auto& item : j.items()) {
    if (!item.value().is_string()) {
      return corrupt(file, "__metadata__ value of '" + printable(item.key()) + "' is a JSON " +
                               item.value().type_name() + ", not a string");
    }
    (*out)[item.key()] = item.value().get<std::string>();
  }
  return ok_status();
}

Result<Entry> parse_entry(const std::string& name, const json& j, uint64_t data_size,
                          std::string_view file) {
  if (!j.is_object()) {
    return bad_tensor(file, name,
                      std::string("entry is a JSON ") + j.type_name() + ", not an object");
  }
  for (const auto& item : j.items()) {
    if (item.key() != "dtype" && item.key() != "shape" && item.key() != "data_offsets") {
      return bad_tensor(file, name, "unexpected field '" + printable(item.key()) + "'");
    }
  }
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    if (!j.contains(field))
      return bad_tensor(file, name, std::string("missing field '") + field + "'");
  }
  Entry e;
  e.name = name;

  const json& dt = j["dtype"];
  if (!dt.is_string()) {
    return bad_tensor(file, name,
                      std::string("dtype is a JSON ") + dt.type_name() + ", not a string");
  }
  const std::string& dt_name = dt.get_ref<const std::string&>();
  Result<DType> dtype = dtype_from_name(dt_name);
  if (!dtype.ok() || dtype_safetensors_name(*dtype) != dt_name) {
    return invalid_argument(std::string(file) + ": tensor '" + printable(name) +
                            "': unsupported dtype '" + printable(dt_name) +
                            "' (supported: F32, F64, BF16, F16, I32, I64, I8, U8)");
  }
  e.dtype = *dtype;

  const json& shape = j["shape"];
  if (!shape.is_array()) {
    return bad_tensor(file, name,
                      std::string("shape is a JSON ") + shape.type_name() + ", not a list");
  }
  // The product of the non-zero dimensions must fit in int64 (Tensor computes strides with it).
  uint64_t bound = 1;
  uint64_t numel = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    const std::optional<uint64_t> d = as_uint(shape[i]);
    if (!d || *d > static_cast<uint64_t>(INT64_MAX)) {
      return bad_tensor(file, name,
                        "shape[" + std::to_string(i) + "] = " + printable(shape[i].dump()) +
                            " is not a non-negative integer");
    }
    if (__builtin_mul_overflow(bound, std::max<uint64_t>(*d, 1), &bound) ||
        bound > static_cast<uint64_t>(INT64_MAX)) {
      return bad_tensor(file, name, "shape " + printable(shape.dump()) + " has too many elements");
    }
    numel *= *d;
    e.shape.push_back(static_cast<int64_t>(*d));
  }
  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(numel, dtype_size(e.dtype), &nbytes)) {
    return bad_tensor(file, name, "shape " + printable(shape.dump()) + " has too many elements");
  }

  const json& offs = j["data_offsets"];
  std::optional<uint64_t> b, en;
  if (offs.is_array() && offs.size() == 2) {
    b = as_uint(offs[0]);
    en = as_uint(offs[1]);
  }
  if (!b || !en) {
    return bad_tensor(file, name,
                      "data_offsets = " + printable(offs.dump()) +
                          " is not [begin, end] with non-negative integers");
  }
  e.begin = *b;
  e.end = *en;
  if (e.begin > e.end) {
    return bad_tensor(file, name, "data_offsets " + offsets_str(e.begin, e.end) + " are reversed");
  }
  if (e.end > data_size) {
    return bad_tensor(file, name,
                      "data_offsets " + offsets_str(e.begin, e.end) +
                          " run past the end of the data region (" + std::to_string(data_size) +
                          " bytes)");
  }
  if (e.end - e.begin != nbytes) {
    return bad_tensor(file, name,
                      "data_offsets " + offsets_str(e.begin, e.end) + " hold " +
                          std::to_string(e.end - e.begin) + " bytes, but dtype " + dt_name +
                          " and shape " + shape_str(e.shape) + " need " + std::to_string(nbytes));
  }
  return e;
}

Result<Header> parse_header(std::string_view text, uint64_t data_size, std::string_view file) {
  ASSIGN_OR_RETURN(json root, parse_json(text, file));
  if (!root.is_object()) {
    return corrupt(file, std::string("header is a JSON ") + root.type_name() + ", not an object");
  }
  Header h;
  for (const auto& item : root.items()) {
    if (item.key() == "__metadata__") {
      RETURN_IF_ERROR(parse_metadata(item.value(), file, &h.metadata));
      continue;
    }
    ASSIGN_OR_RETURN(Entry e, parse_entry(item.key(), item.value(), data_size, file));
    h.entries.push_back(std::move(e));
  }
  std::stable_sort(h.entries.begin(), h.entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  // The tensors must tile the data region exactly: no overlap, no gap, nothing after.
  uint64_t cursor = 0;
  std::string_view previous;
  for (const Entry& e : h.entries) {
    if (e.begin < cursor) {
      return bad_tensor(file, e.name,
                        "data_offsets " + offsets_str(e.begin, e.end) + " overlap tensor '" +
                            printable(previous) + "', which ends at " + std::to_string(cursor));
    }
    if (e.begin > cursor) {
      return bad_tensor(file, e.name,
                        "data_offsets " + offsets_str(e.begin, e.end) + " leave bytes [" +
                            std::to_string(cursor) + ", " + std::to_string(e.begin) +
                            ") of the data unused");
    }
    cursor = e.end;
    previous = e.name;
  }
  if (cursor != data_size) {
    return corrupt(file, std::to_string(data_size - cursor) +
                             " bytes of trailing data after the last tensor (which ends at " +
                             std::to_string(cursor) + " of " + std::to_string(data_size) + ")");
  }
  return h;
}

// Byte-exact copy of a strided tensor. (Tensor::contiguous() converts some dtypes through
// double, which would round 64-bit integers and quiet NaN payloads.)
Status append_tensor(AtomicFile& out, const Tensor& t) {
  if (t.numel() == 0) return ok_status();
  if (t.is_contiguous()) return out.append(t.raw_data(), t.nbytes());
  constexpr size_t kChunk = size_t{1} << 20;
  const size_t esize = dtype_size(t.dtype());
  const char* base = static_cast<const char*>(t.impl()->storage->data());
  const Shape& shape = t.shape();
  const Strides& strides = t.strides();
  std::vector<int64_t> index(shape.size(), 0);
  std::vector<char> buf;
  buf.reserve(std::min(kChunk + esize, t.nbytes()));
  int64_t off = t.offset();
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) {
    const char* p = base + off * static_cast<int64_t>(esize);
    buf.insert(buf.end(), p, p + esize);
    if (buf.size() >= kChunk) {
      RETURN_IF_ERROR(out.append(buf.data(), buf.size()));
      buf.clear();
    }
    for (size_t d = shape.size(); d-- > 0;) {
      if (++index[d] < shape[d]) {
        off += strides[d];
        break;
      }
      off -= strides[d] * (shape[d] - 1);
      index[d] = 0;
    }
  }
  return out.append(buf.data(), buf.size());
}

}  // namespace

Status save_safetensors(const fs::path& path, const StateDict& tensors,
                        const std::map<std::string, std::string>& metadata) {
  const std::string file = path.string();
  ordered_json header = ordered_json::object();
  if (!metadata.empty()) {
    ordered_json m = ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = std::move(m);
  }
  std::set<std::string_view> seen;
  uint64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, t] = tensors[i];
    const std::string where =
        file + ": tensor #" + std::to_string(i) + " '" + printable(name) + "'";
    if (name.empty()) return invalid_argument(where + ": empty name");
    if (name == "__metadata__") return invalid_argument(where + ": the name is reserved");
    if (!seen.insert(name).second) return invalid_argument(where + ": duplicate name");
    if (!t.defined()) return invalid_argument(where + ": undefined tensor");
    if (t.device().type != DeviceType::kCPU) {
      return invalid_argument(where + ": not on the CPU; copy it to the CPU before saving");
    }
    ordered_json e = ordered_json::object();
    e["dtype"] = std::string(dtype_safetensors_name(t.dtype()));
    e["shape"] = t.shape();
    e["data_offsets"] = {offset, offset + t.nbytes()};
    header[name] = std::move(e);
    offset += t.nbytes();
  }
  std::string text;
  try {
    text = header.dump(-1, ' ', false, ordered_json::error_handler_t::strict);
  } catch (const ordered_json::exception&) {
    return invalid_argument(file + ": a tensor name or metadata string is not valid UTF-8");
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(uint64_t{text.size()} >> (8 * i));

  ASSIGN_OR_RETURN(AtomicFile out, AtomicFile::create(path));
  RETURN_IF_ERROR(out.append(len, sizeof(len)));
  RETURN_IF_ERROR(out.append(text.data(), text.size()));
  for (const auto& [name, t] : tensors) RETURN_IF_ERROR(append_tensor(out, t));
  return out.commit();
}

Result<SafetensorsFile> parse_safetensors(std::span<const uint8_t> bytes,
                                          std::string_view source_name) {
  ASSIGN_OR_RETURN(uint64_t n, header_length(bytes, bytes.size(), source_name));
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()) + 8, n);
  ASSIGN_OR_RETURN(Header h, parse_header(text, bytes.size() - 8 - n, source_name));
  SafetensorsFile out;
  out.metadata = std::move(h.metadata);
  const uint8_t* data = bytes.data() + 8 + n;
  for (Entry& e : h.entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype);
    if (e.end > e.begin) std::memcpy(t.raw_data(), data + e.begin, e.end - e.begin);
    out.tensors.emplace_back(std::move(e.name), std::move(t));
  }
  return out;
}

Result<SafetensorsFile> load_safetensors(const fs::path& path) {
  ASSIGN_OR_RETURN(UniqueFd fd, open_for_read(path));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return errno_status(errno, "cannot stat", path);
  if (!S_ISREG(st.st_mode)) return invalid_argument(path.string() + ": not a regular file");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  uint8_t prefix[8] = {};
  if (size >= 8) RETURN_IF_ERROR(read_exact_at(fd.get(), prefix, 8, 0, path));
  ASSIGN_OR_RETURN(uint64_t n, header_length(prefix, size, path.string()));
  std::string text(n, '\0');
  RETURN_IF_ERROR(read_exact_at(fd.get(), text.data(), n, 8, path));
  ASSIGN_OR_RETURN(Header h, parse_header(text, size - 8 - n, path.string()));
  SafetensorsFile out;
  out.metadata = std::move(h.metadata);
  for (Entry& e : h.entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype);
    RETURN_IF_ERROR(read_exact_at(fd.get(), t.raw_data(), e.end - e.begin, 8 + n + e.begin, path));
    out.tensors.emplace_back(std::move(e.name), std::move(t));
  }
  return out;
}

}  // namespace starling::io
