// Splitting Shakespeare by speaking role: parsing, minor roles, the held-out split, bad input.
#include "core/data/shakespeare_roles.h"

#include <catch2/catch.hpp>
#include <filesystem>

#include "core/data/data_dir.h"
#include "core/data/text_file.h"

namespace starling::data {
namespace {

namespace fs = std::filesystem;
using Catch::Contains;

constexpr const char* kPlay =
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\n"
    "All:\nSpeak, speak.\n\n"
    "First Citizen:\nYou are all resolved rather to die than to famish?\n\n\n"
    "Second Citizen:\nOne word.\nGood citizens.\n";

TEST_CASE("each speaker's lines become one role, in first-speech order", "[data]") {
  ShakespeareRolesOptions o;
  o.min_chars = 2;
  o.test_fraction = 0.25;
  auto r = split_by_role(kPlay, o, "play.txt");
  REQUIRE(r.ok());
  REQUIRE(r->roles.size() == 3);
  CHECK(r->roles[0].role == "First Citizen");
  CHECK(r->roles[1].role == "All");
  CHECK(r->roles[2].role == "Second Citizen");
  const std::string first =
      "Before we proceed any further, hear me speak.\nYou are all resolved rather to die than to "
      "famish?\n";
  CHECK(r->roles[0].train + r->roles[0].test == first);
  CHECK(r->roles[0].test.size() == (first.size() + 3) / 4);  // ceil(0.25 n)
  CHECK(r->roles[2].train + r->roles[2].test == "One word.\nGood citizens.\n");
  CHECK(r->minor_roles == 0);
}

TEST_CASE("minor roles are dropped or merged", "[data]") {
  ShakespeareRolesOptions o;
  o.min_chars = 20;  // "Speak, speak.\n" (14) is minor; the citizens are not
  auto dropped = split_by_role(kPlay, o, "play.txt");
  REQUIRE(dropped.ok());
  CHECK(dropped->roles.size() == 2);
  CHECK(dropped->minor_roles == 1);
  CHECK(dropped->minor_chars == 14);
  o.min_chars = 26;  // Second Citizen (25) is minor too; merged they make 39 characters
  o.merge_minor = true;
  auto merged = split_by_role(kPlay, o, "play.txt");
  REQUIRE(merged.ok());
  REQUIRE(merged->roles.size() == 2);
  CHECK(merged->roles[1].role == "(minor roles)");
  CHECK(merged->roles[1].train + merged->roles[1].test ==
        "Speak, speak.\nOne word.\nGood citizens.\n");
  CHECK(merged->minor_roles == 2);
}

TEST_CASE("malformed role text is an error naming the line", "[data]") {
  ShakespeareRolesOptions o;
  o.min_chars = 2;
  auto bad = split_by_role("ROMEO:\nHello.\n\nno speaker here\n", o, "bad.txt");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == StatusCode::kDataLoss);
  CHECK_THAT(bad.status().message(), Contains("bad.txt:4") && Contains("no speaker here"));
  CHECK_FALSE(split_by_role("", o, "e.txt").ok());
  o.test_fraction = 0.5;
  CHECK(split_by_role(kPlay, o, "p").status().code() == StatusCode::kInvalidArgument);
  o.test_fraction = 0.1;
  o.min_chars = 100000;
  CHECK_THAT(split_by_role(kPlay, o, "p").status().message(), Contains("no role"));
}

TEST_CASE("Tiny Shakespeare splits into its speaking roles when present", "[data]") {
  auto dir = resolve_data_dir("");
  if (!dir.ok()) return;
  std::error_code ec;
  const fs::path file = *dir / "tinyshakespeare" / "input.txt";
  if (!fs::exists(file, ec)) return;
  auto text = read_text_file(file);
  REQUIRE(text.ok());
  ShakespeareRolesOptions o;  // min_chars 1000
  auto r = split_by_role(*text, o, file.string());
  REQUIRE(r.ok());
  CHECK(r->roles.size() + static_cast<size_t>(r->minor_roles) == 309);
  CHECK(r->roles.size() == 141);
  CHECK(r->roles[0].role == "First Citizen");
  size_t chars = 0;
  for (const auto& role : r->roles) chars += role.train.size() + role.test.size();
  CHECK(static_cast<int64_t>(chars) + r->minor_chars == 1027852);
}

}  // namespace
}  // namespace starling::data
