// `kvrail doctor`: the preflight report of tools/doctor.h.
#ifndef KVRAIL_TOOLS_DOCTOR_CMD_H_
#define KVRAIL_TOOLS_DOCTOR_CMD_H_

#include <CLI/CLI.hpp>

namespace kvrail::tools {

void AddDoctor(CLI::App& app, int& exit_code);

}  // namespace kvrail::tools

#endif  // KVRAIL_TOOLS_DOCTOR_CMD_H_
