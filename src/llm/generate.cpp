// The generation loop over an abstract step function: prefill, then one step per new token.
// Contract: include/kiln/llm.h.
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <string>

#include "kiln/llm.h"

namespace kiln {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

Error with_context(const Error& e, const std::string& where) {
  return Error(e.code(), "generate: " + where + ": " + e.message());
}

}  // namespace

double peak_rss_mib() {
  // VmHWM first: ru_maxrss alone is not enough, Linux carries it over fork and exec, so a runner
  // started by a large parent (a Python script holding torch) would report the parent's size.
  if (FILE* f = std::fopen("/proc/self/status", "r")) {
    char line[256];
    long kib = -1;
    while (std::fgets(line, sizeof(line), f)) {
      if (std::strncmp(line, "VmHWM:", 6) == 0) kib = std::strtol(line + 6, nullptr, 10);
    }
    std::fclose(f);
    if (kib > 0) return static_cast<double>(kib) / 1024.0;
  }
  struct rusage usage {};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0.0;
#if defined(__APPLE__)
  return static_cast<double>(usage.ru_maxrss) / (1024.0 * 1024.0);  // bytes
#else
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // KiB
#endif
}

Error check_generate_request(std::span<const int64_t> prompt, const GenerateOptions& options) {
  KILN_CHECK_OR_RETURN(!prompt.empty(), InvalidArgument, "generate: the prompt is empty (at least 1 token)");
  KILN_CHECK_OR_RETURN(options.max_new_tokens >= 0, InvalidArgument,
                       "generate: max_new_tokens must be >= 0, got " + std::to_string(options.max_new_tokens));
  KILN_CHECK_OR_RETURN(options.max_seq_len > 0, InvalidArgument,
                       "generate: max_seq_len must be > 0, got " + std::to_string(options.max_seq_len));
  const int64_t prompt_len = static_cast<int64_t>(prompt.size());
  if (prompt_len > options.max_seq_len || options.max_new_tokens > options.max_seq_len - prompt_len) {
    return Error(ErrorCode::InvalidArgument,
                 "generate: prompt of " + std::to_string(prompt_len) + " tokens + " +
                     std::to_string(options.max_new_tokens) + " new tokens exceeds the program's max_seq_len of " +
                     std::to_string(options.max_seq_len));
  }
  KILN_RETURN_IF_ERROR(options.sampling.validate());
  for (int64_t id : options.eos_ids) {
    KILN_CHECK_OR_RETURN(id >= 0, InvalidArgument, "generate: eos id " + std::to_string(id) + " is negative");
  }
  return {};
}

Result<std::vector<int64_t>> generate(const StepFn& step, std::span<const int64_t> prompt,
                                      const GenerateOptions& options, GenerateStats* stats,
                                      const std::function<void(int64_t)>& on_token) {
  // Every check before the first step: a refused request runs nothing (and so changes no state).
  KILN_CHECK_OR_RETURN(static_cast<bool>(step), InvalidArgument, "generate: no step function");
  KILN_RETURN_IF_ERROR(check_generate_request(prompt, options));
  const int64_t prompt_len = static_cast<int64_t>(prompt.size());

  GenerateStats st;
  st.prefill_tokens = prompt_len;
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(options.max_new_tokens));
  if (options.max_new_tokens == 0) {
    st.peak_rss_mib = peak_rss_mib();
    if (stats) *stats = st;
    return out;
  }

  Sampler sampler(options.sampling);
  const std::span<const int64_t> banned =
      options.ignore_eos ? std::span<const int64_t>(options.eos_ids) : std::span<const int64_t>();
  const auto is_eos = [&](int64_t id) {
    return std::find(options.eos_ids.begin(), options.eos_ids.end(), id) != options.eos_ids.end();
  };
  size_t vocab = 0;
  // One step at `pos` plus sampling the next token; `where` names the step in errors.
  const auto step_and_sample = [&](std::span<const int64_t> tokens, int64_t pos,
                                   const std::string& where) -> Result<int64_t> {
    Result<std::span<const float>> logits = step(tokens, pos);
    if (!logits.ok()) return with_context(logits.error(), where);
    const std::span<const float> l = logits.value();
    if (l.empty()) return Error(ErrorCode::InvalidArgument, "generate: " + where + ": the step returned no logits");
    if (vocab == 0) vocab = l.size();
    if (l.size() != vocab) {
      return Error(ErrorCode::InvalidArgument, "generate: " + where + ": the step returned " +
                                                   std::to_string(l.size()) + " logits, the prefill " +
                                                   std::to_string(vocab));
    }
    Result<int64_t> token = sampler.next(l, banned);
    if (!token.ok()) return with_context(token.error(), where);
    return token;
  };

  // Prefill: the whole prompt at position 0; its logits give the first new token.
  const Clock::time_point t0 = Clock::now();
  Result<int64_t> first = step_and_sample(prompt, 0, "prefill of " + std::to_string(prompt_len) + " tokens");
  if (!first.ok()) return first.error();
  const double prefill_s = seconds_since(t0);
  out.push_back(first.value());
  if (on_token) on_token(first.value());

  // Decode: feed the last new token at position prompt + (new tokens so far) - 1.
  double decode_s = 0.0;
  while (static_cast<int64_t>(out.size()) < options.max_new_tokens && !is_eos(out.back())) {
    const int64_t pos = prompt_len + static_cast<int64_t>(out.size()) - 1;
    const Clock::time_point t = Clock::now();
    Result<int64_t> token =
        step_and_sample(std::span<const int64_t>(&out.back(), 1), pos, "decode step at position " + std::to_string(pos));
    if (!token.ok()) return token.error();
    decode_s += seconds_since(t);
    out.push_back(token.value());
    if (on_token) on_token(token.value());
  }

  st.decode_tokens = static_cast<int64_t>(out.size()) - 1;
  st.time_to_first_token_ms = prefill_s * 1e3;
  st.prefill_tokens_per_s = prefill_s > 0 ? static_cast<double>(prompt_len) / prefill_s : 0.0;
  st.decode_tokens_per_s = (st.decode_tokens > 0 && decode_s > 0) ? static_cast<double>(st.decode_tokens) / decode_s : 0.0;
  st.peak_rss_mib = peak_rss_mib();
  if (stats) *stats = st;
  return out;
}

}  // namespace kiln
