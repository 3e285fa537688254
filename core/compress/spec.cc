// Parsing and printing of codec specs, and the glob matcher of per-tensor overrides.
#include "core/compress/spec.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <set>

namespace starling::compress {
namespace {

struct KindName {
  CodecKind kind;
  std::string_view name;
  std::string_view keys;  // accepted keys besides "ef", for error messages
};

constexpr KindName kKinds[] = {
    {CodecKind::kIdentity, "identity", ""},
    {CodecKind::kFp16, "fp16", ""},
    {CodecKind::kBf16, "bf16", ""},
    {CodecKind::kInt8, "int8", "block"},
    {CodecKind::kQsgd, "qsgd", "levels, bucket"},
    {CodecKind::kTopk, "topk", "ratio, approx, sample, values, block"},
    {CodecKind::kRandk, "randk", "ratio, values, block"},
    {CodecKind::kPowerSgd, "powersgd", "rank"},
    {CodecKind::kSign, "sign", ""},
};

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool key_allowed(CodecKind kind, std::string_view key) {
  if (key == "ef") return true;
  switch (kind) {
    case CodecKind::kInt8:
      return key == "block";
    case CodecKind::kQsgd:
      return key == "levels" || key == "bucket";
    case CodecKind::kTopk:
      return key == "ratio" || key == "approx" || key == "sample" || key == "values" ||
             key == "block";
    case CodecKind::kRandk:
      return key == "ratio" || key == "values" || key == "block";
    case CodecKind::kPowerSgd:
      return key == "rank";
    default:
      return false;
  }
}

Result<int> parse_int(std::string_view v) {
  int out = 0;
  const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc() || p != v.data() + v.size()) {
    return invalid_argument("'" + std::string(v) + "' is not an integer");
  }
  return out;
}

Result<double> parse_double(std::string_view v) {
  double out = 0;
  const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc() || p != v.data() + v.size() || !std::isfinite(out)) {
    return invalid_argument("'" + std::string(v) + "' is not a number");
  }
  return out;
}

Result<bool> parse_bool(std::string_view v) {
  if (v == "1" || v == "true") return true;
  if (v == "0" || v == "false") return false;
  return invalid_argument("'" + std::string(v) + "' is not 0/1/true/false");
}

Result<ValueCoding> parse_values(std::string_view v) {
  for (ValueCoding c :
       {ValueCoding::kF32, ValueCoding::kF16, ValueCoding::kBf16, ValueCoding::kInt8}) {
    if (v == value_coding_name(c)) return c;
  }
  return invalid_argument("'" + std::string(v) + "' is not one of f32, fp16, bf16, int8");
}

Status set_param(CodecSpec& s, std::string_view key, std::string_view v) {
  if (key == "ef") {
    ASSIGN_OR_RETURN(s.error_feedback, parse_bool(v));
  } else if (key == "block") {
    ASSIGN_OR_RETURN(s.block, parse_int(v));
  } else if (key == "levels") {
    ASSIGN_OR_RETURN(s.levels, parse_int(v));
  } else if (key == "bucket") {
    ASSIGN_OR_RETURN(s.bucket, parse_int(v));
  } else if (key == "ratio") {
    ASSIGN_OR_RETURN(s.ratio, parse_double(v));
  } else if (key == "approx") {
    ASSIGN_OR_RETURN(s.approx, parse_bool(v));
  } else if (key == "sample") {
    ASSIGN_OR_RETURN(s.sample, parse_double(v));
  } else if (key == "values") {
    ASSIGN_OR_RETURN(s.values, parse_values(v));
  } else if (key == "rank") {
    ASSIGN_OR_RETURN(s.rank, parse_int(v));
  }
  return ok_status();
}

std::string fmt_double(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

}  // namespace

std::string_view codec_kind_name(CodecKind kind) {
  for (const auto& k : kKinds) {
    if (k.kind == kind) return k.name;
  }
  return "unknown";
}

std::string_view value_coding_name(ValueCoding v) {
  switch (v) {
    case ValueCoding::kF32:
      return "f32";
    case ValueCoding::kF16:
      return "fp16";
    case ValueCoding::kBf16:
      return "bf16";
    case ValueCoding::kInt8:
      return "int8";
  }
  return "unknown";
}

std::string CodecSpec::to_string() const {
  std::string out(codec_kind_name(kind));
  std::vector<std::string> kv;
  switch (kind) {
    case CodecKind::kInt8:
      kv.push_back("block=" + std::to_string(block));
      break;
    case CodecKind::kQsgd:
      kv.push_back("levels=" + std::to_string(levels));
      kv.push_back("bucket=" + std::to_string(bucket));
      break;
    case CodecKind::kTopk:
    case CodecKind::kRandk:
      kv.push_back("ratio=" + fmt_double(ratio));
      if (kind == CodecKind::kTopk && approx) {
        kv.push_back("approx=1");
        kv.push_back("sample=" + fmt_double(sample));
      }
      kv.push_back("values=" + std::string(value_coding_name(values)));
      if (values == ValueCoding::kInt8) kv.push_back("block=" + std::to_string(block));
      break;
    case CodecKind::kPowerSgd:
      kv.push_back("rank=" + std::to_string(rank));
      break;
    default:
      break;
  }
  if (error_feedback) kv.push_back("ef=1");
  for (size_t i = 0; i < kv.size(); ++i) out += (i == 0 ? ":" : ",") + kv[i];
  return out;
}

Status validate_codec_spec(const CodecSpec& s) {
  const std::string name(codec_kind_name(s.kind));
  auto bad = [&](std::string_view key, std::string what) {
    return invalid_argument("codec '" + name + "': " + std::string(key) + " " + what);
  };
  if (name == "unknown") return invalid_argument("unknown codec kind");
  const bool int8_block =
      s.kind == CodecKind::kInt8 || ((s.kind == CodecKind::kTopk || s.kind == CodecKind::kRandk) &&
                                     s.values == ValueCoding::kInt8);
  if (int8_block && (s.block < 1 || s.block > (1 << 20))) {
    return bad("block", "must be in [1, 1048576], got " + std::to_string(s.block));
  }
  if (s.kind == CodecKind::kQsgd) {
    if (s.levels < 1 || s.levels > 127) {
      return bad("levels", "must be in [1, 127], got " + std::to_string(s.levels));
    }
    if (s.bucket < 1 || s.bucket > (1 << 24)) {
      return bad("bucket", "must be in [1, 16777216], got " + std::to_string(s.bucket));
    }
  }
  if (s.kind == CodecKind::kTopk || s.kind == CodecKind::kRandk) {
    if (!(s.ratio > 0.0 && s.ratio <= 1.0)) {
      return bad("ratio", "must be in (0, 1], got " + fmt_double(s.ratio));
    }
    if (!(s.sample > 0.0 && s.sample <= 1.0)) {
      return bad("sample", "must be in (0, 1], got " + fmt_double(s.sample));
    }
  }
  if (s.kind == CodecKind::kPowerSgd && (s.rank < 1 || s.rank > 1024)) {
    return bad("rank", "must be in [1, 1024], got " + std::to_string(s.rank));
  }
  return ok_status();
}

Result<CodecSpec> parse_codec_spec(std::string_view text) {
  text = trim(text);
  const size_t colon = text.find(':');
  const std::string_view name = trim(text.substr(0, colon));
  CodecSpec spec;
  const KindName* kind = nullptr;
  for (const auto& k : kKinds) {
    if (k.name == name) kind = &k;
  }
  if (kind == nullptr) {
    return invalid_argument("unknown codec '" + std::string(name) +
                            "' (known: identity, fp16, bf16, int8, qsgd, topk, randk, "
                            "powersgd, sign)");
  }
  spec.kind = kind->kind;
  std::set<std::string, std::less<>> seen;
  std::string_view rest = colon == std::string_view::npos ? "" : text.substr(colon + 1);
  while (!trim(rest).empty()) {
    const size_t comma = rest.find(',');
    const std::string_view item = trim(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? "" : rest.substr(comma + 1);
    const size_t eq = item.find('=');
    const std::string_view key = trim(item.substr(0, eq));
    const std::string ctx = "codec '" + std::string(name) + "'";
    if (eq == std::string_view::npos) {
      return invalid_argument(ctx + ": expected key=value, got '" + std::string(item) + "'");
    }
    if (!key_allowed(spec.kind, key)) {
      std::string known(kind->keys);
      known += known.empty() ? "ef" : ", ef";
      return invalid_argument(ctx + ": unknown parameter '" + std::string(key) +
                              "' (known: " + known + ")");
    }
    if (!seen.insert(std::string(key)).second) {
      return invalid_argument(ctx + ": parameter '" + std::string(key) + "' given twice");
    }
    RETURN_IF_ERROR(set_param(spec, key, trim(item.substr(eq + 1))),
                    ctx + ": parameter '" + std::string(key) + "'");
  }
  RETURN_IF_ERROR(validate_codec_spec(spec));
  return spec;
}

bool glob_match(std::string_view glob, std::string_view name) {
  // Iterative matcher with one backtrack point: linear in practice, no recursion.
  size_t g = 0, n = 0, star = std::string_view::npos, mark = 0;
  while (n < name.size()) {
    if (g < glob.size() && (glob[g] == '?' || glob[g] == name[n])) {
      ++g;
      ++n;
    } else if (g < glob.size() && glob[g] == '*') {
      star = g++;
      mark = n;
    } else if (star != std::string_view::npos) {
      g = star + 1;
      n = ++mark;
    } else {
      return false;
    }
  }
  while (g < glob.size() && glob[g] == '*') ++g;
  return g == glob.size();
}

const CodecSpec& CompressionSpec::spec_for(std::string_view tensor_name) const {
  for (const auto& o : overrides) {
    if (glob_match(o.glob, tensor_name)) return o.spec;
  }
  return default_spec;
}

Status CompressionSpec::add_override(std::string glob, std::string_view spec_text) {
  if (glob.empty()) return invalid_argument("override: empty tensor-name glob");
  auto spec = parse_codec_spec(spec_text);
  if (!spec.ok()) return spec.status().with_context("override '" + glob + "'");
  overrides.push_back({std::move(glob), *spec});
  return ok_status();
}

Result<CompressionSpec> parse_compression_spec(std::string_view text) {
  CompressionSpec cs;
  size_t start = 0;
  bool first = true;
  while (start <= text.size()) {
    const size_t semi = text.find(';', start);
    const std::string_view part = trim(
        text.substr(start, semi == std::string_view::npos ? std::string_view::npos : semi - start));
    if (first) {
      ASSIGN_OR_RETURN(cs.default_spec, parse_codec_spec(part));
      first = false;
    } else {
      const size_t eq = part.find('=');
      if (part.empty() || eq == std::string_view::npos || eq == 0) {
        return invalid_argument("override '" + std::string(part) + "': expected GLOB=SPEC");
      }
      RETURN_IF_ERROR(cs.add_override(std::string(trim(part.substr(0, eq))), part.substr(eq + 1)));
    }
    if (semi == std::string_view::npos) break;
    start = semi + 1;
  }
  return cs;
}

}  // namespace starling::compress
