// AtomicFile: a file appears complete under its name, or not at all.
#include "core/io/file.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "tests/core/io/io_test_util.h"

using starling::StatusCode;
using starling::io::AtomicFile;
using starling::io::testing::list_dir;
using starling::io::testing::read_bytes;
using starling::io::testing::TempDir;
using starling::io::testing::write_bytes;

TEST_CASE("AtomicFile appears only on commit and replaces the old file", "[io]") {
  TempDir dir;
  const auto target = dir / "ckpt.bin";
  write_bytes(target, {1, 2, 3});
  {
    auto f = AtomicFile::create(target);
    REQUIRE(f.ok());
    REQUIRE(f->append("abcd", 4).ok());
    REQUIRE(list_dir(dir.path()).size() == 2);  // the old file and the temporary
    REQUIRE(read_bytes(target) == std::vector<uint8_t>{1, 2, 3});
    REQUIRE(f->commit().ok());
    REQUIRE(f->commit().code() == StatusCode::kFailedPrecondition);
  }
  REQUIRE(read_bytes(target) == std::vector<uint8_t>{'a', 'b', 'c', 'd'});
  REQUIRE(list_dir(dir.path()) == std::vector<std::string>{"ckpt.bin"});
}

TEST_CASE("AtomicFile abandoned without commit leaves nothing behind", "[io]") {
  TempDir dir;
  const auto target = dir / "ckpt.bin";
  {
    auto f = AtomicFile::create(target);
    REQUIRE(f.ok());
    REQUIRE(f->append("abcd", 4).ok());
  }
  REQUIRE(list_dir(dir.path()).empty());
}

TEST_CASE("AtomicFile in a missing directory is NotFound", "[io]") {
  TempDir dir;
  auto f = AtomicFile::create(dir / "no/such/dir/ckpt.bin");
  REQUIRE_FALSE(f.ok());
  REQUIRE(f.status().code() == StatusCode::kNotFound);
  REQUIRE(f.status().message().find("no/such/dir/ckpt.bin") != std::string::npos);
}
