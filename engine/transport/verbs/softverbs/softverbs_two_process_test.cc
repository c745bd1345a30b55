// Two processes on one host: the test re-executes its own binary as the peer
// (/proc/self/exe --softverbs-peer <fd>), which registers memory and exchanges QP information
// over a socketpair; the parent writes into the peer's memory over softverbs.
#include <fcntl.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/transport/verbs/softverbs/softverbs.h"
#include "engine/transport/verbs/softverbs/test_util.h"
#include "gtest/gtest.h"

namespace kvrail::transport::softverbs {
namespace {

using testing::Api;

constexpr size_t kBytes = 4 << 20;

struct Info {
  uint32_t qpn;
  uint32_t rkey;
  uint64_t addr;
  unsigned char gid[16];
};

bool SendAll(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = write(fd, c, n);
    if (w <= 0) return false;
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool RecvAll(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = read(fd, c, n);
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

unsigned char Pattern(size_t i, unsigned char seed) {
  return static_cast<unsigned char>((i * 131 + (i >> 12) + seed) & 0xff);
}

// The peer process: a responder with a 4 MiB region. Commands: 'V' <seed> verifies the region
// holds Pattern(seed) and answers 'K' or 'X'; 'Z' answers 'K' if it is all zero; 'Q' exits.
int RunPeer(int fd) {
  ibv_context* ctx = testing::OpenByName("softverbs0");
  if (ctx == nullptr) return 2;
  ibv_pd* pd = Api().alloc_pd(ctx);
  std::vector<unsigned char> buf(kBytes, 0);
  ibv_mr* mr =
      Api().reg_mr(pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ibv_cq* cq = Api().create_cq(ctx, 64, nullptr, nullptr, 0);
  ibv_qp* qp = testing::MakeQp(pd, cq);
  if (mr == nullptr || qp == nullptr || testing::ToInit(qp) != 0) return 3;
  Info mine{qp->qp_num, mr->rkey, reinterpret_cast<uint64_t>(buf.data()), {}};
  const ibv_gid gid = testing::Gid(ctx);
  std::memcpy(mine.gid, gid.raw, 16);
  Info theirs;
  if (!SendAll(fd, &mine, sizeof(mine)) || !RecvAll(fd, &theirs, sizeof(theirs))) return 4;
  ibv_gid dgid;
  std::memcpy(dgid.raw, theirs.gid, 16);
  if (testing::ToRtr(qp, theirs.qpn, dgid) != 0 || testing::ToRts(qp, 14, 7) != 0) return 5;
  if (!SendAll(fd, "R", 1)) return 6;
  for (;;) {
    char cmd[2];
    if (!RecvAll(fd, cmd, 1)) return 7;
    if (cmd[0] == 'Q') break;
    if (cmd[0] == 'Z') {
      bool zero = true;
      for (size_t i = 0; i < kBytes && zero; ++i) zero = buf[i] == 0;
      if (!SendAll(fd, zero ? "K" : "X", 1)) return 9;
    }
    if (cmd[0] == 'V') {
      if (!RecvAll(fd, cmd + 1, 1)) return 8;
      bool ok = true;
      for (size_t i = 0; i < kBytes && ok; ++i) ok = buf[i] == Pattern(i, cmd[1]);
      if (!SendAll(fd, ok ? "K" : "X", 1)) return 9;
    }
  }
  Api().destroy_qp(qp);
  Api().destroy_cq(cq);
  Api().dereg_mr(mr);
  Api().dealloc_pd(pd);
  Api().close_device(ctx);
  return 0;
}

// In a fresh network namespace (run as its own process): "lo" starts down, so the rail's port
// is down; bringing lo up there (what `ip link set dev lo up` does) brings the port up within
// the 10 ms the link state is cached. Exit 0: as expected; 77: no permission for a namespace.
int RunNetnsProbe() {
  if (unshare(CLONE_NEWNET) != 0) return 77;
  SetRails({Rail{"softverbs0", "lo", 100}});
  ibv_context* ctx = testing::OpenByName("softverbs0");
  if (ctx == nullptr) return 2;
  ibv_port_attr port;
  if (Api().query_port(ctx, 1, &port) != 0 || port.state != IBV_PORT_DOWN) return 3;
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  ifreq req;
  std::memset(&req, 0, sizeof(req));
  std::strncpy(req.ifr_name, "lo", IFNAMSIZ - 1);
  if (ioctl(fd, SIOCGIFFLAGS, &req) != 0) return 4;
  req.ifr_flags |= IFF_UP;
  if (ioctl(fd, SIOCSIFFLAGS, &req) != 0) return 5;
  close(fd);
  absl::SleepFor(absl::Milliseconds(30));
  if (Api().query_port(ctx, 1, &port) != 0 || port.state != IBV_PORT_ACTIVE) return 6;
  Api().close_device(ctx);
  return 0;
}

TEST(SoftVerbsNetns, ARailIsDownWhileItsNetdevIsDownInTheCallersNetworkNamespace) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    char flag[] = "--softverbs-netns-probe";
    char* argv[] = {const_cast<char*>("softverbs_netns_probe"), flag, nullptr};
    execv("/proc/self/exe", argv);
    _exit(127);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 77) GTEST_SKIP() << "no permission to create a network namespace";
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

class TwoProcesses : public ::testing::Test {
 protected:
  void SetUp() override {
    SetRails({Rail{"softverbs0", "lo", 100}});
    int sv[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    fd_ = sv[0];
    // The child's end survives exec; prepare argv before fork (the child only calls execv).
    ASSERT_EQ(fcntl(sv[1], F_SETFD, 0), 0);
    const std::string fd_arg = std::to_string(sv[1]);
    char flag[] = "--softverbs-peer";
    char* argv[] = {const_cast<char*>("softverbs_peer"), flag, const_cast<char*>(fd_arg.c_str()),
                    nullptr};
    child_ = fork();
    ASSERT_GE(child_, 0);
    if (child_ == 0) {
      execv("/proc/self/exe", argv);
      _exit(127);
    }
    close(sv[1]);

    ctx_ = testing::OpenByName("softverbs0");
    ASSERT_NE(ctx_, nullptr);
    pd_ = Api().alloc_pd(ctx_);
    cq_ = Api().create_cq(ctx_, 4096, nullptr, nullptr, 0);
    src_.resize(kBytes);
    mr_ = Api().reg_mr(pd_, src_.data(), kBytes, IBV_ACCESS_LOCAL_WRITE);
    qp_ = testing::MakeQp(pd_, cq_, 1024);
    ASSERT_NE(qp_, nullptr);
    ASSERT_EQ(testing::ToInit(qp_), 0);
    ASSERT_TRUE(RecvAll(fd_, &peer_, sizeof(peer_)));
    Info mine{qp_->qp_num, 0, 0, {}};
    const ibv_gid gid = testing::Gid(ctx_);
    std::memcpy(mine.gid, gid.raw, 16);
    ASSERT_TRUE(SendAll(fd_, &mine, sizeof(mine)));
    ibv_gid dgid;
    std::memcpy(dgid.raw, peer_.gid, 16);
    ASSERT_EQ(testing::ToRtr(qp_, peer_.qpn, dgid), 0);
    // timeout 14, retry_cnt 7: 4.096 us x 2^14 x 8 = 537 ms.
    ASSERT_EQ(testing::ToRts(qp_, 14, 7), 0);
    char ready = 0;
    ASSERT_TRUE(RecvAll(fd_, &ready, 1));
    ASSERT_EQ(ready, 'R');
  }

  void TearDown() override {
    if (child_ > 0) {
      SendAll(fd_, "Q", 1);
      int status = 0;
      waitpid(child_, &status, 0);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
    }
    if (fd_ >= 0) close(fd_);
    if (qp_) Api().destroy_qp(qp_);
    if (mr_) Api().dereg_mr(mr_);
    if (cq_) Api().destroy_cq(cq_);
    if (pd_) Api().dealloc_pd(pd_);
    if (ctx_) Api().close_device(ctx_);
  }

  // Posts kBytes as `n` chained writes, only the last one signalled.
  int PostAll(int n, uint64_t wr_id) {
    std::vector<ibv_sge> sges(n);
    std::vector<ibv_send_wr> wrs(n);
    const size_t each = kBytes / n;
    for (int i = 0; i < n; ++i) {
      sges[i] = {reinterpret_cast<uint64_t>(src_.data() + i * each), static_cast<uint32_t>(each),
                 mr_->lkey};
      wrs[i] = testing::Write(wr_id + i, &sges[i], peer_.addr + i * each, peer_.rkey, i == n - 1);
      if (i > 0) wrs[i - 1].next = &wrs[i];
    }
    ibv_send_wr* bad = nullptr;
    return Api().post_send(qp_, wrs.data(), &bad);
  }

  int fd_ = -1;
  pid_t child_ = -1;
  Info peer_{};
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_cq* cq_ = nullptr;
  ibv_mr* mr_ = nullptr;
  ibv_qp* qp_ = nullptr;
  std::vector<unsigned char> src_;
};

TEST_F(TwoProcesses, FourMebibytesInChainedWritesLandByteExactInThePeer) {
  for (unsigned char seed : {1, 77}) {
    for (size_t i = 0; i < kBytes; ++i) src_[i] = Pattern(i, seed);
    ASSERT_EQ(PostAll(16, seed * 100), 0);
    const std::vector<ibv_wc> wcs = testing::PollN(cq_, 1);
    ASSERT_EQ(wcs.size(), 1u);
    ASSERT_EQ(wcs[0].status, IBV_WC_SUCCESS);
    EXPECT_EQ(wcs[0].wr_id, seed * 100u + 15);
    const char cmd[2] = {'V', static_cast<char>(seed)};
    ASSERT_TRUE(SendAll(fd_, cmd, 2));
    char answer = 0;
    ASSERT_TRUE(RecvAll(fd_, &answer, 1));
    EXPECT_EQ(answer, 'K') << "seed " << int(seed);
  }
}

TEST_F(TwoProcesses, KillingThePeerMidStreamEndsInRetryExceededNotAHang) {
  for (size_t i = 0; i < kBytes; ++i) src_[i] = Pattern(i, 5);
  // A few rounds that succeed, then the peer dies with writes in flight.
  for (int round = 0; round < 3; ++round) {
    ASSERT_EQ(PostAll(8, round * 10), 0);
    const std::vector<ibv_wc> wcs = testing::PollN(cq_, 1);
    ASSERT_EQ(wcs.size(), 1u);
    ASSERT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  }
  ASSERT_EQ(PostAll(8, 1000), 0);
  ASSERT_EQ(kill(child_, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(child_, &status, 0), child_);
  child_ = -1;
  const absl::Time start = absl::Now();
  ibv_wc_status first_error = IBV_WC_SUCCESS;
  int posted_rounds = 0;
  while (first_error == IBV_WC_SUCCESS && absl::Now() - start < absl::Seconds(20)) {
    if (posted_rounds < 20 && PostAll(8, 2000 + posted_rounds * 10) == 0) ++posted_rounds;
    ibv_wc wc[16];
    const int n = Api().poll_cq(cq_, 16, wc);
    ASSERT_GE(n, 0);
    for (int i = 0; i < n && first_error == IBV_WC_SUCCESS; ++i) first_error = wc[i].status;
    if (n == 0) absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(first_error, IBV_WC_RETRY_EXC_ERR);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(qp_->state, IBV_QPS_ERR);
  // The killed peer could not remove its segment.
  unlink(SegmentName(peer_.qpn).c_str());
}

// A stopped peer (SIGSTOP) answers nothing: the writes time out after the retry budget, and
// once the requester's QP is in ERR none of them lands when the peer resumes (the fence).
TEST_F(TwoProcesses, AStoppedPeerTimesOutAndNothingLandsWhenItResumes) {
  for (size_t i = 0; i < kBytes; ++i) src_[i] = Pattern(i, 9);
  ASSERT_EQ(kill(child_, SIGSTOP), 0);
  int status = 0;
  ASSERT_EQ(waitpid(child_, &status, WUNTRACED), child_);
  const absl::Time start = absl::Now();
  ASSERT_EQ(PostAll(16, 1), 0);
  const std::vector<ibv_wc> wcs = testing::PollN(cq_, 16, absl::Seconds(20));
  ASSERT_FALSE(wcs.empty());
  EXPECT_EQ(wcs[0].status, IBV_WC_RETRY_EXC_ERR);
  // The budget: 4.096 us x 2^14 x 8 = 537 ms.
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(500));
  EXPECT_EQ(qp_->state, IBV_QPS_ERR);
  ASSERT_EQ(kill(child_, SIGCONT), 0);
  absl::SleepFor(absl::Milliseconds(100));
  ASSERT_TRUE(SendAll(fd_, "Z", 1));
  char answer = 0;
  ASSERT_TRUE(RecvAll(fd_, &answer, 1));
  EXPECT_EQ(answer, 'K') << "a fenced write landed";
}

}  // namespace
}  // namespace kvrail::transport::softverbs

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--softverbs-peer") == 0) {
    return kvrail::transport::softverbs::RunPeer(std::atoi(argv[2]));
  }
  if (argc == 2 && std::strcmp(argv[1], "--softverbs-netns-probe") == 0) {
    return kvrail::transport::softverbs::RunNetnsProbe();
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
