// Reading and writing the safetensors checkpoint format (the one PyTorch and Hugging Face use):
// 8-byte little-endian header length N, N bytes of JSON header, then the raw tensor bytes.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>

#include "core/io/state_dict.h"
#include "core/util/status.h"

namespace starling::io {

// Largest JSON header accepted, as in the reference implementation.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

struct SafetensorsFile {
  StateDict tensors;  // in file (data offset) order, each in its own contiguous CPU storage
  std::map<std::string, std::string> metadata;  // the "__metadata__" object; may be empty
};

// Writes `tensors` (in their order, contiguous, little-endian) and `metadata` to `path`.
// The header is padded with spaces to a multiple of 8 bytes. The write is atomic: a temporary
// file in the same directory is fsynced and renamed over `path`, so a crash leaves either the
// old file or the complete new one. Tensors may be non-contiguous views; their bytes are
// copied exactly (NaN payloads and 64-bit integers included).
// Errors: InvalidArgument for an empty, duplicate, non-UTF-8 or reserved ("__metadata__")
// name, an undefined or non-CPU tensor, or non-UTF-8 metadata; NotFound when the directory
// does not exist; other I/O errors from the file system.
Status save_safetensors(const std::filesystem::path& path, const StateDict& tensors,
                        const std::map<std::string, std::string>& metadata = {});

// Reads and fully validates a safetensors file. Never crashes on malformed input: a missing
// file is NotFound, a corrupt one DataLoss (message names the file and, where one is
// involved, the tensor), and a well-formed file holding a dtype starling lacks (BOOL, U16,
// F8_*, ...) is InvalidArgument.
Result<SafetensorsFile> load_safetensors(const std::filesystem::path& path);

// As load_safetensors, from the bytes of a whole file; `source_name` stands for the file in
// error messages.
Result<SafetensorsFile> parse_safetensors(std::span<const uint8_t> bytes,
                                          std::string_view source_name);

}  // namespace starling::io
