#include "control/bootstrap/bearer_token.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

namespace kvrail::bootstrap {
namespace {

std::string WriteFile(const std::string& name, const std::string& content) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

TEST(BootstrapTokenTest, AFileHoldsTheTokenWithoutSurroundingWhitespace) {
  absl::StatusOr<std::string> token =
      ReadBearerTokenFile(WriteFile("token", "  s3cr3t-Token_~+/==\n"));
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "s3cr3t-Token_~+/==");
}

TEST(BootstrapTokenTest, TokensOutsideB64tokenAreRefusedWithoutShowingThem) {
  for (const std::string bad :
       {std::string(""), std::string("two words"), std::string("a%41"), std::string("=="),
        std::string("tok\x01"), std::string(5000, 'a'), std::string("a=b")}) {
    absl::Status status = ValidateBearerToken(bad);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    if (bad.size() > 3) EXPECT_EQ(status.message().find(bad), std::string::npos) << status;
  }
  absl::StatusOr<std::string> missing = ReadBearerTokenFile("/nonexistent/kvrail-token");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/nonexistent/kvrail-token"), std::string::npos);
  absl::StatusOr<std::string> blank = ReadBearerTokenFile(WriteFile("blank", "\n\n"));
  EXPECT_NE(blank.status().message().find("is empty"), std::string::npos) << blank.status();
}

TEST(BootstrapTokenTest, OnlyTheBearerSchemeWithTheExactTokenIsAccepted) {
  EXPECT_EQ(BearerAuthorization("abc"), "Bearer abc");
  EXPECT_TRUE(AuthorizationCarries("Bearer abc", "abc"));
  EXPECT_TRUE(AuthorizationCarries("bearer abc", "abc"));  // the scheme has no case
  EXPECT_FALSE(AuthorizationCarries("Bearer abd", "abc"));
  EXPECT_FALSE(AuthorizationCarries("Bearer ab", "abc"));
  EXPECT_FALSE(AuthorizationCarries("Bearer abcd", "abc"));
  EXPECT_FALSE(AuthorizationCarries("Bearer ABC", "abc"));
  EXPECT_FALSE(AuthorizationCarries("Basic abc", "abc"));
  EXPECT_FALSE(AuthorizationCarries("abc", "abc"));
  EXPECT_FALSE(AuthorizationCarries("", "abc"));
}

}  // namespace
}  // namespace kvrail::bootstrap
