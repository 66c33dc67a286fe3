// classify: run an ImageNet classifier compiled to a .kiln program on one photo.
//
//   classify MODEL.kiln IMAGE [--labels imagenet_classes.txt] [--top 5] [--runs N]
//            [--save-input x.npy] [--save-logits y.npy]
//
// Steps (each prints what it did):
//  1. Load and verify the program (file size, load time). Its method "forward" must take exactly
//     one input float32[1, 3, 224, 224] and return a float32 scores tensor (normally [1, K]; any
//     output is read as its numel() scores in order).
//  2. Decode the image with stb_image (PNG or JPEG; 8 bits per channel, 16-bit PNGs are reduced to 8
//     bits by stb_image; grayscale is replicated to RGB; an alpha channel is dropped without
//     compositing).
//  3. Preprocess like torchvision's ImageNet evaluation transform, in float32:
//       Resize(256) -> CenterCrop(224) -> ToTensor() -> Normalize(mean, std)
//     with the resize done on the [0, 1] float image (no rounding back to 8 bits):
//     - resized size: the short side becomes 256 and the long side int(256 * long / short)
//       (truncated), as torchvision.transforms.functional.resize(img, 256);
//     - crop offsets: top = round((rh - 224) / 2), left = round((rw - 224) / 2), with Python's
//       round-half-to-even, as torchvision.transforms.functional.center_crop;
//     - bilinear interpolation with half-pixel centers and no antialiasing, the formula of
//       torch.nn.functional.interpolate(mode="bilinear", align_corners=False, antialias=False)
//       (PyTorch aten/src/ATen/native/UpSample.h, area_pixel_compute_source_index): for output
//       index d along an axis of input size n and resized size m,
//         s  = max((d + 0.5) * (n / m) - 0.5, 0)
//         i0 = floor(s), i1 = min(i0 + 1, n - 1), w1 = s - i0, w0 = 1 - w1
//       with n / m and s computed in float32 arithmetic as PyTorch does for float tensors (exact
//       arithmetic would move s by a few 1e-5 pixel at most), and
//       out = wy0 * (wx0 * p[i0y, i0x] + wx1 * p[i0y, i1x]) + wy1 * (wx0 * p[i1y, i0x] + wx1 * p[i1y, i1x]),
//       where p = pixel / 255. (Note: PIL's BILINEAR and torchvision's antialias=True default
//       widen the filter when downscaling; this does not.)
//     - normalize per channel: (v - mean[c]) / std[c] with the ImageNet statistics
//       mean = (0.485, 0.456, 0.406), std = (0.229, 0.224, 0.225) (torchvision's
//       ImageClassification preset); layout CHW, batch 1.
//  4. Run forward once to warm up, then --runs times (default 10); print the top-k scores with
//     class names (--labels: one name per line, line i = class i; must have exactly K lines) and
//     the median latency in ms.
//
// Exit status: 0 on success, 1 on any error (message on stderr naming the file and the problem,
// Kiln errors with their ErrorCode name), 2 on a usage error.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/runtime.h"
#include <kiln/npy.h>  // the project's .npy reader/writer (kiln::npy)

#define STB_IMAGE_IMPLEMENTATION
#define STBI_ONLY_PNG
#define STBI_ONLY_JPEG
#define STBI_MAX_DIMENSIONS (1 << 15)  // reject absurd sizes before allocating
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#pragma GCC diagnostic ignored "-Wimplicit-fallthrough"
#endif
#include <stb/stb_image.h>
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

namespace {

constexpr int kResizeShort = 256;
constexpr int kCrop = 224;
// torchvision ImageClassification preset (torchvision/transforms/_presets.py).
constexpr float kMean[3] = {0.485f, 0.456f, 0.406f};
constexpr float kStd[3] = {0.229f, 0.224f, 0.225f};

constexpr const char* kUsage =
    "usage: classify MODEL.kiln IMAGE [--labels FILE] [--top K] [--runs N]\n"
    "                [--save-input X.npy] [--save-logits Y.npy]\n"
    "  MODEL.kiln    program whose method 'forward' takes float32[1, 3, 224, 224]\n"
    "  IMAGE         PNG or JPEG photo (RGB, grayscale or with alpha)\n"
    "  --labels FILE class names, one per line (line i = class i)\n"
    "  --top K       how many classes to print (default 5)\n"
    "  --runs N      timed runs after one warm-up; the median is printed (default 10)\n"
    "  --save-input  write the preprocessed input float32[1, 3, 224, 224] as .npy\n"
    "  --save-logits write the output scores (output 0, its own shape) as .npy\n";

struct Options {
  std::string model, image, labels, save_input, save_logits;
  int top = 5;
  int runs = 10;
};

int fail(const std::string& message) {
  std::fprintf(stderr, "classify: error: %s\n", message.c_str());
  return 1;
}

int usage_error(const std::string& message) {
  std::fprintf(stderr, "classify: %s\n%s", message.c_str(), kUsage);
  return 2;
}

bool parse_positive(std::string_view s, int* out) {
  int v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || v < 1) return false;
  *out = v;
  return true;
}

/// Parses argv into `o`; returns "" or a usage error message.
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
    auto take = [&]() -> bool {
      if (has_value) return true;
      if (i + 1 >= argc) return false;
      value = argv[++i];
      return true;
    };
    if (arg == "--labels" || arg == "--save-input" || arg == "--save-logits" || arg == "--top" || arg == "--runs") {
      if (!take()) return arg + " needs a value";
      if (arg == "--labels") o->labels = value;
      if (arg == "--save-input") o->save_input = value;
      if (arg == "--save-logits") o->save_logits = value;
      if (arg == "--top" && !parse_positive(value, &o->top)) return "--top must be a positive integer, got '" + value + "'";
      if (arg == "--runs" && !parse_positive(value, &o->runs)) return "--runs must be a positive integer, got '" + value + "'";
    } else {
      return "unknown option " + arg;
    }
  }
  if (positional.size() != 2) return "expected MODEL.kiln and IMAGE, got " + std::to_string(positional.size()) + " positional arguments";
  o->model = positional[0];
  o->image = positional[1];
  return "";
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

std::string human_bytes(uint64_t n) {
  char buf[64];
  if (n >= (1u << 20)) std::snprintf(buf, sizeof buf, "%.2f MiB", n / 1048576.0);
  else if (n >= 1024) std::snprintf(buf, sizeof buf, "%.1f KiB", n / 1024.0);
  else std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(n));
  return buf;
}

/// Reads class names, one per line (a trailing '\r' is dropped). Returns "" or an error message.
std::string read_labels(const std::string& path, std::vector<std::string>* names) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return "labels file '" + path + "': no such file";
  std::ifstream in(path);
  if (!in) return "labels file '" + path + "': cannot open";
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    names->push_back(line);
  }
  if (names->empty()) return "labels file '" + path + "' is empty";
  return "";
}

/// An 8-bit RGB image, rows top to bottom, pixels interleaved (height * width * 3 bytes).
struct Image {
  int width = 0, height = 0, channels_in_file = 0;
  std::vector<uint8_t> rgb;
};

/// Decodes a PNG or JPEG file to 8-bit RGB. Returns "" or an error message naming the file.
std::string decode_image(const std::string& path, Image* img) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return "image '" + path + "': no such file";
  if (!std::filesystem::is_regular_file(path, ec)) return "image '" + path + "': not a regular file";
  int w = 0, h = 0, c = 0;
  stbi_uc* pixels = stbi_load(path.c_str(), &w, &h, &c, 3);  // 3: grayscale -> RGB, alpha dropped
  if (!pixels) {
    return "image '" + path + "': cannot decode as PNG or JPEG (stb_image: " + stbi_failure_reason() + ")";
  }
  img->width = w;
  img->height = h;
  img->channels_in_file = c;
  img->rgb.assign(pixels, pixels + static_cast<size_t>(w) * h * 3);
  stbi_image_free(pixels);
  return "";
}

/// Python's round() for a value that is an integer or an integer + 0.5: ties go to the even integer.
int round_half_even_of_half(int twice) {
  int q = twice / 2;
  if (twice % 2 != 0 && q % 2 != 0) ++q;  // twice >= 0 here
  return q;
}

/// Source indices and weights of bilinear interpolation along one axis (see the header comment).
struct AxisTap {
  int i0, i1;
  float w0, w1;
};

/// Taps for output positions [offset, offset + count) of an axis resized from n to m.
/// Scale and source index in float, as PyTorch's CPU kernel computes them for float tensors.
std::vector<AxisTap> bilinear_taps(int n, int m, int offset, int count) {
  std::vector<AxisTap> taps(count);
  const float scale = static_cast<float>(n) / static_cast<float>(m);
  for (int k = 0; k < count; ++k) {
    float s = scale * (static_cast<float>(offset + k) + 0.5f) - 0.5f;
    if (s < 0.f) s = 0.f;
    int i0 = static_cast<int>(s);  // floor: s >= 0
    if (i0 > n - 1) i0 = n - 1;
    const int i1 = i0 < n - 1 ? i0 + 1 : i0;
    const float w1 = std::min(std::max(s - static_cast<float>(i0), 0.f), 1.f);
    taps[k] = {i0, i1, 1.f - w1, w1};
  }
  return taps;
}

/// What preprocessing did, for the log line.
struct Geometry {
  int resized_w, resized_h, crop_left, crop_top;
};

/// Resize(256) + CenterCrop(224) + ToTensor + Normalize into `chw` (3 * 224 * 224 floats, CHW).
/// Only the 224x224 pixels of the crop are interpolated.
Geometry preprocess(const Image& img, std::vector<float>* chw) {
  Geometry g{};
  const int w = img.width, h = img.height;
  if (w <= h) {
    g.resized_w = kResizeShort;
    g.resized_h = static_cast<int>(static_cast<int64_t>(kResizeShort) * h / w);  // int(256 * long / short)
  } else {
    g.resized_h = kResizeShort;
    g.resized_w = static_cast<int>(static_cast<int64_t>(kResizeShort) * w / h);
  }
  g.crop_top = round_half_even_of_half(g.resized_h - kCrop);
  g.crop_left = round_half_even_of_half(g.resized_w - kCrop);

  const std::vector<AxisTap> ys = bilinear_taps(h, g.resized_h, g.crop_top, kCrop);
  const std::vector<AxisTap> xs = bilinear_taps(w, g.resized_w, g.crop_left, kCrop);
  chw->assign(static_cast<size_t>(3) * kCrop * kCrop, 0.f);
  const uint8_t* p = img.rgb.data();
  const size_t row = static_cast<size_t>(w) * 3;
  for (int c = 0; c < 3; ++c) {
    float* out = chw->data() + static_cast<size_t>(c) * kCrop * kCrop;
    for (int oy = 0; oy < kCrop; ++oy) {
      const AxisTap& ty = ys[oy];
      const uint8_t* r0 = p + ty.i0 * row;
      const uint8_t* r1 = p + ty.i1 * row;
      for (int ox = 0; ox < kCrop; ++ox) {
        const AxisTap& tx = xs[ox];
        const float p00 = r0[tx.i0 * 3 + c] / 255.f, p01 = r0[tx.i1 * 3 + c] / 255.f;
        const float p10 = r1[tx.i0 * 3 + c] / 255.f, p11 = r1[tx.i1 * 3 + c] / 255.f;
        const float v = ty.w0 * (tx.w0 * p00 + tx.w1 * p01) + ty.w1 * (tx.w0 * p10 + tx.w1 * p11);
        out[oy * kCrop + ox] = (v - kMean[c]) / kStd[c];
      }
    }
  }
  return g;
}

int run(const Options& opt) {
  std::vector<std::string> labels;
  if (!opt.labels.empty()) {
    if (std::string e = read_labels(opt.labels, &labels); !e.empty()) return fail(e);
  }

  // 1. Program.
  auto t0 = std::chrono::steady_clock::now();
  auto program = kiln::Program::load(opt.model);
  if (!program.ok()) return fail("model '" + opt.model + "': " + program.error().to_string());
  const double load_ms = ms_since(t0);
  std::printf("model: %s (%llu bytes = %s, constants %s), loaded and verified in %.2f ms\n", opt.model.c_str(),
              static_cast<unsigned long long>((*program)->file_size()), human_bytes((*program)->file_size()).c_str(),
              human_bytes((*program)->constant_bytes()).c_str(), load_ms);

  auto meta = (*program)->method_meta("forward");
  if (!meta.ok()) return fail("model '" + opt.model + "': " + meta.error().to_string());
  const kiln::TensorType want{kiln::DType::Float32, {1, 3, kCrop, kCrop}};
  std::string got;
  for (size_t i = 0; i < meta->inputs.size(); ++i) got += (i ? ", " : "") + meta->inputs[i].to_string();
  if (meta->inputs.size() != 1 || meta->inputs[0] != want) {
    return fail("model '" + opt.model + "': method 'forward' takes (" + got + "); classify needs exactly one input " +
                want.to_string());
  }
  if (meta->outputs.empty()) return fail("model '" + opt.model + "': method 'forward' has no outputs");
  const kiln::TensorType& out_type = meta->outputs[0];
  if (out_type.dtype != kiln::DType::Float32 || out_type.numel() < 1) {
    return fail("model '" + opt.model + "': output 0 is " + out_type.to_string() +
                "; classify needs a non-empty float32 scores tensor");
  }
  const int64_t num_classes = out_type.numel();
  if (!labels.empty() && static_cast<int64_t>(labels.size()) != num_classes) {
    return fail("labels file '" + opt.labels + "' has " + std::to_string(labels.size()) + " names but the model has " +
                std::to_string(num_classes) + " scores (output " + out_type.to_string() + ")");
  }

  t0 = std::chrono::steady_clock::now();
  auto method = (*program)->load_method("forward");
  if (!method.ok()) return fail("model '" + opt.model + "': " + method.error().to_string());
  std::printf("method forward: %s -> %s%s (%zu kernel calls, %zu delegate calls, arena %s), prepared in %.2f ms\n",
              got.c_str(), out_type.to_string().c_str(), meta->outputs.size() > 1 ? " (+ more outputs, unused)" : "",
              meta->num_kernel_calls, meta->num_delegate_calls, human_bytes(meta->arena_bytes).c_str(), ms_since(t0));

  // 2-3. Image.
  Image img;
  t0 = std::chrono::steady_clock::now();
  if (std::string e = decode_image(opt.image, &img); !e.empty()) return fail(e);
  std::vector<float> input;
  const Geometry g = preprocess(img, &input);
  std::printf("image: %s %dx%d (%d channel%s in file) -> resize %dx%d -> crop %dx%d at x=%d y=%d, %.2f ms\n",
              opt.image.c_str(), img.width, img.height, img.channels_in_file, img.channels_in_file == 1 ? "" : "s",
              g.resized_w, g.resized_h, kCrop, kCrop, g.crop_left, g.crop_top, ms_since(t0));
  const kiln::Tensor x{kiln::DType::Float32, want.sizes, input.data()};
  if (!opt.save_input.empty()) {
    if (kiln::Error e = kiln::npy::write_file(opt.save_input, x); !e.ok()) return fail("--save-input: " + e.to_string());
  }

  // 4. Run: one warm-up, then opt.runs timed runs.
  std::vector<double> times;
  std::vector<float> scores;
  for (int r = 0; r <= opt.runs; ++r) {
    t0 = std::chrono::steady_clock::now();
    auto outs = method->execute({x});
    const double ms = ms_since(t0);
    if (!outs.ok()) return fail("model '" + opt.model + "': forward failed: " + outs.error().to_string());
    if (r > 0) times.push_back(ms);
    if (r == opt.runs) {  // outputs are views into the arena: copy the last run's scores
      const kiln::Tensor& y = (*outs)[0];
      if (y.dtype != kiln::DType::Float32 || y.numel() != num_classes) {
        return fail("model '" + opt.model + "': output 0 has type " + y.type().to_string() + ", expected " +
                    out_type.to_string());
      }
      scores.assign(y.data_as<float>(), y.data_as<float>() + num_classes);
    }
  }
  std::sort(times.begin(), times.end());
  const size_t n = times.size();
  const double median = n % 2 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]);
  if (!opt.save_logits.empty()) {
    const kiln::Tensor y{kiln::DType::Float32, out_type.sizes, scores.data()};
    if (kiln::Error e = kiln::npy::write_file(opt.save_logits, y); !e.ok()) return fail("--save-logits: " + e.to_string());
  }

  // Top-k: highest score first; equal scores keep the lower class index first.
  const int k = static_cast<int>(std::min<int64_t>(opt.top, num_classes));
  std::vector<int64_t> order(num_classes);
  std::iota(order.begin(), order.end(), int64_t{0});
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int64_t a, int64_t b) {
    return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
  });
  std::printf("top-%d:\n", k);
  for (int i = 0; i < k; ++i) {
    const int64_t c = order[i];
    std::printf("  %d. [%lld] %-32s %10.4f\n", i + 1, static_cast<long long>(c),
                labels.empty() ? ("class " + std::to_string(c)).c_str() : labels[c].c_str(), scores[c]);
  }
  std::printf("latency: %.3f ms (median of %zu runs after 1 warm-up; min %.3f, max %.3f)\n", median, n, times.front(),
              times.back());
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
