// Output names (Method.output_names in schema/program.fbs): Graph::set_output_names and
// unique_output_names, the serializer/loader round trip into MethodMeta::output_names, files
// without the field (written before it: the output values' names, else unnamed), and files whose
// names are malformed (count, empty, repeated, not printable UTF-8) -> InvalidProgram.
#include <optional>
#include <string>
#include <vector>

#include "kiln/format.h"
#include "program_generated.h"
#include "runtime/file_format.h"
#include "runtime_test_util.h"

namespace kiln {
namespace {

// A hand-built program: y = relu(x), z = relu(x), x float32[2]; outputs (y, z). y's value is
// named "y_value", z's is unnamed; Method.output_names is `names` (absent when nullopt).
std::vector<uint8_t> two_relus(const std::optional<std::vector<std::string>>& names) {
  flatbuffers::FlatBufferBuilder b;
  auto sizes = [&] { return b.CreateVector(std::vector<int64_t>{2}); };
  auto x = fb::CreateTensor(b, fb::DType::Float32, sizes(), 0, -1, 0, b.CreateString("x"));
  auto y = fb::CreateTensor(b, fb::DType::Float32, sizes(), 0, -1, 64, b.CreateString("y_value"));
  auto z = fb::CreateTensor(b, fb::DType::Float32, sizes(), 0, -1, 128);
  std::vector<flatbuffers::Offset<fb::InstructionEntry>> entries;
  for (int32_t out : {1, 2}) {
    auto call = fb::CreateKernelCall(b, b.CreateString("aten.relu"), b.CreateVector(std::vector<int32_t>{0}),
                                     b.CreateVector(std::vector<int32_t>{out}));
    entries.push_back(fb::CreateInstructionEntry(b, fb::Instruction::KernelCall, call.Union()));
  }
  auto method = fb::CreateMethod(b, b.CreateString("forward"), b.CreateVector({x, y, z}),
                                 b.CreateVector(std::vector<int32_t>{0}), b.CreateVector(std::vector<int32_t>{1, 2}),
                                 b.CreateVector(entries), 192, 0, 0, names ? b.CreateVectorOfStrings(*names) : 0);
  fb::FinishProgramBuffer(b, fb::CreateProgram(b, kFormatVersion, b.CreateVector({method})));
  std::vector<uint8_t> file(sizeof(FileHeader) + b.GetSize());
  FileHeader h{};
  std::memcpy(h.magic, kFileMagic, sizeof(kFileMagic));
  h.version = kFormatVersion;
  h.header_size = sizeof(FileHeader);
  h.flatbuffer_offset = sizeof(FileHeader);
  h.flatbuffer_size = b.GetSize();
  h.segments_offset = file.size();
  h.file_size = file.size();
  std::memcpy(file.data(), &h, sizeof(h));
  std::memcpy(file.data() + sizeof(h), b.GetBufferPointer(), b.GetSize());
  return file;
}

TEST(OutputNames, FileWithoutTheFieldKeepsValueNamesElseUnnamed) {
  const auto file = two_relus(std::nullopt);
  KILN_ASSERT_OK_AND_ASSIGN(program, Program::load_from_buffer(file));
  KILN_ASSERT_OK_AND_ASSIGN(meta, program->method_meta("forward"));
  EXPECT_EQ(meta.output_names, (std::vector<std::string>{"y_value", ""}));
  // The construction is sound: it runs and computes relu twice.
  KILN_ASSERT_OK_AND_ASSIGN(method, program->load_method("forward"));
  std::vector<float> x{-1.5f, 2.0f};
  KILN_ASSERT_OK_AND_ASSIGN(outs, method.execute({Tensor{DType::Float32, {2}, x.data()}}));
  ASSERT_EQ(outs.size(), 2u);
  for (const Tensor& t : outs) {
    EXPECT_EQ(t.data_as<const float>()[0], 0.0f);
    EXPECT_EQ(t.data_as<const float>()[1], 2.0f);
  }
}

TEST(OutputNames, NamesInTheFileAreTheMetaNames) {
  const auto file = two_relus(std::vector<std::string>{"logits", "past.0.key"});
  KILN_ASSERT_OK_AND_ASSIGN(program, Program::load_from_buffer(file));
  KILN_ASSERT_OK_AND_ASSIGN(meta, program->method_meta("forward"));
  EXPECT_EQ(meta.output_names, (std::vector<std::string>{"logits", "past.0.key"}));
  EXPECT_EQ(meta.input_names, (std::vector<std::string>{"x"}));
}

TEST(OutputNames, MalformedNamesAreInvalidProgram) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"only_one"}, "1 output names for 2 outputs"},
      {{"a", "b", "c"}, "3 output names for 2 outputs"},
      {{"a", ""}, "output 1 has an empty name"},
      {{"a", "a"}, "output name 'a' is given twice"},
      {{"a", "b\x01"}, "output 1: the name is not a printable UTF-8 name: 'b\\x01'"},
      {{"\xff", "b"}, "output 0: the name is not a printable UTF-8 name: '\\xff'"},
  };
  for (const auto& [names, message] : cases) {
    const auto file = two_relus(names);
    auto program = Program::load_from_buffer(file);
    ASSERT_FALSE(program.ok()) << message;
    EXPECT_EQ(program.error().code(), ErrorCode::InvalidProgram) << program.error().to_string();
    EXPECT_NE(program.error().message().find(message), std::string::npos) << program.error().to_string();
  }
}

Graph two_output_graph() {
  Graph g;
  const ValueId x = g.add_input("x", {DType::Float32, {3}});
  auto r = g.add_node("aten.relu", {x}, {});
  auto s = g.add_node("aten.add", {x, x}, {{"alpha", 1.0}});
  EXPECT_TRUE(r.ok() && s.ok());
  EXPECT_TRUE(g.set_outputs({r.value()[0], s.value()[0]}).ok());
  return g;
}

TEST(OutputNames, GraphChecksNames) {
  Graph g = two_output_graph();
  EXPECT_TRUE(g.output_names().empty());
  EXPECT_EQ(g.set_output_names({"a"}).code(), ErrorCode::InvalidArgument);
  EXPECT_EQ(g.set_output_names({"a", ""}).code(), ErrorCode::InvalidArgument);
  EXPECT_EQ(g.set_output_names({"a", "a"}).code(), ErrorCode::InvalidArgument);
  EXPECT_EQ(g.set_output_names({"a", "b\n"}).code(), ErrorCode::InvalidArgument);  // the loader would refuse it
  EXPECT_TRUE(g.output_names().empty());  // a refused call changes nothing
  ASSERT_TRUE(g.set_output_names({"a", "b"}).ok());
  EXPECT_EQ(g.output_names(), (std::vector<std::string>{"a", "b"}));
  ASSERT_TRUE(g.set_outputs(g.outputs()).ok());
  EXPECT_TRUE(g.output_names().empty());  // new outputs: names cleared
}

TEST(OutputNames, UniqueOutputNames) {
  EXPECT_EQ(unique_output_names({"", "a", "a", "a_2", "a"}),
            (std::vector<std::string>{"output_0", "a", "a_3", "a_2", "a_4"}));
  EXPECT_EQ(unique_output_names({"x", "y"}), (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(unique_output_names({"a\nb", "\xff", "\xe2\x82\xac"}),
            (std::vector<std::string>{"a\\x0ab", "\\xff", "\xe2\x82\xac"}));  // the euro sign stays
  EXPECT_TRUE(unique_output_names({}).empty());
  // A name given as it is keeps it: the placeholder for an empty name, and a later repeat, are the
  // ones suffixed, with a suffix no output has.
  EXPECT_EQ(unique_output_names({"", "output_0"}), (std::vector<std::string>{"output_0_2", "output_0"}));
  EXPECT_EQ(unique_output_names({"a", "", "output_1_2", "output_1"}),
            (std::vector<std::string>{"a", "output_1_3", "output_1_2", "output_1"}));
  EXPECT_EQ(unique_output_names({"a\\x0ab", "a\nb"}), (std::vector<std::string>{"a\\x0ab", "a\\x0ab_2"}));
}

TEST(OutputNames, CompilerRoundTrip) {
  for (bool named : {true, false}) {
    Graph g = two_output_graph();
    if (named) {
      ASSERT_TRUE(g.set_output_names({"relu", "sum.0"}).ok());
    }
    ProgramBuilder pb;
    ASSERT_TRUE(pb.add_method("forward", std::move(g)).ok());
    KILN_ASSERT_OK_AND_ASSIGN(compiled, pb.compile());
    KILN_ASSERT_OK_AND_ASSIGN(program, Program::load_from_buffer(compiled.bytes));
    KILN_ASSERT_OK_AND_ASSIGN(meta, program->method_meta("forward"));
    EXPECT_EQ(meta.output_names, named ? (std::vector<std::string>{"relu", "sum.0"})
                                       : (std::vector<std::string>{"", ""}));
  }
}

}  // namespace
}  // namespace kiln
