#include "ir/type.h"

#include <algorithm>

namespace pejit {

Type TensorTy(DType dtype, Shape shape) { return TensorTy(TensorType{dtype, std::move(shape)}); }
Type TensorTy(const TensorType& type) { return std::make_shared<TensorTypeNode>(type); }
Type ScalarTy(DType dtype) { return TensorTy(dtype, {}); }
Type TupleTy(std::vector<Type> fields) { return std::make_shared<TupleTypeNode>(std::move(fields)); }
Type RecordTy(std::vector<std::string> names, std::vector<Type> fields) {
  return std::make_shared<TupleTypeNode>(std::move(fields), std::move(names));
}

int TupleTypeNode::FieldIndex(std::string_view name) const {
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) return static_cast<int>(i);
  }
  return -1;
}
Type FuncTy(std::vector<Type> params, Type ret) {
  return std::make_shared<FuncTypeNode>(std::move(params), std::move(ret));
}
Type GenericFuncTy(std::vector<std::string> type_params, std::vector<Type> params, Type ret) {
  return std::make_shared<FuncTypeNode>(std::move(params), std::move(ret), std::move(type_params));
}
Type AdtTy(std::string name, std::vector<Type> args) {
  return std::make_shared<AdtTypeNode>(std::move(name), std::move(args));
}
Type TypeVarTy(std::string name) { return std::make_shared<TypeVarNode>(std::move(name)); }

const TensorTypeNode* AsTensor(const Type& t) {
  return t && t->kind == TypeKind::kTensor ? static_cast<const TensorTypeNode*>(t.get()) : nullptr;
}
const TupleTypeNode* AsTuple(const Type& t) {
  return t && t->kind == TypeKind::kTuple ? static_cast<const TupleTypeNode*>(t.get()) : nullptr;
}
const FuncTypeNode* AsFunc(const Type& t) {
  return t && t->kind == TypeKind::kFunc ? static_cast<const FuncTypeNode*>(t.get()) : nullptr;
}
const AdtTypeNode* AsAdt(const Type& t) {
  return t && t->kind == TypeKind::kAdt ? static_cast<const AdtTypeNode*>(t.get()) : nullptr;
}
const TypeVarNode* AsTypeVar(const Type& t) {
  return t && t->kind == TypeKind::kVar ? static_cast<const TypeVarNode*>(t.get()) : nullptr;
}

namespace {

std::string List(const std::vector<Type>& types) {
  std::string s;
  for (size_t i = 0; i < types.size(); ++i) s += (i ? ", " : "") + TypeToString(types[i]);
  return s;
}

}  // namespace

bool TensorTypeFits(const TensorType& want, const TensorType& got) {
  if (want.dtype != got.dtype || want.shape.size() != got.shape.size()) return false;
  for (size_t i = 0; i < want.shape.size(); ++i) {
    if (want.shape[i] != kUnknownDim && got.shape[i] != kUnknownDim && want.shape[i] != got.shape[i]) return false;
  }
  return true;
}

namespace {

// Equality (exact) or compatibility (unknown dims match anything).
bool Match(const Type& a, const Type& b, bool exact) {
  if (!a || !b) return a == b;
  if (a->kind != b->kind) return false;
  switch (a->kind) {
    case TypeKind::kTensor: {
      const TensorType &x = AsTensor(a)->type, &y = AsTensor(b)->type;
      if (x.dtype != y.dtype || x.shape.size() != y.shape.size()) return false;
      for (size_t i = 0; i < x.shape.size(); ++i) {
        if (x.shape[i] == y.shape[i]) continue;
        if (exact || (x.shape[i] != kUnknownDim && y.shape[i] != kUnknownDim)) return false;
      }
      return true;
    }
    case TypeKind::kTuple: {
      const auto &x = AsTuple(a)->fields, &y = AsTuple(b)->fields;
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!Match(x[i], y[i], exact)) return false;
      }
      return true;
    }
    case TypeKind::kFunc: {
      const FuncTypeNode *x = AsFunc(a), *y = AsFunc(b);
      if (x->params.size() != y->params.size() || x->type_params != y->type_params || !Match(x->ret, y->ret, exact)) {
        return false;
      }
      for (size_t i = 0; i < x->params.size(); ++i) {
        if (!Match(x->params[i], y->params[i], exact)) return false;
      }
      return true;
    }
    case TypeKind::kAdt: {
      const AdtTypeNode *x = AsAdt(a), *y = AsAdt(b);
      if (x->name != y->name || x->args.size() != y->args.size()) return false;
      for (size_t i = 0; i < x->args.size(); ++i) {
        if (!Match(x->args[i], y->args[i], exact)) return false;
      }
      return true;
    }
    case TypeKind::kVar:
      return AsTypeVar(a)->name == AsTypeVar(b)->name;
  }
  return false;
}

}  // namespace

std::string TypeToString(const Type& t) {
  if (!t) return "<no type>";
  switch (t->kind) {
    case TypeKind::kTensor: return AsTensor(t)->type.ToString();
    case TypeKind::kTuple: {
      const TupleTypeNode* tuple = AsTuple(t);
      const auto& f = tuple->fields;
      if (!tuple->names.empty()) {
        std::string s = "{";
        for (size_t i = 0; i < f.size(); ++i) s += (i ? ", " : "") + tuple->names[i] + ": " + TypeToString(f[i]);
        return s + "}";
      }
      return "(" + List(f) + (f.size() == 1 ? ",)" : ")");
    }
    case TypeKind::kFunc: {
      const FuncTypeNode* f = AsFunc(t);
      return "fn" + TypeParamsText(f->type_params) + "(" + List(f->params) + ") -> " + TypeToString(f->ret);
    }
    case TypeKind::kAdt: {
      const AdtTypeNode* a = AsAdt(t);
      return a->args.empty() ? a->name : a->name + "[" + List(a->args) + "]";
    }
    case TypeKind::kVar: return AsTypeVar(t)->name;
  }
  return "?";
}

bool TypeEqual(const Type& a, const Type& b) { return Match(a, b, true); }
bool TypeCompatible(const Type& expected, const Type& actual) { return Match(expected, actual, false); }

bool HasTypeVars(const Type& t, const std::vector<std::string>* only) {
  if (!t) return false;
  auto any = [&](const std::vector<Type>& ts) {
    return std::any_of(ts.begin(), ts.end(), [&](const Type& x) { return HasTypeVars(x, only); });
  };
  switch (t->kind) {
    case TypeKind::kTensor: return false;
    case TypeKind::kTuple: return any(AsTuple(t)->fields);
    case TypeKind::kFunc: return any(AsFunc(t)->params) || HasTypeVars(AsFunc(t)->ret, only);
    case TypeKind::kAdt: return any(AsAdt(t)->args);
    case TypeKind::kVar: return !only || std::find(only->begin(), only->end(), AsTypeVar(t)->name) != only->end();
  }
  return false;
}

std::string TypeParamsText(const std::vector<std::string>& params) {
  std::string text;
  for (size_t i = 0; i < params.size(); ++i) text += (i ? ", " : "[") + params[i];
  return params.empty() ? text : text + "]";
}

Type SubstituteTypeVars(const Type& t, const std::map<std::string, Type>& bindings) {
  if (!t || bindings.empty()) return t;
  auto all = [&](const std::vector<Type>& ts) {
    std::vector<Type> out;
    for (const Type& x : ts) out.push_back(SubstituteTypeVars(x, bindings));
    return out;
  };
  switch (t->kind) {
    case TypeKind::kTensor: return t;
    case TypeKind::kTuple: return RecordTy(AsTuple(t)->names, all(AsTuple(t)->fields));
    case TypeKind::kFunc: return FuncTy(all(AsFunc(t)->params), SubstituteTypeVars(AsFunc(t)->ret, bindings));
    case TypeKind::kAdt: return AdtTy(AsAdt(t)->name, all(AsAdt(t)->args));
    case TypeKind::kVar: {
      auto it = bindings.find(AsTypeVar(t)->name);
      return it == bindings.end() ? t : it->second;
    }
  }
  return t;
}

int TypeDef::FindCtor(const std::string& ctor) const {
  for (size_t i = 0; i < ctors.size(); ++i) {
    if (ctors[i].name == ctor) return static_cast<int>(i);
  }
  return -1;
}

bool IsTensorTree(const Type& t) {
  if (AsTensor(t)) return true;
  const TupleTypeNode* tuple = AsTuple(t);
  if (!tuple) return false;
  for (const Type& f : tuple->fields) {
    if (!IsTensorTree(f)) return false;
  }
  return true;
}

size_t CountTensorLeaves(const Type& t) {
  if (AsTensor(t)) return 1;
  size_t n = 0;
  if (const TupleTypeNode* tuple = AsTuple(t)) {
    for (const Type& f : tuple->fields) n += CountTensorLeaves(f);
  }
  return n;
}

}  // namespace pejit
