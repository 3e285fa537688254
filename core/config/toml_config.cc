// The TOML -> protobuf reader: walks the parsed TOML tree and the message descriptor together,
// rejecting anything the schema does not name or type.
#include "core/config/toml_config.h"

#include <google/protobuf/descriptor.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <system_error>
#include <vector>

namespace starling::config {
namespace {

namespace pb = google::protobuf;
using FD = pb::FieldDescriptor;

std::string_view toml_type_name(toml::node_type t) {
  switch (t) {
    case toml::node_type::table:
      return "table";
    case toml::node_type::array:
      return "array";
    case toml::node_type::string:
      return "string";
    case toml::node_type::integer:
      return "integer";
    case toml::node_type::floating_point:
      return "float";
    case toml::node_type::boolean:
      return "boolean";
    case toml::node_type::date:
      return "date";
    case toml::node_type::time:
      return "time";
    case toml::node_type::date_time:
      return "date-time";
    case toml::node_type::none:
      break;
  }
  return "nothing";
}

std::string enum_names(const pb::EnumDescriptor* e) {
  std::string s;
  for (int i = 0; i < e->value_count(); ++i) {
    if (i > 0) s += ", ";
    s += e->value(i)->name();
  }
  return s;
}

std::string expected_type(const FD* f) {
  switch (f->cpp_type()) {
    case FD::CPPTYPE_INT32:
      return "integer (int32)";
    case FD::CPPTYPE_INT64:
      return "integer (int64)";
    case FD::CPPTYPE_UINT32:
      return "integer (uint32)";
    case FD::CPPTYPE_UINT64:
      return "integer (uint64)";
    case FD::CPPTYPE_FLOAT:
    case FD::CPPTYPE_DOUBLE:
      return "float";
    case FD::CPPTYPE_BOOL:
      return "boolean";
    case FD::CPPTYPE_STRING:
      return "string";
    case FD::CPPTYPE_ENUM:
      return "string (one of " + enum_names(f->enum_type()) + ")";
    case FD::CPPTYPE_MESSAGE:
      return "table";
  }
  return "?";
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] =
          std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// " (did you mean 'x'?)" for a close field name, else " (known keys: ...)".
std::string suggestion(std::string_view key, const pb::Descriptor* d) {
  const pb::FieldDescriptor* best = nullptr;
  size_t best_distance = std::numeric_limits<size_t>::max();
  for (int i = 0; i < d->field_count(); ++i) {
    const size_t dist = edit_distance(lower(key), lower(d->field(i)->name()));
    if (dist < best_distance) {
      best_distance = dist;
      best = d->field(i);
    }
  }
  if (best == nullptr) return " (this table takes no keys)";
  if (best_distance <= std::max<size_t>(2, key.size() / 3)) {
    return " (did you mean '" + best->name() + "'?)";
  }
  std::string s = " (known keys: ";
  for (int i = 0; i < d->field_count(); ++i) s += (i > 0 ? ", " : "") + d->field(i)->name();
  return s + ")";
}

class Reader {
 public:
  explicit Reader(std::string_view source) : source_(source) {}

  Status fill(const toml::table& table, pb::Message* m, const std::string& prefix) {
    const pb::Descriptor* d = m->GetDescriptor();
    const pb::Reflection* r = m->GetReflection();
    for (auto&& [key, node] : table) {
      const std::string name(key.str());
      const std::string path = prefix.empty() ? name : prefix + "." + name;
      const FD* f = d->FindFieldByName(name);
      if (f == nullptr) {
        return invalid_argument(where(key.source()) + ": unknown key '" + path + "'" +
                                suggestion(name, d));
      }
      if (f->is_map()) return error(node, path, "map fields are not supported");
      if (const pb::OneofDescriptor* o = f->real_containing_oneof();
          o != nullptr && r->HasOneof(*m, o)) {
        return error(node, path,
                     "conflicts with '" + r->GetOneofFieldDescriptor(*m, o)->name() +
                         "' (both belong to oneof '" + o->name() + "')");
      }
      RETURN_IF_ERROR(set_field(node, m, f, path));
    }
    return ok_status();
  }

 private:
  std::string where(const toml::source_region& region) const {
    std::string s(source_);
    if (region.begin.line > 0) s += ":" + std::to_string(region.begin.line);
    return s;
  }

  Status error(const toml::node& n, std::string_view path, const std::string& what) const {
    return invalid_argument(where(n.source()) + ": key '" + std::string(path) + "': " + what);
  }

  Status type_error(const toml::node& n, std::string_view path, const std::string& expected) const {
    return error(n, path,
                 "expected " + expected + ", got " + std::string(toml_type_name(n.type())));
  }

  Status set_field(const toml::node& n, pb::Message* m, const FD* f, const std::string& path) {
    if (!f->is_repeated()) return set_value(n, m, f, path);
    const toml::array* arr = n.as_array();
    if (arr == nullptr) return type_error(n, path, "array of " + expected_type(f));
    for (size_t i = 0; i < arr->size(); ++i) {
      RETURN_IF_ERROR(set_value(*arr->get(i), m, f, path + "[" + std::to_string(i) + "]"));
    }
    return ok_status();
  }

  // Sets a singular field, or appends one element to a repeated one.
  Status set_value(const toml::node& n, pb::Message* m, const FD* f, const std::string& path) {
    const pb::Reflection* r = m->GetReflection();
    const bool rep = f->is_repeated();
    switch (f->cpp_type()) {
      case FD::CPPTYPE_MESSAGE: {
        const toml::table* t = n.as_table();
        if (t == nullptr) return type_error(n, path, expected_type(f));
        return fill(*t, rep ? r->AddMessage(m, f) : r->MutableMessage(m, f), path);
      }
      case FD::CPPTYPE_INT32:
      case FD::CPPTYPE_INT64:
      case FD::CPPTYPE_UINT32:
      case FD::CPPTYPE_UINT64:
        return set_integer(n, m, f, path);
      case FD::CPPTYPE_FLOAT:
      case FD::CPPTYPE_DOUBLE: {
        double x = 0;
        if (const auto* i = n.as_integer()) {
          x = static_cast<double>(i->get());
        } else if (const auto* d = n.as_floating_point()) {
          x = d->get();
        } else {
          return type_error(n, path, expected_type(f));
        }
        if (f->cpp_type() == FD::CPPTYPE_DOUBLE) {
          rep ? r->AddDouble(m, f, x) : r->SetDouble(m, f, x);
          return ok_status();
        }
        // Doubles from FLT_MAX + half an ulp upward would round to infinity.
        if (std::isfinite(x) && std::fabs(x) >= 0x1.ffffffp+127) {
          char buf[32];
          const auto res = std::to_chars(buf, buf + sizeof(buf), x);
          return error(n, path, std::string(buf, res.ptr) + " is out of range for float");
        }
        rep ? r->AddFloat(m, f, static_cast<float>(x)) : r->SetFloat(m, f, static_cast<float>(x));
        return ok_status();
      }
      case FD::CPPTYPE_BOOL: {
        const auto* b = n.as_boolean();
        if (b == nullptr) return type_error(n, path, expected_type(f));
        rep ? r->AddBool(m, f, b->get()) : r->SetBool(m, f, b->get());
        return ok_status();
      }
      case FD::CPPTYPE_STRING: {
        const auto* s = n.as_string();
        if (s == nullptr) return type_error(n, path, expected_type(f));
        rep ? r->AddString(m, f, s->get()) : r->SetString(m, f, s->get());
        return ok_status();
      }
      case FD::CPPTYPE_ENUM: {
        const auto* s = n.as_string();
        if (s == nullptr) return type_error(n, path, expected_type(f));
        const pb::EnumDescriptor* e = f->enum_type();
        for (int i = 0; i < e->value_count(); ++i) {
          const pb::EnumValueDescriptor* v = e->value(i);
          if (lower(v->name()) == lower(s->get())) {
            rep ? r->AddEnum(m, f, v) : r->SetEnum(m, f, v);
            return ok_status();
          }
        }
        return error(n, path, "unknown value '" + s->get() + "' (allowed: " + enum_names(e) + ")");
      }
    }
    return error(n, path, "unsupported field type");
  }

  Status set_integer(const toml::node& n, pb::Message* m, const FD* f, const std::string& path) {
    const auto* i = n.as_integer();
    if (i == nullptr) return type_error(n, path, expected_type(f));
    const int64_t x = i->get();
    const pb::Reflection* r = m->GetReflection();
    const bool rep = f->is_repeated();
    auto out_of_range = [&](auto lo, auto hi, const char* type) {
      return error(n, path,
                   std::to_string(x) + " is out of range for " + type + " [" + std::to_string(lo) +
                       ", " + std::to_string(hi) + "]");
    };
    switch (f->cpp_type()) {
      case FD::CPPTYPE_INT32: {
        constexpr auto lo = std::numeric_limits<int32_t>::min();
        constexpr auto hi = std::numeric_limits<int32_t>::max();
        if (x < lo || x > hi) return out_of_range(lo, hi, "int32");
        rep ? r->AddInt32(m, f, static_cast<int32_t>(x))
            : r->SetInt32(m, f, static_cast<int32_t>(x));
        return ok_status();
      }
      case FD::CPPTYPE_INT64:
        rep ? r->AddInt64(m, f, x) : r->SetInt64(m, f, x);
        return ok_status();
      case FD::CPPTYPE_UINT32: {
        constexpr auto hi = std::numeric_limits<uint32_t>::max();
        if (x < 0 || x > int64_t{hi}) return out_of_range(0, hi, "uint32");
        rep ? r->AddUInt32(m, f, static_cast<uint32_t>(x))
            : r->SetUInt32(m, f, static_cast<uint32_t>(x));
        return ok_status();
      }
      case FD::CPPTYPE_UINT64:
        if (x < 0) return out_of_range(0, std::numeric_limits<uint64_t>::max(), "uint64");
        rep ? r->AddUInt64(m, f, static_cast<uint64_t>(x))
            : r->SetUInt64(m, f, static_cast<uint64_t>(x));
        return ok_status();
      default:
        break;
    }
    return error(n, path, "unsupported field type");
  }

  std::string_view source_;
};

}  // namespace

Status parse_toml(std::string_view text, std::string_view source_name, pb::Message* out) {
  out->Clear();
  toml::table root;
#if TOML_EXCEPTIONS
  try {
    root = toml::parse(text, source_name);
  } catch (const toml::parse_error& e) {
    return invalid_argument(std::string(source_name) + ":" + std::to_string(e.source().begin.line) +
                            ":" + std::to_string(e.source().begin.column) + ": " +
                            std::string(e.description()));
  }
#else
  toml::parse_result parsed = toml::parse(text, source_name);
  if (!parsed) {
    const toml::parse_error& e = parsed.error();
    return invalid_argument(std::string(source_name) + ":" + std::to_string(e.source().begin.line) +
                            ":" + std::to_string(e.source().begin.column) + ": " +
                            std::string(e.description()));
  }
  root = std::move(parsed).table();
#endif
  RETURN_IF_ERROR(Reader(source_name).fill(root, out, ""));
  if (!out->IsInitialized()) {
    std::vector<std::string> missing;
    out->FindInitializationErrors(&missing);
    std::string list;
    for (const auto& k : missing) list += (list.empty() ? "" : ", ") + k;
    return invalid_argument(std::string(source_name) + ": missing required key(s): " + list);
  }
  return ok_status();
}

Status load_toml(const std::filesystem::path& file, pb::Message* out) {
  std::error_code ec;
  const auto st = std::filesystem::status(file, ec);
  if (!std::filesystem::exists(st)) return not_found(file.string() + ": no such config file");
  if (std::filesystem::is_directory(st)) {
    return invalid_argument(file.string() + ": is a directory, not a config file");
  }
  std::ifstream in(file, std::ios::binary);
  std::ostringstream text;
  if (in) text << in.rdbuf();
  if (!in || in.bad()) {
    return invalid_argument(file.string() + ": cannot read: " + std::strerror(errno));
  }
  return parse_toml(text.str(), file.string(), out);
}

}  // namespace starling::config
