// Token sampling and the generation loop of a decoder-only language model (issue 18, items 4-5).
//
// The loop is written against an abstract step function, so it does not depend on how the model
// runs: a step runs the model on some tokens at a cache position and returns the logits of the
// last token. With a program exported by `python -m kiln export-llm` (method
// `forward(tokens: int64[1, seq], input_pos: int64[1]) -> logits: float32[1, vocab]`, state = the
// KV cache of one session), a step is one `execute` of that method in one session
// (tools/kiln.cpp's `kiln generate` is this, with the options from the program's llm.* metadata):
//
//   auto session = program->new_session().value();   // the KV cache, zeros
//   auto method = program->load_method("forward").value();
//   kiln::GenerateOptions opts;
//   opts.max_new_tokens = 16;
//   opts.max_seq_len = <llm.max_seq_len>;
//   opts.eos_ids = <llm.eos_ids>;
//   opts.sampling.temperature = 0.7f; opts.sampling.top_k = 50; opts.sampling.seed = 1;
//   std::vector<int64_t> pos(1);
//   kiln::StepFn step = [&](std::span<const int64_t> tokens, int64_t input_pos)
//       -> kiln::Result<std::span<const float>> {
//     pos[0] = input_pos;
//     kiln::Tensor t{kiln::DType::Int64, {1, (int64_t)tokens.size()}, (void*)tokens.data()};
//     kiln::Tensor p{kiln::DType::Int64, {1}, pos.data()};
//     auto out = method.execute(*session, {t, p});  // logits float32[1, vocab]
//     if (!out.ok()) return out.error();
//     const kiln::Tensor& l = (*out)[0];
//     return std::span<const float>(static_cast<const float*>(l.data), l.sizes.back());
//   };
//   kiln::GenerateStats stats;
//   auto ids = kiln::generate(step, prompt, opts, &stats, [](int64_t id) { printf("%lld ", id); });
//
// The sampler reproduces the distribution that Hugging Face transformers' `generate(do_sample=True)`
// samples from (its logits warpers, transformers/generation/logits_process.py, version 5.24); the
// random draw itself is Kiln's own (std::mt19937_64, inverse CDF), so the same seed gives the same
// tokens on every platform, but not the tokens of torch.multinomial.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <span>
#include <vector>

#include "kiln/error.h"

namespace kiln {

/// How the next token is chosen from a step's logits.
///
/// Note: transformers' GenerationConfig defaults to top_k = 50 when do_sample=True; here 0 means
/// off, so pass top_k = 50 to sample as `model.generate(do_sample=True)` does by default.
struct SamplingOptions {
  /// 0: greedy (argmax; top_k, top_p and seed are unused). > 0: sample from
  /// softmax(logits / temperature) after top-k and top-p. Negative, NaN or inf: InvalidArgument.
  float temperature = 0.0f;
  /// 0: off. k > 0: keep the tokens whose scaled logit is >= the k-th largest (ties kept).
  /// Negative: InvalidArgument. k larger than the vocabulary keeps everything. top_k = 1 chooses
  /// the greedy token unless the maximum is tied (then the tied tokens are drawn from).
  int64_t top_k = 0;
  /// 1: off. In (0, 1): keep the most likely tokens whose probabilities add up to top_p or more
  /// (nucleus sampling; transformers' TopPLogitsWarper, exact rule at sampling_distribution).
  /// Outside (0, 1] or NaN: InvalidArgument.
  float top_p = 1.0f;
  /// Seed of the Sampler's random generator (std::mt19937_64).
  uint64_t seed = 0;

  /// Ok, or InvalidArgument naming the bad field and its value.
  Error validate() const;
};

/// The probability distribution the Sampler draws the next token from, given one step's logits.
///
/// logits: float32 [vocab], vocab >= 1. probs: resized to [vocab], float32, sums to 1 (each entry
/// rounded from the double value).
///
/// temperature == 0 (greedy): a one-hot at the first maximal logit (torch.argmax's choice).
/// Otherwise, exactly the steps of transformers' generate(do_sample=True)
/// (transformers/generation/utils.py `_get_logits_processor`, then `_sample`):
///  1. TemperatureLogitsWarper: s = logits / temperature, in float32;
///  2. TopKLogitsWarper (top_k > 0): t = the min(top_k, vocab)-th largest s; every s < t becomes
///     -inf (so ties with t are kept: more than k tokens may remain);
///  3. TopPLogitsWarper (top_p < 1): sort s ascending, c = cumsum(softmax(sorted s)); the sorted
///     entries with c <= 1 - top_p become -inf, except the last (largest) one, which is always kept
///     (min_tokens_to_keep = 1). The softmax and cumsum are computed in double and c is rounded to
///     float32 before the comparison with float32(1 - double(top_p)), as torch compares a float32
///     tensor with a Python float. Equal logits are ordered by index (torch.sort(stable=True)):
///     transformers' unstable torch.sort leaves which of several equal logits straddling the
///     cut is dropped unspecified;
///  4. softmax over the remaining scores (-inf -> probability 0), in double.
/// Errors (InvalidArgument): options that fail validate(); empty logits; a NaN logit (naming its
/// index); with temperature > 0, a +inf logit or scaled logits that overflow float32, or no finite
/// logit at all.
Error sampling_distribution(std::span<const float> logits, const SamplingOptions& options,
                            std::vector<float>* probs);

/// Chooses tokens from logits: greedy, or a seeded random draw from sampling_distribution.
/// Deterministic: the same options (seed included) and the same logits give the same tokens on
/// every platform (the uniform double is built from the generator's raw 64 bits, not with
/// std::uniform_real_distribution, whose output is implementation-defined). Not thread-safe: one
/// Sampler per generation.
class Sampler {
 public:
  /// Options should have passed validate(); next() returns its error otherwise.
  explicit Sampler(const SamplingOptions& options);

  /// The next token id in [0, vocab). logits: float32 [vocab] of one step.
  /// banned_ids: token ids whose logit is set to -inf before anything else (as transformers'
  /// MinNewTokensLengthLogitsProcessor does with eos ids: `--ignore-eos`); each must be in
  /// [0, vocab). Greedy (temperature 0): the first maximal logit (torch.argmax). Otherwise: the
  /// inverse CDF of sampling_distribution at u = (raw64 >> 11) * 2^-53, u in [0, 1); tokens of
  /// probability 0 are never chosen. One raw draw per call in sampling mode, none when greedy.
  /// Errors (InvalidArgument): invalid options, empty logits, a NaN logit, a banned id out of
  /// range, every token banned or -inf, and the errors of sampling_distribution.
  Result<int64_t> next(std::span<const float> logits, std::span<const int64_t> banned_ids = {});

  const SamplingOptions& options() const { return options_; }

 private:
  SamplingOptions options_;
  std::mt19937_64 rng_;
  std::vector<float> masked_;   // logits with the banned ids at -inf
  std::vector<float> scratch_;  // warped scores
  std::vector<double> probs_;
};

/// Options of generate().
struct GenerateOptions {
  /// How many tokens to generate at most (>= 0; 0 returns no tokens without running a step).
  int64_t max_new_tokens = 0;
  SamplingOptions sampling;
  /// Generation stops after one of these ids is produced (it is included in the output, as in
  /// transformers). Empty: stop only at max_new_tokens.
  std::vector<int64_t> eos_ids;
  /// true: the eos ids are banned (logit -inf at every step) and generation always produces
  /// max_new_tokens tokens (transformers: min_new_tokens = max_new_tokens).
  bool ignore_eos = false;
  /// The program's context length (`llm.max_seq_len`): prompt + max_new_tokens must not exceed it.
  /// Must be > 0.
  int64_t max_seq_len = 0;
};

/// Measurements of one generate() call (times are wall clock of the steps plus sampling; the
/// on_token callback is not counted).
struct GenerateStats {
  double prefill_tokens_per_s = 0;    ///< prompt tokens / time_to_first_token
  double decode_tokens_per_s = 0;     ///< decode steps / their total time (0 without any)
  double time_to_first_token_ms = 0;  ///< prefill step + sampling the first new token
  double peak_rss_mib = 0;            ///< the process's peak resident set (peak_rss_mib()), MiB
  int64_t prefill_tokens = 0;         ///< = prompt size
  int64_t decode_tokens = 0;          ///< steps after the prefill (= new tokens - 1, or 0)
};

/// Runs the model on `tokens` (int64 ids, 1 <= size) placed at cache positions
/// [input_pos, input_pos + tokens.size()) and returns the float32 logits [vocab] of the last one.
/// The span must stay valid until the next call of the step function (e.g. a view into the
/// method's output). An error is returned by generate() with the step's context added.
using StepFn = std::function<Result<std::span<const float>>(std::span<const int64_t> tokens, int64_t input_pos)>;

/// The checks generate() makes before any step runs (InvalidArgument): an empty prompt,
/// max_new_tokens < 0, max_seq_len <= 0, prompt.size() + max_new_tokens > max_seq_len (the message
/// names the limit: "prompt of 40 tokens + 16 new tokens exceeds the program's max_seq_len of 48"),
/// invalid sampling options, a negative eos id. A runner calls it to tell a bad request (exit
/// status 2 of `kiln generate`) from a failure while generating (exit status 1).
Error check_generate_request(std::span<const int64_t> prompt, const GenerateOptions& options);

/// Generates up to options.max_new_tokens token ids after `prompt` and returns the new ids only.
///
/// Checks first, before any step runs: check_generate_request().
/// Then: prefill = step(prompt, 0); the first new token is sampled from its logits; each further
/// token comes from step({previous token}, prompt.size() + generated - 1), i.e. the token sampled
/// from the prefill is fed at position prompt.size(), the next at prompt.size() + 1, and so on.
/// The last new token is never fed back (max_new_tokens steps in all at most). Stops after
/// max_new_tokens tokens or after an eos id. on_token, when set, is called with each new id as
/// soon as it is chosen (streaming). A step error, a step returning empty logits or logits whose
/// size changes between steps, or a sampling error ends generation with that error (the message
/// says which step). stats, when given, is filled on success.
Result<std::vector<int64_t>> generate(const StepFn& step, std::span<const int64_t> prompt,
                                      const GenerateOptions& options, GenerateStats* stats = nullptr,
                                      const std::function<void(int64_t)>& on_token = {});

/// The process's peak resident set size in MiB: VmHWM of /proc/self/status (this program's own
/// high-water mark), else getrusage's ru_maxrss (which Linux carries over fork and exec); 0 where
/// neither is available. Used by kiln generate and kiln bench.
double peak_rss_mib();

}  // namespace kiln
