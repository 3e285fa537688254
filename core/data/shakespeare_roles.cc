// Parsing Tiny Shakespeare's speaker blocks into per-role texts.
#include "core/data/shakespeare_roles.h"

#include <cmath>
#include <unordered_map>

namespace starling::data {

Result<ShakespeareRoles> split_by_role(std::string_view text, const ShakespeareRolesOptions& opts,
                                       std::string_view source) {
  if (text.empty()) return invalid_argument(std::string(source) + ": empty text");
  if (opts.min_chars < 2) return invalid_argument("shakespeare roles: min_chars below 2");
  if (!(opts.test_fraction > 0.0 && opts.test_fraction < 0.5)) {
    return invalid_argument("shakespeare roles: test_fraction must be in (0, 0.5)");
  }
  std::vector<std::pair<std::string, std::string>> all;  // role, text; first-speech order
  std::unordered_map<std::string, size_t> index;
  size_t pos = 0;
  int64_t line_no = 0;
  std::string* current = nullptr;  // the speech being collected; null between blocks
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(pos, end - pos);
    ++line_no;
    pos = end + 1;
    if (line.empty()) {
      current = nullptr;
      continue;
    }
    if (current == nullptr) {
      if (line.back() != ':' || line.size() < 2) {
        return data_loss(std::string(source) + ":" + std::to_string(line_no) +
                         ": expected a speaker line 'NAME:', got '" +
                         std::string(line.substr(0, 60)) + "'");
      }
      std::string name(line.substr(0, line.size() - 1));
      auto [it, fresh] = index.emplace(name, all.size());
      if (fresh) all.emplace_back(std::move(name), std::string());
      current = &all[it->second].second;
      continue;
    }
    current->append(line);
    current->push_back('\n');
  }

  return split_texts(std::move(all), opts, "(minor roles)", "role", source);
}

Result<ShakespeareRoles> split_texts(std::vector<std::pair<std::string, std::string>> texts,
                                     const ShakespeareRolesOptions& opts,
                                     std::string_view merged_name, std::string_view unit,
                                     std::string_view source) {
  ShakespeareRoles out;
  std::string minor;
  auto split = [&](std::string name, const std::string& t) {
    const auto n_test =
        static_cast<size_t>(std::ceil(opts.test_fraction * static_cast<double>(t.size())));
    RoleText r;
    r.role = std::move(name);
    r.train = t.substr(0, t.size() - n_test);
    r.test = t.substr(t.size() - n_test);
    out.roles.push_back(std::move(r));
  };
  for (auto& [name, t] : texts) {
    if (static_cast<int64_t>(t.size()) < opts.min_chars) {
      ++out.minor_roles;
      out.minor_chars += static_cast<int64_t>(t.size());
      if (opts.merge_minor) minor += t;
      continue;
    }
    split(name, t);
  }
  if (opts.merge_minor && static_cast<int64_t>(minor.size()) >= opts.min_chars) {
    split(std::string(merged_name), minor);
  }
  if (out.roles.empty()) {
    return invalid_argument(std::string(source) + ": no " + std::string(unit) + " has " +
                            std::to_string(opts.min_chars) + " characters or more");
  }
  return out;
}

}  // namespace starling::data
