// `kiln report`: one self-contained HTML page (inline CSS, no scripts, no network) that shows how
// the runtime runs each method of a program file (tools/report_html.cpp).
#pragma once

#include <string>
#include <vector>

#include "kiln/runtime.h"

namespace kiln::tools {

/// One method's per-instruction profile for the page (`kiln report --profile`), from the same
/// bench-style run as `kiln bench --profile` (tools/kiln.cpp run_bench).
struct ReportProfile {
  std::string method;
  std::string error;                      ///< non-empty: the method could not be timed (shown instead)
  std::vector<InstructionProfile> prof;   ///< Method::profile() summed over `runs` executions
  int runs = 0;
  int threads = 0;
  double wall_ms_per_run = 0.0;           ///< wall time of one profiled execution (mean)
};

/// The HTML page for `program` (loaded with defer_backend_errors, so that files whose backends
/// are missing here are shown too). `file_label` is shown as the file's name. Every string read from
/// the file (names, ops, metadata, reasons) is HTML-escaped after non-UTF-8 bytes and control
/// characters are made printable (kiln::printable). The compile-time delegation record (metadata
/// key "kiln.delegation") is shown where present; a file without it (compiled before it was
/// recorded) or with a malformed one says so. Never fails: what cannot be read is said on the page.
std::string report_html(const Program& program, const std::string& file_label, const std::vector<ReportProfile>& profiles);

/// `text` with &, <, >, " and ' replaced by HTML character references (after kiln::printable).
std::string html_escape(const std::string& text);

}  // namespace kiln::tools
