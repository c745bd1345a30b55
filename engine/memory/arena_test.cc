#include "engine/memory/arena.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/memory/pattern.h"

namespace kvrail {
namespace {

using ::testing::HasSubstr;

// A name no other test process uses: tests run in parallel, each in its own process, and
// sandboxes in separate pid namespaces share /dev/shm and often the pid.
std::string UniqueName() {
  static std::atomic<int> counter{0};
  static const unsigned kRun = std::random_device{}();
  return absl::StrCat("/kvrail-arena-test-", getpid(), "-", kRun, "-", counter++);
}

// Runs `body` in a forked child and returns its exit code, or 128 + signal. The child leaves
// through _exit, so it never runs the test framework's or the sanitizers' exit handlers.
int RunInChild(const std::function<int()>& body) {
  const pid_t pid = fork();
  if (pid == 0) _exit(body());
  if (pid < 0) return -1;
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

absl::Span<uint8_t> Bytes(const Arena& arena) { return {arena.data(), arena.size()}; }

// Exit codes of the children below.
constexpr int kChildOk = 0;
constexpr int kChildOpenFailed = 2;
constexpr int kChildWrongSize = 3;

TEST(ArenaSharedTest, ChildOpensByNameAndParentSeesItsWrites) {
  const std::string name = UniqueName();
  constexpr size_t kBytes = 1 << 20;
  absl::StatusOr<Arena> arena = Arena::CreateShared(name, kBytes);
  ASSERT_TRUE(arena.ok()) << arena.status();
  ASSERT_EQ(FirstPatternMismatch(Bytes(*arena), 5).has_value(), true);  // not yet written

  const int exit_code = RunInChild([&] {
    absl::StatusOr<Arena> opened = Arena::OpenShared(name);
    if (!opened.ok()) return kChildOpenFailed;
    if (opened->size() != kBytes) return kChildWrongSize;
    FillPattern(Bytes(*opened), 5);
    return kChildOk;
  });

  ASSERT_EQ(exit_code, kChildOk);
  EXPECT_EQ(FirstPatternMismatch(Bytes(*arena), 5), std::nullopt);
}

TEST(ArenaSharedTest, ReleasedNameOutlivesItsCreator) {
  const std::string name = UniqueName();
  const int exit_code = RunInChild([&] {
    absl::StatusOr<Arena> created = Arena::CreateShared(name, 4096);
    if (!created.ok()) return kChildOpenFailed;
    FillPattern(Bytes(*created), 9);
    created->ReleaseName();
    return kChildOk;
  });
  ASSERT_EQ(exit_code, kChildOk);

  absl::StatusOr<Arena> opened = Arena::OpenShared(name);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(opened->size(), 4096u);
  EXPECT_EQ(FirstPatternMismatch(Bytes(*opened), 9), std::nullopt);
  EXPECT_TRUE(Arena::UnlinkShared(name).ok());
  EXPECT_EQ(Arena::OpenShared(name).status().code(), absl::StatusCode::kNotFound);
}

TEST(ArenaSharedTest, CreatedArenaIsZeroFilledOwnerOnlyAndNamed) {
  const std::string name = UniqueName();
  absl::StatusOr<Arena> arena = Arena::CreateShared(name, 10000);
  ASSERT_TRUE(arena.ok()) << arena.status();
  EXPECT_EQ(arena->size(), 10000u);
  EXPECT_EQ(arena->name(), name);
  EXPECT_EQ(arena->kind(), MemoryKind::kHost);
  EXPECT_TRUE(arena->owns_name());
  EXPECT_TRUE(
      std::all_of(arena->data(), arena->data() + arena->size(), [](uint8_t b) { return b == 0; }));
  struct stat info;
  ASSERT_EQ(fstat(arena->fd(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0600u);
  EXPECT_EQ(info.st_size, 10000);
}

TEST(ArenaSharedTest, DestructorUnlinksTheName) {
  const std::string name = UniqueName();
  {
    absl::StatusOr<Arena> arena = Arena::CreateShared(name, 4096);
    ASSERT_TRUE(arena.ok()) << arena.status();
    ASSERT_TRUE(Arena::OpenShared(name).ok());
  }
  absl::Status reopened = Arena::OpenShared(name).status();
  EXPECT_EQ(reopened.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(
      reopened.message(),
      absl::StrCat("arena \"", name, "\": shm_open failed: No such file or directory (errno 2)"));
}

TEST(ArenaSharedTest, ReleaseNameKeepsTheNameAfterDestruction) {
  const std::string name = UniqueName();
  {
    absl::StatusOr<Arena> arena = Arena::CreateShared(name, 4096);
    ASSERT_TRUE(arena.ok()) << arena.status();
    arena->ReleaseName();
    EXPECT_FALSE(arena->owns_name());
  }
  EXPECT_TRUE(Arena::OpenShared(name).ok());
  EXPECT_TRUE(Arena::UnlinkShared(name).ok());
}

TEST(ArenaSharedTest, OpenerNeverUnlinks) {
  const std::string name = UniqueName();
  absl::StatusOr<Arena> created = Arena::CreateShared(name, 4096);
  ASSERT_TRUE(created.ok()) << created.status();
  {
    absl::StatusOr<Arena> opened = Arena::OpenShared(name);
    ASSERT_TRUE(opened.ok()) << opened.status();
    EXPECT_FALSE(opened->owns_name());
  }
  EXPECT_TRUE(Arena::OpenShared(name).ok());
}

TEST(ArenaSharedTest, SecondCreateOfSameNameFailsWithEexist) {
  const std::string name = UniqueName();
  absl::StatusOr<Arena> first = Arena::CreateShared(name, 4096);
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<Arena> second = Arena::CreateShared(name, 4096);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(second.status().message(),
            absl::StrCat("arena \"", name, "\": shm_open failed: File exists (errno 17)"));
  // The failed create must not have removed the first arena's name.
  EXPECT_TRUE(Arena::OpenShared(name).ok());
}

TEST(ArenaSharedTest, OpenOfMissingNameIsNotFound) {
  absl::Status status = Arena::OpenShared(UniqueName()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("shm_open failed: No such file or directory"));
}

TEST(ArenaSharedTest, OpenOfEmptyObjectFailsPrecondition) {
  const std::string name = UniqueName();
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  absl::Status status = Arena::OpenShared(name).status();
  close(fd);
  shm_unlink(name.c_str());
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr("size 0"));
}

TEST(ArenaSharedTest, ZeroSizeIsRejectedAndLeavesNothingBehind) {
  const std::string name = UniqueName();
  absl::Status status = Arena::CreateShared(name, 0).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            absl::StrCat("arena \"", name, "\": size 0: an arena holds at least one byte"));
  EXPECT_EQ(Arena::OpenShared(name).status().code(), absl::StatusCode::kNotFound);
}

TEST(ArenaSharedTest, SizeBeyondPhysicalMemoryIsRejected) {
  const std::string name = UniqueName();
  absl::Status status = Arena::CreateShared(name, SIZE_MAX).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("exceeds this machine's physical memory"));
  EXPECT_EQ(Arena::OpenShared(name).status().code(), absl::StatusCode::kNotFound);
}

TEST(ArenaSharedTest, UnlinkOfMissingNameIsNotFound) {
  EXPECT_EQ(Arena::UnlinkShared(UniqueName()).code(), absl::StatusCode::kNotFound);
}

TEST(ArenaNameTest, InvalidNamesAreRejectedWithTheRule) {
  const std::pair<std::string, std::string> cases[] = {
      {"", "arena name \"\": must start with '/' (shm_overview(7))"},
      {"kvrail-p0", "arena name \"kvrail-p0\": must start with '/' (shm_overview(7))"},
      {"/", "arena name \"/\": needs at least one character after the leading '/'"},
      {"/kvrail/p0",
       "arena name \"/kvrail/p0\": '/' at position 7; only the first character "
       "may be '/'"},
      {"/kv\nrail", "arena name \"/kv\\nrail\": byte 3 (0x0a) is not printable ASCII"},
      {std::string("/kv\0rail", 8),
       "arena name \"/kv\\000rail\": byte 3 (0x00) is not printable "
       "ASCII"},
      {"/.", "arena name \"/.\": \".\" and \"..\" cannot name a shared-memory object"},
      {"/..", "arena name \"/..\": \".\" and \"..\" cannot name a shared-memory object"},
  };
  for (const auto& [name, message] : cases) {
    SCOPED_TRACE(name);
    for (const absl::Status& status :
         {ValidateSharedName(name), Arena::CreateShared(name, 4096).status(),
          Arena::OpenShared(name).status(), Arena::UnlinkShared(name)}) {
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_EQ(status.message(), message);
    }
  }
}

TEST(ArenaNameTest, NameLengthLimitIsNameMax) {
  std::string longest = UniqueName();
  longest.resize(1 + kMaxSharedNameBytes, 'k');
  absl::StatusOr<Arena> arena = Arena::CreateShared(longest, 4096);
  EXPECT_TRUE(arena.ok()) << arena.status();

  const absl::Status too_long = ValidateSharedName(longest + "k");
  EXPECT_EQ(too_long.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(too_long.message()),
              HasSubstr(": 256 characters after the '/' exceed the limit of 255 (NAME_MAX)"));
  // Long names are cut short in messages.
  EXPECT_THAT(std::string(too_long.message()), HasSubstr("kkk\"... (257 bytes): 256"));
}

TEST(ArenaMemfdTest, ChildMapsItThroughTheFdAndParentSeesItsWrites) {
  constexpr size_t kBytes = 3 * 4096 + 17;
  absl::StatusOr<Arena> arena = Arena::CreateMemfd("kv", kBytes);
  ASSERT_TRUE(arena.ok()) << arena.status();
  EXPECT_EQ(arena->name(), "memfd:kv");
  EXPECT_FALSE(arena->owns_name());

  const int fd = arena->fd();
  const int exit_code = RunInChild([fd] {
    absl::StatusOr<Arena> mapped = Arena::FromFd(fd);
    if (!mapped.ok()) return kChildOpenFailed;
    if (mapped->size() != kBytes) return kChildWrongSize;
    FillPattern(Bytes(*mapped), 77);
    return kChildOk;
  });

  ASSERT_EQ(exit_code, kChildOk);
  EXPECT_EQ(FirstPatternMismatch(Bytes(*arena), 77), std::nullopt);
}

TEST(ArenaMemfdTest, FromFdDuplicatesTheFdAndOutlivesTheOriginal) {
  std::optional<Arena> mapped;
  {
    absl::StatusOr<Arena> arena = Arena::CreateMemfd("kv", 4096);
    ASSERT_TRUE(arena.ok()) << arena.status();
    FillPattern(Bytes(*arena), 3);
    absl::StatusOr<Arena> from_fd = Arena::FromFd(arena->fd());
    ASSERT_TRUE(from_fd.ok()) << from_fd.status();
    EXPECT_NE(from_fd->fd(), arena->fd());
    EXPECT_NE(from_fd->data(), arena->data());
    EXPECT_THAT(from_fd->name(), HasSubstr("memfd:kv"));
    mapped = std::move(*from_fd);
  }
  ASSERT_EQ(mapped->size(), 4096u);
  EXPECT_EQ(FirstPatternMismatch(Bytes(*mapped), 3), std::nullopt);
  EXPECT_GE(fcntl(mapped->fd(), F_GETFD), 0);
  EXPECT_TRUE(fcntl(mapped->fd(), F_GETFD) & FD_CLOEXEC);
}

TEST(ArenaMemfdTest, SizeIsSealedAgainstPeersHoldingTheFd) {
  absl::StatusOr<Arena> arena = Arena::CreateMemfd("kv", 8192);
  ASSERT_TRUE(arena.ok()) << arena.status();
  EXPECT_NE(ftruncate(arena->fd(), 0), 0);
  EXPECT_EQ(errno, EPERM);
  EXPECT_NE(ftruncate(arena->fd(), 1 << 20), 0);
  EXPECT_EQ(errno, EPERM);
}

TEST(ArenaMemfdTest, FdIsCloseOnExec) {
  absl::StatusOr<Arena> arena = Arena::CreateMemfd("kv", 4096);
  ASSERT_TRUE(arena.ok()) << arena.status();
  EXPECT_TRUE(fcntl(arena->fd(), F_GETFD) & FD_CLOEXEC);
}

TEST(ArenaMemfdTest, BadDebugNamesAndSizesAreRejected) {
  EXPECT_EQ(Arena::CreateMemfd("", 4096).status().message(),
            "memfd arena \"\": the debug name must not be empty (it names the arena in messages "
            "and in /proc/<pid>/maps)");
  EXPECT_EQ(Arena::CreateMemfd("kv\t", 4096).status().message(),
            "memfd arena \"kv\\t\": byte 2 (0x09) is not printable ASCII");
  EXPECT_THAT(Arena::CreateMemfd(std::string(250, 'k'), 4096).status().message(),
              HasSubstr(": 250 bytes exceed the debug name limit of 249 (memfd_create(2))"));
  EXPECT_TRUE(Arena::CreateMemfd(std::string(249, 'k'), 4096).ok());
  EXPECT_EQ(Arena::CreateMemfd("kv", 0).status().message(),
            "memfd arena \"kv\": size 0: an arena holds at least one byte");
  absl::Status huge = Arena::CreateMemfd("kv", SIZE_MAX).status();
  EXPECT_EQ(huge.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(huge.message()), HasSubstr("exceeds this machine's physical memory"));
}

TEST(ArenaFromFdTest, NegativeFdIsRejected) {
  absl::Status status = Arena::FromFd(-1).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "arena from fd -1: not a file descriptor");
}

TEST(ArenaFromFdTest, ClosedFdReportsEbadf) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  close(fds[0]);
  close(fds[1]);
  absl::Status status = Arena::FromFd(fds[0]).status();
  EXPECT_EQ(status.message(),
            absl::StrCat("arena from fd ", fds[0],
                         ": fcntl(F_GETFL) failed: Bad file descriptor (errno 9)"));
}

TEST(ArenaFromFdTest, SocketIsNotAnArena) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  absl::Status status = Arena::FromFd(fds[0]).status();
  close(fds[0]);
  close(fds[1]);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("not a regular file or shared-memory object"));
}

TEST(ArenaFromFdTest, ReadOnlyFdIsRejected) {
  const std::string name = UniqueName();
  absl::StatusOr<Arena> arena = Arena::CreateShared(name, 4096);
  ASSERT_TRUE(arena.ok()) << arena.status();
  const int read_only = shm_open(name.c_str(), O_RDONLY, 0);
  ASSERT_GE(read_only, 0);
  absl::Status status = Arena::FromFd(read_only).status();
  close(read_only);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("not open for reading and writing"));
}

TEST(ArenaFromFdTest, SharedMemoryFdMapsTheSameBytes) {
  const std::string name = UniqueName();
  absl::StatusOr<Arena> arena = Arena::CreateShared(name, 4096);
  ASSERT_TRUE(arena.ok()) << arena.status();
  absl::StatusOr<Arena> mapped = Arena::FromFd(arena->fd());
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_EQ(mapped->name(), absl::StrCat("/dev/shm", name));
  FillPattern(Bytes(*mapped), 1);
  EXPECT_EQ(FirstPatternMismatch(Bytes(*arena), 1), std::nullopt);
}

TEST(ArenaMoveTest, MoveTransfersTheMappingAndTheName) {
  const std::string name = UniqueName();
  absl::StatusOr<Arena> created = Arena::CreateShared(name, 4096);
  ASSERT_TRUE(created.ok()) << created.status();
  Arena first = std::move(*created);
  uint8_t* const data = first.data();

  Arena second = std::move(first);
  // The moved-from state is part of the contract (arena.h).
  // NOLINTBEGIN(bugprone-use-after-move,clang-analyzer-cplusplus.Move)
  EXPECT_EQ(first.data(), nullptr);
  EXPECT_EQ(first.size(), 0u);
  EXPECT_EQ(first.fd(), -1);
  EXPECT_FALSE(first.owns_name());
  // NOLINTEND(bugprone-use-after-move,clang-analyzer-cplusplus.Move)
  EXPECT_EQ(second.data(), data);
  EXPECT_TRUE(second.owns_name());

  // Assigning over an arena releases what it held: its name goes.
  const std::string other_name = UniqueName();
  absl::StatusOr<Arena> other = Arena::CreateShared(other_name, 4096);
  ASSERT_TRUE(other.ok()) << other.status();
  *other = std::move(second);
  EXPECT_EQ(Arena::OpenShared(other_name).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Arena::OpenShared(name).ok());
  EXPECT_EQ(other->data(), data);
}

}  // namespace
}  // namespace kvrail
