// The strict TOML -> protobuf reader and the to_toml writer, on a schema with every field kind.
#include "core/config/toml_config.h"

#include <google/protobuf/util/message_differencer.h>

#include <catch2/catch.hpp>
#include <limits>
#include <string>

#include "tests/core/config/test_schema.h"

namespace {

using google::protobuf::util::MessageDifferencer;
using starling::StatusCode;
using starling::config::parse_toml;
using starling::config::to_toml;
using starling::config::testing::TestSchema;

// The error message of parsing `text` as an AllTypes; the parse must fail with InvalidArgument.
std::string error_of(const std::string& text, const std::string& type = "AllTypes") {
  TestSchema schema;
  auto m = schema.make(type);
  const auto s = parse_toml(text, "t.toml", m.get());
  REQUIRE_FALSE(s.ok());
  REQUIRE(s.code() == StatusCode::kInvalidArgument);
  return s.message();
}

}  // namespace

TEST_CASE("parse_toml fills every field kind", "[config]") {
  TestSchema schema;
  auto m = schema.make("AllTypes");
  const auto s = parse_toml(R"(
i32 = -5
i64 = -9223372036854775808
u32 = 4294967295
u64 = 9223372036854775807
s32 = -2147483648
fx64 = 12
f = 2          # an integer is accepted for a float
d = 1e-300
b = false
s = "tab\there \u00fc"
color = "dark_blue"   # enum names match case-insensitively
ints = [1, -2, 3]
names = ["a", "b"]
floats = [0.5, 1]
colors = ["RED", "Green"]
pick_b = "chosen"

[nested]
x = 10
label = "n"
inner = { flag = true }

[[items]]
x = 1
[[items]]
label = "second"
inner.flag = true

[child.nested]
x = 99
)",
                            "t.toml", m.get());
  REQUIRE(s.ok());
  auto expected = schema.from_text("AllTypes", R"pb(
    i32: -5
    i64: -9223372036854775808
    u32: 4294967295
    u64: 9223372036854775807
    s32: -2147483648
    fx64: 12
    f: 2
    d: 1e-300
    b: false
    s: "tab\there \303\274"
    color: DARK_BLUE
    ints: [ 1, -2, 3 ]
    names: [ "a", "b" ]
    floats: [ 0.5, 1 ]
    colors: [ RED, GREEN ]
    pick_b: "chosen"
    nested {
      x: 10
      label: "n"
      inner { flag: true }
    }
    items { x: 1 }
    items {
      label: "second"
      inner { flag: true }
    }
    child { nested { x: 99 } }
  )pb");
  INFO(m->DebugString());
  REQUIRE(MessageDifferencer::Equals(*expected, *m));
}

TEST_CASE("parse_toml: unknown keys name file and line and dotted path and the closest key",
          "[config]") {
  SECTION("nested") {
    REQUIRE(error_of("i32 = 1\n\n[nested]\nx = 1\nlabl = \"q\"\n") ==
            "t.toml:5: unknown key 'nested.labl' (did you mean 'label'?)");
  }
  SECTION("top level") {
    REQUIRE(error_of("i32 = 1\ncolour = \"RED\"\n") ==
            "t.toml:2: unknown key 'colour' (did you mean 'color'?)");
  }
  SECTION("a table header") {
    REQUIRE_THAT(error_of("[nestd]\nx = 1\n"),
                 Catch::StartsWith("t.toml:1: unknown key 'nestd' (did you mean 'nested'?)"));
  }
  SECTION("inside an array of tables") {
    REQUIRE_THAT(error_of("[[items]]\nx = 1\n[[items]]\ny = 1\n"),
                 Catch::StartsWith("t.toml:4: unknown key 'items[1].y' (did you mean 'x'?)"));
  }
  SECTION("nothing close: list the known keys") {
    REQUIRE(error_of("[nested]\ncompletely_different = 1\n") ==
            "t.toml:2: unknown key 'nested.completely_different' (known keys: x, label, inner)");
  }
}

TEST_CASE("parse_toml: wrong types name line and key and expected and actual type", "[config]") {
  struct Case {
    const char* what;
    const char* text;
    const char* message;
  };
  const Case cases[] = {
      {"string for int", "\n\ni32 = \"4\"",
       "t.toml:3: key 'i32': expected integer (int32), got string"},
      {"float for int", "i64 = 4.0", "t.toml:1: key 'i64': expected integer (int64), got float"},
      {"table for scalar", "[nested]\nx = { a = 1 }",
       "t.toml:2: key 'nested.x': expected integer (int32), got table"},
      {"table header for scalar", "[u32]\na = 1",
       "t.toml:1: key 'u32': expected integer (uint32), got table"},
      {"scalar for table", "nested = 3", "t.toml:1: key 'nested': expected table, got integer"},
      {"int for bool", "b = 1", "t.toml:1: key 'b': expected boolean, got integer"},
      {"bool for string", "s = true", "t.toml:1: key 's': expected string, got boolean"},
      {"string for float", "f = \"0.5\"", "t.toml:1: key 'f': expected float, got string"},
      {"int for enum", "color = 1",
       "t.toml:1: key 'color': expected string (one of RED, GREEN, DARK_BLUE), got integer"},
      {"date", "s = 1979-05-27", "t.toml:1: key 's': expected string, got date"},
      {"scalar for repeated", "ints = 1",
       "t.toml:1: key 'ints': expected array of integer (int64), got integer"},
      {"array for scalar", "i32 = [1]", "t.toml:1: key 'i32': expected integer (int32), got array"},
      {"bad array element", "ints = [1,\n 2,\n \"x\"]",
       "t.toml:3: key 'ints[2]': expected integer (int64), got string"},
  };
  for (const auto& c : cases) {
    DYNAMIC_SECTION(c.what) { REQUIRE(error_of(c.text) == c.message); }
  }
}

TEST_CASE("parse_toml: integers out of range and negative into unsigned", "[config]") {
  REQUIRE(error_of("i32 = 3000000000") ==
          "t.toml:1: key 'i32': 3000000000 is out of range for int32 [-2147483648, 2147483647]");
  REQUIRE(error_of("s32 = -2147483649") ==
          "t.toml:1: key 's32': -2147483649 is out of range for int32 [-2147483648, 2147483647]");
  REQUIRE(error_of("u32 = 4294967296") ==
          "t.toml:1: key 'u32': 4294967296 is out of range for uint32 [0, 4294967295]");
  REQUIRE(error_of("u32 = -1") ==
          "t.toml:1: key 'u32': -1 is out of range for uint32 [0, 4294967295]");
  REQUIRE(error_of("u64 = -1") ==
          "t.toml:1: key 'u64': -1 is out of range for uint64 [0, 18446744073709551615]");
  REQUIRE(error_of("f = 1e39") == "t.toml:1: key 'f': 1e+39 is out of range for float");
  REQUIRE_THAT(error_of("f = 3.4028236e38"), Catch::Contains("out of range for float"));
  TestSchema schema;
  auto m = schema.make("AllTypes");
  REQUIRE(parse_toml("f = 3.40282356e38", "t.toml", m.get()).ok());  // rounds to FLT_MAX
  REQUIRE_THAT(error_of("fx64 = -3"), Catch::Contains("out of range for uint64"));
  // Beyond int64, TOML itself refuses the number.
  REQUIRE_THAT(error_of("i64 = 9223372036854775808"), Catch::StartsWith("t.toml:1:"));
}

TEST_CASE("parse_toml: bad enum value lists the allowed names", "[config]") {
  REQUIRE(error_of("colors = [\"red\", \"purple\"]") ==
          "t.toml:1: key 'colors[1]': unknown value 'purple' (allowed: RED, GREEN, DARK_BLUE)");
}

TEST_CASE("parse_toml: TOML syntax errors carry line and column", "[config]") {
  const std::string m = error_of("i32 = 1\n[nested]\nx = = 2\n");
  REQUIRE_THAT(m, Catch::StartsWith("t.toml:3:"));
  REQUIRE(m.find(':', std::string("t.toml:3:").size()) != std::string::npos);    // ...:3:COL:
  REQUIRE_THAT(error_of("i32 = 1\ni32 = 2\n"), Catch::StartsWith("t.toml:2:"));  // redefinition
}

TEST_CASE("parse_toml: oneof members conflict and required fields must be present", "[config]") {
  REQUIRE_THAT(error_of("pick_a = 1\npick_b = \"x\"\n"),
               Catch::Contains("conflicts with 'pick_a'") && Catch::Contains("oneof 'pick'"));
  REQUIRE(error_of("", "WithRequired") == "t.toml: missing required key(s): id");
  TestSchema schema;
  auto m = schema.make("WithRequired");
  REQUIRE(parse_toml("id = 3", "t.toml", m.get()).ok());
}

TEST_CASE("parse_toml clears the message first and leaves absent keys at their defaults",
          "[config]") {
  TestSchema schema;
  auto m = schema.from_text("AllTypes", "i32: 100 s: \"old\"");
  REQUIRE(parse_toml("[nested]\nlabel = \"x\"", "t.toml", m.get()).ok());
  auto expected = schema.from_text("AllTypes", "nested { label: \"x\" }");
  REQUIRE(MessageDifferencer::Equals(*expected, *m));
  const auto* d = m->GetDescriptor();
  REQUIRE(m->GetReflection()->GetInt32(*m, d->FindFieldByName("i32")) == 7);
  REQUIRE(m->GetReflection()->GetString(*m, d->FindFieldByName("s")) == "hi");
}

TEST_CASE("to_toml writes every field and parse_toml reads it back", "[config]") {
  TestSchema schema;
  SECTION("explicit values, awkward strings and floats") {
    auto m = schema.from_text("AllTypes", R"pb(
      i32: -2147483648
      i64: -9223372036854775808
      u32: 4294967295
      u64: 9223372036854775807
      s32: 17
      fx64: 0
      f: 0.1
      d: -0.0
      b: false
      s: "quote\" backslash\\ newline\n tab\t cr\r ctl\001 del\177 \303\274"
      color: RED
      ints: []
      names: [ "", "x" ]
      floats: [ 1e-45, 3.4028235e38, -1.5, 100 ]
      colors: [ DARK_BLUE, RED ]
      nested { x: 0 label: "" }
      items {
        x: 5
        inner { flag: true }
      }
      items { label: "two" }
      child {
        i32: 1
        child { s: "deep" }
      }
      pick_a: 4
    )pb");
    const std::string text = to_toml(*m);
    INFO(text);
    auto back = schema.make("AllTypes");
    const auto s = parse_toml(text, "written.toml", back.get());
    INFO(s.to_string());
    REQUIRE(s.ok());
    REQUIRE(MessageDifferencer::Equivalent(*m, *back));  // unset == default
    REQUIRE(to_toml(*back) == text);
  }
  SECTION("an empty message writes its defaults") {
    auto m = schema.make("AllTypes");
    const std::string text = to_toml(*m);
    INFO(text);
    REQUIRE_THAT(text, Catch::StartsWith("i32 = 7\ni64 = 0\n"));
    REQUIRE_THAT(text, Catch::Contains("\nf = 0.25\n") && Catch::Contains("\nb = true\n") &&
                           Catch::Contains("\ns = \"hi\"\n") &&
                           Catch::Contains("\ncolor = \"GREEN\"\n") &&
                           Catch::Contains("\nints = []\n") &&
                           Catch::Contains("\n[nested]\nx = 3\nlabel = \"\"\n") &&
                           Catch::Contains("\n[nested.inner]\nflag = false\n"));
    REQUIRE(text.find("pick_") == std::string::npos);   // no member of the unset oneof
    REQUIRE(text.find("[child") == std::string::npos);  // unset recursive field left out
    auto back = schema.make("AllTypes");
    REQUIRE(parse_toml(text, "written.toml", back.get()).ok());
    REQUIRE(to_toml(*back) == text);
    const auto* d = back->GetDescriptor();
    REQUIRE(back->GetReflection()->HasField(*back, d->FindFieldByName("i32")));
    REQUIRE(back->GetReflection()->GetInt32(*back, d->FindFieldByName("i32")) == 7);
  }
}
