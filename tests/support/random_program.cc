// The random program generator.
//
// 1. Shape of a program. A program picks its recursive types first (tree,
//    list, generic Seq[A], three-way tree, rose tree with its forest), then
//    the shared weights W that @main and every recursive function receive
//    (one by one or as one tuple), the helpers' signatures, and @main's
//    parameters: one root per family of types, W, extra data, maybe i64
//    indices and a static i64.
// 2. Expressions are written by type: Tensor(shape) picks a production (an
//    operator, a let, an if, a match, a call, ...) whose output has that
//    shape and asks for inputs of the shapes the production needs, until the
//    body's budget or the depth runs out; then a leaf takes a variable in
//    scope (recent bindings first) and adapts its shape with reshape, slice,
//    pad, reductions or broadcast_to, so data flows from the parameters to
//    the results.
// 3. A variable bound for a reason (a let meant to be shared, a recursive
//    result, a closure's parameter) is checked to be used, twice for shared
//    lets; if the random body did not, it is folded in with an add or mul.
// 4. Recursive functions @fold_k(%t, W, %d) match on their ADT and recurse
//    on the fields of the matched constructor only, so recursion is
//    structural and terminates; %d starts at a constant (or the static
//    argument) and grows by 1, so `if`s on it are static for the partial
//    evaluator and still differ from node to node.
// 5. Tameness: every result of a recursive function goes through tanh or
//    sigmoid; exp only sees tanh, log sees sigmoid + 0.5, div and sqrt see
//    y*y + 1 or sigmoid + 0.5, pow sees tanh or sigmoid.
// 6. Determinism: every random choice is made in a statement of its own or
//    inside a braced list (evaluated left to right), never in two operands
//    of one `+`, whose order C++ leaves to the compiler. The text is then a
//    function of the seed alone.
#include "tests/support/random_program.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <functional>
#include <initializer_list>
#include <numeric>
#include <stdexcept>

#include "ops/random.h"

namespace pejit {
namespace {

using Ints = std::vector<int64_t>;
using Kind = RandomType::Kind;

std::string Join(const std::vector<std::string>& parts, const char* sep = ", ") {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? sep : "") + parts[i];
  return out;
}

// `name(args...)`.
std::string Fn(const std::string& name, std::initializer_list<std::string> args) {
  return name + "(" + Join(std::vector<std::string>(args)) + ")";
}

std::string IntsText(const Ints& v) {
  std::vector<std::string> parts;
  for (int64_t x : v) parts.push_back(std::to_string(x));
  return "[" + Join(parts) + "]";
}

std::string ShapeText(const Shape& s, bool rows_unknown = false) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < s.size(); ++i) parts.push_back(i == 0 && rows_unknown ? "?" : std::to_string(s[i]));
  return "(" + Join(parts) + (s.size() == 1 ? ",)" : ")");
}

// An f32 literal with two decimals (a decimal point makes it f32).
std::string Float(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  std::string s = buf;
  return s == "-0.00" ? "0.00" : s;
}

std::string TensorText(const Shape& s, const char* dtype = "f32", bool rows_unknown = false) {
  return "Tensor[" + ShapeText(s, rows_unknown) + ", " + dtype + "]";
}

bool IdentChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// Occurrences of `word` ("%v3", "tanh(") not preceded or followed by more of a name.
int CountWord(const std::string& text, const std::string& word) {
  int n = 0;
  for (size_t at = text.find(word); at != std::string::npos; at = text.find(word, at + 1)) {
    size_t end = at + word.size();
    bool starts = word[0] == '%' || at == 0 || (!IdentChar(text[at - 1]) && text[at - 1] != '%' && text[at - 1] != '@');
    bool ends = word.back() == '(' || end == text.size() || !IdentChar(text[end]);
    n += starts && ends;
  }
  return n;
}

// Every operator the generator writes; counted in the text as features.
const char* const kOps[] = {
    "neg", "abs", "exp", "log", "tanh", "sigmoid", "relu", "sqrt", "pow", "copy", "add", "sub", "mul", "div",
    "maximum", "minimum", "less", "greater", "equal", "less_equal", "greater_equal", "not_equal", "logical_and",
    "logical_or", "logical_not", "where", "cast", "matmul", "dense", "sum", "mean", "max", "min", "logsumexp", "norm", "zeros_like", "ones_like", "clip", "argmax", "argmin",
    "softmax", "log_softmax", "reshape", "expand_dims", "squeeze", "transpose", "concat", "stack", "split", "chunk",
    "slice", "pad", "broadcast_to", "take", "scatter_add", "one_hot", "cross_entropy", "nll", "gather", "layer_norm",
    "dropout", "floor_div", "mod", "zeros", "ones"};

// A function the generator can call.
struct FuncSig {
  std::string name;  // with '@'
  std::vector<RandomType> params;
  RandomType ret;
};

RandomType F32(Shape s) {
  RandomType t;
  t.kind = Kind::kF32;
  t.shape = std::move(s);
  return t;
}
RandomType Index(Shape s, int64_t bound) {
  RandomType t;
  t.kind = Kind::kIndex;
  t.shape = std::move(s);
  t.bound = bound;
  return t;
}
RandomType StaticInt(int64_t bound) {
  RandomType t;
  t.kind = Kind::kStaticInt;
  t.bound = bound;
  return t;
}
RandomType Tuple(std::vector<RandomType> fields) {
  RandomType t;
  t.kind = Kind::kTuple;
  t.fields = std::move(fields);
  return t;
}
RandomType Adt(int k) {
  RandomType t;
  t.kind = Kind::kAdt;
  t.adt = k;
  return t;
}

class Generator {
 public:
  Generator(uint64_t seed, const RandomProgramOptions& options)
      : rng_(seed * 0x9e3779b97f4a7c15ull + 0x1234567ull), options_(options) {
    program_.seed = seed;
  }

  RandomProgram Run();

 private:
  struct ScopeVar {
    std::string name;  // with '%'
    RandomType type;
    int weight;        // preference as a leaf: fresh bindings over parameters
  };
  using Scope = std::vector<ScopeVar>;

  // What the body being written may call and recurse on.
  struct Context {
    int helpers_callable = 0;   // helpers @h0 .. below this index
    bool folds_callable = false;
    std::string depth;          // the static depth to pass to folds
    std::string own_adt_param;  // a fold's own parameter: never recursed on again
  };

  struct Atom {
    std::string expr;
    Shape shape;
    int weight;
  };

  // ---- randomness ------------------------------------------------------------
  int64_t Int(int64_t lo, int64_t hi) { return rng_.NextInt(lo, hi + 1); }  // [lo, hi]
  bool Coin(double p) { return rng_.NextUniform() < p; }
  template <typename T>
  T Pick(const std::vector<T>& v) {
    return v[rng_.NextInt(0, static_cast<int64_t>(v.size()))];
  }
  std::string PickOp(std::initializer_list<const char*> names) {
    std::vector<std::string> v(names.begin(), names.end());
    return Pick(v);
  }
  size_t PickWeighted(const std::vector<int>& weights) {
    int total = std::accumulate(weights.begin(), weights.end(), 0);
    int64_t r = rng_.NextInt(0, total);
    for (size_t i = 0; i < weights.size(); ++i) {
      if (r < weights[i]) return i;
      r -= weights[i];
    }
    return weights.size() - 1;
  }
  // Dimensions up to `max_dim`, shifted by how far options_.max_dim is from 5.
  Shape RandomShape(int min_rank, int max_rank, int64_t max_dim) {
    int rank = static_cast<int>(Int(min_rank, max_rank));
    int64_t bound = std::max<int64_t>(1, max_dim + options_.max_dim - 5);
    Shape s;
    for (int i = 0; i < rank; ++i) s.push_back(Int(1, bound));
    return s;
  }
  // A shape that broadcasts to `s`: itself, a scalar, a suffix, or with 1s.
  Shape Partner(const Shape& s) {
    switch (Int(0, 4)) {
      case 0: return {};
      case 1: return Shape(s.begin() + Int(0, static_cast<int64_t>(s.size())), s.end());
      case 2: {
        Shape p = s;
        for (int64_t& d : p) {
          if (Coin(0.5)) d = 1;
        }
        return p;
      }
      default: return s;
    }
  }

  void Note(const std::string& feature) { ++program_.features[feature]; }
  std::string Fresh(const char* stem) { return std::string("%") + stem + std::to_string(names_++); }

  std::string TypeText(const RandomType& t) const {
    switch (t.kind) {
      case Kind::kF32: return TensorText(t.shape, "f32", t.rows_unknown);
      case Kind::kIndex: return TensorText(t.shape, "i64");
      case Kind::kStaticInt: return "Tensor[(), i64]";
      case Kind::kTuple: {
        std::vector<std::string> parts;
        for (const RandomType& f : t.fields) parts.push_back(TypeText(f));
        return "(" + Join(parts) + (parts.size() == 1 ? ",)" : ")");
      }
      case Kind::kAdt: return program_.adts[t.adt].type_text;
    }
    return "?";
  }

  // A function's result: a tensor or a pair of tensors.
  RandomType ResultType() {
    if (Coin(0.35)) {
      Shape a = RandomShape(1, 2, 4);
      Shape b = RandomShape(0, 2, 4);
      return Tuple({F32(a), F32(b)});
    }
    return F32(RandomShape(0, 2, 4));
  }

  // ---- constants -------------------------------------------------------------
  std::string Literal() { return Float(rng_.NextUniform() * 2 - 1); }
  std::string ConstF32(const Shape& s) {
    if (s.empty()) return Literal();
    int64_t n = NumElements(s);
    if (n > 12) return Fn("broadcast_to", {Literal(), "shape=" + IntsText(s)});
    std::vector<std::string> data;
    for (int64_t i = 0; i < n; ++i) data.push_back(Literal());
    return "tensor(f32, " + ShapeText(s) + ", [" + Join(data) + "])";
  }
  std::string ConstIndices(const Shape& s, int64_t bound) {
    std::vector<std::string> data;
    for (int64_t i = 0; i < NumElements(s); ++i) data.push_back(std::to_string(rng_.NextInt(0, bound)));
    return "tensor(i64, " + ShapeText(s) + ", [" + Join(data) + "])";
  }

  // ---- leaves ----------------------------------------------------------------
  // The f32 tensors an expression of type `t` gives access to.
  void AtomsOf(const std::string& expr, const RandomType& t, int weight, const Scope& scope, std::vector<Atom>& out) const {
    switch (t.kind) {
      case Kind::kF32:
        if (!t.rows_unknown) {
          out.push_back({expr, t.shape, weight});
        } else {
          out.push_back({"mean(" + expr + ")", {}, 1});
        }
        // A matrix is also a table whose rows the index variables look up.
        if (t.shape.size() == 2) {
          for (const ScopeVar& v : scope) {
            if (v.type.kind != Kind::kIndex || v.type.bound > t.shape[0] || v.type.shape.size() > 1) continue;
            if (v.type.shape.empty()) {
              out.push_back({"take(" + expr + ", reshape(" + v.name + ", shape=[1]))", {1, t.shape[1]}, weight + v.weight});
            } else {
              out.push_back({"take(" + expr + ", " + v.name + ")", {v.type.shape[0], t.shape[1]}, weight + v.weight});
            }
          }
        }
        break;
      case Kind::kIndex: out.push_back({"mul(cast(" + expr + ", dtype=f32), 0.2)", t.shape, 1}); break;
      case Kind::kStaticInt: out.push_back({"mul(cast(" + expr + ", dtype=f32), 0.3)", {}, 1}); break;
      case Kind::kTuple:
        for (size_t i = 0; i < t.fields.size(); ++i) AtomsOf(expr + "." + std::to_string(i), t.fields[i], weight, scope, out);
        break;
      case Kind::kAdt: break;
    }
  }

  std::string Reduce(const std::string& e, const Ints& axes, bool keepdims) {
    std::string out = PickOp({"sum", "mean", "max"}) + "(" + e;
    if (!axes.empty()) out += ", axes=" + IntsText(axes);
    if (keepdims) out += ", keepdims=true";
    return out + ")";
  }

  // `e` of shape `a` made into shape `s` by reshape, reductions,
  // expand_dims, slice, pad and broadcast_to.
  std::string Adapt(std::string e, Shape a, const Shape& s) {
    if (a == s) return e;
    if (NumElements(a) == NumElements(s) && Coin(0.6)) return Fn("reshape", {e, "shape=" + IntsText(s)});
    if (s.empty()) return Reduce(e, {}, false);
    while (a.size() > s.size()) {
      e = Reduce(e, {0}, false);
      a.erase(a.begin());
    }
    while (a.size() < s.size()) {
      e = Fn("expand_dims", {e, "axis=0"});
      a.insert(a.begin(), 1);
    }
    Ints axes, begins, ends;
    for (size_t i = 0; i < s.size(); ++i) {
      if (a[i] <= s[i]) continue;
      if (s[i] == 1) {
        e = Reduce(e, {static_cast<int64_t>(i)}, true);
      } else {
        int64_t b = Int(0, a[i] - s[i]);
        axes.push_back(static_cast<int64_t>(i));
        begins.push_back(b);
        ends.push_back(b + s[i]);
      }
      a[i] = s[i];
    }
    if (!axes.empty()) {
      e = Fn("slice", {e, "axes=" + IntsText(axes), "begins=" + IntsText(begins), "ends=" + IntsText(ends)});
    }
    Ints before(s.size(), 0), after(s.size(), 0);
    bool pad = false;
    for (size_t i = 0; i < s.size(); ++i) {
      if (a[i] < s[i] && a[i] != 1) {
        before[i] = Int(0, s[i] - a[i]);
        after[i] = s[i] - a[i] - before[i];
        a[i] = s[i];
        pad = true;
      }
    }
    if (pad) e = Fn("pad", {e, "before=" + IntsText(before), "after=" + IntsText(after)});
    if (a != s) e = Fn("broadcast_to", {e, "shape=" + IntsText(s)});
    return e;
  }

  std::string Leaf(const Shape& s, const Scope& scope) {
    std::vector<Atom> atoms;
    for (const ScopeVar& v : scope) AtomsOf(v.name, v.type, v.weight, scope, atoms);
    if (atoms.empty() || Coin(0.08)) return ConstF32(s);
    std::vector<int> weights;
    for (const Atom& a : atoms) weights.push_back(a.weight);
    const Atom& a = atoms[PickWeighted(weights)];
    return Adapt(a.expr, a.shape, s);
  }

  // `expr` (of shape `s`) combined with each variable of `vars` it does not
  // use yet: what was bound for a reason reaches the result.
  std::string EnsureUses(std::string expr, const Shape& s, const std::vector<ScopeVar>& vars, const Scope& scope) {
    for (const ScopeVar& v : vars) {
      if (CountWord(expr, v.name) > 0) continue;
      std::vector<Atom> atoms;
      AtomsOf(v.name, v.type, 1, scope, atoms);
      if (atoms.empty()) continue;
      Atom a = Pick(atoms);
      std::string op = PickOp({"add", "mul"});
      std::string adapted = Adapt(a.expr, a.shape, s);
      expr = Fn(op, {expr, adapted});
    }
    return expr;
  }

  // ---- expressions -------------------------------------------------------------
  std::string Gen(const RandomType& t, const Scope& scope, int depth, const Context& ctx) {
    switch (t.kind) {
      case Kind::kF32: return Tensor(t.shape, scope, depth, ctx);
      case Kind::kTuple: {
        std::vector<std::string> parts;
        for (const RandomType& f : t.fields) parts.push_back(Gen(f, scope, depth, ctx));
        return "(" + Join(parts) + (parts.size() == 1 ? ",)" : ")");
      }
      default: throw std::logic_error("random_program: no expressions of type " + TypeText(t));
    }
  }
  // A `{ let v: T = value; body }` block in which `body` uses `v`.
  std::string LetBlock(const std::string& v, const RandomType& t, const std::string& value, const Shape& s,
                       const Scope& scope, int depth, const Context& ctx) {
    Scope inner = scope;
    inner.push_back({v, t, 12});
    std::string body = Tensor(s, inner, depth - 1, ctx);
    body = EnsureUses(body, s, {{v, t, 1}}, inner);
    return "{ let " + v + ": " + TypeText(t) + " = " + value + "; " + body + " }";
  }

  std::string Tensor(const Shape& s, const Scope& scope, int depth, const Context& ctx);
  std::string StaticCond(const Scope& scope);
  std::string DynamicCond(const Scope& scope, int depth, const Context& ctx);
  std::string Loop(const Shape& s, const Scope& scope, int depth, const Context& ctx);
  std::string MatchAdt(const Shape& s, const Scope& scope, int depth, const Context& ctx, const ScopeVar& t);
  std::string FoldCall(const ScopeVar& t, const Scope& scope, const Context& ctx);

  // ---- program pieces ----------------------------------------------------------
  void MakeAdts();
  int AddAdt(RandomAdt adt) {
    program_.adts.push_back(std::move(adt));
    return static_cast<int>(program_.adts.size()) - 1;
  }
  RandomType FieldType() {
    if (vocabulary_ > 0 && Coin(0.3)) return Index({}, vocabulary_);
    if (Coin(0.12)) {
      Note("tuple_field");
      Shape a = RandomShape(1, 2, 4);
      Shape b = RandomShape(0, 1, 4);
      return Tuple({F32(a), F32(b)});
    }
    return F32(RandomShape(1, 2, 4));
  }
  std::string TypeDefs() const;
  std::string HelperDef(size_t i);
  std::string FoldDef(int k);
  std::string MapDef(int k);
  std::string MainDef();
  std::string LossDef();
  std::string Squash(const std::string& e) { return Fn(Coin(0.7) ? "tanh" : "sigmoid", {e}); }
  std::string WeightArgs() const {
    if (weights_as_tuple_) return "%p";
    std::vector<std::string> names;
    for (const ScopeVar& w : weights_) names.push_back(w.name);
    return Join(names);
  }
  RandomType WeightTuple() const {
    std::vector<RandomType> fields;
    for (const ScopeVar& w : weights_) fields.push_back(w.type);
    return Tuple(fields);
  }
  std::vector<std::string> WeightParams() const {
    if (weights_as_tuple_) return {"%p: " + TypeText(WeightTuple())};
    std::vector<std::string> out;
    for (const ScopeVar& w : weights_) out.push_back(w.name + ": " + TypeText(w.type));
    return out;
  }
  void AddWeightsTo(Scope& scope) const {
    if (weights_as_tuple_) {
      scope.push_back({"%p", WeightTuple(), 3});
    } else {
      for (const ScopeVar& w : weights_) scope.push_back(w);
    }
  }
  bool HasF32(const RandomType& t, std::vector<bool>& seen) const;

  Rng rng_;
  RandomProgramOptions options_;
  RandomProgram program_;
  int names_ = 0;
  int budget_ = 0;
  bool allow_dynamic_if_ = false;
  bool uses_seq_ = false;
  int64_t vocabulary_ = 0;           // rows of the embedding table, when word ids exist
  std::vector<int> roots_;           // each family's root ADT: one @main parameter each
  std::vector<FuncSig> helpers_;
  std::vector<FuncSig> folds_;     // one per ADT
  std::vector<bool> fold_has_acc_;   // list folds written as accumulating scans
  std::vector<ScopeVar> weights_;    // shared by @main and every fold
  bool weights_as_tuple_ = false;
  std::vector<std::string> param_names_;  // @main's, with '%'
  RandomType main_result_;
  bool use_maps_ = false;                 // @map_k rebuild each ADT; @main folds the rebuilt roots
  std::vector<std::string> extra_defs_;   // higher-order helpers, written on demand
};

// ---- types ------------------------------------------------------------------------

void Generator::MakeAdts() {
  if (Coin(0.4)) vocabulary_ = Int(3, 8);
  int families = static_cast<int>(Int(Coin(0.15) ? 0 : 1, options_.max_adts));
  for (int f = 0; f < families; ++f) {
    std::string k = std::to_string(f);
    int kind = static_cast<int>(Int(0, 4));
    if (kind == 2 && uses_seq_) kind = 1;
    int self = static_cast<int>(program_.adts.size());
    RandomAdt adt;
    switch (kind) {
      case 0: {  // a binary tree
        adt.type_def = adt.type_text = "Tree" + k;
        RandomCtor leaf{"Leaf" + k, {FieldType()}};
        if (Coin(0.3)) leaf.fields.push_back(FieldType());
        RandomCtor node{"Node" + k, {Adt(self), Adt(self)}};
        if (Coin(0.4)) {
          int64_t at = Int(0, 2);
          node.fields.insert(node.fields.begin() + at, FieldType());
        }
        adt.ctors = {leaf, node};
        roots_.push_back(AddAdt(adt));
        Note("adt:tree");
        break;
      }
      case 1: {  // a list
        adt.type_def = adt.type_text = "List" + k;
        RandomCtor cons{"Cons" + k, {FieldType()}};
        if (Coin(0.3)) cons.fields.push_back(FieldType());
        cons.fields.push_back(Adt(self));
        adt.ctors = {{"Nil" + k, {}}, cons};
        roots_.push_back(AddAdt(adt));
        Note("adt:list");
        break;
      }
      case 2: {  // the generic Seq[A]
        uses_seq_ = true;
        RandomType elem = F32(RandomShape(1, 2, 4));
        adt.type_def = "Seq";
        adt.type_text = "Seq[" + TypeText(elem) + "]";
        adt.ctors = {{"End", {}}, {"More", {elem, Adt(self)}}};
        roots_.push_back(AddAdt(adt));
        Note("adt:generic");
        break;
      }
      case 3: {  // three constructors, with one and two children
        adt.type_def = adt.type_text = "Tri" + k;
        RandomType tip = FieldType();
        RandomType one = FieldType();
        adt.ctors = {{"Tip" + k, {tip}}, {"One" + k, {Adt(self), one}}, {"Two" + k, {Adt(self), Adt(self)}}};
        roots_.push_back(AddAdt(adt));
        Note("adt:tri");
        break;
      }
      default: {  // a rose tree and its forest: mutually recursive types and folds
        RandomAdt forest;
        adt.type_def = adt.type_text = "Rose" + k;
        adt.ctors = {{"Rose" + k + "N", {FieldType(), Adt(self + 1)}}};
        forest.type_def = forest.type_text = "Forest" + k;
        forest.ctors = {{"FNil" + k, {}}, {"FCons" + k, {Adt(self), Adt(self + 1)}}};
        roots_.push_back(AddAdt(adt));
        AddAdt(forest);
        Note("adt:rose");
        break;
      }
    }
  }
  bool word_ids = false;
  for (const RandomAdt& a : program_.adts) {
    for (const RandomCtor& c : a.ctors) {
      for (const RandomType& t : c.fields) word_ids |= t.kind == Kind::kIndex;
    }
  }
  if (!word_ids && Coin(0.5)) vocabulary_ = 0;  // keep the table for %ids, sometimes
}

std::string Generator::TypeDefs() const {
  std::string out;
  if (uses_seq_) out += "type Seq[A] { End, More(A, Seq[A]) }\n\n";
  out += "type Maybe[A] { Nothing, Just(A) }\n\n";
  for (const RandomAdt& a : program_.adts) {
    if (a.type_def == "Seq") continue;
    std::vector<std::string> ctors;
    for (const RandomCtor& c : a.ctors) {
      std::vector<std::string> fields;
      for (const RandomType& f : c.fields) fields.push_back(TypeText(f));
      ctors.push_back("  " + c.name + (fields.empty() ? "" : "(" + Join(fields) + ")") + ",\n");
    }
    out += "type " + a.type_def + " {\n" + Join(ctors, "") + "}\n\n";
  }
  return out;
}

bool Generator::HasF32(const RandomType& t, std::vector<bool>& seen) const {
  switch (t.kind) {
    case Kind::kF32: return true;
    case Kind::kTuple:
      for (const RandomType& f : t.fields) {
        if (HasF32(f, seen)) return true;
      }
      return false;
    case Kind::kAdt:
      if (seen[t.adt]) return false;
      seen[t.adt] = true;
      for (const RandomCtor& c : program_.adts[t.adt].ctors) {
        for (const RandomType& f : c.fields) {
          if (HasF32(f, seen)) return true;
        }
      }
      return false;
    default: return false;
  }
}

// ---- expressions --------------------------------------------------------------------

std::string Generator::StaticCond(const Scope& scope) {
  std::vector<ScopeVar> ints;
  for (const ScopeVar& v : scope) {
    if (v.type.kind == Kind::kStaticInt) ints.push_back(v);
  }
  if (!ints.empty() && Coin(0.7)) {
    ScopeVar v = Pick(ints);
    Note(v.name == "%k" ? "static_if:argument" : "static_if:depth");
    std::string op = PickOp({"less", "greater", "equal"});
    return Fn(op, {v.name, std::to_string(Int(0, 2))});
  }
  Note("static_if:constant");
  if (Coin(0.5)) {
    std::string op = PickOp({"less", "greater"});
    return Fn(op, {std::to_string(Int(0, 3)), std::to_string(Int(0, 3))});
  }
  Shape s = {Int(2, 4)};
  return Fn("greater", {Fn("sum", {ConstF32(s)}), "0f32"});
}

std::string Generator::DynamicCond(const Scope& scope, int depth, const Context& ctx) {
  Shape p = RandomShape(0, 2, 4);
  std::string x = Tensor(p, scope, depth - 1, ctx);
  if (!p.empty()) x = Fn(PickOp({"sum", "mean", "max"}), {x});
  std::string op = PickOp({"greater", "less"});
  return Fn(op, {x, Float(rng_.NextUniform() * 0.4 - 0.2)});
}

// A match on an ADT variable in scope: a clause per constructor (the last
// one sometimes a wildcard); the matched constructor's fields come into
// scope, its subterms ready to be recursed on.
std::string Generator::MatchAdt(const Shape& s, const Scope& scope, int depth, const Context& ctx, const ScopeVar& t) {
  Note("match_adt");
  const RandomAdt& adt = program_.adts[t.type.adt];
  std::vector<std::string> clauses;
  bool wildcard_last = adt.ctors.size() > 1 && Coin(0.3);
  for (size_t c = 0; c < adt.ctors.size(); ++c) {
    const RandomCtor& ctor = adt.ctors[c];
    if (wildcard_last && c + 1 == adt.ctors.size()) {
      Note("wildcard");
      clauses.push_back("_ => " + Tensor(s, scope, depth - 1, ctx));
      break;
    }
    Scope inner = scope;
    std::vector<std::string> fields;
    for (const RandomType& f : ctor.fields) {
      if (Coin(0.15)) {
        fields.push_back("_");
        continue;
      }
      std::string v = Fresh("f");
      fields.push_back(v);
      inner.push_back({v, f, 6});
    }
    std::string pattern = ctor.name + (fields.empty() ? "" : "(" + Join(fields) + ")");
    clauses.push_back(pattern + " => " + Tensor(s, inner, depth - 1, ctx));
  }
  return "match (" + t.name + ") { " + Join(clauses) + " }";
}

std::string Generator::FoldCall(const ScopeVar& t, const Scope& scope, const Context& ctx) {
  const FuncSig& f = folds_[t.type.adt];
  std::string call = f.name + "(" + t.name + ", " + WeightArgs() + ", " + ctx.depth;
  if (fold_has_acc_[t.type.adt]) call += ", " + Gen(f.ret, scope, 2, ctx);
  return call + ")";
}

std::string Generator::Tensor(const Shape& s, const Scope& scope, int depth, const Context& ctx) {
  if (depth <= 0 || budget_ <= 0) return Leaf(s, scope);
  --budget_;
  const int r = static_cast<int>(s.size());
  // An input of shape `shape`, from `sc` (default: this scope).
  auto X = [&](const Shape& shape, const Scope* sc = nullptr) { return Tensor(shape, sc ? *sc : scope, depth - 1, ctx); };
  std::vector<ScopeVar> adt_vars;
  for (const ScopeVar& v : scope) {
    if (v.type.kind == Kind::kAdt && v.name != ctx.own_adt_param) adt_vars.push_back(v);
  }
  std::vector<int> axes_ge2, axes_eq1, axes_23;
  for (int i = 0; i < r; ++i) {
    if (s[i] >= 2) axes_ge2.push_back(i);
    if (s[i] == 1) axes_eq1.push_back(i);
    if (s[i] == 2 || s[i] == 3) axes_23.push_back(i);
  }

  enum P {
    kLeaf, kUnary, kGuarded, kBinary, kWhere, kMatmul, kDense, kReduce, kSoftmax, kReshape, kTranspose, kConcat,
    kSlice, kChunk, kSplit, kStack, kPad, kExpand, kSqueeze, kBroadcast, kTake, kScatter, kOneHot, kCrossEntropy,
    kArgmax, kCast64, kLet, kTuple, kStaticIf, kDynamicIf, kMatchLocal, kMatchAdt, kHelper, kFold, kClosure,
    kGather, kLayerNorm, kDropout, kIntegerDivision, kCreate, kCount
  };
  std::vector<int> w(kCount, 0);
  w[kLeaf] = 6;
  w[kUnary] = 10;
  w[kGuarded] = 5;
  w[kBinary] = 14;
  w[kWhere] = 2;
  w[kMatmul] = r == 2 || r == 3 ? 6 : 0;
  w[kDense] = r == 2 ? 4 : 0;
  w[kReduce] = r < 3 ? 5 : 0;
  w[kSoftmax] = r >= 1 ? 2 : 0;
  w[kReshape] = NumElements(s) > 1 ? 2 : 0;
  w[kTranspose] = r >= 2 ? 2 : 0;
  w[kConcat] = axes_ge2.empty() ? 0 : 2;
  w[kSlice] = r >= 1 ? 2 : 0;
  w[kChunk] = r >= 1 ? 2 : 0;
  w[kSplit] = r >= 1 ? 1 : 0;
  w[kStack] = axes_23.empty() ? 0 : 1;
  w[kPad] = axes_ge2.empty() ? 0 : 1;
  w[kExpand] = axes_eq1.empty() ? 0 : 1;
  w[kSqueeze] = r < 3 ? 1 : 0;
  w[kBroadcast] = NumElements(s) > 1 ? 1 : 0;
  w[kTake] = r >= 1 ? 1 : 0;
  w[kScatter] = r >= 1 ? 1 : 0;
  w[kOneHot] = r >= 1 && s.back() <= 6 ? 1 : 0;
  w[kCrossEntropy] = r == 0 ? 2 : 0;
  w[kArgmax] = 1;
  w[kCast64] = 1;
  w[kLet] = 6;
  w[kTuple] = 3;
  w[kStaticIf] = 3;
  w[kDynamicIf] = allow_dynamic_if_ ? 2 : 0;
  w[kMatchLocal] = 2;
  w[kMatchAdt] = adt_vars.empty() ? 0 : 3;
  w[kHelper] = ctx.helpers_callable > 0 ? 3 : 0;
  w[kFold] = ctx.folds_callable && !adt_vars.empty() ? 3 : 0;
  w[kClosure] = 1;
  w[kGather] = r >= 1 ? 1 : 0;
  w[kLayerNorm] = r >= 1 && s.back() >= 2 ? 1 : 0;
  w[kDropout] = NumElements(s) > 1 ? 1 : 0;
  w[kIntegerDivision] = 1;
  w[kCreate] = 1;

  switch (static_cast<P>(PickWeighted(w))) {
    case kLeaf: return Leaf(s, scope);
    case kUnary: {
      std::string op = PickOp({"neg", "abs", "tanh", "sigmoid", "relu", "copy", "zeros_like", "ones_like", "clip"});
      if (op == "clip") return Fn(op, {X(s), "min=-0.5", "max=0.5"});
      return Fn(op, {X(s)});
    }
    case kGuarded: {
      switch (Int(0, 6)) {
        case 0: return Fn("exp", {Fn("tanh", {X(s)})});
        case 1: return Fn("log", {Fn("add", {Fn("sigmoid", {X(s)}), "0.5"})});
        case 2: {
          std::string exponent = Coin(0.5) ? "exponent=2.0" : "exponent=3.0";
          return Fn("pow", {Fn("tanh", {X(s)}), exponent});
        }
        case 3: return Fn("pow", {Fn("sigmoid", {X(s)}), "exponent=1.5"});
        case 4: {
          Shape p = Partner(s);
          return Fn("div", {X(s), Fn("add", {Fn("sigmoid", {X(p)}), "0.5"})});
        }
        default: {
          // x / (y*y + 1) or sqrt(y*y + 1), with y let-bound and used twice.
          Note("let_shared");
          std::string y = Fresh("v");
          bool div = Coin(0.5);
          Shape ys = div ? Partner(s) : s;
          std::string value = X(ys);
          std::string sq = Fn("add", {Fn("mul", {y, y}), "1f32"});
          std::string body = div ? Fn("div", {X(s), sq}) : Fn("sqrt", {sq});
          return "{ let " + y + ": " + TensorText(ys) + " = " + value + "; " + body + " }";
        }
      }
    }
    case kBinary: {
      std::string op = PickOp({"add", "sub", "mul", "maximum", "minimum"});
      if (r >= 1 && Coin(0.2)) {
        // Both sides broadcast: (m, 1) with (1, n) and the like.
        Note("broadcast_both");
        Shape a = s, b = s;
        for (int i = 0; i < r; ++i) {
          if (Coin(0.5)) {
            a[i] = 1;
          } else {
            b[i] = 1;
          }
        }
        return Fn(op, {X(a), X(b)});
      }
      Shape p = Partner(s);
      if (Coin(0.5)) return Fn(op, {X(s), X(p)});
      return Fn(op, {X(p), X(s)});
    }
    case kWhere: {
      std::string cmp = PickOp({"greater", "less", "greater_equal", "less_equal", "not_equal"});
      Shape c1 = Partner(s);
      Shape c2 = Partner(s);
      Shape p = Partner(s);
      // The two sides a margin apart: a program can make them equal by
      // construction (a broadcast value beside its mean), and a tie is
      // decided by rounding, which tiers do not share (random program 6879
      // of 10,000 once the generator wrote gather, layer_norm and dropout).
      auto apart = [](std::string b) { return Fn("add", {std::move(b), "0.01"}); };
      std::string cond = Fn(cmp, {X(c1), apart(X(c2))});
      if (Coin(0.3)) {  // conditions combined (one draw after another: argument order is unspecified)
        if (Coin(0.3)) {
          cond = Fn("logical_not", {cond});
        } else {
          std::string logical = PickOp({"logical_and", "logical_or"}), other_cmp = PickOp({"greater", "less"});
          std::string a = X(Partner(s));
          std::string b = X(Partner(s));
          cond = Fn(logical, {cond, Fn(other_cmp, {a, apart(b)})});
        }
      }
      if (Coin(0.5)) return Fn("where", {cond, X(s), X(p)});
      return Fn("where", {cond, X(p), X(s)});
    }
    case kMatmul: {
      int64_t k = Int(1, 5);
      bool ta = Coin(0.3);
      bool tb = Coin(0.3);
      Shape a(s.begin(), s.end() - 2), b = a;
      int64_t m = s[r - 2], n = s[r - 1];
      a.insert(a.end(), {ta ? k : m, ta ? m : k});
      b.insert(b.end(), {tb ? n : k, tb ? k : n});
      std::string lhs = X(a);
      std::string rhs = X(b);
      if (ta && tb) return Fn("matmul", {lhs, rhs, "transpose_a=true", "transpose_b=true"});
      if (ta) return Fn("matmul", {lhs, rhs, "transpose_a=true"});
      if (tb) return Fn("matmul", {lhs, rhs, "transpose_b=true"});
      return Fn("matmul", {lhs, rhs});
    }
    case kDense: {
      int64_t k = Int(1, 5);
      return Fn("dense", {X({s[0], k}), X({s[1], k}), X({s[1]})});
    }
    case kReduce: {
      std::string op = PickOp({"sum", "mean", "max", "min", "logsumexp", "norm"});
      Shape in = s;
      Ints axes;
      bool keep = !axes_eq1.empty() && Coin(0.3);
      if (keep) {
        int a = Pick(axes_eq1);
        in[a] = Int(2, 4);
        axes.push_back(Coin(0.3) ? a - r : a);
      } else {
        int at = static_cast<int>(Int(0, r));
        in.insert(in.begin() + at, Int(2, 4));
        axes.push_back(at);
        if (r == 0 && Coin(0.3)) {
          in.push_back(Int(2, 3));
          axes.push_back(1);
        }
      }
      std::string x = X(in);
      if (keep) return Fn(op, {x, "axes=" + IntsText(axes), "keepdims=true"});
      return Fn(op, {x, "axes=" + IntsText(axes)});
    }
    case kSoftmax: {
      std::string op = PickOp({"softmax", "log_softmax"});
      int64_t axis = Int(-r, r - 1);
      return Fn(op, {X(s), "axis=" + std::to_string(axis)});
    }
    case kReshape: {
      // Another factorization of the same number of elements.
      int64_t n = NumElements(s);
      Shape p;
      for (int64_t left = n; left > 1;) {
        std::vector<int64_t> divisors;
        for (int64_t d = 2; d <= left; ++d) {
          if (left % d == 0) divisors.push_back(d);
        }
        int64_t d = Pick(divisors);
        p.push_back(d);
        left /= d;
      }
      if (p.size() > 3) p = {n};
      if (Coin(0.3)) {
        int64_t at = Int(0, static_cast<int64_t>(p.size()));
        p.insert(p.begin() + at, 1);
      }
      return Fn("reshape", {X(p), "shape=" + IntsText(s)});
    }
    case kTranspose: {
      Ints perm(r);
      std::iota(perm.begin(), perm.end(), 0);
      for (int i = r - 1; i > 0; --i) std::swap(perm[i], perm[Int(0, i)]);
      Shape in(r);
      for (int i = 0; i < r; ++i) in[perm[i]] = s[i];
      bool reverse = true;
      for (int i = 0; i < r; ++i) reverse &= perm[i] == r - 1 - i;
      bool implicit = reverse && Coin(0.5);
      std::string x = X(in);
      if (implicit) return Fn("transpose", {x});
      return Fn("transpose", {x, "perm=" + IntsText(perm)});
    }
    case kConcat: {
      int a = Pick(axes_ge2);
      std::vector<std::string> parts;
      for (int64_t left = s[a]; left > 0;) {
        int64_t n = parts.size() < 2 && left > 1 ? Int(1, left - 1) : left;
        Shape p = s;
        p[a] = n;
        parts.push_back(X(p));
        left -= n;
      }
      return "concat(" + Join(parts) + ", axis=" + std::to_string(a) + ")";
    }
    case kSlice: {
      int64_t a = Int(0, r - 1);
      int64_t extra = Int(1, 3);
      int64_t b = Int(0, extra);
      Shape in = s;
      in[a] += extra;
      return Fn("slice", {X(in), "axes=[" + std::to_string(a) + "]", "begins=[" + std::to_string(b) + "]",
                          "ends=[" + std::to_string(b + s[a]) + "]"});
    }
    case kChunk: {
      int64_t a = Int(0, r - 1);
      int64_t chunks = Int(2, 3);
      Shape in = s;
      in[a] *= chunks;
      std::string call = Fn("chunk", {X(in), "chunks=" + std::to_string(chunks), "axis=" + std::to_string(a)});
      if (Coin(0.5)) {
        Note("proj");
        return call + "." + std::to_string(Int(0, chunks - 1));
      }
      // Two pieces of one chunk: a multi-output operator, let-bound and used twice.
      Note("let_shared");
      std::string v = Fresh("c");
      std::string op = PickOp({"mul", "sub"});
      std::string i = std::to_string(Int(0, chunks - 1));
      std::string j = std::to_string(Int(0, chunks - 1));
      std::vector<RandomType> pieces(chunks, F32(s));
      return "{ let " + v + ": " + TypeText(Tuple(pieces)) + " = " + call + "; " + Fn(op, {v + "." + i, v + "." + j}) + " }";
    }
    case kSplit: {
      int64_t a = Int(0, r - 1);
      int pieces = static_cast<int>(Int(2, 3));
      int which = static_cast<int>(Int(0, pieces - 1));
      Ints sizes;
      Shape in = s;
      for (int i = 0; i < pieces; ++i) {
        int64_t n = i == which ? s[a] : Int(1, 3);
        sizes.push_back(n);
        if (i != which) in[a] += n;
      }
      Note("proj");
      return Fn("split", {X(in), "axis=" + std::to_string(a), "sizes=" + IntsText(sizes)}) + "." + std::to_string(which);
    }
    case kStack: {
      int a = Pick(axes_23);
      Shape in = s;
      in.erase(in.begin() + a);
      std::vector<std::string> parts;
      for (int64_t i = 0; i < s[a]; ++i) parts.push_back(X(in));
      return "stack(" + Join(parts) + ", axis=" + std::to_string(a) + ")";
    }
    case kPad: {
      int a = Pick(axes_ge2);
      int64_t total = Int(1, s[a] - 1);
      Ints before(r, 0), after(r, 0);
      before[a] = Int(0, total);
      after[a] = total - before[a];
      Shape in = s;
      in[a] -= total;
      return Fn("pad", {X(in), "before=" + IntsText(before), "after=" + IntsText(after)});
    }
    case kExpand: {
      int a = Pick(axes_eq1);
      Shape in = s;
      in.erase(in.begin() + a);
      return Fn("expand_dims", {X(in), "axis=" + std::to_string(a)});
    }
    case kSqueeze: {
      int64_t a = Int(0, r);
      Shape in = s;
      in.insert(in.begin() + a, 1);
      return Fn("squeeze", {X(in), "axes=[" + std::to_string(a) + "]"});
    }
    case kBroadcast: {
      Shape p = Partner(s);
      if (p == s) p[Int(0, r - 1)] = 1;
      return Fn("broadcast_to", {X(p), "shape=" + IntsText(s)});
    }
    case kTake: {
      int64_t rows = Int(2, 5);
      Shape table = s;
      table[0] = rows;
      return Fn("take", {X(table), ConstIndices({s[0]}, rows)});
    }
    case kScatter: {
      int64_t n = Int(1, 5);
      Shape values = s;
      values[0] = n;
      return Fn("scatter_add", {X(values), ConstIndices({n}, s[0]), "rows=" + std::to_string(s[0])});
    }
    case kOneHot: {
      Shape ids(s.begin(), s.end() - 1);
      return Fn("mul", {Fn("one_hot", {ConstIndices(ids, s.back()), "depth=" + std::to_string(s.back())}), X(s)});
    }
    case kCrossEntropy: {
      int64_t n = Int(1, 4);
      int64_t classes = Int(2, 5);
      std::string labels = ConstIndices({n}, classes);
      if (Coin(0.5)) return Fn("cross_entropy", {X({n, classes}), labels});
      return Fn("nll", {Fn("log_softmax", {X({n, classes})}), labels});
    }
    case kArgmax: {
      int64_t at = Int(0, r);
      Shape in = s;
      in.insert(in.begin() + at, Int(2, 4));
      std::string arg = PickOp({"argmax", "argmin"});
      // A ramp of 0.01 along the axis breaks the ties the program's structure
      // makes (padded zeros, broadcasts, (x + c) - x): two tiers may round
      // such equal values apart, and the index of a tie is then either
      // answer (random program 5789 of 10,000 was one).
      Shape ramp_shape(in.size(), 1);
      ramp_shape[at] = in[at];
      std::vector<std::string> ramp;
      for (int64_t i = 0; i < in[at]; ++i) ramp.push_back(std::to_string(0.01 * static_cast<double>(i)));
      std::string separated = Fn("add", {X(in), "tensor(f32, " + ShapeText(ramp_shape) + ", [" + Join(ramp) + "])"});
      return Fn("mul", {Fn("cast", {Fn(arg, {separated, "axis=" + std::to_string(at)}), "dtype=f32"}), "0.25"});
    }
    case kGather: {
      // Along any axis, counted from either end: x's rows of that axis at
      // constant indices (repeats included: gradients add up).
      const int axis = static_cast<int>(Int(0, r - 1));
      const int64_t size = Int(2, 5);
      Shape x = s;
      x[axis] = size;
      const int64_t written = Coin(0.5) ? axis : axis - r;
      return Fn("gather", {X(x), ConstIndices({s[axis]}, size), "axis=" + std::to_string(written)});
    }
    case kLayerNorm: {
      // eps 0.1: a row the program made constant has a variance of 0.
      Shape last = {s.back()};
      return Fn("layer_norm", {X(s), X(last), X(last), "eps=0.1"});
    }
    case kDropout:
      // The key a constant, as a training step's would be an argument: every
      // tier draws the mask from the key and the element's index.
      return Fn("dropout", {X(s), std::to_string(Int(0, 1000)), "rate=" + std::string(Coin(0.5) ? "0.25" : "0.5")});
    case kIntegerDivision: {
      // Python's // and % on integers (exact in every tier), negative ones
      // and divisors included, scaling an f32 value by at most 1 (larger
      // values make cancellations whose rounding the tiers do not share).
      std::vector<std::string> data;
      for (int64_t i = 0; i < NumElements(s); ++i) data.push_back(std::to_string(Int(-7, 7)));
      std::string n = "tensor(i64, " + ShapeText(s) + ", [" + Join(data) + "])";
      std::string divisor = std::to_string(Coin(0.5) ? Int(2, 4) : -Int(2, 4));
      std::string q = Fn(PickOp({"floor_div", "mod"}), {n, divisor});
      return Fn("mul", {X(s), Fn("mul", {Fn("cast", {q, "dtype=f32"}), "0.25"})});
    }
    case kCreate:  // x + 0 or x * 1: values keep their size
      if (Coin(0.5)) return Fn("add", {X(s), Fn("zeros", {"shape=" + IntsText(s)})});
      return Fn("mul", {X(s), Fn("ones", {"shape=" + IntsText(s)})});
    case kCast64: {
      Note("f64");
      std::string x = Fn("cast", {X(s), "dtype=f64"});
      if (Coin(0.5)) return Fn("cast", {Fn("tanh", {x}), "dtype=f32"});
      Shape p = Partner(s);
      return Fn("cast", {Fn("mul", {x, Fn("cast", {X(p), "dtype=f64"})}), "dtype=f32"});
    }
    case kLet: {
      // A value bound once and used at least twice.
      Note("let_shared");
      Shape p = Coin(0.5) ? s : RandomShape(0, 2, 4);
      std::string v = Fresh("v");
      std::string value = X(p);
      Scope inner = scope;
      inner.push_back({v, F32(p), 12});
      std::string body = X(s, &inner);
      for (int uses = CountWord(body, v); uses < 2; ++uses) {
        std::string op = PickOp({"add", "mul"});
        std::string adapted = Adapt(v, p, s);
        body = Fn(op, {body, adapted});
      }
      return "{ let " + v + ": " + TensorText(p) + " = " + value + "; " + body + " }";
    }
    case kTuple: {
      Note("tuple");
      Note("proj");
      Shape a = Coin(0.5) ? s : RandomShape(0, 2, 4);
      Shape b = RandomShape(0, 2, 4);
      RandomType t = Tuple({F32(a), F32(b)});
      if (a == s && Coin(0.3)) return "(" + Gen(t, scope, depth - 1, ctx) + ").0";  // static projection
      std::string v = Fresh("t");
      std::string value = Gen(t, scope, depth - 1, ctx);
      return LetBlock(v, t, value, s, scope, depth, ctx);
    }
    case kStaticIf: {
      std::string cond = StaticCond(scope);
      std::string then = X(s);
      return "if (" + cond + ") { " + then + " } else { " + X(s) + " }";
    }
    case kDynamicIf: {
      if (Coin(0.3)) return Loop(s, scope, depth, ctx);
      Note("dynamic_if");
      std::string cond = DynamicCond(scope, depth, ctx);
      if (Coin(0.3)) {
        // Both branches give a pair; the result is projected.
        Note("dynamic_if:tuple");
        Shape b = RandomShape(0, 2, 3);
        RandomType t = Tuple({F32(s), F32(b)});
        std::string v = Fresh("t");
        std::string then = Gen(t, scope, depth - 1, ctx);
        std::string value = "if (" + cond + ") { " + then + " } else { " + Gen(t, scope, depth - 1, ctx) + " }";
        return LetBlock(v, t, value, s, scope, depth, ctx);
      }
      std::string then = X(s);
      return "if (" + cond + ") { " + then + " } else { " + X(s) + " }";
    }
    case kMatchLocal: {
      Note("match_local");
      if (Coin(0.5)) {
        // Maybe[T] from a static if: the match is decided at specialization.
        Note("match_local:maybe");
        Shape p = Coin(0.5) ? s : RandomShape(0, 2, 4);
        std::string m = Fresh("m");
        std::string y = Fresh("y");
        std::string cond = StaticCond(scope);
        std::string value = "if (" + cond + ") { Just(" + X(p) + ") } else { Nothing }";
        Scope inner = scope;
        inner.push_back({y, F32(p), 12});
        std::string just = X(s, &inner);
        just = EnsureUses(just, s, {{y, F32(p), 1}}, inner);
        return "{ let " + m + ": Maybe[" + TensorText(p) + "] = " + value + "; match (" + m + ") { Just(" + y +
               ") => " + just + ", Nothing => " + X(s) + " } }";
      }
      // A tuple pattern.
      Note("match_local:tuple");
      Shape pa = RandomShape(0, 2, 4);
      Shape pb = RandomShape(0, 2, 4);
      RandomType t = Tuple({F32(pa), F32(pb)});
      std::string a = Fresh("a"), b = Fresh("b");
      std::string value = Gen(t, scope, depth - 1, ctx);
      if (allow_dynamic_if_ && Coin(0.7)) {
        // The pair comes from a dynamic if: the pattern takes a residual tuple apart.
        Note("match_local:dynamic_tuple");
        std::string cond = DynamicCond(scope, depth, ctx);
        value = "if (" + cond + ") { " + value + " } else { " + Gen(t, scope, depth - 1, ctx) + " }";
      }
      Scope inner = scope;
      inner.push_back({a, t.fields[0], 12});
      inner.push_back({b, t.fields[1], 12});
      std::string body = X(s, &inner);
      body = EnsureUses(body, s, {{a, t.fields[0], 1}, {b, t.fields[1], 1}}, inner);
      return "match (" + value + ") { (" + a + ", " + b + ") => " + body + " }";
    }
    case kMatchAdt: {
      ScopeVar t = Pick(adt_vars);
      return MatchAdt(s, scope, depth, ctx, t);
    }
    case kHelper: {
      Note("helper_call");
      const FuncSig& h = helpers_[Int(0, ctx.helpers_callable - 1)];
      std::vector<std::string> args;
      for (const RandomType& p : h.params) args.push_back(Gen(p, scope, depth - 1, ctx));
      std::string v = Fresh("h");
      if (Coin(0.25)) {
        // The helper as a value, called through a variable.
        Note("global_value");
        std::vector<std::string> types;
        for (const RandomType& p : h.params) types.push_back(TypeText(p));
        std::string g = Fresh("g");
        std::string call = LetBlock(v, h.ret, g + "(" + Join(args) + ")", s, scope, depth, ctx);
        return "{ let " + g + ": fn(" + Join(types) + ") -> " + TypeText(h.ret) + " = " + h.name + "; " + call + " }";
      }
      return LetBlock(v, h.ret, h.name + "(" + Join(args) + ")", s, scope, depth, ctx);
    }
    case kFold: {
      Note("fold_call");
      ScopeVar t = Pick(adt_vars);
      std::string call = FoldCall(t, scope, ctx);
      std::string v = Fresh("r");
      return LetBlock(v, folds_[t.type.adt].ret, call, s, scope, depth, ctx);
    }
    case kClosure: {
      // A closure capturing the scope, called twice.
      Note("closure");
      Shape p = Coin(0.5) ? s : RandomShape(0, 2, 3);
      std::string f = Fresh("fn"), y = Fresh("y");
      Scope inner = scope;
      inner.push_back({y, F32(p), 12});
      std::string body = X(s, &inner);
      body = EnsureUses(body, s, {{y, F32(p), 1}}, inner);
      std::string sig = "(" + TensorText(p) + ") -> " + TensorText(s);
      std::string lambda = "fn (" + y + ": " + TensorText(p) + ") -> " + TensorText(s) + " { " + body + " }";
      if (Coin(0.15)) {
        // One of two closures, chosen by the data: every call of it runs
        // under the same condition.
        Note("closure:dynamic_if");
        std::string cond = DynamicCond(scope, depth, ctx);
        std::string other = EnsureUses(X(s, &inner), s, {{y, F32(p), 1}}, inner);
        lambda = "if (" + cond + ") { " + lambda + " } else { fn (" + y + ": " + TensorText(p) + ") -> " + TensorText(s) +
                 " { " + other + " } }";
      }
      std::string op = PickOp({"add", "mul"});
      std::string a = X(p);
      std::string b = X(p);
      if (Coin(0.4)) {
        // Passed to a higher-order function that calls it twice.
        Note("higher_order");
        std::string name = "@twice" + std::to_string(extra_defs_.size());
        extra_defs_.push_back("def " + name + "(%f: fn" + sig + ", %a: " + TensorText(p) + ", %b: " + TensorText(p) +
                              ") -> " + TensorText(s) + " {\n  " + Fn(op, {"%f(%a)", "%f(%b)"}) + "\n}\n\n");
        return "{ let " + f + ": fn" + sig + " = " + lambda + "; " + name + "(" + f + ", " + a + ", " + b + ") }";
      }
      return "{ let " + f + ": fn" + sig + " = " + lambda + "; " + Fn(op, {f + "(" + a + ")", f + "(" + b + ")"}) + " }";
    }
    case kCount: break;
  }
  return Leaf(s, scope);
}

// A loop the data ends: @loopK steps its state until a reduction of it
// falls below a threshold, at most `n` times (a literal count, which partial
// evaluation does not unroll: the loop stays a residual function). In some,
// the recursive call is not in tail position: its result is used after it.
std::string Generator::Loop(const Shape& s, const Scope& scope, int depth, const Context& ctx) {
  Note("data_ended_loop");
  const std::string type = TensorText(s);
  Scope state = {{"%s", F32(s), 6}};
  const int budget = budget_;
  budget_ = 3;
  std::string step = Squash(EnsureUses(Tensor(s, state, 2, Context()), s, state, state));
  budget_ = budget;
  const std::string name = "@loop" + std::to_string(extra_defs_.size());  // after those the step defined
  std::string again = name + "(" + step + ", sub(%n, 1))";
  if (Coin(0.4)) {
    Note("data_ended_loop:nested");
    again = Squash(Fn("add", {again, "%s"}));
  }
  std::string measure = Fn(PickOp({"mean", "max", "sum"}), {"%s"});
  extra_defs_.push_back("def " + name + "(%s: " + type + ", %n: Tensor[(), i64]) -> " + type + " {\n  if (logical_or(less(" +
                        measure + ", " + Float(rng_.NextUniform() * 0.6 - 0.3) + "), less_equal(%n, 0))) { %s } else { " +
                        again + " }\n}\n\n");
  return name + "(" + Tensor(s, scope, depth - 1, ctx) + ", " + std::to_string(Int(1, 6)) + ")";
}

// ---- definitions --------------------------------------------------------------------

std::string Generator::HelperDef(size_t i) {
  const FuncSig& h = helpers_[i];
  Scope scope;
  std::vector<std::string> params;
  for (size_t j = 0; j < h.params.size(); ++j) {
    std::string v = "%x" + std::to_string(j);
    params.push_back(v + ": " + TypeText(h.params[j]));
    scope.push_back({v, h.params[j], 6});
  }
  Context ctx;
  ctx.helpers_callable = static_cast<int>(i);
  budget_ = options_.body_budget;
  std::string body;
  if (h.ret.kind == Kind::kTuple) {
    std::vector<std::string> parts;
    for (const RandomType& f : h.ret.fields) parts.push_back(Tensor(f.shape, scope, options_.max_depth, ctx));
    parts[0] = EnsureUses(parts[0], h.ret.fields[0].shape, scope, scope);
    body = "(" + Join(parts) + ")";
  } else {
    body = Tensor(h.ret.shape, scope, options_.max_depth, ctx);
    body = EnsureUses(body, h.ret.shape, scope, scope);
  }
  return "def " + h.name + "(" + Join(params) + ") -> " + TypeText(h.ret) + " {\n  " + body + "\n}\n\n";
}

// @fold_k(%t, W, %d[, %acc]): a clause per constructor that recurses on the
// constructor's ADT fields and combines their results with its other fields,
// the weights and the depth, squashed by tanh or sigmoid.
std::string Generator::FoldDef(int k) {
  const FuncSig& f = folds_[k];
  const RandomAdt& adt = program_.adts[k];
  const bool acc = fold_has_acc_[k];
  Note("recursion");
  Scope base;
  AddWeightsTo(base);
  base.push_back({"%d", StaticInt(100), 2});
  Context ctx;
  ctx.helpers_callable = static_cast<int>(helpers_.size());
  ctx.folds_callable = true;
  ctx.depth = "add(%d, 1)";
  ctx.own_adt_param = "%t";
  // The result, from a scope in which the variables `must` are bound.
  auto result = [&](const Scope& scope, const std::vector<ScopeVar>& must) {
    budget_ = options_.body_budget;
    if (f.ret.kind == Kind::kTuple) {
      std::vector<std::string> parts;
      for (size_t i = 0; i < f.ret.fields.size(); ++i) {
        const Shape& s = f.ret.fields[i].shape;
        std::string e = Tensor(s, scope, options_.max_depth, ctx);
        if (i == 0) e = EnsureUses(e, s, must, scope);
        parts.push_back(Squash(e));
      }
      return "(" + Join(parts) + ")";
    }
    std::string e = Tensor(f.ret.shape, scope, options_.max_depth, ctx);
    return Squash(EnsureUses(e, f.ret.shape, must, scope));
  };

  std::vector<std::string> clauses;
  if (acc) {
    // An accumulating scan over a list: the recursive call is the result.
    Note("accumulator");
    base.push_back({"%acc", f.ret, 8});
    for (const RandomCtor& c : adt.ctors) {
      Scope scope = base;
      std::vector<std::string> fields;
      std::string rest;
      std::vector<ScopeVar> must = {{"%acc", f.ret, 1}};
      for (const RandomType& t : c.fields) {
        std::string v = Fresh("f");
        fields.push_back(v);
        if (t.kind == Kind::kAdt) {
          rest = v;
        } else {
          scope.push_back({v, t, 8});
          must.push_back(scope.back());
        }
      }
      std::string pattern = c.name + (fields.empty() ? "" : "(" + Join(fields) + ")");
      if (rest.empty()) {
        clauses.push_back(pattern + " => %acc");
      } else {
        std::string next = result(scope, must);
        clauses.push_back(pattern + " => " + f.name + "(" + rest + ", " + WeightArgs() + ", " + ctx.depth + ", " + next + ")");
      }
    }
  } else {
    // One clause: constructor `c`, its field `nested` (if >= 0) matched
    // against constructor `inner`; every ADT-typed variable it binds is
    // recursed on.
    auto clause = [&](const RandomCtor& c, int nested, const RandomCtor* inner) {
      Scope scope = base;
      std::vector<std::string> lets;
      std::vector<ScopeVar> must;
      auto bind = [&](const RandomType& t) {
        if (t.kind != Kind::kAdt && Coin(0.1)) return std::string("_");
        std::string v = Fresh("f");
        if (t.kind == Kind::kAdt) {
          std::string r = Fresh("r");
          const FuncSig& callee = folds_[t.adt];
          std::string call = callee.name + "(" + v + ", " + WeightArgs() + ", " + ctx.depth;
          if (fold_has_acc_[t.adt]) call += ", " + Gen(callee.ret, scope, 2, ctx);
          lets.push_back("let " + r + ": " + TypeText(callee.ret) + " = " + call + ");");
          scope.push_back({r, callee.ret, 10});
          must.push_back(scope.back());
          if (t.adt != k) Note("mutual_recursion");
        } else {
          scope.push_back({v, t, 8});
        }
        return v;
      };
      std::vector<std::string> fields;
      for (size_t i = 0; i < c.fields.size(); ++i) {
        if (static_cast<int>(i) == nested) {
          std::vector<std::string> sub;
          for (const RandomType& t : inner->fields) sub.push_back(bind(t));
          fields.push_back(inner->name + (sub.empty() ? "" : "(" + Join(sub) + ")"));
        } else {
          fields.push_back(bind(c.fields[i]));
        }
      }
      std::string pattern = c.name + (fields.empty() ? "" : "(" + Join(fields) + ")");
      std::string body = result(scope, must);
      if (lets.empty()) return pattern + " => " + body;
      return pattern + " => {\n      " + Join(lets, "\n      ") + "\n      " + body + "\n    }";
    };
    if (Coin(0.35)) {
      std::vector<std::pair<int, int>> nestable;  // (constructor, ADT field)
      for (size_t c = 0; c < adt.ctors.size(); ++c) {
        for (size_t i = 0; i < adt.ctors[c].fields.size(); ++i) {
          if (adt.ctors[c].fields[i].kind == Kind::kAdt) nestable.push_back({static_cast<int>(c), static_cast<int>(i)});
        }
      }
      if (!nestable.empty()) {
        auto [c, i] = Pick(nestable);
        const std::vector<RandomCtor>& subs = program_.adts[adt.ctors[c].fields[i].adt].ctors;
        const RandomCtor& sub = subs[Int(0, static_cast<int64_t>(subs.size()) - 1)];
        Note("nested_pattern");
        clauses.push_back(clause(adt.ctors[c], i, &sub));
      }
    }
    bool wildcard = adt.ctors.size() > 1 && Coin(0.2);
    for (size_t c = 0; c < adt.ctors.size(); ++c) {
      if (wildcard && c + 1 == adt.ctors.size()) {
        Note("wildcard");
        clauses.push_back("_ => " + result(base, {}));
      } else {
        clauses.push_back(clause(adt.ctors[c], -1, nullptr));
      }
    }
  }
  std::vector<std::string> params = {"%t: " + adt.type_text};
  for (const std::string& p : WeightParams()) params.push_back(p);
  params.push_back("%d: Tensor[(), i64]");
  if (acc) params.push_back("%acc: " + TypeText(f.ret));
  return "def " + f.name + "(" + Join(params) + ") -> " + TypeText(f.ret) + " {\n  match (%t) {\n    " +
         Join(clauses, ",\n    ") + ",\n  }\n}\n\n";
}

// @map_k(%t, W, %d) -> the same ADT: every constructor rebuilt with its
// tensors transformed and its subterms mapped. The partial evaluator builds
// the new skeleton statically, with dynamic tensors in it, and the folds
// then match on values no argument holds.
std::string Generator::MapDef(int k) {
  const RandomAdt& adt = program_.adts[k];
  Scope base;
  AddWeightsTo(base);
  base.push_back({"%d", StaticInt(100), 2});
  Context ctx;
  ctx.helpers_callable = static_cast<int>(helpers_.size());
  ctx.depth = "add(%d, 1)";
  std::vector<std::string> clauses;
  for (const RandomCtor& c : adt.ctors) {
    std::vector<std::string> vars, fields;
    Scope scope = base;
    for (const RandomType& t : c.fields) {
      vars.push_back(Fresh("f"));
      scope.push_back({vars.back(), t, 8});
    }
    for (size_t i = 0; i < c.fields.size(); ++i) {
      const RandomType& t = c.fields[i];
      budget_ = options_.body_budget / 2;
      switch (t.kind) {
        case Kind::kAdt:
          fields.push_back("@map" + std::to_string(t.adt) + "(" + vars[i] + ", " + WeightArgs() + ", " + ctx.depth + ")");
          break;
        case Kind::kF32: {
          std::string e = Tensor(t.shape, scope, options_.max_depth - 1, ctx);
          fields.push_back(Squash(EnsureUses(e, t.shape, {scope[base.size() + i]}, scope)));
          break;
        }
        case Kind::kTuple: {
          std::vector<std::string> parts;
          for (const RandomType& f : t.fields) parts.push_back(Squash(Tensor(f.shape, scope, options_.max_depth - 1, ctx)));
          fields.push_back("(" + Join(parts) + ")");
          break;
        }
        default: fields.push_back(vars[i]); break;
      }
    }
    std::string pattern = c.name + (vars.empty() ? "" : "(" + Join(vars) + ")");
    clauses.push_back(pattern + " => " + c.name + (fields.empty() ? "" : "(" + Join(fields) + ")"));
  }
  std::vector<std::string> params = {"%t: " + adt.type_text};
  for (const std::string& p : WeightParams()) params.push_back(p);
  params.push_back("%d: Tensor[(), i64]");
  return "def @map" + std::to_string(k) + "(" + Join(params) + ") -> " + adt.type_text + " {\n  match (%t) {\n    " +
         Join(clauses, ",\n    ") + ",\n  }\n}\n\n";
}

std::string Generator::MainDef() {
  Scope scope;
  std::vector<std::string> params;
  for (size_t i = 0; i < program_.params.size(); ++i) {
    params.push_back(param_names_[i] + ": " + TypeText(program_.params[i]));
    scope.push_back({param_names_[i], program_.params[i], 4});
  }
  Context ctx;
  ctx.helpers_callable = static_cast<int>(helpers_.size());
  ctx.folds_callable = true;
  bool has_k = std::find(param_names_.begin(), param_names_.end(), "%k") != param_names_.end();
  ctx.depth = has_k && Coin(0.5) ? "%k" : "0";
  // (1) Every root is folded once up front.
  std::vector<std::string> lets;
  std::vector<ScopeVar> must;
  for (size_t i = 0; i < program_.params.size(); ++i) {
    if (program_.params[i].kind != Kind::kAdt) continue;
    budget_ = options_.body_budget / 2;
    std::string root = param_names_[i];
    if (use_maps_) root = "@map" + std::to_string(program_.params[i].adt) + "(" + root + ", " + WeightArgs() + ", " + ctx.depth + ")";
    std::string call = FoldCall({root, program_.params[i], 1}, scope, ctx);
    std::string r = Fresh("r");
    const RandomType& ret = folds_[program_.params[i].adt].ret;
    lets.push_back("let " + r + ": " + TypeText(ret) + " = " + call + ";");
    scope.push_back({r, ret, 10});
    must.push_back(scope.back());
  }
  // (2) The outputs.
  int outputs = static_cast<int>(Int(1, 3));
  std::vector<RandomType> results;
  std::vector<std::string> parts;
  for (int i = 0; i < outputs; ++i) {
    results.push_back(F32(RandomShape(0, 2, 5)));
    budget_ = options_.body_budget;
    std::string e = Tensor(results.back().shape, scope, options_.max_depth, ctx);
    if (i == 0) e = EnsureUses(e, results.back().shape, must, scope);
    // Bound, so that another output may be the very same value.
    std::string o = Fresh("out");
    lets.push_back("let " + o + ": " + TypeText(results.back()) + " = " + e + ";");
    parts.push_back(o);
  }
  // Results that share memory with other results or with the arguments, or
  // are constants: what a memory plan must get right at the boundary.
  if (Coin(0.4)) {
    std::vector<std::pair<std::string, Shape>> aliases;
    for (size_t i = 0; i < parts.size(); ++i) {
      aliases.push_back({parts[i], results[i].shape});
      if (NumElements(results[i].shape) > 1) aliases.push_back({"reshape(" + parts[i] + ", shape=[" + std::to_string(NumElements(results[i].shape)) + "])", {NumElements(results[i].shape)}});
    }
    for (size_t i = 0; i < program_.params.size(); ++i) {
      const RandomType& t = program_.params[i];
      if (t.kind == Kind::kF32 && !t.rows_unknown) aliases.push_back({param_names_[i], t.shape});
    }
    Shape c = RandomShape(0, 2, 3);
    aliases.push_back({ConstF32(c), c});
    int extra = static_cast<int>(Int(1, 2));
    for (int i = 0; i < extra; ++i) {
      auto [e, shape] = Pick(aliases);
      Note(e[0] == '%' ? "result_alias" : e.rfind("reshape", 0) == 0 ? "result_view" : "result_constant");
      results.push_back(F32(shape));
      parts.push_back(e);
    }
  }
  main_result_ = Tuple(results);
  std::string out = "def @main(" + Join(params) + ") -> " + TypeText(main_result_) + " {\n";
  for (const std::string& l : lets) out += "  " + l + "\n";
  return out + "  (" + Join(parts, ",\n   ") + (parts.size() == 1 ? ",)" : ")") + "\n}\n\n";
}

std::string Generator::LossDef() {
  std::vector<std::string> params;
  for (size_t i = 0; i < program_.params.size(); ++i) params.push_back(param_names_[i] + ": " + TypeText(program_.params[i]));
  std::string loss;
  for (size_t i = 0; i < main_result_.fields.size(); ++i) {
    const Shape& s = main_result_.fields[i].shape;
    std::string r = "%r." + std::to_string(i);
    std::string term;
    switch (Int(0, 3)) {
      case 0: term = Fn("sum", {Fn("mul", {r, ConstF32(s)})}); break;
      case 1: term = Fn("mean", {Fn("mul", {r, r})}); break;
      case 2: term = Fn("mean", {Fn("tanh", {r})}); break;
      default: term = Fn("sum", {Fn("sigmoid", {r})}); break;
    }
    loss = i == 0 ? term : Fn("add", {loss, term});
  }
  return "def @loss(" + Join(params) + ") -> Tensor[(), f32] {\n  let %r: " + TypeText(main_result_) + " = @main(" +
         Join(param_names_) + ");\n  " + loss + "\n}\n";
}

RandomProgram Generator::Run() {
  allow_dynamic_if_ = Coin(options_.dynamic_if);
  MakeAdts();
  // (1) Shared weights, and the embedding table if there are word ids.
  int nweights = static_cast<int>(Int(1, 3));
  for (int i = 0; i < nweights; ++i) weights_.push_back({"%w" + std::to_string(i), F32(RandomShape(1, 2, 5)), 4});
  if (vocabulary_ > 0) {
    RandomType table = F32({vocabulary_, Int(2, 5)});
    table.rows_unknown = Coin(0.5);
    if (table.rows_unknown) Note("unknown_dim");
    weights_.push_back({"%emb", table, 4});
  }
  weights_as_tuple_ = Coin(0.3);
  if (weights_as_tuple_) Note("weight_tuple");
  // (2) Signatures of the helpers and folds.
  int nhelpers = static_cast<int>(Int(0, options_.max_helpers));
  for (int i = 0; i < nhelpers; ++i) {
    FuncSig h;
    h.name = "@h" + std::to_string(i);
    int nparams = static_cast<int>(Int(1, 3));
    for (int j = 0; j < nparams; ++j) {
      if (Coin(0.15)) {
        h.params.push_back(ResultType());
      } else {
        h.params.push_back(F32(RandomShape(0, 2, 4)));
      }
    }
    h.ret = ResultType();
    helpers_.push_back(h);
  }
  for (size_t k = 0; k < program_.adts.size(); ++k) {
    const RandomAdt& adt = program_.adts[k];
    FuncSig f;
    f.name = "@fold" + std::to_string(k);
    f.ret = ResultType();
    folds_.push_back(f);
    // A list: Nil, and Cons(non-ADT fields..., itself).
    bool list = adt.ctors.size() == 2 && adt.ctors[0].fields.empty() && !adt.ctors[1].fields.empty() &&
                adt.ctors[1].fields.back().kind == Kind::kAdt && adt.ctors[1].fields.back().adt == static_cast<int>(k);
    for (size_t i = 0; list && i + 1 < adt.ctors[1].fields.size(); ++i) list = adt.ctors[1].fields[i].kind != Kind::kAdt;
    fold_has_acc_.push_back(list && Coin(0.4));
  }
  // (3) @main's parameters, in a partly shuffled order.
  std::vector<std::pair<std::string, RandomType>> params;
  for (size_t i = 0; i < roots_.size(); ++i) params.push_back({"%tree" + std::to_string(i), Adt(roots_[i])});
  if (weights_as_tuple_) {
    params.push_back({"%p", WeightTuple()});
  } else {
    for (const ScopeVar& w : weights_) params.push_back({w.name, w.type});
  }
  int extra = static_cast<int>(Int(0, 2));
  for (int i = 0; i < extra; ++i) params.push_back({"%x" + std::to_string(i), F32(RandomShape(0, 2, 5))});
  if (vocabulary_ > 0 && Coin(0.4)) {
    params.push_back({"%ids", Index({Int(1, 4)}, vocabulary_)});
    Note("dynamic_indices");
  }
  if (Coin(0.3)) {
    params.push_back({"%k", StaticInt(3)});
    Note("static_argument");
  }
  for (size_t i = params.size(); i > 1; --i) {
    if (Coin(0.3)) std::swap(params[i - 1], params[Int(0, static_cast<int64_t>(i) - 1)]);
  }
  for (auto& [name, type] : params) {
    param_names_.push_back(name);
    program_.static_args.push_back(type.kind == Kind::kStaticInt);
    program_.params.push_back(type);
  }
  for (size_t i = 0; i < program_.params.size(); ++i) {
    std::vector<bool> seen(program_.adts.size(), false);
    if (!program_.static_args[i] && HasF32(program_.params[i], seen)) program_.wrt.push_back(static_cast<int>(i));
  }
  use_maps_ = !program_.adts.empty() && Coin(0.3);
  if (use_maps_) Note("adt_map");
  // (4) Bodies.
  std::string defs;
  for (size_t i = 0; i < helpers_.size(); ++i) defs += HelperDef(i);
  for (size_t k = 0; k < folds_.size(); ++k) defs += FoldDef(static_cast<int>(k));
  for (size_t k = 0; use_maps_ && k < program_.adts.size(); ++k) defs += MapDef(static_cast<int>(k));
  defs += MainDef();
  defs += LossDef();
  for (const std::string& d : extra_defs_) defs += d;
  program_.text = "# random program " + std::to_string(program_.seed) + "\n" + TypeDefs() + defs;
  for (const char* op : kOps) {
    int n = CountWord(program_.text, std::string(op) + "(");
    if (n > 0) program_.features[std::string("op:") + op] += n;
  }
  return std::move(program_);
}

// ---- values ---------------------------------------------------------------------

Value RandomValue(const RandomType& t, const std::vector<RandomAdt>& adts, const ModuleSnapshot& module, Rng& rng,
                  int64_t nodes);

// A value of ADT `k` with about `nodes` constructors.
Value RandomAdtValue(int k, const std::vector<RandomAdt>& adts, const ModuleSnapshot& module, Rng& rng, int64_t nodes) {
  const RandomAdt& adt = adts[k];
  auto children = [](const RandomCtor& c) {
    int n = 0;
    for (const RandomType& f : c.fields) n += f.kind == Kind::kAdt;
    return n;
  };
  std::vector<int> candidates;
  int fewest = 1 << 20;
  for (const RandomCtor& c : adt.ctors) fewest = std::min(fewest, children(c));
  for (size_t c = 0; c < adt.ctors.size(); ++c) {
    int n = children(adt.ctors[c]);
    if (nodes <= 1 ? n == fewest : n > 0) candidates.push_back(static_cast<int>(c));
  }
  int tag = candidates[rng.NextInt(0, static_cast<int64_t>(candidates.size()))];
  const RandomCtor& ctor = adt.ctors[tag];
  // The remaining nodes, split among the children, at least one each.
  int n = children(ctor);
  std::vector<int64_t> share(n, 1);
  for (int64_t left = nodes - 1 - n; left > 0; --left) ++share[rng.NextInt(0, n)];
  std::vector<Value> fields;
  int child = 0;
  for (const RandomType& f : ctor.fields) {
    if (f.kind == Kind::kAdt) {
      fields.push_back(RandomAdtValue(f.adt, adts, module, rng, share[child++]));
    } else {
      fields.push_back(RandomValue(f, adts, module, rng, 0));
    }
  }
  TypeDefPtr def = module.FindType(adt.type_def);
  if (!def) throw std::invalid_argument("random_program: the module has no type " + adt.type_def);
  return Value::Adt(def, tag, std::move(fields));
}

Value RandomValue(const RandomType& t, const std::vector<RandomAdt>& adts, const ModuleSnapshot& module, Rng& rng,
                  int64_t nodes) {
  switch (t.kind) {
    case Kind::kF32: return Value(RandomUniform(rng, t.shape, -1, 1));
    case Kind::kIndex: return Value(RandomInt(rng, t.shape, 0, t.bound));
    case Kind::kStaticInt: return Value(Tensor::FromVector<int64_t>({}, {rng.NextInt(0, t.bound)}));
    case Kind::kTuple: {
      std::vector<Value> fields;
      for (const RandomType& f : t.fields) fields.push_back(RandomValue(f, adts, module, rng, nodes));
      return Value::Tuple(std::move(fields));
    }
    case Kind::kAdt: return RandomAdtValue(t.adt, adts, module, rng, nodes);
  }
  return Value();
}

Value Refilled(const Value& like, const RandomType& t, const std::vector<RandomAdt>& adts, Rng& rng) {
  switch (t.kind) {
    case Kind::kF32: return Value(RandomUniform(rng, like.tensor().shape(), -1, 1));
    case Kind::kIndex: return Value(RandomInt(rng, like.tensor().shape(), 0, t.bound));
    case Kind::kStaticInt: return like;
    case Kind::kTuple: {
      std::vector<Value> fields;
      for (size_t i = 0; i < t.fields.size(); ++i) fields.push_back(Refilled(like.fields().at(i), t.fields[i], adts, rng));
      return Value::Tuple(std::move(fields));
    }
    case Kind::kAdt: {
      const RandomCtor& ctor = adts[t.adt].ctors.at(like.tag());
      std::vector<Value> fields;
      for (size_t i = 0; i < ctor.fields.size(); ++i) fields.push_back(Refilled(like.fields().at(i), ctor.fields[i], adts, rng));
      return Value::Adt(like.adt(), like.tag(), std::move(fields));
    }
  }
  return like;
}

uint64_t InputSeed(uint64_t program, uint64_t input) {
  return (program + 1) * 0x2545f4914f6cdd1dull ^ (input + 7) * 0x9e3779b97f4a7c15ull;
}

}  // namespace

Snapshot RandomProgram::Load() const {
  Module m;
  try {
    m.AddSource(text, "random" + std::to_string(seed) + ".pj");
  } catch (const std::exception& e) {
    throw std::runtime_error("random program " + std::to_string(seed) + " does not type-check: " + e.what() + "\n" + text);
  }
  return m.snapshot();
}

std::vector<Value> RandomProgram::Arguments(const ModuleSnapshot& module, uint64_t input, int max_nodes) const {
  Rng rng(InputSeed(seed, input));
  std::vector<Value> args;
  for (const RandomType& t : params) {
    int64_t nodes = rng.NextInt(1, max_nodes + 1);
    args.push_back(RandomValue(t, adts, module, rng, nodes));
    // Sometimes the very tensor of an earlier argument of the same type: two
    // parameters, one buffer.
    bool alias = rng.NextUniform() < 0.3;
    for (size_t j = 0; alias && t.kind == RandomType::Kind::kF32 && j + 1 < args.size(); ++j) {
      if (args[j].is_tensor() && args[j].tensor().type() == args.back().tensor().type()) {
        args.back() = args[j];
        break;
      }
    }
  }
  return args;
}

std::vector<Value> RandomProgram::Refill(const std::vector<Value>& like, uint64_t input) const {
  Rng rng(InputSeed(seed, input) ^ 0x5bd1e995ull);
  std::vector<Value> args;
  for (size_t i = 0; i < params.size(); ++i) args.push_back(Refilled(like.at(i), params[i], adts, rng));
  return args;
}

RandomProgram GenerateRandomProgram(uint64_t seed, const RandomProgramOptions& options) {
  return Generator(seed, options).Run();
}

}  // namespace pejit
