"""The sampler's distribution (kiln._kiln.sampling_distribution, include/kiln/llm.h) against Hugging Face
transformers' logits warpers as generate(do_sample=True) applies them: TemperatureLogitsWarper,
TopKLogitsWarper, TopPLogitsWarper (in that order), then softmax. Also the Python exposure of the
Sampler and of the generation loop (kiln._kiln.Sampler, kiln._kiln.generate)."""
import numpy as np
import pytest
import torch

from kiln import KilnError, _kiln

transformers = pytest.importorskip("transformers")
from transformers.generation.logits_process import (  # noqa: E402
    TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)


def f32(x: float) -> float:
    """The float32 value the C++ options hold (Kiln's temperature and top_p are float)."""
    return float(np.float32(x))


def transformers_distribution(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    # As transformers' _get_logits_processor builds them (generation/utils.py): each only when active.
    scores = torch.from_numpy(logits.astype(np.float32))[None, :]
    ids = torch.zeros((1, 1), dtype=torch.long)
    if temperature != 1.0:
        scores = TemperatureLogitsWarper(f32(temperature))(ids, scores)
    if top_k != 0:
        scores = TopKLogitsWarper(top_k=top_k)(ids, scores)
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p=f32(top_p))(ids, scores)
    return torch.nn.functional.softmax(scores, dim=-1)[0].numpy()


def logit_vectors():
    rng = np.random.default_rng(18)
    out = {
        "normal_1000": rng.normal(0, 3, 1000),
        "wide_50": rng.normal(0, 20, 50),
        "uniform_257": rng.uniform(-5, 5, 257),
        # Ties: small integers repeat, so the top-k threshold and the top-p cut meet equal logits.
        "ties_64": rng.integers(-3, 4, 64).astype(np.float64),
        "one_token": np.array([1.5]),
        "with_-inf": np.where(rng.uniform(size=100) < 0.3, -np.inf, rng.normal(0, 2, 100)),
    }
    return {k: v.astype(np.float32) for k, v in out.items()}


SETTINGS = [
    # (temperature, top_k, top_p): each option alone, then combined.
    (1.0, 0, 1.0),
    (0.7, 0, 1.0),
    (1.8, 0, 1.0),
    (1.0, 1, 1.0),
    (1.0, 5, 1.0),
    (1.0, 50, 1.0),
    (1.0, 0, 0.9),
    (1.0, 0, 0.5),
    (1.0, 0, 0.05),
    (0.7, 40, 1.0),
    (0.7, 0, 0.95),
    (1.0, 20, 0.8),
    (0.6, 10, 0.9),
    (1.3, 100, 0.7),
]


def top_p_straddles_tie(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> bool:
    """True when equal logits lie on both sides of the top-p cut: then which of them transformers drops
    depends on the order of its (unstable) torch.sort, and Kiln's choice (lower index first) is one of
    the valid outcomes."""
    if top_p >= 1.0:
        return False
    scores = torch.from_numpy(logits)[None, :] / f32(temperature)
    if top_k:
        scores = TopKLogitsWarper(top_k=top_k)(None, scores)
    s, _ = torch.sort(scores, descending=False)
    c = s.softmax(-1).cumsum(-1)[0]
    removed = (c <= 1 - f32(top_p)).numpy()
    removed[-1] = False
    s = s[0].numpy()
    kept_values = set(s[~removed].tolist())
    return any(v in kept_values for v in s[removed].tolist() if np.isfinite(v))


@pytest.mark.parametrize("name", list(logit_vectors()))
@pytest.mark.parametrize("temperature,top_k,top_p", SETTINGS)
def test_distribution_matches_transformers_warpers(name, temperature, top_k, top_p):
    logits = logit_vectors()[name]
    got = _kiln.sampling_distribution(logits, temperature=temperature, top_k=top_k, top_p=top_p)
    want = transformers_distribution(logits, temperature, top_k, top_p)
    assert got.dtype == np.float32 and got.shape == logits.shape
    if top_p_straddles_tie(logits, temperature, top_k, top_p):
        # Equal logits straddle the top-p cut: which of them transformers drops depends on its unstable
        # torch.sort; the distributions agree up to a permutation among equal logits.
        for value in np.unique(logits):
            group = logits == value
            np.testing.assert_allclose(np.sort(got[group]), np.sort(want[group]), rtol=0, atol=1e-6)
        return
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    # The same support: a token transformers removes has probability exactly 0 here too.
    np.testing.assert_array_equal(got == 0, want == 0)
    assert abs(float(got.astype(np.float64).sum()) - 1.0) < 1e-5


def test_ties_at_the_top_k_threshold_are_kept():
    logits = np.array([3, 1, 2, 2, 2, 0], np.float32)
    got = _kiln.sampling_distribution(logits, top_k=2)
    want = transformers_distribution(logits, 1.0, 2, 1.0)
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert (got > 0).sum() == 4  # 3 and the three 2s


def test_top_p_tie_straddling_the_cut_drops_the_lower_index():
    # Four equal logits (0.25 each): top_p 0.6 drops cumulative <= 0.4, i.e. the first in ascending
    # order. Kiln orders equal logits by index (torch.sort(stable=True)); transformers' torch.sort is
    # not stable, so it may drop any one of them: the same distribution up to which token.
    logits = np.zeros(4, np.float32)
    got = _kiln.sampling_distribution(logits, top_p=0.6)
    np.testing.assert_allclose(got, [0, 1 / 3, 1 / 3, 1 / 3], atol=1e-7)
    want = transformers_distribution(logits, 1.0, 0, 0.6)
    np.testing.assert_allclose(np.sort(got), np.sort(want), atol=1e-6)


def test_greedy_distribution_is_one_hot_at_the_first_maximum():
    got = _kiln.sampling_distribution(np.array([0, 5, 5, 1], np.float32), temperature=0.0)
    np.testing.assert_array_equal(got, [0, 1, 0, 0])


@pytest.mark.parametrize("kwargs,text", [
    (dict(temperature=-1.0), "temperature must be >= 0"),
    (dict(top_k=-2), "top_k must be >= 0"),
    (dict(top_p=0.0), "top_p must be in (0, 1]"),
    (dict(top_p=1.5), "top_p must be in (0, 1]"),
])
def test_invalid_options(kwargs, text):
    with pytest.raises(KilnError, match=text.replace("(", r"\(").replace("]", r"\]")) as e:
        _kiln.sampling_distribution(np.zeros(3, np.float32), **kwargs)
    assert e.value.args[1] == "InvalidArgument"
    with pytest.raises(KilnError):
        _kiln.Sampler(**kwargs)


def test_nan_logit_is_an_error():
    with pytest.raises(KilnError, match="token 1 is NaN"):
        _kiln.sampling_distribution(np.array([0, np.nan], np.float32))


def test_sampler_seed_top_k_1_and_banned_ids():
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 2, 500).astype(np.float32)

    def draws(seed, **kw):
        s = _kiln.Sampler(temperature=1.0, seed=seed, **kw)
        return [s.next(logits) for _ in range(50)]

    assert draws(7) == draws(7)
    assert draws(7) != draws(8)
    assert set(draws(3, top_k=1)) == {int(np.argmax(logits))}
    greedy = _kiln.Sampler()
    best = int(np.argmax(logits))
    assert greedy.next(logits) == best
    assert greedy.next(logits, banned_ids=[best]) == int(np.argsort(logits)[-2])
    with pytest.raises(KilnError, match="banned token id 500"):
        greedy.next(logits, banned_ids=[500])


def test_generate_loop_over_a_python_step():
    vocab, calls = 16, []

    def step(tokens, input_pos):
        calls.append((tokens.tolist(), input_pos))
        logits = np.zeros((1, vocab), np.float32)
        logits[0, (int(tokens[-1]) + 1) % vocab] = 1.0
        return logits

    streamed = []
    ids, stats = _kiln.generate(step, [2, 7, 1], max_new_tokens=4, max_seq_len=8, on_token=streamed.append)
    assert ids == [2, 3, 4, 5] and streamed == ids
    assert calls == [([2, 7, 1], 0), ([2], 3), ([3], 4), ([4], 5)]
    assert stats["prefill_tokens"] == 3 and stats["decode_tokens"] == 3 and stats["peak_rss_mib"] > 0
    # eos stops (and is returned); ignore_eos bans it.
    assert _kiln.generate(step, [2], max_new_tokens=5, max_seq_len=8, eos_ids=[4])[0] == [3, 4]
    assert _kiln.generate(step, [2], max_new_tokens=3, max_seq_len=8, eos_ids=[4], ignore_eos=True)[0] == [3, 0, 1]
    # The limit is checked before the first step.
    calls.clear()
    with pytest.raises(KilnError, match="prompt of 6 tokens \\+ 3 new tokens exceeds the program's max_seq_len of 8"):
        _kiln.generate(step, [1] * 6, max_new_tokens=3, max_seq_len=8)
    assert calls == []

    def failing(tokens, input_pos):
        raise ValueError("model failed")

    with pytest.raises(ValueError, match="model failed"):
        _kiln.generate(failing, [1], max_new_tokens=2, max_seq_len=8)
