// A `kvrail top` frame as text lines (pure: model and terminal size in, lines out).
//
// A header with the totals, a column header, one row per endpoint (a sidecar's fastest peers
// indented under it; a bootstrap server's requests and registered ranks; an endpoint that did
// not answer as DOWN with the error), then a footer with the time. Every line is cut to the
// width (never wrapped) and holds printable characters only: a failure reason comes from a
// peer and may hold anything, escape sequences included.
#ifndef KVRAIL_TOOLS_TOP_RENDER_H_
#define KVRAIL_TOOLS_TOP_RENDER_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "tools/top/view_model.h"

namespace kvrail::top {

struct FrameOptions {
  int width = 120;   // columns; longer lines are cut
  int height = 0;    // rows; 0: no limit. Rows that do not fit are counted in one line.
  std::string time;  // the footer's clock, e.g. "21:50:05 UTC"
  double interval_seconds = 1;
  bool interactive = true;  // the footer says "q to quit"
  int peers_per_row = 3;    // a sidecar's fastest peers listed under it
};

std::vector<std::string> RenderFrame(const TopModel& model, const FrameOptions& options);

// `text` with every control character (and DEL) as a space, cut to `width` characters
// (UTF-8 sequences count as one; a cut never splits one).
std::string FitLine(absl::string_view text, int width);

// Bytes for a person: "512 B", "4.0 KiB", "1.5 GiB".
std::string HumanBytes(double bytes);

}  // namespace kvrail::top

#endif  // KVRAIL_TOOLS_TOP_RENDER_H_
