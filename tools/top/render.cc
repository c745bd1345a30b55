#include "tools/top/render.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvrail::top {
namespace {

constexpr double kGB = 1e9;
constexpr char kNone[] = "-";

std::string Rate(bool known, double value, const absl::FormatSpec<double>& format) {
  return known ? absl::StrFormat(format, value) : kNone;
}

std::string Header(const TopModel& model) {
  const Totals& t = model.totals;
  return absl::StrFormat(
      "kvrail top  %d endpoints: %d up, %d down  sidecar rooms/s %.1f  GB/s %.3f  failed %.0f "
      "(%.2f/s)  in flight %s",
      t.up + t.down, t.up, t.down, t.rooms_per_second, t.bytes_per_second / kGB, t.failures,
      t.failures_per_second, HumanBytes(t.bytes_in_flight));
}

// The columns before GB/S, after the endpoint's: role, rank, rooms/s and their spaces.
constexpr int kColumnsBeforeGbps = 1 + 9 + 1 + 4 + 1 + 8 + 1;
constexpr int kPeerIndent = 5;  // "  -> "

std::string ColumnHeader(int name_width) {
  return absl::StrFormat("%-*s %-9s %4s %8s %8s %8s %7s %7s %10s  %s", name_width, "ENDPOINT",
                         "ROLE", "RANK", "ROOMS/S", "GB/S", "P99 MS", "FAILED", "FAIL/S",
                         "IN FLIGHT", "LAST FAILURE");
}

std::string LastFailureText(const EndpointView& view) {
  if (!view.last_failure) return "";
  const LastFailure& f = *view.last_failure;
  return absl::StrCat(f.cause.empty() ? "failed" : f.cause, " room ", f.room, ": ", f.reason);
}

std::string Row(const EndpointView& view, int name_width) {
  if (!view.up) return absl::StrFormat("%-*s DOWN  %s", name_width, view.endpoint, view.error);
  const bool r = view.has_rates;
  const std::string role = view.role.empty() ? "?" : view.role;
  if (view.kind == EndpointKind::kBootstrap) {
    return absl::StrFormat("%-*s %-9s %4s %8s  %s req/s, %.0f ranks registered", name_width,
                           view.endpoint, role, kNone, kNone,
                           Rate(r, view.requests_per_second, "%.1f"), view.registered_ranks);
  }
  std::string p99 =
      view.p99_seconds ? absl::StrFormat("%.1f", *view.p99_seconds * 1000) : std::string(kNone);
  return absl::StrFormat("%-*s %-9s %4s %8s %8s %8s %7.0f %7s %10s  %s", name_width, view.endpoint,
                         role, view.rank.empty() ? kNone : view.rank,
                         Rate(r, view.rooms_per_second, "%.1f"),
                         Rate(r, view.bytes_per_second / kGB, "%.3f"), p99, view.failures,
                         Rate(r, view.failures_per_second, "%.2f"),
                         HumanBytes(view.bytes_in_flight), LastFailureText(view));
}

// A sidecar's fastest peers, indented under its row, GB/s in the GB/S column.
void PeerRows(const EndpointView& view, int most, int name_width, std::vector<std::string>& lines) {
  const int peer_width = name_width + kColumnsBeforeGbps - kPeerIndent - 1;
  const int shown = std::min<int>(most, view.peers.size());
  for (int i = 0; i < shown; ++i) {
    const PeerRate& peer = view.peers[i];
    lines.push_back(absl::StrFormat("  -> %-*.*s %8.3f  GB/s to/from this peer", peer_width,
                                    peer_width, peer.peer, peer.bytes_per_second / kGB));
  }
  if (view.peers.size() > static_cast<size_t>(shown)) {
    lines.push_back(absl::StrFormat("  -> (%d more peers)", view.peers.size() - shown));
  }
}

std::string Footer(const FrameOptions& options) {
  std::string footer = absl::StrFormat("%s  every %.1f s", options.time, options.interval_seconds);
  if (options.interactive) absl::StrAppend(&footer, "  q to quit");
  return footer;
}

}  // namespace

std::string HumanBytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (bytes >= 1024 && unit < 4) {
    bytes /= 1024;
    ++unit;
  }
  return unit == 0 ? absl::StrFormat("%.0f B", bytes)
                   : absl::StrFormat("%.1f %s", bytes, units[unit]);
}

std::string FitLine(absl::string_view text, int width) {
  std::string out;
  int columns = 0;
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = text[i];
    size_t length = 1;
    if (c >= 0xC0) length = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
    if (columns >= width) break;
    if (length > 1 && i + length <= text.size()) {
      out.append(text.data() + i, length);
    } else {
      // Control characters (a newline in a reason, an escape sequence), DEL and stray bytes
      // are shown as a space or '?', never sent to the terminal.
      out.push_back(c < 0x20 || c == 0x7F ? ' ' : c < 0x80 ? static_cast<char>(c) : '?');
      length = 1;
    }
    i += length;
    ++columns;
  }
  return out;
}

std::vector<std::string> RenderFrame(const TopModel& model, const FrameOptions& options) {
  // The endpoint column fits the longest name, from 22 up to 48 characters.
  size_t name_width = 22;
  for (const EndpointView& view : model.rows)
    name_width = std::max(name_width, view.endpoint.size());
  const int width = static_cast<int>(std::min<size_t>(name_width, 48));
  std::vector<std::string> body;
  for (const EndpointView& view : model.rows) {
    body.push_back(Row(view, width));
    if (view.up) PeerRows(view, options.peers_per_row, width, body);
  }
  std::vector<std::string> lines = {Header(model), ColumnHeader(width)};
  // Header, column header and footer always show; the body gives way, its last line then
  // counting what was left out.
  const int room = options.height > 0 ? std::max(options.height - 3, 1) : 0;
  if (room > 0 && static_cast<int>(body.size()) > room) {
    const int kept = room - 1;
    const int left_out = static_cast<int>(body.size()) - kept;
    body.resize(kept);
    body.push_back(absl::StrFormat("... %d more lines (a taller terminal shows them)", left_out));
  }
  lines.insert(lines.end(), body.begin(), body.end());
  lines.push_back(Footer(options));
  for (std::string& line : lines) {
    line = FitLine(absl::StripTrailingAsciiWhitespace(line), options.width);
  }
  return lines;
}

}  // namespace kvrail::top
