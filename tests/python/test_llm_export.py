"""LLM export and generation end to end (issue 18): tiny Hugging Face checkpoints (seeded random
weights, tests/python/llm_models.py) exported with ``kiln.export_llm`` / ``python -m kiln
export-llm``, run by the C++ ``kiln generate`` and by ``kiln.generate`` / ``python -m kiln generate``.

- greedy ``kiln generate --ignore-eos`` (C++ CLI) gives transformers' ``model.generate(do_sample=False,
  min_new_tokens=16, max_new_tokens=16)`` ids for prompts of 1, 7 and max_seq_len - 16 tokens, on
  portable and cpu kernels, for Llama, Qwen 2, Qwen 3, Mistral and Gemma 3 (sliding windows of 6,
  shorter than the prompts), and for Llama with the linear, llama3 and yarn rope types;
  every step's logits (prefill, then one decode call per token fed eager's tokens) match eager
  transformers within 1e-4 relative. An eager near-tie (top-2 within 1e-4 of the largest logit) is
  warned about; more than one per case fails;
- one program serves every length 1..max_seq_len; a prompt past it, or positions past it, is
  InvalidArgument / a generate error naming the limit, and the session's state is unchanged; a wrong
  token dtype / batch / rank names the expected int64[1, seq <= 48];
- a program whose strings (names, ops, metadata) hold flipped bytes is refused with printable text;
- two sessions of one program, interleaved call by call from two threads, give each run's own tokens;
  reset() gives the same tokens again; the same seed gives the same tokens (C++ and Python); top-k 1 is
  greedy;
- ``kiln inspect`` (text and --json) shows the states, the seq symbol, the dims and the llm.* metadata;
- xnnpack declines the symbolic-size nodes with its reason and the program still generates the same;
- w8 and w4 programs compute eager transformers with the dequantized weights;
- ``python -m kiln export-llm`` (w8) and ``python -m kiln generate`` (ids and --tokenizer text), and
  their errors (exit 2 for every bad argument, a prompt the program's limits refuse included).

Each tiny model is exported once per module (max_seq_len 48).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import threading
import types
import warnings

import numpy as np
import pytest
import torch

import kiln
from kiln import llm
from kiln.__main__ import main as kiln_main

import llm_models

# The mlx programs run on MLX's CPU device (no GPU here); set before kiln loads any program.
os.environ.setdefault("KILN_MLX_DEVICE", "cpu")
HAVE_MLX = "mlx" in kiln._kiln.backend_names()
MLX_ARCHS = ("gemma3", "llama", "qwen3")  # issue 20: Llama, Qwen 3 and Gemma 3 delegated whole to mlx

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KILN_CLI = os.environ.get("KILN_CLI", os.path.join(ROOT, "build", "tools", "kiln"))

MAX_SEQ = 48
NEW = 16
PROMPT_LENS = (1, 7, MAX_SEQ - NEW)
RTOL = 1e-4
ARCHS = sorted(llm_models.BUILDERS)  # gemma3, llama, mistral, qwen2, qwen3


def _prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, llm_models.VOCAB, (n,), generator=g, dtype=torch.int64).tolist()


def _rel_err(a, ref) -> float:
    a, ref = np.asarray(a, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    return float(np.abs(a - ref).max() / max(np.abs(ref).max(), 1e-30))


def _state_snapshot(program, session) -> dict[str, np.ndarray]:
    return {s["name"]: session.state(s["name"]) for s in program.states}


def _assert_states_equal(before: dict, after: dict, what: str):
    assert before.keys() == after.keys()
    for name in before:
        assert np.array_equal(before[name], after[name]), f"{what}: state {name} changed"


def _execute(method, session, tokens, pos) -> np.ndarray:
    out = method.execute([np.asarray(tokens, dtype=np.int64).reshape(1, -1), np.array([pos], dtype=np.int64)],
                         session)
    assert out[0].shape == (1, llm_models.VOCAB)
    return out[0][0]


def _greedy(method, session, prompt, n, eos=(), barrier=None) -> list[int]:
    """Greedy decoding with eos banned, one execute per step (prefill, then decode)."""
    logits = _execute(method, session, prompt, 0)
    got = []
    for step in range(n):
        masked = logits.copy()
        masked[list(eos)] = -np.inf
        got.append(int(masked.argmax()))
        if barrier is not None:
            barrier.wait()
        if step + 1 < n:
            logits = _execute(method, session, [got[-1]], len(prompt) + step)
    return got


def kiln_cli(*args, check_rc: int | None = 0) -> subprocess.CompletedProcess:
    if not os.path.isfile(KILN_CLI):
        pytest.fail(f"{KILN_CLI} not built (set KILN_CLI or build the tools)")
    r = subprocess.run([KILN_CLI, *map(str, args)], capture_output=True, text=True, timeout=120)
    if check_rc is not None:
        assert r.returncode == check_rc, f"kiln {' '.join(map(str, args))}: rc {r.returncode}\n{r.stderr}"
    return r


def cli_generate(path, prompt, n, *extra, kernels="cpu") -> list[int]:
    r = kiln_cli("generate", path, "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens", n,
                 "--kernels", kernels, "--threads", 1, "--json", *extra)
    out = json.loads(r.stdout)
    assert set(out) >= {"ids", "prefill_tokens_per_s", "decode_tokens_per_s", "time_to_first_token_ms",
                        "peak_rss_mib"}
    return out["ids"]


class _Case:
    """One tiny checkpoint, its transformers reference and its exported program."""

    def __init__(self, name: str, tmp):
        self.name = name
        self.dir = llm_models.BUILDERS[name](tmp)
        self.hf, self.config = llm.load_llm(self.dir)
        self.path = os.path.join(os.fspath(tmp), f"{name}.kiln")
        kiln.export_llm(self.dir, MAX_SEQ, out=self.path, verbose=False)
        self.meta = llm.llm_metadata(self.config, MAX_SEQ, self.dir)
        self.eos = [int(i) for i in self.meta["llm.eos_ids"].split(",") if i]
        self._refs: dict[int, types.SimpleNamespace] = {}
        self._programs: dict[str, kiln.LoadedProgram] = {}

    def program(self, kernels: str = "cpu") -> kiln.LoadedProgram:
        """kernels: "portable", "cpu", or "mlx" (the program exported with --require-delegation mlx,
        on MLX's CPU device)."""
        if kernels not in self._programs:
            if kernels == "mlx":
                self._programs[kernels] = kiln.load(self.mlx_path(), num_threads=1,
                                                    backend_settings={"mlx.device": "cpu"})
            else:
                self._programs[kernels] = kiln.load(self.path, portable_kernels_only=kernels == "portable",
                                                    num_threads=1)
        return self._programs[kernels]

    def mlx_path(self) -> str:
        """The program delegated whole to mlx (require_delegation), exported once; its report in
        self.mlx_report."""
        if not HAVE_MLX:
            pytest.skip("the mlx backend is not built")
        path = os.path.join(os.path.dirname(self.path), f"{self.name}_mlx.kiln")
        if not os.path.exists(path):
            rj = path + ".json"
            kiln.export_llm(self.dir, MAX_SEQ, out=path, require_delegation="mlx", report_json=rj, verbose=False)
            with open(rj) as f:
                self.mlx_report = json.load(f)
        return path

    def path_for(self, kernels: str) -> tuple[str, str]:
        """(program file, --kernels value) of `kiln generate` for kernels portable / cpu / mlx."""
        return (self.mlx_path(), "cpu") if kernels == "mlx" else (self.path, kernels)

    @torch.no_grad()
    def ref(self, n: int) -> types.SimpleNamespace:
        """transformers' greedy ids for the prompt of length n, and eager logits of every step (a full
        forward over prompt + eager's tokens so far, last position)."""
        if n not in self._refs:
            prompt = _prompt(n, seed=100 + n)
            p = torch.tensor([prompt])
            want = self.hf.generate(p, attention_mask=torch.ones_like(p), do_sample=False, min_new_tokens=NEW,
                                    max_new_tokens=NEW)[0, n:].tolist()
            assert len(want) == NEW
            logits, near_ties = [], []
            for step in range(NEW):
                seq = torch.tensor([prompt + want[:step]])
                ref = self.hf(seq, use_cache=False).logits[0, -1].double()
                logits.append(ref.numpy())
                masked = ref.clone()
                masked[self.eos] = float("-inf")
                a, b = masked.topk(2).values.tolist()
                if a - b < RTOL * float(ref.abs().max()):
                    near_ties.append(step)
            self._refs[n] = types.SimpleNamespace(prompt=prompt, want=want, logits=logits, near_ties=near_ties)
        return self._refs[n]


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    store: dict[str, _Case] = {}

    def get(name: str) -> _Case:
        if name not in store:
            store[name] = _Case(name, tmp_path_factory.mktemp(name))
        return store[name]

    return get


@pytest.fixture(scope="module", params=ARCHS)
def arch(request, cases) -> _Case:
    return cases(request.param)


@pytest.fixture(scope="module")
def llama(cases) -> _Case:
    return cases("llama")


# ------------------------------------------------------------------------------------------------
# greedy against transformers

def _skip_unless_mlx_arch(arch, kernels):
    if kernels == "mlx" and arch.name not in MLX_ARCHS:
        pytest.skip(f"issue 20 delegates {', '.join(MLX_ARCHS)} to mlx in the tests")


@pytest.mark.parametrize("kernels", ["portable", "cpu", "mlx"])
def test_step_logits_match_eager(arch, kernels):
    """Prefill then decode on one session, fed eager's tokens: every step's logits within 1e-4 of
    eager's, the argmax (eos banned) eager's token except at an eager near-tie. mlx: the program
    delegated whole to mlx, KV cache held in MLX's memory, on MLX's CPU device."""
    _skip_unless_mlx_arch(arch, kernels)
    program = arch.program(kernels)
    method = program.method()
    for n in PROMPT_LENS:
        ref = arch.ref(n)
        if ref.near_ties:
            warnings.warn(f"{arch.name} prompt {n}: eager near-tie at step(s) {ref.near_ties}; continuing from "
                          "eager's token")
        assert len(ref.near_ties) <= 1, f"{arch.name} prompt {n}: eager near-ties at steps {ref.near_ties}"
        session = program.new_session()
        logits = _execute(method, session, ref.prompt, 0)
        for step in range(NEW):
            err = _rel_err(logits, ref.logits[step])
            assert err <= RTOL, f"{arch.name} {kernels} prompt {n} step {step}: logits rel err {err:.2e}"
            masked = logits.copy()
            masked[arch.eos] = -np.inf
            tok = int(masked.argmax())
            assert tok == ref.want[step] or step in ref.near_ties, (
                f"{arch.name} {kernels} prompt {n} step {step}: token {tok}, transformers gave {ref.want[step]}")
            if step + 1 < NEW:
                logits = _execute(method, session, [ref.want[step]], n + step)  # eager's token
        assert not session.failed


@pytest.mark.parametrize("kernels", ["portable", "cpu", "mlx"])
def test_cli_greedy_matches_transformers_generate(arch, kernels):
    """`kiln generate --ignore-eos --json` (C++) with one program file for every prompt length."""
    _skip_unless_mlx_arch(arch, kernels)
    path, kset = arch.path_for(kernels)
    for n in PROMPT_LENS:
        ref = arch.ref(n)
        got = cli_generate(path, ref.prompt, NEW, "--ignore-eos", kernels=kset)
        assert len(got) == NEW
        if got != ref.want:
            first = next(i for i, (a, b) in enumerate(zip(got, ref.want)) if a != b)
            assert first in ref.near_ties, (f"{arch.name} {kernels} prompt {n}: kiln generate {got}, transformers "
                                            f"{ref.want} (first difference at step {first}, not an eager near-tie)")
            warnings.warn(f"{arch.name} {kernels} prompt {n}: diverged at eager near-tie step {first}")
            assert got[:first] == ref.want[:first]


def test_python_generate_matches_cli(arch):
    ref = arch.ref(7)
    ids, stats = kiln.generate(arch.program("cpu"), ref.prompt, NEW, ignore_eos=True)
    assert ids == cli_generate(arch.path, ref.prompt, NEW, "--ignore-eos")
    assert stats["prefill_tokens"] == 7 and stats["decode_tokens"] == NEW - 1
    assert stats["decode_tokens_per_s"] > 0 and stats["peak_rss_mib"] > 0


def test_prefault_and_no_mmap_loads_give_the_same_tokens(llama):
    """kiln.load(prefault=True) (MAP_POPULATE, what both generate commands use) and
    kiln.load(use_mmap=False) / `kiln generate --no-mmap` (the file read into memory) run the same
    program: the same greedy tokens as a plain load."""
    ref = llama.ref(5)
    plain, _ = kiln.generate(llama.program("cpu"), ref.prompt, NEW, ignore_eos=True)
    pre, _ = kiln.generate(kiln.load(llama.path, num_threads=1, prefault=True), ref.prompt, NEW, ignore_eos=True)
    assert pre == plain
    copied, _ = kiln.generate(kiln.load(llama.path, num_threads=1, use_mmap=False), ref.prompt, NEW, ignore_eos=True)
    assert copied == plain
    assert cli_generate(llama.path, ref.prompt, NEW, "--ignore-eos", "--no-mmap") == plain


# ------------------------------------------------------------------------------------------------
# limits: one program for 1..max_seq_len, errors leave the session unchanged

def test_max_seq_len_prompt_and_limits(llama):
    program = llama.program("cpu")
    method = program.method()
    # the full bound in one prefill
    prompt = _prompt(MAX_SEQ, seed=5)
    session = program.new_session()
    logits = _execute(method, session, prompt, 0)
    with torch.no_grad():
        ref = llama.hf(torch.tensor([prompt]), use_cache=False).logits[0, -1].numpy()
    assert _rel_err(logits, ref) <= RTOL

    session = program.new_session()
    _execute(method, session, prompt[:10], 0)
    before = _state_snapshot(program, session)
    assert any(np.abs(v).max() > 0 for v in before.values())

    def refused(tokens, pos, match):
        with pytest.raises(kiln.KilnError, match=match) as ei:
            method.execute([np.asarray(tokens, dtype=np.int64).reshape(1, -1), np.array([pos])], session)
        assert ei.value.args[1] == "InvalidArgument", ei.value.args
        assert not session.failed, f"{match}: the session is marked failed"
        _assert_states_equal(before, _state_snapshot(program, session), f"after refusing {len(tokens)} at {pos}")

    # longer than the bound: the input check, before anything runs
    refused(_prompt(MAX_SEQ + 1, seed=6), 0, r"'tokens' dim 1 is 49, outside symbol 'seq' in \[1, 48\]")
    refused([], 0, r"'tokens' dim 1 is 0, outside symbol 'seq' in \[1, 48\]")
    # positions past the cache: kiln.check_range refuses input_pos before any cache write
    refused(_prompt(10, seed=7), MAX_SEQ - 9, r"input_pos .* is 39, outside \[0, 38\]")
    refused([5], MAX_SEQ, r"input_pos .* is 48, outside \[0, 47\]")
    # the session still works, from where it was
    logits = _execute(method, session, prompt[10:11], 10)
    with torch.no_grad():
        ref = llama.hf(torch.tensor([prompt[:11]]), use_cache=False).logits[0, -1].numpy()
    assert _rel_err(logits, ref) <= RTOL

    # generate: prompt + new tokens past the bound is refused before the first step
    before = _state_snapshot(program, session)
    with pytest.raises(kiln.KilnError, match="exceeds the program's max_seq_len of 48"):
        kiln.generate(program, _prompt(MAX_SEQ - NEW + 1, seed=8), NEW, session=session)
    with pytest.raises(kiln.KilnError, match="max_seq_len of 48"):
        kiln.generate(program, _prompt(MAX_SEQ + 1, seed=8), 1, session=session)
    assert not session.failed
    _assert_states_equal(before, _state_snapshot(program, session), "after refused generate")

    # the C++ runner: a request past the limit is a bad argument (exit 2, as every other one), the
    # message names the limit
    for n, new in ((MAX_SEQ - NEW + 1, NEW), (MAX_SEQ + 1, 1)):
        r = kiln_cli("generate", llama.path, "--prompt-ids", ",".join(map(str, _prompt(n, 9))), "-n", new,
                     check_rc=2)
        assert "max_seq_len of 48" in r.stderr, r.stderr


@pytest.mark.parametrize("kernels", ["cpu", "mlx"])
def test_negative_input_pos_leaves_state_unchanged(llama, kernels):
    """input_pos -1 (index_put alone would take it as the last position, ATen's negative index): the
    export routes input_pos through kiln.check_range first, so the call fails before any cache
    write; the state is unchanged and the session goes on. mlx: the same with the cache held by the
    delegate (its check fails the call before the delegate keeps the new cache; session.state reads
    MLX's copy)."""
    program = llama.program(kernels)
    method = program.method()
    session = program.new_session()
    ref = llama.ref(7)
    _execute(method, session, ref.prompt, 0)
    before = {s["name"]: session.state(s["name"]) for s in program.states}
    for pos, n in ((-1, 1), (-5, 3), (48, 1), (46, 3)):
        with pytest.raises(kiln.KilnError, match=r"input_pos .* outside \[0, "):
            _execute(method, session, [5] * n, pos)
    assert not session.failed
    for name, v in before.items():
        np.testing.assert_array_equal(session.state(name), v)
    session.reset()
    assert _greedy(method, session, ref.prompt, 4, llama.eos) == ref.want[:4]


def test_input_errors_show_the_bounded_dim(llama):
    """A wrong token dtype, batch or rank names the expected type with its symbolic dim and bound,
    int64[1, seq <= 48], never the bare upper bound int64[1, 48] (which reads as "exactly 48")."""
    program = llama.program("cpu")
    method = program.method()
    session = program.new_session()
    pos = np.array([0], dtype=np.int64)
    want = "int64[1, seq <= 48]"

    def message(*inputs) -> str:
        with pytest.raises(kiln.KilnError) as ei:
            method.execute(list(inputs), session)
        assert ei.value.args[1] == "InvalidArgument", ei.value.args
        msg = ei.value.args[0]
        assert "int64[1, 48]" not in msg, msg
        return msg

    assert f"input 0 'tokens': expected {want}, got int32[1, 5]" in message(np.ones((1, 5), np.int32), pos)
    assert f"input 0 'tokens': expected {want}, got int64[2, 5]" in message(np.ones((2, 5), np.int64), pos)
    assert f"input 0 'tokens': expected {want}, got int64[5]" in message(np.ones((5,), np.int64), pos)
    # a NumPy dtype that is no Kiln dtype (the binding's own check)
    assert f"input 0 'tokens': expected {want}, got a NumPy array of dtype uint32" in message(
        np.ones((1, 5), np.uint32), pos)
    # past the bound: the symbol's range and the expected type
    assert f"'tokens' dim 1 is 49, outside symbol 'seq' in [1, 48] (expected {want})" in message(
        np.ones((1, 49), np.int64), pos)
    # a missing input
    assert f"missing input 0 'tokens' (expected {want})" in message()
    assert not session.failed


def _with_flatbuffer_string_replaced(data: bytes, old: bytes, new: bytes) -> bytes:
    """`data` with the first FlatBuffer string `old` (uint32 length, bytes, NUL, inside the
    FlatBuffer) overwritten by `new` of the same length."""
    assert len(old) == len(new)
    fb_offset, fb_size = int.from_bytes(data[16:24], "little"), int.from_bytes(data[24:32], "little")
    at = data.find(len(old).to_bytes(4, "little") + old + b"\0", fb_offset, fb_offset + fb_size)
    assert at >= 0, f"no FlatBuffer string {old!r}"
    return data[:at + 4] + new + data[at + 4 + len(new):]


@pytest.mark.parametrize("old", [b"forward", b"tokens", b"k_cache_0", b"aten.embedding", b"kiln.sdpa_kv_cache",
                                 b"llm.max_seq_len", b"llama"],
                         ids=["method", "input", "state", "op", "kiln-op", "metadata-key", "metadata-value"])
@pytest.mark.parametrize("junk", [b"\xff\xfe", b"\xc3(", b"\x1b["], ids=["ff-fe", "bad-continuation", "escape"])
def test_corrupted_strings_give_printable_errors(llama, tmp_path, old, junk):
    """Bytes flipped inside a string of a valid program (a name, an op, a metadata key or value):
    loading is a KilnError (InvalidProgram) whose message is printable text, the bytes written as
    \\xNN, never a UnicodeDecodeError, mojibake or a raw control character; nothing loads that
    would hand Python undecodable names or metadata. (An escape sequence is valid UTF-8: refused in
    names, allowed in metadata values, where it reaches Python as the text it is.)"""
    data = open(llama.path, "rb").read()
    new = old[:2] + junk + old[2 + len(junk):]
    path = tmp_path / "corrupted.kiln"
    path.write_bytes(_with_flatbuffer_string_replaced(data, old, new))
    if junk == b"\x1b[" and old == b"llama":
        program = kiln.load(path, num_threads=1)
        assert program.metadata["llm.arch"] == new.decode()
        # `kiln inspect` shows the value with the escape written as \x1b, not raw (a terminal escape)
        r = subprocess.run([KILN_CLI, "inspect", str(path)], capture_output=True, timeout=60)
        assert r.returncode == 0 and b"\x1b" not in r.stdout and b"llm.arch = ll\\x1b[a" in r.stdout, r.stdout
        return
    with pytest.raises(kiln.KilnError) as ei:
        kiln.load(path, num_threads=1)
    msg, code = ei.value.args
    assert code == "InvalidProgram", ei.value.args
    assert msg.isprintable() and "\ufffd" not in msg, repr(msg)
    assert "\\x" + f"{junk[0]:02x}" in msg, msg
    # the C++ tool says the same, as text
    r = subprocess.run([KILN_CLI, "inspect", str(path)], capture_output=True, timeout=60)
    assert r.returncode == 1
    err = r.stderr.decode("utf-8")  # valid UTF-8
    assert "InvalidProgram" in err and err.strip().isprintable(), err


def test_malformed_llm_metadata_is_an_invalid_program(llama, tmp_path, capsys):
    """llm.* integers that are not decimal positive integers (a damaged file) make both generate
    commands fail with exit 1 naming the value, not a request error (exit 2) or a partial parse."""
    data = open(llama.path, "rb").read()
    for i, (old, new) in enumerate(((b"256", b"2x6"), (b"256", b"-12"), (b"48", b"00"))):
        path = tmp_path / f"bad{i}.kiln"
        path.write_bytes(_with_flatbuffer_string_replaced(data, old, new))
        r = subprocess.run([KILN_CLI, "generate", str(path), "--prompt-ids", "1", "-n", "1"], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 1 and f"is '{new.decode()}', not a positive integer" in r.stderr, r.stderr
        rc = kiln_main(["generate", str(path), "--prompt-ids", "1", "-n", "1"])
        err = capsys.readouterr().err
        assert rc == 1 and f"is '{new.decode()}', not a positive integer" in err, err


def test_compile_refuses_a_metadata_key_the_loader_would_refuse():
    """A metadata key with a control character is refused when the program is compiled (the loader
    refuses such a file), naming it escaped; a value may hold one (valid UTF-8)."""
    g = kiln.Graph()
    x = g.add_input("x", "float32", [2])
    g.set_outputs(list(g.add_node("aten.relu", [x], {})))
    pb = kiln.ProgramBuilder()
    pb.add_method("forward", g)
    pb.set_metadata("k\x1bey", "v")
    with pytest.raises(kiln.KilnError) as ei:
        pb.compile()
    assert ei.value.args[1] == "InvalidArgument" and "metadata key 'k\\x1bey'" in ei.value.args[0], ei.value.args
    pb = kiln.ProgramBuilder()
    pb.add_method("forward", g)
    pb.set_metadata("key", "v\x1b[0m")
    data, _ = pb.compile()
    assert kiln.load_bytes(data).metadata["key"] == "v\x1b[0m"


@pytest.mark.parametrize("rope", [{"rope_type": "linear", "factor": 2.0},
                                  {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
                                  {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}],
                         ids=lambda r: r["rope_type"])
def test_static_rope_types_export(tmp_path, rope):
    """The rope types kiln.llm accepts besides the default (SUPPORTED_ROPE_TYPES: frequencies fixed at
    init) export and compute eager transformers: prefill, then decode steps fed eager's tokens, every
    step's logits within 1e-4 and greedy tokens equal to transformers' generate."""
    from transformers import LlamaConfig, LlamaForCausalLM
    assert rope["rope_type"] in llm.SUPPORTED_ROPE_TYPES
    torch.manual_seed(0)
    cfg = LlamaConfig(**llm_models._COMMON, rope_scaling=rope, tie_word_embeddings=False)
    d = llm_models._save(llm_models._init(LlamaForCausalLM(cfg), 5), os.path.join(tmp_path, "ckpt"))
    out = tmp_path / "rope.kiln"
    kiln.export_llm(d, MAX_SEQ, out=out, verbose=False)
    hf, _ = llm.load_llm(d)
    program = kiln.load(out, num_threads=1)
    prompt = _prompt(20, seed=21)
    with torch.no_grad():
        p = torch.tensor([prompt])
        want = hf.generate(p, attention_mask=torch.ones_like(p), do_sample=False, min_new_tokens=NEW,
                           max_new_tokens=NEW)[0, 20:].tolist()
    session = program.new_session()
    logits = _execute(program.method(), session, prompt, 0)
    for step in range(NEW):
        ref = _last_logits(hf, prompt + want[:step])
        assert _rel_err(logits, ref) <= RTOL, f"{rope['rope_type']} step {step}"
        if step + 1 < NEW:
            logits = _execute(program.method(), session, [want[step]], 20 + step)
    assert kiln.generate(program, prompt, NEW, ignore_eos=True)[0] == want


# ------------------------------------------------------------------------------------------------
# sessions

@pytest.mark.parametrize("kernels", ["cpu", "mlx"])
@pytest.mark.parametrize("own_methods", [True, False], ids=["method-per-thread", "shared-method"])
def test_two_sessions_interleaved_threads(llama, own_methods, kernels):
    program = llama.program(kernels)
    prompts = [llama.ref(7).prompt, _prompt(20, seed=11)]
    n = 12
    alone = []
    for p in prompts:
        alone.append(_greedy(program.method(), program.new_session(), p, n, llama.eos))
    assert alone[0] == llama.ref(7).want[:n]
    assert alone[0] != alone[1]

    # LoadedProgram.method() caches one Method per name (its calls are serialized by a lock);
    # _program.load_method gives each thread its own instance, which run concurrently.
    methods = ([program._program.load_method("forward", 1, False) for _ in prompts] if own_methods
               else [program.method()] * len(prompts))
    sessions = [program.new_session() for _ in prompts]
    barrier = threading.Barrier(len(prompts))
    results: list = [None] * len(prompts)
    errors: list = []

    def worker(i):
        try:
            results[i] = _greedy(methods[i], sessions[i], prompts[i], n, llama.eos, barrier=barrier)
        except BaseException as ex:  # noqa: BLE001
            errors.append(ex)
            barrier.abort()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert results == alone


@pytest.mark.parametrize("kernels", ["cpu", "mlx"])
def test_reset_gives_same_tokens(llama, kernels):
    program = llama.program(kernels)
    session = program.new_session()
    prompt = llama.ref(7).prompt
    first, _ = kiln.generate(program, prompt, 10, ignore_eos=True, session=session)
    assert any(np.abs(v).max() > 0 for v in _state_snapshot(program, session).values())
    session.reset()
    assert all(not v.any() for v in _state_snapshot(program, session).values())
    again, _ = kiln.generate(program, prompt, 10, ignore_eos=True, session=session)
    assert again == first == llama.ref(7).want[:10]
    # a different conversation on the same session after reset, then the first again
    session.reset()
    kiln.generate(program, _prompt(12, seed=3), 6, ignore_eos=True, session=session)
    session.reset()
    assert kiln.generate(program, prompt, 10, ignore_eos=True, session=session)[0] == first


# ------------------------------------------------------------------------------------------------
# sampling

def test_sampling_seeded(llama):
    program = llama.program("cpu")
    prompt = llama.ref(7).prompt
    opts = dict(temperature=0.9, top_k=40, top_p=0.95)
    a, _ = kiln.generate(program, prompt, 12, seed=7, ignore_eos=True, **opts)
    b, _ = kiln.generate(program, prompt, 12, seed=7, ignore_eos=True, **opts)
    assert a == b
    flags = ["--temperature", 0.9, "--top-k", 40, "--top-p", 0.95, "--ignore-eos"]
    c1 = cli_generate(llama.path, prompt, 12, *flags, "--seed", 7)
    c2 = cli_generate(llama.path, prompt, 12, *flags, "--seed", 7)
    assert c1 == c2 == a  # the same sampler and the same kernels in C++ and Python
    others = {tuple(kiln.generate(program, prompt, 12, seed=s, ignore_eos=True, **opts)[0]) for s in range(4)}
    assert len(others) > 1, "different seeds all gave the same tokens: is the sampler seeded at all?"
    # top-k 1 is greedy, whatever the temperature and seed
    greedy = llama.ref(7).want[:12]
    assert kiln.generate(program, prompt, 12, temperature=1.5, top_k=1, seed=3, ignore_eos=True)[0] == greedy
    assert cli_generate(llama.path, prompt, 12, "--temperature", 1.5, "--top-k", 1, "--seed", 3,
                        "--ignore-eos") == greedy


# ------------------------------------------------------------------------------------------------
# kiln inspect

def test_inspect_shows_states_symbols_metadata(llama):
    text = kiln_cli("inspect", llama.path).stdout
    for i in range(2):
        for kv in "kv":
            assert re.search(rf"{kv}_cache_{i}\s+float32\[1, 2, 48, 16\]\s+initial zeros", text), text
    assert re.search(r"states\s+4 \(24576 bytes per session\)", text), text
    assert re.search(r"symbols\s+seq in \[1, 48\]", text), text
    assert re.search(r"tokens\s+int64\[1, seq <= 48\]", text), text
    assert re.search(r"input_pos\s+int64\[1\]", text), text
    for key in ("llm.arch", "llm.vocab_size", "llm.bos_id", "llm.eos_ids", "llm.max_seq_len", "llm.cache"):
        assert f"{key} = {llama.meta[key]}" in text, (key, text)
    assert "llm.arch = llama" in text and "llm.max_seq_len = 48" in text and "llm.eos_ids = 2" in text

    d = json.loads(kiln_cli("inspect", llama.path, "--json").stdout)
    assert {k: v for k, v in d["metadata"].items() if k.startswith("llm.")} == llama.meta
    assert [(s["name"], s["dtype"], s["sizes"], s["initial"]) for s in d["states"]] == [
        (f"{kv}_cache_{i}", "float32", [1, 2, 48, 16], "zeros") for i in range(2) for kv in "kv"]
    (m,) = d["methods"]
    assert m["symbols"] == [{"name": "seq", "min": 1, "max": 48}]
    assert m["input_dims"] == [[None, "seq"], [None]]
    assert [(i["name"], i["dtype"], i["sizes"]) for i in m["inputs"]] == [("tokens", "int64", [1, 48]),
                                                                         ("input_pos", "int64", [1])]
    assert m["outputs"][0]["sizes"] == [1, llm_models.VOCAB]
    assert sorted(m["states"]) == sorted(s["name"] for s in d["states"])
    # the Python view agrees
    program = llama.program("cpu")
    assert {k: v for k, v in program.metadata.items() if k.startswith("llm.")} == llama.meta
    assert program.method_meta()["symbols"] in ([("seq", 1, 48)], [["seq", 1, 48]])


# ------------------------------------------------------------------------------------------------
# delegation

def test_xnnpack_declines_symbolic_sizes(llama, tmp_path):
    if "xnnpack" not in kiln._kiln.backend_names():
        pytest.skip("xnnpack is not built")
    out, rj = tmp_path / "llama_xnn.kiln", tmp_path / "report.json"
    kiln.export_llm(llama.dir, MAX_SEQ, out=out, backends=("xnnpack",), report_json=rj, verbose=False)
    report = json.loads(rj.read_text())
    (m,) = report["methods"]
    reasons = [r for op in m["delegation"]["cpu_ops"] for _, r in op["reasons"]]
    assert reasons and any("cannot reshape a built runtime" in r for r in reasons), reasons
    program = kiln.load(out, num_threads=1)
    ref = llama.ref(7)
    assert kiln.generate(program, ref.prompt, NEW, ignore_eos=True)[0] == ref.want


@pytest.mark.parametrize("name", MLX_ARCHS)
def test_mlx_delegates_the_whole_method(cases, name):
    """require_delegation="mlx" succeeds for Llama, Qwen 3 and Gemma 3: one mlx segment, no node on
    Kiln's CPU kernels, every KV-cache state held by the delegate (none crosses the boundary); the
    file's only instruction is the delegate call."""
    case = cases(name)
    path = case.mlx_path()
    (m,) = case.mlx_report["methods"]
    d = m["delegation"]
    assert [(b["backend"], b["segments"]) for b in d["backends"]] == [("mlx", 1)]
    assert d["cpu_ops"] == []
    assert sorted(st["state"] for st in d["states"]) == sorted(s["name"] for s in case.program("cpu").states)
    assert all(st["resident"] and st["backend"] == "mlx" for st in d["states"]), d["states"]
    meta = kiln.load(path, backend_settings={"mlx.device": "cpu"}).method_meta("forward")
    assert meta["num_delegate_calls"] == 1 and meta["num_kernel_calls"] == 0, meta
    assert meta["state_holders"] == ["mlx"] * len(meta["states"]), meta
    r = kiln_cli("inspect", path)
    assert re.search(r"states\s+k_cache_0 \(held by mlx\)", r.stdout), r.stdout


def test_mlx_damaged_held_state_is_refused_before_a_session(llama, tmp_path):
    """A file whose held-state sizes were damaged (the cache [1, 2, 48, 16] made 2^28 positions long,
    a 256 GiB session) loads as a program, but its method does not: the mlx segment's payload
    expects the cache it was compiled with (InvalidProgram naming the held state), and kiln.generate
    loads the method before it allocates a session."""
    data = open(llama.mlx_path(), "rb").read()
    payload = data.find(b"KMLX")  # the mlx segment (page-aligned, after the program's FlatBuffer)
    assert payload > 0 and payload % 4096 == 0
    head = data[:payload]
    old = np.array([1, 2, MAX_SEQ, 16], np.int64).tobytes()
    assert head.count(old) == 4, "the 4 cache states of the tiny Llama, in the program's state table"
    bad = tmp_path / "bad_state.kiln"
    bad.write_bytes(head.replace(old, np.array([1, 2, 1 << 28, 16], np.int64).tobytes()) + data[payload:])
    program = kiln.load(bad, backend_settings={"mlx.device": "cpu"})
    with pytest.raises(kiln.KilnError, match=r"held state 0 is float32\[1, 2, 48, 16\] in the segment, "
                                             r"float32\[1, 2, 268435456, 16\] in the program") as ei:
        program.method()
    assert ei.value.args[1] == "InvalidProgram"
    with pytest.raises(kiln.KilnError, match="held state 0"):
        kiln.generate(program, [1, 2, 3], 2)


def _profile_line(stderr: str) -> dict:
    """The numbers of the mlx handle's KILN_MLX_PROFILE=1 line (src/backends/mlx/mlx_backend.cpp)."""
    m = re.search(r"\[kiln mlx\] (\d+) executes, .*outside eval ([\d.]+)%; host<->device copies per execute: "
                  r"([\d.]+) in \((\d+) bytes\), ([\d.]+) out \((\d+) bytes\); held states uploaded: (\d+) "
                  r"\((\d+) bytes\); graphs built: (\d+)", stderr)
    assert m, stderr
    keys = ("executes", "outside_pct", "copies_in", "bytes_in", "copies_out", "bytes_out", "uploads", "upload_bytes",
            "graphs")
    return dict(zip(keys, map(float, m.groups())))


def test_mlx_step_copies_no_kv_cache(llama, monkeypatch):
    """Per decode step the only host<->device copies are the boundary's: tokens and input_pos in (16
    bytes), the logits out; the KV cache (4 states of [1, 2, 48, 16] float32 = 6 KiB each) is
    uploaded once per session (from its initial value), never per step; one graph per prompt length
    plus one for decode."""
    monkeypatch.setenv("KILN_MLX_PROFILE", "1")
    ref = llama.ref(7)
    r = kiln_cli("generate", llama.mlx_path(), "--prompt-ids", ",".join(map(str, ref.prompt)), "-n", NEW,
                 "--ignore-eos", "--threads", 1)
    assert [int(t) for t in r.stdout.split(",")] == ref.want
    p = _profile_line(r.stderr)
    states = llama.program("cpu").states
    cache_bytes = sum(int(np.prod(st["sizes"])) * 4 for st in states)
    assert p["executes"] == NEW  # the prefill, then NEW - 1 decode steps
    assert p["copies_in"] == 2 and p["copies_out"] == 1
    # mean bytes per execute: the prefill's 7 tokens, then 1 token, and input_pos
    assert p["bytes_in"] <= (7 * 8 + 8 + (NEW - 1) * 16) / NEW + 1
    assert p["bytes_out"] == llm_models.VOCAB * 4
    assert p["uploads"] == len(states) and p["upload_bytes"] == cache_bytes
    assert p["graphs"] == 2


def test_mlx_without_gpu_is_not_found_and_alternatives_run_on_cpu(llama, tmp_path):
    """Without a GPU (and without KILN_MLX_DEVICE=cpu) the mlx program does not load (NotFound naming
    mlx); a file with mlx and CPU-kernel alternatives loads the CPU one there and generates the same."""
    path = llama.mlx_path()
    alt = tmp_path / "llama_any.kiln"
    kiln.export_llm(llama.dir, MAX_SEQ, out=alt, alternatives=[("mlx",), ()], verbose=False)
    code = textwrap.dedent(f"""
        import kiln
        try:
            kiln.load({str(path)!r})
            print("GPU loaded")
            raise SystemExit(0)
        except kiln.KilnError as e:
            print("ERR", e.args[1], e)
        p = kiln.load({str(alt)!r})
        print("ALT", p.method_meta("forward")["alternative"])
        print("IDS", ",".join(map(str, kiln.generate(p, {llama.ref(7).prompt!r}, 8, ignore_eos=True)[0])))
    """)
    env = {k: v for k, v in os.environ.items() if k != "KILN_MLX_DEVICE"}
    env["PYTHONPATH"] = os.path.join(ROOT, "python")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    if r.stdout.startswith("GPU"):
        pytest.skip("this machine has an MLX GPU")
    lines = dict(line.split(" ", 1) for line in r.stdout.strip().splitlines())
    assert lines["ERR"].startswith("NotFound") and "mlx" in lines["ERR"] and "no GPU device" in lines["ERR"], r.stdout
    assert lines["ALT"] == "1"
    assert lines["IDS"] == ",".join(map(str, llama.ref(7).want[:8]))


def _greedy_against_reference(program, prompt, n, reference, eos, what) -> float:
    """`n` greedy tokens of `program` after `prompt`, each checked against the argmax (eos banned) of
    reference(ids) (last-position logits of a full forward over ids); returns the largest logit
    error relative to the reference's largest logit, over the steps."""
    ids, _ = kiln.generate(program, prompt, n, ignore_eos=True)
    session = program.new_session()
    logits = _execute(program.method(), session, prompt, 0)
    errs = []
    for step, tok in enumerate(ids):
        want = reference(prompt + ids[:step])
        errs.append(_rel_err(logits, want))
        masked = want.copy()
        masked[list(eos)] = -np.inf
        assert tok == int(masked.argmax()), f"{what} step {step}: {tok}, the reference gives {int(masked.argmax())}"
        logits = _execute(program.method(), session, [tok], len(prompt) + step)
    print(f"{what}: max logit error {max(errs):.2e} of the largest logit")
    return max(errs)


def test_mlx_float16_matches_eager_float16(llama, tmp_path):
    """compute_dtype float16 (KV cache held in float16, norms and softmax in float32) against eager
    transformers in float16 on the CPU: the first 8 greedy tokens agree; the logit error against
    that reference (docs/mlx.md) is within 2e-2 of the largest logit."""
    out = tmp_path / "llama_mlx_f16.kiln"
    kiln.export_llm(llama.dir, MAX_SEQ, out=out, require_delegation="mlx", compute_dtype="float16", verbose=False)
    program = kiln.load(out, num_threads=1, backend_settings={"mlx.device": "cpu"})
    hf = llm.load_llm(llama.dir)[0].to(torch.float16)

    @torch.no_grad()
    def reference(ids):
        return hf(torch.tensor([ids]), use_cache=False).logits[0, -1].float().numpy()

    err = _greedy_against_reference(program, llama.ref(7).prompt, 8, reference, llama.eos, "mlx float16 vs eager float16")
    assert err <= 2e-2


@pytest.mark.parametrize("scheme,group_size", [("w4", 32), ("w8", 128)])
def test_mlx_quantized_matches_dequantized_eager(llama, tmp_path, scheme, group_size):
    """w4 (groups of 32: MLX's quantized matmul) and w8 (per channel: dequantized in the graph)
    delegated whole to mlx: the first 8 greedy tokens those of eager transformers with the
    dequantized weights, every step's logits within 1e-4."""
    out = tmp_path / f"llama_mlx_{scheme}.kiln"
    kiln.export_llm(llama.dir, MAX_SEQ, out=out, quantize=scheme, group_size=group_size, require_delegation="mlx",
                    verbose=False)
    program = kiln.load(out, num_threads=1, backend_settings={"mlx.device": "cpu"})
    hf = _dequantized_eager(llama, scheme, group_size)
    err = _greedy_against_reference(program, llama.ref(7).prompt, 8, lambda ids: _last_logits(hf, ids), llama.eos,
                                    f"mlx {scheme} vs dequantized eager")
    assert err <= RTOL


# ------------------------------------------------------------------------------------------------
# python -m kiln export-llm / generate

def test_export_past_max_position_embeddings_warns(llama, tmp_path, capsys):
    """A KV cache longer than the positions the model was trained on exports (the user may know
    better), with a warning that names both numbers; within them, no warning."""
    trained = llama.config.max_position_embeddings
    out = tmp_path / "long.kiln"
    kiln.export_llm(llama.dir, trained + 8, out=out, verbose=True)
    err = capsys.readouterr().err
    assert f"max_seq_len {trained + 8} is past the model's max_position_embeddings {trained}" in err
    assert kiln.load(out).metadata["llm.max_seq_len"] == str(trained + 8)
    with pytest.warns(UserWarning, match="max_position_embeddings"):
        kiln.export_llm(llama.dir, trained + 1, out=tmp_path / "long2.kiln", verbose=False)
    kiln.export_llm(llama.dir, trained, out=tmp_path / "fits.kiln", verbose=True)
    assert "max_position_embeddings" not in capsys.readouterr().err
    # the command line with -q: the same one-line warning, not a Python warning with a source line
    rc = kiln_main(["export-llm", llama.dir, "--max-seq-len", str(trained + 2), "-o", str(tmp_path / "q.kiln"), "-q"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert captured.out.strip() == str(tmp_path / "q.kiln")
    assert f"[kiln] warning: max_seq_len {trained + 2} is past" in captured.err
    assert "UserWarning" not in captured.err


def test_cli_export_llm_w8_and_generate(llama, tmp_path, capsys):
    out, rj = tmp_path / "llama_w8.kiln", tmp_path / "w8.json"
    rc = kiln_main(["export-llm", llama.dir, "--max-seq-len", str(MAX_SEQ), "--quantize", "w8",
                    "--report-json", str(rj), "-o", str(out), "-q"])
    assert rc == 0, capsys.readouterr().err
    assert capsys.readouterr().out.strip() == str(out)
    assert json.loads(rj.read_text())["methods"][0]["num_quantized"] > 0
    program = kiln.load(out, num_threads=1)
    assert {k: v for k, v in program.metadata.items() if k.startswith("llm.")} == llama.meta
    assert program.file_size < os.path.getsize(llama.path)
    # logits near the float32 model's (weight-only int8), and equal to eager transformers with the
    # same int8 weights dequantized
    ref = llama.ref(7)
    session = program.new_session()
    logits = _execute(program.method(), session, ref.prompt, 0)
    assert np.isfinite(logits).all() and _rel_err(logits, ref.logits[0]) < 0.1
    assert _rel_err(logits, _last_logits(_dequantized_eager(llama, "w8", 128), ref.prompt)) <= RTOL

    rc = kiln_main(["generate", str(out), "--prompt-ids", ",".join(map(str, ref.prompt)), "-n", "8",
                    "--ignore-eos", "--json"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    res = json.loads(captured.out)
    assert len(res["ids"]) == 8 and res["prompt_tokens"] == 7
    assert res["ids"] == kiln.generate(program, ref.prompt, 8, ignore_eos=True)[0]
    for k in ("prefill_tokens_per_s", "decode_tokens_per_s", "time_to_first_token_ms", "peak_rss_mib"):
        assert res[k] > 0, k


@torch.no_grad()
def _dequantized_eager(case, scheme: str, group_size: int):
    """Eager transformers with every nn.Linear and nn.Embedding weight replaced by Kiln's
    quantization of it, dequantized (docs/quantization.md: w8 q * s per row; w4 symmetric (u - 8) * s
    per group, low nibble first; an embedding table row by row; a tied table once)."""
    hf, _ = llm.load_llm(case.dir)
    seen = set()
    for mod in hf.modules():
        if isinstance(mod, (torch.nn.Linear, torch.nn.Embedding)) and id(mod.weight) not in seen:
            seen.add(id(mod.weight))
            w = mod.weight.numpy().astype(np.float32)
            n, k = w.shape
            packed, scales, _ = kiln._kiln.quantize_matrix(w, scheme, group_size, True, "float32")
            s = scales.view(np.float32).reshape(n, -1)
            if scheme == "w8":
                dq = packed.view(np.int8).reshape(n, k).astype(np.float32) * s
            else:
                b = packed.reshape(n, -1)
                u = np.empty((n, 2 * b.shape[1]), np.float32)
                u[:, 0::2], u[:, 1::2] = b & 15, b >> 4
                dq = (u[:, :k] - 8) * np.repeat(s, group_size, axis=1)[:, :k]
            mod.weight.copy_(torch.from_numpy(dq))
    return hf


@torch.no_grad()
def _last_logits(hf, ids) -> np.ndarray:
    return hf(torch.tensor([ids]), use_cache=False).logits[0, -1].numpy()


def test_w4_matches_dequantized_eager(llama, tmp_path):
    """w4 (groups of 32) on random weights moves the logits a lot, but the program computes exactly
    eager transformers with the dequantized weights, over every step of a generation."""
    out = tmp_path / "llama_w4.kiln"
    kiln.export_llm(llama.dir, MAX_SEQ, out=out, quantize="w4", group_size=32, verbose=False)
    program = kiln.load(out, num_threads=1)
    ref = llama.ref(7)
    ids, _ = kiln.generate(program, ref.prompt, 6, ignore_eos=True)
    hf = _dequantized_eager(llama, "w4", 32)
    session = program.new_session()
    logits = _execute(program.method(), session, ref.prompt, 0)
    for step, tok in enumerate(ids):
        want = _last_logits(hf, ref.prompt + ids[:step])
        assert _rel_err(logits, want) <= RTOL, f"w4 step {step}"
        logits = _execute(program.method(), session, [tok], 7 + step)


def _fake_quantize_linear_inputs(hf, block: int = 32):
    """Forward pre-hooks on every nn.Linear whose in_features is a multiple of `block`: the input
    quantized and dequantized by the int8 activation rule of docs/quantization.md (per block of 32
    columns d = max|x| / 127 in float32, q = round-half-even(x / d) clamped to [-127, 127], x' = q * d),
    written here in torch, not taken from Kiln's code."""
    def hook(mod, args):
        x = args[0]
        xb = x.reshape(*x.shape[:-1], x.shape[-1] // block, block)
        d = xb.abs().amax(-1, keepdim=True) / torch.tensor(127.0, dtype=torch.float32)
        q = torch.where(d > 0, torch.clamp(torch.round(xb / d), -127, 127), torch.zeros_like(xb))
        return ((q * d).reshape(x.shape),) + tuple(args[1:])

    for mod in hf.modules():
        if isinstance(mod, torch.nn.Linear) and mod.in_features % block == 0:
            mod.register_forward_pre_hook(hook)
    return hf


@pytest.mark.parametrize("scheme,group_size", [("w4a8", 32), ("w8a8", 128)])
def test_a8_matches_eager_with_quantized_activations(llama, tmp_path, scheme, group_size):
    """w4a8 / w8a8 (int8 activation blocks): the program computes eager transformers with the same
    dequantized weights and every linear input quantized by the same rule (pre-hooks), greedy token
    for token over 16 steps, logits within RTOL (without the pre-hooks they differ by about 3e-2)."""
    out = tmp_path / f"llama_{scheme}.kiln"
    kiln.export_llm(llama.dir, MAX_SEQ, out=out, quantize=scheme, group_size=group_size, verbose=False)
    program = kiln.load(out, num_threads=1)
    ref = llama.ref(7)
    ids, _ = kiln.generate(program, ref.prompt, 16, ignore_eos=True)
    hf = _fake_quantize_linear_inputs(_dequantized_eager(llama, scheme[:2], group_size))
    session = program.new_session()
    logits = _execute(program.method(), session, ref.prompt, 0)
    for step, tok in enumerate(ids):
        want = _last_logits(hf, ref.prompt + ids[:step])
        assert _rel_err(logits, want) <= RTOL, f"{scheme} step {step}"
        assert tok == int(np.argmax(want)), f"{scheme} step {step}"
        logits = _execute(program.method(), session, [tok], 7 + step)


def test_cli_generate_ids(llama, capsys):
    ref = llama.ref(7)
    ids = ",".join(map(str, ref.prompt))
    assert kiln_main(["generate", llama.path, "--prompt-ids", ids, "-n", str(NEW), "--ignore-eos",
                      "--kernels", "portable", "--threads", "1"]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == ",".join(map(str, ref.want))
    assert "decode" in captured.err and "tokens/s" in captured.err
    # sampling, seeded: the same as the C++ runner
    assert kiln_main(["generate", llama.path, "--prompt-ids", ids, "-n", "10", "--temperature", "0.8",
                      "--top-p", "0.9", "--seed", "4", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["ids"]
    assert got == cli_generate(llama.path, ref.prompt, 10, "--temperature", 0.8, "--top-p", 0.9, "--seed", 4)


def _tiny_tokenizer(d, *, add_bos: bool):
    """A WordLevel tokenizer over 256 ids (the tiny models' vocabulary): <pad> 0, <s> 1, </s> 2,
    the words of a few sentences, then filler words; whitespace pre-tokenizer. add_bos: a
    post-processor that puts <s> first (else kiln must prepend llm.bos_id)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    sentences = ["the capital of france is paris", "a kiln fires clay at high heat",
                 "small models answer quickly", "the quick brown fox jumps over the lazy dog"]
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    for s in sentences:
        for w in s.split():
            vocab.setdefault(w, len(vocab))
    i = 0
    while len(vocab) < llm_models.VOCAB:
        vocab.setdefault(f"w{i}", len(vocab))
        i += 1
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.add_special_tokens(["<pad>", "<s>", "</s>", "<unk>"])
    if add_bos:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    os.makedirs(d, exist_ok=True)
    tok.save(os.path.join(d, "tokenizer.json"))
    return tok


@pytest.mark.parametrize("add_bos", [False, True], ids=["kiln-adds-bos", "tokenizer-adds-bos"])
def test_cli_generate_tokenizer(llama, tmp_path, capsys, add_bos):
    pytest.importorskip("tokenizers")
    tok = _tiny_tokenizer(tmp_path / "tok", add_bos=add_bos)
    text = "the capital of france is"
    want_prompt = [1] + tok.encode(text, add_special_tokens=False).ids
    assert want_prompt == [1, 4, 5, 6, 7, 8]
    assert kiln_main(["generate", llama.path, "--tokenizer", str(tmp_path / "tok"), "--prompt", text, "-n", "8",
                      "--ignore-eos", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["prompt_ids"] == want_prompt  # bos once, whoever adds it
    ids, _ = kiln.generate(llama.program("cpu"), want_prompt, 8, ignore_eos=True)
    assert res["ids"] == ids
    assert res["text"] == tok.decode(ids, skip_special_tokens=True) and res["text"]
    # plain output: the text
    assert kiln_main(["generate", llama.path, "--tokenizer", str(tmp_path / "tok"), "--prompt", text, "-n", "8",
                      "--ignore-eos"]) == 0
    assert capsys.readouterr().out.strip() == res["text"]


def test_cli_errors(llama, tmp_path, capsys):
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Phi3Config, Phi3ForCausalLM

    def run(*argv) -> tuple[int, str]:
        try:
            rc = kiln_main([str(a) for a in argv])
        except SystemExit as ex:  # argparse usage errors
            rc = ex.code
        return rc, capsys.readouterr().err

    # configs this path cannot export: the message names the part. Support follows the class that
    # transformers builds (model_type phi3: Phi3ForCausalLM), whatever config.architectures claims.
    torch.manual_seed(0)
    phi3 = Phi3ForCausalLM(Phi3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, pad_token_id=0))
    phi3.save_pretrained(tmp_path / "phi3")
    cfg_path = tmp_path / "phi3" / "config.json"
    cfg_json = json.loads(cfg_path.read_text())
    assert cfg_json["model_type"] == "phi3"
    cfg_json["architectures"] = ["LlamaForCausalLM"]  # save_pretrained writes the class's own name
    cfg_path.write_text(json.dumps(cfg_json))
    rc, err = run("export-llm", tmp_path / "phi3", "--max-seq-len", 16, "-o", tmp_path / "m.kiln")
    assert rc == 1 and "Phi3ForCausalLM: architecture not supported" in err, err
    assert "config.architectures says LlamaForCausalLM" in err and "MistralForCausalLM" in err, err
    # a rope type whose frequencies change in forward: named, before torch.export is tried
    llama_dyn = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=2, num_key_value_heads=1,
                                             rope_scaling={"rope_type": "dynamic", "factor": 2.0}))
    llama_dyn.save_pretrained(tmp_path / "llama_dynamic")
    rc, err = run("export-llm", tmp_path / "llama_dynamic", "--max-seq-len", 16, "-o", tmp_path / "d.kiln")
    assert rc == 1 and "rope type 'dynamic' is not supported" in err, err
    assert "supported rope types: default, linear, llama3, yarn" in err and "GuardOnDataDependent" not in err, err
    assert not (tmp_path / "d.kiln").exists()
    # a config transformers itself refuses (longrope without its factors): exit 1 naming config.json
    cfg_json = json.loads((tmp_path / "llama_dynamic" / "config.json").read_text())
    cfg_json["rope_scaling"] = {"rope_type": "longrope", "factor": 2.0}
    cfg_json.pop("rope_parameters", None)
    (tmp_path / "llama_dynamic" / "config.json").write_text(json.dumps(cfg_json))
    rc, err = run("export-llm", tmp_path / "llama_dynamic", "--max-seq-len", 16, "-o", tmp_path / "d.kiln")
    assert rc == 1 and ("cannot read config.json" in err or "rope type 'longrope' is not supported" in err), err
    assert "Traceback" not in err, err
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2, n_positions=32))
    gpt2.save_pretrained(tmp_path / "gpt2")
    rc, err = run("export-llm", tmp_path / "gpt2", "--max-seq-len", 16, "-o", tmp_path / "g.kiln")
    assert rc == 1 and "GPT2LMHeadModel: architecture not supported" in err, err
    assert not (tmp_path / "m.kiln").exists() and not (tmp_path / "g.kiln").exists()
    # checkpoints that do not hold the model their config describes: transformers would initialize the
    # missing weights at random and load the rest; the export refuses, naming them (exit 1, no traceback)
    import shutil

    from safetensors.torch import load_file, save_file

    def variant(name, edit_config=None, edit_tensors=None, truncate=None):
        d = tmp_path / name
        shutil.copytree(llama.dir, d)
        if edit_config:
            cfg = json.loads((d / "config.json").read_text())
            edit_config(cfg)
            (d / "config.json").write_text(json.dumps(cfg))
        st = d / "model.safetensors"
        if edit_tensors:
            tensors = load_file(st)
            edit_tensors(tensors)
            save_file(tensors, st, metadata={"format": "pt"})
        if truncate:
            st.write_bytes(st.read_bytes()[:truncate])
        rc, err = run("export-llm", d, "--max-seq-len", 16, "-o", tmp_path / f"{name}.kiln")
        assert rc == 1 and "Traceback" not in err and not (tmp_path / f"{name}.kiln").exists(), (name, rc, err)
        return err

    err = variant("drop", edit_tensors=lambda t: t.pop("model.layers.0.self_attn.q_proj.weight"))
    assert "missing model.layers.0.self_attn.q_proj.weight" in err and "at random" in err, err
    err = variant("nolayers", edit_config=lambda c: c.pop("num_hidden_layers"))  # transformers' default: 32
    assert "missing model.layers." in err and "more" in err, err
    err = variant("heads", edit_config=lambda c: c.update(num_attention_heads=5))
    assert "not a multiple of the number of attention heads" in err, err
    err = variant("truncated", truncate=5000)
    assert "cannot build the model" in err, err
    # missing / empty folders, bad arguments
    rc, err = run("export-llm", tmp_path / "nope", "--max-seq-len", 16, "-o", tmp_path / "x.kiln")
    assert rc == 2 and "no such folder" in err and "nope" in err, err
    (tmp_path / "empty").mkdir()
    rc, err = run("export-llm", tmp_path / "empty", "--max-seq-len", 16, "-o", tmp_path / "x.kiln")
    assert rc == 1 and "no config.json" in err, err
    rc, err = run("export-llm", llama.dir, "--max-seq-len", 1, "-o", tmp_path / "x.kiln")
    assert rc == 2 and "--max-seq-len must be >= 2" in err, err
    rc, err = run("export-llm", llama.dir, "-o", tmp_path / "x.kiln")
    assert rc == 2 and "--max-seq-len" in err, err
    rc, err = run("export-llm", llama.dir, "--max-seq-len", 16, "--backends", "nosuch", "-o", tmp_path / "x.kiln")
    assert rc == 2 and "nosuch" in err, err

    # generate: a request the program's limits refuse is a bad argument (exit 2), like the others
    ids = ",".join(map(str, _prompt(MAX_SEQ - NEW + 1, seed=2)))
    rc, err = run("generate", llama.path, "--prompt-ids", ids, "-n", NEW)
    assert rc == 2 and "prompt of 33 tokens + 16 new tokens exceeds the program's max_seq_len of 48" in err, err
    rc, err = run("generate", llama.path, "--prompt-ids", ",".join(["5"] * (MAX_SEQ + 1)), "-n", 1)
    assert rc == 2 and "max_seq_len of 48" in err, err
    rc, err = run("generate", llama.path, "--prompt-ids", "1,999", "-n", 2)
    assert rc == 2 and "token id 999 is outside the vocabulary of 256" in err, err
    # the C++ runner the same
    r = kiln_cli("generate", llama.path, "--prompt-ids", "1,999", "-n", 2, check_rc=2)
    assert "token id 999 is outside the vocabulary of 256" in r.stderr, r.stderr
    r = kiln_cli("generate", llama.path, "--prompt-ids", ids, "-n", NEW, check_rc=2)
    assert "prompt of 33 tokens + 16 new tokens exceeds the program's max_seq_len of 48" in r.stderr, r.stderr
    # both document the exit statuses in --help
    assert "2 bad arguments, including a request the program's limits refuse" in " ".join(
        kiln_cli("generate", "--help").stdout.split()), "kiln generate --help"
    try:
        kiln_main(["generate", "--help"])
    except SystemExit:
        pass
    assert "2 bad arguments, including a request the program's limits refuse" in " ".join(
        capsys.readouterr().out.split()), "python -m kiln generate --help"
    rc, err = run("generate", llama.path, "-n", 2)
    assert rc == 2 and "--prompt-ids" in err, err
    rc, err = run("generate", llama.path, "--prompt", "hello", "-n", 2)
    assert rc == 2 and "--tokenizer" in err, err
    rc, err = run("generate", llama.path, "--prompt-ids", "1,x", "-n", 2)
    assert rc == 2 and "'x' is not a token id" in err, err
    rc, err = run("generate", tmp_path / "missing.kiln", "--prompt-ids", "1", "-n", 2)
    assert rc == 1 and "no such file" in err, err  # cannot be loaded: exit 1, as the C++ runner
    rc, err = run("generate", llama.path, "--prompt-ids", "1", "-n", 2, "--threads", 1000)
    assert rc == 2 and "--threads must be between 1 and 256" in err and "prompt" not in err, err
    rc, err = run("generate", llama.path, "--tokenizer", tmp_path / "empty", "--prompt", "hi", "-n", 2)
    assert rc == 2 and "no tokenizer.json" in err, err
    rc, err = run("generate", llama.path, "--prompt-ids", "1", "--kernels", "gpu")
    assert rc == 2 and "--kernels" in err, err
    rc, err = run("generate", llama.path, "--prompt-ids", "1", "--temperature", "-1")
    assert rc == 2 and "temperature must be >= 0" in err, err
    (tmp_path / "junk.kiln").write_bytes(b"not a program")
    rc, err = run("generate", tmp_path / "junk.kiln", "--prompt-ids", "1")
    assert rc == 1 and "cannot load" in err, err
    # a program without llm.* metadata
    kiln.export(torch.nn.Linear(4, 4), (torch.randn(1, 4),), out=tmp_path / "linear.kiln", verbose=False)
    rc, err = run("generate", tmp_path / "linear.kiln", "--prompt-ids", "1")
    assert rc == 1 and "no llm.* metadata" in err, err
    r = kiln_cli("generate", tmp_path / "linear.kiln", "--prompt-ids", "1", check_rc=1)
    assert "llm.max_seq_len" in r.stderr, r.stderr
