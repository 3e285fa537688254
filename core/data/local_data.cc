// Local text and image data for clients.
#include "core/data/local_data.h"

#include <png.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
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

Result<std::vector<int32_t>> read_local_tokens(const fs::path& path, const Tokenizer& tokenizer,
                                               int64_t min_tokens) {
  std::vector<std::pair<size_t, size_t>> records;
  ASSIGN_OR_RETURN(const std::string text, read_text_records(path, &records));
  auto ids = tokenizer.encode(text);
  const auto* chars = dynamic_cast<const CharTokenizer*>(&tokenizer);
  if (!ids.ok() && chars == nullptr) return ids.status().with_context(path.string());
  if (!ids.ok()) {
    const CharTokenizer& tok = *chars;
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

namespace {

// One PNG as 8-bit gray, rows x cols, appended to `set` with `label`.
Status append_png(const fs::path& file, int32_t label, int64_t rows, int64_t cols, MnistSet* set) {
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_file(&image, file.c_str())) {
    return data_loss(file.string() + ": not a readable PNG (" + image.message + ")");
  }
  if (static_cast<int64_t>(image.height) != rows || static_cast<int64_t>(image.width) != cols) {
    const std::string size = std::to_string(image.width) + "x" + std::to_string(image.height);
    png_image_free(&image);
    return invalid_argument(file.string() + ": the image is " + size + ", the model takes " +
                            std::to_string(cols) + "x" + std::to_string(rows));
  }
  image.format = PNG_FORMAT_GRAY;
  std::vector<uint8_t> pixels(PNG_IMAGE_SIZE(image));
  if (!png_image_finish_read(&image, nullptr, pixels.data(), 0, nullptr)) {
    const std::string why = image.message;
    png_image_free(&image);
    return data_loss(file.string() + ": corrupt PNG (" + why + ")");
  }
  for (uint8_t p : pixels) set->images.push_back(static_cast<float>(p) / 255.0f);
  set->labels.push_back(label);
  return ok_status();
}

Result<MnistSet> read_png_folders(const fs::path& dir, int64_t rows, int64_t cols) {
  MnistSet set;
  set.rows = rows;
  set.cols = cols;
  for (int32_t label = 0; label <= 9; ++label) {
    const fs::path sub = dir / std::to_string(label);
    std::error_code ec;
    if (!fs::is_directory(sub, ec)) continue;
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(sub, ec)) {
      if (!entry.is_regular_file()) continue;
      if (entry.path().extension() != ".png") {
        return invalid_argument("data.path " + dir.string() + ": " + entry.path().string() +
                                " is not a .png (a label folder holds PNG images only)");
      }
      files.push_back(entry.path());
    }
    if (ec) return unavailable("data.path " + sub.string() + ": " + ec.message());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) RETURN_IF_ERROR(append_png(f, label, rows, cols, &set));
  }
  return set;
}

bool has_label_folders(const fs::path& dir) {
  std::error_code ec;
  for (int label = 0; label <= 9; ++label) {
    if (fs::is_directory(dir / std::to_string(label), ec)) return true;
  }
  return false;
}

}  // namespace

Result<MnistSet> read_local_images(const fs::path& dir, int64_t rows, int64_t cols) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return not_found("data.path " + dir.string() +
                     ": no such folder (it must hold train-images-idx3-ubyte[.gz] and "
                     "train-labels-idx1-ubyte[.gz], or label folders 0 to 9 of PNG images)");
  }
  const bool idx = fs::exists(dir / "train-images-idx3-ubyte", ec) ||
                   fs::exists(dir / "train-images-idx3-ubyte.gz", ec);
  if (!idx && has_label_folders(dir)) {
    ASSIGN_OR_RETURN(MnistSet set, read_png_folders(dir, rows, cols));
    if (set.size() == 0) return invalid_argument("data.path " + dir.string() + ": no images");
    return set;
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
