// A protobuf schema with every field kind, built at run time (no generated code), for the
// TOML reader and writer tests.
#pragma once

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/dynamic_message.h>
#include <google/protobuf/text_format.h>

#include <catch2/catch.hpp>
#include <memory>
#include <string>

namespace starling::config::testing {

inline constexpr char kAllTypesProto[] = R"pb(
  name: "starling_test_all_types.proto"
  package: "starling.test"
  syntax: "proto2"
  enum_type {
    name: "Color"
    value { name: "RED" number: 0 }
    value { name: "GREEN" number: 1 }
    value { name: "DARK_BLUE" number: 2 }
  }
  message_type {
    name: "Inner"
    field { name: "flag" number: 1 label: LABEL_OPTIONAL type: TYPE_BOOL }
  }
  message_type {
    name: "Nested"
    field { name: "x" number: 1 label: LABEL_OPTIONAL type: TYPE_INT32 default_value: "3" }
    field { name: "label" number: 2 label: LABEL_OPTIONAL type: TYPE_STRING }
    field {
      name: "inner"
      number: 3
      label: LABEL_OPTIONAL
      type: TYPE_MESSAGE
      type_name: ".starling.test.Inner"
    }
  }
  message_type {
    name: "AllTypes"
    field { name: "i32" number: 1 label: LABEL_OPTIONAL type: TYPE_INT32 default_value: "7" }
    field { name: "i64" number: 2 label: LABEL_OPTIONAL type: TYPE_INT64 }
    field { name: "u32" number: 3 label: LABEL_OPTIONAL type: TYPE_UINT32 }
    field { name: "u64" number: 4 label: LABEL_OPTIONAL type: TYPE_UINT64 }
    field { name: "s32" number: 5 label: LABEL_OPTIONAL type: TYPE_SINT32 }
    field { name: "fx64" number: 6 label: LABEL_OPTIONAL type: TYPE_FIXED64 }
    field { name: "f" number: 7 label: LABEL_OPTIONAL type: TYPE_FLOAT default_value: "0.25" }
    field { name: "d" number: 8 label: LABEL_OPTIONAL type: TYPE_DOUBLE }
    field { name: "b" number: 9 label: LABEL_OPTIONAL type: TYPE_BOOL default_value: "true" }
    field { name: "s" number: 10 label: LABEL_OPTIONAL type: TYPE_STRING default_value: "hi" }
    field {
      name: "color"
      number: 11
      label: LABEL_OPTIONAL
      type: TYPE_ENUM
      type_name: ".starling.test.Color"
      default_value: "GREEN"
    }
    field {
      name: "nested"
      number: 12
      label: LABEL_OPTIONAL
      type: TYPE_MESSAGE
      type_name: ".starling.test.Nested"
    }
    field { name: "ints" number: 13 label: LABEL_REPEATED type: TYPE_INT64 }
    field { name: "names" number: 14 label: LABEL_REPEATED type: TYPE_STRING }
    field { name: "floats" number: 15 label: LABEL_REPEATED type: TYPE_FLOAT }
    field {
      name: "colors"
      number: 16
      label: LABEL_REPEATED
      type: TYPE_ENUM
      type_name: ".starling.test.Color"
    }
    field {
      name: "items"
      number: 17
      label: LABEL_REPEATED
      type: TYPE_MESSAGE
      type_name: ".starling.test.Nested"
    }
    field {
      name: "child"
      number: 18
      label: LABEL_OPTIONAL
      type: TYPE_MESSAGE
      type_name: ".starling.test.AllTypes"
    }
    field { name: "pick_a" number: 19 label: LABEL_OPTIONAL type: TYPE_INT32 oneof_index: 0 }
    field { name: "pick_b" number: 20 label: LABEL_OPTIONAL type: TYPE_STRING oneof_index: 0 }
    oneof_decl { name: "pick" }
  }
  message_type {
    name: "WithRequired"
    field { name: "id" number: 1 label: LABEL_REQUIRED type: TYPE_INT32 }
  }
)pb";

// Owns the descriptor pool and the message factory; messages it makes must not outlive it.
class TestSchema {
 public:
  TestSchema() {
    google::protobuf::FileDescriptorProto file;
    REQUIRE(google::protobuf::TextFormat::ParseFromString(kAllTypesProto, &file));
    REQUIRE(pool_.BuildFile(file) != nullptr);
  }

  std::unique_ptr<google::protobuf::Message> make(const std::string& name) {
    const google::protobuf::Descriptor* d = pool_.FindMessageTypeByName("starling.test." + name);
    REQUIRE(d != nullptr);
    return std::unique_ptr<google::protobuf::Message>(factory_.GetPrototype(d)->New());
  }

  // A message of type `name` from protobuf text format.
  std::unique_ptr<google::protobuf::Message> from_text(const std::string& name,
                                                       const std::string& text) {
    auto m = make(name);
    REQUIRE(google::protobuf::TextFormat::ParseFromString(text, m.get()));
    return m;
  }

 private:
  google::protobuf::DescriptorPool pool_;
  google::protobuf::DynamicMessageFactory factory_{&pool_};
};

}  // namespace starling::config::testing
