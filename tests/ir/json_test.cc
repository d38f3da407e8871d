// Program values from JSON (ir/json.h): any nesting the memory allows, in
// time linear in the input, and errors that name the path to the problem.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "ir/json.h"
#include "ir/module.h"

namespace pejit {
namespace {

using Json = nlohmann::json;

Snapshot ListModule() {
  Module m;
  m.AddSource(R"(
type List[T] { Nil, Cons(T, List[T]) }
type Tree { Leaf(Tensor[(), i64]), Node(Tree, Tree) }
def @id(%l: List[Tensor[(), i64]]) -> List[Tensor[(), i64]] { %l }
)", "list.pj");
  return m.snapshot();
}

Json Scalar(int64_t v) { return Json{{"dtype", "i64"}, {"shape", Json::array()}, {"data", {v}}}; }

Value Load(const ModuleSnapshot& s, const Json& j, const Type& type) {
  return ValueFromJson(j, type, [&](const std::string& n) { return s.FindType(n); }, "args[0]");
}

const Type& ListType(const ModuleSnapshot& s) { return s.Get("id").func->params[0]->annotation; }

// A list of n elements, n-1, ..., 0, nested as the text format nests it.
Json ListJson(int64_t n) {
  Json list = {{"ctor", "Nil"}, {"fields", Json::array()}};
  for (int64_t i = 0; i < n; ++i) list = Json{{"ctor", "Cons"}, {"fields", {Scalar(i), std::move(list)}}};
  return list;
}

TEST(ValueFromJson, AListOfAHundredThousandElementsLoadsWithoutRecursion) {
  Snapshot s = ListModule();
  const int64_t n = 100000;
  Value v = Load(*s, ListJson(n), ListType(*s));
  int64_t length = 0, expected = n - 1;
  for (const Value* at = &v; at->ctor_name() == "Cons"; at = &at->fields()[1], ++length, --expected) {
    ASSERT_EQ(at->fields()[0].tensor().data<int64_t>()[0], expected);
  }
  EXPECT_EQ(length, n);
}

TEST(ValueFromJson, RoundTripsThroughValueToJson) {
  Snapshot s = ListModule();
  Json j = ListJson(5);
  Value v = Load(*s, j, ListType(*s));
  EXPECT_EQ(ValueToJson(v), j);
  Value again = Load(*s, ValueToJson(v), ListType(*s));
  EXPECT_TRUE(ValueEqual(v, again));
}

TEST(ValueFromJson, AnErrorNamesThePathToTheValue) {
  Snapshot s = ListModule();
  Json j = ListJson(3);
  j["fields"][1]["fields"][1]["fields"][0]["dtype"] = "f32";  // the third element
  try {
    Load(*s, j, ListType(*s));
    FAIL() << "accepted an f32 element";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).rfind("args[0].fields[1].fields[1].fields[0]: expected Tensor[(), i64]", 0), 0u)
        << e.what();
  }
  Json wrong_ctor = ListJson(2);
  wrong_ctor["fields"][1]["ctor"] = "Leaf";
  try {
    Load(*s, wrong_ctor, ListType(*s));
    FAIL() << "accepted a Leaf in a List";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "args[0].fields[1]: type List has no constructor 'Leaf'");
  }
}

// Issue 24: an error deep in a long list names the first and last steps of
// its path and how many it left out, not a message of megabytes.
TEST(ValueFromJson, AnErrorDeepInALongListKeepsItsPathShort) {
  Snapshot s = ListModule();
  const int64_t n = 100000;
  Json j = ListJson(n);
  Json* last = &j;
  for (int64_t i = 0; i + 1 < n; ++i) last = &(*last)["fields"][1];
  (*last)["fields"][0]["dtype"] = "f32";  // the last element
  try {
    Load(*s, j, ListType(*s));
    FAIL() << "accepted an f32 element";
  } catch (const std::invalid_argument& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind("args[0].fields[1].fields[1].fields[1].fields[1]...(99988 levels).fields[1]", 0), 0u) << message;
    EXPECT_NE(message.find(".fields[1].fields[1].fields[0]: expected Tensor[(), i64]"), std::string::npos) << message;
    EXPECT_LT(message.size(), 400u);
  }
}

// Issue 24: a shape whose element count wraps is refused, not taken for an
// empty tensor whose data then reads past its buffer.
TEST(ValueFromJson, AShapeWhoseElementCountOverflowsIsRefused) {
  Module m;
  m.AddSource("def @f(%x: Tensor[(?, ?), f32]) -> Tensor[(?, ?), f32] { %x }", "f.pj");
  Snapshot s = m.snapshot();
  Json big = {{"dtype", "f32"}, {"shape", {int64_t{4611686018427387904}, 4}}, {"data", Json::array()}};
  try {
    Load(*s, big, s->Get("f").func->params[0]->annotation);
    FAIL() << "accepted a shape of 2^64 elements";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("args[0]: shape (4611686018427387904, 4) has more elements than 2^63"),
              std::string::npos)
        << e.what();
  }
}

// Found by fuzz/json_value: 10^17 elements fit in i64 but not in memory; the
// data array's length is checked before anything is allocated.
TEST(ValueFromJson, AHugeShapeWithoutItsDataIsRefusedBeforeAllocating) {
  Module m;
  m.AddSource("def @f(%x: Tensor[(?, 2), f32]) -> Tensor[(?, 2), f32] { %x }", "f.pj");
  Snapshot s = m.snapshot();
  Json huge = {{"dtype", "f32"}, {"shape", {int64_t{46116860184273904}, 2}}, {"data", Json::array()}};
  try {
    Load(*s, huge, s->Get("f").func->params[0]->annotation);
    FAIL() << "accepted a shape without its data";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("args[0]: data must be a flat array of 92233720368547808 numbers"), std::string::npos)
        << e.what();
  }
}

TEST(ValueFromJson, TuplesAndTensorsNestInsideStructures) {
  Module m;
  m.AddSource(R"(
type Tree { Leaf(Tensor[(2,), f32]), Node(Tree, (Tensor[(), i64], Tree)) }
def @f(%t: Tree) -> Tree { %t }
)", "tree.pj");
  Snapshot s = m.snapshot();
  Json leaf = {{"ctor", "Leaf"}, {"fields", {Json{{"dtype", "f32"}, {"shape", {2}}, {"data", {1.5, -2}}}}}};
  Json tree = {{"ctor", "Node"}, {"fields", {leaf, Json::array({Scalar(7), leaf})}}};
  Value v = Load(*s, tree, s->Get("f").func->params[0]->annotation);
  EXPECT_EQ(v.ctor_name(), "Node");
  EXPECT_EQ(v.fields()[1].fields()[0].tensor().data<int64_t>()[0], 7);
  EXPECT_FLOAT_EQ(v.fields()[1].fields()[1].fields()[0].tensor().data<float>()[1], -2.0f);
  EXPECT_EQ(ValueToJson(v), tree);
}

// ---- Values to JSON and back: exactly, at any depth -----------------------------

Value TensorValue(Tensor t) { return Value(std::move(t)); }

TEST(ValueToJsonText, PrintsI64ExactlyAndFloatsInTheirShortestDigits) {
  Tensor big = Tensor::FromVector<int64_t>({2}, {9007199254740993, -9223372036854775807 - 1});
  EXPECT_EQ(ValueToJsonText(TensorValue(big)),
            R"({"dtype":"i64","shape":[2],"data":[9007199254740993,-9223372036854775808]})");
  // 0.1f is 0.100000001490116...: its shortest f32 digits, not a double's.
  Tensor f = Tensor::FromVector<float>({3}, {0.1f, 3.0f, 1e-20f});
  EXPECT_EQ(ValueToJsonText(TensorValue(f)), R"({"dtype":"f32","shape":[3],"data":[0.1,3.0,1e-20]})");
  Tensor b = Tensor::FromVector<bool>({2}, {true, false});
  EXPECT_EQ(ValueToJsonText(TensorValue(b)), R"({"dtype":"bool","shape":[2],"data":[true,false]})");
}

TEST(ValueToJsonText, NonFiniteFloatsAreStringsThatReadBack) {
  const float inf = std::numeric_limits<float>::infinity();
  Tensor t = Tensor::FromVector<float>({3}, {std::numeric_limits<float>::quiet_NaN(), inf, -inf});
  std::string text = ValueToJsonText(TensorValue(t));
  EXPECT_EQ(text, R"({"dtype":"f32","shape":[3],"data":["nan","inf","-inf"]})");
  Value back = ValueFromJson(Json::parse(text), TensorTy(DType::kF32, {3}), nullptr, "v");
  const float* p = back.tensor().data<float>();
  EXPECT_TRUE(std::isnan(p[0]));
  EXPECT_EQ(p[1], inf);
  EXPECT_EQ(p[2], -inf);
}

TEST(ValueFromJson, RefusesNumbersItWouldHaveToChange) {
  auto error = [](const Json& data, DType dtype) {
    try {
      ValueFromJson(Json{{"dtype", DTypeName(dtype)}, {"shape", {1}}, {"data", data}}, TensorTy(dtype, {1}),
                    nullptr, "args[2]");
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(error(Json::parse("[1e300]"), DType::kF32),
            "args[2]: data[0]: 1e+300 is out of f32's range (largest 3.4028235e+38); write \"inf\" for infinity");
  EXPECT_EQ(error(Json::parse("[1e300]"), DType::kF64), "accepted");
  EXPECT_EQ(error(Json::parse("[18446744073709551615]"), DType::kI64),
            "args[2]: data[0]: 18446744073709551615 is out of i64's range");
  EXPECT_EQ(error(Json::parse("[-9223372036854775809]"), DType::kI64),  // read as a double: no integer holds it
            "args[2]: data[0]: -9.223372036854776e+18 is out of i64's range");
  EXPECT_EQ(error(Json::parse("[1.5]"), DType::kI64), "args[2]: data[0]: expected an integer for an i64, got 1.5");
  EXPECT_EQ(error(Json::parse(R"(["one"])"), DType::kF32),
            "args[2]: data[0]: expected a number (or \"nan\", \"inf\", \"-inf\") for a f32, got \"one\"");
  EXPECT_EQ(error(Json::parse("[1]"), DType::kBool), "args[2]: data[0]: expected true or false for a bool, got 1");
}

TEST(ValueToJsonText, AListOfAHundredThousandElementsPrintsWithoutRecursionAndReadsBack) {
  Snapshot s = ListModule();
  const int64_t n = 100000;
  Value v = Load(*s, ListJson(n), ListType(*s));
  std::string text = ValueToJsonText(v);
  EXPECT_EQ(text.rfind(R"({"ctor":"Cons","fields":[{"dtype":"i64","shape":[],"data":[99999]},{"ctor":"Cons")", 0), 0u);
  EXPECT_TRUE(ValueEqual(Load(*s, Json::parse(text), ListType(*s)), v));
}

}  // namespace
}  // namespace pejit
