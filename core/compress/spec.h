// CodecSpec: which codec compresses a tensor and with what parameters, parsed from strings such
// as "topk:ratio=0.01,values=int8,ef=1"; CompressionSpec adds per-tensor overrides by name glob.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/util/status.h"

namespace starling::compress {

// Numbering matches starling.v1.CodecId in core/wire/codec.proto.
enum class CodecKind : uint8_t {
  kIdentity = 1,
  kFp16 = 2,
  kBf16 = 3,
  kInt8 = 4,
  kQsgd = 5,
  kTopk = 6,
  kRandk = 7,
  kPowerSgd = 8,
  kSign = 9,
};

// How the kept values of a sparse codec are sent. Numbering matches starling.v1.ValueCodingId.
enum class ValueCoding : uint8_t { kF32 = 0, kF16 = 1, kBf16 = 2, kInt8 = 3 };

std::string_view codec_kind_name(CodecKind kind);   // "topk"
std::string_view value_coding_name(ValueCoding v);  // "int8"

// Every parameter of every codec; each codec reads only its own (see parse_codec_spec).
struct CodecSpec {
  CodecKind kind = CodecKind::kIdentity;
  int block = 256;       // int8 block; int8 block of sparse values
  int levels = 8;        // QSGD s, 1..127
  int bucket = 512;      // QSGD bucket (elements sharing one norm)
  double ratio = 0.01;   // top-k / random-k: k = ceil(ratio * numel), at least 1
  bool approx = false;   // top-k: Deep Gradient Compression's sampled threshold
  double sample = 0.01;  // top-k approx: fraction of the tensor sampled (at least 256 elements)
  ValueCoding values = ValueCoding::kF32;  // top-k / random-k kept values
  int rank = 4;                            // PowerSGD r
  bool error_feedback = false;  // "ef": the sender keeps what was not sent (ErrorFeedback)

  // Canonical string, parseable by parse_codec_spec: "topk:ratio=0.01,values=int8,block=256".
  std::string to_string() const;
};

// Parses "name[:key=value[,key=value]...]". Names: identity, fp16, bf16, int8 (block), qsgd
// (levels, bucket), topk (ratio, approx, sample, values, block), randk (ratio, values, block),
// powersgd (rank), sign; every codec also takes ef (0/1). Unknown names, unknown or repeated keys
// and out-of-range values are InvalidArgument errors that name the codec and the key.
Result<CodecSpec> parse_codec_spec(std::string_view text);
// Checks the ranges of a spec built as a struct (what parse_codec_spec checks).
Status validate_codec_spec(const CodecSpec& spec);

// True when `name` matches `glob`: '*' matches any run of characters (dots included), '?' one.
bool glob_match(std::string_view glob, std::string_view name);

// The codec choice of one federation: a default, and overrides tried in order (first match wins),
// e.g. {"*.bias", identity}, {"*ln*", identity} keep biases and layer norms dense.
struct CompressionSpec {
  struct Override {
    std::string glob;
    CodecSpec spec;
  };
  CodecSpec default_spec;
  std::vector<Override> overrides;

  const CodecSpec& spec_for(std::string_view tensor_name) const;
  // Appends an override parsed from a spec string; errors name the glob.
  Status add_override(std::string glob, std::string_view spec_text);
};

// Parses a CompressionSpec: "DEFAULT[;GLOB=SPEC]...", e.g.
// "topk:ratio=0.01,ef=1;*.bias=identity;*ln_*=identity" (the first '=' of an override splits
// the glob from its spec; the first matching override wins). Errors name the part at fault.
Result<CompressionSpec> parse_compression_spec(std::string_view text);

}  // namespace starling::compress
