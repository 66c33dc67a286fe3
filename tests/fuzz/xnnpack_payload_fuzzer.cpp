// libFuzzer target: untrusted bytes through the xnnpack delegate's run half, as the loader would
// hand them to it: the input is framed as in delegate_case.h (boundary types, constants, payload);
// Backend::init must return an error value for anything it cannot build, and what it builds must
// execute on zero-filled inputs without touching memory it does not own. Seeds: make_corpus.cpp
// (payloads the real compiler lowered for small programs, captured at the real loader's init).
#include <cstdio>
#include <cstdlib>

#include "delegate_case.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const kiln::Backend* backend = [] {
    const kiln::Backend* b = kiln::BackendRegistry::get().find("xnnpack");
    kiln::Error avail = b ? b->is_available({}) : kiln::Error(kiln::ErrorCode::NotFound, "not built");
    if (!avail.ok()) {
      std::fprintf(stderr, "kiln_xnnpack_payload_fuzzer: the xnnpack backend is unavailable: %s\n",
                   avail.to_string().c_str());
      std::abort();
    }
    return b;
  }();
  static const kiln::BackendSettings settings;
  kiln::DelegateOptions options;
  options.num_threads = 1;  // XNNPACK on the calling thread: runs are reproducible
  options.settings = &settings;
  kiln::fuzz::run_delegate_case(*backend, {data, size}, options);
  return 0;
}
