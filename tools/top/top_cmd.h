// `kvrail top`: a live terminal view of sidecars and bootstrap servers from their Prometheus
// metrics endpoints (docs: README.md, "kvrail top").
//
// Every interval it scrapes each endpoint (all at once, each within a timeout), computes the
// rates against the previous scrape (view_model.h) and redraws the frame (render.h) in place
// in the alternate screen; q, Ctrl-C or SIGTERM end it and give the screen back. --once
// prints one frame, after two scrapes an interval apart, without escapes; --json prints its
// numbers instead (frame_json.h).
#ifndef KVRAIL_TOOLS_TOP_TOP_CMD_H_
#define KVRAIL_TOOLS_TOP_TOP_CMD_H_

#include <CLI/CLI.hpp>

namespace kvrail::tools {

void AddTop(CLI::App& app, int& exit_code);

}  // namespace kvrail::tools

#endif  // KVRAIL_TOOLS_TOP_TOP_CMD_H_
