// libFuzzer target: untrusted bytes through the whole runtime path a user takes.
//   Program::load_from_buffer(bytes); for every method whose planned arena and inputs fit in
//   64 MiB: load_method, then execute on zero-filled inputs of the declared types.
// Methods with symbolic dims (format version 2) run at the upper bounds (MethodMeta::inputs), then
// with every dim that is exactly a symbol at that symbol's minimum. Methods with state run on a
// Session of the program (one per program, shared by its methods as prefill/decode share a KV
// cache; skipped when the program's states exceed 64 MiB), again after Session::reset().
// Any crash, sanitizer report or out-of-bounds access is a bug in the loader (it must reject
// the file) or in a kernel (it must only touch what the loader verified). Errors are fine.
// The 64 MiB cap is this harness's resource limit, not the runtime's: a file may legitimately
// declare a large arena, and a caller decides from MethodMeta whether to run it.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kiln/runtime.h"

namespace {
constexpr uint64_t kMaxBytes = 64ull << 20;

// Runs `method` once on zero-filled inputs of `types` (on `session` when non-null) and reads
// every output byte, so a view outside the arena is reported by ASan.
void run_once(kiln::Method& method, kiln::Session* session, const std::vector<kiln::TensorType>& types) {
  std::vector<std::vector<uint8_t>> buffers;
  std::vector<kiln::Tensor> inputs;
  buffers.reserve(types.size());
  for (const kiln::TensorType& t : types) {
    buffers.emplace_back(t.nbytes(), 0);
    inputs.push_back(kiln::Tensor{t.dtype, t.sizes, buffers.back().data()});
  }
  auto outputs = session ? method.execute(*session, std::span<const kiln::Tensor>(inputs))
                         : method.execute(std::span<const kiln::Tensor>(inputs));
  if (!outputs.ok()) return;
  uint8_t sink = 0;
  for (const kiln::Tensor& o : *outputs) {
    const auto* p = static_cast<const uint8_t*>(o.data);
    for (size_t i = 0; i < o.nbytes(); ++i) sink ^= p[i];
  }
  volatile uint8_t keep = sink;
  (void)keep;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto program = kiln::Program::load_from_buffer(std::span<const uint8_t>(data, size));
  if (!program.ok()) return 0;
  static kiln::ThreadPool pool(1);  // single-threaded: kernels run inline, runs are reproducible
  uint64_t state_bytes = 0;
  for (const kiln::StateInfo& s : (*program)->states()) state_bytes += s.type.nbytes();
  std::unique_ptr<kiln::Session> session;  // made on the first method with state
  for (const std::string& name : (*program)->method_names()) {
    auto meta = (*program)->method_meta(name);
    if (!meta.ok() || meta->arena_bytes > kMaxBytes) continue;
    uint64_t input_bytes = 0;
    for (const kiln::TensorType& t : meta->inputs) input_bytes += t.nbytes();
    if (input_bytes > kMaxBytes) continue;
    const bool stateful = !meta->states.empty();
    if (stateful && !session) {
      if (state_bytes > kMaxBytes) continue;
      auto s = (*program)->new_session();
      if (!s.ok()) continue;
      session = std::move(s.value());
    }
    kiln::MethodOptions options;
    options.pool = &pool;
    auto method = (*program)->load_method(name, options);
    if (!method.ok()) continue;
    kiln::Session* sp = stateful ? session.get() : nullptr;
    run_once(*method, sp, meta->inputs);
    if (!meta->symbols.empty()) {
      // Each dim that is exactly a symbol at the symbol's minimum (other symbolic dims at their
      // bound: execute may refuse that combination, which is fine).
      std::vector<kiln::TensorType> small = meta->inputs;
      for (size_t i = 0; i < small.size() && i < meta->input_dims.size(); ++i) {
        for (size_t d = 0; d < small[i].sizes.size() && d < meta->input_dims[i].size(); ++d) {
          for (const kiln::SymbolDef& s : meta->symbols) {
            if (meta->input_dims[i][d] == s.name) small[i].sizes[d] = s.min;
          }
        }
      }
      run_once(*method, sp, small);
    }
    if (sp) {
      sp->reset();
      run_once(*method, sp, meta->inputs);
    }
  }
  return 0;
}
