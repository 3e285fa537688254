// Typed configuration from TOML: a strict, reflection-driven reader into any protobuf message,
// a writer of the effective configuration, and the validated RunConfig of `starling train`.
#pragma once

#include <google/protobuf/message.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "core/util/status.h"
#include "core/wire/config.pb.h"

namespace starling::config {

// Parses TOML `text` into `*out`, which is cleared first. Tables map to message fields by
// exact field name, recursively; arrays map to repeated fields (arrays of tables to repeated
// messages). Scalars: integer -> any integer field (range-checked; negative into unsigned is an
// error), integer or float -> float/double, boolean -> bool, string -> string, string -> enum
// (value name, case-insensitive). Anything else is InvalidArgument: a TOML syntax error
// ("SOURCE:LINE:COL: ..."), an unknown key ("SOURCE:LINE: unknown key 'a.b' (did you mean
// 'c'?)"), a wrong type or an out-of-range value ("SOURCE:LINE: key 'a.b': ..."), a second
// member of one oneof, or a missing proto2 `required` field. Map fields are unsupported.
// `source_name` stands for the file in messages. On error *out is unspecified.
Status parse_toml(std::string_view text, std::string_view source_name,
                  google::protobuf::Message* out);

// parse_toml on the contents of `file`; a missing file is NotFound naming the path.
Status load_toml(const std::filesystem::path& file, google::protobuf::Message* out);

// Writes every field of `msg` as TOML, unset ones with their (proto2) default, so that the
// output records the effective configuration: scalars first, then one [a.b] table per singular
// message field, repeated messages as arrays of inline tables. Of a oneof only the set member is
// written. parse_toml(to_toml(m)) reproduces m's values (not which fields were explicitly set),
// except for uint64 values above INT64_MAX and invalid UTF-8, which TOML cannot hold, and map
// fields (written as arrays of {key, value} tables, which parse_toml rejects).
std::string to_toml(const google::protobuf::Message& msg);

// Checks the values of a RunConfig (positive sizes, n_embd divisible by n_head, 0 <= dropout
// < 1, 0 < val_fraction < 1, non-negative learning rates, ...). InvalidArgument listing every
// violation as "SOURCE: key 'model.n_head' ...".
Status validate_run_config(const starling::v1::RunConfig& config, std::string_view source_name);

// load_toml into a RunConfig, then validate_run_config.
Result<starling::v1::RunConfig> load_run_config(const std::filesystem::path& file);

// A training run's folder: creates train.out_dir, writes the effective config there as
// config.toml and opens metrics.jsonl (truncated) for the run's JSON lines. Errors name
// `source_name`, the key and the path.
Result<std::ofstream> open_run_dir(const starling::v1::RunConfig& config,
                                   std::string_view source_name);

}  // namespace starling::config
