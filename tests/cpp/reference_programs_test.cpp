// Whole programs compiled on another machine, run here and compared with reference outputs that
// PyTorch eager computed there (tests/cross/make_reference.py writes them; scripts/cross-test.sh
// runs this test under qemu-aarch64 at the NEON target on files made on x86-64).
//
// The directory is named by the environment variable KILN_REFERENCE_DIR; without it the test is
// skipped (a plain ctest run has no reference files). The directory holds manifest.txt, one line per
// program:
//   <name> <num_inputs> <num_outputs> <atol> <rtol>
// and for each program <name>.kiln (method "forward"), <name>.in<i>.npy and <name>.out<i>.npy.
// An output element passes when |got - ref| <= atol + rtol * |ref| (NumPy's allclose rule); the
// generator states why each tolerance is what it is. Every program is loaded with the default
// options, so the optimized cpu kernels of the process's target run where they accept a call.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/cpu_target.h"
#include "kiln/npy.h"
#include "kiln/runtime.h"

namespace kiln {
namespace {

struct ReferenceEntry {
  std::string name;
  int num_inputs = 0;
  int num_outputs = 0;
  double atol = 0.0;
  double rtol = 0.0;
};

std::vector<ReferenceEntry> read_manifest(const std::string& dir) {
  std::vector<ReferenceEntry> entries;
  std::ifstream in(dir + "/manifest.txt");
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream s(line);
    ReferenceEntry e;
    if (s >> e.name >> e.num_inputs >> e.num_outputs >> e.atol >> e.rtol) entries.push_back(e);
    else ADD_FAILURE() << "manifest.txt: malformed line '" << line << "'";
  }
  return entries;
}

TEST(ReferencePrograms, MatchPyTorchEager) {
  const char* dir_env = std::getenv("KILN_REFERENCE_DIR");
  if (dir_env == nullptr || *dir_env == '\0') GTEST_SKIP() << "KILN_REFERENCE_DIR not set";
  const std::string dir = dir_env;
  const std::vector<ReferenceEntry> entries = read_manifest(dir);
  ASSERT_FALSE(entries.empty()) << dir << "/manifest.txt: missing or empty";
  for (const ReferenceEntry& e : entries) {
    SCOPED_TRACE(e.name);
    auto program = Program::load(dir + "/" + e.name + ".kiln");
    ASSERT_TRUE(program.ok()) << program.error().to_string();
    auto method = (*program)->load_method("forward");
    ASSERT_TRUE(method.ok()) << method.error().to_string();
    std::vector<npy::Array> inputs;
    for (int i = 0; i < e.num_inputs; ++i) {
      auto a = npy::read_file(dir + "/" + e.name + ".in" + std::to_string(i) + ".npy");
      ASSERT_TRUE(a.ok()) << a.error().to_string();
      inputs.push_back(std::move(a.value()));
    }
    std::vector<Tensor> views;
    for (npy::Array& a : inputs) views.push_back(a.view());
    auto outputs = method->execute(std::span<const Tensor>(views));
    ASSERT_TRUE(outputs.ok()) << outputs.error().to_string();
    ASSERT_EQ(static_cast<int>(outputs->size()), e.num_outputs);
    for (int o = 0; o < e.num_outputs; ++o) {
      auto ref = npy::read_file(dir + "/" + e.name + ".out" + std::to_string(o) + ".npy");
      ASSERT_TRUE(ref.ok()) << ref.error().to_string();
      const Tensor& got = (*outputs)[o];
      ASSERT_EQ(ref->dtype, DType::Float32) << "reference outputs are float32";
      ASSERT_EQ(got.dtype, DType::Float32);
      ASSERT_EQ(got.sizes, ref->shape) << "output " << o;
      const float* g = got.data_as<float>();
      const float* r = reinterpret_cast<const float*>(ref->data.data());
      const size_t n = ref->data.size() / sizeof(float);
      double max_abs = 0.0, max_ref = 0.0, worst_excess = -1.0;
      size_t bad = 0, worst = 0;
      for (size_t i = 0; i < n; ++i) {
        const double diff = std::fabs(static_cast<double>(g[i]) - r[i]);
        const double bound = e.atol + e.rtol * std::fabs(static_cast<double>(r[i]));
        if (!(diff <= bound)) ++bad;  // NaN in got fails too
        if (std::isnan(diff) || diff - bound > worst_excess) { worst_excess = std::isnan(diff) ? INFINITY : diff - bound; worst = i; }
        if (diff > max_abs || std::isnan(diff)) max_abs = diff;
        max_ref = std::max(max_ref, std::fabs(static_cast<double>(r[i])));
      }
      std::printf("reference %s output %d (%zu values, max |ref| %.4g) at target %s: max abs error %.3g "
                  "(atol %.3g, rtol %.3g): %s\n",
                  e.name.c_str(), o, n, max_ref, cpu_target().c_str(), max_abs, e.atol, e.rtol,
                  bad == 0 ? "ok" : "FAILED");
      EXPECT_EQ(bad, 0u) << e.name << " output " << o << ": " << bad << " of " << n
                         << " values out of tolerance; worst at " << worst << ": got " << g[worst] << ", ref " << r[worst];
    }
  }
}

}  // namespace
}  // namespace kiln
