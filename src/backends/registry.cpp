// BackendRegistry: the delegate backends of this process (backend libraries register themselves
// when linked: KILN_REGISTER_BACKEND in backend.h).
#include "backends/backend.h"

#include <algorithm>

namespace kiln {

BackendRegistry& BackendRegistry::get() {
  // Never destroyed: backends registered during static initialization of other objects, and
  // pointers returned by find, must outlive every static destructor.
  static BackendRegistry* registry = new BackendRegistry();
  return *registry;
}

const Backend* BackendRegistry::find(std::string_view name) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& b : backends_) {
    if (b->name() == name) return b.get();
  }
  return nullptr;
}

void BackendRegistry::add(std::unique_ptr<Backend> backend) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& b : backends_) {
    if (b->name() == backend->name()) {
      retired_.push_back(std::move(b));
      b = std::move(backend);
      return;
    }
  }
  backends_.push_back(std::move(backend));
}

std::vector<std::string> BackendRegistry::names() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (const auto& b : backends_) out.push_back(b->name());
  // Static initialization order across libraries is unspecified: sort, so that listings are stable.
  std::sort(out.begin(), out.end());
  return out;
}

SubgraphBoundary::SubgraphBoundary(const Subgraph& sg) {
  const Graph& g = *sg.graph;
  for (ValueId c : sg.constants) constants.emplace_back(*g.value(c).constant);
  for (ValueId v : sg.inputs) inputs.push_back(g.value(v).type);
  for (ValueId v : sg.outputs) outputs.push_back(g.value(v).type);
}

Error Backend::check_build(const Subgraph& subgraph, std::span<const uint8_t> payload, size_t* node_at_fault,
                           bool* checked) const {
  *node_at_fault = SIZE_MAX;
  *checked = false;
  const BackendSettings no_settings;
  if (!is_available(no_settings).ok()) return {};
  const SubgraphBoundary b(subgraph);
  DelegateOptions options;
  options.num_threads = 1;
  options.settings = &no_settings;
  auto handle = init(payload, b.constants, b.inputs, b.outputs, options);
  *checked = true;
  if (!handle.ok()) return Error(ErrorCode::NotSupported, "the lowered segment does not build: " + handle.error().message());
  destroy(std::move(handle.value()));
  return {};
}

void register_backend(std::unique_ptr<Backend> backend) { BackendRegistry::get().add(std::move(backend)); }

}  // namespace kiln
