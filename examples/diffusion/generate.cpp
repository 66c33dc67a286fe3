// generate: one-step text-to-image with a diffusion program of three methods (examples/diffusion/export.py):
//   encode(token_ids int64[1, T]) -> text_embedding float32[1, T, D]
//   denoise(latent float32[1, C, h, w], timestep int64[1], text_embedding) -> latent (the x0 prediction)
//   decode(latent) -> image float32[1, 3, H, W] in [0, 1]
//
//   generate MODEL.kiln (--tokens "49406,320,1125,49407" | --tokens-file FILE) [--out image.png]
//            [--timestep 999] [--seed 0] [--latent-in FILE.f32] [--latent-out FILE.f32]
//            [--threads N] [--portable] [--mlx-device cpu|gpu]
//
// There is no tokenizer: token ids come in as a list of integers (comma and/or whitespace separated,
// in --tokens or in the file). Fewer than T ids are padded with --pad-id (default 49407, CLIP's
// <|endoftext|>, which SD-1.5's tokenizer also pads with); more than T is an error.
//
// The starting latent is standard normal noise from a documented generator, so that any language
// can reproduce it: splitmix64 (Steele, Lea, Flood 2014, "Fast splittable pseudorandom number
// generators"; constants as in Vigna's reference splitmix64.c) seeded with --seed gives 64-bit words
// x; each word gives a uniform u = ((x >> 11) + 0.5) * 2^-53 in (0, 1); pairs (u1, u2) give two normals
// by the Box-Muller transform r = sqrt(-2 ln u1), z0 = r cos(2 pi u2), z1 = r sin(2 pi u2), computed
// in double and rounded to float32; the latent is filled in C-order (NCHW) with z0, z1, z0, ...
// --latent-in reads the latent instead (raw little-endian float32, C*h*w values, NCHW);
// --latent-out writes the starting latent in the same format.
//
// The image is written as an 8-bit RGB PNG (stb_image_write, Debian libstb-dev): each value v of the
// decoded [0, 1] image becomes round(clamp(v, 0, 1) * 255).
//
// Every stage prints its time. Exit status: 0 on success, 1 on an error (message on stderr), 2 on a
// usage error.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/runtime.h"

#define STB_IMAGE_WRITE_IMPLEMENTATION
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#pragma GCC diagnostic ignored "-Wimplicit-fallthrough"
#pragma GCC diagnostic ignored "-Wunused-parameter"
#endif
#include <stb/stb_image_write.h>
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

namespace {

constexpr const char* kUsage =
    "usage: generate MODEL.kiln (--tokens IDS | --tokens-file FILE) [--out image.png] [--timestep 999]\n"
    "                [--seed 0] [--latent-in FILE.f32] [--latent-out FILE.f32] [--pad-id 49407]\n"
    "                [--threads N] [--portable] [--mlx-device cpu|gpu]\n"
    "  MODEL.kiln       program with methods encode, denoise, decode (examples/diffusion/export.py)\n"
    "  --tokens IDS     token ids, comma/space separated (no tokenizer is included)\n"
    "  --tokens-file F  the same, read from a file\n"
    "  --pad-id N       id that pads the ids to the program's length (default 49407)\n"
    "  --out FILE       PNG to write (default image.png)\n"
    "  --timestep T     denoising timestep, 0 <= T < 1000 (default 999)\n"
    "  --seed S         seed of the latent noise (splitmix64 + Box-Muller, see generate.cpp; default 0)\n"
    "  --latent-in F    read the starting latent (raw float32, NCHW) instead of generating it\n"
    "  --latent-out F   write the starting latent (raw float32, NCHW)\n"
    "  --threads N      threads for Kiln's kernels and delegates (default: KILN_NUM_THREADS or all cores)\n"
    "  --portable       run Kiln's portable reference kernels instead of the optimized cpu kernels\n"
    "  --mlx-device D   mlx segments on MLX's 'cpu' or 'gpu' device (load setting mlx.device)\n";

struct Options {
  std::string model, tokens, tokens_file, out = "image.png", latent_in, latent_out, mlx_device;
  int64_t timestep = 999, pad_id = 49407;
  uint64_t seed = 0;
  int threads = 0;
  bool portable = false;
};

int fail(const std::string& message) {
  std::fprintf(stderr, "generate: error: %s\n", message.c_str());
  return 1;
}

int usage_error(const std::string& message) {
  std::fprintf(stderr, "generate: %s\n%s", message.c_str(), kUsage);
  return 2;
}

template <typename T>
bool parse_int(std::string_view s, T* out) {
  T v{};
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) return false;
  *out = v;
  return true;
}

std::string parse_args(int argc, char** argv, Options* o) {
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.size() < 2 || arg.rfind("--", 0) != 0) {
      positional.push_back(arg);
      continue;
    }
    std::string value;
    bool has_value = false;
    if (auto eq = arg.find('='); eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_value = true;
    }
    if (arg == "--portable") {
      if (has_value) return "--portable takes no value";
      o->portable = true;
      continue;
    }
    if (!has_value) {
      if (i + 1 >= argc) return arg + " needs a value";
      value = argv[++i];
    }
    if (arg == "--tokens") o->tokens = value;
    else if (arg == "--tokens-file") o->tokens_file = value;
    else if (arg == "--out") o->out = value;
    else if (arg == "--latent-in") o->latent_in = value;
    else if (arg == "--latent-out") o->latent_out = value;
    else if (arg == "--mlx-device") o->mlx_device = value;
    else if (arg == "--timestep") {
      if (!parse_int(value, &o->timestep) || o->timestep < 0 || o->timestep >= 1000)
        return "--timestep must be an integer in [0, 1000), got '" + value + "'";
    } else if (arg == "--pad-id") {
      if (!parse_int(value, &o->pad_id) || o->pad_id < 0) return "--pad-id must be a non-negative integer, got '" + value + "'";
    } else if (arg == "--seed") {
      if (!parse_int(value, &o->seed)) return "--seed must be a non-negative integer, got '" + value + "'";
    } else if (arg == "--threads") {
      if (!parse_int(value, &o->threads) || o->threads < 1 || o->threads > kiln::ThreadPool::kMaxThreads)
        return "--threads must be an integer in [1, " + std::to_string(kiln::ThreadPool::kMaxThreads) + "], got '" +
               value + "'";
    } else {
      return "unknown option " + arg;
    }
  }
  if (positional.size() != 1) return "expected MODEL.kiln, got " + std::to_string(positional.size()) + " positional arguments";
  o->model = positional[0];
  if (o->tokens.empty() == o->tokens_file.empty()) return "give exactly one of --tokens and --tokens-file";
  return "";
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

/// Parses integers separated by commas and/or whitespace. Returns "" or an error message.
std::string parse_ids(const std::string& text, std::vector<int64_t>* ids) {
  std::string s = text;
  std::replace(s.begin(), s.end(), ',', ' ');
  std::istringstream in(s);
  std::string word;
  while (in >> word) {
    int64_t v = 0;
    if (!parse_int(word, &v) || v < 0) return "token id '" + word + "' is not a non-negative integer";
    ids->push_back(v);
  }
  if (ids->empty()) return "no token ids given";
  return "";
}

/// splitmix64 (see the header comment): advances `state`, returns the next 64-bit word.
uint64_t splitmix64(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// n standard normal float32 values from `seed` (splitmix64 + Box-Muller, see the header comment).
std::vector<float> normal_noise(uint64_t seed, size_t n) {
  std::vector<float> out(n);
  uint64_t state = seed;
  const double two_pi = 6.283185307179586476925286766559;
  for (size_t i = 0; i < n; i += 2) {
    const double u1 = (static_cast<double>(splitmix64(&state) >> 11) + 0.5) * 0x1p-53;
    const double u2 = (static_cast<double>(splitmix64(&state) >> 11) + 0.5) * 0x1p-53;
    const double r = std::sqrt(-2.0 * std::log(u1));
    out[i] = static_cast<float>(r * std::cos(two_pi * u2));
    if (i + 1 < n) out[i + 1] = static_cast<float>(r * std::sin(two_pi * u2));
  }
  return out;
}

std::string read_file(const std::string& path, std::string* data) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return "'" + path + "': is a directory, not a file";
  if (!std::filesystem::is_regular_file(path, ec)) return "'" + path + "': no such file";
  std::ifstream in(path, std::ios::binary);
  if (!in) return "'" + path + "': cannot open";
  std::ostringstream ss;
  ss << in.rdbuf();
  *data = ss.str();
  return "";
}

std::string write_file(const std::string& path, const void* data, size_t n) {
  std::ofstream out(path, std::ios::binary);
  if (!out || !out.write(static_cast<const char*>(data), static_cast<std::streamsize>(n))) return "'" + path + "': cannot write";
  return "";
}

/// The method's meta, checked against the expected input types (dims < 0 = any). "" or an error.
std::string check_method(const kiln::Program& program, const std::string& name,
                         const std::vector<kiln::TensorType>& want, kiln::MethodMeta* meta) {
  auto m = program.method_meta(name);
  if (!m.ok()) return m.error().to_string() + " (a diffusion program has methods encode, denoise, decode)";
  std::string got;
  for (size_t i = 0; i < m->inputs.size(); ++i) got += (i ? ", " : "") + m->inputs[i].to_string();
  bool ok = m->inputs.size() == want.size() && m->outputs.size() >= 1;
  for (size_t i = 0; ok && i < want.size(); ++i) {
    const auto& a = m->inputs[i];
    ok = a.dtype == want[i].dtype && a.sizes.size() == want[i].sizes.size();
    for (size_t d = 0; ok && d < a.sizes.size(); ++d) ok = want[i].sizes[d] < 0 || want[i].sizes[d] == a.sizes[d];
  }
  if (!ok) return "method '" + name + "' takes (" + got + "), which is not what generate expects";
  *meta = *m;
  return "";
}

int run(const Options& opt) {
  using kiln::DType;
  std::vector<int64_t> ids;
  {
    std::string text = opt.tokens;
    if (!opt.tokens_file.empty()) {
      if (std::string e = read_file(opt.tokens_file, &text); !e.empty()) return fail("--tokens-file " + e);
    }
    if (std::string e = parse_ids(text, &ids); !e.empty()) return fail(e);
  }

  // Load.
  auto t0 = std::chrono::steady_clock::now();
  kiln::LoadOptions lo;
  if (!opt.mlx_device.empty()) lo.backend_settings.push_back({"mlx.device", opt.mlx_device});
  auto program = kiln::Program::load(opt.model, lo);
  if (!program.ok()) return fail("model '" + opt.model + "': " + program.error().to_string());
  const kiln::Program& prog = **program;
  std::printf("load:    %s (%.1f MB, constants %.1f MB), verified in %.1f ms\n", opt.model.c_str(),
              prog.file_size() / 1e6, prog.constant_bytes() / 1e6, ms_since(t0));

  kiln::MethodMeta enc, den, dec;
  if (auto e = check_method(prog, "encode", {{DType::Int64, {1, -1}}}, &enc); !e.empty()) return fail(e);
  const int64_t T = enc.inputs[0].sizes[1];
  if (enc.outputs[0].dtype != DType::Float32 || enc.outputs[0].dim() != 3) return fail("encode must return float32[1, T, D]");
  const kiln::TensorType text_type = enc.outputs[0];
  if (auto e = check_method(prog, "denoise", {{DType::Float32, {1, -1, -1, -1}}, {DType::Int64, {1}}, text_type}, &den);
      !e.empty())
    return fail(e);
  const kiln::TensorType latent_type = den.inputs[0];
  if (den.outputs[0] != latent_type) return fail("denoise must return " + latent_type.to_string());
  if (auto e = check_method(prog, "decode", {latent_type}, &dec); !e.empty()) return fail(e);
  const kiln::TensorType image_type = dec.outputs[0];
  if (image_type.dtype != DType::Float32 || image_type.dim() != 4 || image_type.sizes[0] != 1 || image_type.sizes[1] != 3)
    return fail("decode must return float32[1, 3, H, W], got " + image_type.to_string());

  if (static_cast<int64_t>(ids.size()) > T)
    return fail(std::to_string(ids.size()) + " token ids given; the program takes at most " + std::to_string(T));
  const size_t given = ids.size();
  ids.resize(T, opt.pad_id);

  std::unique_ptr<kiln::ThreadPool> pool;
  kiln::MethodOptions mo;
  if (opt.threads > 0) {
    pool = std::make_unique<kiln::ThreadPool>(opt.threads);
    mo.pool = pool.get();
  }
  mo.portable_kernels_only = opt.portable;
  t0 = std::chrono::steady_clock::now();
  auto m_enc = prog.load_method("encode", mo);
  if (!m_enc.ok()) return fail("encode: " + m_enc.error().to_string());
  auto m_den = prog.load_method("denoise", mo);
  if (!m_den.ok()) return fail("denoise: " + m_den.error().to_string());
  auto m_dec = prog.load_method("decode", mo);
  if (!m_dec.ok()) return fail("decode: " + m_dec.error().to_string());
  std::printf("prepare: 3 methods (arenas %.1f + %.1f + %.1f MB, delegate calls %zu/%zu/%zu) in %.1f ms\n",
              enc.arena_bytes / 1e6, den.arena_bytes / 1e6, dec.arena_bytes / 1e6, enc.num_delegate_calls,
              den.num_delegate_calls, dec.num_delegate_calls, ms_since(t0));

  // Starting latent.
  std::vector<float> latent;
  const size_t latent_n = static_cast<size_t>(latent_type.numel());
  if (!opt.latent_in.empty()) {
    std::string data;
    if (std::string e = read_file(opt.latent_in, &data); !e.empty()) return fail("--latent-in " + e);
    if (data.size() != latent_n * sizeof(float))
      return fail("--latent-in '" + opt.latent_in + "' has " + std::to_string(data.size()) + " bytes; " +
                  latent_type.to_string() + " needs " + std::to_string(latent_n * sizeof(float)));
    latent.resize(latent_n);
    std::memcpy(latent.data(), data.data(), data.size());
    for (size_t i = 0; i < latent_n; ++i) {  // a NaN / inf latent would silently give a black or garbage image
      if (!std::isfinite(latent[i]))
        return fail("--latent-in '" + opt.latent_in + "': value " + std::to_string(i) + " is " +
                    std::to_string(latent[i]) + "; the latent must be finite");
    }
    std::printf("latent:  %s read from %s\n", latent_type.to_string().c_str(), opt.latent_in.c_str());
  } else {
    latent = normal_noise(opt.seed, latent_n);
    std::printf("latent:  %s, normal noise from seed %llu\n", latent_type.to_string().c_str(),
                static_cast<unsigned long long>(opt.seed));
  }
  if (!opt.latent_out.empty()) {
    if (std::string e = write_file(opt.latent_out, latent.data(), latent_n * sizeof(float)); !e.empty())
      return fail("--latent-out " + e);
  }

  // encode -> denoise -> decode. Outputs are views into each method's arena, valid until its next execute.
  t0 = std::chrono::steady_clock::now();
  auto text = m_enc->execute({kiln::Tensor{DType::Int64, enc.inputs[0].sizes, ids.data()}});
  if (!text.ok()) return fail("encode: " + text.error().to_string());
  std::printf("encode:  %zu token ids (+%lld padding) -> %s in %.1f ms\n", given, static_cast<long long>(T - given),
              text_type.to_string().c_str(), ms_since(t0));

  int64_t t = opt.timestep;
  t0 = std::chrono::steady_clock::now();
  auto x0 = m_den->execute({kiln::Tensor{DType::Float32, latent_type.sizes, latent.data()},
                            kiln::Tensor{DType::Int64, {1}, &t}, (*text)[0]});
  if (!x0.ok()) return fail("denoise: " + x0.error().to_string());
  std::printf("denoise: one step at timestep %lld -> %s in %.1f ms\n", static_cast<long long>(t),
              latent_type.to_string().c_str(), ms_since(t0));

  t0 = std::chrono::steady_clock::now();
  auto image = m_dec->execute({(*x0)[0]});
  if (!image.ok()) return fail("decode: " + image.error().to_string());
  std::printf("decode:  -> %s in %.1f ms\n", image_type.to_string().c_str(), ms_since(t0));

  t0 = std::chrono::steady_clock::now();
  const int64_t H = image_type.sizes[2], W = image_type.sizes[3];
  const float* px = (*image)[0].data_as<float>();
  std::vector<uint8_t> rgb(static_cast<size_t>(H * W * 3));
  for (int64_t c = 0; c < 3; ++c) {
    for (int64_t i = 0; i < H * W; ++i) {
      float v = px[c * H * W + i];
      v = std::isnan(v) ? 0.f : std::min(std::max(v, 0.f), 1.f);
      rgb[static_cast<size_t>(i * 3 + c)] = static_cast<uint8_t>(std::lround(v * 255.f));
    }
  }
  if (!stbi_write_png(opt.out.c_str(), static_cast<int>(W), static_cast<int>(H), 3, rgb.data(), static_cast<int>(W * 3)))
    return fail("cannot write PNG '" + opt.out + "'");
  std::printf("write:   %s (%lldx%lld RGB) in %.1f ms\n", opt.out.c_str(), static_cast<long long>(W),
              static_cast<long long>(H), ms_since(t0));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "-h" || std::string_view(argv[i]) == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
  }
  Options opt;
  if (std::string e = parse_args(argc, argv, &opt); !e.empty()) return usage_error(e);
  return run(opt);
}
