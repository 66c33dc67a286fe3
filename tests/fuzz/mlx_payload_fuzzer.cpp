// libFuzzer target: untrusted bytes through the mlx delegate's run half on MLX's CPU device
// (setting mlx.device=cpu), as the loader would hand them to it: the input is framed as in
// delegate_case.h (boundary types, constants, payload). Backend::init must return an error value
// for anything it cannot build (MLX reports errors by throwing C++ exceptions: init and execute
// turn them into error values; one escaping is a crash here), and what it builds must execute on
// zero-filled inputs. Seeds: make_corpus.cpp (payloads the real compiler lowered for small
// programs, captured at the real loader's init).
// Harness limit: mlx.max_array_bytes = 64 MiB (init refuses a computation with a larger array:
// MLX cannot survive a failed allocation, so nothing beyond the fuzzer's memory limit may reach it).
// MLX's graph compilation is disabled (mlx::core::disable_compile, as MLX_DISABLE_COMPILE does):
// on the CPU device it generates C++ for each new fused kernel and runs the system compiler on
// it (seconds per kernel, a new shared library in /tmp per shape), which is MLX's code, not a
// parser; every step of Kiln's init and execute runs the same, uncompiled.
#include <mlx/compile.h>

#include <cstdio>
#include <cstdlib>

#include "delegate_case.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const kiln::BackendSettings settings = {{"mlx.device", "cpu"}, {"mlx.max_array_bytes", "67108864"}};
  static const kiln::Backend* backend = [] {
    mlx::core::disable_compile();
    const kiln::Backend* b = kiln::BackendRegistry::get().find("mlx");
    kiln::Error avail = b ? b->is_available(settings) : kiln::Error(kiln::ErrorCode::NotFound, "not built");
    if (!avail.ok()) {
      std::fprintf(stderr, "kiln_mlx_payload_fuzzer: the mlx backend is unavailable: %s\n", avail.to_string().c_str());
      std::abort();
    }
    return b;
  }();
  kiln::DelegateOptions options;
  options.num_threads = 1;
  options.settings = &settings;
  kiln::fuzz::run_delegate_case(*backend, {data, size}, options);
  return 0;
}
