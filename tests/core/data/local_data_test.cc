// A client's own data ([data] path): text and JSON lines in the federation's vocabulary, and a
// folder of IDX files or of PNG label folders; every error names the file, and the line where there
// is one.
#include "core/data/local_data.h"

#include <png.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace starling::data {
namespace {

namespace fs = std::filesystem;
using Catch::Contains;

fs::path write(const std::string& name, const std::string& text) {
  const fs::path p = fs::temp_directory_path() / name;
  std::ofstream(p, std::ios::binary) << text;
  return p;
}

CharTokenizer vocab() {
  auto tok = CharTokenizer::from_corpus("abcdefghijklmnopqrstuvwxyz ABC:\n");
  REQUIRE(tok.ok());
  return std::move(*tok);
}

TEST_CASE("local text: .txt and .jsonl read as the text they hold", "[data]") {
  const auto txt = write("own.txt", "ROMEO:\nhello there\n");
  auto t = read_local_text(txt);
  REQUIRE(t.ok());
  CHECK(*t == "ROMEO:\nhello there\n");
  const auto jl =
      write("own.jsonl", "{\"text\": \"first\"}\n\n  \n{\"text\": \"sec\\nond\", \"id\": 3}\n");
  auto j = read_local_text(jl);
  REQUIRE(j.ok());
  CHECK(*j == "first\nsec\nond");
  auto ids = read_local_tokens(jl, vocab(), 4);
  REQUIRE(ids.ok());
  CHECK(ids->size() == j->size());
}

TEST_CASE("local text: bad files are refused naming the file and line", "[data]") {
  const CharTokenizer tok = vocab();
  auto refuse = [&](const fs::path& p, const std::string& why) {
    auto r = read_local_tokens(p, tok, 4);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Contains(why));
  };
  refuse(write("bad.jsonl", "{\"text\": \"ok\"}\n{\"text\": 3}\n"),
         "bad.jsonl:2: not a JSON object");
  refuse(write("bad2.jsonl", "{\"text\": \"ok\"}\nnot json\n"), "bad2.jsonl:2:");
  refuse(write("arr.jsonl", "[\"text\"]\n"), "arr.jsonl:1:");
  refuse(write("odd.txt", "abc\ndef\nab%c\n"), "odd.txt:3: character '%' (0x25)");
  // In JSON lines the line is the file's, not the text's.
  refuse(write("odd.jsonl", "{\"text\": \"a\\nb\\nc\"}\n{\"text\": \"x\"}\n{\"text\": \"q!\"}\n"),
         "odd.jsonl:3: character '!'");
  refuse(write("bin.txt", std::string("ab\x01 c")), "bin.txt:1: character 0x01");
  refuse(write("short.txt", "abc"), "fewer than the 4");
  refuse(write("empty.jsonl", "\n\n"), "no text");
  refuse(write("data.csv", "a,b\n"), "expected a .txt or .jsonl");
  auto missing = read_local_text(fs::temp_directory_path() / "nowhere.txt");
  CHECK(missing.status().code() == StatusCode::kNotFound);
  CHECK_THAT(missing.status().message(), Contains("nowhere.txt"));
}

void put32(std::ofstream& f, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) f.put(static_cast<char>((v >> s) & 0xff));
}

TEST_CASE("local images: a folder of IDX files, checked against the model's input", "[data]") {
  const fs::path dir = fs::temp_directory_path() / "own_images";
  fs::create_directories(dir);
  auto write_idx = [&](uint32_t n, uint32_t rows, uint32_t cols) {
    std::ofstream img(dir / "train-images-idx3-ubyte", std::ios::binary);
    put32(img, 0x803);
    put32(img, n);
    put32(img, rows);
    put32(img, cols);
    for (uint32_t i = 0; i < n * rows * cols; ++i) img.put(static_cast<char>(i % 256));
    std::ofstream lab(dir / "train-labels-idx1-ubyte", std::ios::binary);
    put32(lab, 0x801);
    put32(lab, n);
    for (uint32_t i = 0; i < n; ++i) lab.put(static_cast<char>(i % 10));
  };
  write_idx(7, 28, 28);
  auto set = read_local_images(dir, 28, 28);
  REQUIRE(set.ok());
  CHECK(set->size() == 7);
  CHECK(set->labels[3] == 3);
  write_idx(7, 8, 8);
  auto small = read_local_images(dir, 28, 28);
  CHECK_THAT(small.status().message(), Contains("8x8") && Contains("28x28"));
  fs::remove(dir / "train-labels-idx1-ubyte");
  CHECK_THAT(read_local_images(dir, 28, 28).status().message(),
             Contains("train-labels-idx1-ubyte"));
  CHECK(read_local_images(dir / "none", 28, 28).status().code() == StatusCode::kNotFound);
}

// A w x h PNG written by libpng: gray when `rgb` is false, else RGB with gray = r = g = b.
void write_png(const fs::path& path, uint32_t w, uint32_t h, uint8_t base, bool rgb) {
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  image.width = w;
  image.height = h;
  image.format = rgb ? PNG_FORMAT_RGB : PNG_FORMAT_GRAY;
  const uint32_t channels = rgb ? 3 : 1;
  std::vector<uint8_t> px(static_cast<size_t>(w) * h * channels);
  for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>(base + i / channels);
  REQUIRE(png_image_write_to_file(&image, path.c_str(), 0, px.data(), 0, nullptr) != 0);
}

TEST_CASE("local images: label folders of PNG files, any colour type, checked", "[data]") {
  const fs::path dir = fs::temp_directory_path() / "own_pngs";
  fs::remove_all(dir);
  fs::create_directories(dir / "3");
  fs::create_directories(dir / "7");
  write_png(dir / "3" / "b.png", 28, 28, 10, false);
  write_png(dir / "3" / "a.png", 28, 28, 20, true);
  write_png(dir / "7" / "x.png", 28, 28, 30, false);
  auto set = read_local_images(dir, 28, 28);
  REQUIRE(set.ok());
  REQUIRE(set->size() == 3);
  CHECK(set->labels == std::vector<int32_t>{3, 3, 7});  // label order, then file name order
  CHECK(set->images[0] == 20.0f / 255.0f);              // a.png (RGB, read as gray)
  CHECK(set->images[784] == 10.0f / 255.0f);            // b.png
  CHECK(set->images[2 * 784 + 5] == 35.0f / 255.0f);    // x.png, pixel 5
  // The wrong size, a file that is not a PNG, and something else in a label folder.
  write_png(dir / "7" / "y.png", 20, 28, 0, false);
  CHECK_THAT(read_local_images(dir, 28, 28).status().message(),
             Contains("y.png") && Contains("20x28") && Contains("28x28"));
  fs::remove(dir / "7" / "y.png");
  std::ofstream(dir / "7" / "z.png") << "not a png";
  CHECK_THAT(read_local_images(dir, 28, 28).status().message(),
             Contains("z.png") && Contains("not a readable PNG"));
  fs::remove(dir / "7" / "z.png");
  std::ofstream(dir / "7" / "labels.txt") << "7\n";
  CHECK_THAT(read_local_images(dir, 28, 28).status().message(),
             Contains("labels.txt") && Contains("is not a .png"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace starling::data
