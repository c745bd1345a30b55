#include "control/engine_api/sidecar_arena.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "engine/memory/arena.h"

namespace kvrail::engine_api {
namespace {

// A reply as a sidecar in this process would send it for `arena`.
v1::EngineReply ReplyFor(const Arena& arena, uint64_t offset) {
  v1::EngineReply reply;
  reply.set_arena_path(absl::StrCat("/proc/", getpid(), "/fd/", arena.fd()));
  reply.set_arena_offset(offset);
  reply.set_arena_placement("memfd");
  return reply;
}

TEST(MapSidecarArenaTest, TheArenaStartsAtTheOffsetAndSharesThePages) {
  Arena sidecar = Arena::CreateMemfd("sidecar", 3 * 4096).value();
  auto mapped = MapSidecarArena(ReplyFor(sidecar, 4096), 2 * 4096);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_EQ(mapped->bytes().size(), 2u * 4096);
  EXPECT_EQ(mapped->placement, "memfd");
  mapped->bytes()[0] = 0x5a;
  mapped->bytes()[2 * 4096 - 1] = 0xa5;
  EXPECT_EQ(sidecar.data()[4096], 0x5a);
  EXPECT_EQ(sidecar.data()[3 * 4096 - 1], 0xa5);
}

TEST(MapSidecarArenaTest, AReplyWithoutAPathIsRefused) {
  auto mapped = MapSidecarArena(v1::EngineReply(), 4096);
  ASSERT_FALSE(mapped.ok());
  EXPECT_EQ(mapped.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(mapped.status().message().find("no arena_path"), std::string::npos) << mapped.status();
}

TEST(MapSidecarArenaTest, AFileTooSmallForOffsetAndLengthIsRefusedNamingTheSizes) {
  Arena sidecar = Arena::CreateMemfd("sidecar", 2 * 4096).value();
  auto mapped = MapSidecarArena(ReplyFor(sidecar, 4096), 4097);
  ASSERT_FALSE(mapped.ok());
  EXPECT_EQ(mapped.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(mapped.status().message().find("holds 8192 bytes; arena_offset 4096 + 4097"),
            std::string::npos)
      << mapped.status();
}

TEST(MapSidecarArenaTest, APathThatIsGoneNamesThePathAndErrno) {
  v1::EngineReply reply;
  reply.set_arena_path(absl::StrCat("/proc/", getpid(), "/fd/999999"));
  auto mapped = MapSidecarArena(reply, 4096);
  ASSERT_FALSE(mapped.ok());
  EXPECT_NE(mapped.status().message().find("/fd/999999: open failed"), std::string::npos)
      << mapped.status();
}

}  // namespace
}  // namespace kvrail::engine_api
