// Token sampling: transformers' logits warpers (temperature, top-k, top-p) and a seeded,
// platform-independent draw. Formulas and their sources: include/kiln/llm.h.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "kiln/llm.h"

namespace kiln {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

std::string fmt(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

Error invalid(std::string message) { return Error(ErrorCode::InvalidArgument, std::move(message)); }

Error check_logits(std::span<const float> logits) {
  if (logits.empty()) return invalid("sampling: logits are empty (vocab size 0)");
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isnan(logits[i])) return invalid("sampling: logit of token " + std::to_string(i) + " is NaN");
  }
  return Error::success();
}

// Index of the first maximal value (torch.argmax); values hold no NaN.
size_t first_argmax(std::span<const float> values) {
  size_t best = 0;
  for (size_t i = 1; i < values.size(); ++i) {
    if (values[i] > values[best]) best = i;
  }
  return best;
}

// The distribution of sampling_distribution in double. `scores` is scratch (the warped logits).
// Logits were checked by check_logits; options by validate().
Error distribution(std::span<const float> logits, const SamplingOptions& o, std::vector<float>& scores,
                   std::vector<double>& probs) {
  const size_t n = logits.size();
  probs.assign(n, 0.0);
  if (o.temperature == 0.0f) {
    const size_t best = first_argmax(logits);
    if (logits[best] == kNegInf) return invalid("sampling: no token has a finite logit (all are -inf or banned)");
    probs[best] = 1.0;
    return Error::success();
  }
  // 1. TemperatureLogitsWarper: scores / temperature in float32.
  scores.resize(n);
  float max_score = kNegInf;
  for (size_t i = 0; i < n; ++i) {
    if (logits[i] == std::numeric_limits<float>::infinity()) {
      return invalid("sampling: logit of token " + std::to_string(i) + " is +inf");
    }
    scores[i] = logits[i] / o.temperature;
    if (std::isinf(scores[i]) && scores[i] > 0) {
      return invalid("sampling: logit " + fmt(logits[i]) + " of token " + std::to_string(i) + " / temperature " +
                     fmt(o.temperature) + " overflows float32 (temperature 0 is greedy)");
    }
    max_score = std::max(max_score, scores[i]);
  }
  if (max_score == kNegInf) return invalid("sampling: no token has a finite logit (all are -inf or banned)");

  // 2. TopKLogitsWarper: remove scores < the k-th largest (ties with it are kept).
  if (o.top_k > 0 && static_cast<uint64_t>(o.top_k) < n) {
    std::vector<float> sorted(scores);
    const size_t k = static_cast<size_t>(o.top_k);
    std::nth_element(sorted.begin(), sorted.begin() + static_cast<ptrdiff_t>(k - 1), sorted.end(),
                     std::greater<float>());
    const float threshold = sorted[k - 1];
    for (float& s : scores) {
      if (s < threshold) s = kNegInf;
    }
  }

  // 3. TopPLogitsWarper: sort ascending, cumulative softmax, remove c <= 1 - top_p, keep the last.
  if (o.top_p < 1.0f) {
    // Only the finite scores are sorted: the -inf ones (removed by top-k or banned) come first in
    // ascending order with probability 0, so their cumulative 0 <= 1 - top_p removes them anyway.
    std::vector<size_t> order;
    order.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      if (scores[i] != kNegInf) order.push_back(i);
    }
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return scores[a] < scores[b]; });
    // max_score is still present: top-k keeps the maximum.
    double sum = 0.0;
    for (size_t i : order) sum += std::exp(static_cast<double>(scores[i]) - max_score);
    const float threshold = static_cast<float>(1.0 - static_cast<double>(o.top_p));
    double cumulative = 0.0;
    for (size_t j = 0; j + 1 < order.size(); ++j) {  // the last (largest) entry is always kept
      const size_t i = order[j];
      // torch: softmax in float32, cumsum accumulated in double and stored as float32.
      const float p = static_cast<float>(std::exp(static_cast<double>(scores[i]) - max_score) / sum);
      cumulative += p;
      if (static_cast<float>(cumulative) <= threshold) scores[i] = kNegInf;
    }
  }

  // 4. softmax (-inf -> 0) in double.
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) {
    if (scores[i] != kNegInf) {
      probs[i] = std::exp(static_cast<double>(scores[i]) - max_score);
      sum += probs[i];
    }
  }
  for (double& p : probs) p /= sum;
  return Error::success();
}

}  // namespace

Error SamplingOptions::validate() const {
  if (!(temperature >= 0.0f) || std::isinf(temperature)) {
    return invalid("sampling: temperature must be >= 0 and finite (0 = greedy), got " + fmt(temperature));
  }
  if (top_k < 0) return invalid("sampling: top_k must be >= 0 (0 = off), got " + std::to_string(top_k));
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    return invalid("sampling: top_p must be in (0, 1] (1 = off), got " + fmt(top_p));
  }
  return Error::success();
}

Error sampling_distribution(std::span<const float> logits, const SamplingOptions& options,
                            std::vector<float>* probs) {
  KILN_CHECK_OR_RETURN(probs != nullptr, InvalidArgument, "sampling_distribution: probs is null");
  KILN_RETURN_IF_ERROR(options.validate());
  KILN_RETURN_IF_ERROR(check_logits(logits));
  std::vector<float> scores;
  std::vector<double> p;
  KILN_RETURN_IF_ERROR(distribution(logits, options, scores, p));
  probs->assign(p.begin(), p.end());
  return Error::success();
}

Sampler::Sampler(const SamplingOptions& options) : options_(options), rng_(options.seed) {}

Result<int64_t> Sampler::next(std::span<const float> logits, std::span<const int64_t> banned_ids) {
  KILN_RETURN_IF_ERROR(options_.validate());
  if (logits.empty()) return invalid("sampling: logits are empty (vocab size 0)");
  const size_t n = logits.size();
  if (!banned_ids.empty()) {
    // MinNewTokensLengthLogitsProcessor: banned ids get -inf before the warpers.
    std::vector<float>& masked = masked_;
    masked.assign(logits.begin(), logits.end());
    for (int64_t id : banned_ids) {
      if (id < 0 || static_cast<uint64_t>(id) >= n) {
        return invalid("sampling: banned token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                       std::to_string(n) + ")");
      }
      masked[static_cast<size_t>(id)] = kNegInf;
    }
    logits = masked;
  }
  KILN_RETURN_IF_ERROR(check_logits(logits));
  if (options_.temperature == 0.0f) {
    const size_t best = first_argmax(logits);
    if (logits[best] == kNegInf) return invalid("sampling: no token has a finite logit (all are -inf or banned)");
    return static_cast<int64_t>(best);
  }
  KILN_RETURN_IF_ERROR(distribution(logits, options_, scratch_, probs_));
  // u in [0, 1) from the top 53 bits of one raw draw: the same on every platform.
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53;
  double cumulative = 0.0;
  size_t last_nonzero = 0;
  for (size_t i = 0; i < n; ++i) {
    if (probs_[i] == 0.0) continue;
    cumulative += probs_[i];
    last_nonzero = i;
    if (u < cumulative) return static_cast<int64_t>(i);
  }
  return static_cast<int64_t>(last_nonzero);  // u beyond the rounded total
}

}  // namespace kiln
