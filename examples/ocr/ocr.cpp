// ocr: read the text lines of an image with the PP-OCR models (detection, direction classifier,
// recognition) compiled to .kiln programs (examples/ocr/README.md, export.py).
//
//   ocr [--models DIR] [--backend NAME] [--det F] [--cls F] [--rec F] [--keys F] [--no-cls]
//       [--kernels portable|cpu] [--threads N] [--setting KEY=VALUE]... IMAGE...
//
// Pipeline for each image (the conventions of PaddleOCR's PP-OCR inference, as documented by
// PaddleOCR and RapidOCR's config.yaml; constants below name their source):
//  1. Decode with OpenCV (cv::imread, 8-bit BGR; grayscale is replicated, alpha dropped).
//  2. Detection (DB, "Real-time Scene Text Detection with Differentiable Binarization", Liao et al.
//     2020). The det program has a fixed input float32[1, 3, H, W] (chosen at export): the image is
//     scaled by s = min(H / h, W / w) (up or down, aspect kept) with bilinear interpolation to
//     (round(w s), round(h s)), put in the top-left corner, normalised per channel in BGR order as
//     (v / 255 - 0.5) / 0.5 (RapidOCR config.yaml Det mean/std 0.5), the rest of the canvas 0.
//     Output: a probability map float32[1, 1, H, W].
//  3. Boxes (DB post-processing, PaddleOCR DBPostProcess): bitmap = map > thresh (0.3), dilated
//     with a 2x2 kernel (use_dilation); contours (cv::findContours, outer and inner, simple chain);
//     for each (at most 1000): the minimum-area rectangle (cv::minAreaRect), dropped if its short
//     side < 3; score = mean of the map inside the rectangle (score_mode "fast"), dropped if
//     < box_thresh (0.5); unclip: the rectangle is offset outwards by
//     d = area * unclip_ratio / perimeter (unclip_ratio 1.6) with round joins (Clipper,
//     libpolyclipping); the minimum-area rectangle of the result, dropped if its short side < 5;
//     corners mapped back to the image (divided by s per axis), clipped to the image, ordered
//     top-left, top-right, bottom-right, bottom-left; boxes narrower or lower than 4 pixels
//     dropped. Boxes are sorted top to bottom, then left to right for boxes whose top-left corners
//     are within 10 pixels vertically.
//  4. Crop: each box is warped to an upright rectangle (cv::getPerspectiveTransform +
//     cv::warpPerspective, bicubic, border replicated) of width max(|p0p1|, |p2p3|) and height
//     max(|p0p3|, |p1p2|); crops at least 1.5 times taller than wide are rotated 90 degrees
//     counter-clockwise (vertical text).
//  5. Direction classifier (unless --no-cls): input float32[B, 3, 48, Wc] (192 for PP-OCR mobile
//     v2.0); each crop resized to height 48 and width min(Wc, ceil(48 w / h)), normalised as in 2,
//     zero padded on the right; output float32[B, 2] probabilities of labels ('0', '180'). A crop
//     whose best label is '180' with probability > 0.9 (cls_thresh) is rotated by 180 degrees.
//  6. Recognition (CTC): the rec program has one method per input width Wr, named "w<Wr>"
//     (export.py --rec-widths), or one method "forward". Each batch goes to the narrowest method
//     with Wr >= ceil(48 w / h) of its widest crop (else the widest method): PaddleOCR sizes the
//     recognizer's input by the lines' aspect ratio, Kiln programs have static shapes. Input
//     float32[B, 3, 48, Wr]; each crop resized to height 48 and width min(Wr, ceil(48 w / h)),
//     normalised as in 2, zero padded on the right; output float32[B, T, C]
//     (per time step, probabilities over C classes). Greedy CTC decoding: per time step the best
//     class (first one on ties); repeated classes collapsed; class 0 (CTC blank) dropped. Classes
//     are: 0 = blank, 1..K = the K characters of the key file (one per line, as shipped in the rec
//     model's ONNX metadata "character"), K + 1 = ' ' (PaddleOCR CTCLabelDecode with
//     use_space_char). C must equal K + 2. The line's score is the mean probability of the kept
//     characters; lines scoring below --text-score (0.5, RapidOCR config.yaml) are dropped.
// Batches: a program with batch B > 1 gets up to B crops per call (unused slots are zeros).
//
// Output: per image one line "image: PATH WxH, N text lines (det D ms, cls C ms, rec R ms)",
// then per text line "  box=x0,y0;x1,y1;x2,y2;x3,y3 score=S text=TEXT" (box corners in image
// pixels, top-left first, clockwise; TEXT is the rest of the line, UTF-8).
//
// Exit status: 0 on success, 1 on any error (message on stderr naming the file and the problem,
// Kiln errors with their ErrorCode name), 2 on a usage error.
#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <polyclipping/clipper.hpp>

#include "kiln/runtime.h"
#include "kiln/thread_pool.h"

namespace {

// PaddleOCR DBPostProcess defaults as set in RapidOCR 1.4.4 config.yaml (Det section).
struct DetParams {
  float thresh = 0.3f;
  float box_thresh = 0.5f;
  float unclip_ratio = 1.6f;
  int max_candidates = 1000;
  int min_size = 3;  // PaddleOCR DBPostProcess.min_size
};
constexpr float kClsThresh = 0.9f;  // config.yaml Cls cls_thresh
constexpr int kLineHeight = 48;     // cls_image_shape / rec_img_shape height

constexpr const char* kUsage =
    "usage: ocr [options] IMAGE...\n"
    "  --models DIR        folder of the exported files (default: the current folder): det_<B>.kiln,\n"
    "                      cls_<B>.kiln, rec_<B>.kiln for backend B, and ppocr_keys.txt\n"
    "  --backend B         backend name of the files (default portable)\n"
    "  --det/--cls/--rec F program files (override --models/--backend)\n"
    "  --keys F            character list, one per line (default DIR/ppocr_keys.txt)\n"
    "  --no-cls            skip the direction classifier\n"
    "  --kernels K         portable (reference kernels only) or cpu (default: optimized where available)\n"
    "  --threads N         threads for kernels and delegates (default: Kiln's default pool)\n"
    "  --setting KEY=VAL   backend setting at load, e.g. mlx.device=cpu (repeatable)\n"
    "  --text-score S      drop text lines scoring below S (default 0.5)\n";

struct Options {
  std::string models_dir = ".", backend = "portable", det, cls, rec, keys;
  bool use_cls = true, portable_kernels = false;
  int threads = 0;
  float text_score = 0.5f;
  kiln::BackendSettings settings;
  std::vector<std::string> images;
};

int fail(const std::string& message) {
  std::fprintf(stderr, "ocr: error: %s\n", message.c_str());
  return 1;
}

int usage_error(const std::string& message) {
  std::fprintf(stderr, "ocr: %s\n%s", message.c_str(), kUsage);
  return 2;
}

/// Parses argv into `o`; returns "" or a usage error message.
std::string parse_args(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.size() < 2 || arg.rfind("--", 0) != 0) {
      o->images.push_back(arg);
      continue;
    }
    if (arg == "--no-cls") {
      o->use_cls = false;
      continue;
    }
    std::string value;
    if (auto eq = arg.find('='); eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    } else {
      if (i + 1 >= argc) return arg + " needs a value";
      value = argv[++i];
    }
    if (arg == "--models") o->models_dir = value;
    else if (arg == "--backend") o->backend = value;
    else if (arg == "--det") o->det = value;
    else if (arg == "--cls") o->cls = value;
    else if (arg == "--rec") o->rec = value;
    else if (arg == "--keys") o->keys = value;
    else if (arg == "--kernels") {
      if (value != "portable" && value != "cpu") return "--kernels must be portable or cpu, got '" + value + "'";
      o->portable_kernels = value == "portable";
    } else if (arg == "--threads") {
      auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), o->threads);
      if (ec != std::errc() || p != value.data() + value.size() || o->threads < 1 ||
          o->threads > kiln::ThreadPool::kMaxThreads) {
        return "--threads must be an integer in [1, " + std::to_string(kiln::ThreadPool::kMaxThreads) + "], got '" +
               value + "'";
      }
    } else if (arg == "--setting") {
      auto eq = value.find('=');
      if (eq == std::string::npos || eq == 0) return "--setting needs KEY=VALUE, got '" + value + "'";
      o->settings.emplace_back(value.substr(0, eq), value.substr(eq + 1));
    } else if (arg == "--text-score") {
      char* end = nullptr;
      o->text_score = std::strtof(value.c_str(), &end);
      if (value.empty() || *end != '\0' || !(o->text_score >= 0.f && o->text_score <= 1.f)) {
        return "--text-score must be a number in [0, 1], got '" + value + "'";
      }
    } else {
      return "unknown option " + arg;
    }
  }
  if (o->images.empty()) return "no IMAGE given";
  auto in_dir = [&](const std::string& stem) { return (std::filesystem::path(o->models_dir) / stem).string(); };
  if (o->det.empty()) o->det = in_dir("det_" + o->backend + ".kiln");
  if (o->cls.empty()) o->cls = in_dir("cls_" + o->backend + ".kiln");
  if (o->rec.empty()) o->rec = in_dir("rec_" + o->backend + ".kiln");
  if (o->keys.empty()) o->keys = in_dir("ppocr_keys.txt");
  return "";
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

/// One loaded model: its program, one method and its input/output types.
struct Model {
  std::string path, method_name;
  std::shared_ptr<kiln::Program> program;
  std::optional<kiln::Method> method;
  kiln::TensorType input, output;
};

/// Loads `path` (or uses `program` when given) and checks that method `method_name` takes one
/// float32 NCHW input with 3 channels and returns a float32 output of rank `out_rank` whose first
/// dimension is the input's batch. Returns "" or an error message naming the file.
std::string load_model(const std::string& role, const std::string& path, const std::string& method_name,
                       const Options& opt, kiln::ThreadPool* pool, int64_t out_rank, Model* m,
                       std::shared_ptr<kiln::Program> program = nullptr) {
  m->path = path;
  m->method_name = method_name;
  const std::string what = role + " model '" + path + "'";
  if (!program) {
    kiln::LoadOptions lo;
    lo.backend_settings = opt.settings;
    auto loaded = kiln::Program::load(path, lo);
    if (!loaded.ok()) return what + ": " + loaded.error().to_string();
    program = *loaded;
  }
  m->program = program;
  auto meta = m->program->method_meta(method_name);
  if (!meta.ok()) return what + ": " + meta.error().to_string();
  if (meta->inputs.size() != 1 || meta->outputs.empty()) {
    return what + ": method '" + method_name + "' must have one input and at least one output";
  }
  m->input = meta->inputs[0];
  m->output = meta->outputs[0];
  const auto& in = m->input.sizes;
  if (m->input.dtype != kiln::DType::Float32 || in.size() != 4 || in[1] != 3 || in[0] < 1 || in[2] < 1 || in[3] < 1) {
    return what + ": input is " + m->input.to_string() + "; expected float32[B, 3, H, W]";
  }
  if (m->output.dtype != kiln::DType::Float32 || m->output.dim() != out_rank || m->output.sizes[0] != in[0]) {
    return what + ": output 0 is " + m->output.to_string() + "; expected float32 of rank " +
           std::to_string(out_rank) + " with batch " + std::to_string(in[0]);
  }
  kiln::MethodOptions mo;
  mo.pool = pool;
  mo.portable_kernels_only = opt.portable_kernels;
  auto method = m->program->load_method(method_name, mo);
  if (!method.ok()) return what + ": " + method.error().to_string();
  m->method.emplace(std::move(*method));
  return "";
}

/// Runs `m` on `input` (m.input's numel floats); copies output 0 into `out`. Returns "" or an error.
std::string run_model(Model& m, const std::vector<float>& input, std::vector<float>* out) {
  const kiln::Tensor x{kiln::DType::Float32, m.input.sizes, const_cast<float*>(input.data())};
  auto outs = m.method->execute({x});
  if (!outs.ok()) return "model '" + m.path + "': " + outs.error().to_string();
  const kiln::Tensor& y = (*outs)[0];
  if (y.type() != m.output) return "model '" + m.path + "': output 0 is " + y.type().to_string();
  out->assign(y.data_as<float>(), y.data_as<float>() + y.numel());
  return "";
}

/// Writes the 8-bit BGR image `img` into plane `slot` of an NCHW float buffer with H = rows,
/// W = cols, normalised as (v / 255 - 0.5) / 0.5 (PP-OCR det/cls/rec normalisation, config.yaml).
void normalize_into(const cv::Mat& img, float* chw, int64_t H, int64_t W) {
  for (int y = 0; y < img.rows && y < H; ++y) {
    const uint8_t* row = img.ptr<uint8_t>(y);
    for (int x = 0; x < img.cols && x < W; ++x) {
      for (int c = 0; c < 3; ++c) chw[c * H * W + y * W + x] = (row[x * 3 + c] / 255.f - 0.5f) / 0.5f;
    }
  }
}

/// Corners of `r` ordered top-left, top-right, bottom-right, bottom-left: the two leftmost points
/// (by x) are the left side, the upper of them (smaller y) top-left; likewise on the right.
std::array<cv::Point2f, 4> ordered_corners(const cv::RotatedRect& r) {
  std::array<cv::Point2f, 4> p;
  r.points(p.data());
  std::sort(p.begin(), p.end(), [](const cv::Point2f& a, const cv::Point2f& b) { return a.x < b.x; });
  cv::Point2f tl = p[0], bl = p[1], tr = p[2], br = p[3];
  if (bl.y < tl.y) std::swap(tl, bl);
  if (br.y < tr.y) std::swap(tr, br);
  return {tl, tr, br, bl};
}

/// Mean of `map` (CV_32F) inside the quadrilateral `q` (DB score_mode "fast").
float box_score(const cv::Mat& map, const std::array<cv::Point2f, 4>& q) {
  float xmin = q[0].x, xmax = q[0].x, ymin = q[0].y, ymax = q[0].y;
  for (const auto& p : q) {
    xmin = std::min(xmin, p.x), xmax = std::max(xmax, p.x), ymin = std::min(ymin, p.y), ymax = std::max(ymax, p.y);
  }
  const int x0 = std::clamp(static_cast<int>(std::floor(xmin)), 0, map.cols - 1);
  const int x1 = std::clamp(static_cast<int>(std::ceil(xmax)), 0, map.cols - 1);
  const int y0 = std::clamp(static_cast<int>(std::floor(ymin)), 0, map.rows - 1);
  const int y1 = std::clamp(static_cast<int>(std::ceil(ymax)), 0, map.rows - 1);
  cv::Mat mask = cv::Mat::zeros(y1 - y0 + 1, x1 - x0 + 1, CV_8U);
  std::vector<cv::Point> poly;
  for (const auto& p : q) poly.emplace_back(static_cast<int>(std::lround(p.x - x0)), static_cast<int>(std::lround(p.y - y0)));
  cv::fillPoly(mask, std::vector<std::vector<cv::Point>>{poly}, cv::Scalar(1));
  return static_cast<float>(cv::mean(map(cv::Rect(x0, y0, x1 - x0 + 1, y1 - y0 + 1)), mask)[0]);
}

/// Offsets the quadrilateral `q` outwards by area * ratio / perimeter with round joins (Clipper,
/// coordinates scaled by 16 to keep sub-pixel precision); returns the points of the largest
/// resulting polygon (empty if Clipper returns none).
std::vector<cv::Point2f> unclip(const std::array<cv::Point2f, 4>& q, float ratio) {
  double area = 0, perimeter = 0;
  for (int i = 0; i < 4; ++i) {
    const cv::Point2f& a = q[i];
    const cv::Point2f& b = q[(i + 1) % 4];
    area += static_cast<double>(a.x) * b.y - static_cast<double>(b.x) * a.y;
    perimeter += std::hypot(b.x - a.x, b.y - a.y);
  }
  area = std::abs(area) / 2;
  if (perimeter <= 0) return {};
  constexpr double kScale = 16;
  const double distance = area * ratio / perimeter;
  ClipperLib::Path path;
  for (const auto& p : q) path.emplace_back(std::llround(p.x * kScale), std::llround(p.y * kScale));
  ClipperLib::ClipperOffset offset;
  offset.AddPath(path, ClipperLib::jtRound, ClipperLib::etClosedPolygon);
  ClipperLib::Paths solution;
  offset.Execute(solution, distance * kScale);
  const ClipperLib::Path* best = nullptr;
  double best_area = 0;
  for (const auto& s : solution) {
    const double a = std::abs(ClipperLib::Area(s));
    if (!best || a > best_area) best = &s, best_area = a;
  }
  std::vector<cv::Point2f> out;
  if (best) {
    for (const auto& p : *best) out.emplace_back(static_cast<float>(p.X / kScale), static_cast<float>(p.Y / kScale));
  }
  return out;
}

struct TextBox {
  std::array<cv::Point2f, 4> corners;  // image pixels: top-left, top-right, bottom-right, bottom-left
  float det_score = 0;
};

/// DB post-processing (step 3 of the header) on the probability map `map` (det canvas pixels,
/// already cut to the scaled image's nh x nw region); scale_x, scale_y map canvas to image pixels.
std::vector<TextBox> boxes_from_map(const cv::Mat& map, const DetParams& dp, float scale_x, float scale_y, int img_w,
                                    int img_h) {
  cv::Mat bitmap = map > dp.thresh;  // CV_8U, 255 where true
  cv::dilate(bitmap, bitmap, cv::Mat::ones(2, 2, CV_8U));
  std::vector<std::vector<cv::Point>> contours;
  cv::findContours(bitmap, contours, cv::RETR_LIST, cv::CHAIN_APPROX_SIMPLE);
  std::vector<TextBox> boxes;
  const size_t n = std::min(contours.size(), static_cast<size_t>(dp.max_candidates));
  for (size_t i = 0; i < n; ++i) {
    const cv::RotatedRect r = cv::minAreaRect(contours[i]);
    if (std::min(r.size.width, r.size.height) < dp.min_size) continue;
    const auto q = ordered_corners(r);
    const float score = box_score(map, q);
    if (score < dp.box_thresh) continue;
    const std::vector<cv::Point2f> expanded = unclip(q, dp.unclip_ratio);
    if (expanded.size() < 3) continue;
    const cv::RotatedRect r2 = cv::minAreaRect(expanded);
    if (std::min(r2.size.width, r2.size.height) < dp.min_size + 2) continue;
    TextBox b;
    b.det_score = score;
    b.corners = ordered_corners(r2);
    for (auto& p : b.corners) {
      p.x = std::clamp(std::round(p.x * scale_x), 0.f, static_cast<float>(img_w));
      p.y = std::clamp(std::round(p.y * scale_y), 0.f, static_cast<float>(img_h));
    }
    const float w = static_cast<float>(cv::norm(b.corners[0] - b.corners[1]));
    const float h = static_cast<float>(cv::norm(b.corners[0] - b.corners[3]));
    if (w <= 3 || h <= 3) continue;
    boxes.push_back(b);
  }
  // Reading order: top to bottom, then left to right within a 10-pixel band.
  std::sort(boxes.begin(), boxes.end(), [](const TextBox& a, const TextBox& b) {
    return a.corners[0].y < b.corners[0].y || (a.corners[0].y == b.corners[0].y && a.corners[0].x < b.corners[0].x);
  });
  for (size_t i = 0; i + 1 < boxes.size(); ++i) {
    for (size_t j = i + 1; j-- > 0;) {
      if (std::abs(boxes[j + 1].corners[0].y - boxes[j].corners[0].y) < 10 &&
          boxes[j + 1].corners[0].x < boxes[j].corners[0].x) {
        std::swap(boxes[j], boxes[j + 1]);
      } else {
        break;
      }
    }
  }
  return boxes;
}

/// Step 4: the box's pixels warped to an upright rectangle (rotated when vertical).
cv::Mat crop_box(const cv::Mat& img, const TextBox& b) {
  const auto& p = b.corners;
  const int w = std::max(1, static_cast<int>(std::max(cv::norm(p[0] - p[1]), cv::norm(p[2] - p[3]))));
  const int h = std::max(1, static_cast<int>(std::max(cv::norm(p[0] - p[3]), cv::norm(p[1] - p[2]))));
  const cv::Point2f src[4] = {p[0], p[1], p[2], p[3]};
  const cv::Point2f dst[4] = {{0, 0}, {static_cast<float>(w), 0}, {static_cast<float>(w), static_cast<float>(h)},
                              {0, static_cast<float>(h)}};
  cv::Mat crop;
  cv::warpPerspective(img, crop, cv::getPerspectiveTransform(src, dst), cv::Size(w, h), cv::INTER_CUBIC,
                      cv::BORDER_REPLICATE);
  if (h >= 1.5 * w) cv::rotate(crop, crop, cv::ROTATE_90_COUNTERCLOCKWISE);
  return crop;
}

/// Fills batch slot `slot` of `buf` (an NCHW buffer of model input type `t`, height 48) with
/// `crop` resized to height 48 and width min(W, ceil(48 w / h)), zero padded on the right.
void line_into(const cv::Mat& crop, const kiln::TensorType& t, int64_t slot, std::vector<float>* buf) {
  const int64_t H = t.sizes[2], W = t.sizes[3];
  const double ratio = static_cast<double>(crop.cols) / crop.rows;
  const int rw = static_cast<int>(std::min<double>(W, std::ceil(H * ratio)));
  cv::Mat resized;
  cv::resize(crop, resized, cv::Size(std::max(1, rw), static_cast<int>(H)), 0, 0, cv::INTER_LINEAR);
  float* plane = buf->data() + slot * 3 * H * W;
  std::fill(plane, plane + 3 * H * W, 0.f);
  normalize_into(resized, plane, H, W);
}

/// Reads the key file: one character per line (a trailing '\r' dropped; empty lines kept out).
std::string read_keys(const std::string& path, std::vector<std::string>* keys) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "key file '" + path + "': cannot open";
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    keys->push_back(line);
  }
  if (keys->empty()) return "key file '" + path + "' is empty";
  return "";
}

struct TextLine {
  TextBox box;
  std::string text;
  float score = 0;
};

int run(const Options& opt) {
  std::vector<std::string> classes{""};  // 0: CTC blank
  if (std::string e = read_keys(opt.keys, &classes); !e.empty()) return fail(e);
  classes.push_back(" ");  // use_space_char

  std::unique_ptr<kiln::ThreadPool> pool;
  if (opt.threads > 0) pool = std::make_unique<kiln::ThreadPool>(opt.threads);
  Model det, cls;
  if (std::string e = load_model("det", opt.det, "forward", opt, pool.get(), 4, &det); !e.empty()) return fail(e);
  if (det.input.sizes[0] != 1 || det.output.sizes != std::vector<int64_t>{1, 1, det.input.sizes[2], det.input.sizes[3]}) {
    return fail("det model '" + opt.det + "': it must map float32[1, 3, H, W] to float32[1, 1, H, W], got " +
                det.input.to_string() + " -> " + det.output.to_string());
  }
  if (opt.use_cls) {
    if (std::string e = load_model("cls", opt.cls, "forward", opt, pool.get(), 2, &cls); !e.empty()) return fail(e);
    if (cls.output.sizes[1] != 2 || cls.input.sizes[2] != kLineHeight) {
      return fail("cls model '" + opt.cls + "': it must map float32[B, 3, 48, W] to float32[B, 2], got " +
                  cls.input.to_string() + " -> " + cls.output.to_string());
    }
  }
  // Recognition: the methods "w<N>" (one per input width N, see export.py --rec-widths), else "forward".
  std::vector<Model> recs;
  {
    kiln::LoadOptions lo;
    lo.backend_settings = opt.settings;
    auto program = kiln::Program::load(opt.rec, lo);
    if (!program.ok()) return fail("rec model '" + opt.rec + "': " + program.error().to_string());
    std::vector<std::string> names;
    for (const std::string& n : (*program)->method_names()) {
      if (n.size() > 1 && n[0] == 'w' && n.find_first_not_of("0123456789", 1) == std::string::npos) names.push_back(n);
    }
    if (names.empty()) names.push_back("forward");
    for (const std::string& n : names) {
      Model rec;
      if (std::string e = load_model("rec", opt.rec, n, opt, pool.get(), 3, &rec, *program); !e.empty()) return fail(e);
      if (rec.input.sizes[2] != kLineHeight || rec.output.sizes[2] != static_cast<int64_t>(classes.size()) ||
          (!recs.empty() && rec.input.sizes[0] != recs[0].input.sizes[0])) {
        return fail("rec model '" + opt.rec + "': method '" + n + "' maps " + rec.input.to_string() + " -> " +
                    rec.output.to_string() + "; expected input height 48, the same batch in every method and " +
                    std::to_string(classes.size()) + " classes (blank + the key file's " +
                    std::to_string(classes.size() - 2) + " characters + space)");
      }
      recs.push_back(std::move(rec));
    }
    std::sort(recs.begin(), recs.end(),
              [](const Model& a, const Model& b) { return a.input.sizes[3] < b.input.sizes[3]; });
  }
  const DetParams dp;

  // An image that cannot be read is reported and skipped: the others are still read, and the exit
  // status is 1 at the end. A model that fails to run stops everything (exit 1 at once).
  int status = 0;
  for (const std::string& path : opt.images) {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) {
      status = fail("image '" + path + "': is a directory, not an image file");
      continue;
    }
    if (!std::filesystem::is_regular_file(path, ec)) {
      status = fail("image '" + path + "': no such file");
      continue;
    }
    const cv::Mat img = cv::imread(path, cv::IMREAD_COLOR);
    if (img.empty()) {
      status = fail("image '" + path + "': cannot decode (not an image format OpenCV reads)");
      continue;
    }

    // 2. Detection.
    auto t0 = std::chrono::steady_clock::now();
    const int64_t H = det.input.sizes[2], W = det.input.sizes[3];
    const double s = std::min(static_cast<double>(H) / img.rows, static_cast<double>(W) / img.cols);
    const int nh = std::clamp(static_cast<int>(std::lround(img.rows * s)), 1, static_cast<int>(H));
    const int nw = std::clamp(static_cast<int>(std::lround(img.cols * s)), 1, static_cast<int>(W));
    cv::Mat scaled;
    cv::resize(img, scaled, cv::Size(nw, nh), 0, 0, cv::INTER_LINEAR);
    std::vector<float> x(static_cast<size_t>(3 * H * W), 0.f), y;
    normalize_into(scaled, x.data(), H, W);
    if (std::string e = run_model(det, x, &y); !e.empty()) return fail(e);
    const cv::Mat map = cv::Mat(static_cast<int>(H), static_cast<int>(W), CV_32F, y.data())(cv::Rect(0, 0, nw, nh));
    const std::vector<TextBox> boxes = boxes_from_map(map, dp, static_cast<float>(img.cols) / nw,
                                                      static_cast<float>(img.rows) / nh, img.cols, img.rows);
    const double det_ms = ms_since(t0);

    // 4-5. Crops and direction.
    t0 = std::chrono::steady_clock::now();
    std::vector<cv::Mat> crops;
    for (const TextBox& b : boxes) crops.push_back(crop_box(img, b));
    if (opt.use_cls) {
      const int64_t B = cls.input.sizes[0];
      std::vector<float> in(static_cast<size_t>(cls.input.numel())), out;
      for (size_t i0 = 0; i0 < crops.size(); i0 += B) {
        const size_t n = std::min<size_t>(B, crops.size() - i0);
        std::fill(in.begin(), in.end(), 0.f);
        for (size_t k = 0; k < n; ++k) line_into(crops[i0 + k], cls.input, k, &in);
        if (std::string e = run_model(cls, in, &out); !e.empty()) return fail(e);
        for (size_t k = 0; k < n; ++k) {
          if (out[2 * k + 1] > out[2 * k] && out[2 * k + 1] > kClsThresh) cv::rotate(crops[i0 + k], crops[i0 + k], cv::ROTATE_180);
        }
      }
    }
    const double cls_ms = ms_since(t0);

    // 6. Recognition.
    t0 = std::chrono::steady_clock::now();
    std::vector<TextLine> lines;
    const int64_t B = recs[0].input.sizes[0];
    std::vector<float> in, out;
    for (size_t i0 = 0; i0 < crops.size(); i0 += B) {
      const size_t n = std::min<size_t>(B, crops.size() - i0);
      // The narrowest method at least as wide as the widest line of this batch needs (else the widest).
      int64_t need = 0;
      for (size_t k = 0; k < n; ++k) {
        need = std::max<int64_t>(need, static_cast<int64_t>(std::ceil(kLineHeight * static_cast<double>(crops[i0 + k].cols) /
                                                                      crops[i0 + k].rows)));
      }
      Model* pick = &recs.back();
      for (Model& r : recs) {
        if (r.input.sizes[3] >= need) {
          pick = &r;
          break;
        }
      }
      Model& rec = *pick;
      const int64_t T = rec.output.sizes[1], C = rec.output.sizes[2];
      in.resize(static_cast<size_t>(rec.input.numel()));
      for (size_t k = 0; k < n; ++k) line_into(crops[i0 + k], rec.input, k, &in);
      const size_t plane = static_cast<size_t>(3 * rec.input.sizes[2] * rec.input.sizes[3]);
      std::fill(in.begin() + n * plane, in.end(), 0.f);  // unused batch slots
      if (std::string e = run_model(rec, in, &out); !e.empty()) return fail(e);
      for (size_t k = 0; k < n; ++k) {
        TextLine line;
        line.box = boxes[i0 + k];
        int64_t prev = -1;
        double sum = 0;
        int kept = 0;
        for (int64_t t = 0; t < T; ++t) {
          const float* p = out.data() + (static_cast<int64_t>(k) * T + t) * C;
          const int64_t best = std::max_element(p, p + C) - p;  // first maximum
          if (best != prev && best != 0) {
            line.text += classes[best];
            sum += p[best];
            ++kept;
          }
          prev = best;
        }
        line.score = kept ? static_cast<float>(sum / kept) : 0.f;
        if (kept && line.score >= opt.text_score) lines.push_back(std::move(line));
      }
    }
    const double rec_ms = ms_since(t0);

    std::printf("image: %s %dx%d, %zu text lines (det %.1f ms, cls %.1f ms, rec %.1f ms)\n", path.c_str(), img.cols,
                img.rows, lines.size(), det_ms, cls_ms, rec_ms);
    for (const TextLine& l : lines) {
      const auto& c = l.box.corners;
      std::printf("  box=%d,%d;%d,%d;%d,%d;%d,%d score=%.4f text=%s\n", int(c[0].x), int(c[0].y), int(c[1].x),
                  int(c[1].y), int(c[2].x), int(c[2].y), int(c[3].x), int(c[3].y), l.score, l.text.c_str());
    }
    std::fflush(stdout);
  }
  return status;
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
  try {
    return run(opt);
  } catch (const cv::Exception& e) {  // OpenCV reports errors (e.g. out of memory) by throwing
    return fail(std::string("OpenCV: ") + e.what());
  } catch (const std::bad_alloc&) {
    return fail("out of memory");
  }
}
