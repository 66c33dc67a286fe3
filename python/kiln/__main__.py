"""Command line of the Python side of Kiln: ``python -m kiln export|compile|export-llm|generate|ops ...``.

    python -m kiln export mobilenet_v3_small --input-shape 1x3x224x224 -o mv3.kiln
    python -m kiln export resnet18 --weights resnet18.pt --backends xnnpack \
        --require-delegation xnnpack --report-json r18.json -o r18.kiln
    python -m kiln compile model.pt2 -o model.kiln --backends xnnpack   # torch.export.save output
    python -m kiln export-llm ./tiny_llama --max-seq-len 256 --quantize w8 -o llama.kiln  # HF checkpoint folder
    python -m kiln generate llama.kiln --prompt-ids 1,2,3 --max-new-tokens 16 --json
    python -m kiln generate llama.kiln --tokenizer ./tiny_llama --prompt "Hello" --max-new-tokens 16
    python -m kiln ops            # list Kiln's op set (this build)

Exit status: 0 on success, 1 when the export (or generation) failed (the error is printed in one
paragraph), 2 for bad command-line arguments (for generate also a prompt the program's limits
refuse: an id outside the vocabulary, or prompt + new tokens past llm.max_seq_len).
"""
from __future__ import annotations

import argparse
import os
import sys


def parse_shape(text: str) -> tuple[int, ...]:
    """"1x3x224x224" -> (1, 3, 224, 224); argparse.ArgumentTypeError for anything else."""
    try:
        dims = tuple(int(d) for d in text.lower().replace(",", "x").split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad shape '{text}': expected sizes separated by 'x', e.g. 1x3x224x224")
    if not dims or any(d <= 0 for d in dims):
        raise argparse.ArgumentTypeError(f"bad shape '{text}': sizes must be positive")
    return dims


def build_model(name: str, weights: str | None, *, log=print):
    """A torchvision classification model by name (torchvision.models.<name>), eval mode.

    With `weights` (a state_dict saved by torch.save, or a checkpoint dict holding "state_dict"/
    "model"), loads it strictly. Without, seeds torch.manual_seed(0) and keeps the random
    initialization: the program then computes meaningless labels (fine for testing the toolchain).
    ValueError for an unknown name; torch's errors for unreadable or mismatching weights."""
    import torch
    import torchvision

    models = set(torchvision.models.list_models(module=torchvision.models))
    ctor = getattr(torchvision.models, name, None) if name in models else None
    if ctor is None:
        known = ", ".join(sorted(torchvision.models.list_models(module=torchvision.models)))
        raise ValueError(f"unknown torchvision model '{name}'. Known models: {known}")
    if weights is None:
        torch.manual_seed(0)
        model = ctor(weights=None)
        log(f"[kiln] {name}: no --weights given, using seeded random weights (torch.manual_seed(0)); "
            "the program's labels are meaningless")
    else:
        model = ctor(weights=None)
        try:
            state = torch.load(weights, map_location="cpu", weights_only=True)
        except Exception as ex:
            raise ValueError(f"cannot read --weights {weights} as a state dict saved with torch.save "
                             f"({type(ex).__name__}: {ex})") from None
        if isinstance(state, dict):
            for key in ("state_dict", "model"):
                if key in state and isinstance(state[key], dict):
                    state = state[key]
        model.load_state_dict(state)
        log(f"[kiln] {name}: loaded weights from {weights}")
    return model.eval()


def _check_delegation_args(args):
    """(backends, require) from --backends / --require-delegation; ExportError for bad names."""
    from .capture import check_backends, check_require_delegation
    backends = check_backends(tuple(args.backends))
    require = check_require_delegation(args.require_delegation, backends)
    return backends, require


def _check_input_file(path: str, what: str) -> bool:
    """False (after printing the error) unless `path` is an existing file; `what` names the kind."""
    if os.path.isdir(path):
        print(f"error: {path} is a directory, not {what}", file=sys.stderr)
        return False
    if not os.path.isfile(path):
        print(f"error: no such file: {path}", file=sys.stderr)
        return False
    return True


def _check_output(path: str) -> bool:
    if os.path.isdir(path):
        print(f"error: -o {path} is a directory; give the path of the .kiln file to write", file=sys.stderr)
        return False
    return True


def cmd_export(args) -> int:
    import torch

    from .capture import ExportError, export

    if args.model_pos and args.model and args.model_pos != args.model:
        print(f"error: two different models given ({args.model_pos} and --model {args.model})", file=sys.stderr)
        return 2
    name = args.model_pos or args.model
    if not name:
        print("error: give the model to export, e.g. `python -m kiln export mobilenet_v3_small -o mv3.kiln`",
              file=sys.stderr)
        return 2
    try:
        backends, require = _check_delegation_args(args)
    except ExportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not _check_output(args.output):
        return 2
    try:
        model = build_model(name, args.weights, log=lambda s: print(s, file=sys.stderr))
    except Exception as ex:  # unknown name; unreadable, non-state-dict or mismatched weights
        print(f"error: cannot build {name}: {type(ex).__name__}: {ex}", file=sys.stderr)
        return 2
    torch.manual_seed(1)
    example = torch.randn(*args.input_shape)
    try:
        result = export(model, (example,), out=args.output, backends=backends, require_delegation=require,
                        report_json=args.report_json, verbose=not args.quiet, **_quant_kwargs(args))
    except ExportError as e:
        print(f"error: export of {name} failed: {e}", file=sys.stderr)
        return 1
    if args.quiet:
        print(result.path)
    return 0


def cmd_compile(args) -> int:
    from .capture import ExportError, compile_exported_file

    try:
        backends, require = _check_delegation_args(args)
    except ExportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not _check_input_file(args.file, "a model file"):
        return 2
    if not _check_output(args.output):
        return 2
    if args.file.lower().endswith(".onnx"):
        return _compile_onnx(args, backends, require)
    if args.input_shape:
        print("error: --input-shape applies to ONNX models only (a .pt2 keeps its example inputs' shapes)",
              file=sys.stderr)
        return 2
    try:
        result = compile_exported_file(args.file, method=args.method, out=args.output, backends=backends,
                                       require_delegation=require, report_json=args.report_json,
                                       verbose=not args.quiet, **_quant_kwargs(args))
    except ExportError as e:
        print(f"error: compile of {args.file} failed: {e}", file=sys.stderr)
        return 1
    if args.quiet:
        print(result.path)
    return 0


def _compile_onnx(args, backends, require) -> int:
    """`python -m kiln compile model.onnx`: the C++ ONNX importer, then the same compile and report."""
    from . import onnx as konnx
    from .capture import ExportError
    from ._kiln import KilnError

    shapes = {}
    for text in args.input_shape or []:
        name, _, dims = text.rpartition("=")
        try:
            if not name:
                raise argparse.ArgumentTypeError("no NAME=")
            if name in shapes:
                raise argparse.ArgumentTypeError(f"input '{name}' given twice")
            shapes[name] = parse_shape(dims)
        except argparse.ArgumentTypeError as e:
            print(f"error: --input-shape '{text}': expected NAME=SIZES, e.g. x=1x3x224x224 ({e})", file=sys.stderr)
            return 2
    if not konnx.available():
        print("error: this Kiln was built without the ONNX importer (libonnx-dev, libprotobuf-dev)", file=sys.stderr)
        return 1
    try:
        result = konnx.compile_onnx(args.file, out=args.output, input_shapes=shapes, backends=backends,
                                    require_delegation=require, report_json=args.report_json, method=args.method,
                                    verbose=not args.quiet, **_quant_kwargs(args))
    except (KilnError, ExportError) as e:
        print(f"error: compile of {args.file} failed: {e.args[0]}", file=sys.stderr)
        return 1
    if args.quiet:
        print(result.path)
    return 0


def _quant_kwargs(args) -> dict:
    return {"quantize": args.quantize, "group_size": args.group_size, "symmetric": not args.asymmetric,
            "scale_dtype": args.scale_dtype, "exclude": args.quantize_exclude, "weights_dtype": args.weights_dtype,
            "compute_dtype": args.compute_dtype}


def _add_delegation_args(p, built: str):
    p.add_argument("--backends", nargs="+", default=[], metavar="NAME",
                   help="delegate backends in order of preference, e.g. --backends xnnpack (built here: "
                        f"{built}); each takes the nodes it supports, the rest runs on Kiln's CPU kernels. "
                        "Default: Kiln's CPU kernels only")
    p.add_argument("--require-delegation", metavar="BACKEND",
                   help="fail (exit 1, listing every node not delegated and why) unless BACKEND takes every "
                        "node, instead of writing a program that silently runs elsewhere; implies "
                        "--backends BACKEND when --backends is not given")
    p.add_argument("--report-json", metavar="PATH",
                   help="also write the compile report (per method: nodes, arena, constants, delegate segments "
                        "per backend, nodes left to CPU kernels by op with each backend's reason) as JSON")
    p.add_argument("--quantize", choices=("w8", "w4", "w8a8", "w4a8"),
                   help="quantization of linear/matmul/convolution weights: w8 = int8 per output "
                        "channel, w4 = int4 in groups along the reduction dim; w8a8 / w4a8: the same weights, and "
                        "linear inputs quantized to int8 blocks of 32 at run time, multiplied in integers "
                        "(docs/quantization.md)")
    p.add_argument("--group-size", type=int, default=128, choices=(32, 64, 128),
                   help="w4: weights per group (default 128)")
    p.add_argument("--asymmetric", action="store_true", help="w4: min/max groups with zeros (default symmetric)")
    p.add_argument("--scale-dtype", choices=("float32", "float16"), default="float32",
                   help="dtype of the quantization scales and zeros (default float32)")
    p.add_argument("--weights-dtype", choices=("float32", "float16"), default="float32",
                   help="storage of the float32 weights not quantized: float16 halves them in the file (widened "
                        "to float32 at load)")
    p.add_argument("--quantize-exclude", nargs="+", default=[], metavar="PATTERN",
                   help="module paths / weight names (fnmatch patterns, e.g. 'features.0.*') left in float32")
    p.add_argument("--compute-dtype", choices=("float32", "float16", "bfloat16"), default="float32",
                   help="precision of the delegates that support it (mlx computes its segments in it); "
                        "the program's inputs, outputs and weights stay float32, and Kiln's CPU kernels "
                        "and xnnpack compute float32 (default float32)")
    p.add_argument("-o", "--output", required=True, metavar="OUT.kiln", help="program file to write")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the written path")


def cmd_export_llm(args) -> int:
    from .capture import ExportError
    from .llm import LLMExportError

    d = args.dir
    if not os.path.exists(d):
        print(f"error: no such folder: {d} (give a Hugging Face checkpoint folder written by save_pretrained: "
              "config.json + safetensors)", file=sys.stderr)
        return 2
    if not os.path.isdir(d):
        print(f"error: {d} is not a folder (give a Hugging Face checkpoint folder written by save_pretrained)",
              file=sys.stderr)
        return 2
    if args.max_seq_len < 2:
        print(f"error: --max-seq-len must be >= 2, got {args.max_seq_len}", file=sys.stderr)
        return 2
    try:
        backends, require = _check_delegation_args(args)
    except ExportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.quantize in (None, "w8", "w8a8") and args.group_size != 128:
        print(f"error: --group-size applies to --quantize w4 / w4a8 only ({args.quantize or 'no quantization'} "
              "has no groups)", file=sys.stderr)
        return 2
    if not _check_output(args.output):
        return 2
    from .llm_export import export_llm
    if args.quiet:  # transformers' own loading progress bar and report too
        from transformers.utils import logging as hf_logging
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    import warnings
    try:
        with warnings.catch_warnings(record=True) as caught:  # -q: export_llm warns instead of printing
            warnings.simplefilter("always", UserWarning)
            result = export_llm(d, args.max_seq_len, out=args.output, quantize=args.quantize,
                                group_size=args.group_size, scale_dtype=args.scale_dtype,
                                backends=backends, weights_dtype=args.weights_dtype, verbose=not args.quiet,
                                report_json=args.report_json, require_delegation=require,
                                compute_dtype=args.compute_dtype)
        for w in caught:
            print(f"[kiln] warning: {w.message}", file=sys.stderr)
    except LLMExportError as e:
        print(f"error: export-llm of {d} failed: {e}", file=sys.stderr)
        return 1
    except ExportError as e:
        print(f"error: export-llm of {d} failed: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # unreadable weights, a folder transformers cannot load
        print(f"error: export-llm of {d} failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    if args.quiet:
        print(result.path)
    return 0


def _parse_ids(text: str) -> list[int]:
    ids = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            raise ValueError(f"--prompt-ids: empty item in '{text}'")
        try:
            v = int(item)
        except ValueError:
            raise ValueError(f"--prompt-ids: '{item}' is not a token id (a non-negative integer)") from None
        if v < 0:
            raise ValueError(f"--prompt-ids: '{item}' is not a token id (a non-negative integer)")
        ids.append(v)
    return ids


def _load_tokenizer(d: str):
    """tokenizers.Tokenizer from DIR/tokenizer.json (or the file itself); ValueError when unreadable."""
    path = os.path.join(d, "tokenizer.json") if os.path.isdir(d) else d
    if not os.path.isfile(path):
        raise ValueError(f"--tokenizer {d}: no tokenizer.json there")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ValueError("--tokenizer needs the `tokenizers` package (pip install tokenizers)") from None
    try:
        return Tokenizer.from_file(path)
    except Exception as ex:  # noqa: BLE001 (tokenizers raises its own Exception type)
        raise ValueError(f"--tokenizer {path}: cannot read it ({type(ex).__name__}: {ex})") from None


def encode_prompt(tokenizer, text: str, bos_id: int | None) -> list[int]:
    """The prompt's ids: the tokenizer's own encoding (with its special tokens), with `bos_id`
    prepended when the tokenizer did not put it first."""
    ids = list(tokenizer.encode(text, add_special_tokens=True).ids)
    if bos_id is not None and (not ids or ids[0] != bos_id):
        ids.insert(0, bos_id)
    return ids


def cmd_generate(args) -> int:
    import json

    from . import KilnError, load
    from .llm_export import generate, llm_limits

    if (args.prompt_ids is None) == (args.prompt is None):
        print("error: give the prompt either as --prompt-ids 1,2,3 or as --tokenizer DIR --prompt TEXT",
              file=sys.stderr)
        return 2
    if args.prompt is not None and args.tokenizer is None:
        print("error: --prompt TEXT needs --tokenizer DIR (a folder with tokenizer.json)", file=sys.stderr)
        return 2
    if args.max_new_tokens < 0:
        print("error: --max-new-tokens must be >= 0", file=sys.stderr)
        return 2
    if not 0 <= args.threads <= 256:  # the runtime's limit, as the C++ `kiln generate` says it
        print(f"error: --threads must be between 1 and 256 (0: the default pool), got {args.threads}", file=sys.stderr)
        return 2
    if args.seed < 0:
        print("error: --seed must be >= 0", file=sys.stderr)
        return 2
    try:  # the sampler's own checks (temperature >= 0, top_k >= 0, top_p in (0, 1])
        from ._kiln import Sampler
        Sampler(args.temperature, args.top_k, args.top_p, args.seed)
    except KilnError as e:
        print(f"error: {e.args[0]}", file=sys.stderr)
        return 2
    if not _check_input_file(args.file, "a .kiln program"):
        return 1  # the program cannot be loaded (exit 1, as the C++ `kiln generate`)
    tokenizer = None
    try:
        if args.tokenizer is not None:
            tokenizer = _load_tokenizer(args.tokenizer)
        prompt_ids = _parse_ids(args.prompt_ids) if args.prompt_ids is not None else None
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        program = load(args.file, num_threads=args.threads, portable_kernels_only=args.kernels == "portable",
                       prefault=True, use_mmap=not args.no_mmap)
        limits = llm_limits(program)
    except KilnError as e:
        print(f"error: cannot load {args.file}: {e.args[0]}", file=sys.stderr)
        return 1
    except ValueError as e:
        print(f"error: {args.file}: {e}", file=sys.stderr)
        return 1
    if prompt_ids is None:
        prompt_ids = encode_prompt(tokenizer, args.prompt, limits["bos_id"])
        if not prompt_ids:
            print("error: --prompt encodes to no tokens", file=sys.stderr)
            return 2
    # The request checked against the program's limits before anything runs: a bad request is a
    # bad argument (exit 2), as in the C++ `kiln generate`; exit 1 is left for a program that cannot
    # be loaded or a generation that failed while running.
    where = "--prompt-ids" if args.prompt_ids is not None else "--prompt"
    for t in prompt_ids:
        if not 0 <= t < limits["vocab_size"]:
            print(f"error: {where}: token id {t} is outside the vocabulary of {limits['vocab_size']}", file=sys.stderr)
            return 2
    if len(prompt_ids) + args.max_new_tokens > limits["max_seq_len"]:
        print(f"error: {where}: prompt of {len(prompt_ids)} tokens + {args.max_new_tokens} new tokens exceeds the "
              f"program's max_seq_len of {limits['max_seq_len']}", file=sys.stderr)
        return 2
    try:
        ids, stats = generate(program, prompt_ids, args.max_new_tokens, temperature=args.temperature,
                              top_k=args.top_k, top_p=args.top_p, seed=args.seed, ignore_eos=args.ignore_eos)
    except ValueError as e:  # kiln.generate's own checks of the request (ids, seed, threads)
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KilnError as e:
        print(f"error: generate failed: {e.args[0]}", file=sys.stderr)
        return 1
    text = tokenizer.decode(list(ids), skip_special_tokens=True) if tokenizer is not None else None
    if args.json:
        out = {"ids": list(ids), "prompt_tokens": len(prompt_ids)}
        if text is not None:
            out["text"] = text
            out["prompt_ids"] = list(prompt_ids)
        for k in ("prefill_tokens_per_s", "decode_tokens_per_s", "time_to_first_token_ms", "peak_rss_mib"):
            out[k] = stats[k]
        print(json.dumps(out))
    else:
        print(text if text is not None else ",".join(str(i) for i in ids))
        print(f"kiln generate: {len(prompt_ids)} prompt tokens, {len(ids)} new; prefill "
              f"{stats['prefill_tokens_per_s']:.1f} tokens/s, decode {stats['decode_tokens_per_s']:.1f} tokens/s, "
              f"time to first token {stats['time_to_first_token_ms']:.2f} ms, peak RSS "
              f"{stats['peak_rss_mib']:.1f} MiB", file=sys.stderr)
    return 0


def cmd_ops(args) -> int:
    from . import op_names
    try:
        for n in sorted(op_names()):
            print(n)
    except BrokenPipeError:  # e.g. `python -m kiln ops | head`
        sys.stderr.close()
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m kiln",
        description="Kiln: export PyTorch models to .kiln programs (the C++ `kiln` tool runs and inspects "
                    "programs).")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    try:
        from . import _kiln
        built = ", ".join(["portable"] + [b for b in _kiln.backend_names() if b != "portable"])
    except Exception:  # noqa: BLE001 (help still works without the binding)
        built = "portable"

    e = sub.add_parser(
        "export", help="export a torchvision model to a .kiln program",
        description="Captures a torchvision model with torch.export, maps it onto Kiln's op set "
                    "(docs/op-set.md), compiles it (optionally delegating to backends such as xnnpack) and "
                    "writes one .kiln file. Prints a report: nodes, arena and constant sizes, and with "
                    "--backends how the graph was split between delegates and Kiln's CPU kernels, and why.",
        epilog="examples:\n"
               "  python -m kiln export mobilenet_v3_small --input-shape 1x3x224x224 -o mv3.kiln\n"
               "  python -m kiln export resnet18 --weights r18.pt -o r18.kiln\n"
               "  python -m kiln export mobilenet_v3_large --backends xnnpack --require-delegation xnnpack \\\n"
               "      --report-json mv3l.json -o mv3l_xnnpack.kiln\n\n"
               "exit status: 0 written, 1 export/compile failed (e.g. a node not delegated with "
               "--require-delegation), 2 bad arguments",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    e.add_argument("model_pos", nargs="?", metavar="MODEL",
                   help="torchvision.models name, e.g. mobilenet_v3_small, mobilenet_v3_large, resnet18")
    e.add_argument("--model", help="the same as MODEL (kept for older scripts)")
    e.add_argument("--input-shape", type=parse_shape, default=(1, 3, 224, 224), metavar="NxCxHxW",
                   help="shape of the single input tensor the program will take (default 1x3x224x224)")
    e.add_argument("--dtype", dest="compute_dtype", choices=("float32", "float16", "bfloat16"), default="float32",
                   help="the same as --compute-dtype (kept for older scripts)")
    e.add_argument("--weights", metavar="PATH",
                   help="state_dict saved with torch.save(model.state_dict(), PATH); without it the model "
                        "gets seeded random weights (torch.manual_seed(0)) and its labels are meaningless")
    _add_delegation_args(e, built)
    e.set_defaults(func=cmd_export)

    c = sub.add_parser(
        "compile", help="compile an ExportedProgram (.pt2) or an ONNX model (.onnx) to a .kiln program",
        description="Reads FILE.pt2 (torch.export.save(torch.export.export(model, example_inputs), FILE)) or "
                    "FILE.onnx (opsets up to 22, through Kiln's C++ ONNX importer: docs/onnx.md), maps it onto "
                    "Kiln's op set, compiles it and writes one .kiln file. A .pt2 program's inputs have the "
                    "shapes and dtypes of its example inputs (export the model in eval mode: training-mode "
                    "batch norm is refused); an ONNX model's dynamic input dims are fixed with --input-shape.",
        epilog="examples:\n"
               "  python -m kiln compile model.pt2 -o model.kiln\n"
               "  python -m kiln compile model.onnx --input-shape x=1x3x640x640 -o model.kiln\n"
               "  python -m kiln compile model.pt2 -o model_xnnpack.kiln --backends xnnpack \\\n"
               "      --require-delegation xnnpack --report-json report.json\n\n"
               "exit status: 0 written, 1 compile failed, 2 bad arguments or missing file",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("file", metavar="FILE.pt2|FILE.onnx",
                   help="ExportedProgram saved with torch.export.save, or an ONNX model (docs/onnx.md)")
    c.add_argument("--input-shape", action="append", metavar="NAME=SIZES",
                   help="ONNX only: static sizes of an input with dynamic dims, e.g. x=1x3x640x640 (repeatable)")
    c.add_argument("--method", default="forward", help="name of the program's method (default forward)")
    _add_delegation_args(c, built)
    c.set_defaults(func=cmd_compile)

    x = sub.add_parser(
        "export-llm", help="export a Hugging Face causal LM checkpoint folder to a .kiln program with a KV cache",
        description="Reads a checkpoint folder (config.json plus safetensors, as save_pretrained writes it: "
                    "LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM, Gemma3ForCausalLM, as "
                    "transformers builds it from model_type; RoPE types default, linear, llama3, yarn), wraps the "
                    "model with a static KV cache of --max-seq-len positions and writes one program with one "
                    "method forward(tokens: int64[1, seq], input_pos: int64[1]) -> logits float32[1, vocab], seq in 1..max-seq-len. The "
                    "cache is the program's state (one session per conversation); the llm.* metadata (arch, "
                    "vocab_size, bos_id, eos_ids, max_seq_len, cache) is stored in the file (kiln inspect shows it). "
                    "Run it with `kiln generate` (C++) or `python -m kiln generate`.",
        epilog="examples:\n"
               "  python -m kiln export-llm ./llama_ckpt --max-seq-len 512 -o llama.kiln\n"
               "  python -m kiln export-llm ./qwen3_ckpt --max-seq-len 1024 --quantize w4 --group-size 32 \\\n"
               "      --weights-dtype float16 --report-json qwen3.json -o qwen3_w4.kiln\n\n"
               "exit status: 0 written, 1 export failed (e.g. an unsupported config, the error names the part), "
               "2 bad arguments or missing folder",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    x.add_argument("dir", metavar="DIR",
                   help="checkpoint folder written by save_pretrained (config.json + safetensors)")
    x.add_argument("--max-seq-len", type=int, required=True, metavar="N",
                   help="positions of the KV cache: prompt + generated tokens of one session at most (>= 2)")
    x.add_argument("--quantize", choices=("w8", "w4", "w8a8", "w4a8"),
                   help="quantization of the linear weights and the token embedding table (a tied "
                        "output projection shares it): w8 = int8 per output channel, w4 = int4 in groups; "
                        "w8a8 / w4a8: the same weights, and the linear layers' inputs quantized to int8 blocks of "
                        "32 at run time, multiplied in integers (faster decoding; docs/quantization.md)")
    x.add_argument("--group-size", type=int, default=128, choices=(32, 64, 128),
                   help="w4: weights per group (default 128)")
    x.add_argument("--scale-dtype", choices=("float32", "float16"), default="float32",
                   help="storage of the quantization scales (w4 g32 with float16 scales: 4.5 bits per weight, "
                        "the size of llama.cpp's Q4_0)")
    x.add_argument("--backends", nargs="+", default=[], metavar="NAME",
                   help=f"delegate backends to try (built here: {built}): mlx takes the whole method with the KV "
                        "cache held in MLX's memory; xnnpack declines nodes with symbolic sizes, which stay on "
                        "Kiln's CPU kernels (the report says why)")
    x.add_argument("--require-delegation", metavar="BACKEND",
                   help="fail (exit 1, listing every node not delegated and why) unless BACKEND takes every "
                        "node; implies --backends BACKEND when --backends is not given")
    x.add_argument("--compute-dtype", choices=("float32", "float16", "bfloat16"), default="float32",
                   help="precision of the delegates that support it (mlx computes its segment, KV cache "
                        "included, in it; norms and softmax in float32); logits stay float32")
    x.add_argument("--weights-dtype", choices=("float32", "float16"), default="float32",
                   help="storage of the float32 weights not quantized: float16 halves them in the file (widened "
                        "to float32 at load)")
    x.add_argument("--report-json", metavar="PATH", help="also write the compile report as JSON")
    x.add_argument("-o", "--output", required=True, metavar="OUT.kiln", help="program file to write")
    x.add_argument("-q", "--quiet", action="store_true", help="print only the written path")
    x.set_defaults(func=cmd_export_llm)

    g = sub.add_parser(
        "generate", help="generate tokens (or text, with --tokenizer) with a program from export-llm",
        description="Prefill the prompt, then decode one token per call on one session (the KV cache) until "
                    "--max-new-tokens or an eos id (llm.eos_ids); the same loop and sampler as the C++ `kiln "
                    "generate`. Greedy when --temperature is 0 (the default). With --tokenizer DIR (its "
                    "tokenizer.json, read by the `tokenizers` package) the prompt is --prompt TEXT (llm.bos_id is "
                    "prepended unless the tokenizer puts it first) and the output is text. Prints the new ids or "
                    "text, and speed on stderr; --json prints one object {ids, text (with --tokenizer), "
                    "prompt_tokens, prefill_tokens_per_s, decode_tokens_per_s, time_to_first_token_ms, peak_rss_mib}.",
        epilog="examples:\n"
               "  python -m kiln generate llama.kiln --prompt-ids 1,15043,29892 --max-new-tokens 32\n"
               "  python -m kiln generate llama.kiln --tokenizer ./llama_ckpt \\\n"
               "      --prompt \"The capital of France is\" \\\n"
               "      --max-new-tokens 16 --temperature 0.7 --top-p 0.9 --seed 1 --json\n\n"
               "exit status: 0 generated; 1 the program cannot be loaded (or has no llm.* metadata) or the "
               "generation failed while running; 2 bad arguments, including a request the program's limits refuse "
               "before anything runs: a prompt id outside [0, llm.vocab_size), or prompt + --max-new-tokens past "
               "llm.max_seq_len (the message names the limit)",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    g.add_argument("file", metavar="MODEL.kiln", help="program written by export-llm")
    g.add_argument("--prompt-ids", metavar="IDS", help="prompt token ids, comma-separated (e.g. 1,2,3)")
    g.add_argument("--tokenizer", metavar="DIR", help="folder with tokenizer.json (e.g. the checkpoint folder)")
    g.add_argument("--prompt", metavar="TEXT", help="prompt text (needs --tokenizer)")
    g.add_argument("-n", "--max-new-tokens", type=int, default=16, metavar="N",
                   help="tokens to generate at most (default 16)")
    g.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default); > 0: sample")
    g.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0: off, the default)")
    g.add_argument("--top-p", type=float, default=1.0,
                   help="keep the most likely tokens up to cumulative probability p (1: off, the default)")
    g.add_argument("--seed", type=int, default=0, help="seed of the sampler (same seed, same tokens; default 0)")
    g.add_argument("--ignore-eos", action="store_true",
                   help="never choose an eos id (its logit set to -inf before sampling)")
    g.add_argument("--no-mmap", action="store_true",
                   help="read the program into memory instead of mapping the file (docs/generative.md)")
    g.add_argument("--threads", type=int, default=0, metavar="N",
                   help="threads of the method's pool (0: the process-wide pool, KILN_NUM_THREADS or the core count)")
    g.add_argument("--kernels", choices=("cpu", "portable"), default="cpu",
                   help="cpu: optimized kernels where they apply (default); portable: the reference kernels only")
    g.add_argument("--json", action="store_true", help="print one JSON object")
    g.set_defaults(func=cmd_generate)

    o = sub.add_parser("ops", help="list Kiln's op set (ops built into this Kiln)")
    o.set_defaults(func=cmd_ops)

    args = p.parse_args(argv)
    try:
        return args.func(args)
    except ModuleNotFoundError as e:  # torch / transformers not installed (they are optional extras)
        from . import missing_dependency_message
        msg = missing_dependency_message(e)
        if msg is None:
            raise
        print(f"error: python -m kiln {args.command}: {msg}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
