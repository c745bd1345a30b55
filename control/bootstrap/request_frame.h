// Where one HTTP/1.1 request ends in the bytes a connection has sent so far (RFC 9112 §6.3), so
// that the bootstrap server hands its workers only whole requests, and refuses an oversized or
// unreadable one before reading the rest of it. Framing only: httplib parses the request itself
// afterwards, from exactly the bytes found here. Pure: no sockets, no clocks.
//
// A request's body is what its Content-Length says (1*DIGIT; repeated headers must agree), or
// its chunks when Transfer-Encoding is exactly "chunked", or nothing when it has neither
// (RFC 9112 §6.3 item 7). Both headers together, another transfer coding, or an unreadable
// length or chunk is refused (400): a request two readers could frame differently is how
// requests are smuggled.
#ifndef KVRAIL_CONTROL_BOOTSTRAP_REQUEST_FRAME_H_
#define KVRAIL_CONTROL_BOOTSTRAP_REQUEST_FRAME_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace kvrail::bootstrap {

struct FrameLimits {
  // The request line and headers, with the blank line that ends them; also bounds a chunked
  // body's trailers and the chunk-size lines' overhead.
  size_t max_head_bytes = size_t{16} << 10;
  // The body, however it is framed. A contract is at most 256 KiB.
  size_t max_body_bytes = size_t{1} << 20;
};

struct FrameVerdict {
  enum class State {
    kIncomplete,  // wait for more bytes
    kComplete,    // the first request_bytes bytes are one whole request
    kRefused,     // answer http_status with reason, and read no further
  };
  State state = State::kIncomplete;
  size_t request_bytes = 0;       // kComplete
  bool head_complete = false;     // the blank line after the headers has arrived
  bool expects_continue = false;  // head_complete, and "Expect: 100-continue" is among them
  int http_status = 0;            // kRefused: 400, 413 or 431
  std::string reason;             // kRefused: one line naming the input and the rule
};

// Frames the one request at the start of a connection. Keeps its place between calls, so each
// byte is looked at about once however the bytes arrive.
class RequestFramer {
 public:
  explicit RequestFramer(FrameLimits limits) : limits_(limits) {}

  // `received` is every byte the connection has sent so far: each call's is the previous
  // call's with more appended. Once the verdict is kComplete or kRefused it no longer changes.
  FrameVerdict Scan(absl::string_view received);

 private:
  FrameVerdict ScanHead(absl::string_view received);
  FrameVerdict ScanChunks(absl::string_view received);
  FrameVerdict Refuse(int http_status, std::string reason);

  FrameLimits limits_;
  std::optional<FrameVerdict> final_;  // set once complete or refused
  size_t head_search_from_ = 0;
  size_t head_bytes_ = 0;  // 0 until the head has ended
  bool expects_continue_ = false;
  bool chunked_ = false;
  uint64_t content_length_ = 0;
  // Chunked: where the next chunk-size line starts, and the data bytes seen so far.
  size_t chunk_at_ = 0;
  uint64_t chunk_data_bytes_ = 0;
};

}  // namespace kvrail::bootstrap

#endif  // KVRAIL_CONTROL_BOOTSTRAP_REQUEST_FRAME_H_
