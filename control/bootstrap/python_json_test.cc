#include "control/bootstrap/python_json.h"

#include <gtest/gtest.h>

namespace kvrail::bootstrap {
namespace {

using nlohmann::ordered_json;

TEST(PythonJsonTest, UsesJsonDumpsDefaultSeparatorsAndMemberOrder) {
  ordered_json value;
  value["prefill_tp_size"] = 4;
  value["prefill_dp_size"] = nullptr;
  value["list"] = {1, "a", ordered_json::array(), ordered_json::object()};
  EXPECT_EQ(DumpPythonJson(value),
            R"({"prefill_tp_size": 4, "prefill_dp_size": null, "list": [1, "a", [], {}]})");
}

TEST(PythonJsonTest, EscapesLikeEnsureAscii) {
  // json.dumps("\"\\/\b\f\n\r\t\x01\x7f\u00f6\u20ac\U0001F600")
  const std::string text = "\"\\/\b\f\n\r\t\x01\x7f\xc3\xb6\xe2\x82\xac\xf0\x9f\x98\x80";
  EXPECT_EQ(DumpPythonJson(ordered_json(text)),
            R"("\"\\/\b\f\n\r\t\u0001\u007f\u00f6\u20ac\ud83d\ude00")");
}

TEST(PythonJsonTest, WritesIntegersAndBooleansAsPython) {
  EXPECT_EQ(DumpPythonJson(ordered_json(-1)), "-1");
  EXPECT_EQ(DumpPythonJson(ordered_json(uint64_t{18446744073709551615u})), "18446744073709551615");
  EXPECT_EQ(DumpPythonJson(ordered_json(true)), "true");
}

}  // namespace
}  // namespace kvrail::bootstrap
