// The input format of the delegate payload fuzzers (kiln_xnnpack_payload_fuzzer,
// kiln_mlx_payload_fuzzer) and the body they share: one fuzz input is everything a backend's
// init receives from the loader for one delegate call, framed simply (little-endian):
//
//   u8 num_inputs, u8 num_outputs, u8 num_constants
//   per input, then per output: u8 dtype (Kiln DType), u8 rank (<= 16), u32 dims[rank]
//   per constant:               u32 nbytes, nbytes bytes
//   the payload:                every remaining byte
//
// The payload comes last so that mutating it needs no length fix-up. make_corpus.cpp writes
// seeds in this format from what the real compiler lowers and the real loader hands to init.
//
// run_delegate_case gives the backend only what the loader could give it (boundary types of rank
// <= 16 and sizes >= 0, like src/runtime/loader.cpp checks; each constant in its own 64-byte
// aligned allocation of exactly its size, and the payload likewise, so ASan sees any read past
// either), calls init and, when init succeeds, execute on zero-filled inputs, then reads every
// output byte. Any crash, abort, uncaught exception or sanitizer report is a bug in the backend's
// decoder (init must reject the payload with an error value) or in what init built.
// Harness limit (not the backend's): boundary tensors of more than 64 MiB in total are skipped,
// as load_fuzzer.cpp skips large arenas.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <vector>

#include "backends/backend.h"

namespace kiln::fuzz {

/// One delegate call as init sees it.
struct DelegateCase {
  std::vector<TensorType> inputs, outputs;
  std::vector<std::vector<uint8_t>> constants;
  std::vector<uint8_t> payload;
};

constexpr size_t kMaxRank = 16;               // the loader's limit (src/runtime/loader.cpp)
constexpr uint64_t kMaxBoundaryBytes = 64ull << 20;

/// The framed bytes of `c` (dims must fit in u32, ranks in 16, counts in 255).
inline std::vector<uint8_t> encode_case(const DelegateCase& c) {
  std::vector<uint8_t> b;
  auto u32 = [&](uint32_t v) {
    for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
  };
  b.push_back(static_cast<uint8_t>(c.inputs.size()));
  b.push_back(static_cast<uint8_t>(c.outputs.size()));
  b.push_back(static_cast<uint8_t>(c.constants.size()));
  for (const auto* list : {&c.inputs, &c.outputs}) {
    for (const TensorType& t : *list) {
      b.push_back(static_cast<uint8_t>(t.dtype));
      b.push_back(static_cast<uint8_t>(t.sizes.size()));
      for (int64_t d : t.sizes) u32(static_cast<uint32_t>(d));
    }
  }
  for (const auto& k : c.constants) {
    u32(static_cast<uint32_t>(k.size()));
    b.insert(b.end(), k.begin(), k.end());
  }
  b.insert(b.end(), c.payload.begin(), c.payload.end());
  return b;
}

/// Parses the framing; nullopt when the bytes are not a well-formed case or a boundary type is
/// one the loader would have rejected (bad dtype, rank > 16) or is above the harness limit.
inline std::optional<DelegateCase> decode_case(std::span<const uint8_t> data) {
  size_t pos = 0;
  auto left = [&] { return data.size() - pos; };
  auto u8 = [&](uint8_t& v) {
    if (left() < 1) return false;
    v = data[pos++];
    return true;
  };
  auto u32 = [&](uint32_t& v) {
    if (left() < 4) return false;
    v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(data[pos + i]) << (8 * i);
    pos += 4;
    return true;
  };
  uint8_t ni = 0, no = 0, nc = 0;
  if (!u8(ni) || !u8(no) || !u8(nc)) return std::nullopt;
  DelegateCase c;
  uint64_t boundary = 0;
  for (int k = 0; k < ni + no; ++k) {
    uint8_t dt = 0, rank = 0;
    if (!u8(dt) || !u8(rank) || !is_valid_dtype(dt) || rank > kMaxRank) return std::nullopt;
    TensorType t{static_cast<DType>(dt), {}};
    uint64_t numel = 1;
    for (uint8_t r = 0; r < rank; ++r) {
      uint32_t d = 0;
      if (!u32(d)) return std::nullopt;
      t.sizes.push_back(d);
      // Saturating product: a huge type is skipped below, never overflowed.
      numel = (d != 0 && numel > (kMaxBoundaryBytes + 1) / d) ? kMaxBoundaryBytes + 1 : numel * d;
    }
    boundary += numel * dtype_size(t.dtype);
    if (boundary > kMaxBoundaryBytes) return std::nullopt;
    (k < ni ? c.inputs : c.outputs).push_back(std::move(t));
  }
  for (int k = 0; k < nc; ++k) {
    uint32_t n = 0;
    if (!u32(n) || n > left()) return std::nullopt;
    c.constants.emplace_back(data.begin() + static_cast<std::ptrdiff_t>(pos),
                             data.begin() + static_cast<std::ptrdiff_t>(pos + n));
    pos += n;
  }
  c.payload.assign(data.begin() + static_cast<std::ptrdiff_t>(pos), data.end());
  return c;
}

/// A 64-byte aligned heap buffer of exactly `size` bytes (ASan reports a read one past the end).
class AlignedBytes {
 public:
  explicit AlignedBytes(size_t size, const uint8_t* init = nullptr)
      : size_(size), p_(static_cast<uint8_t*>(::operator new[](size == 0 ? 1 : size, std::align_val_t{64}))) {
    if (size == 0) return;
    if (init) std::memcpy(p_, init, size);
    else std::memset(p_, 0, size);
  }
  ~AlignedBytes() { ::operator delete[](p_, std::align_val_t{64}); }
  AlignedBytes(const AlignedBytes&) = delete;
  AlignedBytes& operator=(const AlignedBytes&) = delete;
  uint8_t* data() const { return p_; }
  size_t size() const { return size_; }
  std::span<const uint8_t> span() const { return {p_, size_}; }

 private:
  size_t size_;
  uint8_t* p_;
};

/// The shared fuzzer body: decode, init, execute on zeros when init succeeded, destroy.
inline void run_delegate_case(const Backend& backend, std::span<const uint8_t> data, const DelegateOptions& options) {
  std::optional<DelegateCase> c = decode_case(data);
  if (!c) return;
  AlignedBytes payload(c->payload.size(), c->payload.data());
  std::vector<std::unique_ptr<AlignedBytes>> const_buf;
  std::vector<std::span<const uint8_t>> constants;
  for (const auto& k : c->constants) {
    const_buf.push_back(std::make_unique<AlignedBytes>(k.size(), k.data()));
    constants.push_back(const_buf.back()->span());
  }
  auto handle = backend.init(payload.span(), constants, c->inputs, c->outputs, options);
  if (!handle.ok()) return;
  std::vector<std::unique_ptr<AlignedBytes>> bufs;
  std::vector<Tensor> in_t, out_t;
  in_t.reserve(c->inputs.size());
  out_t.reserve(c->outputs.size());
  for (const TensorType& t : c->inputs) {
    bufs.push_back(std::make_unique<AlignedBytes>(t.nbytes()));
    in_t.push_back(Tensor{t.dtype, t.sizes, bufs.back()->data()});
  }
  for (const TensorType& t : c->outputs) {
    bufs.push_back(std::make_unique<AlignedBytes>(t.nbytes()));
    out_t.push_back(Tensor{t.dtype, t.sizes, bufs.back()->data()});
  }
  std::vector<const Tensor*> in_p;
  std::vector<Tensor*> out_p;
  for (const Tensor& t : in_t) in_p.push_back(&t);
  for (Tensor& t : out_t) out_p.push_back(&t);
  Error e = backend.execute(**handle, in_p, out_p);
  if (e.ok()) {
    uint8_t sink = 0;  // read every output byte (uninitialized or out-of-bounds writes show up)
    for (const Tensor& t : out_t) {
      const auto* p = static_cast<const uint8_t*>(t.data);
      for (size_t i = 0; i < t.nbytes(); ++i) sink ^= p[i];
    }
    volatile uint8_t keep = sink;
    (void)keep;
  }
  backend.destroy(std::move(handle).value());
}

}  // namespace kiln::fuzz
