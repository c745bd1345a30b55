// kvrail's active-message write protocol, both ends, without UCX: a writer's messages are
// handed to a target in this process, as a lane's thread would hand them over.
#include "engine/transport/ucx/am_protocol.h"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvrail::transport::am {
namespace {

// Registered memory at the target: one buffer at a fixed fake address.
class FakeMemory final : public AmLanding {
 public:
  static constexpr uint64_t kBase = 0x10000;
  explicit FakeMemory(size_t length) : bytes_(length, std::byte{0}) {}

  bool Registered(uint64_t address, uint64_t length) const override {
    return registered_ && address >= kBase && length <= bytes_.size() &&
           address - kBase <= bytes_.size() - length;
  }
  void CopyRows(uint64_t address, uint64_t stride, const std::byte* bytes, uint64_t length,
                uint64_t rows) override {
    ASSERT_GE(rows, 1u);
    ASSERT_TRUE(rows == 1 || stride >= length) << "rows overlap";  // as MeasureRows allows
    ASSERT_TRUE(Registered(address, (rows - 1) * stride + length));
    for (uint64_t row = 0; row < rows; ++row) {
      std::memcpy(bytes_.data() + (address - kBase) + row * stride, bytes + row * length, length);
    }
    ++copies_;
    fenced_ = false;
  }
  void Fence() override { fenced_ = true; }

  void Deregister() { registered_ = false; }
  std::string Read(uint64_t address, size_t length) const {
    return std::string(reinterpret_cast<const char*>(bytes_.data() + (address - kBase)), length);
  }
  int copies() const { return copies_; }
  bool fenced() const { return fenced_; }

 private:
  std::vector<std::byte> bytes_;
  bool registered_ = true;
  int copies_ = 0;
  bool fenced_ = true;
};

// One writer lane, one target lane, and the wire between them: each message the writer plans
// is encoded as the UCX glue sends it (header, then payload), and handed to the target.
class AmLink {
 public:
  explicit AmLink(uint64_t slice, size_t memory = 1 << 16)
      : slice_(slice), writer_(0xfeed), landing_(memory) {}

  // Sends a batch from `source` as messages; returns how many.
  size_t SendBatch(const std::string& source, const std::vector<Write>& writes) {
    PlanMessages(writes, slice_, &plan_);
    for (const AmMessage& message : plan_) {
      const AmHeader header = writer_.WriteHeader(message, writes);
      std::vector<std::byte> payload;
      if (message.id == kWritesAm) {
        for (size_t k = message.first; k < message.end; ++k) {
          const PackedWrite entry{writes[k].remote_address, writes[k].length};
          Append(payload, &entry, sizeof(entry));
        }
        for (size_t k = message.first; k < message.end; ++k) {
          Append(payload, source.data() + writes[k].local_offset, writes[k].length);
        }
        target_.OnWrites(header, payload.data(), payload.size(), true, landing_, Replier());
      } else if (message.id == kRowsAm) {
        const Write& w = writes[message.first];
        const PackedRows rows{message.length, w.length};
        Append(payload, &rows, sizeof(rows));
        for (uint64_t r = message.row; r < message.row + message.length; ++r) {
          Append(payload, source.data() + w.local_offset + r * w.local_stride, w.length);
        }
        target_.OnRows(header, payload.data(), payload.size(), true, landing_, Replier());
      } else {
        const Write& w = writes[message.first];
        Append(payload,
               source.data() + w.local_offset + message.row * w.local_stride + message.offset,
               message.length);
        target_.OnWrite(header, payload.data(), payload.size(), true, landing_, Replier());
      }
      writer_.Sent();
    }
    return plan_.size();
  }

  // Sends a flush; its number.
  uint64_t SendFlush() {
    const AmHeader flush = writer_.NextFlush();
    target_.OnFlush(flush, Replier());
    return flush.b;
  }

  // The writer's hello, as the UCX glue sends it on a new connection.
  void SendHello(const std::string& name) {
    target_.OnHello(AmHeader{.token = writer_.token()},
                    reinterpret_cast<const std::byte*>(name.data()), name.size());
  }

  const std::vector<FlushReply>& replies() const { return replies_; }
  AmWriter& writer() { return writer_; }
  AmTarget& target() { return target_; }
  FakeMemory& landing() { return landing_; }
  const std::vector<AmMessage>& plan() const { return plan_; }
  const Reply* Replier() { return &reply_; }

 private:
  static void Append(std::vector<std::byte>& out, const void* data, size_t length) {
    const auto* bytes = static_cast<const std::byte*>(data);
    out.insert(out.end(), bytes, bytes + length);
  }

  uint64_t slice_;
  AmWriter writer_;
  AmTarget target_;
  FakeMemory landing_;
  std::vector<AmMessage> plan_;
  std::vector<FlushReply> replies_;
  std::function<void(const FlushReply&)> record_ = [this](const FlushReply& r) {
    replies_.push_back(r);
  };
  Reply reply_{record_};
};

constexpr uint64_t kBase = FakeMemory::kBase;

// ---------------------------------------------------------------------------------------------
// The codec.

TEST(AmCodecTest, AHeaderIsReadOnlyFromItsOwnLength) {
  const AmHeader sent{.token = 7, .a = 0x1234, .b = 9};
  AmHeader read;
  ASSERT_TRUE(ReadHeader(&sent, sizeof(sent), &read));
  EXPECT_EQ(read.token, 7u);
  EXPECT_EQ(read.a, 0x1234u);
  EXPECT_EQ(read.b, 9u);
  FlushReply reply;
  EXPECT_FALSE(ReadHeader(&sent, sizeof(sent), &reply));
  EXPECT_FALSE(ReadHeader(&sent, sizeof(sent) - 1, &read));
}

TEST(AmCodecTest, AHeaderIsReadFromUnalignedBytes) {
  alignas(8) std::byte buffer[sizeof(FlushReply) + 1];
  const FlushReply sent{
      .token = 1, .seq = 2, .refused = 1, .refused_address = 3, .refused_length = 4};
  std::memcpy(buffer + 1, &sent, sizeof(sent));
  FlushReply read;
  ASSERT_TRUE(ReadHeader(buffer + 1, sizeof(sent), &read));
  EXPECT_EQ(read.seq, 2u);
  EXPECT_EQ(read.refused_length, 4u);
}

// ---------------------------------------------------------------------------------------------
// The writer's side: how a batch becomes messages.

TEST(AmPlanTest, ALargeWriteIsSlicedInOrder) {
  std::vector<AmMessage> plan;
  PlanMessages({Write{.local_offset = 0, .remote_address = kBase, .length = 2500}}, 1000, &plan);
  ASSERT_EQ(plan.size(), 3u);
  EXPECT_EQ(plan[0].offset, 0u);
  EXPECT_EQ(plan[1].offset, 1000u);
  EXPECT_EQ(plan[2].offset, 2000u);
  EXPECT_EQ(plan[2].length, 500u);
  for (const AmMessage& m : plan) EXPECT_EQ(m.id, kWriteAm);
}

TEST(AmPlanTest, SmallNeighboursShareOneMessageWithTheirEntries) {
  // slice 1024: writes of at most 128 bytes pack; each costs its bytes and a 16-byte entry.
  std::vector<Write> writes;
  for (int i = 0; i < 4; ++i) {
    writes.push_back({.local_offset = 100u * i, .remote_address = kBase + 100u * i, .length = 100});
  }
  std::vector<AmMessage> plan;
  PlanMessages(writes, 1024, &plan);
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0].id, kWritesAm);
  EXPECT_EQ(plan[0].first, 0u);
  EXPECT_EQ(plan[0].end, 4u);
  // Five pieces (the entry table and four writes): packed by the writer, entries and bytes.
  EXPECT_EQ(GatherPieces(plan[0], writes), 5u);
  EXPECT_TRUE(PackedBeforeSending(plan[0], writes));
  const PlanSizes sizes = SizesOf(plan, writes);
  EXPECT_EQ(sizes.headers, 1u);
  EXPECT_EQ(sizes.packed_bytes, 4 * sizeof(PackedWrite) + 400);
  EXPECT_EQ(sizes.rows, 0u);
  EXPECT_EQ(sizes.gather, 0u);
}

// The bytes a writer packs for a message are those its gather list would have sent: entries,
// then each write's bytes; PackedRows, then each row from its source stride.
TEST(AmPlanTest, APackedPayloadIsWhatItsGatherListWouldSend) {
  std::string source(8192, '\0');
  for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<char>(i * 7 + i / 251);
  const auto* base = reinterpret_cast<const std::byte*>(source.data());
  const auto append = [](std::vector<std::byte>& out, const void* data, size_t length) {
    const auto* bytes = static_cast<const std::byte*>(data);
    out.insert(out.end(), bytes, bytes + length);
  };

  // Small writes sharing a kWritesAm.
  std::vector<Write> small;
  for (uint64_t i = 0; i < 3; ++i) {
    small.push_back(
        {.local_offset = 300 * i + 5, .remote_address = kBase + 1000 * i, .length = 90 + i});
  }
  std::vector<AmMessage> plan;
  PlanMessages(small, 1024, &plan);
  ASSERT_EQ(plan.size(), 1u);
  ASSERT_EQ(plan[0].id, kWritesAm);
  std::vector<std::byte> expected;
  for (const Write& w : small) {
    const PackedWrite entry{w.remote_address, w.length};
    append(expected, &entry, sizeof(entry));
  }
  for (const Write& w : small) append(expected, base + w.local_offset, w.length);
  ASSERT_EQ(PayloadBytes(plan[0], small), expected.size());
  std::vector<std::byte> packed(expected.size());
  PackPayload(plan[0], small, base, packed.data());
  EXPECT_EQ(packed, expected);

  // Rows whose source is strided (a prefill of the smaller TP): 10 rows of 64 bytes, 160
  // apart at the source, cut at 6 rows a message by a slice of 6 rows and a PackedRows.
  const std::vector<Write> strided = {{.local_offset = 40,
                                       .remote_address = kBase,
                                       .length = 64,
                                       .rows = 10,
                                       .local_stride = 160,
                                       .remote_stride = 128}};
  PlanMessages(strided, sizeof(PackedRows) + 6 * 64, &plan);
  ASSERT_EQ(plan.size(), 2u);
  for (const AmMessage& message : plan) {
    ASSERT_EQ(message.id, kRowsAm);
    EXPECT_TRUE(PackedBeforeSending(message, strided));
    EXPECT_EQ(GatherPieces(message, strided), 1 + message.length);
    expected.clear();
    const PackedRows rows{message.length, 64};
    append(expected, &rows, sizeof(rows));
    for (uint64_t r = message.row; r < message.row + message.length; ++r) {
      append(expected, base + 40 + r * 160, 64);
    }
    ASSERT_EQ(PayloadBytes(message, strided), expected.size());
    packed.assign(expected.size(), std::byte{0});
    PackPayload(message, strided, base, packed.data());
    EXPECT_EQ(packed, expected) << "the message from row " << message.row;
  }
  EXPECT_EQ(SizesOf(plan, strided).packed_bytes, 2 * sizeof(PackedRows) + 10 * 64);

  // Rows contiguous at the source (a prefill of the larger TP): two pieces, sent in place.
  const std::vector<Write> contiguous = {{.local_offset = 0,
                                          .remote_address = kBase,
                                          .length = 64,
                                          .rows = 10,
                                          .local_stride = 64,
                                          .remote_stride = 128}};
  PlanMessages(contiguous, 4096, &plan);
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(GatherPieces(plan[0], contiguous), 2u);
  EXPECT_FALSE(PackedBeforeSending(plan[0], contiguous));
  const PlanSizes sizes = SizesOf(plan, contiguous);
  EXPECT_EQ(sizes.packed_bytes, 0u);
  EXPECT_EQ(sizes.rows, 1u);
  EXPECT_EQ(sizes.gather, 2u);
}

TEST(AmPlanTest, APackedMessageNeverPassesTheSlice) {
  // 116 bytes + 16 of entry: 7 writes fill 924 of 1024; the eighth would pass it.
  std::vector<Write> writes;
  for (int i = 0; i < 9; ++i) {
    writes.push_back({.local_offset = 0, .remote_address = kBase + 128u * i, .length = 116});
  }
  std::vector<AmMessage> plan;
  PlanMessages(writes, 1024, &plan);
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].end - plan[0].first, 7u);
  EXPECT_EQ(plan[1].first, 7u);
  EXPECT_EQ(plan[1].end, 9u);
  EXPECT_EQ(plan[1].id, kWritesAm);
}

TEST(AmPlanTest, ALoneSmallWriteAndALargeOneGoAsPlainWrites) {
  std::vector<AmMessage> plan;
  PlanMessages({Write{.local_offset = 0, .remote_address = kBase, .length = 10},
                Write{.local_offset = 0, .remote_address = kBase + 64, .length = 900}},
               1024, &plan);
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].id, kWriteAm);
  EXPECT_EQ(plan[0].length, 10u);
  EXPECT_EQ(plan[1].id, kWriteAm);
  EXPECT_EQ(plan[1].first, 1u);
}

TEST(AmWriterTest, AFlushCountsEveryMessageSentAndIsNumberedFromOne) {
  AmWriter writer(42);
  writer.Sent();
  writer.Sent();
  const AmHeader first = writer.NextFlush();
  EXPECT_EQ(first.token, 42u);
  EXPECT_EQ(first.a, 2u);
  EXPECT_EQ(first.b, 1u);
  writer.Sent();
  const AmHeader second = writer.NextFlush();
  EXPECT_EQ(second.a, 3u);
  EXPECT_EQ(second.b, 2u);
}

TEST(AmWriterTest, AFlushReplyWithARefusalIsUnavailableNamingTheWrite) {
  EXPECT_TRUE(FlushReplyStatus(FlushReply{.token = 1, .seq = 1}, 3, 1).ok());
  const absl::Status refused = FlushReplyStatus(
      FlushReply{.seq = 1, .refused = 1, .refused_address = 0x2000, .refused_length = 64}, 3, 1);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(refused.message().find("peer 3 lane 1"), std::string::npos) << refused;
  EXPECT_NE(refused.message().find("64 bytes at 0x2000"), std::string::npos) << refused;
}

// ---------------------------------------------------------------------------------------------
// Both ends.

TEST(AmProtocolTest, WritesLandAndTheFlushAfterThemIsAnsweredOk) {
  AmLink link(1024);
  const std::string source = std::string(3000, 'x') + "abcdefgh";
  link.SendBatch(source,
                 {Write{.local_offset = 0, .remote_address = kBase, .length = 3000},
                  Write{.local_offset = 3000, .remote_address = kBase + 4000, .length = 4},
                  Write{.local_offset = 3004, .remote_address = kBase + 5000, .length = 4}});
  const uint64_t seq = link.SendFlush();
  ASSERT_EQ(link.replies().size(), 1u);
  EXPECT_EQ(link.replies()[0].seq, seq);
  EXPECT_EQ(link.replies()[0].refused, 0u);
  EXPECT_EQ(link.landing().Read(kBase, 3000), std::string(3000, 'x'));
  EXPECT_EQ(link.landing().Read(kBase + 4000, 4), "abcd");
  EXPECT_EQ(link.landing().Read(kBase + 5000, 4), "efgh");
  EXPECT_TRUE(link.landing().fenced());
}

TEST(AmProtocolTest, AFlushThatOvertakesItsWritesIsAnsweredOnceTheyAreHandled) {
  AmLink link(1024);
  // The flush counts two messages the target has not seen yet.
  link.target().OnFlush(AmHeader{.token = link.writer().token(), .a = 2, .b = 1}, link.Replier());
  EXPECT_TRUE(link.replies().empty());
  const std::string source(10, 'y');
  link.SendBatch(source, {Write{.local_offset = 0, .remote_address = kBase, .length = 10}});
  EXPECT_TRUE(link.replies().empty());
  link.SendBatch(source, {Write{.local_offset = 0, .remote_address = kBase + 10, .length = 10}});
  ASSERT_EQ(link.replies().size(), 1u);
  EXPECT_EQ(link.replies()[0].seq, 1u);
}

TEST(AmProtocolTest, AWriteOutsideRegisteredMemoryIsRefusedAndTheNextFlushSaysSo) {
  AmLink link(1024, /*memory=*/256);
  const std::string source(64, 'z');
  link.SendBatch(source, {Write{.local_offset = 0, .remote_address = kBase + 224, .length = 64}});
  EXPECT_EQ(link.landing().copies(), 0);
  link.SendFlush();
  ASSERT_EQ(link.replies().size(), 1u);
  EXPECT_EQ(link.replies()[0].refused, 1u);
  EXPECT_EQ(link.replies()[0].refused_address, kBase + 224);
  EXPECT_EQ(link.replies()[0].refused_length, 64u);
}

TEST(AmProtocolTest, ARefusalIsReportedOnceThenForgotten) {
  AmLink link(1024, 256);
  const std::string source(64, 'z');
  link.SendBatch(source, {Write{.local_offset = 0, .remote_address = kBase + 1000, .length = 8}});
  link.SendFlush();
  link.SendBatch(source, {Write{.local_offset = 0, .remote_address = kBase, .length = 8}});
  link.SendFlush();
  ASSERT_EQ(link.replies().size(), 2u);
  EXPECT_EQ(link.replies()[0].refused, 1u);
  EXPECT_EQ(link.replies()[1].refused, 0u);
}

TEST(AmProtocolTest, TheFirstRefusalSinceTheLastAnswerIsTheOneNamed) {
  AmLink link(1024, 256);
  const std::string source(300, 'z');
  link.SendBatch(source, {Write{.local_offset = 0, .remote_address = kBase + 1000, .length = 8},
                          Write{.local_offset = 0, .remote_address = kBase + 2000, .length = 300}});
  link.SendFlush();
  ASSERT_EQ(link.replies().size(), 1u);
  EXPECT_EQ(link.replies()[0].refused_address, kBase + 1000);
}

TEST(AmProtocolTest, AWriteIntoDeregisteredMemoryIsRefused) {
  AmLink link(1024);
  link.landing().Deregister();
  const std::string source(8, 'q');
  link.SendBatch(source, {Write{.local_offset = 0, .remote_address = kBase, .length = 8}});
  link.SendFlush();
  EXPECT_EQ(link.landing().copies(), 0);
  ASSERT_EQ(link.replies().size(), 1u);
  EXPECT_EQ(link.replies()[0].refused, 1u);
}

TEST(AmProtocolTest, APackedMessageLandsEachGoodRowAndRefusesTheBadOne) {
  AmLink link(1024, 256);
  const std::string source = "aaaabbbbcccc";
  link.SendBatch(source, {Write{.local_offset = 0, .remote_address = kBase, .length = 4},
                          Write{.local_offset = 4, .remote_address = kBase + 4096, .length = 4},
                          Write{.local_offset = 8, .remote_address = kBase + 8, .length = 4}});
  ASSERT_EQ(link.plan().size(), 1u);
  ASSERT_EQ(link.plan()[0].id, kWritesAm);
  link.SendFlush();
  EXPECT_EQ(link.landing().Read(kBase, 4), "aaaa");
  EXPECT_EQ(link.landing().Read(kBase + 8, 4), "cccc");
  ASSERT_EQ(link.replies().size(), 1u);
  EXPECT_EQ(link.replies()[0].refused_address, kBase + 4096);
}

// A strided write (rows of a head-sliced page) goes as rows messages of as many whole rows as
// fit the slice with their PackedRows, and every row lands at its stride; a row longer than a
// message goes row by row in slices.
TEST(AmProtocolTest, AStridedWriteGoesAsRowsMessagesAndLandsEveryRow) {
  AmLink link(16 + 3 * 4, 256);  // three 4-byte rows a message
  const std::string source = "aaaabbbbccccddddeeee";
  link.SendBatch(source, {Write{.local_offset = 0,
                                .remote_address = kBase,
                                .length = 4,
                                .rows = 5,
                                .local_stride = 4,
                                .remote_stride = 8}});
  ASSERT_EQ(link.plan().size(), 2u);
  EXPECT_EQ(link.plan()[0].id, kRowsAm);
  EXPECT_EQ(link.plan()[0].length, 3u);
  EXPECT_EQ(link.plan()[1].row, 3u);
  EXPECT_EQ(link.plan()[1].length, 2u);
  link.SendFlush();
  EXPECT_EQ(link.landing().Read(kBase, 40),
            std::string("aaaa\0\0\0\0bbbb\0\0\0\0cccc\0\0\0\0dddd\0\0\0\0eeee\0\0\0\0", 40));
  ASSERT_EQ(link.replies().size(), 1u);
  EXPECT_EQ(link.replies()[0].refused, 0u);

  AmLink narrow(6, 256);  // an 8-byte row and its PackedRows do not fit: slices of each row
  narrow.SendBatch(source, {Write{.local_offset = 0,
                                  .remote_address = kBase,
                                  .length = 8,
                                  .rows = 2,
                                  .local_stride = 8,
                                  .remote_stride = 16}});
  ASSERT_EQ(narrow.plan().size(), 4u);
  EXPECT_EQ(narrow.plan()[0].id, kWriteAm);
  EXPECT_EQ(narrow.plan()[3].row, 1u);
  narrow.SendFlush();
  EXPECT_EQ(narrow.landing().Read(kBase, 24), std::string("aaaabbbb\0\0\0\0\0\0\0\0ccccdddd", 24));
}

// A rows message is checked whole: rows whose span leaves registered memory are refused, none
// landed, and the flush names the span; a malformed one (no rows, bytes that are not rows x
// length, a stride below the length) is refused whole too.
TEST(AmProtocolTest, ARowsMessageIsCheckedByItsWholeSpan) {
  AmLink link(1024, 256);
  const std::string source(64, 'x');
  link.SendBatch(source, {Write{.local_offset = 0,
                                .remote_address = kBase + 212,
                                .length = 4,
                                .rows = 4,
                                .local_stride = 4,
                                .remote_stride = 16}});  // the last row ends at 264, past 256
  link.SendFlush();
  EXPECT_EQ(link.landing().copies(), 0);
  ASSERT_EQ(link.replies().size(), 1u);
  EXPECT_EQ(link.replies()[0].refused_address, kBase + 212);
  EXPECT_EQ(link.replies()[0].refused_length, 3 * 16 + 4u);

  const auto refused_whole = [](PackedRows rows, uint64_t stride, size_t bytes) {
    AmTarget target;
    FakeMemory memory(256);
    std::vector<std::byte> payload(sizeof(PackedRows) + bytes, std::byte{1});
    std::memcpy(payload.data(), &rows, sizeof(rows));
    std::vector<FlushReply> replies;
    std::function<void(const FlushReply&)> record = [&](const FlushReply& r) {
      replies.push_back(r);
    };
    const Reply reply(record);
    target.OnRows(AmHeader{.token = 5, .a = kBase, .b = stride}, payload.data(), payload.size(),
                  true, memory, &reply);
    target.OnFlush(AmHeader{.token = 5, .a = 1, .b = 1}, &reply);
    EXPECT_EQ(memory.copies(), 0);
    return replies.size() == 1 && replies[0].refused == 1;
  };
  EXPECT_TRUE(refused_whole({0, 4}, 8, 0));
  EXPECT_TRUE(refused_whole({2, 4}, 8, 9));
  EXPECT_TRUE(refused_whole({2, 4}, 2, 8));
  EXPECT_TRUE(refused_whole({UINT64_MAX, 4}, 8, 8));
}

// A packed message's entries must account for exactly the bytes that follow them.
void ExpectMalformedPackedMessageRefusedWhole(uint64_t count, std::vector<PackedWrite> entries,
                                              size_t bytes) {
  AmTarget target;
  FakeMemory memory(256);
  std::vector<std::byte> payload(entries.size() * sizeof(PackedWrite) + bytes, std::byte{1});
  if (!entries.empty()) std::memcpy(payload.data(), entries.data(), entries.size() * 16);
  std::vector<FlushReply> replies;
  std::function<void(const FlushReply&)> record = [&](const FlushReply& r) {
    replies.push_back(r);
  };
  const Reply reply(record);
  target.OnWrites(AmHeader{.token = 5, .a = count}, payload.data(), payload.size(), true, memory,
                  &reply);
  target.OnFlush(AmHeader{.token = 5, .a = 1, .b = 1}, &reply);
  EXPECT_EQ(memory.copies(), 0);
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(replies[0].refused, 1u);
  EXPECT_EQ(replies[0].refused_address, 0u);
  EXPECT_EQ(replies[0].refused_length, payload.size());
}

TEST(AmProtocolTest, APackedMessageWithNoEntriesIsRefusedWhole) {
  ExpectMalformedPackedMessageRefusedWhole(0, {}, 8);
}

TEST(AmProtocolTest, APackedMessageClaimingMoreEntriesThanItHoldsIsRefusedWhole) {
  ExpectMalformedPackedMessageRefusedWhole(3, {{kBase, 4}}, 4);
}

TEST(AmProtocolTest, APackedMessageWhoseLengthsDoNotAddUpIsRefusedWhole) {
  ExpectMalformedPackedMessageRefusedWhole(2, {{kBase, 4}, {kBase + 8, 4}}, 9);
  ExpectMalformedPackedMessageRefusedWhole(2, {{kBase, 4}, {kBase + 8, UINT64_MAX}}, 8);
}

TEST(AmProtocolTest, AMessageThatDidNotArriveWholeIsRefused) {
  AmLink link(1024);
  const std::byte bytes[8] = {};
  link.target().OnWrite(AmHeader{.token = 9, .a = kBase}, bytes, 8, /*whole=*/false, link.landing(),
                        link.Replier());
  EXPECT_EQ(link.landing().copies(), 0);
  link.target().OnFlush(AmHeader{.token = 9, .a = 1, .b = 1}, link.Replier());
  ASSERT_EQ(link.replies().size(), 1u);
  EXPECT_EQ(link.replies()[0].refused, 1u);
}

TEST(AmProtocolTest, AFlushFromAWriterThatCannotBeAnsweredIsDropped) {
  AmTarget target;
  target.OnFlush(AmHeader{.token = 3, .a = 0, .b = 1}, nullptr);
  EXPECT_EQ(target.writers(), 0u);
}

TEST(AmProtocolTest, WritesAreCountedEvenWhenTheWriterCannotBeAnswered) {
  AmLink link(1024);
  const std::byte bytes[8] = {};
  link.target().OnWrite(AmHeader{.token = 9, .a = kBase}, bytes, 8, true, link.landing(), nullptr);
  EXPECT_EQ(link.landing().copies(), 1);
  link.target().OnFlush(AmHeader{.token = 9, .a = 1, .b = 1}, link.Replier());
  ASSERT_EQ(link.replies().size(), 1u);
  EXPECT_EQ(link.replies()[0].refused, 0u);
}

TEST(AmProtocolTest, ByeForgetsTheWriter) {
  AmLink link(1024);
  const std::string source(8, 'b');
  link.SendBatch(source, {Write{.local_offset = 0, .remote_address = kBase, .length = 8}});
  EXPECT_EQ(link.target().writers(), 1u);
  link.target().OnBye(AmHeader{.token = link.writer().token()});
  EXPECT_EQ(link.target().writers(), 0u);
}

TEST(AmProtocolTest, TwoWritersAreCountedApart) {
  AmTarget target;
  FakeMemory memory(256);
  std::vector<FlushReply> replies;
  std::function<void(const FlushReply&)> record = [&](const FlushReply& r) {
    replies.push_back(r);
  };
  const Reply reply(record);
  const std::byte bytes[8] = {};
  target.OnWrite(AmHeader{.token = 1, .a = kBase}, bytes, 8, true, memory, &reply);
  // Writer 2 counts one message, but has sent none: its flush waits.
  target.OnFlush(AmHeader{.token = 2, .a = 1, .b = 1}, &reply);
  EXPECT_TRUE(replies.empty());
  target.OnFlush(AmHeader{.token = 1, .a = 1, .b = 1}, &reply);
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(replies[0].token, 1u);
}

// ---------------------------------------------------------------------------------------------
// A writer refused (Transport::RefuseWriter: its process found gone).

TEST(AmProtocolTest, ARefusedWritersMessagesLandNowhereAndItsNextFlushSaysWhy) {
  AmLink link(1024);
  link.SendHello("tcp://10.0.0.1:7000");
  const std::string before(16, 'a');
  link.SendBatch(before, {Write{.local_offset = 0, .remote_address = kBase, .length = 16}});
  EXPECT_EQ(link.target().Refuse("tcp://10.0.0.1:7000"), 1u);
  // What it sent before it went and the target reads only now: a single write, a packed one, rows.
  const std::string after(4096, 'b');
  link.SendBatch(after, {Write{.local_offset = 0, .remote_address = kBase + 64, .length = 16}});
  link.SendBatch(after, {Write{.local_offset = 0, .remote_address = kBase + 128, .length = 8},
                         Write{.local_offset = 8, .remote_address = kBase + 192, .length = 8}});
  link.SendBatch(after, {Write{.local_offset = 0,
                               .remote_address = kBase + 1024,
                               .length = 64,
                               .rows = 4,
                               .local_stride = 128,
                               .remote_stride = 256}});
  EXPECT_EQ(link.landing().copies(), 1);  // the write before the refusal only
  EXPECT_EQ(link.landing().Read(kBase, 16), before);
  EXPECT_EQ(link.landing().Read(kBase + 64, 16), std::string(16, '\0'));
  EXPECT_EQ(link.landing().Read(kBase + 1024, 64), std::string(64, '\0'));
  link.SendFlush();
  ASSERT_EQ(link.replies().size(), 1u);
  EXPECT_EQ(link.replies()[0].refused, uint64_t{kRefusedWriter});
  EXPECT_EQ(link.replies()[0].refused_address, kBase + 64);
  const absl::Status status = FlushReplyStatus(link.replies()[0], 3, 1);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(), testing::HasSubstr("refuses this writer"));
  // Refused for good: every later flush says so too.
  link.SendBatch(after, {Write{.local_offset = 0, .remote_address = kBase + 64, .length = 16}});
  link.SendFlush();
  ASSERT_EQ(link.replies().size(), 2u);
  EXPECT_EQ(link.replies()[1].refused, uint64_t{kRefusedWriter});
}

TEST(AmProtocolTest, RefusingAWriterLeavesOthersAndItsLaterConnections) {
  AmTarget target;
  FakeMemory memory(256);
  const std::string gone = "tcp://10.0.0.1:7000";
  const std::string other = "tcp://10.0.0.2:7000";
  target.OnHello(AmHeader{.token = 1}, reinterpret_cast<const std::byte*>(gone.data()),
                 gone.size());
  target.OnHello(AmHeader{.token = 2}, reinterpret_cast<const std::byte*>(other.data()),
                 other.size());
  const std::byte bytes[8] = {std::byte{7}};
  target.OnWrite(AmHeader{.token = 3, .a = kBase}, bytes, 8, true, memory, nullptr);  // unnamed
  EXPECT_EQ(target.Refuse(gone), 1u);
  EXPECT_EQ(target.Refuse("tcp://10.0.0.3:7000"), 0u);
  EXPECT_EQ(target.Refuse(""), 0u);  // the unnamed writer is never refused by name
  // The same name on a connection made after the refusal (a rank restarted there) lands.
  target.OnHello(AmHeader{.token = 4}, reinterpret_cast<const std::byte*>(gone.data()),
                 gone.size());
  target.OnWrite(AmHeader{.token = 1, .a = kBase + 8}, bytes, 8, true, memory, nullptr);
  target.OnWrite(AmHeader{.token = 2, .a = kBase + 16}, bytes, 8, true, memory, nullptr);
  target.OnWrite(AmHeader{.token = 3, .a = kBase + 24}, bytes, 8, true, memory, nullptr);
  target.OnWrite(AmHeader{.token = 4, .a = kBase + 32}, bytes, 8, true, memory, nullptr);
  EXPECT_EQ(memory.copies(), 4);  // token 3 twice, 2 and 4 once; 1 refused
  EXPECT_EQ(memory.Read(kBase + 8, 8), std::string(8, '\0'));
  EXPECT_EQ(memory.Read(kBase + 16, 1), "\x07");
  EXPECT_EQ(memory.Read(kBase + 32, 1), "\x07");
}

// A writer's connection that said goodbye had every message before it handled: it counts among
// those that can land nothing more, once its token is forgotten.
TEST(AmProtocolTest, AConnectionThatSaidGoodbyeCountsAsSettled) {
  AmTarget target;
  const std::string name = "tcp://10.0.0.1:7000";
  for (uint64_t token : {1, 2}) {
    target.OnHello(AmHeader{.token = token}, reinterpret_cast<const std::byte*>(name.data()),
                   name.size());
  }
  target.OnBye(AmHeader{.token = 1});
  target.OnBye(AmHeader{.token = 3});  // unknown: nothing
  EXPECT_EQ(target.writers(), 1u);
  EXPECT_EQ(target.Refuse(name), 2u);  // token 2 refused, token 1 closed
  EXPECT_EQ(target.Refuse("tcp://10.0.0.2:7000"), 0u);
}

}  // namespace
}  // namespace kvrail::transport::am
