// \file Types of the IR: tensors, tuples, functions, algebraic data types.
//
// A record (`{emb: Matrix, w: Matrix}`) is a tuple whose fields have names:
// its values are tuples, the names only let a program write `%p.w` for
// `%p.1`. Types match structurally, names aside, so a record parameter takes
// a tuple and a tuple literal is a record where one is expected.
//
// Types are immutable and shared. Tensor types may have dimensions known only
// at call time (`?`, kUnknownDim). ADT types refer to a TypeDef by name and
// may carry type arguments (`List[Tensor[(), i64]]`); a TypeVar is a type
// parameter inside its TypeDef.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ir/source.h"
#include "ops/tensor.h"

namespace pejit {

enum class TypeKind : uint8_t { kTensor, kTuple, kFunc, kAdt, kVar };

struct TypeNode;
using Type = std::shared_ptr<const TypeNode>;

struct TypeNode {
  explicit TypeNode(TypeKind k) : kind(k) {}
  virtual ~TypeNode() = default;
  const TypeKind kind;
};

struct TensorTypeNode final : TypeNode {
  explicit TensorTypeNode(TensorType t) : TypeNode(TypeKind::kTensor), type(std::move(t)) {}
  TensorType type;
};

struct TupleTypeNode final : TypeNode {
  explicit TupleTypeNode(std::vector<Type> f, std::vector<std::string> n = {})
      : TypeNode(TypeKind::kTuple), fields(std::move(f)), names(std::move(n)) {}
  std::vector<Type> fields;
  std::vector<std::string> names;  // a record's, one per field; empty for a tuple
  int FieldIndex(std::string_view name) const;  // -1 if none is called so
};

struct FuncTypeNode final : TypeNode {
  FuncTypeNode(std::vector<Type> p, Type r, std::vector<std::string> t = {})
      : TypeNode(TypeKind::kFunc), params(std::move(p)), ret(std::move(r)), type_params(std::move(t)) {}
  std::vector<Type> params;
  Type ret;
  // A generic definition's type parameters (`def @map[A, B]`), which each
  // use instantiates; empty for every other function type.
  std::vector<std::string> type_params;
};

struct AdtTypeNode final : TypeNode {
  AdtTypeNode(std::string n, std::vector<Type> a) : TypeNode(TypeKind::kAdt), name(std::move(n)), args(std::move(a)) {}
  std::string name;
  std::vector<Type> args;
};

struct TypeVarNode final : TypeNode {
  explicit TypeVarNode(std::string n) : TypeNode(TypeKind::kVar), name(std::move(n)) {}
  std::string name;
};

Type TensorTy(DType dtype, Shape shape);
Type TensorTy(const TensorType& type);
Type ScalarTy(DType dtype);  // Tensor[(), dtype]
Type TupleTy(std::vector<Type> fields);
Type RecordTy(std::vector<std::string> names, std::vector<Type> fields);
Type FuncTy(std::vector<Type> params, Type ret);
Type GenericFuncTy(std::vector<std::string> type_params, std::vector<Type> params, Type ret);
Type AdtTy(std::string name, std::vector<Type> args = {});
Type TypeVarTy(std::string name);

// Downcasts; null when the type is of another kind.
const TensorTypeNode* AsTensor(const Type& t);
const TupleTypeNode* AsTuple(const Type& t);
const FuncTypeNode* AsFunc(const Type& t);
const AdtTypeNode* AsAdt(const Type& t);
const TypeVarNode* AsTypeVar(const Type& t);

// Printed as in the text format: "Tensor[(?, 128), f32]", "(A, B)",
// "fn(A) -> B", "List[T]"; a generic definition's type "fn[A, B](A) -> B".
std::string TypeToString(const Type& t);

// Exactly the same type (`?` equals only `?`).
bool TypeEqual(const Type& a, const Type& b);
// A value of type `actual` may be passed where `expected` is wanted: equal up
// to unknown dimensions on either side (checked again at run time).
bool TypeCompatible(const Type& expected, const Type& actual);
// A tensor of type `got` may stand where `want` is declared: the same dtype
// and rank, and each dimension known on both sides equal. (Run-time checks of
// declared types: the interpreter's, partial evaluation's, the generic tier's.)
bool TensorTypeFits(const TensorType& want, const TensorType& got);
// Whether `t` names a type variable anywhere (a generic definition's
// annotations do; the types of values never), or, with `only`, one of those.
bool HasTypeVars(const Type& t, const std::vector<std::string>* only = nullptr);
// "[A, B]" for a generic definition's type parameters, "" for none.
std::string TypeParamsText(const std::vector<std::string>& params);
// Replaces type variables by their bindings.
Type SubstituteTypeVars(const Type& t, const std::map<std::string, Type>& bindings);

// One constructor of an algebraic data type.
struct CtorDef {
  std::string name;
  std::vector<Type> fields;  // may mention the TypeDef's params
};

// `type Tree { Leaf(Tensor[(), i64]), Node(Tree, Tree) }`
struct TypeDef {
  std::string name;
  std::vector<std::string> params;  // type parameters, e.g. {"T"} for List[T]
  std::vector<CtorDef> ctors;
  SourceLoc loc;

  // Index of the constructor named `ctor`, or -1.
  int FindCtor(const std::string& ctor) const;
};
using TypeDefPtr = std::shared_ptr<const TypeDef>;

// True when `t` is a tensor, or a tuple of such (nested): what compiled code returns.
bool IsTensorTree(const Type& t);
// Number of tensors in a tensor tree type.
size_t CountTensorLeaves(const Type& t);

}  // namespace pejit
