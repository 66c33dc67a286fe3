// Program and Method: instantiate a verified method plan and execute it.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "ir/fusion.h"
#include "ir/op_registry.h"
#include "kiln/cpu_target.h"
#include "kiln/format.h"
#include "runtime/program_data.h"

namespace kiln {

Program::Program() = default;
Program::~Program() = default;

Result<std::shared_ptr<Program>> Program::load(const std::string& path, const LoadOptions& options) {
  // A KILN_CPU_TARGET that cannot be honoured is refused before anything runs at another target.
  if (Error target = cpu_target_status(); !target.ok()) return target;
  auto bytes = detail::FileBytes::map(path, options.use_mmap, options.prefault);
  if (!bytes.ok()) return bytes.error();
  auto data = detail::verify_and_plan(std::move(bytes.value()), options.defer_backend_errors, options.backend_settings);
  if (!data.ok()) return Error(data.error().code(), path + ": " + data.error().message());
  auto program = std::shared_ptr<Program>(new Program());
  program->data_ = std::move(data.value());
  return program;
}

Result<std::shared_ptr<Program>> Program::load_from_buffer(std::span<const uint8_t> buffer, const LoadOptions& options) {
  // A KILN_CPU_TARGET that cannot be honoured is refused before anything runs at another target.
  if (Error target = cpu_target_status(); !target.ok()) return target;
  auto bytes = detail::FileBytes::copy(buffer);
  if (!bytes.ok()) return bytes.error();
  auto data = detail::verify_and_plan(std::move(bytes.value()), options.defer_backend_errors, options.backend_settings);
  if (!data.ok()) return data.error();
  auto program = std::shared_ptr<Program>(new Program());
  program->data_ = std::move(data.value());
  return program;
}

const std::string* find_setting(const BackendSettings& settings, std::string_view key) {
  const std::string* found = nullptr;
  for (const auto& [k, v] : settings) {
    if (k == key) found = &v;
  }
  return found;
}

uint32_t Program::format_version() const { return data_->version; }
const std::vector<StateInfo>& Program::states() const { return data_->state_infos; }
const std::vector<std::pair<std::string, std::string>>& Program::metadata() const { return data_->metadata; }
const std::string* Program::metadata_value(std::string_view key) const {
  for (const auto& [k, v] : data_->metadata) {
    if (k == key) return &v;
  }
  return nullptr;
}

Result<std::unique_ptr<Session>> Program::new_session() const {
  auto session = std::unique_ptr<Session>(new Session());
  session->program_ = shared_from_this();
  for (const auto& st : data_->states) {
    const size_t n = st.type.nbytes();
    void* p = std::aligned_alloc(64, (n + 63) / 64 * 64 + 64);
    if (p == nullptr) {
      return Error(ErrorCode::MemoryAllocationFailed, "cannot allocate " + std::to_string(n) + " bytes for state '" + st.name + "'");
    }
    session->buffers_.push_back(p);
  }
  session->held_.resize(data_->states.size());
  session->reset();
  return session;
}

Session::~Session() {
  held_.clear();
  for (void* p : buffers_) std::free(p);
}

void Session::reset() {
  for (auto& h : held_) h.reset();  // the delegate creates it again from the initial value
  const auto& states = program_->data_->states;
  for (size_t i = 0; i < states.size(); ++i) {
    const size_t n = states[i].type.nbytes();
    if (n == 0) continue;
    if (states[i].initial) {
      std::memcpy(buffers_[i], states[i].initial, n);
    } else {
      std::memset(buffers_[i], 0, n);
    }
  }
  failure_.clear();
}

Result<Tensor> Session::state(std::string_view name) const {
  const auto& states = program_->data_->states;
  for (size_t i = 0; i < states.size(); ++i) {
    if (states[i].name != name) continue;
    if (i < held_.size() && held_[i]) {
      if (Error e = held_[i]->read(buffers_[i], states[i].type.nbytes()); !e.ok()) {
        return Error(e.code(), "state '" + std::string(name) + "': " + e.message());
      }
    }
    return Tensor{states[i].type.dtype, states[i].type.sizes, buffers_[i]};
  }
  return Error(ErrorCode::NotFound, "no state '" + std::string(name) + "' in the program");
}
uint64_t Program::constant_bytes() const { return data_->constant_bytes; }
uint64_t Program::file_size() const { return data_->bytes->size(); }

std::vector<std::string> Program::method_names() const {
  std::vector<std::string> names;
  for (const auto& m : data_->methods) names.push_back(m.meta.name);
  return names;
}

Result<MethodMeta> Program::method_meta(const std::string& name) const {
  for (const auto& m : data_->methods) {
    if (m.meta.name == name) return m.meta;
  }
  return Error(ErrorCode::NotFound, "no method '" + name + "' in program");
}

Result<std::vector<InstructionInfo>> Program::method_instructions(const std::string& name, size_t alternative) const {
  const detail::MethodPlan* plan = nullptr;
  for (const auto& m : data_->methods) {
    if (m.meta.name == name) plan = &m;
  }
  if (plan == nullptr) return Error(ErrorCode::NotFound, "no method '" + name + "' in program");
  if (alternative != kChosenAlternative && alternative != plan->meta.alternative) {
    if (alternative >= plan->meta.num_alternatives) {
      return Error(ErrorCode::NotFound, "method '" + name + "' has " + std::to_string(plan->meta.num_alternatives) +
                                            " alternative(s), no alternative " + std::to_string(alternative));
    }
    plan = nullptr;
    auto it = data_->other_alternatives.find(name);
    if (it != data_->other_alternatives.end()) {
      for (const auto& [a, other] : it->second) {
        if (a == alternative) plan = &other;
      }
    }
    if (plan == nullptr) return Error(ErrorCode::NotFound, "alternative " + std::to_string(alternative) + " of method '" + name + "' not found");
  }
  auto value = [&](int32_t v) {
    InstructionValue iv;
    iv.index = v;
    if (v < 0) return iv;
    const auto i = static_cast<size_t>(v);
    iv.name = i < plan->value_names.size() ? plan->value_names[i] : std::string();
    iv.type = plan->value_types[i];
    iv.arena_offset = plan->arena_offsets[i];
    iv.constant = plan->constant_data[i] != nullptr;
    const int32_t st = plan->value_state[i];
    if (st >= 0 && static_cast<size_t>(st) < data_->states.size()) iv.state = data_->states[static_cast<size_t>(st)].name;
    return iv;
  };
  std::vector<InstructionInfo> out;
  out.reserve(plan->instructions.size());
  for (size_t k = 0; k < plan->instructions.size(); ++k) {
    const detail::PlannedInstruction& pi = plan->instructions[k];
    InstructionInfo info;
    info.index = k;
    info.op = pi.op;
    info.debug_name = pi.debug_name;
    if (!pi.backend_name.empty()) {
      info.backend = pi.backend_name;
      info.kernel = "delegate";
      info.payload_bytes = pi.payload.size();
      info.delegate_constants = pi.delegate_constants.size();
      for (const auto& c : pi.delegate_constants) info.delegate_constant_bytes += c.size();
    } else {
      info.kernel = KernelRegistry::get().set_name(pi.kernel);
    }
    for (int32_t a : pi.args) info.inputs.push_back(value(a));
    for (int32_t o : pi.outputs) info.outputs.push_back(value(o));
    out.push_back(std::move(info));
  }
  return out;
}

struct Method::Impl {
  std::shared_ptr<const Program> program;  // keeps the mapping alive
  const detail::MethodPlan* plan = nullptr;
  void* owned_arena = nullptr;
  uint8_t* arena = nullptr;
  ThreadPool* pool = nullptr;
  std::vector<Tensor> values;
  // Per instruction: pointers into `values` in schema order.
  std::vector<std::vector<const Tensor*>> args;
  std::vector<std::vector<Tensor*>> outs;
  // Per instruction: the delegate's handle (null for kernel calls), built at load_method.
  std::vector<std::unique_ptr<DelegateHandle>> handles;
  // Per instruction: the kernel to call (null for delegate calls), from the kernel set chosen
  // at load_method.
  std::vector<KernelFn> kernels;
  // Per instruction: the state its kernel's prepare built (or null), and whether the
  // instruction is skipped because the kernel before it fused it.
  std::vector<std::unique_ptr<KernelState>> states;
  std::vector<char> skip;
  uint64_t prepared_bytes = 0;
  size_t num_fused = 0;
  // Method::set_profiling: per instruction, executions timed and nanoseconds spent.
  bool profiling = false;
  std::vector<uint64_t> prof_calls;
  std::vector<int64_t> prof_ns;
  std::vector<int64_t> prof_min_ns;
  std::vector<int64_t> prof_last_start_ns, prof_last_ns;  // the latest execution's start and duration
  // Symbolic sizes: per instruction with symbolic attributes, its attributes with this call's
  // values; the symbols' values of the current call.
  std::vector<Attributes> call_attrs;
  std::vector<int64_t> symbol_values;
  std::vector<int64_t> bound_symbols;  // the symbol values the values' sizes were last computed for
  bool bound_valid = false;
  // execute(inputs) of a stateful method: the session this Method owns.
  std::unique_ptr<Session> own_session;

  ~Impl() {
    for (size_t k = 0; k < handles.size(); ++k) {
      if (handles[k]) plan->instructions[k].backend->destroy(std::move(handles[k]));
    }
    std::free(owned_arena);
  }
};

Method::Method() : impl_(std::make_unique<Impl>()) {}
Method::Method(Method&&) noexcept = default;
Method& Method::operator=(Method&&) noexcept = default;
Method::~Method() = default;

const MethodMeta& Method::meta() const { return impl_->plan->meta; }
uint64_t Method::prepared_bytes() const { return impl_->prepared_bytes; }
size_t Method::num_fused_instructions() const { return impl_->num_fused; }

void Method::set_profiling(bool on) {
  Impl& im = *impl_;
  im.profiling = on;
  const size_t n = on ? im.plan->instructions.size() : 0;
  im.prof_calls.assign(n, 0);
  im.prof_ns.assign(n, 0);
  im.prof_min_ns.assign(n, INT64_MAX);
  im.prof_last_start_ns.assign(n, 0);
  im.prof_last_ns.assign(n, 0);
}

std::vector<InstructionProfile> Method::profile() const {
  const Impl& im = *impl_;
  std::vector<InstructionProfile> out;
  if (!im.profiling) return out;
  const auto& ins = im.plan->instructions;
  for (size_t k = 0; k < ins.size(); ++k) {
    if (im.skip[k]) continue;
    InstructionProfile p;
    p.index = k;
    p.op = ins[k].op;
    if (k + 1 < ins.size() && im.skip[k + 1]) p.fused = ins[k + 1].op;
    if (k + 2 < ins.size() && im.skip[k + 1] && im.skip[k + 2]) p.fused += " +" + ins[k + 2].op;  // FusionCandidate::then
    p.kernel = ins[k].backend != nullptr || !ins[k].backend_name.empty() ? "delegate"
               : im.kernels[k] == ins[k].portable_kernel          ? "portable"
                                                                    : "cpu";
    for (int32_t v : ins[k].args) {
      if (v >= 0) p.inputs.push_back(im.plan->value_types[static_cast<size_t>(v)]);
    }
    // A fused instruction's output type is the fusing kernel's (same type by construction).
    for (int32_t v : ins[k].outputs) p.outputs.push_back(im.plan->value_types[static_cast<size_t>(v)]);
    p.calls = im.prof_calls[k];
    p.total_ms = static_cast<double>(im.prof_ns[k]) * 1e-6;
    p.min_ms = p.calls > 0 ? static_cast<double>(im.prof_min_ns[k]) * 1e-6 : 0.0;
    p.last_start_ns = im.prof_last_start_ns[k];
    p.last_ns = im.prof_last_ns[k];
    out.push_back(std::move(p));
  }
  return out;
}

namespace {

/// Arena byte range [lo, hi) of value v, or {0, 0} for a constant or an empty value.
std::pair<uint64_t, uint64_t> arena_range(const detail::MethodPlan& plan, int32_t v) {
  const auto i = static_cast<size_t>(v);
  if (plan.arena_offsets[i] < 0) return {0, 0};
  const auto lo = static_cast<uint64_t>(plan.arena_offsets[i]);
  return {lo, lo + plan.value_types[i].nbytes()};
}

/// The data flow that lets kernel call k compute instruction k + 1 (the op is the fusion
/// table's business, fusion_offer): k has one output v; instruction k + 1 is a kernel call whose
/// only tensor input is v, or one with two tensor inputs, v and one other value r (*other = r,
/// else -1) of v's type, and whose one output w has v's type; nothing else reads v and v is not a
/// method output; and w's arena bytes overlap no arena input of k and not r (the kernel writes w
/// while reading those inputs; values other than k's inputs and r that are live at k are still
/// live at k + 1, so the arena plan already keeps them apart from w).
bool adjacent_fusable(const detail::MethodPlan& plan, size_t k, const std::vector<int>& readers, int32_t* other) {
  *other = -1;
  if (k + 1 >= plan.instructions.size()) return false;
  const auto& a = plan.instructions[k];
  const auto& b = plan.instructions[k + 1];
  if (a.backend_name.size() || b.backend_name.size() || a.outputs.size() != 1 || b.outputs.size() != 1) return false;
  const int32_t v = a.outputs[0], w = b.outputs[0];
  int tensor_args = 0;
  for (int32_t x : b.args) tensor_args += x >= 0;
  int32_t r = -1;
  if (tensor_args == 2 && b.args.size() == 2 && (b.args[0] == v) != (b.args[1] == v)) {
    r = b.args[0] == v ? b.args[1] : b.args[0];
    if (r < 0 || plan.value_types[static_cast<size_t>(r)] != plan.value_types[static_cast<size_t>(v)]) return false;
  } else if (tensor_args != 1 || b.args.empty() || b.args[0] != v) {
    return false;
  }
  if (readers[static_cast<size_t>(v)] != 1) return false;
  for (int32_t o : plan.outputs) {
    if (o == v) return false;
  }
  if (plan.value_types[static_cast<size_t>(v)] != plan.value_types[static_cast<size_t>(w)]) return false;
  // Symbolic sizes: the same expressions (so the same actual sizes on every call), and no state bytes.
  if (plan.value_sym[static_cast<size_t>(v)] != plan.value_sym[static_cast<size_t>(w)]) return false;
  if (r >= 0 && plan.value_sym[static_cast<size_t>(r)] != plan.value_sym[static_cast<size_t>(v)]) return false;
  if (plan.value_state[static_cast<size_t>(v)] >= 0 || plan.value_state[static_cast<size_t>(w)] >= 0) return false;
  if (plan.arena_offsets[static_cast<size_t>(w)] < 0) return false;
  const std::pair<uint64_t, uint64_t> wr = arena_range(plan, w);  // not a structured binding: clang 14
  auto overlaps_w = [&](int32_t x) {                                   // cannot capture those in a lambda
    const auto [lo, hi] = arena_range(plan, x);
    return lo < hi && wr.first < hi && lo < wr.second;
  };
  for (int32_t x : a.args) {
    if (x >= 0 && overlaps_w(x)) return false;
  }
  if (r >= 0 && overlaps_w(r)) return false;
  *other = r;
  return true;
}

}  // namespace

namespace detail {

FusionOffer fusion_offer(const MethodPlan& plan, size_t k, const std::vector<int>& readers) {
  FusionOffer offer;
  int32_t other = -1;
  if (!adjacent_fusable(plan, k, readers, &other)) return offer;
  const auto& a = plan.instructions[k];
  const auto& b = plan.instructions[k + 1];
  const FoldAs as = fold_as(a.op, b.op, b.attrs);
  if (as == FoldAs::None || (as == FoldAs::ResidualAdd) != (other >= 0)) return offer;
  offer.next = true;
  offer.other = other;
  // After a residual add: the epilogue op on its output (FusionCandidate::then), whose output
  // overlaps none of k's arena inputs and not the add's other input.
  int32_t other2 = -1;
  if (as == FoldAs::ResidualAdd && adjacent_fusable(plan, k + 1, readers, &other2) && other2 < 0 &&
      epilogue_after_add(a.op, plan.instructions[k + 2].op, plan.instructions[k + 2].attrs)) {
    const auto w2 = arena_range(plan, plan.instructions[k + 2].outputs[0]);
    bool apart = true;
    std::vector<int32_t> read(a.args);
    read.push_back(other);
    for (int32_t x : read) {
      if (x < 0) continue;
      const auto [lo, hi] = arena_range(plan, x);
      apart = apart && !(lo < hi && w2.first < hi && lo < w2.second);
    }
    offer.then = apart;
  }
  return offer;
}

}  // namespace detail

Result<Method> Program::load_method(const std::string& name, const MethodOptions& options) const {
  const detail::MethodPlan* plan = nullptr;
  for (const auto& m : data_->methods) {
    if (m.meta.name == name) plan = &m;
  }
  if (plan == nullptr) return Error(ErrorCode::NotFound, "no method '" + name + "' in program");
  for (const auto& ins : plan->instructions) {
    if (!ins.backend_error.ok()) return ins.backend_error;  // LoadOptions::defer_backend_errors
  }
  Method method;
  Method::Impl& im = *method.impl_;
  im.program = shared_from_this();
  im.plan = plan;
  im.pool = options.pool ? options.pool : ThreadPool::default_pool();
  const uint64_t need = plan->meta.arena_bytes;
  if (!options.arena.empty()) {
    if (options.arena.size() < need) {
      return Error(ErrorCode::MemoryAllocationFailed, "method '" + name + "' needs an arena of " + std::to_string(need) +
                                                          " bytes, the caller supplied " + std::to_string(options.arena.size()));
    }
    if (reinterpret_cast<uintptr_t>(options.arena.data()) % 64 != 0) {
      return Error(ErrorCode::InvalidArgument, "the caller's arena must be 64-byte aligned");
    }
    im.arena = options.arena.data();
  } else if (need > 0) {
    im.owned_arena = std::aligned_alloc(64, (need + 63) / 64 * 64);
    if (im.owned_arena == nullptr) {
      return Error(ErrorCode::MemoryAllocationFailed, "cannot allocate an arena of " + std::to_string(need) + " bytes");
    }
    im.arena = static_cast<uint8_t*>(im.owned_arena);
  }
  const size_t nv = plan->value_types.size();
  im.values.resize(nv);
  for (size_t i = 0; i < nv; ++i) {
    Tensor& t = im.values[i];
    t.dtype = plan->value_types[i].dtype;
    t.sizes = plan->value_types[i].sizes;
    t.data = plan->constant_data[i]      ? const_cast<uint8_t*>(plan->constant_data[i])
             : plan->value_state[i] >= 0 ? nullptr  // the session's bytes, set per call
                                         : im.arena + plan->arena_offsets[i];
  }
  for (const auto& ins : plan->instructions) {
    std::vector<const Tensor*> a;
    for (int32_t v : ins.args) a.push_back(v < 0 ? nullptr : &im.values[static_cast<size_t>(v)]);
    std::vector<Tensor*> o;
    for (int32_t v : ins.outputs) o.push_back(&im.values[static_cast<size_t>(v)]);
    im.args.push_back(std::move(a));
    im.outs.push_back(std::move(o));
  }
  im.call_attrs.resize(plan->instructions.size());
  for (size_t k = 0; k < plan->instructions.size(); ++k) {
    if (!plan->instructions[k].sym_attrs.empty()) im.call_attrs[k] = plan->instructions[k].attrs;
  }
  im.symbol_values.assign(plan->symbols.size(), 0);
  im.kernels.resize(plan->instructions.size());
  for (size_t k = 0; k < plan->instructions.size(); ++k) {
    const auto& ins = plan->instructions[k];
    im.kernels[k] = options.portable_kernels_only ? ins.portable_kernel : ins.kernel;
  }
  // Kernel prepare (optimized kernels only): per-instruction state such as packed weights, and
  // fusion of the following instruction where the kernel offers it.
  im.states.resize(plan->instructions.size());
  im.skip.assign(plan->instructions.size(), 0);
  if (!options.portable_kernels_only) {
    std::vector<int> readers(nv, 0);
    for (const auto& ins : plan->instructions) {
      for (int32_t v : ins.args) {
        if (v >= 0) ++readers[static_cast<size_t>(v)];
      }
    }
    for (size_t k = 0; k < plan->instructions.size(); ++k) {
      const auto& ins = plan->instructions[k];
      if (ins.backend != nullptr || im.skip[k]) continue;
      const KernelPrepare prepare = KernelRegistry::get().prepare_of(ins.kernel);
      if (prepare == nullptr) continue;
      std::vector<const TensorType*> in_types, out_types;
      std::vector<const Tensor*> constants;
      for (int32_t v : ins.args) {
        in_types.push_back(v < 0 ? nullptr : &plan->value_types[static_cast<size_t>(v)]);
        constants.push_back(v >= 0 && plan->constant_data[static_cast<size_t>(v)] ? &im.values[static_cast<size_t>(v)] : nullptr);
      }
      for (int32_t v : ins.outputs) out_types.push_back(&plan->value_types[static_cast<size_t>(v)]);
      const KernelSignature sig{in_types, out_types, ins.attrs};
      std::optional<FusionCandidate> next, then;
      const detail::FusionOffer offer = detail::fusion_offer(*plan, k, readers);
      const int32_t other = offer.other;
      if (offer.next) {
        if (offer.then) then.emplace(FusionCandidate{plan->instructions[k + 2].op, plan->instructions[k + 2].attrs});
        next.emplace(FusionCandidate{plan->instructions[k + 1].op, plan->instructions[k + 1].attrs,
                                     other >= 0 ? &plan->value_types[static_cast<size_t>(other)] : nullptr,
                                     then ? &*then : nullptr});
      }
      auto state = prepare(KernelPrepareArgs{sig, constants, next ? &*next : nullptr});
      if (!state.ok()) {
        return Error(state.error().code(), "method '" + name + "' instruction " + std::to_string(k) + " (" + ins.op +
                                               "): kernel prepare failed: " + state.error().message());
      }
      im.states[k] = std::move(state.value());
      if (!im.states[k]) continue;
      im.prepared_bytes += im.states[k]->bytes;
      for (size_t i : im.states[k]->released_inputs) {  // weights now held packed: drop the file's pages
        if (i < constants.size() && constants[i] != nullptr) {
          data_->bytes->release_pages(constants[i]->data, constants[i]->nbytes());
        }
      }
      if (im.states[k]->fused_next && next) {
        const bool both = im.states[k]->fused_then && then;  // FusionCandidate::then fused too
        im.outs[k][0] = &im.values[static_cast<size_t>(plan->instructions[k + (both ? 2 : 1)].outputs[0])];
        if (other >= 0) im.args[k].push_back(&im.values[static_cast<size_t>(other)]);  // FusionCandidate::other
        im.skip[k + 1] = 1;
        ++im.num_fused;
        if (both) {
          im.skip[k + 2] = 1;
          ++im.num_fused;
        }
      }
    }
  }
  // Delegates: each payload is initialized once per method instance (weights packed here).
  DelegateOptions dopts;
  dopts.num_threads = im.pool->num_threads();
  dopts.settings = &data_->backend_settings;
  im.handles.resize(plan->instructions.size());
  for (size_t k = 0; k < plan->instructions.size(); ++k) {
    const auto& ins = plan->instructions[k];
    if (ins.backend == nullptr) continue;
    std::vector<TensorType> in_types, out_types;
    for (int32_t v : ins.args) in_types.push_back(plan->value_types[static_cast<size_t>(v)]);
    for (int32_t v : ins.outputs) out_types.push_back(plan->value_types[static_cast<size_t>(v)]);
    std::vector<TensorType> held;
    for (uint32_t st : ins.held_states) held.push_back(data_->states[st].type);
    dopts.held_states = held;
    auto handle = ins.backend->init(ins.payload, ins.delegate_constants, in_types, out_types, dopts);
    if (!handle.ok()) {
      return Error(handle.error().code(), "method '" + name + "' instruction " + std::to_string(k) + ": backend '" +
                                              ins.backend->name() + "' init failed: " + handle.error().message());
    }
    if (!handle.value()) {
      return Error(ErrorCode::Internal, "backend '" + ins.backend->name() + "' returned a null handle");
    }
    im.handles[k] = std::move(handle.value());
  }
  return method;
}

Result<std::vector<Tensor>> Method::execute(std::span<const Tensor> inputs) {
  Impl& im = *impl_;
  if (!im.plan->uses_state) return execute_impl(nullptr, inputs);
  if (!im.own_session) {
    auto session = im.program->new_session();
    if (!session.ok()) return session.error();
    im.own_session = std::move(session.value());
  }
  return execute_impl(im.own_session.get(), inputs);
}

Result<std::vector<Tensor>> Method::execute(Session& session, std::span<const Tensor> inputs) {
  if (session.program_.get() != impl_->program.get()) {
    return Error(ErrorCode::InvalidArgument, "method '" + impl_->plan->meta.name + "': the session belongs to another program");
  }
  return execute_impl(&session, inputs);
}

namespace {

std::string binding_text(const detail::MethodPlan& plan, size_t s) {
  return "symbol '" + plan.symbols[s].name + "' in [" + std::to_string(plan.symbols[s].min) + ", " +
         std::to_string(plan.symbols[s].max) + "]";
}

}  // namespace

/// Binds the symbols from the inputs' actual sizes, checks every input against its dims and
/// computes every value's sizes and the symbolic attributes for this call. Nothing is written
/// before this succeeds.
Error Method::bind_sizes(std::span<const Tensor> inputs) {
  Impl& im = *impl_;
  const detail::MethodPlan& plan = *im.plan;
  const MethodMeta& meta = plan.meta;
  auto label = [&](size_t i) {
    return "method '" + meta.name + "' input " + std::to_string(i) + (meta.input_names[i].empty() ? "" : " '" + meta.input_names[i] + "'");
  };
  // Input i's type as the method declares it, symbolic dims with their bound: "int64[1, seq <= 40]".
  auto expected = [&](size_t i) {
    return type_to_string(meta.inputs[i], i < meta.input_dims.size() ? meta.input_dims[i] : std::vector<std::string>{});
  };
  for (size_t i = 0; i < inputs.size(); ++i) {
    const TensorType& want = meta.inputs[i];
    if (inputs[i].dtype != want.dtype || inputs[i].sizes.size() != want.sizes.size()) {
      return Error(ErrorCode::InvalidArgument, label(i) + ": expected " + expected(i) + ", got " + inputs[i].type().to_string());
    }
  }
  for (size_t s = 0; s < plan.symbols.size(); ++s) {
    const auto [i, d] = plan.symbol_binding[s];
    const int64_t v = inputs[i].sizes[d];
    if (v < plan.symbols[s].min || v > plan.symbols[s].max) {
      return Error(ErrorCode::InvalidArgument, label(i) + " dim " + std::to_string(d) + " is " + std::to_string(v) + ", outside " +
                                                   binding_text(plan, s) + " (expected " + expected(i) + ")");
    }
    im.symbol_values[s] = v;
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto& sym = plan.value_sym[static_cast<size_t>(plan.inputs[i])];
    for (size_t d = 0; d < inputs[i].sizes.size(); ++d) {
      int64_t want = meta.inputs[i].sizes[d];
      if (!sym.empty() && !sym[d].is_constant()) {
        auto v = sym[d].eval(im.symbol_values);
        if (!v.ok()) return Error(ErrorCode::InvalidArgument, label(i) + ": " + v.error().message());
        want = v.value();
      }
      if (inputs[i].sizes[d] != want) {
        std::string why = "expected " + expected(i);
        if (!sym.empty() && !sym[d].is_constant()) {
          why = "dim " + std::to_string(d) + " (" + sym[d].to_string(plan.symbols) + ") must be " + std::to_string(want);
          for (size_t s = 0; s < plan.symbols.size(); ++s) {
            const auto [bi, bd] = plan.symbol_binding[s];
            why += (s == 0 ? " given " : ", ") + binding_text(plan, s) + " = " + std::to_string(im.symbol_values[s]) +
                   " from input " + std::to_string(bi) + " dim " + std::to_string(bd);
          }
        }
        return Error(ErrorCode::InvalidArgument, label(i) + ": " + why + ", got " + inputs[i].type().to_string());
      }
    }
  }
  // The same symbol values as the last call that bound successfully (every decode step of a
  // language model): the sizes, attributes and re-typing of that call still hold.
  if (im.bound_valid && im.symbol_values == im.bound_symbols) return {};
  im.bound_valid = false;
  for (int32_t v : plan.dynamic_values) {
    Tensor& t = im.values[static_cast<size_t>(v)];
    if (Error e = eval_sizes(plan.value_sym[static_cast<size_t>(v)], im.symbol_values, &t.sizes); !e.ok()) {
      return Error(ErrorCode::InvalidArgument, "method '" + meta.name + "' value " + std::to_string(v) + ": " + e.message());
    }
    const auto& bound = plan.value_types[static_cast<size_t>(v)].sizes;
    for (size_t d = 0; d < bound.size(); ++d) {
      if (t.sizes[d] > bound[d]) {
        return Error(ErrorCode::InvalidProgram, "method '" + meta.name + "' value " + std::to_string(v) + " would be " +
                                                    sizes_to_string(t.sizes) + ", beyond its planned " + sizes_to_string(bound));
      }
    }
  }
  for (size_t k = 0; k < plan.instructions.size(); ++k) {
    const auto& ins = plan.instructions[k];
    for (const auto& sa : ins.sym_attrs) {
      auto v = sa.expr.eval(im.symbol_values);
      if (!v.ok()) return Error(ErrorCode::InvalidArgument, "instruction " + std::to_string(k) + " (" + ins.op + "): " + v.error().message());
      KILN_RETURN_IF_ERROR(set_int_attribute(im.call_attrs[k], sa.name, sa.index, v.value()));
    }
  }
  // Every call with symbolic sizes re-typed by the op registry for this call's sizes: kernels
  // trust their shapes, and the file's expressions were checked only at the check bindings.
  std::vector<TensorType> in_types;
  std::vector<const TensorType*> in_ptrs;
  for (size_t k = 0; k < plan.instructions.size(); ++k) {
    const auto& ins = plan.instructions[k];
    if (!ins.dynamic || !ins.backend_name.empty()) continue;  // a delegate checks its own sizes
    const OpDef* def = OpRegistry::get().find(ins.op);
    in_types.clear();
    in_types.reserve(ins.args.size());
    in_ptrs.clear();
    for (int32_t a : ins.args) in_types.push_back(a < 0 ? TensorType{} : im.values[static_cast<size_t>(a)].type());
    for (size_t j = 0; j < ins.args.size(); ++j) in_ptrs.push_back(ins.args[j] < 0 ? nullptr : &in_types[j]);
    auto inferred = def->infer_types(in_ptrs, ins.sym_attrs.empty() ? ins.attrs : im.call_attrs[k]);
    bool same = inferred.ok() && inferred->size() == ins.outputs.size();
    for (size_t o = 0; same && o < ins.outputs.size(); ++o) {
      same = (*inferred)[o].sizes == im.values[static_cast<size_t>(ins.outputs[o])].sizes;
    }
    if (!same) {
      std::string syms;
      for (size_t s = 0; s < plan.symbols.size(); ++s) syms += (s ? ", " : "") + plan.symbols[s].name + "=" + std::to_string(im.symbol_values[s]);
      return Error(ErrorCode::InvalidProgram, "instruction " + std::to_string(k) + " (" + ins.op + "): shapes disagree with the symbols at " + syms +
                                                  (inferred.ok() ? "" : ": " + inferred.error().message()));
    }
  }
  im.bound_symbols = im.symbol_values;
  im.bound_valid = true;
  return {};
}

Result<std::vector<Tensor>> Method::execute_impl(Session* session, std::span<const Tensor> inputs) {
  Impl& im = *impl_;
  const MethodMeta& meta = im.plan->meta;
  if (session != nullptr && session->failed()) {
    return Error(ErrorCode::InvalidArgument, "method '" + meta.name + "': the session's state is undefined after a failed call (" +
                                                 session->failure() + "); call reset()");
  }
  if (inputs.size() != meta.inputs.size()) {
    // Name the first input that is missing (expected type) or unexpected (actual type).
    const size_t k = std::min(inputs.size(), meta.inputs.size());
    std::string detail;
    if (inputs.size() < meta.inputs.size()) {
      const std::string label = meta.input_names[k].empty() ? "" : " '" + meta.input_names[k] + "'";
      const std::vector<std::string> no_dims;
      detail = ": missing input " + std::to_string(k) + label + " (expected " +
               type_to_string(meta.inputs[k], k < meta.input_dims.size() ? meta.input_dims[k] : no_dims) + ")";
    } else {
      detail = ": unexpected input " + std::to_string(k) + " (got " + inputs[k].type().to_string() + ")";
    }
    return Error(ErrorCode::InvalidArgument, "method '" + meta.name + "' takes " + std::to_string(meta.inputs.size()) +
                                                 " inputs, got " + std::to_string(inputs.size()) + detail);
  }
  if (!im.plan->symbols.empty()) KILN_RETURN_IF_ERROR(bind_sizes(inputs));
  for (size_t i = 0; i < inputs.size(); ++i) {
    const TensorType& want = meta.inputs[i];
    if (im.plan->symbols.empty() && (inputs[i].dtype != want.dtype || inputs[i].sizes != want.sizes)) {
      const std::string label = meta.input_names[i].empty() ? "" : " '" + meta.input_names[i] + "'";
      return Error(ErrorCode::InvalidArgument, "method '" + meta.name + "' input " + std::to_string(i) + label +
                                                   ": expected " + want.to_string() + ", got " +
                                                   inputs[i].type().to_string());
    }
    if (inputs[i].data == nullptr && inputs[i].nbytes() > 0) {
      return Error(ErrorCode::InvalidArgument, "method '" + meta.name + "' input " + std::to_string(i) + " has no data");
    }
  }
  // An input may be a view into this method's own arena (an output of the previous execute
  // fed back): copy such inputs aside first, so that filling one input slot cannot clobber
  // another input's bytes (or overlap its own source).
  const auto arena_lo = reinterpret_cast<uintptr_t>(im.arena);
  const uintptr_t arena_hi = arena_lo + meta.arena_bytes;
  std::vector<std::vector<uint8_t>> staged;
  staged.reserve(inputs.size());
  std::vector<const void*> sources(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    sources[i] = inputs[i].data;
    const size_t n = inputs[i].nbytes();
    const void* slot = im.values[static_cast<size_t>(im.plan->inputs[i])].data;
    const auto p = reinterpret_cast<uintptr_t>(inputs[i].data);
    if (n > 0 && inputs[i].data != slot && p < arena_hi && p + n > arena_lo) {
      const auto* src = static_cast<const uint8_t*>(inputs[i].data);
      staged.emplace_back(src, src + n);
      sources[i] = staged.back().data();
    }
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    Tensor& slot = im.values[static_cast<size_t>(im.plan->inputs[i])];
    if (slot.data != sources[i] && inputs[i].nbytes() > 0) std::memcpy(slot.data, sources[i], inputs[i].nbytes());
  }
  if (session != nullptr) {  // state values are the session's bytes
    for (size_t v = 0; v < im.plan->value_state.size(); ++v) {
      if (im.plan->value_state[v] >= 0) im.values[v].data = session->buffers_[static_cast<size_t>(im.plan->value_state[v])];
    }
  }
  bool state_written = false;
  for (size_t k = 0; k < im.plan->instructions.size(); ++k) {
    if (im.skip[k]) continue;  // fused into instruction k - 1 (or k - 2: FusionCandidate::then)
    const auto& ins = im.plan->instructions[k];
    std::chrono::steady_clock::time_point t0;
    if (im.profiling) t0 = std::chrono::steady_clock::now();
    const Attributes& attrs = ins.sym_attrs.empty() ? ins.attrs : im.call_attrs[k];
    Error err;
    if (ins.backend) {
      DelegateStateSlot slots[8];
      std::vector<DelegateStateSlot> many;
      std::span<DelegateStateSlot> held;
      if (!ins.held_states.empty()) {
        if (ins.held_states.size() > std::size(slots)) many.resize(ins.held_states.size());
        held = many.empty() ? std::span<DelegateStateSlot>(slots, ins.held_states.size()) : std::span<DelegateStateSlot>(many);
        const auto& states = im.program->data_->states;
        for (size_t j = 0; j < ins.held_states.size(); ++j) {
          const uint32_t st = ins.held_states[j];
          held[j] = DelegateStateSlot{&session->held_[st], states[st].type,
                                      {static_cast<const uint8_t*>(session->buffers_[st]), states[st].type.nbytes()}};
        }
      }
      err = ins.backend->execute_in_context(*im.handles[k], im.args[k], im.outs[k], ExecuteContext{im.symbol_values, held});
    } else {
      err = im.kernels[k](KernelArgs{im.args[k], im.outs[k], attrs, im.pool, im.states[k].get()});
    }
    if (im.profiling) {
      const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
      im.prof_ns[k] += ns;
      im.prof_min_ns[k] = std::min(im.prof_min_ns[k], ns);
      im.prof_last_start_ns[k] = std::chrono::duration_cast<std::chrono::nanoseconds>(t0.time_since_epoch()).count();
      im.prof_last_ns[k] = ns;
      ++im.prof_calls[k];
    }
    if (!err.ok()) {
      Error e(err.code(), "instruction " + std::to_string(k) + " (" + ins.op +
                              (ins.debug_name.empty() ? "" : " at " + ins.debug_name) + "): " + err.message());
      if (state_written && session != nullptr) session->failure_ = e.message();
      return e;
    }
    state_written = state_written || ins.writes_state;
  }
  if (session != nullptr) {  // updates not written in place: copied now that the call succeeded
    for (const auto& [st, v] : im.plan->state_copies) {
      const Tensor& t = im.values[static_cast<size_t>(v)];
      if (t.nbytes() > 0) std::memmove(session->buffers_[st], t.data, t.nbytes());
    }
  }
  std::vector<Tensor> out;
  out.reserve(im.plan->outputs.size());
  for (int32_t o : im.plan->outputs) out.push_back(im.values[static_cast<size_t>(o)]);
  return out;
}

}  // namespace kiln
