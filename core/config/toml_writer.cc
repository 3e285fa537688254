// to_toml: the effective configuration (every field, defaults included) written back as TOML.
#include <google/protobuf/descriptor.h>

#include <charconv>
#include <cmath>
#include <string>
#include <vector>

#include "core/config/toml_config.h"

namespace starling::config {
namespace {

namespace pb = google::protobuf;
using FD = pb::FieldDescriptor;

// Shortest text that reads back as the same value, spelled as a TOML float.
template <typename F>
std::string format_float(F x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x < 0 ? "-inf" : "inf";
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), x);
  std::string s(buf, res.ptr);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

std::string quote(const std::string& s) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out = "\"";
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (u < 0x20 || u == 0x7f) {
          out += "\\u00";
          out += kHex[u >> 4];
          out += kHex[u & 0xf];
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

// Fields written for `m`: all of them, except the unset members of a oneof.
std::vector<const FD*> written_fields(const pb::Message& m) {
  std::vector<const FD*> fields;
  const pb::Descriptor* d = m.GetDescriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    const FD* f = d->field(i);
    if (f->real_containing_oneof() != nullptr && !m.GetReflection()->HasField(m, f)) continue;
    fields.push_back(f);
  }
  return fields;
}

class Writer {
 public:
  std::string take() { return std::move(out_); }

  // Key/values of `m`, then one [path.field] table per singular message field.
  void table(const pb::Message& m, const std::string& path) {
    stack_.push_back(m.GetDescriptor());
    std::vector<const FD*> tables;
    for (const FD* f : written_fields(m)) {
      if (f->cpp_type() == FD::CPPTYPE_MESSAGE && !f->is_repeated()) {
        if (descend(m, f)) tables.push_back(f);
        continue;
      }
      out_ += f->name() + " = " + field_value(m, f) + "\n";
    }
    for (const FD* f : tables) {
      const std::string sub = path.empty() ? f->name() : path + "." + f->name();
      if (!out_.empty()) out_ += "\n";
      out_ += "[" + sub + "]\n";
      table(m.GetReflection()->GetMessage(m, f), sub);
    }
    stack_.pop_back();
  }

 private:
  // An unset message field whose type is already being written would recurse forever; its
  // default is the empty message, so it is left out.
  bool descend(const pb::Message& m, const FD* f) const {
    if (m.GetReflection()->HasField(m, f)) return true;
    return std::find(stack_.begin(), stack_.end(), f->message_type()) == stack_.end();
  }

  std::string field_value(const pb::Message& m, const FD* f) {
    if (!f->is_repeated()) return element(m, f, -1);
    std::string s = "[";
    const int n = m.GetReflection()->FieldSize(m, f);
    for (int i = 0; i < n; ++i) s += (i > 0 ? ", " : "") + element(m, f, i);
    return s + "]";
  }

  std::string inline_table(const pb::Message& m) {
    stack_.push_back(m.GetDescriptor());
    std::string s = "{";
    bool first = true;
    for (const FD* f : written_fields(m)) {
      if (f->cpp_type() == FD::CPPTYPE_MESSAGE && !f->is_repeated() && !descend(m, f)) continue;
      s += (first ? " " : ", ") + f->name() + " = " + field_value(m, f);
      first = false;
    }
    stack_.pop_back();
    return s + (first ? "}" : " }");
  }

  // One value: the singular field (index < 0) or element `index` of a repeated one.
  std::string element(const pb::Message& m, const FD* f, int i) {
    const pb::Reflection* r = m.GetReflection();
    const bool rep = i >= 0;
    switch (f->cpp_type()) {
      case FD::CPPTYPE_INT32:
        return std::to_string(rep ? r->GetRepeatedInt32(m, f, i) : r->GetInt32(m, f));
      case FD::CPPTYPE_INT64:
        return std::to_string(rep ? r->GetRepeatedInt64(m, f, i) : r->GetInt64(m, f));
      case FD::CPPTYPE_UINT32:
        return std::to_string(rep ? r->GetRepeatedUInt32(m, f, i) : r->GetUInt32(m, f));
      case FD::CPPTYPE_UINT64:
        return std::to_string(rep ? r->GetRepeatedUInt64(m, f, i) : r->GetUInt64(m, f));
      case FD::CPPTYPE_FLOAT:
        return format_float(rep ? r->GetRepeatedFloat(m, f, i) : r->GetFloat(m, f));
      case FD::CPPTYPE_DOUBLE:
        return format_float(rep ? r->GetRepeatedDouble(m, f, i) : r->GetDouble(m, f));
      case FD::CPPTYPE_BOOL:
        return (rep ? r->GetRepeatedBool(m, f, i) : r->GetBool(m, f)) ? "true" : "false";
      case FD::CPPTYPE_STRING:
        return quote(rep ? r->GetRepeatedString(m, f, i) : r->GetString(m, f));
      case FD::CPPTYPE_ENUM:
        return quote((rep ? r->GetRepeatedEnum(m, f, i) : r->GetEnum(m, f))->name());
      case FD::CPPTYPE_MESSAGE:
        return inline_table(rep ? r->GetRepeatedMessage(m, f, i) : r->GetMessage(m, f));
    }
    return "\"\"";
  }

  std::string out_;
  std::vector<const pb::Descriptor*> stack_;
};

}  // namespace

std::string to_toml(const pb::Message& msg) {
  Writer w;
  w.table(msg, "");
  return w.take();
}

}  // namespace starling::config
