// WikiText split by Wikipedia article (natural non-IID: every article is one topic, one voice):
// each article's text is one federated client's data, as Tiny Shakespeare's speaking roles are.
#pragma once

#include <string_view>

#include "core/data/shakespeare_roles.h"
#include "core/util/status.h"

namespace starling::data {

// Parses WikiText's tokenized layout: an article starts at a title line " = Title = " (one '='
// on each side; " = = Section = = " lines are headings inside it) and runs to the next title.
// The title line itself belongs to its article's text. Each article is one RoleText (role =
// its title), split train / test by opts.test_fraction at its end; articles shorter than
// opts.min_chars are dropped or merged into "(short articles)" by opts.merge_minor.
// Errors: InvalidArgument naming `source` for empty text, text before the first title that is
// not blank, no title at all, no article of min_chars, or options out of range (as
// split_by_role).
Result<ShakespeareRoles> split_by_article(std::string_view text,
                                          const ShakespeareRolesOptions& opts,
                                          std::string_view source);

}  // namespace starling::data
