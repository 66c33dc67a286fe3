// Token sampler and generation loop (include/kiln/llm.h): greedy and its ties, top-k / top-p /
// temperature, seeded determinism, banned ids, option validation, and generate() over a fake step
// function (positions, eos, ignore_eos, the max_seq_len check before any step).
// The comparison with transformers' warpers is tests/python/test_sampling.py.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "kiln/llm.h"

namespace kiln {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

SamplingOptions sampling(float temperature, int64_t top_k = 0, float top_p = 1.0f, uint64_t seed = 0) {
  SamplingOptions o;
  o.temperature = temperature;
  o.top_k = top_k;
  o.top_p = top_p;
  o.seed = seed;
  return o;
}

std::vector<float> random_logits(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, 3.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

TEST(Sampler, GreedyIsArgmax) {
  Sampler s(sampling(0.0f));
  const std::vector<float> logits = {0.5f, -1.0f, 3.0f, 2.9f};
  auto t = s.next(logits);
  ASSERT_TRUE(t.ok()) << t.error().to_string();
  EXPECT_EQ(t.value(), 2);
}

TEST(Sampler, GreedyTiesTakeTheFirstMaximum) {
  Sampler s(sampling(0.0f));
  const std::vector<float> logits = {1.0f, 4.0f, -2.0f, 4.0f, 4.0f};
  EXPECT_EQ(s.next(logits).value(), 1);
  const std::vector<float> with_inf = {1.0f, kInf, kInf};
  EXPECT_EQ(s.next(with_inf).value(), 1);
}

TEST(Sampler, GreedyDistributionIsOneHot) {
  std::vector<float> probs;
  ASSERT_TRUE(sampling_distribution(std::vector<float>{1, 7, 7, 2}, sampling(0.0f), &probs).ok());
  EXPECT_EQ(probs, (std::vector<float>{0, 1, 0, 0}));
}

TEST(Sampler, TopK1EqualsGreedy) {
  for (uint32_t trial = 0; trial < 20; ++trial) {
    const auto logits = random_logits(257, trial);
    Sampler greedy(sampling(0.0f));
    Sampler topk1(sampling(1.3f, 1, 1.0f, trial));
    EXPECT_EQ(topk1.next(logits).value(), greedy.next(logits).value());
    std::vector<float> probs;
    ASSERT_TRUE(sampling_distribution(logits, sampling(0.7f, 1), &probs).ok());
    EXPECT_EQ(probs[static_cast<size_t>(greedy.next(logits).value())], 1.0f);
  }
}

TEST(Sampler, SameSeedSameTokens) {
  const auto logits = random_logits(1000, 7);
  const auto draw = [&](uint64_t seed) {
    Sampler s(sampling(1.0f, 0, 1.0f, seed));
    std::vector<int64_t> ids;
    for (int i = 0; i < 64; ++i) ids.push_back(s.next(logits).value());
    return ids;
  };
  EXPECT_EQ(draw(42), draw(42));
  EXPECT_NE(draw(42), draw(43));
}

TEST(Sampler, SeedZeroDrawsArePinned) {
  // std::mt19937_64 is fully specified by the standard and u = (raw >> 11) * 2^-53, so these draws
  // are the same on every platform. Probabilities 0.1, 0.2, 0.3, 0.4 (logits = log p).
  const std::vector<float> logits = {std::log(0.1f), std::log(0.2f), std::log(0.3f), std::log(0.4f)};
  std::mt19937_64 ref(0);
  Sampler s(sampling(1.0f));
  for (int i = 0; i < 32; ++i) {
    const double u = static_cast<double>(ref() >> 11) * 0x1.0p-53;
    const int64_t expected = u < 0.1 ? 0 : u < 0.3 ? 1 : u < 0.6 ? 2 : 3;
    const bool near_edge = std::abs(u - 0.1) < 1e-6 || std::abs(u - 0.3) < 1e-6 || std::abs(u - 0.6) < 1e-6;
    const int64_t got = s.next(logits).value();
    if (!near_edge) {
      EXPECT_EQ(got, expected) << "draw " << i << " u=" << u;
    }
  }
}

TEST(Sampler, SamplingFollowsTheDistribution) {
  const std::vector<float> logits = {std::log(0.1f), std::log(0.2f), std::log(0.3f), std::log(0.4f), -kInf};
  Sampler s(sampling(1.0f, 0, 1.0f, 3));
  std::vector<int> counts(5);
  const int n = 20000;
  for (int i = 0; i < n; ++i) counts[static_cast<size_t>(s.next(logits).value())]++;
  EXPECT_EQ(counts[4], 0);  // probability 0 is never drawn
  const double expected[] = {0.1, 0.2, 0.3, 0.4};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(counts[static_cast<size_t>(i)] / double(n), expected[i], 0.015) << i;
}

TEST(Sampler, BannedIdsAreNeverChosen) {
  const std::vector<float> logits = {0.0f, 10.0f, 9.0f, 1.0f};
  const std::vector<int64_t> banned = {1};
  Sampler greedy(sampling(0.0f));
  EXPECT_EQ(greedy.next(logits, banned).value(), 2);
  Sampler s(sampling(1.0f, 0, 1.0f, 5));
  for (int i = 0; i < 200; ++i) EXPECT_NE(s.next(logits, banned).value(), 1);
  // A NaN on a banned id is replaced like any other logit.
  const std::vector<float> nan_banned = {std::nanf(""), 1.0f};
  EXPECT_EQ(greedy.next(nan_banned, std::vector<int64_t>{0}).value(), 1);
}

TEST(Sampler, Errors) {
  Sampler greedy(sampling(0.0f));
  const std::vector<float> logits = {1.0f, 2.0f};
  auto e = greedy.next(logits, std::vector<int64_t>{2});
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.error().code(), ErrorCode::InvalidArgument);
  EXPECT_NE(e.error().message().find("banned token id 2"), std::string::npos) << e.error().message();
  e = greedy.next(logits, std::vector<int64_t>{0, 1});
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message().find("no token has a finite logit"), std::string::npos) << e.error().message();
  e = greedy.next(std::vector<float>{1.0f, std::nanf("")});
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message().find("token 1 is NaN"), std::string::npos) << e.error().message();
  e = greedy.next(std::vector<float>{});
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.error().code(), ErrorCode::InvalidArgument);
  Sampler sample(sampling(1e-30f));
  e = sample.next(std::vector<float>{1.0e9f, 2.0f});
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message().find("overflows float32"), std::string::npos) << e.error().message();
}

TEST(SamplingOptions, Validation) {
  EXPECT_TRUE(SamplingOptions{}.validate().ok());
  EXPECT_TRUE(sampling(0.7f, 50, 0.9f).validate().ok());
  struct Case {
    SamplingOptions o;
    const char* text;
  };
  const Case cases[] = {
      {sampling(-0.5f), "temperature must be >= 0"},
      {sampling(std::nanf("")), "temperature must be >= 0"},
      {sampling(kInf), "temperature must be >= 0"},
      {sampling(1.0f, -1), "top_k must be >= 0"},
      {sampling(1.0f, 0, 0.0f), "top_p must be in (0, 1]"},
      {sampling(1.0f, 0, 1.5f), "top_p must be in (0, 1]"},
      {sampling(1.0f, 0, -0.1f), "top_p must be in (0, 1]"},
      {sampling(1.0f, 0, std::nanf("")), "top_p must be in (0, 1]"},
  };
  for (const Case& c : cases) {
    Error e = c.o.validate();
    ASSERT_FALSE(e.ok()) << c.text;
    EXPECT_EQ(e.code(), ErrorCode::InvalidArgument);
    EXPECT_NE(e.message().find(c.text), std::string::npos) << e.message();
    std::vector<float> probs;
    EXPECT_EQ(sampling_distribution(std::vector<float>{1.0f}, c.o, &probs).code(), ErrorCode::InvalidArgument);
    Sampler s(c.o);
    EXPECT_FALSE(s.next(std::vector<float>{1.0f}).ok());
  }
}

TEST(SamplingDistribution, TemperatureTopKTopP) {
  const std::vector<float> logits = {2.0f, 1.0f, 0.0f, 3.0f, 1.0f, -1.0f};
  std::vector<float> probs;
  // Temperature alone: softmax(logits / T).
  ASSERT_TRUE(sampling_distribution(logits, sampling(2.0f), &probs).ok());
  double sum = 0;
  for (float l : logits) sum += std::exp(l / 2.0);
  for (size_t i = 0; i < logits.size(); ++i) EXPECT_NEAR(probs[i], std::exp(logits[i] / 2.0) / sum, 1e-7);
  // Top-k 3: the 3rd largest is 1.0, tied by tokens 1 and 4: both kept (4 tokens).
  ASSERT_TRUE(sampling_distribution(logits, sampling(1.0f, 3), &probs).ok());
  EXPECT_GT(probs[1], 0);
  EXPECT_GT(probs[4], 0);
  EXPECT_EQ(probs[2], 0);
  EXPECT_EQ(probs[5], 0);
  EXPECT_FLOAT_EQ(probs[1], probs[4]);
  // Top-p: probabilities 0.5, 0.3, 0.15, 0.05 (ascending cumsum 0.05, 0.2, 0.5, 1).
  const std::vector<float> l2 = {std::log(0.15f), std::log(0.5f), std::log(0.05f), std::log(0.3f)};
  ASSERT_TRUE(sampling_distribution(l2, sampling(1.0f, 0, 0.75f), &probs).ok());  // drop c <= 0.25
  EXPECT_EQ(probs[0], 0);
  EXPECT_EQ(probs[2], 0);
  EXPECT_NEAR(probs[1], 0.5 / 0.8, 1e-6);
  EXPECT_NEAR(probs[3], 0.3 / 0.8, 1e-6);
  // A tiny top_p keeps the single most likely token.
  ASSERT_TRUE(sampling_distribution(l2, sampling(1.0f, 0, 1e-6f), &probs).ok());
  EXPECT_EQ(probs, (std::vector<float>{0, 1, 0, 0}));
  // Equal logits straddling the cut: the lower index comes first in ascending order (dropped first).
  const std::vector<float> l3 = {0.0f, 0.0f, 0.0f, 0.0f};
  ASSERT_TRUE(sampling_distribution(l3, sampling(1.0f, 0, 0.6f), &probs).ok());  // drop c <= 0.4: 0.25
  EXPECT_EQ(probs[0], 0);
  EXPECT_NEAR(probs[1], 1.0 / 3, 1e-7);
}

// A fake model: records every call; the logits favour token (last input token + 1) % vocab.
struct FakeModel {
  int64_t vocab = 10;
  std::vector<std::vector<int64_t>> tokens;
  std::vector<int64_t> positions;
  std::vector<float> logits;

  StepFn step() {
    return [this](std::span<const int64_t> t, int64_t pos) -> Result<std::span<const float>> {
      tokens.emplace_back(t.begin(), t.end());
      positions.push_back(pos);
      logits.assign(static_cast<size_t>(vocab), 0.0f);
      logits[static_cast<size_t>((t.back() + 1) % vocab)] = 5.0f;
      logits[static_cast<size_t>((t.back() + 2) % vocab)] = 4.0f;
      return std::span<const float>(logits);
    };
  }
};

GenerateOptions gen_options(int64_t max_new, int64_t max_seq_len, std::vector<int64_t> eos = {}, bool ignore = false) {
  GenerateOptions o;
  o.max_new_tokens = max_new;
  o.max_seq_len = max_seq_len;
  o.eos_ids = std::move(eos);
  o.ignore_eos = ignore;
  return o;
}

TEST(Generate, PrefillThenOneStepPerTokenAtTheRightPositions) {
  FakeModel m;
  const std::vector<int64_t> prompt = {3, 1, 4};
  std::vector<int64_t> streamed;
  GenerateStats stats;
  auto ids = generate(m.step(), prompt, gen_options(4, 16), &stats, [&](int64_t id) { streamed.push_back(id); });
  ASSERT_TRUE(ids.ok()) << ids.error().to_string();
  EXPECT_EQ(ids.value(), (std::vector<int64_t>{5, 6, 7, 8}));
  EXPECT_EQ(streamed, ids.value());
  ASSERT_EQ(m.positions, (std::vector<int64_t>{0, 3, 4, 5}));
  EXPECT_EQ(m.tokens[0], prompt);
  EXPECT_EQ(m.tokens[1], (std::vector<int64_t>{5}));  // the prefill's token fed at position 3
  EXPECT_EQ(m.tokens[3], (std::vector<int64_t>{7}));  // the last token (8) is never fed
  EXPECT_EQ(stats.prefill_tokens, 3);
  EXPECT_EQ(stats.decode_tokens, 3);
  EXPECT_GT(stats.prefill_tokens_per_s, 0);
  EXPECT_GT(stats.decode_tokens_per_s, 0);
  EXPECT_GT(stats.time_to_first_token_ms, 0);
  EXPECT_GT(stats.peak_rss_mib, 0);
}

TEST(Generate, StopsAfterEosAndIncludesIt) {
  FakeModel m;
  auto ids = generate(m.step(), std::vector<int64_t>{3}, gen_options(8, 16, {9, 6}));
  ASSERT_TRUE(ids.ok()) << ids.error().to_string();
  EXPECT_EQ(ids.value(), (std::vector<int64_t>{4, 5, 6}));
  EXPECT_EQ(m.positions.size(), 3u);
  // An eos from the prefill stops at once.
  FakeModel m2;
  ids = generate(m2.step(), std::vector<int64_t>{5}, gen_options(8, 16, {6}));
  EXPECT_EQ(ids.value(), (std::vector<int64_t>{6}));
  EXPECT_EQ(m2.positions.size(), 1u);
}

TEST(Generate, IgnoreEosBansIt) {
  FakeModel m;
  auto ids = generate(m.step(), std::vector<int64_t>{3}, gen_options(5, 16, {6}, true));
  ASSERT_TRUE(ids.ok()) << ids.error().to_string();
  // After 5, token 6 is banned: the runner-up 7 is chosen, and so on.
  EXPECT_EQ(ids.value(), (std::vector<int64_t>{4, 5, 7, 8, 9}));
  EXPECT_EQ(m.positions, (std::vector<int64_t>{0, 1, 2, 3, 4}));
}

TEST(Generate, LimitsAreCheckedBeforeAnyStep) {
  FakeModel m;
  const std::vector<int64_t> prompt(40, 1);
  auto ids = generate(m.step(), prompt, gen_options(16, 48));
  ASSERT_FALSE(ids.ok());
  EXPECT_EQ(ids.error().code(), ErrorCode::InvalidArgument);
  EXPECT_EQ(ids.error().message(), "generate: prompt of 40 tokens + 16 new tokens exceeds the program's max_seq_len of 48");
  EXPECT_FALSE(generate(m.step(), std::vector<int64_t>(49, 1), gen_options(0, 48)).ok());
  EXPECT_FALSE(generate(m.step(), std::vector<int64_t>{}, gen_options(1, 48)).ok());
  EXPECT_FALSE(generate(m.step(), prompt, gen_options(-1, 48)).ok());
  EXPECT_FALSE(generate(m.step(), prompt, gen_options(1, 0)).ok());
  EXPECT_FALSE(generate(m.step(), prompt, gen_options(1, 48, {-1})).ok());
  GenerateOptions bad = gen_options(1, 48);
  bad.sampling.top_p = 2.0f;
  EXPECT_FALSE(generate(m.step(), prompt, bad).ok());
  EXPECT_TRUE(m.positions.empty());
  // Exactly at the limit is fine; 0 new tokens runs no step.
  auto at_limit = generate(m.step(), prompt, gen_options(8, 48));
  ASSERT_TRUE(at_limit.ok()) << at_limit.error().to_string();
  EXPECT_EQ(m.positions.back(), 46);
  m.positions.clear();
  auto none = generate(m.step(), prompt, gen_options(0, 48));
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none.value().empty());
  EXPECT_TRUE(m.positions.empty());
}

TEST(Generate, StepErrorsCarryTheStep) {
  int calls = 0;
  std::vector<float> logits(4, 0.0f);
  StepFn failing = [&](std::span<const int64_t>, int64_t pos) -> Result<std::span<const float>> {
    if (++calls == 3) return Error(ErrorCode::InvalidArgument, "input 'tokens': out of range");
    (void)pos;
    return std::span<const float>(logits);
  };
  auto ids = generate(failing, std::vector<int64_t>{1, 2}, gen_options(5, 16));
  ASSERT_FALSE(ids.ok());
  EXPECT_EQ(ids.error().message(), "generate: decode step at position 3: input 'tokens': out of range");
  // Logits whose size changes between steps.
  calls = 0;
  std::vector<float> small(3, 0.0f);
  StepFn changing = [&](std::span<const int64_t>, int64_t) -> Result<std::span<const float>> {
    return std::span<const float>(++calls == 1 ? logits : small);
  };
  ids = generate(changing, std::vector<int64_t>{1}, gen_options(3, 16));
  ASSERT_FALSE(ids.ok());
  EXPECT_NE(ids.error().message().find("returned 3 logits, the prefill 4"), std::string::npos);
}

TEST(Generate, SeededSamplingIsReproducible) {
  const auto run = [](uint64_t seed) {
    std::vector<float> logits;
    StepFn step = [&](std::span<const int64_t> t, int64_t pos) -> Result<std::span<const float>> {
      logits = random_logits(50, static_cast<uint32_t>(t.back() * 131 + pos));
      return std::span<const float>(logits);
    };
    GenerateOptions o = gen_options(12, 32);
    o.sampling = sampling(0.9f, 20, 0.95f, seed);
    return generate(step, std::vector<int64_t>{1, 2, 3}, o).value();
  };
  EXPECT_EQ(run(11), run(11));
  EXPECT_NE(run(11), run(12));
}

}  // namespace
}  // namespace kiln
