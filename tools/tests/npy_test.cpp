// Tests of the .npy reader/writer (include/kiln/npy.h). The byte layouts below are written out by
// hand from NumPy's format description (numpy/lib/format.py), not produced by our writer;
// tests/python/test_cli.py checks interoperability with numpy.save / numpy.load itself.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "kiln/npy.h"

namespace kiln::npy {
namespace {

/// A .npy file: magic, version major.minor, little-endian header length, header, data.
std::vector<uint8_t> make_file(const std::string& header, const std::vector<uint8_t>& data, int major = 1) {
  std::vector<uint8_t> b = {0x93, 'N', 'U', 'M', 'P', 'Y', static_cast<uint8_t>(major), 0};
  const uint32_t n = static_cast<uint32_t>(header.size());
  b.push_back(n & 0xFF);
  b.push_back((n >> 8) & 0xFF);
  if (major >= 2) {
    b.push_back((n >> 16) & 0xFF);
    b.push_back((n >> 24) & 0xFF);
  }
  b.insert(b.end(), header.begin(), header.end());
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

std::vector<uint8_t> f32_bytes(std::initializer_list<float> v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.begin(), b.size());
  return b;
}

std::string message_of(const Result<Array>& r) { return r.ok() ? std::string("(ok)") : r.error().message(); }

TEST(Npy, ParsesVersion1Float32) {
  auto r = parse(make_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }      \n",
                           f32_bytes({1, 2, 3, 4, 5, 6})));
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(r->dtype, DType::Float32);
  EXPECT_EQ(r->shape, (std::vector<int64_t>{2, 3}));
  ASSERT_EQ(r->data.size(), 24u);
  float f[6];
  std::memcpy(f, r->data.data(), 24);
  EXPECT_EQ(f[0], 1.0f);
  EXPECT_EQ(f[5], 6.0f);
}

TEST(Npy, ParsesVersion2And3AndScalars) {
  auto r2 = parse(make_file("{'descr': '<i8', 'fortran_order': False, 'shape': (), }\n", std::vector<uint8_t>(8, 0), 2));
  ASSERT_TRUE(r2.ok()) << r2.error().to_string();
  EXPECT_EQ(r2->dtype, DType::Int64);
  EXPECT_TRUE(r2->shape.empty());
  auto r3 = parse(make_file("{\"descr\": \"|u1\", \"fortran_order\": False, \"shape\": (3,)}\n", {7, 8, 9}, 3));
  ASSERT_TRUE(r3.ok()) << r3.error().to_string();
  EXPECT_EQ(r3->dtype, DType::UInt8);
  EXPECT_EQ(r3->shape, (std::vector<int64_t>{3}));
}

TEST(Npy, AllSupportedDtypes) {
  const std::pair<const char*, DType> cases[] = {
      {"<f4", DType::Float32}, {"<f2", DType::Float16}, {"<i8", DType::Int64}, {"<i4", DType::Int32},
      {"|i1", DType::Int8},    {"|u1", DType::UInt8},   {"|b1", DType::Bool}};
  for (const auto& [descr, dtype] : cases) {
    const std::string h = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (2,), }\n";
    auto r = parse(make_file(h, std::vector<uint8_t>(2 * dtype_size(dtype), 1)));
    ASSERT_TRUE(r.ok()) << descr << ": " << r.error().to_string();
    EXPECT_EQ(r->dtype, dtype) << descr;
  }
}

TEST(Npy, FortranOrderOfVectorIsAcceptedOfMatrixRejected) {
  auto vec = parse(make_file("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 1), }\n", f32_bytes({1, 2})));
  EXPECT_TRUE(vec.ok()) << message_of(vec);  // same bytes in either order
  auto mat = parse(make_file("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }\n", f32_bytes({1, 2, 3, 4})));
  ASSERT_FALSE(mat.ok());
  EXPECT_EQ(mat.error().code(), ErrorCode::InvalidArgument);
  EXPECT_NE(mat.error().message().find("Fortran"), std::string::npos) << mat.error().message();
}

TEST(Npy, RejectsUnsupportedDtypesWithAReason) {
  auto be = parse(make_file("{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }\n", f32_bytes({1})));
  ASSERT_FALSE(be.ok());
  EXPECT_NE(be.error().message().find("big-endian"), std::string::npos) << be.error().message();
  auto c8 = parse(make_file("{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }\n", std::vector<uint8_t>(8)));
  ASSERT_FALSE(c8.ok());
  EXPECT_NE(c8.error().message().find("'<c8' is not supported"), std::string::npos) << c8.error().message();
  auto rec = parse(make_file("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }\n", f32_bytes({1})));
  ASSERT_FALSE(rec.ok());
  EXPECT_NE(rec.error().message().find("structured"), std::string::npos) << rec.error().message();
  auto obj = parse(make_file("{'descr': '|O', 'fortran_order': False, 'shape': (1,), }\n", std::vector<uint8_t>(8)));
  EXPECT_FALSE(obj.ok());
}

TEST(Npy, RejectsMalformedFiles) {
  const std::string good = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }\n";
  const auto data = f32_bytes({1, 2});
  struct Case { std::vector<uint8_t> bytes; const char* expect; };
  std::vector<Case> cases;
  cases.push_back({{}, "magic"});
  cases.push_back({{'N', 'U', 'M', 'P', 'Y', 0, 1, 0, 0, 0}, "magic"});
  auto v9 = make_file(good, data);
  v9[6] = 9;
  cases.push_back({v9, "version 9.0"});
  auto longhdr = make_file(good, data);
  longhdr[9] = 0x7F;  // header length beyond the file
  cases.push_back({longhdr, "truncated"});
  cases.push_back({make_file(good, f32_bytes({1})), "truncated file"});
  cases.push_back({make_file(good, f32_bytes({1, 2, 3})), "needs 8"});
  cases.push_back({make_file("{'descr': '<f4', 'shape': (2,), }\n", data), "lacks"});
  cases.push_back({make_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}\n", data), "unexpected key 'x'"});
  cases.push_back({make_file("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }\n", data), "non-negative"});
  cases.push_back({make_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2, }\n", data), "expected"});
  cases.push_back({make_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2,) \n", data), "expected ',' or '}'"});
  cases.push_back({make_file("{'descr': '<f4, 'fortran_order': False}\n", data), "expected ','"});
  cases.push_back({make_file("{'descr' '<f4'}\n", data), "expected ':'"});
  cases.push_back({make_file("['descr']\n", data), "not a dict"});
  cases.push_back({make_file("{'descr': '<f4', 'fortran_order': 0, 'shape': (2,), }\n", data), "fortran_order"});
  cases.push_back({make_file("{'descr': '<f4', 'fortran_order': False, 'shape': 2, }\n", data), "'shape' is not a tuple"});
  cases.push_back({make_file("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }\n", data), "too large"});
  cases.push_back({make_file("{'descr': '<f4', 'fortran_order': False, 'shape': (4194304, 4194304, 4194304), }\n", data), "too large"});
  cases.push_back({make_file("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}\n", data), "duplicate"});
  for (size_t i = 0; i < cases.size(); ++i) {
    auto r = parse(cases[i].bytes);
    ASSERT_FALSE(r.ok()) << "case " << i << " parsed";
    EXPECT_EQ(r.error().code(), ErrorCode::InvalidArgument) << i;
    EXPECT_NE(r.error().message().find(cases[i].expect), std::string::npos)
        << "case " << i << ": '" << r.error().message() << "' lacks '" << cases[i].expect << "'";
  }
}

TEST(Npy, EveryTruncationOfAValidFileFailsCleanly) {
  const auto full = make_file("{'descr': '<i4', 'fortran_order': False, 'shape': (3, 1), }\n", std::vector<uint8_t>(12, 5));
  ASSERT_TRUE(parse(full).ok());
  for (size_t n = 0; n < full.size(); ++n) {
    EXPECT_FALSE(parse(std::span<const uint8_t>(full.data(), n)).ok()) << n;
  }
}

TEST(Npy, BoolBytesAreNormalized) {
  auto r = parse(make_file("{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }\n", {0, 1, 0xFF}));
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(r->data, (std::vector<uint8_t>{0, 1, 1}));
}

TEST(Npy, EncodeWritesTheExactNumpyLayout) {
  std::vector<float> v = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, 8.0f};
  auto bytes = encode(Tensor{DType::Float32, {2, 3}, v.data()});
  ASSERT_TRUE(bytes.ok()) << bytes.error().to_string();
  // NumPy 1.x/2.x writes exactly this header for np.zeros((2, 3), np.float32): the dict, spaces,
  // '\n', total prefix 128 bytes (a multiple of 64).
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  ASSERT_EQ(bytes->size(), 128u + 24u);
  EXPECT_EQ(std::memcmp(bytes->data(), "\x93NUMPY\x01\x00", 8), 0);
  EXPECT_EQ((*bytes)[8] | ((*bytes)[9] << 8), 118);
  EXPECT_EQ(std::string(bytes->begin() + 10, bytes->begin() + 10 + static_cast<long>(dict.size())), dict);
  EXPECT_EQ((*bytes)[127], '\n');
  EXPECT_EQ((*bytes)[126], ' ');
  EXPECT_EQ(std::memcmp(bytes->data() + 128, v.data(), 24), 0);
}

TEST(Npy, EncodeShapesOfRank0And1) {
  int64_t s = 42;
  auto r0 = encode(Tensor{DType::Int64, {}, &s});
  ASSERT_TRUE(r0.ok());
  EXPECT_NE(std::string(r0->begin(), r0->end()).find("'shape': ()"), std::string::npos);
  uint8_t b[3] = {1, 0, 1};
  auto r1 = encode(Tensor{DType::Bool, {3}, b});
  ASSERT_TRUE(r1.ok());
  EXPECT_NE(std::string(r1->begin(), r1->end()).find("'descr': '|b1', 'fortran_order': False, 'shape': (3,)"), std::string::npos);
}

TEST(Npy, RoundTripAndBfloat16Rejected) {
  std::vector<uint16_t> h = {0x3C00, 0xC000};  // float16 1.0, -2.0
  auto bytes = encode(Tensor{DType::Float16, {1, 2}, h.data()});
  ASSERT_TRUE(bytes.ok());
  auto back = parse(*bytes);
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  EXPECT_EQ(back->dtype, DType::Float16);
  EXPECT_EQ(back->shape, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(std::memcmp(back->data.data(), h.data(), 4), 0);
  auto bf = encode(Tensor{DType::BFloat16, {2}, h.data()});
  ASSERT_FALSE(bf.ok());
  EXPECT_EQ(bf.error().code(), ErrorCode::InvalidArgument);
}

TEST(Npy, ReadFileErrorsNameThePath) {
  auto r = read_file("/nonexistent/dir/x.npy");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::NotFound);
  EXPECT_NE(r.error().message().find("/nonexistent/dir/x.npy"), std::string::npos);
  auto dir = read_file("/");
  ASSERT_FALSE(dir.ok());
  EXPECT_EQ(dir.error().code(), ErrorCode::InvalidArgument);
  EXPECT_NE(dir.error().message().find("not a regular file"), std::string::npos) << dir.error().message();
}

}  // namespace
}  // namespace kiln::npy
