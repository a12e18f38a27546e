// The matrix-instruction table against AMD's Matrix Instruction Calculator
// (tests/data/amd_matrix_layouts.json, slots [row, col, lane, element]), slot by
// slot, plus the structural facts every row must satisfy.
#include "lowering/matrix_table.h"
#include "lowering/target.h"
#include "tools/json.h"

#include <gtest/gtest.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

namespace flashjit::lowering {
namespace {

namespace json = flashjit::cli::json;

const std::string kCalculatorPath = std::string(FLASHJIT_TEST_DATA) + "/amd_matrix_layouts.json";

// Calculator instructions that deliberately have no row: flashjit accumulates in f32
// and uses f16/bf16 inputs only. A new calculator key must be added to the table
// or here, with a reason.
const std::map<std::string, std::string> kUnusedCalculatorKeys = {
    {"gfx11.v_wmma_f16_16x16x16_f16", "f16 accumulator (attention accumulates in f32, doc §2.3)"},
    {"gfx12.v_wmma_f16_16x16x16_f16", "f16 accumulator"},
    {"gfx12.v_wmma_f32_16x16x16_fp8_fp8", "fp8 inputs"},
};

// The bf16 builtins declared with __bf16 vectors ('V8y' in BuiltinsAMDGPU.def, doc
// §5.1, §10.2); every other bf16 builtin takes short vectors ('V4s', 'V8s', 'V16s').
const std::set<std::string_view> kBf16VectorBuiltins = {
    "__builtin_amdgcn_mfma_f32_16x16x32_bf16",
    "__builtin_amdgcn_mfma_f32_32x32x16_bf16",
};

std::optional<std::string> read_file(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return std::nullopt;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

/// The member `key` of `v`, or nullptr (also when `v` is not an object).
const json::Value *member(const json::Value &v, const std::string &key) {
  if (!v.is_object())
    return nullptr;
  auto it = v.find(key);
  return it == v.end() ? nullptr : &*it;
}

const json::Value &calculator() {
  static const json::Value data = [] {
    std::optional<std::string> text = read_file(kCalculatorPath);
    if (!text) {
      ADD_FAILURE() << "cannot read " << kCalculatorPath;
      return json::Value{};
    }
    std::string error;
    std::optional<json::Value> v = json::parse(*text, &error);
    if (!v) {
      ADD_FAILURE() << kCalculatorPath << ": " << error;
      return json::Value{};
    }
    return *v;
  }();
  return data;
}

const json::Value *calculator_instructions() {
  const json::Value *instrs = member(calculator(), "instructions");
  EXPECT_TRUE(instrs && instrs->is_object()) << kCalculatorPath << " has no 'instructions' object";
  return instrs;
}

/// The calculator key of a row: "<family>.<mnemonic>", e.g. "cdna3.v_mfma_f32_32x32x8_f16".
std::string calculator_key(const MatrixInstr &row) {
  return std::string(family_name(row.family)) + "." + std::string(row.mnemonic);
}

std::string row_name(const MatrixInstr &row) {
  return calculator_key(row) + " (" + std::string(row.builtin) + ")";
}

using Slot = std::array<int, 4>; // row, col, lane, element

std::multiset<Slot> slots_of(LaneMap map, int lanes, int elems) {
  std::multiset<Slot> slots;
  for (int lane = 0; lane < lanes; ++lane)
    for (int e = 0; e < elems; ++e) {
      MatrixCoord c = map(lane, e);
      slots.insert({c.row, c.col, lane, e});
    }
  return slots;
}

std::multiset<Slot> slots_of(const json::Value &operand) {
  std::multiset<Slot> slots;
  const json::Value *list = member(operand, "slots");
  if (!list || !list->is_array())
    return slots;
  for (const json::Value &s : *list) {
    if (!s.is_array() || s.size() != 4) {
      ADD_FAILURE() << "slot " << s.dump() << " is not 4 numbers";
      continue;
    }
    slots.insert({s[0].get<int>(), s[1].get<int>(), s[2].get<int>(), s[3].get<int>()});
  }
  return slots;
}

std::string show(const Slot &s) {
  return "[row " + std::to_string(s[0]) + ", col " + std::to_string(s[1]) + ", lane " +
         std::to_string(s[2]) + ", elem " + std::to_string(s[3]) + "]";
}

/// Compares one operand's map with the calculator, slot by slot, both ways.
void expect_operand_matches(const MatrixInstr &row, const json::Value &instr,
                            std::string_view operand, LaneMap map, int elems, int rows, int cols) {
  SCOPED_TRACE(calculator_key(row) + " operand " + std::string(operand));
  const json::Value *json_operand = member(instr, std::string(operand));
  ASSERT_TRUE(json_operand != nullptr) << "calculator entry lacks operand " << operand;
  ASSERT_TRUE(member(*json_operand, "rows") && member(*json_operand, "cols"));
  EXPECT_EQ(json_operand->at("rows").get<int>(), rows);
  EXPECT_EQ(json_operand->at("cols").get<int>(), cols);

  std::multiset<Slot> ours = slots_of(map, row.layout->wave_size, elems);
  std::multiset<Slot> theirs = slots_of(*json_operand);
  EXPECT_EQ(ours.size(), theirs.size()) << "slot counts differ";
  EXPECT_EQ(std::set<Slot>(theirs.begin(), theirs.end()).size(), theirs.size())
      << "the calculator lists a slot twice";
  int shown = 0;
  for (const Slot &s : ours)
    if (!theirs.count(s) && shown++ < 8)
      ADD_FAILURE() << "table has " << show(s) << ", the calculator does not";
  for (const Slot &s : theirs)
    if (!ours.count(s) && shown++ < 16)
      ADD_FAILURE() << "calculator has " << show(s) << ", the table does not";
}

TEST(JsonReader, ParsesTheValueKinds) {
  std::string error;
  std::optional<json::Value> v = json::parse(
      R"( {"a": [1, -2.5e1, true, false, null], "s": "x\"y\\n\u0041", "o": {}} )", &error);
  ASSERT_TRUE(v) << error;
  ASSERT_TRUE(v->is_object());
  const json::Value *a = member(*v, "a");
  ASSERT_TRUE(a && a->is_array());
  ASSERT_EQ(a->size(), 5u);
  EXPECT_EQ(json::integer((*a)[0]), 1);
  EXPECT_EQ((*a)[1].get<double>(), -25.0);
  EXPECT_FALSE(json::integer((*a)[1]));
  EXPECT_TRUE((*a)[2].is_boolean() && (*a)[2].get<bool>());
  EXPECT_TRUE((*a)[3].is_boolean() && !(*a)[3].get<bool>());
  EXPECT_TRUE((*a)[4].is_null());
  EXPECT_EQ(v->at("s"), "x\"y\\nA");
  EXPECT_TRUE(v->at("o").is_object());
  EXPECT_EQ(member(*v, "missing"), nullptr);

  EXPECT_FALSE(json::parse("[1, 2", &error));
  EXPECT_NE(error.find("line 1, column 6"), std::string::npos) << error;
  EXPECT_FALSE(json::parse("{\"a\" 1}"));
  EXPECT_FALSE(json::parse("[1] x"));
  EXPECT_FALSE(json::parse("[tru]"));
}

TEST(CalculatorData, SharedCopyIsByteIdentical) {
  const std::string shared =
      std::string(FLASHJIT_SOURCE_DIR) + "/../shared/data/amd_matrix_layouts.json";
  if (!std::filesystem::exists(shared))
    GTEST_SKIP() << "no shared copy at " << shared << " (only present in the team checkout)";
  std::optional<std::string> a = read_file(shared);
  std::optional<std::string> b = read_file(kCalculatorPath);
  ASSERT_TRUE(a && b);
  EXPECT_TRUE(*a == *b) << shared << " and " << kCalculatorPath
                        << " differ: copy the shared one into tests/data";
}

TEST(MatrixTable, CalculatorRowsMatchSlotBySlot) {
  const json::Value *instrs = calculator_instructions();
  ASSERT_TRUE(instrs);
  int checked = 0;
  for (const MatrixInstr &row : matrix_table()) {
    const json::Value *instr = member(*instrs, calculator_key(row));
    EXPECT_EQ(instr != nullptr, row.layout_source == LayoutSource::calculator)
        << row_name(row) << ": layout_source must say 'calculator' exactly when the calculator "
        << "data has the instruction";
    if (!instr)
      continue;
    SCOPED_TRACE(row_name(row));
    const LaneLayout &l = *row.layout;
    EXPECT_EQ(instr->at("wave").get<int>(), l.wave_size);
    EXPECT_EQ(instr->at("ab_bits").get<int>(), 8 * dtype_bytes(row.ab_dtype));
    EXPECT_EQ(instr->at("cd_bits").get<int>(), 8 * dtype_bytes(row.acc_dtype));
    expect_operand_matches(row, *instr, "A", l.a, l.a_elems, l.m, l.k);
    expect_operand_matches(row, *instr, "B", l.b, l.b_elems, l.k, l.n);
    expect_operand_matches(row, *instr, "D", l.d, l.cd_elems, l.m, l.n);
    std::cout << "[calculator] " << row_name(row) << ": A, B, D match slot by slot\n";
    ++checked;
  }
  std::cout << checked << " of " << matrix_table().size()
            << " rows checked against the calculator\n";
  EXPECT_GT(checked, 0);
}

TEST(MatrixTable, EveryCalculatorInstructionHasARowOrAReason) {
  const json::Value *instrs = calculator_instructions();
  ASSERT_TRUE(instrs);
  std::set<std::string> row_keys;
  for (const MatrixInstr &row : matrix_table())
    row_keys.insert(calculator_key(row));
  for (const auto &entry : instrs->items()) {
    const std::string &key = entry.key();
    if (row_keys.count(key))
      continue;
    auto unused = kUnusedCalculatorKeys.find(key);
    if (unused == kUnusedCalculatorKeys.end())
      ADD_FAILURE() << "calculator instruction " << key << " has no table row and no reason in "
                    << "kUnusedCalculatorKeys";
    else
      std::cout << "[unused] " << key << ": " << unused->second << "\n";
  }
  for (const auto &[key, reason] : kUnusedCalculatorKeys)
    EXPECT_TRUE(instrs->contains(key))
        << key << " is listed as unused but not in the calculator data";
}

// Rows the calculator snapshot does not cover ([sources]-only, doc §5.2-5.3): named
// in the log, with a note when their maps coincide with a calculator-checked row.
TEST(MatrixTable, SourcesOnlyRowsAreNamed) {
  int sources_only = 0;
  for (const MatrixInstr &row : matrix_table()) {
    if (row.layout_source != LayoutSource::sources)
      continue;
    ++sources_only;
    // Name a checked row with the same layout, preferring one with the same builtin.
    const MatrixInstr *twin = nullptr;
    for (const MatrixInstr &other : matrix_table()) {
      if (other.layout_source != LayoutSource::calculator || other.layout != row.layout)
        continue;
      if (!twin || (other.builtin == row.builtin && twin->builtin != row.builtin))
        twin = &other;
    }
    std::string note = twin ? "its lane maps are the ones checked for " + calculator_key(*twin)
                            : "no calculator-checked row has the same layout";
    std::cout << "[sources]-only " << row_name(row) << ": " << note << "\n";
  }
  std::cout << sources_only << " rows are [sources]-only (no calculator entry)\n";
  for (const MatrixInstr &row : matrix_table()) {
    if (row.family == Family::cdna4) {
      EXPECT_EQ(row.layout_source, LayoutSource::sources)
          << row_name(row) << ": the calculator snapshot has no CDNA4";
    }
  }
}

/// Every (lane, elem) lands inside the rows x cols matrix and every entry is held
/// by exactly `copies` slots.
void expect_covers(std::string_view what, LaneMap map, int lanes, int elems, int rows, int cols,
                   int copies) {
  SCOPED_TRACE(std::string(what));
  std::vector<int> held(rows * cols, 0);
  for (int lane = 0; lane < lanes; ++lane)
    for (int e = 0; e < elems; ++e) {
      MatrixCoord c = map(lane, e);
      ASSERT_TRUE(c.row >= 0 && c.row < rows && c.col >= 0 && c.col < cols)
          << "lane " << lane << " elem " << e << " -> (" << c.row << ", " << c.col << ")";
      ++held[c.row * cols + c.col];
    }
  for (int i = 0; i < rows * cols; ++i)
    EXPECT_EQ(held[i], copies) << "entry (" << i / cols << ", " << i % cols << ")";
}

TEST(MatrixTable, LaneMapsAreBijections) {
  for (const MatrixInstr &row : matrix_table()) {
    SCOPED_TRACE(row_name(row));
    const LaneLayout &l = *row.layout;
    int rep = l.ab_replication;
    EXPECT_EQ(l.a_elems * l.wave_size, l.m * l.k * rep);
    EXPECT_EQ(l.b_elems * l.wave_size, l.k * l.n * rep);
    EXPECT_EQ(l.cd_elems * l.wave_size, l.m * l.n);
    expect_covers("A", l.a, l.wave_size, l.a_elems, l.m, l.k, rep);
    expect_covers("B", l.b, l.wave_size, l.b_elems, l.k, l.n, rep);
    expect_covers("D", l.d, l.wave_size, l.cd_elems, l.m, l.n, 1);
    // Replicas: lane L holds what lane L % (wave / rep) holds (gfx11: L and L+16).
    int distinct_lanes = l.wave_size / rep;
    for (int lane = distinct_lanes; lane < l.wave_size; ++lane)
      for (int e = 0; e < l.a_elems; ++e) {
        EXPECT_EQ(l.a(lane, e), l.a(lane % distinct_lanes, e)) << "A lane " << lane;
        EXPECT_EQ(l.b(lane, e), l.b(lane % distinct_lanes, e)) << "B lane " << lane;
      }
  }
}

TEST(MatrixTable, RowFieldsAreConsistent) {
  std::set<std::string> keys;
  std::set<std::tuple<Family, DType, int, int, int>> shapes;
  for (const MatrixInstr &row : matrix_table()) {
    SCOPED_TRACE(row_name(row));
    EXPECT_TRUE(keys.insert(calculator_key(row)).second) << "two rows with one mnemonic";
    EXPECT_TRUE(shapes.insert({row.family, row.ab_dtype, row.m(), row.n(), row.k()}).second)
        << "two rows for one (family, dtype, shape): find_matrix_instr would be ambiguous";
    if (target::family_facts(row.family).vendor == target::Vendor::nvidia) {
      // NVIDIA: inline PTX, no builtin; the mnemonic names the shape as m16n8k16.
      EXPECT_TRUE(row.builtin.empty());
      EXPECT_NE(row.mnemonic.find(fmt::format("m{}n{}k{}", row.m(), row.n(), row.k())),
                std::string_view::npos);
      EXPECT_TRUE(row.trailing_args.empty());
      continue;
    }
    std::string shape =
        std::to_string(row.m()) + "x" + std::to_string(row.n()) + "x" + std::to_string(row.k());
    EXPECT_NE(row.mnemonic.find(shape), std::string_view::npos);
    EXPECT_NE(row.builtin.find(shape), std::string_view::npos);
    EXPECT_TRUE(row.builtin.starts_with("__builtin_amdgcn_"));
    EXPECT_EQ(row.acc_dtype, DType::f32);
    EXPECT_EQ(row.cd_elem_type, "float");
    if (row.ab_dtype == DType::f16)
      EXPECT_EQ(row.ab_elem_type, "_Float16");
    else if (row.ab_dtype == DType::bf16)
      EXPECT_EQ(row.ab_elem_type, kBf16VectorBuiltins.count(row.builtin) ? "__bf16" : "short");
    else
      ADD_FAILURE() << "A/B must be f16 or bf16";

    bool wmma = row.mnemonic.starts_with("v_wmma_");
    EXPECT_EQ(wmma, row.family == Family::gfx11 || row.family == Family::gfx12);
    if (wmma) {
      EXPECT_TRUE(row.trailing_args.empty());
    } else {
      ASSERT_EQ(row.trailing_args.size(), 3u);
      EXPECT_EQ(row.trailing_args[0].name, "cbsz");
      EXPECT_EQ(row.trailing_args[1].name, "abid");
      EXPECT_EQ(row.trailing_args[2].name, "blgp");
      for (const BuiltinArg &arg : row.trailing_args)
        EXPECT_EQ(arg.value, 0);
    }
    // gfx12 builtins carry the _gfx12 suffix; gfx11's must not (doc §10.1).
    EXPECT_EQ(row.builtin.ends_with("_w32_gfx12"), row.family == Family::gfx12);
    EXPECT_EQ(row.builtin.ends_with("_w32"), row.family == Family::gfx11);
  }
}

TEST(MatrixTable, WaveSizeMatchesTheTargets) {
  for (std::string_view arch : supported_archs()) {
    Expected<Target> t = parse_target(arch);
    ASSERT_TRUE(t) << t.status().message();
    EXPECT_FALSE(t->matrix_instrs.empty()) << arch;
    for (const MatrixInstr *row : t->matrix_instrs) {
      EXPECT_EQ(row->family, t->family) << arch << " " << row_name(*row);
      EXPECT_EQ(row->layout->wave_size, t->wave_size) << arch << " " << row_name(*row);
    }
  }
}

TEST(MatrixTable, FamiliesHaveTheExpectedRows) {
  std::map<Family, std::vector<std::string>> by_family;
  for (const MatrixInstr &row : matrix_table())
    by_family[row.family].push_back(std::string(row.mnemonic));
  using V = std::vector<std::string>;
  EXPECT_EQ(by_family[Family::gfx11], (V{"v_wmma_f32_16x16x16_f16", "v_wmma_f32_16x16x16_bf16"}));
  EXPECT_EQ(by_family[Family::gfx12], (V{"v_wmma_f32_16x16x16_f16", "v_wmma_f32_16x16x16_bf16"}));
  EXPECT_EQ(by_family[Family::cdna2], (V{"v_mfma_f32_16x16x16f16", "v_mfma_f32_16x16x16bf16_1k",
                                         "v_mfma_f32_32x32x8f16", "v_mfma_f32_32x32x8bf16_1k"}));
  EXPECT_EQ(by_family[Family::cdna3], (V{"v_mfma_f32_16x16x16_f16", "v_mfma_f32_16x16x16_bf16",
                                         "v_mfma_f32_32x32x8_f16", "v_mfma_f32_32x32x8_bf16"}));
  EXPECT_EQ(by_family[Family::cdna4],
            (V{"v_mfma_f32_16x16x32_f16", "v_mfma_f32_16x16x32_bf16", "v_mfma_f32_32x32x16_f16",
               "v_mfma_f32_32x32x16_bf16", "v_mfma_f32_16x16x16_f16", "v_mfma_f32_16x16x16_bf16",
               "v_mfma_f32_32x32x8_f16", "v_mfma_f32_32x32x8_bf16"}));
  // Hopper runs Ampere's mma.sync (its wgmma rows come with an sm90 rule set).
  const V mma_sync = {"mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
                      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"};
  EXPECT_EQ(by_family[Family::sm80], mma_sync);
  EXPECT_EQ(by_family[Family::sm90], mma_sync);
}

TEST(MatrixTable, FindMatrixInstr) {
  Target gfx1201 = parse_target("gfx1201").take();
  Expected<const MatrixInstr *> r = find_matrix_instr(gfx1201, DType::bf16, 16, 16, 16);
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_EQ((*r)->builtin, "__builtin_amdgcn_wmma_f32_16x16x16_bf16_w32_gfx12");
  EXPECT_EQ((*r)->ab_elem_type, "short");

  Target gfx1100 = parse_target("gfx1100").take();
  r = find_matrix_instr(gfx1100, DType::f16, 16, 16, 16);
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_EQ((*r)->builtin, "__builtin_amdgcn_wmma_f32_16x16x16_f16_w32");
  EXPECT_EQ((*r)->layout->ab_replication, 2);

  Target gfx950 = parse_target("gfx950").take();
  r = find_matrix_instr(gfx950, DType::bf16, 32, 32, 16);
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_EQ((*r)->builtin, "__builtin_amdgcn_mfma_f32_32x32x16_bf16");
  EXPECT_EQ((*r)->ab_elem_type, "__bf16");
  r = find_matrix_instr(gfx950, DType::bf16, 16, 16, 16);
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_EQ((*r)->builtin, "__builtin_amdgcn_mfma_f32_16x16x16bf16_1k");
  EXPECT_EQ((*r)->ab_elem_type, "short");

  Target gfx90a = parse_target("gfx90a:xnack-").take();
  r = find_matrix_instr(gfx90a, DType::f16, 32, 32, 8);
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_EQ((*r)->mnemonic, "v_mfma_f32_32x32x8f16");
  Target gfx942 = parse_target("gfx942").take();
  r = find_matrix_instr(gfx942, DType::f16, 32, 32, 8);
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_EQ((*r)->mnemonic, "v_mfma_f32_32x32x8_f16");

  r = find_matrix_instr(gfx1201, DType::f16, 32, 32, 8);
  ASSERT_FALSE(r);
  const std::string &msg = r.status().message();
  EXPECT_NE(msg.find("gfx1201"), std::string::npos) << msg;
  EXPECT_NE(msg.find("32x32x8"), std::string::npos) << msg;
  EXPECT_NE(msg.find("f16 16x16x16, bf16 16x16x16"), std::string::npos) << msg;
  EXPECT_FALSE(find_matrix_instr(gfx942, DType::bf16, 16, 16, 32)); // gfx950 only
  EXPECT_FALSE(find_matrix_instr(gfx942, DType::f32, 16, 16, 16));
}

} // namespace
} // namespace flashjit::lowering
