// Character tokenizer on Tiny Shakespeare (nanoGPT's shakespeare_char vocabulary).
#include "core/data/char_tokenizer.h"

#include <catch2/catch.hpp>
#include <vector>

#include "core/data/data_dir.h"
#include "core/data/text_file.h"

using starling::StatusCode;
using starling::data::CharTokenizer;

namespace {

std::string tiny_shakespeare() {
  auto dir = starling::data::resolve_data_dir("");
  REQUIRE(dir.ok());
  auto path = starling::data::resolve_dataset_file(*dir, "tinyshakespeare");
  REQUIRE(path.ok());
  auto text = starling::data::read_text_file(*path);
  REQUIRE(text.ok());
  return std::move(text).value();
}

}  // namespace

TEST_CASE("char tokenizer: Tiny Shakespeare vocabulary and round trip", "[data]") {
  const std::string text = tiny_shakespeare();
  REQUIRE(text.size() == 1115394);
  auto tok = CharTokenizer::from_corpus(text);
  REQUIRE(tok.ok());
  // nanoGPT data/shakespeare_char/prepare.py prints this vocabulary (65 symbols).
  REQUIRE(tok->vocab() == "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz");
  REQUIRE(tok->vocab_size() == 65);
  REQUIRE(tok->name() == "char");

  auto hii = tok->encode("hii there");
  REQUIRE(hii.ok());
  REQUIRE(*hii == std::vector<int32_t>{46, 47, 47, 1, 58, 46, 43, 56, 43});

  auto ids = tok->encode(text);
  REQUIRE(ids.ok());
  REQUIRE(ids->size() == text.size());
  REQUIRE((*ids)[0] == tok->encode("F")->at(0));
  auto back = tok->decode(*ids);
  REQUIRE(back.ok());
  REQUIRE(*back == text);

  SECTION("rebuilt from its serialized vocabulary gives the same ids") {
    auto again = CharTokenizer::from_vocab(tok->vocab());
    REQUIRE(again.ok());
    REQUIRE(again->vocab() == tok->vocab());
    REQUIRE(*again->encode("First Citizen:\n") == *tok->encode("First Citizen:\n"));
  }
}

TEST_CASE("char tokenizer: errors", "[data]") {
  auto tok = CharTokenizer::from_corpus("abc\n");
  REQUIRE(tok.ok());
  SECTION("unknown character names its byte offset") {
    auto ids = tok->encode("ab\nz");
    REQUIRE(ids.status().code() == StatusCode::kInvalidArgument);
    REQUIRE_THAT(ids.status().message(), Catch::Contains("'z'"));
    REQUIRE_THAT(ids.status().message(), Catch::Contains("byte 3"));
  }
  SECTION("ids out of range") {
    const std::vector<int32_t> bad = {0, 4};
    auto text = tok->decode(bad);
    REQUIRE(text.status().code() == StatusCode::kOutOfRange);
    REQUIRE_THAT(text.status().message(), Catch::Contains("position 1"));
    const std::vector<int32_t> negative = {-1};
    REQUIRE(tok->decode(negative).status().code() == StatusCode::kOutOfRange);
  }
  SECTION("bad corpora and vocabularies") {
    REQUIRE_FALSE(CharTokenizer::from_corpus("").ok());
    REQUIRE_FALSE(CharTokenizer::from_vocab("").ok());
    REQUIRE_FALSE(CharTokenizer::from_vocab("ba").ok());
    REQUIRE_FALSE(CharTokenizer::from_vocab("aab").ok());
  }
}
