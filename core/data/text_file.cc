// Whole-file reads for corpora and tokenizer files.
#include "core/data/text_file.h"

#include <fstream>
#include <system_error>

namespace starling::data {

Result<std::string> read_text_file(const std::filesystem::path& path) {
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(st)) return not_found("file not found: " + path.string());
  if (!std::filesystem::is_regular_file(st)) {
    return invalid_argument("not a regular file: " + path.string());
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return permission_denied("cannot open " + path.string());
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) return data_loss("cannot read the size of " + path.string() + ": " + ec.message());
  std::string text(size, '\0');
  in.read(text.data(), static_cast<std::streamsize>(size));
  if (in.gcount() != static_cast<std::streamsize>(size)) {
    return data_loss("short read from " + path.string() + ": got " + std::to_string(in.gcount()) +
                     " of " + std::to_string(size) + " bytes");
  }
  return text;
}

}  // namespace starling::data
