#include "engine/zmq_auth/key_file.h"

#include <gmock/gmock.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/zmq_auth/allowed_keys.h"
#include "gtest/gtest.h"

namespace kvrail::zmq_auth {
namespace {

using ::testing::HasSubstr;

class KeyFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/kvrail-keys-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { (void)!system(absl::StrCat("rm -rf ", dir_).c_str()); }

  std::string Write(const std::string& name, const std::string& text, mode_t mode = 0600) {
    const std::string path = absl::StrCat(dir_, "/", name);
    std::ofstream(path) << text;
    chmod(path.c_str(), mode);
    return path;
  }
  KeyFile Generate(KeyRole role, int rank, std::string name = "") {
    absl::StatusOr<KeyFile> key = GenerateKeyFile({role, rank, std::move(name)});
    EXPECT_TRUE(key.ok()) << key.status();
    return *key;
  }

  std::string dir_;
};

TEST_F(KeyFileTest, KeygenWritesASecretFileOnlyItsOwnerReadsAndAPublicFileThatReadsBack) {
  const KeyFile key = Generate(KeyRole::kDecode, 3);
  EXPECT_EQ(key.identity.name, "decode-3");
  absl::StatusOr<std::string> path = WriteKeyFiles(dir_, key);
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, dir_ + "/decode-3.key");
  struct stat info;
  ASSERT_EQ(stat(path->c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0600u);

  absl::StatusOr<KeyFile> secret = ReadSecretKeyFile(*path);
  ASSERT_TRUE(secret.ok()) << secret.status();
  EXPECT_EQ(secret->identity, key.identity);
  EXPECT_EQ(secret->secret_key, key.secret_key);
  absl::StatusOr<KeyFile> pub = ReadPublicKeyFile(dir_ + "/decode-3.pub");
  ASSERT_TRUE(pub.ok()) << pub.status();
  EXPECT_EQ(pub->public_key, key.public_key);
  EXPECT_TRUE(pub->secret_key.empty());
}

TEST_F(KeyFileTest, KeygenNeverOverwritesAKey) {
  ASSERT_TRUE(WriteKeyFiles(dir_, Generate(KeyRole::kPrefill, 1)).ok());
  absl::StatusOr<std::string> again = WriteKeyFiles(dir_, Generate(KeyRole::kPrefill, 1));
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
}

TEST_F(KeyFileTest, ASecretFileReadableByGroupOrOthersIsRefusedNamingIt) {
  const KeyFile key = Generate(KeyRole::kDecode, 0);
  ASSERT_TRUE(WriteKeyFiles(dir_, key).ok());
  const std::string path = dir_ + "/decode-0.key";
  chmod(path.c_str(), 0640);
  absl::StatusOr<KeyFile> read = ReadSecretKeyFile(path);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(read.status().message()), HasSubstr(path));
  EXPECT_THAT(std::string(read.status().message()), HasSubstr("0640"));
}

TEST_F(KeyFileTest, APublicKeyOfTheWrongLengthIsRefusedNamingTheFileAndTheRule) {
  const std::string path =
      Write("bad.pub", R"({"role": "decode", "rank": 1, "name": "d1", "public": "abc"})", 0644);
  absl::StatusOr<KeyFile> read = ReadPublicKeyFile(path);
  ASSERT_FALSE(read.ok());
  EXPECT_THAT(std::string(read.status().message()), HasSubstr(path));
  EXPECT_THAT(std::string(read.status().message()), HasSubstr("40 characters"));
}

TEST_F(KeyFileTest, AnUnknownRoleIsRefused) {
  const KeyFile key = Generate(KeyRole::kDecode, 1);
  const std::string path =
      Write("x.pub",
            absl::StrCat(R"({"role": "router", "rank": 1, "name": "x", "public": ")",
                         key.public_key, "\"}"),
            0644);
  absl::StatusOr<KeyFile> read = ReadPublicKeyFile(path);
  ASSERT_FALSE(read.ok());
  EXPECT_THAT(std::string(read.status().message()), HasSubstr("role \"router\""));
}

TEST_F(KeyFileTest, APublicFileHoldingASecretAndASecretThatIsNotThePublicKeysAreRefused) {
  const KeyFile a = Generate(KeyRole::kDecode, 1, "a");
  const KeyFile b = Generate(KeyRole::kDecode, 1, "b");
  const std::string leaked =
      absl::StrCat(R"({"role": "decode", "rank": 1, "name": "a", )", R"("public": ")", a.public_key,
                   R"(", "secret": ")", a.secret_key, "\"}");
  EXPECT_THAT(std::string(ParseKeyFile(leaked, "a.pub", false).status().message()),
              HasSubstr("must not hold \"secret\""));
  const std::string mixed =
      absl::StrCat(R"({"role": "decode", "rank": 1, "name": "a", )", R"("public": ")", a.public_key,
                   R"(", "secret": ")", b.secret_key, "\"}");
  EXPECT_THAT(std::string(ParseKeyFile(mixed, "a.key", true).status().message()),
              HasSubstr("not the public half"));
}

TEST_F(KeyFileTest, UserIdsReadBack) {
  const KeyIdentity identity{KeyRole::kPrefill, 7, "prefill-7"};
  EXPECT_EQ(UserId(identity), "prefill:7:prefill-7");
  absl::StatusOr<KeyIdentity> back = ParseUserId("prefill:7:prefill-7");
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, identity);
  EXPECT_FALSE(ParseUserId("prefill:x:y").ok());
  EXPECT_FALSE(ParseUserId("").ok());
}

TEST_F(KeyFileTest, AllowedKeysReadEveryPubFileOfTheDirectory) {
  const KeyFile p1 = Generate(KeyRole::kPrefill, 1);
  const KeyFile d3 = Generate(KeyRole::kDecode, 3);
  ASSERT_TRUE(WriteKeyFiles(dir_, p1).ok());
  ASSERT_TRUE(WriteKeyFiles(dir_, d3).ok());
  absl::StatusOr<AllowedKeys> allowed = AllowedKeys::LoadDirectory(dir_);
  ASSERT_TRUE(allowed.ok()) << allowed.status();
  EXPECT_EQ(allowed->size(), 2u);
  ASSERT_NE(allowed->Find(d3.public_key), nullptr);
  EXPECT_EQ(*allowed->Find(d3.public_key), d3.identity);
  EXPECT_EQ(allowed->Find(Generate(KeyRole::kDecode, 3).public_key), nullptr);
}

TEST_F(KeyFileTest, OnePublicKeyListedWithTwoIdentitiesIsRefusedAtLoad) {
  KeyFile d3 = Generate(KeyRole::kDecode, 3);
  KeyFile as_p1 = d3;
  as_p1.identity = {KeyRole::kPrefill, 1, "prefill-1"};
  absl::StatusOr<AllowedKeys> allowed = AllowedKeys::FromKeys({d3, as_p1});
  ASSERT_FALSE(allowed.ok());
  EXPECT_THAT(std::string(allowed.status().message()), HasSubstr("decode:3:decode-3"));
  EXPECT_THAT(std::string(allowed.status().message()), HasSubstr("prefill:1:prefill-1"));
}

TEST_F(KeyFileTest, AnEmptyAllowedDirectoryIsRefused) {
  EXPECT_FALSE(AllowedKeys::LoadDirectory(dir_).ok());
  EXPECT_FALSE(AllowedKeys::LoadDirectory(dir_ + "/missing").ok());
}

}  // namespace
}  // namespace kvrail::zmq_auth
