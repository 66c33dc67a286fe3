// libFuzzer target: untrusted bytes through the .npy reader (kiln::npy::parse, src/common/npy.cpp).
// Errors are fine; a crash, a sanitizer report or an allocation the header's sizes did not
// justify is a bug. Property checked on every accepted file: encode() writes it back and parse()
// of that reads the same dtype, shape and bytes (a mismatch aborts: a finding).
#include <cstdio>
#include <cstdlib>

#include "kiln/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto a = kiln::npy::parse(std::span<const uint8_t>(data, size));
  if (!a.ok()) return 0;
  auto bytes = kiln::npy::encode(a->view());
  if (!bytes.ok()) {
    std::fprintf(stderr, "encode failed on a parsed array: %s\n", bytes.error().to_string().c_str());
    std::abort();
  }
  auto b = kiln::npy::parse(*bytes);
  if (!b.ok() || b->dtype != a->dtype || b->shape != a->shape || b->data != a->data) {
    std::fprintf(stderr, "parse(encode(parse(x))) differs from parse(x)%s\n",
                 b.ok() ? "" : (": " + b.error().to_string()).c_str());
    std::abort();
  }
  return 0;
}
