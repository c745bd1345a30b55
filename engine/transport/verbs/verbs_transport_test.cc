// The verbs backend's own behaviour beyond the Transport contract (verbs_conformance_test): its
// descriptor, the connect exchange and what it refuses, chained posts longer than the send
// queue, error completions and the QP that replaces a failed one, and multi-rail: lanes weighted
// by link speed, a room striped over two rails, a rail that fails mid-room costing no room, and
// rows gathered by scatter-gather lists up to the device's max_sge.
// All over the software provider (softverbs), whose faults stand in for a NIC's.
#include "engine/transport/verbs/verbs_transport.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/transport/completion_recorder.h"
#include "engine/transport/verbs/softverbs/softverbs.h"
#include "engine/transport/verbs/verbs_connector.h"
#include "gtest/gtest.h"
#include "proto/kvrail/v1/verbs.pb.h"

namespace kvrail::transport {
namespace {

constexpr uint64_t kBytes = 8 << 20;

class VerbsTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    softverbs::ClearFaults();
    softverbs::SetRails({{.device = "softverbs0", .netdev = "lo", .gbps = 200},
                         {.device = "softverbs1", .netdev = "lo", .gbps = 100}});
  }
  void TearDown() override { softverbs::ClearFaults(); }

  static VerbsOptions Options(int lanes, std::vector<std::string> devices) {
    VerbsOptions options;
    options.api = &softverbs::SoftVerbsApi();
    options.lanes = lanes;
    options.devices = std::move(devices);
    options.qp_timeout = 12;  // a silent path fails within about 130 ms
    options.qp_retry_cnt = 7;
    options.rail_probe_after = absl::Milliseconds(200);
    return options;
  }

  // A sender and a receiver, each with `lanes` lanes over `devices`, kBytes registered on each
  // side, and the sender connected.
  void Pair(int lanes, std::vector<std::string> devices, VerbsOptions sender_options = {}) {
    if (sender_options.api == nullptr) sender_options = Options(lanes, devices);
    auto sender = VerbsTransport::Create(sender_options);
    ASSERT_TRUE(sender.ok()) << sender.status();
    sender_ = *std::move(sender);
    auto receiver = VerbsTransport::Create(Options(lanes, devices));
    ASSERT_TRUE(receiver.ok()) << receiver.status();
    receiver_ = *std::move(receiver);
    source_.resize(kBytes);
    for (size_t i = 0; i < source_.size(); ++i) source_[i] = static_cast<uint8_t>(i * 131 + 7);
    destination_.assign(kBytes, 0);
    source_region_ = sender_->Register({source_.data(), source_.size()}).value();
    ASSERT_TRUE(receiver_->Register({destination_.data(), destination_.size()}).ok());
    descriptor_ = receiver_->LocalDescriptor().value();
    auto peer = sender_->Connect(descriptor_);
    ASSERT_TRUE(peer.ok()) << peer.status();
    peer_ = *peer;
  }

  uint64_t Base() const { return reinterpret_cast<uint64_t>(destination_.data()); }

  // Posts kBytes in `chunks` batches of one write each, round-robin over every lane.
  void PostAll(int chunks, Recorder& recorder) {
    const uint64_t chunk = kBytes / chunks;
    const int lanes = sender_->capabilities().lanes;
    for (int c = 0; c < chunks; ++c) {
      const std::vector<Write> writes = {{c * chunk, Base() + c * chunk, chunk}};
      ASSERT_TRUE(
          sender_->PostWrites(peer_, c % lanes, source_region_, writes, recorder.Callback(c)).ok());
    }
  }

  // Posts `writes` as one batch on lane 0, flushes the lane, and expects both to succeed.
  void PostOnLaneZeroAndFlush(const std::vector<Write>& writes) {
    Recorder recorder(2);
    ASSERT_TRUE(sender_->PostWrites(peer_, 0, source_region_, writes, recorder.Callback(0)).ok());
    ASSERT_TRUE(sender_->Flush(peer_, 0, recorder.Callback(1)).ok());
    ASSERT_TRUE(recorder.WaitAll());
    EXPECT_TRUE(recorder.status(0).ok()) << recorder.status(0);
    EXPECT_TRUE(recorder.status(1).ok()) << recorder.status(1);
  }

  std::unique_ptr<VerbsTransport> sender_, receiver_;
  std::vector<uint8_t> source_, destination_;
  RegionId source_region_ = 0;
  PeerId peer_ = 0;
  v1::HandshakeDescriptor descriptor_;
};

TEST(AssignLanesToRails, WeighsRailsByLinkSpeed) {
  EXPECT_EQ(AssignLanesToRails(6, {400, 200}), (std::vector<int>{0, 1, 0, 0, 1, 0}));
  EXPECT_EQ(AssignLanesToRails(4, {100, 100}), (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(AssignLanesToRails(3, {0, 0, 0}), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(AssignLanesToRails(2, {100}), (std::vector<int>{0, 0}));
}

TEST_F(VerbsTransportTest, TheDescriptorNamesEachLanesRailAndOneRkeyPerRail) {
  Pair(3, {"softverbs0", "softverbs1"});
  EXPECT_EQ(receiver_->lane_rails(), (std::vector<int>{0, 1, 0}));  // 200 and 100 Gb/s
  ASSERT_EQ(descriptor_.lanes_size(), 3);
  for (int i = 0; i < 3; ++i) {
    v1::VerbsLaneAddress address;
    ASSERT_TRUE(address.ParseFromString(descriptor_.lanes(i).address()));
    EXPECT_EQ(address.provider(), "softverbs");
    EXPECT_EQ(address.rail(), static_cast<uint32_t>(receiver_->lane_rails()[i]));
    EXPECT_EQ(address.device(), i == 1 ? "softverbs1" : "softverbs0");
    EXPECT_EQ(address.gid().size(), 16u);
    EXPECT_EQ(address.gid_index(), 1u);  // the IPv4-mapped one, never the link-local index 0
    EXPECT_EQ(address.mtu_bytes(), 4096u);
    EXPECT_EQ(address.gbps(), i == 1 ? 100u : 200u);
    EXPECT_EQ(address.connect_endpoint().rfind("tcp://127.0.0.1:", 0), 0u)
        << address.connect_endpoint();
  }
  ASSERT_EQ(descriptor_.regions_size(), 1);
  EXPECT_EQ(descriptor_.regions(0).remote_key().size(), 8u);
}

TEST_F(VerbsTransportTest, ConnectRefusesAnotherProvidersLanesAndAShortRemoteKey) {
  Pair(2, {"softverbs0"});
  v1::HandshakeDescriptor other = descriptor_;
  v1::VerbsLaneAddress address;
  ASSERT_TRUE(address.ParseFromString(other.lanes(0).address()));
  address.set_provider("libibverbs");
  other.mutable_lanes(0)->set_address(address.SerializeAsString());
  auto refused = sender_->Connect(other);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("provider \"libibverbs\""), std::string::npos)
      << refused.status();

  v1::HandshakeDescriptor short_key = descriptor_;
  short_key.mutable_regions(0)->set_remote_key("abc");
  refused = sender_->Connect(short_key);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("3-byte remote key"), std::string::npos)
      << refused.status();

  v1::HandshakeDescriptor garbage = descriptor_;
  garbage.mutable_lanes(1)->set_address("not a lane");
  EXPECT_EQ(sender_->Connect(garbage).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(VerbsTransportTest, ABatchLongerThanTheSendQueueIsPostedAsCompletionsFreeRoom) {
  VerbsOptions options = Options(1, {"softverbs0"});
  options.max_send_wr = 4;
  Pair(1, {"softverbs0"}, options);
  // 512 writes of 16 KiB in one batch: 128 doorbells of 4 work requests.
  std::vector<Write> writes;
  for (uint64_t i = 0; i < 512; ++i) writes.push_back({i * 16384, Base() + i * 16384, 16384});
  PostOnLaneZeroAndFlush(writes);
  EXPECT_EQ(destination_, source_);
}

// A source-strided write landing as contiguous bytes is one RDMA write with a scatter-gather
// list: as many entries as asked (max_send_sge) and the device takes (the software provider
// says 16, and refuses a work request of more); longer batches of them post as completions
// free room in the send queue, and every row lands in order.
TEST_F(VerbsTransportTest, RowsGoAsScatterGatherListsCappedByTheDevicesMaxSge) {
  {
    auto asked_too_much = VerbsTransport::Create(Options(1, {"softverbs0"}));
    ASSERT_TRUE(asked_too_much.ok()) << asked_too_much.status();
    EXPECT_EQ((*asked_too_much)->capabilities().max_gather_rows, 16u);  // 30 asked, 16 offered
    EXPECT_FALSE((*asked_too_much)->capabilities().strided_writes);
    VerbsOptions none = Options(1, {"softverbs0"});
    none.max_send_sge = 0;
    const absl::Status refused = VerbsTransport::Create(none).status();
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(refused.message().find("max_send_sge must be >= 1"), std::string::npos) << refused;
  }
  VerbsOptions options = Options(1, {"softverbs0"});
  options.max_send_sge = 4;
  options.max_send_wr = 4;
  Pair(1, {"softverbs0"}, options);
  ASSERT_EQ(sender_->capabilities().max_gather_rows, 4u);
  // 1024 rows of 1 KiB, the source's every other KiB, back to back at the peer: 256 writes of
  // 4 entries, 64 doorbells of 4 work requests.
  constexpr uint64_t kRow = 1024;
  std::vector<Write> writes;
  for (uint64_t r = 0; r < 1024; r += 4) {
    writes.push_back({.local_offset = 2 * r * kRow,
                      .remote_address = Base() + r * kRow,
                      .length = kRow,
                      .rows = 4,
                      .local_stride = 2 * kRow,
                      .remote_stride = kRow});
  }
  PostOnLaneZeroAndFlush(writes);
  for (uint64_t r = 0; r < 1024; ++r) {
    ASSERT_EQ(std::memcmp(&destination_[r * kRow], &source_[2 * r * kRow], kRow), 0) << r;
  }
  EXPECT_TRUE(std::all_of(destination_.begin() + 1024 * kRow, destination_.end(),
                          [](uint8_t b) { return b == 0; }));
}

TEST_F(VerbsTransportTest, AnErrorCompletionFailsItsBatchNamingTheStatusAndANewQpCarriesOn) {
  Pair(1, {"softverbs0"});
  softverbs::InjectFault(
      {.kind = softverbs::FaultKind::kErrorCompletion, .count = 1, .status = IBV_WC_REM_OP_ERR});
  Recorder first(2);
  const std::vector<Write> one = {{0, Base(), 4096}};
  ASSERT_TRUE(sender_->PostWrites(peer_, 0, source_region_, one, first.Callback(0)).ok());
  ASSERT_TRUE(sender_->Flush(peer_, 0, first.Callback(1)).ok());
  ASSERT_TRUE(first.WaitAll());
  EXPECT_EQ(first.status(0).code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(first.status(0).message().find("remote operation error"), std::string::npos)
      << first.status(0);
  EXPECT_NE(first.status(0).message().find("softverbs0 lane 0"), std::string::npos)
      << first.status(0);
  EXPECT_EQ(first.status(1).code(), absl::StatusCode::kUnavailable) << first.status(1);
  // The QP was replaced: the next batch lands.
  Recorder second(2);
  const std::vector<Write> all = {{0, Base(), kBytes}};
  ASSERT_TRUE(sender_->PostWrites(peer_, 0, source_region_, all, second.Callback(0)).ok());
  ASSERT_TRUE(sender_->Flush(peer_, 0, second.Callback(1)).ok());
  ASSERT_TRUE(second.WaitAll());
  EXPECT_TRUE(second.status(0).ok()) << second.status(0);
  EXPECT_TRUE(second.status(1).ok()) << second.status(1);
  EXPECT_EQ(destination_, source_);
}

TEST_F(VerbsTransportTest, ARoomStripedOverTwoRailsLandsByteExact) {
  Pair(4, {"softverbs0", "softverbs1"});
  EXPECT_EQ(sender_->lane_rails(), (std::vector<int>{0, 1, 0, 0}));  // 200 and 100 Gb/s
  Recorder recorder(64);
  PostAll(64, recorder);
  ASSERT_TRUE(recorder.WaitAll());
  for (int c = 0; c < 64; ++c) EXPECT_TRUE(recorder.status(c).ok()) << c << recorder.status(c);
  EXPECT_EQ(destination_, source_);
  EXPECT_EQ(sender_->failovers(), 0u);
}

TEST_F(VerbsTransportTest, ARailFailingMidRoomCostsNoRoomOnlyItsRetry) {
  Pair(2, {"softverbs0", "softverbs1"});
  Recorder recorder(64);
  PostAll(64, recorder);
  // The cable of rail 1 is cut while the room is in flight (both ends: one process here).
  softverbs::InjectFault({.kind = softverbs::FaultKind::kRailDown, .device = "softverbs1"});
  ASSERT_TRUE(recorder.WaitAll());
  for (int c = 0; c < 64; ++c) EXPECT_TRUE(recorder.status(c).ok()) << c << recorder.status(c);
  EXPECT_EQ(destination_, source_);
  EXPECT_GE(sender_->failovers(), 1u);
  EXPECT_EQ(sender_->rails_in_rotation(), (std::vector<int>{0}));
  // Lane 1 now writes over rail 0.
  std::fill(destination_.begin(), destination_.end(), 0);
  Recorder again(2);
  const std::vector<Write> all = {{0, Base(), kBytes}};
  ASSERT_TRUE(sender_->PostWrites(peer_, 1, source_region_, all, again.Callback(0)).ok());
  ASSERT_TRUE(sender_->Flush(peer_, 1, again.Callback(1)).ok());
  ASSERT_TRUE(again.WaitAll());
  EXPECT_TRUE(again.status(0).ok()) << again.status(0);
  EXPECT_EQ(destination_, source_);
}

TEST_F(VerbsTransportTest, AFailedRailIsProbedBackIntoRotationOnceItsLinkIsBack) {
  Pair(2, {"softverbs0", "softverbs1"});
  softverbs::InjectFault({.kind = softverbs::FaultKind::kRailDown, .device = "softverbs1"});
  Recorder down(1);
  const std::vector<Write> all = {{0, Base(), kBytes}};
  ASSERT_TRUE(sender_->PostWrites(peer_, 1, source_region_, all, down.Callback(0)).ok());
  ASSERT_TRUE(down.WaitAll());
  EXPECT_TRUE(down.status(0).ok()) << down.status(0);
  EXPECT_EQ(sender_->rails_in_rotation(), (std::vector<int>{0}));
  softverbs::InjectFault(
      {.kind = softverbs::FaultKind::kRailDown, .device = "softverbs1", .down = false});
  // Lane 1's idle QP moves back to rail 1 once the backoff has passed, and its next completion
  // puts the rail back into rotation.
  std::vector<int> rotation;
  for (int attempt = 0; attempt < 100; ++attempt) {
    absl::SleepFor(absl::Milliseconds(50));
    Recorder probe(1);
    ASSERT_TRUE(sender_->PostWrites(peer_, 1, source_region_, all, probe.Callback(0)).ok());
    ASSERT_TRUE(probe.WaitAll());
    EXPECT_TRUE(probe.status(0).ok()) << probe.status(0);
    rotation = sender_->rails_in_rotation();
    if (rotation.size() == 2) break;
  }
  EXPECT_EQ(rotation, (std::vector<int>{0, 1}));
}

TEST_F(VerbsTransportTest, WithOneRailAPathFailureFailsTheBatchesAtOnce) {
  Pair(1, {"softverbs0"});
  softverbs::InjectFault({.kind = softverbs::FaultKind::kRailDown, .device = "softverbs0"});
  Recorder recorder(2);
  const std::vector<Write> one = {{0, Base(), 4096}};
  ASSERT_TRUE(sender_->PostWrites(peer_, 0, source_region_, one, recorder.Callback(0)).ok());
  ASSERT_TRUE(sender_->Flush(peer_, 0, recorder.Callback(1)).ok());
  ASSERT_TRUE(recorder.WaitAll());
  EXPECT_EQ(recorder.status(0).code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(recorder.status(0).message().find("IBV_WC_RETRY_EXC_ERR"), std::string::npos)
      << recorder.status(0);
  EXPECT_TRUE(
      std::all_of(destination_.begin(), destination_.end(), [](uint8_t b) { return b == 0; }));
}

// A peer that is not a verbs transport, with a plain socket: every malformed request is
// answered with one line naming the rule, creates nothing, and a real Connect still works.
TEST_F(VerbsTransportTest, HostileConnectRequestsAreRefusedAndChangeNothing) {
  Pair(1, {"softverbs0"});
  v1::VerbsLaneAddress address;
  ASSERT_TRUE(address.ParseFromString(descriptor_.lanes(0).address()));
  zmq::context_t context(1);
  zmq::socket_t dealer(context, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.set(zmq::sockopt::rcvtimeo, 5000);
  dealer.connect(address.connect_endpoint());
  auto ask = [&](std::vector<std::string> frames) -> std::string {
    std::vector<zmq::const_buffer> buffers;
    for (const std::string& f : frames) buffers.push_back(zmq::buffer(f.data(), f.size()));
    EXPECT_TRUE(zmq::send_multipart(dealer, buffers).has_value());
    std::vector<zmq::message_t> reply;
    EXPECT_TRUE(zmq::recv_multipart(dealer, std::back_inserter(reply)).has_value());
    if (reply.size() != 2) return "no reply";
    v1::VerbsConnectReply parsed;
    EXPECT_TRUE(parsed.ParseFromArray(reply[1].data(), static_cast<int>(reply[1].size())));
    EXPECT_EQ(parsed.qps_size(), 0);
    return parsed.error();
  };
  EXPECT_NE(ask({"hello"}).find("expected 2 frames"), std::string::npos);
  EXPECT_NE(ask({kVerbsConnectMagic, "\xff\xff garbage"}).find("not a VerbsConnectMessage"),
            std::string::npos);
  v1::VerbsConnectMessage message;
  message.mutable_connect()->set_provider("softverbs");
  message.mutable_connect()->set_connection_id("x");
  EXPECT_NE(ask({kVerbsConnectMagic, message.SerializeAsString()}).find("1 to 64 QPs"),
            std::string::npos);
  message.mutable_connect()->set_provider("libibverbs");
  EXPECT_NE(ask({kVerbsConnectMagic, message.SerializeAsString()}).find("provider"),
            std::string::npos);
  message.mutable_connect()->set_provider("softverbs");
  v1::VerbsQpInfo* qp = message.mutable_connect()->add_qps();
  qp->set_gid("short");
  EXPECT_NE(ask({kVerbsConnectMagic, message.SerializeAsString()}).find("16 bytes"),
            std::string::npos);
  // The real peer is still served, and writes land.
  Recorder recorder(1);
  const std::vector<Write> all = {{0, Base(), kBytes}};
  ASSERT_TRUE(sender_->PostWrites(peer_, 0, source_region_, all, recorder.Callback(0)).ok());
  ASSERT_TRUE(recorder.WaitAll());
  EXPECT_TRUE(recorder.status(0).ok()) << recorder.status(0);
  EXPECT_EQ(destination_, source_);
}

TEST_F(VerbsTransportTest, ConnectionsBeyondTheLimitAreRefusedNamingIt) {
  VerbsOptions options = Options(2, {"softverbs0"});
  options.max_connections = 2;  // one Connect of a 2-lane peer
  auto receiver = VerbsTransport::Create(options).value();
  auto first = VerbsTransport::Create(Options(2, {"softverbs0"})).value();
  auto second = VerbsTransport::Create(Options(2, {"softverbs0"})).value();
  std::vector<uint8_t> bytes(4096);
  ASSERT_TRUE(receiver->Register({bytes.data(), bytes.size()}).ok());
  const v1::HandshakeDescriptor descriptor = receiver->LocalDescriptor().value();
  ASSERT_TRUE(first->Connect(descriptor).ok());
  auto refused = second->Connect(descriptor);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("max_connections"), std::string::npos)
      << refused.status();
}

// A decode that found a prefill gone refuses what it sent before it went (RefuseWriter): its
// responder QPs are destroyed, so a write still coming on them lands nowhere and fails at the
// writer; a connection the same writer makes afterwards (a restarted rank) lands.
TEST_F(VerbsTransportTest, ARefusedWritersQpsTakeNothingMore) {
  VerbsOptions named = Options(2, {"softverbs0"});
  named.writer_name = "tcp://10.9.0.1:7000";
  named.max_attempts = 1;  // a failed batch is not sent again on a new QP
  Pair(2, {"softverbs0"}, named);
  EXPECT_TRUE(receiver_->capabilities().refuses_writers);
  PostOnLaneZeroAndFlush({{0, Base(), 4096}});
  EXPECT_EQ(receiver_->RefuseWriter("tcp://10.9.0.2:7000").value(), 0u);
  EXPECT_EQ(receiver_->RefuseWriter("tcp://10.9.0.1:7000").value(), 2u);  // a QP per lane
  Recorder refused(2);
  ASSERT_TRUE(
      sender_
          ->PostWrites(peer_, 0, source_region_, {{8192, Base() + 8192, 4096}}, refused.Callback(0))
          .ok());
  ASSERT_TRUE(sender_->Flush(peer_, 0, refused.Callback(1)).ok());
  ASSERT_TRUE(refused.WaitAll());
  EXPECT_EQ(refused.status(0).code(), absl::StatusCode::kUnavailable) << refused.status(0);
  EXPECT_TRUE(std::all_of(destination_.begin() + 8192, destination_.begin() + 12288,
                          [](uint8_t b) { return b == 0; }));
  EXPECT_TRUE(std::equal(source_.begin(), source_.begin() + 4096, destination_.begin()));
  // The writer's next batch goes on a new QP, a connection made after the refusal: it lands.
  PostOnLaneZeroAndFlush({{16384, Base() + 16384, 4096}});
  EXPECT_TRUE(
      std::equal(source_.begin() + 16384, source_.begin() + 20480, destination_.begin() + 16384));
}

// The sysfs fixture of an 8-GPU, 8-NIC node (testdata/sysfs_8gpu_8nic), with software rails
// named as its NICs: a transport given a GPU's affinity opens only the NIC on that GPU's switch.
TEST_F(VerbsTransportTest, AGpuArenasTransportUsesTheNicOnItsPcieSwitch) {
  std::vector<softverbs::Rail> rails;
  for (int i = 0; i <= 8; ++i) rails.push_back({.device = absl::StrCat("mlx5_", i)});
  softverbs::SetRails(rails);
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  ASSERT_NE(srcdir, nullptr);
  VerbsOptions options = Options(2, {});
  options.sysfs_root = absl::StrCat(srcdir, "/", workspace != nullptr ? workspace : "kvrail",
                                    "/engine/transport/verbs/testdata/sysfs_8gpu_8nic");
  options.rail_affinity = "gpu:0000:3a:00.0";
  auto gpu2 = VerbsTransport::Create(options);
  ASSERT_TRUE(gpu2.ok()) << gpu2.status();
  EXPECT_EQ((*gpu2)->rail_devices(), (std::vector<std::string>{"mlx5_2"}));
  options.rail_affinity = "numa:1";
  auto host = VerbsTransport::Create(options);
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_EQ((*host)->rail_devices(),
            (std::vector<std::string>{"mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7"}));
  options.rail_affinity = "gpu:0000:77:00.0";
  EXPECT_EQ(VerbsTransport::Create(options).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(VerbsTransportTest, GpuMemoryIsRefusedNamingWhyWhereNoPathReachesIt) {
  auto transport = VerbsTransport::Create(Options(1, {"softverbs0"})).value();
  EXPECT_FALSE(transport->capabilities().gpu_memory);
  std::vector<uint8_t> bytes(4096);
  auto refused = transport->Register({bytes.data(), bytes.size(), /*cuda=*/true});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("cannot register GPU memory"), std::string::npos)
      << refused.status();
  EXPECT_NE(refused.status().message().find("stages GPU arenas through host memory"),
            std::string::npos)
      << refused.status();
}

}  // namespace
}  // namespace kvrail::transport
