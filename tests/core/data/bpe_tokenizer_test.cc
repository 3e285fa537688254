// GPT-2 BPE: ids against a Python reference, round trips, and bad vocabulary files.
#include "core/data/bpe_tokenizer.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/data/data_dir.h"
#include "core/data/text_file.h"
#include "tests/testing/test_data.h"

namespace fs = std::filesystem;
using starling::StatusCode;
using starling::data::BpeTokenizer;

namespace {

fs::path data_dir() {
  auto dir = starling::data::resolve_data_dir("");
  REQUIRE(dir.ok());
  return *dir;
}

const BpeTokenizer& gpt2() {
  static const BpeTokenizer tok = [] {
    auto t = BpeTokenizer::load_gpt2(data_dir());
    REQUIRE(t.ok());
    return std::move(t).value();
  }();
  return tok;
}

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() / ("starling_bpe_" + std::to_string(::getpid()));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  fs::path write(const std::string& name, const std::string& text) const {
    std::ofstream(path_ / name, std::ios::binary) << text;
    return path_ / name;
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

double thread_cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Reference {
  std::string text;
  std::vector<int32_t> ids;
};

}  // namespace

// Expected ids were produced once with Python, from the files in shared/data/gpt2:
// tiktoken 0.14.0, Encoding(pat_str=r50k's pattern,
// mergeable_ranks=data_gym_to_mergeable_bpe_ranks(vocab.bpe, encoder.json)).encode_ordinary(s),
// cross-checked equal to a transcription of OpenAI's gpt-2 src/encoder.py (regex module).
TEST_CASE("gpt2 bpe: ids match the reference encoder", "[data]") {
  const Reference ref = GENERATE(
      Reference{"Hello world", {15496, 995}},
      Reference{"I'm don't we'll they're you've she'd it's",
                {40, 1101, 836, 470, 356, 1183, 484, 821, 345, 1053, 673, 1549, 340, 338}},
      Reference{"I'M DON'T", {40, 6, 44, 23917, 6, 51}},
      Reference{"In 2024, pi is 3.14159 and 1,000,000 items cost $12.50.",
                {818, 48609, 11, 31028, 318,  513,  13,  1415, 19707, 290,  352,
                 11,  830,   11, 830,   3709, 1575, 720, 1065, 13,    1120, 13}},
      Reference{"a  b   c\n\nd \n  e\t\tf   ",
                {64, 220, 275, 220, 220, 269, 198, 198, 67, 220, 198, 220, 304, 197, 197, 69, 220,
                 220, 220}},
      Reference{"Hello, world! (yes) -- \"quoted\"; ok? <tag/> #1 @user",
                {15496, 11,    995, 0,    357,   8505,  8,    1377, 366,  421, 5191,
                 8172,  12876, 30,  1279, 12985, 15913, 1303, 16,   2488, 7220}},
      // "café naïve 日本語 🙂 ½ ١٢٣ Жизнь"
      Reference{
          "caf\u00e9 na\u00efve \u65e5\u672c\u8a9e \U0001F642 \u00bd \u0661\u0662\u0663 "
          "\u0416\u0438\u0437\u043d\u044c",
          {66,    1878, 2634, 41492, 10545, 245, 98,    17312, 105,   45739, 252, 32485, 25208,
           18923, 94,   149,  95,    149,   96,  12466, 244,   18849, 140,   115, 22177, 45367}},
      Reference{"First Citizen:\nBefore we proceed any further, hear me speak.\n",
                {5962, 22307, 25, 198, 8421, 356, 5120, 597, 2252, 11, 3285, 502, 2740, 13, 198}});
  INFO(ref.text);
  auto ids = gpt2().encode(ref.text);
  REQUIRE(ids.ok());
  REQUIRE(*ids == ref.ids);
  auto text = gpt2().decode(*ids);
  REQUIRE(text.ok());
  REQUIRE(*text == ref.text);
}

TEST_CASE("gpt2 bpe: loads fast, vocabulary facts", "[data]") {
  // CPU time of this thread, so that other processes on a busy machine do not count.
  const double t0 = thread_cpu_seconds();
  auto tok = BpeTokenizer::load_gpt2(data_dir());
  const double seconds = thread_cpu_seconds() - t0;
  REQUIRE(tok.ok());
  INFO("load took " << seconds << " s of CPU");
#if defined(NDEBUG) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  // About 0.1 s optimized. Not a speed target (those live in bench/): a guard against
  // pathological (e.g. quadratic) loading, loose enough for emulated ARM64 runs under qemu.
  CHECK(seconds < 5.0);
#endif
  REQUIRE(tok->vocab_size() == 50257);
  REQUIRE(tok->eot_id() == 50256);
  REQUIRE(tok->name() == "gpt2-bpe");
  REQUIRE(tok->encode("").value().empty());
  const std::vector<int32_t> eot = {50256};
  REQUIRE(tok->decode(eot).value() == "<|endoftext|>");
}

TEST_CASE("gpt2 bpe: round trips real UTF-8 text", "[data]") {
  const fs::path dir = data_dir();
  for (const char* name : {"wikitext-2-valid", "tinyshakespeare"}) {
    INFO(name);
    // The fixture cut has no WikiText (tests/testing/test_data.h).
    if (std::string(name) == "wikitext-2-valid" && starling::testing::using_fixture_data())
      continue;
    auto path = starling::data::resolve_dataset_file(dir, name);
    REQUIRE(path.ok());
    auto text = starling::data::read_text_file(*path);
    REQUIRE(text.ok());
    const std::string sample = text->substr(0, 200000);
    auto ids = gpt2().encode(sample);
    REQUIRE(ids.ok());
    REQUIRE(ids->size() < sample.size() / 2);
    REQUIRE(gpt2().decode(*ids).value() == sample);
  }
  // Unusual but valid: control bytes, a lone combining mark, long runs, 4-byte characters.
  const std::string odd = std::string("\x01\x7f \t\r\n\u0301 ") + std::string(3000, 'x') + " " +
                          std::string(100, ' ') + "\U0001F600\U0001F600 \u00a0\u3000end";
  REQUIRE(gpt2().decode(gpt2().encode(odd).value()).value() == odd);
}

TEST_CASE("gpt2 bpe: bad input", "[data]") {
  SECTION("invalid UTF-8 names the byte offset") {
    auto ids = gpt2().encode("ok \xff\xfe");
    REQUIRE(ids.status().code() == StatusCode::kInvalidArgument);
    REQUIRE_THAT(ids.status().message(), Catch::Contains("byte 3"));
    auto truncated = gpt2().encode("\u65e5\u672c \xe8\xaa");  // a 3-byte character cut short
    REQUIRE(truncated.status().code() == StatusCode::kInvalidArgument);
    REQUIRE_THAT(truncated.status().message(), Catch::Contains("byte 7"));
  }
  SECTION("ids out of range") {
    const std::vector<int32_t> bad = {15496, 50257};
    auto text = gpt2().decode(bad);
    REQUIRE(text.status().code() == StatusCode::kOutOfRange);
    REQUIRE_THAT(text.status().message(), Catch::Contains("position 1"));
  }
}

TEST_CASE("gpt2 bpe: bad vocabulary files name the file and line", "[data]") {
  TempDir tmp;
  const fs::path real = data_dir() / "gpt2";
  const fs::path encoder = real / "encoder.json";
  const fs::path merges = real / "vocab.bpe";
  SECTION("missing file") {
    const fs::path missing = tmp.path() / "encoder.json";
    auto tok = BpeTokenizer::load(missing, merges);
    REQUIRE(tok.status().code() == StatusCode::kNotFound);
    REQUIRE_THAT(tok.status().message(), Catch::Contains(missing.string()));
  }
  SECTION("malformed JSON") {
    const fs::path bad = tmp.write("encoder.json", "{\"a\": 0, \"b\": ");
    auto tok = BpeTokenizer::load(bad, merges);
    REQUIRE(tok.status().code() == StatusCode::kDataLoss);
    REQUIRE_THAT(tok.status().message(), Catch::Contains(bad.string()));
  }
  SECTION("JSON that is not a dense token -> id map") {
    for (const char* text :
         {"[1, 2]", "{\"a\": \"x\"}", "{\"a\": 0, \"b\": 0}", "{\"a\": 5}", "{\"a\": 0}"}) {
      INFO(text);
      const fs::path bad = tmp.write("encoder.json", text);
      auto tok = BpeTokenizer::load(bad, merges);
      REQUIRE(tok.status().code() == StatusCode::kDataLoss);
      REQUIRE_THAT(tok.status().message(), Catch::Contains(bad.string()));
    }
  }
  SECTION("bad merges line") {
    const fs::path bad = tmp.write("vocab.bpe", "#version: 0.2\nĠ t\nĠt\n");
    auto tok = BpeTokenizer::load(encoder, bad);
    REQUIRE(tok.status().code() == StatusCode::kDataLoss);
    REQUIRE_THAT(tok.status().message(), Catch::Contains(bad.string() + ":3:"));
  }
  SECTION("merge of an unknown token") {
    const fs::path bad = tmp.write("vocab.bpe", "#version: 0.2\nĠ t\nqqqq zzzz\n");
    auto tok = BpeTokenizer::load(encoder, bad);
    REQUIRE(tok.status().code() == StatusCode::kDataLoss);
    REQUIRE_THAT(tok.status().message(), Catch::Contains(bad.string() + ":3:"));
    REQUIRE_THAT(tok.status().message(), Catch::Contains("qqqq"));
  }
  SECTION("a truncated merge list still loads and encodes with fewer merges") {
    const fs::path few = tmp.write("vocab.bpe", "#version: 0.2\nĠ t\n");
    auto tok = BpeTokenizer::load(encoder, few);
    REQUIRE(tok.ok());
    // " t" merges into "Ġt" (id 256); nothing else merges.
    REQUIRE(tok->encode(" to").value() == std::vector<int32_t>{256, 78});
  }
}
