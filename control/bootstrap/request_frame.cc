#include "control/bootstrap/request_frame.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kvrail::bootstrap {
namespace {

constexpr absl::string_view kCrlf = "\r\n";
constexpr absl::string_view kBlankLine = "\r\n\r\n";
// A chunk-size line (size and extensions) longer than this is refused: no client writes one.
constexpr size_t kMaxChunkLineBytes = 1024;
// Decimal digits a Content-Length may have and still fit in 64 bits; more is "too large".
constexpr size_t kMaxLengthDigits = 19;
// Hexadecimal digits a chunk size may have and still fit; more is "too large".
constexpr size_t kMaxChunkSizeDigits = 15;

std::string Shown(absl::string_view text) {
  return absl::StrCat("'", absl::CHexEscape(text.substr(0, 40)), text.size() > 40 ? "...'" : "'");
}

bool AllDigits(absl::string_view text) {
  if (text.empty()) return false;
  for (char c : text) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

uint64_t Decimal(absl::string_view digits) {
  uint64_t value = 0;
  for (char c : digits) value = value * 10 + static_cast<uint64_t>(c - '0');
  return value;
}

uint64_t Hexadecimal(absl::string_view digits) {
  uint64_t value = 0;
  for (char c : digits) {
    const int d = absl::ascii_isdigit(static_cast<unsigned char>(c))
                      ? c - '0'
                      : absl::ascii_tolower(static_cast<unsigned char>(c)) - 'a' + 10;
    value = value * 16 + static_cast<uint64_t>(d);
  }
  return value;
}

FrameVerdict Incomplete(bool head_complete, bool expects_continue) {
  FrameVerdict verdict;
  verdict.head_complete = head_complete;
  verdict.expects_continue = expects_continue;
  return verdict;
}

}  // namespace

FrameVerdict RequestFramer::Refuse(int http_status, std::string reason) {
  FrameVerdict verdict;
  verdict.state = FrameVerdict::State::kRefused;
  verdict.head_complete = head_bytes_ > 0;
  verdict.http_status = http_status;
  verdict.reason = std::move(reason);
  final_ = verdict;
  return verdict;
}

FrameVerdict RequestFramer::Scan(absl::string_view received) {
  if (final_.has_value()) return *final_;
  if (head_bytes_ == 0) {
    FrameVerdict head = ScanHead(received);
    if (head.state != FrameVerdict::State::kIncomplete || head_bytes_ == 0) return head;
  }
  if (chunked_) return ScanChunks(received);
  const uint64_t whole = head_bytes_ + content_length_;
  if (received.size() < whole) return Incomplete(true, expects_continue_);
  FrameVerdict verdict = Incomplete(true, expects_continue_);
  verdict.state = FrameVerdict::State::kComplete;
  verdict.request_bytes = static_cast<size_t>(whole);
  final_ = verdict;
  return verdict;
}

FrameVerdict RequestFramer::ScanHead(absl::string_view received) {
  const size_t end = received.find(kBlankLine, head_search_from_);
  if (end == absl::string_view::npos || end + kBlankLine.size() > limits_.max_head_bytes) {
    if (received.size() > limits_.max_head_bytes) {
      return Refuse(431, absl::StrCat("request: the request line and headers exceed the ",
                                      limits_.max_head_bytes,
                                      " bytes the bootstrap server reads (RFC 6585 §5)"));
    }
    head_search_from_ = received.size() < 3 ? 0 : received.size() - 3;
    return Incomplete(false, false);
  }
  head_bytes_ = end + kBlankLine.size();

  std::optional<uint64_t> length;
  bool transfer_encoding = false;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(received.substr(0, end), kCrlf)) {
    if (line_number++ == 0) continue;  // the request line
    if (!line.empty() && (line[0] == ' ' || line[0] == '\t')) {
      return Refuse(400, absl::StrCat("request: header line ", line_number,
                                      " is folded onto the one before it, which RFC 9112 §5.2 "
                                      "lets a server refuse"));
    }
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos) continue;  // httplib refuses it itself
    const absl::string_view name = line.substr(0, colon);
    const absl::string_view value = absl::StripAsciiWhitespace(line.substr(colon + 1));
    if (absl::EqualsIgnoreCase(name, "Content-Length")) {
      if (!AllDigits(value)) {
        return Refuse(400, absl::StrCat("request: Content-Length ", Shown(value),
                                        " is not a decimal length (RFC 9112 §6.2)"));
      }
      const uint64_t parsed =
          value.size() > kMaxLengthDigits ? UINT64_MAX : Decimal(value);  // too large either way
      if (length.has_value() && *length != parsed) {
        return Refuse(400, absl::StrCat("request: Content-Length is set twice, to ", *length,
                                        " and ", Shown(value), " (RFC 9112 §6.3)"));
      }
      length = parsed;
    } else if (absl::EqualsIgnoreCase(name, "Transfer-Encoding")) {
      if (transfer_encoding || !absl::EqualsIgnoreCase(value, "chunked")) {
        return Refuse(400, absl::StrCat("request: Transfer-Encoding ", Shown(value),
                                        " is not a single 'chunked', the only transfer coding "
                                        "the bootstrap server reads (RFC 9112 §6.3)"));
      }
      transfer_encoding = true;
    } else if (absl::EqualsIgnoreCase(name, "Expect")) {
      expects_continue_ = absl::EqualsIgnoreCase(value, "100-continue");
    }
  }
  if (transfer_encoding && length.has_value()) {
    return Refuse(400,
                  "request: both Transfer-Encoding and Content-Length are set, which frames the "
                  "body two ways (RFC 9112 §6.3)");
  }
  if (length.has_value() && *length > limits_.max_body_bytes) {
    return Refuse(413, absl::StrCat("request: Content-Length ",
                                    *length == UINT64_MAX ? std::string("(over 19 digits)")
                                                          : absl::StrCat(*length),
                                    " exceeds the ", limits_.max_body_bytes,
                                    " bytes a body may have (--max-body-bytes)"));
  }
  chunked_ = transfer_encoding;
  content_length_ = length.value_or(0);
  chunk_at_ = head_bytes_;
  return Incomplete(true, expects_continue_);
}

FrameVerdict RequestFramer::ScanChunks(absl::string_view received) {
  auto too_large = [this] {
    return Refuse(413,
                  absl::StrCat("request: the chunked body exceeds the ", limits_.max_body_bytes,
                               " bytes a body may have (--max-body-bytes)"));
  };
  while (true) {
    // Framing overhead (size lines, CRLFs) is bounded too, or tiny chunks would grow the buffer.
    if (chunk_at_ - head_bytes_ - chunk_data_bytes_ > limits_.max_head_bytes) return too_large();
    const size_t line_end = received.find(kCrlf, chunk_at_);
    if (line_end == absl::string_view::npos) {
      if (received.size() - chunk_at_ > kMaxChunkLineBytes) {
        return Refuse(400, absl::StrCat("request: a chunk-size line runs past ", kMaxChunkLineBytes,
                                        " bytes (RFC 9112 §7.1)"));
      }
      return Incomplete(true, expects_continue_);
    }
    const absl::string_view line = received.substr(chunk_at_, line_end - chunk_at_);
    size_t digits = 0;
    while (digits < line.size() && absl::ascii_isxdigit(static_cast<unsigned char>(line[digits]))) {
      ++digits;
    }
    const absl::string_view rest = absl::StripLeadingAsciiWhitespace(line.substr(digits));
    if (digits == 0 || (!rest.empty() && rest[0] != ';')) {
      return Refuse(400, absl::StrCat("request: chunk-size line ", Shown(line),
                                      " does not start with a hexadecimal size (RFC 9112 §7.1)"));
    }
    if (digits > kMaxChunkSizeDigits) return too_large();
    const uint64_t size = Hexadecimal(line.substr(0, digits));
    const size_t data_at = line_end + kCrlf.size();
    if (size == 0) {
      // The last chunk; then trailer lines, if any, up to a blank line.
      size_t end = absl::string_view::npos;
      if (received.substr(data_at, kCrlf.size()) == kCrlf) {
        end = data_at + kCrlf.size();
      } else if (size_t blank = received.find(kBlankLine, data_at);
                 blank != absl::string_view::npos) {
        end = blank + kBlankLine.size();
      }
      if (end == absl::string_view::npos) {
        if (received.size() - data_at > limits_.max_head_bytes) {
          return Refuse(431, absl::StrCat("request: the chunked body's trailers exceed the ",
                                          limits_.max_head_bytes,
                                          " bytes the bootstrap server reads (RFC 6585 §5)"));
        }
        return Incomplete(true, expects_continue_);
      }
      FrameVerdict verdict = Incomplete(true, expects_continue_);
      verdict.state = FrameVerdict::State::kComplete;
      verdict.request_bytes = end;
      final_ = verdict;
      return verdict;
    }
    if (chunk_data_bytes_ + size > limits_.max_body_bytes) return too_large();
    const size_t data_end = data_at + static_cast<size_t>(size);
    if (received.size() < data_end + kCrlf.size()) return Incomplete(true, expects_continue_);
    if (received.substr(data_end, kCrlf.size()) != kCrlf) {
      return Refuse(400,
                    "request: a chunk's data does not end with CRLF where its size says "
                    "(RFC 9112 §7.1)");
    }
    chunk_data_bytes_ += size;
    chunk_at_ = data_end + kCrlf.size();
  }
}

}  // namespace kvrail::bootstrap
