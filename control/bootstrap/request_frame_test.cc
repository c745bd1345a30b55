#include "control/bootstrap/request_frame.h"

#include <gtest/gtest.h>

#include <string>

namespace kvrail::bootstrap {
namespace {

using State = FrameVerdict::State;

FrameLimits Small() {
  FrameLimits limits;
  limits.max_head_bytes = 256;
  limits.max_body_bytes = 64;
  return limits;
}

// Scans `request` as it arrives one byte at a time, and returns the first verdict that is not
// kIncomplete (or the last one).
FrameVerdict ScanByteByByte(const std::string& request, FrameLimits limits = Small()) {
  RequestFramer framer(limits);
  FrameVerdict verdict;
  for (size_t n = 1; n <= request.size(); ++n) {
    verdict = framer.Scan(absl::string_view(request).substr(0, n));
    if (verdict.state != State::kIncomplete) return verdict;
  }
  return verdict;
}

TEST(RequestFramerTest, ARequestWithoutABodyEndsAtItsBlankLine) {
  const std::string get = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  RequestFramer framer(Small());
  EXPECT_EQ(framer.Scan(get.substr(0, get.size() - 1)).state, State::kIncomplete);
  FrameVerdict whole = framer.Scan(get + "GET /next HTTP/1.1\r\n");
  EXPECT_EQ(whole.state, State::kComplete);
  EXPECT_EQ(whole.request_bytes, get.size());  // a pipelined request after it is not part of it
}

TEST(RequestFramerTest, ContentLengthFramesTheBody) {
  const std::string put = "PUT /route HTTP/1.1\r\ncontent-length: 5\r\n\r\nhello";
  FrameVerdict verdict = ScanByteByByte(put);
  EXPECT_EQ(verdict.state, State::kComplete);
  EXPECT_EQ(verdict.request_bytes, put.size());
  RequestFramer framer(Small());
  FrameVerdict head = framer.Scan(put.substr(0, put.size() - 5));
  EXPECT_EQ(head.state, State::kIncomplete);
  EXPECT_TRUE(head.head_complete);
  EXPECT_FALSE(head.expects_continue);
}

TEST(RequestFramerTest, ChunksFrameTheBodyUpToTheLastChunkAndTrailers) {
  const std::string put =
      "PUT /route HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
      "5;ext=1\r\nhello\r\n1A\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nX-Trailer: t\r\n\r\n";
  FrameVerdict verdict = ScanByteByByte(put);
  EXPECT_EQ(verdict.state, State::kComplete);
  EXPECT_EQ(verdict.request_bytes, put.size());
  const std::string plain = "PUT / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET";
  FrameVerdict bare = ScanByteByByte(plain);
  EXPECT_EQ(bare.state, State::kComplete);
  EXPECT_EQ(bare.request_bytes, plain.size() - 3);
}

TEST(RequestFramerTest, ExpectContinueIsReportedOnceTheHeadIsWhole) {
  RequestFramer framer(Small());
  FrameVerdict verdict =
      framer.Scan("PUT /route HTTP/1.1\r\nExpect: 100-Continue\r\nContent-Length: 3\r\n\r\n");
  EXPECT_EQ(verdict.state, State::kIncomplete);
  EXPECT_TRUE(verdict.expects_continue);
}

TEST(RequestFramerTest, ABodyOverTheLimitIsRefused413BeforeItArrives) {
  RequestFramer framer(Small());
  FrameVerdict verdict = framer.Scan("PUT /route HTTP/1.1\r\nContent-Length: 12582912\r\n\r\n");
  EXPECT_EQ(verdict.state, State::kRefused);
  EXPECT_EQ(verdict.http_status, 413);
  EXPECT_NE(verdict.reason.find("Content-Length 12582912 exceeds the 64 bytes"), std::string::npos)
      << verdict.reason;
  FrameVerdict huge = RequestFramer(Small()).Scan(
      "PUT / HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n");
  EXPECT_EQ(huge.http_status, 413);
}

TEST(RequestFramerTest, ChunksOverTheLimitAreRefused413) {
  std::string put = "PUT / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (int i = 0; i < 9; ++i) put += "8\r\n12345678\r\n";  // 72 bytes of data
  FrameVerdict verdict = ScanByteByByte(put);
  EXPECT_EQ(verdict.http_status, 413) << verdict.reason;
  EXPECT_NE(verdict.reason.find("chunked body"), std::string::npos);
  // Tiny chunks cannot grow the buffer without bound either: their framing counts too.
  std::string empty = "PUT / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
  FrameLimits big_body = Small();
  big_body.max_body_bytes = 1 << 20;
  for (int i = 0; i < 200; ++i) empty += "0001;xxxxxxxx\r\na\r\n";
  EXPECT_EQ(ScanByteByByte(empty, big_body).http_status, 413);
}

TEST(RequestFramerTest, AHeadOverTheLimitIsRefused431) {
  const std::string head = "GET / HTTP/1.1\r\nX-Filler: " + std::string(300, 'a');
  FrameVerdict verdict = ScanByteByByte(head);
  EXPECT_EQ(verdict.state, State::kRefused);
  EXPECT_EQ(verdict.http_status, 431);
  EXPECT_NE(verdict.reason.find("256 bytes"), std::string::npos) << verdict.reason;
}

TEST(RequestFramerTest, FramingTwoReadersCouldReadDifferentlyIs400) {
  struct Case {
    const char* name;
    std::string head;
    const char* names;
  };
  const Case cases[] = {
      {"both lengths", "Transfer-Encoding: chunked\r\nContent-Length: 3", "both"},
      {"other coding", "Transfer-Encoding: gzip, chunked", "Transfer-Encoding"},
      {"two codings", "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked",
       "Transfer-Encoding"},
      {"signed length", "Content-Length: +3", "Content-Length '+3'"},
      {"hex length", "Content-Length: 0x3", "Content-Length"},
      {"two lengths", "Content-Length: 3\r\nContent-Length: 4", "set twice"},
      {"folded", "Content-Length: 3\r\n 4", "folded"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    FrameVerdict verdict =
        RequestFramer(Small()).Scan("PUT /route HTTP/1.1\r\n" + c.head + "\r\n\r\nabc");
    EXPECT_EQ(verdict.state, State::kRefused);
    EXPECT_EQ(verdict.http_status, 400);
    EXPECT_NE(verdict.reason.find(c.names), std::string::npos) << verdict.reason;
    EXPECT_EQ(verdict.reason.find('\n'), std::string::npos);
  }
  EXPECT_EQ(RequestFramer(Small())
                .Scan("PUT / HTTP/1.1\r\nContent-Length: 3\r\n"
                      "Content-Length: 3\r\n\r\nabc")
                .state,
            State::kComplete);
}

TEST(RequestFramerTest, UnreadableChunksAre400) {
  const std::string head = "PUT / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
  EXPECT_EQ(ScanByteByByte(head + "zz\r\n").http_status, 400);
  EXPECT_EQ(ScanByteByByte(head + "3\r\nabcd\r\n").http_status, 400);  // data longer than said
  EXPECT_EQ(ScanByteByByte(head + std::string(2000, '1')).http_status, 400);
}

TEST(RequestFramerTest, TheVerdictStaysOnceFinal) {
  RequestFramer framer(Small());
  const std::string get = "GET / HTTP/1.1\r\n\r\n";
  ASSERT_EQ(framer.Scan(get).state, State::kComplete);
  EXPECT_EQ(framer.Scan(get + std::string(1000, 'x')).request_bytes, get.size());
}

}  // namespace
}  // namespace kvrail::bootstrap
