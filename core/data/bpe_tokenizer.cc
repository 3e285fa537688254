// GPT-2 byte-level BPE. Pre-tokenization uses PCRE2 (UTF + UCP) so that \p{L}, \p{N} and \s follow
// the Unicode tables, as the `regex` module does in OpenAI's encoder.py.
#include "core/data/bpe_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/data/data_dir.h"
#include "core/data/text_file.h"

namespace starling::data {
namespace {

namespace fs = std::filesystem;

constexpr char kPattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr size_t kMaxCacheEntries = size_t{1} << 18;
constexpr int32_t kNoRank = std::numeric_limits<int32_t>::max();

struct CodeDeleter {
  void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};
struct MatchDataDeleter {
  void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
};
using CodePtr = std::unique_ptr<pcre2_code, CodeDeleter>;
using MatchDataPtr = std::unique_ptr<pcre2_match_data, MatchDataDeleter>;

std::string pcre2_message(int code) {
  std::array<PCRE2_UCHAR, 256> buf{};
  if (pcre2_get_error_message(code, buf.data(), buf.size()) < 0) {
    return "PCRE2 error " + std::to_string(code);
  }
  return std::string(reinterpret_cast<const char*>(buf.data()));
}

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes stand for themselves, the other 68 bytes are
// shifted to code points 256..323, so every token is a string of visible characters.
std::array<uint32_t, 256> byte_to_codepoint() {
  std::array<uint32_t, 256> cp{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    cp[b] = printable ? b : next++;
  }
  return cp;
}

std::string utf8_encode(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

std::string shown(std::string_view s) {
  constexpr size_t kMax = 40;
  std::string q = "\"";
  q.append(s.substr(0, kMax));
  if (s.size() > kMax) q += "...";
  q += "\"";
  return q;
}

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

}  // namespace

struct BpeTokenizer::State {
  CodePtr regex;
  std::vector<std::string> token_bytes;             // id -> raw bytes
  std::array<int32_t, 256> byte_id{};               // id of each single-byte token
  std::unordered_map<uint64_t, int32_t> pair_rank;  // (left id, right id) -> merge rank
  std::vector<int32_t> merge_result;                // rank -> id of the merged token
  int32_t eot = -1;
  std::string encoder_json;  // the files' text, as loaded (checkpoints embed them)
  std::string merges;

  mutable std::mutex cache_mu;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;

  int32_t rank_of(int32_t a, int32_t b) const {
    const auto it = pair_rank.find(pair_key(a, b));
    return it == pair_rank.end() ? kNoRank : it->second;
  }
  std::vector<int32_t> bpe(std::string_view word) const;
  std::vector<int32_t> bpe_cached(std::string_view word) const;
};

// encoder.py's bpe(): each pass finds the lowest-ranked adjacent pair and merges all of its
// occurrences left to right. Ranks of pairs untouched by a merge are carried over, so a pass costs
// no hash lookups beyond the new neighbours.
std::vector<int32_t> BpeTokenizer::State::bpe(std::string_view word) const {
  std::vector<int32_t> parts(word.size());
  for (size_t i = 0; i < word.size(); ++i) parts[i] = byte_id[static_cast<unsigned char>(word[i])];
  if (parts.size() < 2) return parts;
  std::vector<int32_t> ranks(parts.size() - 1);
  for (size_t i = 0; i + 1 < parts.size(); ++i) ranks[i] = rank_of(parts[i], parts[i + 1]);

  std::vector<int32_t> new_parts, new_ranks;
  std::vector<size_t> origin;  // index in `parts` of each new part's first element
  std::vector<bool> merged;
  while (parts.size() > 1) {
    int32_t best = kNoRank;
    for (int32_t r : ranks) best = std::min(best, r);
    if (best == kNoRank) break;
    const int32_t merged_id = merge_result[static_cast<size_t>(best)];
    new_parts.clear();
    origin.clear();
    merged.clear();
    for (size_t i = 0; i < parts.size();) {
      origin.push_back(i);
      if (i + 1 < parts.size() && ranks[i] == best) {
        new_parts.push_back(merged_id);
        merged.push_back(true);
        i += 2;
      } else {
        new_parts.push_back(parts[i]);
        merged.push_back(false);
        i += 1;
      }
    }
    new_ranks.resize(new_parts.size() - 1);
    for (size_t j = 0; j + 1 < new_parts.size(); ++j) {
      new_ranks[j] =
          (merged[j] || merged[j + 1]) ? rank_of(new_parts[j], new_parts[j + 1]) : ranks[origin[j]];
    }
    parts.swap(new_parts);
    ranks.swap(new_ranks);
  }
  return parts;
}

std::vector<int32_t> BpeTokenizer::State::bpe_cached(std::string_view word) const {
  {
    std::lock_guard<std::mutex> lock(cache_mu);
    const auto it = cache.find(std::string(word));
    if (it != cache.end()) return it->second;
  }
  std::vector<int32_t> ids = bpe(word);
  std::lock_guard<std::mutex> lock(cache_mu);
  if (cache.size() >= kMaxCacheEntries) cache.clear();
  cache.emplace(std::string(word), ids);
  return ids;
}

BpeTokenizer::BpeTokenizer(std::unique_ptr<State> state) : state_(std::move(state)) {}
BpeTokenizer::BpeTokenizer(BpeTokenizer&&) noexcept = default;
BpeTokenizer& BpeTokenizer::operator=(BpeTokenizer&&) noexcept = default;
BpeTokenizer::~BpeTokenizer() = default;

int64_t BpeTokenizer::vocab_size() const {
  return static_cast<int64_t>(state_->token_bytes.size());
}
int32_t BpeTokenizer::eot_id() const { return state_->eot; }
const std::string& BpeTokenizer::encoder_json() const { return state_->encoder_json; }
const std::string& BpeTokenizer::merges() const { return state_->merges; }

Result<BpeTokenizer> BpeTokenizer::load_gpt2(const fs::path& data_dir) {
  ASSIGN_OR_RETURN(fs::path encoder_json, resolve_dataset_file(data_dir, "gpt2-encoder"));
  ASSIGN_OR_RETURN(fs::path vocab_bpe, resolve_dataset_file(data_dir, "gpt2-merges"));
  return load(encoder_json, vocab_bpe);
}

Result<BpeTokenizer> BpeTokenizer::load(const fs::path& encoder_json, const fs::path& vocab_bpe) {
  ASSIGN_OR_RETURN(std::string enc_text, read_text_file(encoder_json), "gpt2 bpe");
  ASSIGN_OR_RETURN(std::string bpe_text, read_text_file(vocab_bpe), "gpt2 bpe");
  return from_text(std::move(enc_text), std::move(bpe_text), encoder_json.string(),
                   vocab_bpe.string());
}

Result<BpeTokenizer> BpeTokenizer::from_text(std::string enc_text, std::string bpe_text,
                                             std::string_view encoder_name,
                                             std::string_view merges_name) {
  auto state = std::make_unique<State>();
  const std::string enc_name(encoder_name);
  const std::string bpe_name(merges_name);

  // Code point (of the token alphabet) -> byte, and -1 elsewhere.
  const std::array<uint32_t, 256> cp_of_byte = byte_to_codepoint();
  std::array<int16_t, 512> byte_of_cp{};
  byte_of_cp.fill(-1);
  for (int b = 0; b < 256; ++b) byte_of_cp[cp_of_byte[b]] = static_cast<int16_t>(b);

  // encoder.json
  nlohmann::json vocab;
  try {
    vocab = nlohmann::json::parse(enc_text);
  } catch (const nlohmann::json::exception& e) {
    return data_loss(enc_name + ": malformed JSON: " + e.what());
  }
  if (!vocab.is_object() || vocab.empty()) {
    return data_loss(enc_name + ": expected a non-empty JSON object mapping token -> id");
  }
  const size_t n = vocab.size();
  state->token_bytes.resize(n);
  std::vector<bool> seen(n, false);
  std::unordered_map<std::string, int32_t> id_of_token;
  id_of_token.reserve(n);
  for (const auto& [token, value] : vocab.items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
        value.get<int64_t>() >= static_cast<int64_t>(n)) {
      return data_loss(enc_name + ": token " + shown(token) + " has id " + value.dump() +
                       "; ids must be integers in [0, " + std::to_string(n) + ")");
    }
    const auto id = static_cast<int32_t>(value.get<int64_t>());
    if (seen[static_cast<size_t>(id)]) {
      return data_loss(enc_name + ": id " + std::to_string(id) + " is used twice (again by " +
                       shown(token) + ")");
    }
    seen[static_cast<size_t>(id)] = true;
    std::string bytes;
    for (size_t i = 0; i < token.size();) {
      const auto c0 = static_cast<unsigned char>(token[i]);
      int32_t cp = -1;
      if (c0 < 0x80) {
        cp = c0;
        i += 1;
      } else if ((c0 & 0xE0) == 0xC0 && i + 1 < token.size()) {
        cp = ((c0 & 0x1F) << 6) | (static_cast<unsigned char>(token[i + 1]) & 0x3F);
        i += 2;
      }
      if (cp < 0 || cp >= static_cast<int32_t>(byte_of_cp.size()) || byte_of_cp[cp] < 0) {
        return data_loss(enc_name + ": token " + shown(token) +
                         " has a character outside GPT-2's byte alphabet");
      }
      bytes += static_cast<char>(byte_of_cp[cp]);
    }
    if (bytes.empty()) return data_loss(enc_name + ": empty token for id " + std::to_string(id));
    state->token_bytes[static_cast<size_t>(id)] = bytes;
    id_of_token.emplace(token, id);
  }
  if (const auto it = id_of_token.find("<|endoftext|>"); it != id_of_token.end()) {
    state->eot = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = id_of_token.find(utf8_encode(cp_of_byte[b]));
    if (it == id_of_token.end()) {
      return data_loss(enc_name + ": no token for byte " + std::to_string(b));
    }
    state->byte_id[b] = it->second;
  }

  // vocab.bpe
  std::string_view rest = bpe_text;
  int line_no = 0;
  while (!rest.empty()) {
    const size_t eol = rest.find('\n');
    std::string_view line = rest.substr(0, eol);
    rest = eol == std::string_view::npos ? std::string_view() : rest.substr(eol + 1);
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line_no == 1 && line.starts_with("#version")) continue;
    const std::string where = bpe_name + ":" + std::to_string(line_no) + ": ";
    const size_t sp = line.find(' ');
    if (line.empty() || sp == 0 || sp == std::string_view::npos || sp + 1 == line.size() ||
        line.find(' ', sp + 1) != std::string_view::npos) {
      return data_loss(where + "expected two tokens separated by one space, got " + shown(line));
    }
    const std::string left(line.substr(0, sp));
    const std::string right(line.substr(sp + 1));
    const auto l = id_of_token.find(left);
    const auto r = id_of_token.find(right);
    const auto m = id_of_token.find(left + right);
    if (l == id_of_token.end() || r == id_of_token.end() || m == id_of_token.end()) {
      const std::string missing = l == id_of_token.end()   ? left
                                  : r == id_of_token.end() ? right
                                                           : left + right;
      return data_loss(where + "token " + shown(missing) + " is not in " + enc_name);
    }
    const auto rank = static_cast<int32_t>(state->merge_result.size());
    if (!state->pair_rank.emplace(pair_key(l->second, r->second), rank).second) {
      return data_loss(where + "duplicate merge " + shown(line));
    }
    state->merge_result.push_back(m->second);
  }

  int err = 0;
  PCRE2_SIZE err_offset = 0;
  state->regex.reset(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern), PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP, &err, &err_offset, nullptr));
  if (!state->regex) {
    return internal_error("gpt2 bpe: pre-tokenizer regex does not compile at offset " +
                          std::to_string(err_offset) + ": " + pcre2_message(err));
  }
  // JIT is only a speed-up; the interpreter gives the same matches when it is unavailable.
  (void)pcre2_jit_compile(state->regex.get(), PCRE2_JIT_COMPLETE);
  state->encoder_json = std::move(enc_text);
  state->merges = std::move(bpe_text);
  return BpeTokenizer(std::move(state));
}

Result<std::vector<int32_t>> BpeTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  if (text.empty()) return ids;
  MatchDataPtr match(pcre2_match_data_create_from_pattern(state_->regex.get(), nullptr));
  if (!match) return resource_exhausted("gpt2 bpe: cannot allocate PCRE2 match data");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  uint32_t options = 0;  // the first match validates the whole text as UTF-8
  size_t offset = 0;
  while (offset < text.size()) {
    const int rc = pcre2_match(state_->regex.get(), subject, text.size(), offset, options,
                               match.get(), nullptr);
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match.get());
    if (rc <= PCRE2_ERROR_UTF8_ERR1 && rc >= PCRE2_ERROR_UTF8_ERR21) {
      return invalid_argument("gpt2 bpe: invalid UTF-8 at byte " +
                              std::to_string(pcre2_get_startchar(match.get())) + ": " +
                              pcre2_message(rc));
    }
    if (rc < 0) return internal_error("gpt2 bpe: pre-tokenizer: " + pcre2_message(rc));
    // The alternatives cover every character, so matches tile the text with no gaps.
    if (ov[0] != offset || ov[1] <= ov[0]) {
      return internal_error("gpt2 bpe: pre-tokenizer skipped text at byte " +
                            std::to_string(offset));
    }
    const std::vector<int32_t> word = state_->bpe_cached(text.substr(ov[0], ov[1] - ov[0]));
    ids.insert(ids.end(), word.begin(), word.end());
    offset = ov[1];
    options = PCRE2_NO_UTF_CHECK;
  }
  return ids;
}

Result<std::string> BpeTokenizer::decode(std::span<const int32_t> ids) const {
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id < 0 || id >= vocab_size()) {
      return out_of_range("gpt2 bpe: id " + std::to_string(id) + " at position " +
                          std::to_string(i) + " is outside [0, " + std::to_string(vocab_size()) +
                          ")");
    }
    text += state_->token_bytes[static_cast<size_t>(id)];
  }
  return text;
}

}  // namespace starling::data
