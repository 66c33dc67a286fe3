// kiln._kiln: the token sampler and the generation loop (include/kiln/llm.h). Registered by
// binding.cpp (register_llm); errors go through its `check` (raises kiln.KilnError).
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <optional>

#include "kiln/llm.h"

namespace py = pybind11;
using namespace kiln;

namespace {

using FloatArray = py::array_t<float, py::array::c_style | py::array::forcecast>;

SamplingOptions sampling_options(float temperature, int64_t top_k, float top_p, uint64_t seed) {
  SamplingOptions o;
  o.temperature = temperature;
  o.top_k = top_k;
  o.top_p = top_p;
  o.seed = seed;
  return o;
}

std::span<const float> logits_span(const FloatArray& a, const char* what) {
  if (a.ndim() != 1) throw py::value_error(std::string(what) + " must be 1-D [vocab]");
  return {a.data(), static_cast<size_t>(a.shape(0))};
}

}  // namespace

void register_llm(py::module_& m, void (*check)(const Error&)) {
  m.def("sampling_distribution", [check](const FloatArray& logits, float temperature, int64_t top_k, float top_p) {
        std::vector<float> probs;
        check(sampling_distribution(logits_span(logits, "logits"), sampling_options(temperature, top_k, top_p, 0),
                                    &probs));
        py::array_t<float> out(static_cast<py::ssize_t>(probs.size()));
        std::memcpy(out.mutable_data(), probs.data(), probs.size() * sizeof(float));
        return out;
      }, py::arg("logits"), py::arg("temperature") = 1.0f, py::arg("top_k") = 0, py::arg("top_p") = 1.0f,
      "The distribution (float32 [vocab], sums to 1) that kiln's sampler draws the next token from, given one "
      "step's logits (float32 [vocab]): transformers' TemperatureLogitsWarper, TopKLogitsWarper (0 = off), "
      "TopPLogitsWarper (1 = off), then softmax; temperature 0 = greedy (one-hot at the first maximum). "
      "Raises KilnError(InvalidArgument) for bad options or a NaN logit. Exact rule: include/kiln/llm.h.");

  py::class_<Sampler>(m, "Sampler",
                      "Chooses tokens from logits: greedy (temperature 0) or a seeded draw from "
                      "sampling_distribution; the same seed gives the same tokens on every platform.")
      .def(py::init([check](float temperature, int64_t top_k, float top_p, uint64_t seed) {
             const SamplingOptions o = sampling_options(temperature, top_k, top_p, seed);
             check(o.validate());
             return Sampler(o);
           }),
           py::arg("temperature") = 0.0f, py::arg("top_k") = 0, py::arg("top_p") = 1.0f, py::arg("seed") = 0)
      .def("next", [check](Sampler& s, const FloatArray& logits, const std::vector<int64_t>& banned_ids) {
             Result<int64_t> r = s.next(logits_span(logits, "logits"), banned_ids);
             check(r.error());
             return r.value();
           }, py::arg("logits"), py::arg("banned_ids") = std::vector<int64_t>{},
           "The next token id; banned_ids get logit -inf first (--ignore-eos). Raises KilnError.");

  m.def("generate", [check](const std::function<py::object(py::array_t<int64_t>, int64_t)>& step,
                            const std::vector<int64_t>& prompt, int64_t max_new_tokens, int64_t max_seq_len,
                            const std::vector<int64_t>& eos_ids, bool ignore_eos, float temperature, int64_t top_k,
                            float top_p, uint64_t seed, const std::function<void(int64_t)>& on_token) {
        GenerateOptions o;
        o.max_new_tokens = max_new_tokens;
        o.max_seq_len = max_seq_len;
        o.eos_ids = eos_ids;
        o.ignore_eos = ignore_eos;
        o.sampling = sampling_options(temperature, top_k, top_p, seed);
        std::optional<FloatArray> last;  // keeps the step's logits alive until the next step
        StepFn fn = [&](std::span<const int64_t> tokens, int64_t input_pos) -> Result<std::span<const float>> {
          py::array_t<int64_t> t(static_cast<py::ssize_t>(tokens.size()));
          std::memcpy(t.mutable_data(), tokens.data(), tokens.size() * sizeof(int64_t));
          last = FloatArray::ensure(step(t, input_pos));
          if (!last->ptr()) throw py::type_error("generate: step must return float logits (array-like)");
          // [vocab] or [1, vocab]: the logits of the last token.
          return std::span<const float>(last->data(), static_cast<size_t>(last->size()));
        };
        GenerateStats stats;
        Result<std::vector<int64_t>> ids = kiln::generate(fn, prompt, o, &stats, on_token);
        check(ids.error());
        py::dict d;
        d["prefill_tokens_per_s"] = stats.prefill_tokens_per_s;
        d["decode_tokens_per_s"] = stats.decode_tokens_per_s;
        d["time_to_first_token_ms"] = stats.time_to_first_token_ms;
        d["peak_rss_mib"] = stats.peak_rss_mib;
        d["prefill_tokens"] = stats.prefill_tokens;
        d["decode_tokens"] = stats.decode_tokens;
        return py::make_tuple(ids.value(), d);
      }, py::arg("step"), py::arg("prompt"), py::arg("max_new_tokens"), py::arg("max_seq_len"),
      py::arg("eos_ids") = std::vector<int64_t>{}, py::arg("ignore_eos") = false, py::arg("temperature") = 0.0f,
      py::arg("top_k") = 0, py::arg("top_p") = 1.0f, py::arg("seed") = 0,
      py::arg("on_token") = std::function<void(int64_t)>{},
      "kiln::generate (include/kiln/llm.h) over a Python step(tokens: int64 ndarray [n], input_pos: int) -> float32 "
      "logits of the last token ([vocab] or [1, vocab]). Returns (new ids, stats dict: prefill_tokens_per_s, "
      "decode_tokens_per_s, time_to_first_token_ms, peak_rss_mib, prefill_tokens, decode_tokens). Limits are checked "
      "before the first step (KilnError InvalidArgument naming max_seq_len); an exception in step propagates.");
}
