// Character (byte) tokenizer.
#include "core/data/char_tokenizer.h"

#include <utility>

namespace starling::data {
namespace {

std::string describe_byte(unsigned char c) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex = "0x";
  hex += kHex[c >> 4];
  hex += kHex[c & 15];
  if (c >= 0x20 && c < 0x7f) return "'" + std::string(1, static_cast<char>(c)) + "' (" + hex + ")";
  return hex;
}

}  // namespace

CharTokenizer::CharTokenizer(std::string vocab) : vocab_(std::move(vocab)) {
  id_of_byte_.fill(-1);
  for (size_t i = 0; i < vocab_.size(); ++i) {
    id_of_byte_[static_cast<unsigned char>(vocab_[i])] = static_cast<int32_t>(i);
  }
}

Result<CharTokenizer> CharTokenizer::from_corpus(std::string_view corpus) {
  if (corpus.empty()) return invalid_argument("char tokenizer: empty corpus");
  std::array<bool, 256> seen{};
  for (char c : corpus) seen[static_cast<unsigned char>(c)] = true;
  std::string vocab;
  for (int b = 0; b < 256; ++b) {
    if (seen[b]) vocab += static_cast<char>(b);
  }
  return CharTokenizer(std::move(vocab));
}

Result<CharTokenizer> CharTokenizer::from_vocab(std::string_view vocab) {
  if (vocab.empty()) return invalid_argument("char tokenizer: empty vocabulary");
  for (size_t i = 1; i < vocab.size(); ++i) {
    if (static_cast<unsigned char>(vocab[i - 1]) >= static_cast<unsigned char>(vocab[i])) {
      return invalid_argument("char tokenizer: vocabulary is not strictly increasing at position " +
                              std::to_string(i) + " (" +
                              describe_byte(static_cast<unsigned char>(vocab[i])) + ")");
    }
  }
  return CharTokenizer(std::string(vocab));
}

Result<std::vector<int32_t>> CharTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    const int32_t id = id_of_byte_[c];
    if (id < 0) {
      return invalid_argument("char tokenizer: character " + describe_byte(c) + " at byte " +
                              std::to_string(i) + " is not in the vocabulary");
    }
    ids[i] = id;
  }
  return ids;
}

std::string CharTokenizer::keep_known(std::string_view text, int64_t* dropped) const {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (id_of_byte_[static_cast<unsigned char>(c)] >= 0) {
      out.push_back(c);
    } else {
      ++*dropped;
    }
  }
  return out;
}

Result<std::string> CharTokenizer::decode(std::span<const int32_t> ids) const {
  std::string text(ids.size(), '\0');
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id < 0 || id >= vocab_size()) {
      return out_of_range("char tokenizer: id " + std::to_string(id) + " at position " +
                          std::to_string(i) + " is outside [0, " + std::to_string(vocab_size()) +
                          ")");
    }
    text[i] = vocab_[static_cast<size_t>(id)];
  }
  return text;
}

}  // namespace starling::data
