// Splitting WikiText into its Wikipedia articles.
#include "core/data/wikitext_articles.h"

#include <string>
#include <utility>
#include <vector>

namespace starling::data {
namespace {

// " = Title = " (WikiText puts a space before and after every line's content): exactly one '='
// at each end, and the title itself does not start or end with '=' (that is a section).
bool is_title_line(std::string_view line) {
  while (!line.empty() && (line.back() == ' ' || line.back() == '\r')) line.remove_suffix(1);
  while (!line.empty() && line.front() == ' ') line.remove_prefix(1);
  if (line.size() < 5 || !line.starts_with("= ") || !line.ends_with(" =")) return false;
  const std::string_view inner = line.substr(2, line.size() - 4);
  return !inner.empty() && inner.front() != '=' && inner.back() != '=';
}

std::string_view title_of(std::string_view line) {
  while (!line.empty() && (line.back() == ' ' || line.back() == '\r')) line.remove_suffix(1);
  while (!line.empty() && line.front() == ' ') line.remove_prefix(1);
  return line.substr(2, line.size() - 4);
}

bool is_blank(std::string_view line) {
  for (char c : line) {
    if (c != ' ' && c != '\r' && c != '\t') return false;
  }
  return true;
}

}  // namespace

Result<ShakespeareRoles> split_by_article(std::string_view text,
                                          const ShakespeareRolesOptions& opts,
                                          std::string_view source) {
  if (text.empty()) return invalid_argument(std::string(source) + ": empty text");
  if (opts.min_chars < 2) return invalid_argument("wikitext articles: min_chars below 2");
  if (!(opts.test_fraction > 0.0 && opts.test_fraction < 0.5)) {
    return invalid_argument("wikitext articles: test_fraction must be in (0, 0.5)");
  }
  std::vector<std::pair<std::string, std::string>> all;  // title, text; in file order
  size_t pos = 0;
  int64_t line_no = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(pos, end - pos);
    ++line_no;
    pos = end + 1;
    if (is_title_line(line)) {
      all.emplace_back(std::string(title_of(line)), std::string());
    } else if (all.empty()) {
      if (is_blank(line)) continue;
      return invalid_argument(std::string(source) + ":" + std::to_string(line_no) +
                              ": text before the first article title ' = Title = ': '" +
                              std::string(line.substr(0, 60)) + "'");
    }
    all.back().second.append(line);
    all.back().second.push_back('\n');
  }
  if (all.empty()) {
    return invalid_argument(std::string(source) +
                            ": no article title line ' = Title = ' (is this WikiText?)");
  }

  return split_texts(std::move(all), opts, "(short articles)", "article", source);
}

}  // namespace starling::data
