#include "engine/transport/peer_process.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

namespace kvrail::transport {
namespace {

// A child that sleeps until killed (it calls nothing but pause: this process may have threads),
// and its identity as it would publish it.
struct Child {
  pid_t pid = -1;
  v1::ProcessIdentity identity;
};

Child StartChild() {
  Child child;
  child.pid = fork();
  if (child.pid == 0) {
    while (true) pause();
  }
  child.identity = ProcessIdentityOf(child.pid);
  return child;
}

TEST(SelfProcessTest, NamesThisProcessOnThisHost) {
  const v1::ProcessIdentity self = SelfProcess();
  EXPECT_EQ(self.pid(), static_cast<uint32_t>(getpid()));
  EXPECT_GT(self.start_ticks(), 0u);
  EXPECT_GT(self.pid_namespace(), 0u);
  EXPECT_EQ(self.boot_id().size(), 36u) << self.boot_id();  // a UUID
}

// A process in a pid namespace of its own whose /proc is still its parent's (unshare -p without
// --mount-proc): there its pid names another process, so it publishes no identity.
TEST(SelfProcessTest, IsEmptyWhereProcShowsAnotherPidNamespace) {
  int result[2];
  ASSERT_EQ(pipe(result), 0);
  const pid_t outer = fork();
  if (outer == 0) {
    // Only async-signal-safe calls until the inner fork, then a fresh single-threaded child.
    if (unshare(CLONE_NEWPID) != 0) {
      const char no = 'n';
      (void)!write(result[1], &no, 1);
      _exit(0);
    }
    const pid_t inner = fork();
    if (inner == 0) {
      const char says = SelfProcess().pid() == 0 ? 'e' : 'p';  // empty, or published
      (void)!write(result[1], &says, 1);
      _exit(0);
    }
    waitpid(inner, nullptr, 0);
    _exit(0);
  }
  close(result[1]);
  char says = 0;
  ASSERT_EQ(read(result[0], &says, 1), 1);
  close(result[0]);
  waitpid(outer, nullptr, 0);
  if (says == 'n') GTEST_SKIP() << "unshare(CLONE_NEWPID) is not allowed here (not root)";
  EXPECT_EQ(says, 'e') << "published an identity whose pid /proc gives to another process";
}

TEST(PeerProcessTest, ALiveProcessHasNotExited) {
  std::unique_ptr<PeerProcess> self = PeerProcess::Watch(SelfProcess());
  ASSERT_NE(self, nullptr);
  EXPECT_FALSE(self->Exited());
  EXPECT_EQ(self->pid(), getpid());
}

TEST(PeerProcessTest, AKilledProcessHasExitedBeforeAndAfterItIsReaped) {
  Child child = StartChild();
  ASSERT_GT(child.pid, 0);
  std::unique_ptr<PeerProcess> watch = PeerProcess::Watch(child.identity);
  ASSERT_NE(watch, nullptr);
  EXPECT_FALSE(watch->Exited());
  ASSERT_EQ(kill(child.pid, SIGKILL), 0);
  // A zombie not yet reaped counts as exited.
  siginfo_t info{};
  ASSERT_EQ(waitid(P_PID, child.pid, &info, WEXITED | WNOWAIT), 0);
  EXPECT_TRUE(watch->Exited());
  ASSERT_EQ(waitpid(child.pid, nullptr, 0), child.pid);
  EXPECT_TRUE(watch->Exited());
}

TEST(PeerProcessTest, AStoppedProcessHasNotExited) {
  Child child = StartChild();
  std::unique_ptr<PeerProcess> watch = PeerProcess::Watch(child.identity);
  ASSERT_NE(watch, nullptr);
  ASSERT_EQ(kill(child.pid, SIGSTOP), 0);
  siginfo_t info{};
  ASSERT_EQ(waitid(P_PID, child.pid, &info, WSTOPPED), 0);
  EXPECT_FALSE(watch->Exited());
  kill(child.pid, SIGKILL);
  waitpid(child.pid, nullptr, 0);
}

TEST(PeerProcessTest, IsNotWatchedWhereTheIdentityIsNotCertainlyThisHostsProcess) {
  const v1::ProcessIdentity self = SelfProcess();
  v1::ProcessIdentity other_host = self;
  other_host.set_boot_id("00000000-0000-0000-0000-000000000000");
  EXPECT_EQ(PeerProcess::Watch(other_host), nullptr);
  v1::ProcessIdentity other_namespace = self;
  other_namespace.set_pid_namespace(self.pid_namespace() + 1);
  EXPECT_EQ(PeerProcess::Watch(other_namespace), nullptr);
  EXPECT_EQ(PeerProcess::Watch(v1::ProcessIdentity()), nullptr);  // an older peer: unset
}

TEST(PeerProcessTest, AProcessGoneBeforeTheWatchHasExited) {
  Child child = StartChild();
  kill(child.pid, SIGKILL);
  waitpid(child.pid, nullptr, 0);
  std::unique_ptr<PeerProcess> gone = PeerProcess::Watch(child.identity);
  ASSERT_NE(gone, nullptr);
  EXPECT_TRUE(gone->Exited());
  // Its pid taken by another process since (here: this one's, with the child's start time).
  v1::ProcessIdentity reused = SelfProcess();
  reused.set_start_ticks(reused.start_ticks() + 1);
  std::unique_ptr<PeerProcess> other = PeerProcess::Watch(reused);
  ASSERT_NE(other, nullptr);
  EXPECT_TRUE(other->Exited());
}

}  // namespace
}  // namespace kvrail::transport
