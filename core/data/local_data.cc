// Local text and image data for clients.
#include "core/data/local_data.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <system_error>
#include <utility>
#include <vector>

#include "core/data/text_file.h"

namespace starling::data {
namespace fs = std::filesystem;

namespace {

// read_local_text, and for a .jsonl file where each record starts: (offset in the text, line).
Result<std::string> read_text_records(const fs::path& path,
                                      std::vector<std::pair<size_t, size_t>>* records) {
  const std::string ext = path.extension().string();
  if (ext != ".txt" && ext != ".jsonl") {
    return invalid_argument("data.path " + path.string() +
                            ": expected a .txt or .jsonl file (one {\"text\": ...} per line)");
  }
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    return not_found("data.path " + path.string() + ": no such file");
  }
  ASSIGN_OR_RETURN(std::string raw, read_text_file(path), "data.path");
  std::string text;
  if (ext == ".txt") {
    text = std::move(raw);
  } else {
    size_t line_no = 0;
    for (size_t at = 0; at < raw.size();) {
      size_t end = raw.find('\n', at);
      if (end == std::string::npos) end = raw.size();
      ++line_no;
      const std::string_view line(raw.data() + at, end - at);
      at = end + 1;
      if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
      const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded() || !j.is_object() || !j.contains("text") || !j["text"].is_string()) {
        return data_loss(path.string() + ":" + std::to_string(line_no) +
                         ": not a JSON object with a string field \"text\"");
      }
      if (!text.empty()) text += '\n';
      records->emplace_back(text.size(), line_no);
      text += j["text"].get<std::string>();
    }
  }
  if (text.empty()) return invalid_argument("data.path " + path.string() + ": no text");
  return text;
}

}  // namespace

Result<std::string> read_local_text(const fs::path& path) {
  std::vector<std::pair<size_t, size_t>> records;
  return read_text_records(path, &records);
}

Result<std::vector<int32_t>> read_local_tokens(const fs::path& path, const CharTokenizer& tok,
                                               int64_t min_tokens) {
  std::vector<std::pair<size_t, size_t>> records;
  ASSIGN_OR_RETURN(const std::string text, read_text_records(path, &records));
  auto ids = tok.encode(text);
  if (!ids.ok()) {
    // Name the first byte outside the vocabulary and the line of the file it is on.
    const std::string& vocab = tok.vocab();
    size_t line = 1;
    for (size_t i = 0; i < text.size(); ++i) {
      const char c = text[i];
      if (vocab.find(c) == std::string::npos) {
        if (!records.empty()) {
          auto it = std::upper_bound(records.begin(), records.end(), std::make_pair(i, SIZE_MAX));
          line = std::prev(it)->second;
        }
        const auto byte = static_cast<unsigned char>(c);
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02X", byte);
        const std::string shown =
            byte >= 0x20 && byte < 0x7f ? "'" + std::string(1, c) + "' (" + hex + ")" : hex;
        return invalid_argument(path.string() + ":" + std::to_string(line) + ": character " +
                                shown + " is not in the federation's " +
                                std::to_string(tok.vocab_size()) + "-symbol vocabulary");
      }
      if (c == '\n') ++line;
    }
    return ids.status().with_context(path.string());
  }
  if (static_cast<int64_t>(ids->size()) < min_tokens) {
    return invalid_argument("data.path " + path.string() + ": " + std::to_string(ids->size()) +
                            " characters, fewer than the " + std::to_string(min_tokens) +
                            " one training window needs");
  }
  return std::move(*ids);
}

Result<MnistSet> read_local_images(const fs::path& dir, int64_t rows, int64_t cols) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return not_found("data.path " + dir.string() +
                     ": no such folder (it must hold train-images-idx3-ubyte[.gz] and "
                     "train-labels-idx1-ubyte[.gz])");
  }
  auto pick = [&](const std::string& base) {
    return fs::exists(dir / (base + ".gz"), ec) ? dir / (base + ".gz") : dir / base;
  };
  ASSIGN_OR_RETURN(MnistSet set,
                   load_mnist(pick("train-images-idx3-ubyte"), pick("train-labels-idx1-ubyte")),
                   "data.path " + dir.string());
  if (set.rows != rows || set.cols != cols) {
    return invalid_argument("data.path " + dir.string() + ": images are " +
                            std::to_string(set.rows) + "x" + std::to_string(set.cols) +
                            ", the model takes " + std::to_string(rows) + "x" +
                            std::to_string(cols));
  }
  if (set.size() == 0) return invalid_argument("data.path " + dir.string() + ": no images");
  return set;
}

}  // namespace starling::data
