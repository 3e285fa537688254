// Splitting WikiText by article: titles versus section headings, short articles, the held-out
// split, bad input, and the real WikiText-2 test split when the data folder has it.
#include "core/data/wikitext_articles.h"

#include <catch2/catch.hpp>
#include <filesystem>

#include "core/data/data_dir.h"
#include "core/data/text_file.h"

namespace starling::data {
namespace {

namespace fs = std::filesystem;
using Catch::Contains;

constexpr const char* kWiki =
    " \n"
    " = Du Fu = \n"
    " \n"
    " Du Fu was a prominent Chinese poet of the Tang dynasty . \n"
    " \n"
    " = = Life = = \n"
    " \n"
    " He was born in 712 . \n"
    " = Ab = \n"
    " x \n"
    " = Kiss You ( One Direction song ) = \n"
    " \n"
    " = = = Release = = = \n"
    " It was released in 2013 . \n";

TEST_CASE("wikitext: each title starts an article, and section headings stay inside it", "[data]") {
  ShakespeareRolesOptions o;
  o.min_chars = 2;
  o.test_fraction = 0.25;
  auto r = split_by_article(kWiki, o, "wiki.tokens");
  REQUIRE(r.ok());
  REQUIRE(r->roles.size() == 3);
  CHECK(r->roles[0].role == "Du Fu");
  CHECK(r->roles[1].role == "Ab");
  CHECK(r->roles[2].role == "Kiss You ( One Direction song )");
  const std::string du_fu =
      " = Du Fu = \n \n Du Fu was a prominent Chinese poet of the Tang dynasty . \n \n"
      " = = Life = = \n \n He was born in 712 . \n";
  CHECK(r->roles[0].train + r->roles[0].test == du_fu);
  CHECK(r->roles[0].test.size() == (du_fu.size() + 3) / 4);  // ceil(0.25 n)
  CHECK_THAT(r->roles[2].train, Contains("= = = Release = = ="));
  CHECK(r->minor_roles == 0);
}

TEST_CASE("wikitext: short articles are dropped or merged", "[data]") {
  ShakespeareRolesOptions o;
  o.min_chars = 40;
  auto dropped = split_by_article(kWiki, o, "wiki.tokens");
  REQUIRE(dropped.ok());
  CHECK(dropped->roles.size() == 2);  // " = Ab = \n x \n" is 13 bytes
  CHECK(dropped->minor_roles == 1);
  CHECK(dropped->minor_chars == 13);
  o.merge_minor = true;
  o.min_chars = 100;  // the song's 89 bytes and Ab's 13 merge into one client of 102
  auto merged = split_by_article(kWiki, o, "wiki.tokens");
  REQUIRE(merged.ok());
  REQUIRE(merged->roles.size() == 2);
  CHECK(merged->roles[0].role == "Du Fu");
  CHECK(merged->roles[1].role == "(short articles)");
  CHECK(merged->minor_roles == 2);
  o.min_chars = 100000;
  auto none = split_by_article(kWiki, o, "wiki.tokens");
  REQUIRE_FALSE(none.ok());
  CHECK_THAT(none.status().message(), Contains("wiki.tokens: no article has 100000 characters"));
}

TEST_CASE("wikitext: text that is not WikiText is refused naming the file and line", "[data]") {
  ShakespeareRolesOptions o;
  auto before = split_by_article(" \nFirst Citizen:\nSpeak.\n = T = \n", o, "roles.txt");
  REQUIRE_FALSE(before.ok());
  CHECK_THAT(before.status().message(), Contains("roles.txt:2: text before the first article"));
  auto none = split_by_article(" \n \n", o, "blank.txt");
  REQUIRE_FALSE(none.ok());
  CHECK_THAT(none.status().message(), Contains("blank.txt: no article title"));
  CHECK_FALSE(split_by_article("", o, "empty.txt").ok());
  o.test_fraction = 0.5;
  CHECK_FALSE(split_by_article(kWiki, o, "wiki.tokens").ok());
}

TEST_CASE("wikitext: WikiText-2's test split has 62 articles (the fixture cut 8)", "[data]") {
  auto dir = resolve_data_dir("");
  if (!dir.ok()) return;
  std::error_code ec;
  const fs::path file = *dir / "wikitext-2" / "wiki.test.tokens";
  if (!fs::exists(file, ec)) return;
  auto text = read_text_file(file);
  REQUIRE(text.ok());
  ShakespeareRolesOptions o;  // min_chars 1000
  auto r = split_by_article(*text, o, file.string());
  REQUIRE(r.ok());
  // The whole split (shared/data), or tests/fixtures/data's cut of its first 8 articles.
  const bool whole = text->size() == 1256449;
  CHECK(r->roles.size() + static_cast<size_t>(r->minor_roles) == (whole ? 62 : 8));
  CHECK(r->minor_roles == (whole ? 1 : 0));
  CHECK(r->roles[0].role == "Robert <unk>");
  size_t chars = 0;
  for (const auto& a : r->roles) chars += a.train.size() + a.test.size();
  // Every byte from the first title line on belongs to exactly one article.
  CHECK(static_cast<int64_t>(chars) + r->minor_chars ==
        static_cast<int64_t>(text->size() - text->find(" = Robert")));
}

}  // namespace
}  // namespace starling::data
