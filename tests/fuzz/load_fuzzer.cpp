// libFuzzer target: untrusted bytes through the whole runtime path a user takes.
//   Program::load_from_buffer(bytes); for every method whose planned arena and inputs fit in
//   64 MiB: load_method, then execute on zero-filled inputs of the declared types.
// Any crash, sanitizer report or out-of-bounds access is a bug in the loader (it must reject
// the file) or in a kernel (it must only touch what the loader verified). Errors are fine.
// The 64 MiB cap is this harness's resource limit, not the runtime's: a file may legitimately
// declare a large arena, and a caller decides from MethodMeta whether to run it.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kiln/runtime.h"

namespace {
constexpr uint64_t kMaxBytes = 64ull << 20;
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto program = kiln::Program::load_from_buffer(std::span<const uint8_t>(data, size));
  if (!program.ok()) return 0;
  static kiln::ThreadPool pool(1);  // single-threaded: kernels run inline, runs are reproducible
  for (const std::string& name : (*program)->method_names()) {
    auto meta = (*program)->method_meta(name);
    if (!meta.ok() || meta->arena_bytes > kMaxBytes) continue;
    uint64_t input_bytes = 0;
    for (const kiln::TensorType& t : meta->inputs) input_bytes += t.nbytes();
    if (input_bytes > kMaxBytes) continue;
    kiln::MethodOptions options;
    options.pool = &pool;
    auto method = (*program)->load_method(name, options);
    if (!method.ok()) continue;
    std::vector<std::vector<uint8_t>> buffers;
    std::vector<kiln::Tensor> inputs;
    buffers.reserve(meta->inputs.size());
    for (const kiln::TensorType& t : meta->inputs) {
      buffers.emplace_back(t.nbytes(), 0);
      inputs.push_back(kiln::Tensor{t.dtype, t.sizes, buffers.back().data()});
    }
    auto outputs = method->execute(std::span<const kiln::Tensor>(inputs));
    if (!outputs.ok()) continue;
    // Read every output byte, so a view outside the arena is reported by ASan.
    uint8_t sink = 0;
    for (const kiln::Tensor& o : *outputs) {
      const auto* p = static_cast<const uint8_t*>(o.data);
      for (size_t i = 0; i < o.nbytes(); ++i) sink ^= p[i];
    }
    volatile uint8_t keep = sink;
    (void)keep;
  }
  return 0;
}
