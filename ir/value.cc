#include "ir/value.h"

#include <stdexcept>
#include <string>

namespace pejit {

Value::Value(Tensor t) : kind_(Kind::kTensor), tensor_(std::move(t)) {}

namespace {
// Values being freed by this thread's outermost ~Value: nested ones are queued
// here instead of freed recursively.
thread_local std::vector<std::shared_ptr<const std::vector<Value>>>* t_value_graveyard = nullptr;
}  // namespace

Value::~Value() {
  if (!fields_) return;
  if (t_value_graveyard) {
    t_value_graveyard->push_back(std::move(fields_));
    return;
  }
  // Dropping a reference is the shared_ptr's own (properly ordered) business;
  // when it frees the vector, the Values inside queue their fields here.
  std::vector<std::shared_ptr<const std::vector<Value>>> pending;
  pending.push_back(std::move(fields_));
  t_value_graveyard = &pending;
  while (!pending.empty()) {
    std::shared_ptr<const std::vector<Value>> next = std::move(pending.back());
    pending.pop_back();
    next.reset();
  }
  t_value_graveyard = nullptr;
}

Value Value::Tuple(std::vector<Value> fields) {
  Value v;
  v.kind_ = Kind::kTuple;
  v.fields_ = std::make_shared<const std::vector<Value>>(std::move(fields));
  return v;
}

Value Value::Adt(TypeDefPtr adt, int tag, std::vector<Value> fields) {
  Value v;
  v.kind_ = Kind::kAdt;
  v.adt_ = std::move(adt);
  v.tag_ = tag;
  v.fields_ = std::make_shared<const std::vector<Value>>(std::move(fields));
  return v;
}

Value Value::Function(std::shared_ptr<const Closure> closure) {
  Value v;
  v.kind_ = Kind::kClosure;
  v.closure_ = std::move(closure);
  return v;
}

void Value::WrongKind(const char* expected) const {
  throw std::logic_error(std::string("expected ") + expected + ", got " + Describe());
}

const Closure& Value::closure() const {
  if (kind_ != Kind::kClosure) throw std::logic_error("expected a function, got " + Describe());
  return *closure_;
}

namespace {

std::string Render(const Value& v, bool numbers, int depth);

// Deeper structure is elided: a message about a 100,000-deep tree stays short.
constexpr int kMaxRenderDepth = 4;

std::string Join(const std::vector<Value>& vs, bool numbers, int depth) {
  if (depth >= kMaxRenderDepth) return "...";
  std::string s;
  for (size_t i = 0; i < vs.size(); ++i) s += (i ? ", " : "") + Render(vs[i], numbers, depth + 1);
  return s;
}

std::string Render(const Value& v, bool numbers, int depth) {
  switch (v.kind()) {
    case Value::Kind::kNone: return "<none>";
    case Value::Kind::kTensor: return numbers ? v.tensor().ToString() : v.tensor().type().ToString();
    case Value::Kind::kTuple: {
      std::string inner = Join(v.fields(), numbers, depth);
      return "(" + inner + (v.fields().size() == 1 ? ",)" : ")");
    }
    case Value::Kind::kAdt:
      return v.fields().empty() ? v.ctor_name() : v.ctor_name() + "(" + Join(v.fields(), numbers, depth) + ")";
    case Value::Kind::kClosure: return v.closure().global.empty() ? "<closure>" : "@" + v.closure().global;
  }
  return "?";
}

}  // namespace

std::string Value::Describe() const { return Render(*this, false, 0); }
std::string Value::ToString() const { return Render(*this, true, 0); }

namespace {

// Iterative: values may be nested 100,000 deep.
bool Compare(const Value& a, const Value& b, const std::function<bool(const Tensor&, const Tensor&)>& same) {
  std::vector<std::pair<const Value*, const Value*>> stack = {{&a, &b}};
  while (!stack.empty()) {
    auto [x, y] = stack.back();
    stack.pop_back();
    if (x->kind() != y->kind()) return false;
    switch (x->kind()) {
      case Value::Kind::kNone: break;
      case Value::Kind::kTensor:
        if (!same(x->tensor(), y->tensor())) return false;
        break;
      case Value::Kind::kAdt:
        if (x->adt()->name != y->adt()->name || x->tag() != y->tag()) return false;
        [[fallthrough]];
      case Value::Kind::kTuple:
        if (x->fields().size() != y->fields().size()) return false;
        for (size_t i = 0; i < x->fields().size(); ++i) stack.push_back({&x->fields()[i], &y->fields()[i]});
        break;
      case Value::Kind::kClosure:
        if (&x->closure() != &y->closure()) return false;
        break;
    }
  }
  return true;
}

}  // namespace

bool ValueEqual(const Value& a, const Value& b) {
  return Compare(a, b, [](const Tensor& x, const Tensor& y) { return Equal(x, y); });
}

bool ValueAllClose(const Value& a, const Value& b, double rtol, double atol) {
  return Compare(a, b, [&](const Tensor& x, const Tensor& y) { return AllClose(x, y, rtol, atol); });
}

std::string ForeignConstructors(const TypeDef& made, const TypeDef& mine) {
  bool same = made.params == mine.params && made.ctors.size() == mine.ctors.size();
  for (size_t c = 0; same && c < made.ctors.size(); ++c) {
    const CtorDef &a = made.ctors[c], &b = mine.ctors[c];
    same = a.name == b.name && a.fields.size() == b.fields.size();
    for (size_t f = 0; same && f < a.fields.size(); ++f) same = TypeToString(a.fields[f]) == TypeToString(b.fields[f]);
  }
  if (same) return "";
  auto list = [](const TypeDef& t) {
    std::string s;
    for (const CtorDef& c : t.ctors) {
      if (!s.empty()) s += ", ";
      s += c.name.size() > 40 ? c.name.substr(0, 40) + "..." : c.name;
      s += "(" + std::to_string(c.fields.size()) + ")";
      if (s.size() > 400) return s + ", ...";
    }
    return s;
  };
  return "a " + made.name + " made by another module's constructors (" + list(made) + "), not this program's (" +
         list(mine) + "): make it with this engine's constructors";
}

void CheckValueType(const Value& root, const Type& root_type, const std::string& what, const FindTypeFn* find_type) {
  const TypeDef* checked = nullptr;  // the last definition found compatible: trees repeat one
  // An explicit stack: trees and lists may be nested 100,000 deep.
  struct Item {
    const Value* value;
    Type type;
    int parent;         // index into `items`, -1 for the root
    std::string label;  // "field 1 of Node"
  };
  std::vector<Item> items = {{&root, root_type, -1, what}};
  std::vector<int> stack = {0};
  while (!stack.empty()) {
    int index = stack.back();
    stack.pop_back();
    const Value& v = *items[index].value;
    Type t = items[index].type;
    auto fail = [&] {
      std::string path = items[index].label;
      for (int p = items[index].parent, depth = 0; p >= 0 && depth < 4; p = items[p].parent, ++depth) {
        path += " of " + items[p].label;
      }
      throw std::invalid_argument(path + ": expected " + TypeToString(t) + ", got " + v.Describe());
    };
    auto push = [&](const Value& child, Type type, std::string label) {
      items.push_back({&child, std::move(type), index, std::move(label)});
      stack.push_back(static_cast<int>(items.size()) - 1);
    };
    switch (t->kind) {
      case TypeKind::kTensor: {
        if (!v.is_tensor()) fail();
        const TensorType& want = AsTensor(t)->type;
        const TensorType& got = v.tensor().type();
        if (want.dtype != got.dtype || want.shape.size() != got.shape.size()) fail();
        for (size_t i = 0; i < want.shape.size(); ++i) {
          if (want.shape[i] != kUnknownDim && want.shape[i] != got.shape[i]) fail();
        }
        break;
      }
      case TypeKind::kTuple: {
        const auto& fields = AsTuple(t)->fields;
        if (v.kind() != Value::Kind::kTuple || v.fields().size() != fields.size()) fail();
        for (size_t i = 0; i < fields.size(); ++i) push(v.fields()[i], fields[i], "field " + std::to_string(i));
        break;
      }
      case TypeKind::kAdt: {
        const AdtTypeNode* adt = AsAdt(t);
        if (v.kind() != Value::Kind::kAdt || v.adt()->name != adt->name) fail();
        if (find_type && v.adt().get() != checked) {
          if (TypeDefPtr mine = (*find_type)(adt->name); mine && mine != v.adt()) {
            if (std::string why = ForeignConstructors(*v.adt(), *mine); !why.empty()) {
              std::string path = items[index].label;
              for (int p = items[index].parent, depth = 0; p >= 0 && depth < 4; p = items[p].parent, ++depth) {
                path += " of " + items[p].label;
              }
              throw std::invalid_argument(path + ": " + why);
            }
          }
          checked = v.adt().get();
        }
        std::map<std::string, Type> bindings;
        for (size_t i = 0; i < adt->args.size() && i < v.adt()->params.size(); ++i) {
          bindings[v.adt()->params[i]] = adt->args[i];
        }
        const CtorDef& ctor = v.adt()->ctors[v.tag()];
        for (size_t i = 0; i < ctor.fields.size(); ++i) {
          push(v.fields()[i], SubstituteTypeVars(ctor.fields[i], bindings),
               "field " + std::to_string(i) + " of " + ctor.name);
        }
        break;
      }
      case TypeKind::kFunc:
        if (v.kind() != Value::Kind::kClosure) fail();
        break;
      case TypeKind::kVar: break;
    }
  }
}

void AppendTensorLeaves(const Value& v, std::vector<Tensor>& out) {
  ForEachNode(v, [&](const Value& node) {
    if (node.is_tensor()) out.push_back(node.tensor());
  });
}

std::vector<Tensor> TensorLeaves(const Value& v) {
  std::vector<Tensor> out;
  AppendTensorLeaves(v, out);
  return out;
}

Value ReplaceTensorLeaves(const Value& like, std::span<const Value> leaves) {
  struct Frame {
    const Value* value;         // a tuple or ADT value
    std::vector<Value> fields;  // rebuilt so far
  };
  // `like` is the one field of a frame of its own: every node is some
  // frame's field, and the root needs no case of its own.
  const Value holder = Value::Tuple({like});
  std::vector<Frame> stack = {{&holder, {}}};
  size_t next = 0;
  for (;;) {
    Frame& f = stack.back();
    const std::vector<Value>& fields = f.value->fields();
    if (f.fields.size() < fields.size()) {
      const Value& v = fields[f.fields.size()];
      if (v.kind() == Value::Kind::kTuple || v.kind() == Value::Kind::kAdt) {
        stack.push_back({&v, {}});  // `f` is not used after
        stack.back().fields.reserve(v.fields().size());
      } else if (v.is_tensor()) {
        if (next == leaves.size()) {
          throw std::invalid_argument("a value with more tensor leaves than the " + std::to_string(leaves.size()) +
                                      " given to replace them");
        }
        f.fields.push_back(leaves[next++]);
      } else {
        f.fields.push_back(v);  // a closure stays
      }
      continue;
    }
    if (stack.size() == 1) break;
    Value done = f.value->kind() == Value::Kind::kTuple ? Value::Tuple(std::move(f.fields))
                                                         : Value::Adt(f.value->adt(), f.value->tag(), std::move(f.fields));
    stack.pop_back();
    stack.back().fields.push_back(std::move(done));
  }
  if (next != leaves.size()) {
    throw std::invalid_argument(std::to_string(leaves.size()) + " values to replace the " + std::to_string(next) +
                                " tensor leaves of a value");
  }
  return std::move(stack[0].fields[0]);
}

Value ValueFromTensors(const Type& t, const std::vector<Tensor>& tensors, size_t& pos) {
  if (AsTensor(t)) return Value(tensors.at(pos++));
  std::vector<Value> fields;
  for (const Type& f : AsTuple(t)->fields) fields.push_back(ValueFromTensors(f, tensors, pos));
  return Value::Tuple(std::move(fields));
}

}  // namespace pejit
