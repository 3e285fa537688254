// Tiny Shakespeare split by speaking role (LEAF-style natural non-IID): every "NAME:" block adds
// its lines to NAME's text; each role's text is one federated client's data.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/util/status.h"

namespace starling::data {

struct ShakespeareRolesOptions {
  // Roles with fewer characters (speech lines, newlines included) than this are minor roles.
  int64_t min_chars = 1000;
  // Minor roles are merged into one client named "(minor roles)" when true, else dropped.
  bool merge_minor = false;
  // The last fraction of each role's text is its test part (LEAF holds out per user too).
  // REQUIRES: in (0, 0.5).
  double test_fraction = 0.1;
};

struct RoleText {
  std::string role;   // the speaker name as written, e.g. "First Citizen"
  std::string train;  // the first (1 - test_fraction) of the role's text
  std::string test;   // the rest
};

struct ShakespeareRoles {
  std::vector<RoleText> roles;  // in order of each role's first speech
  int64_t minor_roles = 0;      // roles below min_chars (dropped or merged)
  int64_t minor_chars = 0;      // their characters
};

// Parses `text`: blocks separated by one or more blank lines, each starting with a speaker line
// "NAME:" followed by the speech. A block whose first line does not end in ':' is DataLoss
// naming `source` and the line number; empty text, a min_chars below 2 or a test_fraction
// outside (0, 0.5) is InvalidArgument. The same speaker in several plays is one role (Tiny
// Shakespeare does not mark plays).
Result<ShakespeareRoles> split_by_role(std::string_view text, const ShakespeareRolesOptions& opts,
                                       std::string_view source);

// The shared tail of the splits (this one, split_by_article): (name, text) pairs in order become
// RoleTexts split train / test, those below opts.min_chars dropped or merged into one named
// `merged_name`. No pair left is InvalidArgument "`source`: no `unit` has N characters or more".
Result<ShakespeareRoles> split_texts(std::vector<std::pair<std::string, std::string>> texts,
                                     const ShakespeareRolesOptions& opts,
                                     std::string_view merged_name, std::string_view unit,
                                     std::string_view source);

}  // namespace starling::data
