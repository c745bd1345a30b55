#include "engine/transport/verbs/softverbs/softverbs.h"

#include <arpa/inet.h>
#include <errno.h>
#include <net/if.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/transport/verbs/softverbs/test_util.h"
#include "gtest/gtest.h"

namespace kvrail::transport::softverbs {
namespace {

using testing::Api;
using testing::PollN;
using testing::Write;

// Two contexts on two rails (both on lo), each with a PD, a CQ and a QP, connected to each
// other; `a` writes into `b`'s registered buffer.
class Pair : public ::testing::Test {
 protected:
  static constexpr size_t kBytes = 4 << 20;

  void SetUp() override {
    ClearFaults();
    SetRails({Rail{"softverbs0", "lo", 100}, Rail{"softverbs1", "lo", 200}});
    ctx_a_ = testing::OpenByName("softverbs0");
    ctx_b_ = testing::OpenByName("softverbs1");
    ASSERT_NE(ctx_a_, nullptr);
    ASSERT_NE(ctx_b_, nullptr);
    pd_a_ = Api().alloc_pd(ctx_a_);
    pd_b_ = Api().alloc_pd(ctx_b_);
    cq_a_ = Api().create_cq(ctx_a_, 8192, nullptr, nullptr, 0);
    cq_b_ = Api().create_cq(ctx_b_, 8192, nullptr, nullptr, 0);
    src_.assign(kBytes, 0);
    dst_.assign(kBytes, 0);
    for (size_t i = 0; i < kBytes; ++i) src_[i] = static_cast<unsigned char>(i * 7 + 3);
    mr_src_ = Api().reg_mr(pd_a_, src_.data(), kBytes, IBV_ACCESS_LOCAL_WRITE);
    mr_dst_ =
        Api().reg_mr(pd_b_, dst_.data(), kBytes, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    ASSERT_NE(mr_src_, nullptr);
    ASSERT_NE(mr_dst_, nullptr);
    qp_a_ = testing::MakeQp(pd_a_, cq_a_);
    qp_b_ = testing::MakeQp(pd_b_, cq_b_);
    ASSERT_NE(qp_a_, nullptr);
    ASSERT_NE(qp_b_, nullptr);
    Connect();
  }

  void Connect() {
    ASSERT_EQ(testing::ToInit(qp_a_), 0);
    ASSERT_EQ(testing::ToInit(qp_b_), 0);
    ASSERT_EQ(testing::ToRtr(qp_a_, qp_b_->qp_num, testing::Gid(ctx_b_)), 0);
    ASSERT_EQ(testing::ToRtr(qp_b_, qp_a_->qp_num, testing::Gid(ctx_a_)), 0);
    ASSERT_EQ(testing::ToRts(qp_a_), 0);
    ASSERT_EQ(testing::ToRts(qp_b_), 0);
  }

  void TearDown() override {
    ClearFaults();
    if (qp_a_) {
      EXPECT_EQ(Api().destroy_qp(qp_a_), 0);
    }
    if (qp_b_) {
      EXPECT_EQ(Api().destroy_qp(qp_b_), 0);
    }
    if (mr_src_) {
      EXPECT_EQ(Api().dereg_mr(mr_src_), 0);
    }
    if (mr_dst_) {
      EXPECT_EQ(Api().dereg_mr(mr_dst_), 0);
    }
    EXPECT_EQ(Api().destroy_cq(cq_a_), 0);
    EXPECT_EQ(Api().destroy_cq(cq_b_), 0);
    EXPECT_EQ(Api().dealloc_pd(pd_a_), 0);
    EXPECT_EQ(Api().dealloc_pd(pd_b_), 0);
    Api().close_device(ctx_a_);
    Api().close_device(ctx_b_);
  }

  // Posts one write of src_[off, off+len) to dst_ + off (or `raddr`/`rkey` when given).
  int Post(uint64_t wr_id, size_t off, size_t len, bool signaled = true, uint64_t raddr = 0,
           uint32_t rkey = 0) {
    ibv_sge sge{reinterpret_cast<uint64_t>(src_.data() + off), static_cast<uint32_t>(len),
                mr_src_->lkey};
    ibv_send_wr wr =
        Write(wr_id, &sge, raddr ? raddr : reinterpret_cast<uint64_t>(dst_.data() + off),
              rkey ? rkey : mr_dst_->rkey, signaled);
    ibv_send_wr* bad = nullptr;
    return Api().post_send(qp_a_, &wr, &bad);
  }

  bool DstIsZero() const {
    for (unsigned char c : dst_) {
      if (c != 0) return false;
    }
    return true;
  }

  ibv_context* ctx_a_ = nullptr;
  ibv_context* ctx_b_ = nullptr;
  ibv_pd* pd_a_ = nullptr;
  ibv_pd* pd_b_ = nullptr;
  ibv_cq* cq_a_ = nullptr;
  ibv_cq* cq_b_ = nullptr;
  ibv_mr* mr_src_ = nullptr;
  ibv_mr* mr_dst_ = nullptr;
  ibv_qp* qp_a_ = nullptr;
  ibv_qp* qp_b_ = nullptr;
  std::vector<unsigned char> src_;
  std::vector<unsigned char> dst_;
};

TEST(SoftVerbsDiscovery, TheDevicesAreTheRailsSetRailsGave) {
  SetRails({Rail{"railA", "lo", 100}, Rail{"railB", "lo", 200}, Rail{"railC", "lo", 10}});
  int n = 0;
  ibv_device** list = Api().get_device_list(&n);
  ASSERT_EQ(n, 3);
  EXPECT_STREQ(Api().get_device_name(list[0]), "railA");
  EXPECT_STREQ(Api().get_device_name(list[1]), "railB");
  EXPECT_EQ(list[3], nullptr);
  ibv_context* ctx = Api().open_device(list[1]);
  Api().free_device_list(list);
  ASSERT_NE(ctx, nullptr);
  ibv_device_attr dev;
  ASSERT_EQ(Api().query_device(ctx, &dev), 0);
  EXPECT_STREQ(dev.fw_ver, "softverbs");
  EXPECT_EQ(dev.max_qp_wr, 4096);
  EXPECT_EQ(dev.max_sge, 16);
  ibv_port_attr port;
  ASSERT_EQ(Api().query_port(ctx, 1, &port), 0);
  EXPECT_EQ(port.state, IBV_PORT_ACTIVE);
  EXPECT_EQ(port.link_layer, IBV_LINK_LAYER_ETHERNET);
  EXPECT_EQ(port.active_mtu, IBV_MTU_4096);
  EXPECT_EQ(port.active_width, 2);   // 4X
  EXPECT_EQ(port.active_speed, 64);  // HDR: 4 x 50 = 200 Gb/s.
  EXPECT_EQ(port.gid_tbl_len, 2);
  EXPECT_NE(Api().query_port(ctx, 2, &port), 0);
  Api().close_device(ctx);
  EXPECT_EQ(ParseRails("softverbs0=lo,softverbs1=veth0:200").size(), 2u);
  EXPECT_EQ(ParseRails("softverbs1=veth0:200")[0].gbps, 200);
  EXPECT_EQ(ParseRails("softverbs1=veth0:200")[0].netdev, "veth0");
}

TEST(SoftVerbsDiscovery, GidZeroIsLinkLocalAndGidOneIsTheIpv4MappedAddressOfTheNetdev) {
  SetRails({Rail{"softverbs0", "lo", 100}});
  ibv_context* ctx = testing::OpenByName("softverbs0");
  ASSERT_NE(ctx, nullptr);
  ibv_gid_entry e;
  ASSERT_EQ(Api().query_gid_ex(ctx, 1, 0, &e, 0), 0);
  EXPECT_EQ(e.gid.raw[0], 0xfe);
  EXPECT_EQ(e.gid.raw[1], 0x80);
  EXPECT_EQ(e.gid_type, IBV_GID_TYPE_ROCE_V2);
  ASSERT_EQ(Api().query_gid_ex(ctx, 1, 1, &e, 0), 0);
  const unsigned char mapped[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1};
  EXPECT_EQ(std::memcmp(e.gid.raw, mapped, 16), 0);
  EXPECT_EQ(e.gid_type, IBV_GID_TYPE_ROCE_V2);
  EXPECT_EQ(e.ndev_ifindex, if_nametoindex("lo"));
  EXPECT_EQ(Api().query_gid_ex(ctx, 1, 2, &e, 0), ENODATA);
  EXPECT_EQ(Api().query_gid_ex(ctx, 2, 0, &e, 0), EINVAL);
  Api().close_device(ctx);
}

TEST(SoftVerbsDiscovery, ARailOnAMissingNetdevIsDownAndHasNoIpv4Gid) {
  SetRails({Rail{"ghost", "kvrailnope0", 100}});
  ibv_context* ctx = testing::OpenByName("ghost");
  ASSERT_NE(ctx, nullptr);
  ibv_port_attr port;
  ASSERT_EQ(Api().query_port(ctx, 1, &port), 0);
  EXPECT_EQ(port.state, IBV_PORT_DOWN);
  ibv_gid_entry e;
  EXPECT_EQ(Api().query_gid_ex(ctx, 1, 1, &e, 0), ENODATA);
  Api().close_device(ctx);
}

TEST(SoftVerbsObjects, RegistrationRulesAndBusyObjects) {
  SetRails({Rail{"softverbs0", "lo", 100}});
  ibv_context* ctx = testing::OpenByName("softverbs0");
  ibv_pd* pd = Api().alloc_pd(ctx);
  std::vector<char> buf(4096);
  EXPECT_EQ(Api().reg_mr(pd, nullptr, 10, 0), nullptr);
  EXPECT_EQ(Api().reg_mr(pd, buf.data(), 0, 0), nullptr);
  ibv_mr* a = Api().reg_mr(pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* b = Api().reg_mr(pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_NE(a->rkey, 0u);
  EXPECT_NE(a->rkey, b->rkey);
  EXPECT_EQ(Api().dealloc_pd(pd), EBUSY);
  ibv_cq* cq = Api().create_cq(ctx, 16, nullptr, nullptr, 0);
  ibv_qp_init_attr init;
  std::memset(&init, 0, sizeof(init));
  init.send_cq = cq;
  init.qp_type = IBV_QPT_UD;
  init.cap.max_send_wr = 4;
  EXPECT_EQ(Api().create_qp(pd, &init), nullptr);
  ibv_qp* qp = testing::MakeQp(pd, cq);
  ASSERT_NE(qp, nullptr);
  EXPECT_EQ(Api().destroy_cq(cq), EBUSY);
  EXPECT_EQ(Api().destroy_qp(qp), 0);
  EXPECT_EQ(Api().destroy_cq(cq), 0);
  EXPECT_EQ(Api().dereg_mr(a), 0);
  EXPECT_EQ(Api().dereg_mr(b), 0);
  EXPECT_EQ(Api().dealloc_pd(pd), 0);
  Api().close_device(ctx);
}

TEST(SoftVerbsQp, StateRulesAreTheRcOnes) {
  SetRails({Rail{"softverbs0", "lo", 100}});
  ibv_context* ctx = testing::OpenByName("softverbs0");
  ibv_pd* pd = Api().alloc_pd(ctx);
  ibv_cq* cq = Api().create_cq(ctx, 16, nullptr, nullptr, 0);
  ibv_qp* qp = testing::MakeQp(pd, cq);
  ibv_qp* peer = testing::MakeQp(pd, cq);
  ASSERT_NE(qp, nullptr);
  ASSERT_NE(peer, nullptr);
  EXPECT_NE(qp->qp_num, peer->qp_num);
  std::vector<unsigned char> buf(64);
  ibv_mr* mr =
      Api().reg_mr(pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ibv_sge sge{reinterpret_cast<uint64_t>(buf.data()), 8, mr->lkey};
  ibv_send_wr wr = Write(1, &sge, reinterpret_cast<uint64_t>(buf.data()), mr->rkey);
  ibv_send_wr* bad = nullptr;

  // RESET -> RTR and RESET -> RTS skip INIT.
  EXPECT_EQ(testing::ToRtr(qp, peer->qp_num, testing::Gid(ctx)), EINVAL);
  EXPECT_EQ(testing::ToRts(qp), EINVAL);
  EXPECT_EQ(Api().post_send(qp, &wr, &bad), EINVAL);
  // INIT needs the port, pkey index and access flags.
  EXPECT_EQ(testing::SetState(qp, IBV_QPS_INIT), EINVAL);
  ASSERT_EQ(testing::ToInit(qp), 0);
  EXPECT_EQ(qp->state, IBV_QPS_INIT);
  bad = nullptr;
  EXPECT_EQ(Api().post_send(qp, &wr, &bad), EINVAL);
  EXPECT_EQ(bad, &wr);
  // INIT -> RTS skips RTR; RTR needs its attributes.
  EXPECT_EQ(testing::ToRts(qp), EINVAL);
  EXPECT_EQ(testing::SetState(qp, IBV_QPS_RTR), EINVAL);
  ASSERT_EQ(testing::ToRtr(qp, peer->qp_num, testing::Gid(ctx)), 0);
  EXPECT_EQ(Api().post_send(qp, &wr, &bad), EINVAL);
  EXPECT_EQ(testing::SetState(qp, IBV_QPS_RTS), EINVAL);
  ASSERT_EQ(testing::ToRts(qp), 0);
  EXPECT_EQ(qp->state, IBV_QPS_RTS);
  // Only RDMA WRITE.
  wr.opcode = IBV_WR_SEND;
  EXPECT_EQ(Api().post_send(qp, &wr, &bad), EINVAL);
  EXPECT_EQ(bad, &wr);
  // Any -> ERR, any -> RESET.
  ASSERT_EQ(testing::SetState(qp, IBV_QPS_ERR), 0);
  EXPECT_EQ(testing::SetState(qp, IBV_QPS_RTS), EINVAL);
  ASSERT_EQ(testing::SetState(qp, IBV_QPS_RESET), 0);
  ASSERT_EQ(testing::ToInit(qp), 0);
  EXPECT_EQ(Api().destroy_qp(qp), 0);
  EXPECT_EQ(Api().destroy_qp(peer), 0);
  EXPECT_EQ(Api().dereg_mr(mr), 0);
  EXPECT_EQ(Api().destroy_cq(cq), 0);
  EXPECT_EQ(Api().dealloc_pd(pd), 0);
  Api().close_device(ctx);
}

TEST_F(Pair, AChainOfWritesWithOnlyTheLastSignalledLandsByteExactAndYieldsOneCompletion) {
  constexpr int kWrs = 8;
  const size_t each = kBytes / kWrs;
  ibv_sge sges[kWrs];
  ibv_send_wr wrs[kWrs];
  for (int i = 0; i < kWrs; ++i) {
    sges[i] = {reinterpret_cast<uint64_t>(src_.data() + i * each), static_cast<uint32_t>(each),
               mr_src_->lkey};
    wrs[i] = Write(100 + i, &sges[i], reinterpret_cast<uint64_t>(dst_.data() + i * each),
                   mr_dst_->rkey, i == kWrs - 1);
    if (i > 0) wrs[i - 1].next = &wrs[i];
  }
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(Api().post_send(qp_a_, &wrs[0], &bad), 0);
  const std::vector<ibv_wc> wcs = PollN(cq_a_, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wcs[0].wr_id, 100u + kWrs - 1);
  EXPECT_EQ(wcs[0].opcode, IBV_WC_RDMA_WRITE);
  EXPECT_EQ(wcs[0].qp_num, qp_a_->qp_num);
  // A success means the bytes are there.
  EXPECT_EQ(std::memcmp(src_.data(), dst_.data(), kBytes), 0);
  absl::SleepFor(absl::Milliseconds(20));
  ibv_wc extra;
  EXPECT_EQ(Api().poll_cq(cq_a_, 1, &extra), 0);
}

TEST_F(Pair, AWriteOutsideTheRegionCompletesWithARemoteAccessErrorAndWritesNothing) {
  // The range (1 MiB, several packets) starts inside the MR and ends past it.
  ASSERT_EQ(Post(1, 0, 1 << 20, true, reinterpret_cast<uint64_t>(dst_.data() + kBytes - 4096)), 0);
  ASSERT_EQ(Post(2, 0, 16), 0);
  const std::vector<ibv_wc> wcs = PollN(cq_a_, 2);
  ASSERT_EQ(wcs.size(), 2u);
  EXPECT_EQ(wcs[0].wr_id, 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(wcs[1].wr_id, 2u);
  EXPECT_EQ(wcs[1].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(qp_a_->state, IBV_QPS_ERR);
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_TRUE(DstIsZero());
  EXPECT_EQ(qp_b_->state, IBV_QPS_ERR);  // The responder's QP fails too.
}

TEST_F(Pair, AWriteWithAnUnknownRkeyCompletesWithARemoteAccessError) {
  ASSERT_EQ(Post(1, 0, 64, true, 0, mr_dst_->rkey ^ 0x5a5a0000), 0);
  const std::vector<ibv_wc> wcs = PollN(cq_a_, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_REM_ACCESS_ERR);
  EXPECT_TRUE(DstIsZero());
}

TEST_F(Pair, AWriteIntoARegionWithoutRemoteWriteCompletesWithARemoteAccessError) {
  std::vector<unsigned char> ro(4096, 0);
  ibv_mr* mr = Api().reg_mr(pd_b_, ro.data(), ro.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  ASSERT_EQ(Post(1, 0, 64, true, reinterpret_cast<uint64_t>(ro.data()), mr->rkey), 0);
  const std::vector<ibv_wc> wcs = PollN(cq_a_, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(ro, std::vector<unsigned char>(4096, 0));
  EXPECT_EQ(Api().dereg_mr(mr), 0);
}

TEST_F(Pair, AWriteAfterDeregCompletesWithARemoteAccessError) {
  const uint32_t rkey = mr_dst_->rkey;
  ASSERT_EQ(Api().dereg_mr(mr_dst_), 0);
  mr_dst_ = nullptr;
  ASSERT_EQ(Post(1, 0, 4096, true, 0, rkey), 0);
  const std::vector<ibv_wc> wcs = PollN(cq_a_, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_REM_ACCESS_ERR);
  EXPECT_TRUE(DstIsZero());
}

TEST_F(Pair, OnceDeregReturnsNoWriteTouchesTheRegionAnyMore) {
  ASSERT_EQ(Post(1, 0, kBytes), 0);  // 32 packets.
  absl::SleepFor(absl::Microseconds(200));
  ASSERT_EQ(Api().dereg_mr(mr_dst_), 0);
  mr_dst_ = nullptr;
  const std::vector<unsigned char> after_dereg = dst_;
  const std::vector<ibv_wc> wcs = PollN(cq_a_, 1);
  ASSERT_EQ(wcs.size(), 1u);
  // Either every packet landed before dereg_mr, or the rest was refused.
  EXPECT_TRUE(wcs[0].status == IBV_WC_SUCCESS || wcs[0].status == IBV_WC_REM_ACCESS_ERR)
      << wcs[0].status;
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_TRUE(dst_ == after_dereg);
}

TEST_F(Pair, ABadLocalSgeCompletesWithALocalProtectionError) {
  ibv_sge sge{reinterpret_cast<uint64_t>(src_.data()), 64, mr_src_->lkey + 1};
  ibv_send_wr wr = Write(7, &sge, reinterpret_cast<uint64_t>(dst_.data()), mr_dst_->rkey, false);
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(Api().post_send(qp_a_, &wr, &bad), 0);
  const std::vector<ibv_wc> wcs = PollN(cq_a_, 1);
  ASSERT_EQ(wcs.size(), 1u);  // A failure completes even when unsignalled.
  EXPECT_EQ(wcs[0].wr_id, 7u);
  EXPECT_EQ(wcs[0].status, IBV_WC_LOC_PROT_ERR);
  EXPECT_TRUE(DstIsZero());
}

// Scatter-gather lists as a device takes them: the device says how many entries a write may
// gather (max_sge), a queue pair asks for at most that many and keeps what it asked, a write
// gathers its entries back to back into the remote range, and a write of more entries than its
// queue pair's limit is refused at the post, before a byte moves.
TEST_F(Pair, AWriteGathersUpToItsQueuePairsEntriesAndNoMore) {
  ibv_device_attr device{};
  ASSERT_EQ(Api().query_device(ctx_a_, &device), 0);
  EXPECT_EQ(device.max_sge, 16);
  ibv_qp_init_attr init{};
  init.send_cq = cq_a_;
  init.recv_cq = cq_a_;
  init.qp_type = IBV_QPT_RC;
  init.cap.max_send_wr = 4;
  init.cap.max_recv_wr = 1;
  init.cap.max_send_sge = static_cast<uint32_t>(device.max_sge) + 1;
  errno = 0;
  EXPECT_EQ(Api().create_qp(pd_a_, &init), nullptr);
  EXPECT_EQ(errno, EINVAL);

  // qp_a_ asked for 4 entries (testing::MakeQp): the source's every other KiB, 4 of them.
  ibv_sge sges[5];
  for (int i = 0; i < 5; ++i) {
    sges[i] = {reinterpret_cast<uint64_t>(src_.data() + i * 2048), 1024, mr_src_->lkey};
  }
  ibv_send_wr wr = Write(1, sges, reinterpret_cast<uint64_t>(dst_.data()), mr_dst_->rkey);
  wr.num_sge = 5;
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(Api().post_send(qp_a_, &wr, &bad), EINVAL);
  EXPECT_EQ(bad, &wr);
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_TRUE(DstIsZero());
  ibv_wc none;
  EXPECT_EQ(Api().poll_cq(cq_a_, 1, &none), 0);

  wr.num_sge = 4;
  bad = nullptr;
  ASSERT_EQ(Api().post_send(qp_a_, &wr, &bad), 0);
  const std::vector<ibv_wc> wcs = PollN(cq_a_, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(std::memcmp(dst_.data() + i * 1024, src_.data() + i * 2048, 1024), 0)
        << "entry " << i;
  }
  EXPECT_TRUE(std::all_of(dst_.begin() + 4096, dst_.end(), [](unsigned char c) { return c == 0; }));
}

TEST_F(Pair, PostingBeyondMaxSendWrFailsWithENOMEM) {
  ibv_qp* small = testing::MakeQp(pd_a_, cq_a_, 4);
  ASSERT_NE(small, nullptr);
  ASSERT_EQ(testing::ToInit(small), 0);
  // Connected to a QP number nobody has: nothing is ever acked.
  ASSERT_EQ(testing::ToRtr(small, 0xFFFFFE, testing::Gid(ctx_b_)), 0);
  ASSERT_EQ(testing::ToRts(small, 0), 0);  // timeout 0: no retry timeout.
  ibv_sge sge{reinterpret_cast<uint64_t>(src_.data()), 8, mr_src_->lkey};
  ibv_send_wr wr = Write(1, &sge, reinterpret_cast<uint64_t>(dst_.data()), mr_dst_->rkey);
  ibv_send_wr* bad = nullptr;
  for (int i = 0; i < 4; ++i) ASSERT_EQ(Api().post_send(small, &wr, &bad), 0);
  EXPECT_EQ(Api().post_send(small, &wr, &bad), ENOMEM);
  EXPECT_EQ(bad, &wr);
  ASSERT_EQ(Api().destroy_qp(small), 0);
}

TEST_F(Pair, AnInjectedErrorCompletionWritesNothingAndFlushesTheRest) {
  InjectFault(Fault{
      .kind = FaultKind::kErrorCompletion, .qp_num = qp_a_->qp_num, .status = IBV_WC_REM_OP_ERR});
  ASSERT_EQ(Post(1, 0, 4096), 0);
  ASSERT_EQ(Post(2, 4096, 4096), 0);
  const std::vector<ibv_wc> wcs = PollN(cq_a_, 2);
  ASSERT_EQ(wcs.size(), 2u);
  EXPECT_EQ(wcs[0].status, IBV_WC_REM_OP_ERR);
  EXPECT_EQ(wcs[1].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(qp_a_->state, IBV_QPS_ERR);
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_TRUE(DstIsZero());
}

TEST_F(Pair, AnInjectedQpErrorFlushesOutstandingWrsAndLaterPosts) {
  // Hold the requests on the wire: the responder's rail is down.
  InjectFault(Fault{.kind = FaultKind::kRailDown, .device = "softverbs1"});
  ASSERT_EQ(Post(1, 0, 4096, false), 0);
  InjectFault(Fault{.kind = FaultKind::kQpError, .qp_num = qp_a_->qp_num});
  EXPECT_EQ(qp_a_->state, IBV_QPS_ERR);
  ASSERT_EQ(Post(2, 0, 4096, false), 0);  // Accepted in ERR, flushed.
  const std::vector<ibv_wc> wcs = PollN(cq_a_, 2);
  ASSERT_EQ(wcs.size(), 2u);
  EXPECT_EQ(wcs[0].wr_id, 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(wcs[1].wr_id, 2u);
  EXPECT_EQ(wcs[1].status, IBV_WC_WR_FLUSH_ERR);
  InjectFault(Fault{.kind = FaultKind::kRailDown, .device = "softverbs1", .down = false});
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_TRUE(DstIsZero());  // Fenced.
}

TEST_F(Pair, DelayedCompletionsArriveNoSoonerThanTheDelay) {
  InjectFault(
      Fault{.kind = FaultKind::kDelayCompletions, .count = 1, .delay = absl::Milliseconds(150)});
  const absl::Time start = absl::Now();
  ASSERT_EQ(Post(1, 0, 4096), 0);
  const std::vector<ibv_wc> wcs = PollN(cq_a_, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(150));
  EXPECT_EQ(std::memcmp(src_.data(), dst_.data(), 4096), 0);
}

TEST_F(Pair, ARailDownTimesOutWithRetryExceededAndComesBack) {
  InjectFault(Fault{.kind = FaultKind::kRailDown, .device = "softverbs0"});
  ibv_port_attr port;
  ASSERT_EQ(Api().query_port(ctx_a_, 1, &port), 0);
  EXPECT_EQ(port.state, IBV_PORT_DOWN);
  const absl::Time start = absl::Now();
  ASSERT_EQ(Post(1, 0, 4096), 0);
  ASSERT_EQ(Post(2, 0, 4096), 0);
  const std::vector<ibv_wc> wcs = PollN(cq_a_, 2);
  ASSERT_EQ(wcs.size(), 2u);
  EXPECT_EQ(wcs[0].status, IBV_WC_RETRY_EXC_ERR);
  EXPECT_EQ(wcs[1].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(500));
  EXPECT_TRUE(DstIsZero());
  InjectFault(Fault{.kind = FaultKind::kRailDown, .device = "softverbs0", .down = false});
  ASSERT_EQ(Api().query_port(ctx_a_, 1, &port), 0);
  EXPECT_EQ(port.state, IBV_PORT_ACTIVE);
  // Reconnected, the rail carries writes again.
  ASSERT_EQ(testing::SetState(qp_a_, IBV_QPS_RESET), 0);
  ASSERT_EQ(testing::SetState(qp_b_, IBV_QPS_RESET), 0);
  Connect();
  ASSERT_EQ(Post(3, 0, 4096), 0);
  const std::vector<ibv_wc> ok = PollN(cq_a_, 1);
  ASSERT_EQ(ok.size(), 1u);
  EXPECT_EQ(ok[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(std::memcmp(src_.data(), dst_.data(), 4096), 0);
}

TEST_F(Pair, AQpWhosePeerWasDestroyedTimesOutWithinTheRetryBudget) {
  ASSERT_EQ(Api().destroy_qp(qp_b_), 0);
  qp_b_ = nullptr;
  const absl::Time start = absl::Now();
  ASSERT_EQ(Post(1, 0, 4096), 0);
  const std::vector<ibv_wc> wcs = PollN(cq_a_, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_RETRY_EXC_ERR);
  // The budget is 537 ms here; allow for a loaded sanitizer run.
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(500));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST_F(Pair, AMisroutedDgidIsUnreachable) {
  ASSERT_EQ(testing::SetState(qp_a_, IBV_QPS_RESET), 0);
  ASSERT_EQ(testing::ToInit(qp_a_), 0);
  ibv_gid wrong = testing::Gid(ctx_b_);
  wrong.raw[15] ^= 1;
  ASSERT_EQ(testing::ToRtr(qp_a_, qp_b_->qp_num, wrong), 0);
  // timeout 8, retry_cnt 2: 3 ms computed, so the 50 ms floor is the budget.
  ASSERT_EQ(testing::ToRts(qp_a_, 8, 2), 0);
  const absl::Time start = absl::Now();
  ASSERT_EQ(Post(1, 0, 64), 0);
  const std::vector<ibv_wc> wcs = PollN(cq_a_, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_RETRY_EXC_ERR);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(50));
  EXPECT_TRUE(DstIsZero());
}

// Requests queued on the wire before the requester leaves RTS never land afterwards.
TEST_F(Pair, MovingTheRequesterToErrorFencesPacketsAlreadyOnTheWire) {
  InjectFault(Fault{.kind = FaultKind::kRailDown, .device = "softverbs1"});
  ASSERT_EQ(Post(1, 0, 1 << 20), 0);
  absl::SleepFor(absl::Milliseconds(20));  // The packets sit in the responder's ring.
  ASSERT_EQ(testing::SetState(qp_a_, IBV_QPS_ERR), 0);
  InjectFault(Fault{.kind = FaultKind::kRailDown, .device = "softverbs1", .down = false});
  const std::vector<ibv_wc> wcs = PollN(cq_a_, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_WR_FLUSH_ERR);
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_TRUE(DstIsZero());
}

TEST_F(Pair, DestroyingTheRequesterFencesPacketsAlreadyOnTheWire) {
  InjectFault(Fault{.kind = FaultKind::kRailDown, .device = "softverbs1"});
  ASSERT_EQ(Post(1, 0, 1 << 20), 0);
  absl::SleepFor(absl::Milliseconds(20));
  ASSERT_EQ(Api().destroy_qp(qp_a_), 0);
  qp_a_ = nullptr;
  InjectFault(Fault{.kind = FaultKind::kRailDown, .device = "softverbs1", .down = false});
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_TRUE(DstIsZero());
}

TEST_F(Pair, ResettingAndReconnectingDropsTheOldConnectionsPackets) {
  InjectFault(Fault{.kind = FaultKind::kRailDown, .device = "softverbs1"});
  ASSERT_EQ(Post(1, 0, 4096), 0);
  absl::SleepFor(absl::Milliseconds(20));
  ASSERT_EQ(testing::SetState(qp_a_, IBV_QPS_RESET), 0);
  ASSERT_EQ(testing::SetState(qp_b_, IBV_QPS_RESET), 0);
  Connect();
  InjectFault(Fault{.kind = FaultKind::kRailDown, .device = "softverbs1", .down = false});
  ASSERT_EQ(Post(2, 8192, 64), 0);
  const std::vector<ibv_wc> wcs = PollN(cq_a_, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].wr_id, 2u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  for (size_t i = 0; i < 4096; ++i) ASSERT_EQ(dst_[i], 0) << i;
  EXPECT_EQ(std::memcmp(src_.data() + 8192, dst_.data() + 8192, 64), 0);
}

TEST_F(Pair, TheCompletionChannelWakesWhenAnArmedCqGetsACompletion) {
  ibv_comp_channel* ch = Api().create_comp_channel(ctx_a_);
  ASSERT_NE(ch, nullptr);
  int tag = 42;
  ibv_cq* cq = Api().create_cq(ctx_a_, 64, &tag, ch, 0);
  ibv_qp* qp = testing::MakeQp(pd_a_, cq);
  ASSERT_EQ(testing::ToInit(qp), 0);
  ASSERT_EQ(testing::ToRtr(qp, qp_b_->qp_num, testing::Gid(ctx_b_)), 0);
  ASSERT_EQ(testing::ToRts(qp), 0);
  ibv_cq* got = nullptr;
  void* got_context = nullptr;
  EXPECT_EQ(Api().get_cq_event(ch, &got, &got_context), -1);
  EXPECT_EQ(errno, EAGAIN);
  ASSERT_EQ(Api().req_notify_cq(cq, 0), 0);
  ibv_sge sge{reinterpret_cast<uint64_t>(src_.data()), 64, mr_src_->lkey};
  // qp_b_ answers only its own peer: this write is never acked and times out, which still
  // produces the completion that must wake the channel.
  ibv_send_wr wr = Write(5, &sge, reinterpret_cast<uint64_t>(dst_.data()), mr_dst_->rkey);
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(Api().post_send(qp, &wr, &bad), 0);
  pollfd pfd{ch->fd, POLLIN, 0};
  ASSERT_EQ(poll(&pfd, 1, 10000), 1);
  ASSERT_EQ(Api().get_cq_event(ch, &got, &got_context), 0);
  EXPECT_EQ(got, cq);
  EXPECT_EQ(got_context, &tag);
  Api().ack_cq_events(cq, 1);
  EXPECT_EQ(cq->comp_events_completed, 1u);
  ibv_wc wc;
  EXPECT_EQ(Api().poll_cq(cq, 1, &wc), 1);
  EXPECT_EQ(wc.wr_id, 5u);
  EXPECT_EQ(Api().get_cq_event(ch, &got, &got_context), -1);
  EXPECT_EQ(Api().destroy_comp_channel(ch), EBUSY);
  ASSERT_EQ(Api().destroy_qp(qp), 0);
  ASSERT_EQ(Api().destroy_cq(cq), 0);
  ASSERT_EQ(Api().destroy_comp_channel(ch), 0);
}

TEST_F(Pair, ACqThatOverrunsFailsPollingInsteadOfCorrupting) {
  ibv_cq* tiny = Api().create_cq(ctx_a_, 2, nullptr, nullptr, 0);
  ibv_qp* qp = testing::MakeQp(pd_a_, tiny);
  ASSERT_EQ(testing::ToInit(qp), 0);
  ASSERT_EQ(testing::SetState(qp, IBV_QPS_ERR), 0);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(Post(i, 0, 8) == 0, true);
  ibv_sge sge{reinterpret_cast<uint64_t>(src_.data()), 8, mr_src_->lkey};
  ibv_send_wr wr = Write(1, &sge, reinterpret_cast<uint64_t>(dst_.data()), mr_dst_->rkey);
  ibv_send_wr* bad = nullptr;
  for (int i = 0; i < 3; ++i) ASSERT_EQ(Api().post_send(qp, &wr, &bad), 0);
  ibv_wc wc[4];
  EXPECT_EQ(Api().poll_cq(tiny, 4, wc), -1);
  ASSERT_EQ(Api().destroy_qp(qp), 0);
  ASSERT_EQ(Api().destroy_cq(tiny), 0);
  PollN(cq_a_, 3, absl::Seconds(2));
}

TEST_F(Pair, ManyThreadsPostOnTheirOwnQpsWhileOnePolls) {
  constexpr int kThreads = 4;
  constexpr int kWrites = 200;
  constexpr size_t kEach = 16 * 1024;
  std::vector<ibv_qp*> senders(kThreads), receivers(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    senders[t] = testing::MakeQp(pd_a_, cq_a_, 64);
    receivers[t] = testing::MakeQp(pd_b_, cq_b_, 64);
    ASSERT_EQ(testing::ToInit(senders[t]), 0);
    ASSERT_EQ(testing::ToInit(receivers[t]), 0);
    ASSERT_EQ(testing::ToRtr(senders[t], receivers[t]->qp_num, testing::Gid(ctx_b_)), 0);
    ASSERT_EQ(testing::ToRtr(receivers[t], senders[t]->qp_num, testing::Gid(ctx_a_)), 0);
    ASSERT_EQ(testing::ToRts(senders[t], 14, 7), 0);
    ASSERT_EQ(testing::ToRts(receivers[t], 14, 7), 0);
  }
  std::atomic<int> completions{0};
  std::atomic<int> failures{0};
  std::atomic<bool> posting{true};
  std::thread poller([&] {
    while (posting.load() || completions.load() < kThreads * kWrites) {
      ibv_wc wc[32];
      const int n = Api().poll_cq(cq_a_, 32, wc);
      for (int i = 0; i < n; ++i) {
        if (wc[i].status != IBV_WC_SUCCESS) failures.fetch_add(1);
      }
      completions.fetch_add(n > 0 ? n : 0);
      if (failures.load() > 0) return;
      if (n <= 0) absl::SleepFor(absl::Microseconds(50));
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kWrites; ++i) {
        const size_t off = (t * kWrites + i) % (kBytes / kEach) * kEach;
        ibv_sge sge{reinterpret_cast<uint64_t>(src_.data() + off), kEach, mr_src_->lkey};
        ibv_send_wr wr =
            Write(i, &sge, reinterpret_cast<uint64_t>(dst_.data() + off), mr_dst_->rkey);
        ibv_send_wr* bad = nullptr;
        while (Api().post_send(senders[t], &wr, &bad) == ENOMEM) {
          absl::SleepFor(absl::Microseconds(50));
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  posting.store(false);
  poller.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(completions.load(), kThreads * kWrites);
  EXPECT_EQ(std::memcmp(src_.data(), dst_.data(), kThreads * kWrites * kEach % kBytes), 0);
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_EQ(Api().destroy_qp(senders[t]), 0);
    ASSERT_EQ(Api().destroy_qp(receivers[t]), 0);
  }
}

// Not a bandwidth figure (this is software); it only guards against a gratuitously slow path.
TEST_F(Pair, OneMebibyteWritesMoveAtAUsefulRate) {
  constexpr int kRounds = 64;
  const absl::Time start = absl::Now();
  for (int r = 0; r < kRounds; ++r) {
    ASSERT_EQ(Post(r, (r % 4) << 20, 1 << 20), 0);
    const std::vector<ibv_wc> wcs = PollN(cq_a_, 1);
    ASSERT_EQ(wcs.size(), 1u);
    ASSERT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  const double gbs = kRounds * double(1 << 20) / seconds / 1e9;
  std::printf("softverbs: 1 MiB writes, one at a time: %.2f GB/s\n", gbs);
  EXPECT_EQ(std::memcmp(src_.data(), dst_.data(), kBytes), 0);
}

}  // namespace
}  // namespace kvrail::transport::softverbs
