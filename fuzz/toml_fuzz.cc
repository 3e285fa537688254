// libFuzzer target: a config file, read strictly into the RunConfig schema.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/config/toml_config.h"
#include "core/wire/config.pb.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  starling::v1::RunConfig cfg;
  (void)starling::config::parse_toml(std::string_view(reinterpret_cast<const char*>(data), size),
                                     "fuzz.toml", &cfg);
  return 0;
}
