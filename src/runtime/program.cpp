// Program and Method: instantiate a verified method plan and execute it.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "runtime/program_data.h"

namespace kiln {

Program::Program() = default;
Program::~Program() = default;

Result<std::shared_ptr<Program>> Program::load(const std::string& path, const LoadOptions& options) {
  auto bytes = detail::FileBytes::map(path, options.use_mmap);
  if (!bytes.ok()) return bytes.error();
  auto data = detail::verify_and_plan(std::move(bytes.value()), options.defer_backend_errors, options.backend_settings);
  if (!data.ok()) return Error(data.error().code(), path + ": " + data.error().message());
  auto program = std::shared_ptr<Program>(new Program());
  program->data_ = std::move(data.value());
  return program;
}

Result<std::shared_ptr<Program>> Program::load_from_buffer(std::span<const uint8_t> buffer, const LoadOptions& options) {
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
    t.data = plan->constant_data[i] ? const_cast<uint8_t*>(plan->constant_data[i])
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
  im.kernels.resize(plan->instructions.size());
  for (size_t k = 0; k < plan->instructions.size(); ++k) {
    const auto& ins = plan->instructions[k];
    im.kernels[k] = options.portable_kernels_only ? ins.portable_kernel : ins.kernel;
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
  const MethodMeta& meta = im.plan->meta;
  if (inputs.size() != meta.inputs.size()) {
    // Name the first input that is missing (expected type) or unexpected (actual type).
    const size_t k = std::min(inputs.size(), meta.inputs.size());
    std::string detail;
    if (inputs.size() < meta.inputs.size()) {
      const std::string label = meta.input_names[k].empty() ? "" : " '" + meta.input_names[k] + "'";
      detail = ": missing input " + std::to_string(k) + label + " (expected " + meta.inputs[k].to_string() + ")";
    } else {
      detail = ": unexpected input " + std::to_string(k) + " (got " + inputs[k].type().to_string() + ")";
    }
    return Error(ErrorCode::InvalidArgument, "method '" + meta.name + "' takes " + std::to_string(meta.inputs.size()) +
                                                 " inputs, got " + std::to_string(inputs.size()) + detail);
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const TensorType& want = meta.inputs[i];
    if (inputs[i].dtype != want.dtype || inputs[i].sizes != want.sizes) {
      const std::string label = meta.input_names[i].empty() ? "" : " '" + meta.input_names[i] + "'";
      return Error(ErrorCode::InvalidArgument, "method '" + meta.name + "' input " + std::to_string(i) + label +
                                                   ": expected " + want.to_string() + ", got " +
                                                   inputs[i].type().to_string());
    }
    if (inputs[i].data == nullptr && want.nbytes() > 0) {
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
  for (size_t k = 0; k < im.plan->instructions.size(); ++k) {
    const auto& ins = im.plan->instructions[k];
    Error err = ins.backend ? ins.backend->execute(*im.handles[k], im.args[k], im.outs[k])
                            : im.kernels[k](KernelArgs{im.args[k], im.outs[k], ins.attrs, im.pool});
    if (!err.ok()) {
      return Error(err.code(), "instruction " + std::to_string(k) + " (" + ins.op +
                                   (ins.debug_name.empty() ? "" : " at " + ins.debug_name) + "): " + err.message());
    }
  }
  std::vector<Tensor> out;
  out.reserve(im.plan->outputs.size());
  for (int32_t o : im.plan->outputs) out.push_back(im.values[static_cast<size_t>(o)]);
  return out;
}

}  // namespace kiln
