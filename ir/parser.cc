// Parser of the text format (docs/language.md).
//
// Design: the whole text is first split into tokens (so the parser can look
// ahead freely and every token carries its line and column), then a
// recursive-descent parser builds the IR directly, resolving names as it
// goes. A file is read in three passes over the tokens so that types and
// constructors may be used before they are declared:
//   0. collect the names (and parameter counts) of all `type` declarations;
//   1. parse every `type` declaration, which makes the constructors known;
//   2. parse the file in order, skipping the declarations already parsed.
// Let-chains are parsed with a loop rather than recursion, because generated
// programs can be thousands of bindings long.

#include "ir/parser.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "support/spelling.h"

namespace pejit {
namespace {

enum class Tok : uint8_t {
  kEof,
  kLower,     // identifiers not starting with a capital: keywords, operators, attributes, dtypes, `_`
  kUpper,     // types and constructors
  kVar,       // %name
  kGlobal,    // @name
  kNumber,    // 3, -2.5e3, 7i64
  kSpecial,   // inf, -inf, nan, -nan: only in tensor data and float attributes
  kLParen, kRParen, kLBracket, kRBracket, kLBrace, kRBrace,
  kComma, kSemi, kColon, kEq, kFatArrow, kArrow, kDot, kQuestion,
};

struct Token {
  Tok kind = Tok::kEof;
  std::string_view text;  // for kVar/kGlobal including the sigil
  int line = 0;
  int col = 0;
  int number_len = 0;     // kNumber: length of the text before the dtype suffix
};

bool IsIdentStart(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool IsIdentChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

class Lexer {
 public:
  Lexer(std::string_view text, std::shared_ptr<const std::string> file)
      : text_(text), file_(std::move(file)) {}

  std::vector<Token> Run() {
    std::vector<Token> tokens;
    for (;;) {
      SkipSpaceAndComments();
      Token t;
      t.line = line_;
      t.col = col_;
      if (pos_ >= text_.size()) {
        tokens.push_back(t);
        return tokens;
      }
      bool after_dot = !tokens.empty() && tokens.back().kind == Tok::kDot;
      size_t start = pos_;
      LexOne(t, after_dot);
      t.text = text_.substr(start, pos_ - start);
      tokens.push_back(t);
    }
  }

 private:
  std::string_view text_;
  std::shared_ptr<const std::string> file_;
  size_t pos_ = 0;
  int line_ = 1;
  int col_ = 1;

  char At(size_t i) const { return i < text_.size() ? text_[i] : '\0'; }

  void Advance() {
    char c = text_[pos_++];
    if (c == '\n') {
      ++line_;
      col_ = 1;
    } else if ((static_cast<unsigned char>(c) & 0xC0) != 0x80) {
      ++col_;  // UTF-8 continuation bytes (in comments) do not start a column
    }
  }

  [[noreturn]] void Fail(int line, int col, const std::string& message) const {
    throw IrError(SourceLoc{file_, line, col}, message);
  }

  void SkipSpaceAndComments() {
    while (pos_ < text_.size()) {
      char c = text_[pos_];
      if (c == '#') {
        while (pos_ < text_.size() && text_[pos_] != '\n') Advance();
      } else if (std::isspace(static_cast<unsigned char>(c))) {
        Advance();
      } else {
        return;
      }
    }
  }

  void SkipIdent() {
    while (IsIdentChar(At(pos_))) Advance();
  }

  // `inf` or `nan` as a whole word at `i`.
  bool SpecialWordAt(size_t i) const {
    std::string_view rest = text_.substr(std::min(i, text_.size()));
    return (rest.starts_with("inf") || rest.starts_with("nan")) && !IsIdentChar(At(i + 3));
  }

  void LexOne(Token& t, bool after_dot) {
    char c = text_[pos_];
    auto single = [&](Tok kind) {
      t.kind = kind;
      Advance();
    };
    switch (c) {
      case '(': return single(Tok::kLParen);
      case ')': return single(Tok::kRParen);
      case '[': return single(Tok::kLBracket);
      case ']': return single(Tok::kRBracket);
      case '{': return single(Tok::kLBrace);
      case '}': return single(Tok::kRBrace);
      case ',': return single(Tok::kComma);
      case ';': return single(Tok::kSemi);
      case ':': return single(Tok::kColon);
      case '.': return single(Tok::kDot);
      case '?': return single(Tok::kQuestion);
      default: break;
    }
    if (c == '=') {
      Advance();
      t.kind = Tok::kEq;
      if (At(pos_) == '>') {
        Advance();
        t.kind = Tok::kFatArrow;
      }
      return;
    }
    if (c == '%' || c == '@') {
      Advance();
      if (!IsIdentStart(At(pos_))) {
        Fail(t.line, t.col, std::string("expected a name after '") + c + "'");
      }
      SkipIdent();
      t.kind = c == '%' ? Tok::kVar : Tok::kGlobal;
      return;
    }
    if (c == '-' && At(pos_ + 1) == '>') {
      Advance();
      Advance();
      t.kind = Tok::kArrow;
      return;
    }
    if (c == '-' && SpecialWordAt(pos_ + 1)) {
      for (int i = 0; i < 4; ++i) Advance();
      t.kind = Tok::kSpecial;
      return;
    }
    if (IsDigit(c) || (c == '-' && IsDigit(At(pos_ + 1)))) return LexNumber(t, after_dot);
    if (IsIdentStart(c)) {
      bool special = SpecialWordAt(pos_);
      SkipIdent();
      bool upper = std::isupper(static_cast<unsigned char>(c));
      t.kind = special ? Tok::kSpecial : upper ? Tok::kUpper : Tok::kLower;
      return;
    }
    std::string shown = std::isprint(static_cast<unsigned char>(c)) ? std::string(1, c) : "\\x" + Hex(c);
    Fail(t.line, t.col, "unexpected character '" + shown + "'");
  }

  static std::string Hex(char c) {
    const char* digits = "0123456789abcdef";
    auto u = static_cast<unsigned char>(c);
    return {digits[u >> 4], digits[u & 15]};
  }

  void LexNumber(Token& t, bool after_dot) {
    size_t start = pos_;
    t.kind = Tok::kNumber;
    if (At(pos_) == '-') Advance();
    while (IsDigit(At(pos_))) Advance();
    // After `.` only a field index may follow: `%t.0.1` is two projections.
    if (!after_dot) {
      if (At(pos_) == '.' && IsDigit(At(pos_ + 1))) {
        Advance();
        while (IsDigit(At(pos_))) Advance();
      }
      bool sign = At(pos_ + 1) == '+' || At(pos_ + 1) == '-';
      if ((At(pos_) == 'e' || At(pos_) == 'E') && IsDigit(At(pos_ + (sign ? 2 : 1)))) {
        Advance();
        if (!IsDigit(At(pos_))) Advance();
        while (IsDigit(At(pos_))) Advance();
      }
    }
    t.number_len = static_cast<int>(pos_ - start);
    if (IsIdentChar(At(pos_))) {
      size_t suffix = pos_;
      SkipIdent();
      std::string_view s = text_.substr(suffix, pos_ - suffix);
      if (after_dot || (s != "f32" && s != "f64" && s != "i64")) {
        Fail(t.line, t.col, "bad number '" + std::string(text_.substr(start, pos_ - start)) +
                                "'" + (after_dot ? "" : " (a dtype suffix is f32, f64 or i64)"));
      }
    }
  }
};

std::string Describe(const Token& t) {
  return t.kind == Tok::kEof ? "end of input" : "'" + std::string(t.text) + "'";
}

bool IsKeyword(std::string_view w) {
  static const std::set<std::string_view> kKeywords = {"def", "type", "let", "fn", "if",
                                                       "else", "match", "true", "false", "tensor"};
  return kKeywords.contains(w);
}

std::string Plural(size_t n, const std::string& word) {
  return std::to_string(n) + " " + word + (n == 1 ? "" : "s");
}

class Parser {
 public:
  Parser(std::string_view text, const std::string& filename, const TypeLookup& lookup)
      : file_(std::make_shared<const std::string>(filename)), lookup_(lookup) {
    tokens_ = Lexer(text, file_).Run();
    for (const Token& t : tokens_) {
      if (t.kind == Tok::kUpper) capitalized_names_.emplace(t.text);
    }
  }

  ParsedProgram Program() {
    CollectTypeNames();
    ParsedProgram program;
    std::map<size_t, size_t> typedef_end;  // token index of `type` -> index after its `}`
    for (size_t start : typedef_starts_) {
      pos_ = start;
      program.types.push_back(ParseTypeDef());
      typedef_end[start] = pos_;
    }
    for (auto& [name, alias] : aliases_) {  // those no type used are checked too
      AliasType(name, Loc(tokens_[alias.start + 1]));
      typedef_end[alias.start] = alias.end;
    }
    pos_ = 0;
    std::map<std::string, SourceLoc> def_locs;
    while (!Is(Tok::kEof)) {
      if (IsWord("type") && typedef_end.contains(pos_)) {
        pos_ = typedef_end[pos_];
      } else if (IsWord("type")) {
        program.types.push_back(ParseTypeDef());
      } else if (IsWord("def")) {
        Token name = Peek(1);
        auto f = ParseFuncDef();
        std::string n = f.first;
        if (auto it = def_locs.find(n); it != def_locs.end()) {
          Fail(name, "duplicate definition of '@" + n + "'; first defined at " + it->second.ToString());
        }
        def_locs[n] = Loc(name);
        program.defs.push_back(std::move(f));
      } else {
        Fail(Peek(), "expected 'def' or 'type', got " + Describe(Peek()));
      }
    }
    return program;
  }

  Expr SingleExpr() {
    Expr e = ParseExpr();
    if (!Is(Tok::kEof)) Fail(Peek(), "expected end of input after the expression, got " + Describe(Peek()));
    return e;
  }

  Type SingleType() {
    Type t = ParseType();
    if (!Is(Tok::kEof)) Fail(Peek(), "expected end of input after the type, got " + Describe(Peek()));
    return t;
  }

 private:
  std::shared_ptr<const std::string> file_;
  const TypeLookup& lookup_;
  std::vector<Token> tokens_;
  size_t pos_ = 0;

  // Declared in this file: name -> number of type parameters.
  std::map<std::string, size_t> file_types_;
  // Type aliases of this file (`type Name[T] = type;`): sugar the parser
  // expands where it is used, so that a module holds no aliases and prints
  // its types whole. Parsed on first use, in any order; a cycle is an error.
  struct Alias {
    size_t start = 0, body = 0, end = 0;  // token indices: its `type`, its type, past its `;` (once parsed)
    std::vector<std::string> params;
    Type type;  // null until parsed
    bool parsing = false;
  };
  std::map<std::string, Alias, std::less<>> aliases_;
  std::vector<size_t> typedef_starts_;
  std::map<std::string, SourceLoc> parsed_type_locs_;
  struct CtorRef {
    TypeDefPtr adt;
    int tag;
    SourceLoc loc;
  };
  std::map<std::string, CtorRef> ctors_;
  // Types found through lookup_, whose constructors may then be used too.
  std::map<std::string, TypeDefPtr> external_types_;
  std::set<std::string> not_external_;
  std::set<std::string> capitalized_names_;
  // Parameters of the type declaration being parsed (a set: a scan per
  // parameter, and per reference to one, was quadratic).
  std::set<std::string, std::less<>> type_params_;
  // Variables in scope: in binding order (to leave scopes), and by name,
  // innermost last (long let-chains make a linear search quadratic).
  std::vector<Var> scope_;
  std::unordered_map<std::string, std::vector<Var>> in_scope_;

  // Expressions, types and patterns nest at most this deep: the parser and
  // the passes after it recurse on nesting (a let chain is a loop, so long
  // programs are not limited), and input must not decide the native stack.
  // 256 levels take ~2 MB of stack in an ASan build (1,000 overflowed its 8).
  static constexpr int kMaxNesting = 256;
  int nesting_ = 0;
  class Nested {
   public:
    explicit Nested(Parser& p) : p_(p) {
      if (++p_.nesting_ > kMaxNesting) {
        --p_.nesting_;
        p_.Fail(p_.Peek(), "nested deeper than " + std::to_string(kMaxNesting) + " levels");
      }
    }
    ~Nested() { --p_.nesting_; }
    Nested(const Nested&) = delete;
    Nested& operator=(const Nested&) = delete;

   private:
    Parser& p_;
  };

  void Bind(const Var& v) {
    scope_.push_back(v);
    in_scope_[v->name].push_back(v);
  }
  // Leaves the scopes entered since scope_ had `size` variables.
  void UnbindTo(size_t size) {
    while (scope_.size() > size) {
      in_scope_[scope_.back()->name].pop_back();
      scope_.pop_back();
    }
  }

  // ---- Tokens -----------------------------------------------------------------

  const Token& Peek(size_t ahead = 0) const {
    return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)];
  }
  Token Next() {
    Token t = Peek();
    if (pos_ < tokens_.size() - 1) ++pos_;
    return t;
  }
  bool Is(Tok kind) const { return Peek().kind == kind; }
  bool Accept(Tok kind) {
    if (!Is(kind)) return false;
    Next();
    return true;
  }
  bool IsWord(std::string_view w) const { return Peek().kind == Tok::kLower && Peek().text == w; }
  SourceLoc Loc(const Token& t) const { return SourceLoc{file_, t.line, t.col}; }

  [[noreturn]] void Fail(const Token& t, const std::string& message) const { throw IrError(Loc(t), message); }

  // `what` says what was expected and where: "')' after arguments".
  Token Expect(Tok kind, const std::string& what) {
    if (!Is(kind)) Fail(Peek(), "expected " + what + ", got " + Describe(Peek()));
    return Next();
  }
  Token ExpectWord(std::string_view w, const std::string& what) {
    if (!IsWord(w)) Fail(Peek(), "expected " + what + ", got " + Describe(Peek()));
    return Next();
  }

  // ---- Declarations -----------------------------------------------------------

  void CollectTypeNames() {
    int depth = 0;
    for (size_t i = 0; i + 1 < tokens_.size(); ++i) {
      const Token& t = tokens_[i];
      if (t.kind == Tok::kLBrace) ++depth;
      if (t.kind == Tok::kRBrace && depth > 0) --depth;
      bool starts_typedef = t.kind == Tok::kLower && t.text == "type" && tokens_[i + 1].kind == Tok::kUpper;
      if (depth != 0 || !starts_typedef) continue;
      size_t params = 0, after = i + 2;  // the token after the name and its parameters
      if (i + 2 < tokens_.size() && tokens_[i + 2].kind == Tok::kLBracket) {
        for (after = i + 3; after < tokens_.size() && tokens_[after].kind != Tok::kRBracket; ++after) {
          if (tokens_[after].kind == Tok::kUpper) ++params;
        }
        ++after;
      }
      if (after < tokens_.size() && tokens_[after].kind == Tok::kEq) {
        DeclareAlias(i);
        continue;
      }
      typedef_starts_.push_back(i);
      file_types_.emplace(std::string(tokens_[i + 1].text), params);
    }
  }

  // `[T, U]` after a declared type's name (or nothing), into type_params_ too.
  std::vector<std::string> ParseTypeParams() {
    type_params_.clear();
    std::vector<std::string> params;
    if (!Accept(Tok::kLBracket)) return params;
    do {
      Token p = Expect(Tok::kUpper, "a type parameter (starting with a capital)");
      std::string pn(p.text);
      if (!type_params_.insert(pn).second) Fail(p, "duplicate type parameter '" + pn + "'");
      params.push_back(pn);
    } while (Accept(Tok::kComma));
    Expect(Tok::kRBracket, "']' after type parameters");
    return params;
  }

  // `type Name[T, ...] = type;` at token `start`: its name and parameters
  // now, its type on first use (AliasType).
  void DeclareAlias(size_t start) {
    pos_ = start + 1;
    Token name = Next();
    std::string n(name.text);
    if (n == "Tensor") Fail(name, "'Tensor' is reserved");
    if (auto it = parsed_type_locs_.find(n); it != parsed_type_locs_.end()) {
      Fail(name, "duplicate type '" + n + "'; first defined at " + it->second.ToString());
    }
    parsed_type_locs_[n] = Loc(name);
    Alias alias;
    alias.start = start;
    alias.params = ParseTypeParams();
    type_params_.clear();
    Expect(Tok::kEq, "'='");
    alias.body = pos_;
    aliases_.emplace(n, std::move(alias));
  }

  // The type alias `name` stands for (with type variables for its
  // parameters), parsed on first use; `use` is where it was needed.
  const Type& AliasType(const std::string& name, const SourceLoc& use) {
    Alias& alias = aliases_.find(name)->second;
    if (alias.type) return alias.type;
    if (alias.parsing) throw IrError(use, "type alias '" + name + "' refers to itself");
    alias.parsing = true;
    size_t saved_pos = pos_;
    std::set<std::string, std::less<>> saved_params = std::move(type_params_);
    type_params_ = {alias.params.begin(), alias.params.end()};
    pos_ = alias.body;
    Type t = ParseType();
    Expect(Tok::kSemi, "';' after the type of alias " + name);
    alias.end = pos_;
    type_params_ = std::move(saved_params);
    pos_ = saved_pos;
    alias.parsing = false;
    alias.type = t;
    return alias.type;
  }

  TypeDefPtr ParseTypeDef() {
    ExpectWord("type", "'type'");
    Token name = Expect(Tok::kUpper, "a type name (starting with a capital) after 'type'");
    std::string n(name.text);
    if (n == "Tensor") Fail(name, "'Tensor' is reserved");
    if (auto it = parsed_type_locs_.find(n); it != parsed_type_locs_.end()) {
      Fail(name, "duplicate type '" + n + "'; first defined at " + it->second.ToString());
    }
    parsed_type_locs_[n] = Loc(name);
    auto def = std::make_shared<TypeDef>();
    def->name = n;
    def->loc = Loc(name);
    def->params = ParseTypeParams();
    Expect(Tok::kLBrace, "'{' before the constructors of " + n);
    do {  // at least one constructor; a trailing comma is allowed
      Token c = Expect(Tok::kUpper, "a constructor name (starting with a capital)");
      std::string cn(c.text);
      if (auto it = ctors_.find(cn); it != ctors_.end()) {
        Fail(c, "duplicate constructor '" + cn + "'; first defined at " + it->second.loc.ToString());
      }
      CtorDef ctor{cn, {}};
      if (Is(Tok::kLParen)) {
        Next();
        do {
          ctor.fields.push_back(ParseType());
        } while (Accept(Tok::kComma));
        Expect(Tok::kRParen, "')' after the fields of " + cn);
      }
      ctors_[cn] = CtorRef{def, static_cast<int>(def->ctors.size()), Loc(c)};
      def->ctors.push_back(std::move(ctor));
    } while (Accept(Tok::kComma) && !Is(Tok::kRBrace));
    Expect(Tok::kRBrace, "',' or '}' after a constructor");
    type_params_.clear();
    return def;
  }

  std::pair<std::string, Func> ParseFuncDef() {
    Token def = ExpectWord("def", "'def'");
    Token name = Expect(Tok::kGlobal, "a name like '@f' after 'def'");
    UnbindTo(0);
    std::vector<std::string> type_params = ParseTypeParams();  // `[A, B]` or nothing: named by the types below
    std::vector<Var> params = ParseParams(type_params.empty() ? "'(' or '[' after the function name"
                                                              : "'(' after the type parameters");
    Type ret;
    if (Is(Tok::kArrow)) {
      Next();
      ret = ParseType();
    }
    Expr body = ParseBlock("'{' to start the function body");
    type_params_.clear();
    UnbindTo(0);
    return {std::string(name.text.substr(1)),
            MakeFunc(std::move(params), std::move(body), ret, Loc(def), std::move(type_params))};
  }

  // "(%x: T, ...)"; leaves the parameters in scope.
  std::vector<Var> ParseParams(const std::string& open_what) {
    Expect(Tok::kLParen, open_what);
    std::vector<Var> params;
    std::unordered_set<std::string_view> names;  // a scan per parameter was quadratic (issue 24)
    if (!Is(Tok::kRParen)) {
      do {
        Token v = Expect(Tok::kVar, "a parameter like '%x: T'");
        if (!names.insert(v.text.substr(1)).second) Fail(v, "duplicate parameter '" + std::string(v.text) + "'");
        Expect(Tok::kColon, "':' and a type after parameter " + std::string(v.text));
        Type t = ParseType();
        params.push_back(MakeVar(std::string(v.text.substr(1)), std::move(t), Loc(v)));
      } while (Accept(Tok::kComma));
    }
    Expect(Tok::kRParen, "')' after parameters");
    for (const Var& p : params) Bind(p);
    return params;
  }

  // ---- Types ------------------------------------------------------------------

  Type ParseType() {
    Nested nested(*this);
    const Token& t = Peek();
    if (t.kind == Tok::kUpper && t.text == "Tensor") return ParseTensorType();
    if (t.kind == Tok::kUpper) return ParseNamedType();
    if (t.kind == Tok::kLParen) {
      Next();
      if (Is(Tok::kRParen)) {
        Next();
        return TupleTy({});
      }
      std::vector<Type> fields{ParseType()};
      bool trailing_comma = false;
      while (Is(Tok::kComma)) {
        Next();
        if (fields.size() == 1 && Is(Tok::kRParen)) {
          trailing_comma = true;
          break;
        }
        fields.push_back(ParseType());
      }
      Expect(Tok::kRParen, "',' or ')' in a tuple type");
      // `(T)` is T, as `(e)` is e; a one-field tuple is `(T,)`.
      if (fields.size() == 1 && !trailing_comma) return fields[0];
      return TupleTy(std::move(fields));
    }
    if (t.kind == Tok::kLBrace) return ParseRecordType();
    if (t.kind == Tok::kLower && t.text == "fn") {
      Next();
      Expect(Tok::kLParen, "'(' after 'fn'");
      std::vector<Type> params;
      if (!Is(Tok::kRParen)) {
        do {
          params.push_back(ParseType());
        } while (Accept(Tok::kComma));
      }
      Expect(Tok::kRParen, "')' after parameter types");
      Expect(Tok::kArrow, "'->' and a result type in a function type");
      Type ret = ParseType();
      return FuncTy(std::move(params), std::move(ret));
    }
    bool is_dtype = t.kind == Tok::kLower && ParseDType(t.text);
    std::string hint = is_dtype ? " (tensor types are written Tensor[(dims), dtype])" : "";
    Fail(t, "expected a type, got " + Describe(t) + hint);
  }

  // `{name: type, ...}`: at least one field, names distinct.
  Type ParseRecordType() {
    Next();
    std::vector<std::string> names;
    std::vector<Type> fields;
    do {
      if (Is(Tok::kRBrace) && !names.empty()) break;  // a trailing comma
      const Token& name = Peek();
      if (name.kind != Tok::kLower || name.text == "_") {
        Fail(name, "expected a field name in a record type, got " + Describe(name));
      }
      std::string n(name.text);
      if (std::find(names.begin(), names.end(), n) != names.end()) Fail(name, "record field '" + n + "' twice");
      Next();
      Expect(Tok::kColon, "':' and the type of field " + n);
      names.push_back(std::move(n));
      fields.push_back(ParseType());
    } while (Accept(Tok::kComma));
    Expect(Tok::kRBrace, "',' or '}' in a record type");
    return RecordTy(std::move(names), std::move(fields));
  }

  Type ParseTensorType() {
    Next();
    Expect(Tok::kLBracket, "'[' after 'Tensor'");
    Expect(Tok::kLParen, "'(' and the dimensions of the tensor");
    Shape shape;
    while (!Is(Tok::kRParen)) {
      if (Is(Tok::kQuestion)) {
        Next();
        shape.push_back(kUnknownDim);
      } else {
        shape.push_back(ParseDim());
      }
      if (!Is(Tok::kComma)) break;
      Next();
    }
    Expect(Tok::kRParen, "',' or ')' after a dimension");
    Expect(Tok::kComma, "',' and a dtype after the dimensions");
    DType dtype = ParseDTypeToken();
    Expect(Tok::kRBracket, "']' after the dtype");
    return TensorTy(dtype, std::move(shape));
  }

  // A non-negative integer without suffix: dimensions, shapes and indices.
  int64_t ParseDim() {
    const Token& t = Peek();
    if (t.kind != Tok::kNumber) Fail(t, "expected a dimension (an integer or '?'), got " + Describe(t));
    bool plain_integer = IsIntegerText(t) && t.number_len == static_cast<int>(t.text.size());
    if (!plain_integer || IntegerValue(t) < 0) {
      Fail(t, "bad dimension " + Describe(t) + ": expected a non-negative integer");
    }
    Next();
    return IntegerValue(t);
  }

  DType ParseDTypeToken() {
    const Token& t = Peek();
    if (t.kind == Tok::kLower) {
      if (auto d = ParseDType(t.text)) {
        Next();
        return *d;
      }
      std::string suggestion = DidYouMean(t.text, {"f32", "f64", "i64", "bool"});
      if (suggestion.empty()) suggestion = " (f32, f64, i64 or bool)";
      Fail(t, "unknown dtype " + Describe(t) + suggestion);
    }
    Fail(t, "expected a dtype (f32, f64, i64 or bool), got " + Describe(t));
  }

  Type ParseNamedType() {
    Token name = Next();
    std::string n(name.text);
    std::vector<Type> args;
    if (Is(Tok::kLBracket)) {
      Next();
      do {
        args.push_back(ParseType());
      } while (Accept(Tok::kComma));
      Expect(Tok::kRBracket, "',' or ']' after type arguments");
    }
    if (type_params_.count(n)) {
      if (!args.empty()) Fail(name, "type parameter '" + n + "' takes no type arguments");
      return TypeVarTy(n);
    }
    if (auto it = aliases_.find(n); it != aliases_.end()) {
      const std::vector<std::string>& params = it->second.params;
      if (params.size() != args.size()) {
        Fail(name, "type alias '" + n + "' takes " + Plural(params.size(), "type argument") + ", got " +
                       std::to_string(args.size()));
      }
      const Type& t = AliasType(n, Loc(name));
      if (params.empty()) return t;
      std::map<std::string, Type> bindings;
      for (size_t i = 0; i < params.size(); ++i) bindings[params[i]] = args[i];
      return SubstituteTypeVars(t, bindings);
    }
    std::optional<size_t> arity;
    if (auto it = file_types_.find(n); it != file_types_.end()) {
      arity = it->second;
    } else if (TypeDefPtr def = FindExternalType(n)) {
      arity = def->params.size();
    }
    if (!arity) {
      std::vector<std::string> candidates(type_params_.begin(), type_params_.end());
      for (const auto& [k, _] : file_types_) candidates.push_back(k);
      for (const auto& [k, _] : aliases_) candidates.push_back(k);
      for (const auto& [k, _] : external_types_) candidates.push_back(k);
      Fail(name, "unknown type '" + n + "'" + DidYouMean(n, candidates));
    }
    if (*arity != args.size()) {
      Fail(name, "type '" + n + "' takes " + Plural(*arity, "type argument") + ", got " +
                     std::to_string(args.size()));
    }
    return AdtTy(n, std::move(args));
  }

  TypeDefPtr FindExternalType(const std::string& name) {
    if (auto it = external_types_.find(name); it != external_types_.end()) return it->second;
    if (!lookup_ || file_types_.contains(name) || not_external_.contains(name)) return nullptr;
    TypeDefPtr def = lookup_(name);
    if (!def || def->name != name) {
      not_external_.insert(name);
      return nullptr;
    }
    external_types_[name] = def;
    return def;
  }

  // A constructor of this file, else one that `lookup_` knows by the
  // constructor's name, else one of a type from `lookup_` named in the text.
  CtorRef ResolveCtor(const Token& name) {
    std::string n(name.text);
    if (auto it = ctors_.find(n); it != ctors_.end()) return it->second;
    if (lookup_) {
      if (TypeDefPtr def = lookup_(n); def && def->FindCtor(n) >= 0) return {def, def->FindCtor(n), def->loc};
    }
    // A type is usually named (in a signature) before its constructors are
    // used, but need not be: try every capitalized name of the text.
    for (const std::string& type : capitalized_names_) FindExternalType(type);
    for (const auto& [_, def] : external_types_) {
      if (def->FindCtor(n) >= 0) return {def, def->FindCtor(n), def->loc};
    }
    std::vector<std::string> candidates;
    for (const auto& [k, _] : ctors_) candidates.push_back(k);
    for (const auto& [_, def] : external_types_) {
      for (const CtorDef& c : def->ctors) candidates.push_back(c.name);
    }
    Fail(name, "unknown constructor '" + n + "'" + DidYouMean(n, candidates));
  }

  void CheckCtorArity(const Token& name, const CtorRef& ctor, size_t given) {
    size_t want = ctor.adt->ctors[ctor.tag].fields.size();
    if (want != given) {
      Fail(name, "constructor '" + std::string(name.text) + "' takes " + Plural(want, "argument") + ", got " +
                     std::to_string(given));
    }
  }

  // ---- Expressions ------------------------------------------------------------

  Expr ParseBlock(const std::string& open_what) {
    Expect(Tok::kLBrace, open_what);
    Expr e = ParseExpr();
    Expect(Tok::kRBrace, "'}' at the end of the block");
    return e;
  }

  Expr ParseExpr() {
    Nested nested(*this);
    if (IsWord("let")) return ParseLetChain();
    if (IsWord("if")) return ParseIf();
    if (IsWord("match")) return ParseMatch();
    if (IsWord("fn")) return ParseFn();
    return ParsePostfix();
  }

  Expr ParseLetChain() {
    struct Binding {
      Var var;
      Expr value;
      SourceLoc loc;
    };
    std::vector<Binding> chain;
    size_t scope_size = scope_.size();
    while (IsWord("let")) {
      Token let = Next();
      Token v = Expect(Tok::kVar, "a variable like '%x' after 'let'");
      Type annotation;
      if (Is(Tok::kColon)) {
        Next();
        annotation = ParseType();
      }
      Expect(Tok::kEq, "'=' after 'let " + std::string(v.text) + "'");
      Expr value = ParseExpr();
      Expect(Tok::kSemi, "';' after the value of " + std::string(v.text));
      Var var = MakeVar(std::string(v.text.substr(1)), std::move(annotation), Loc(v));
      Bind(var);
      chain.push_back({var, std::move(value), Loc(let)});
    }
    Expr body = ParseExpr();
    UnbindTo(scope_size);
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
      body = MakeLet(std::move(it->var), std::move(it->value), std::move(body), std::move(it->loc));
    }
    return body;
  }

  Expr ParseIf() {
    Token kw = Next();
    Expect(Tok::kLParen, "'(' after 'if'");
    Expr cond = ParseExpr();
    Expect(Tok::kRParen, "')' after the condition");
    Expr then_branch = ParseBlock("'{' after the condition of 'if'");
    ExpectWord("else", "'else' after the block of 'if'");
    Expr else_branch = ParseBlock("'{' after 'else'");
    return MakeIf(std::move(cond), std::move(then_branch), std::move(else_branch), Loc(kw));
  }

  Expr ParseMatch() {
    Token kw = Next();
    Expect(Tok::kLParen, "'(' after 'match'");
    Expr scrutinee = ParseExpr();
    Expect(Tok::kRParen, "')' after the value matched");
    Expect(Tok::kLBrace, "'{' before the clauses of 'match'");
    std::vector<Clause> clauses;
    do {  // at least one clause; a trailing comma is allowed
      size_t scope_size = scope_.size();
      std::vector<Var> bound;
      Pattern pattern = ParsePattern(bound);
      for (const Var& v : bound) Bind(v);
      Expect(Tok::kFatArrow, "'=>' after the pattern");
      Expr body = ParseExpr();
      UnbindTo(scope_size);
      clauses.push_back({std::move(pattern), std::move(body)});
    } while (Accept(Tok::kComma) && !Is(Tok::kRBrace));
    Expect(Tok::kRBrace, "',' or '}' after a match clause");
    return MakeMatch(std::move(scrutinee), std::move(clauses), Loc(kw));
  }

  Pattern ParsePattern(std::vector<Var>& bound) {
    Nested nested(*this);
    Token t = Peek();
    auto p = std::make_shared<PatternNode>();
    p->loc = Loc(t);
    if (t.kind == Tok::kLower && t.text == "_") {
      Next();
      p->kind = PatternKind::kWildcard;
      return p;
    }
    if (t.kind == Tok::kVar) {
      Next();
      std::string n(t.text.substr(1));
      for (const Var& v : bound) {
        if (v->name == n) Fail(t, "variable '" + std::string(t.text) + "' is bound twice in one pattern");
      }
      p->kind = PatternKind::kVar;
      p->var = MakeVar(n, nullptr, Loc(t));
      bound.push_back(p->var);
      return p;
    }
    if (t.kind == Tok::kUpper) {
      Next();
      CtorRef ctor = ResolveCtor(t);
      p->kind = PatternKind::kCtor;
      p->adt = ctor.adt;
      p->tag = ctor.tag;
      if (Is(Tok::kLParen)) {
        Next();
        do {
          p->fields.push_back(ParsePattern(bound));
        } while (Accept(Tok::kComma));
        Expect(Tok::kRParen, "',' or ')' after a pattern");
      }
      CheckCtorArity(t, ctor, p->fields.size());
      return p;
    }
    if (t.kind == Tok::kLParen) {
      Next();
      p->kind = PatternKind::kTuple;
      if (Is(Tok::kRParen)) {
        Next();
        return p;
      }
      p->fields.push_back(ParsePattern(bound));
      bool trailing_comma = false;
      while (Is(Tok::kComma)) {
        Next();
        if (p->fields.size() == 1 && Is(Tok::kRParen)) {
          trailing_comma = true;
          break;
        }
        p->fields.push_back(ParsePattern(bound));
      }
      Expect(Tok::kRParen, "',' or ')' in a tuple pattern");
      if (p->fields.size() == 1 && !trailing_comma) return p->fields[0];
      return p;
    }
    Fail(t, "expected a pattern, got " + Describe(t));
  }

  Expr ParseFn() {
    Token kw = Next();
    size_t scope_size = scope_.size();
    std::vector<Var> params = ParseParams("'(' after 'fn'");
    Type ret;
    if (Is(Tok::kArrow)) {
      Next();
      ret = ParseType();
    }
    Expr body = ParseBlock("'{' to start the function body");
    UnbindTo(scope_size);
    return MakeFunc(std::move(params), std::move(body), std::move(ret), Loc(kw));
  }

  // Comma-separated expressions up to `)`; the `(` is already consumed.
  std::vector<Expr> ParseArgs(bool allow_empty) {
    std::vector<Expr> args;
    if (allow_empty && Is(Tok::kRParen)) {
      Next();
      return args;
    }
    for (;;) {
      args.push_back(ParseExpr());
      if (!Is(Tok::kComma)) break;
      Next();
    }
    Expect(Tok::kRParen, "')' after arguments");
    return args;
  }

  Expr ParsePostfix() {
    Token start = Peek();
    Expr e = ParsePrimary();
    for (;;) {
      if (Is(Tok::kLParen)) {
        Next();
        e = MakeCall(std::move(e), ParseArgs(true), Loc(start));
      } else if (Is(Tok::kDot)) {
        Token dot = Next();
        const Token& index = Peek();
        if (index.kind == Tok::kLower && index.text != "_") {
          e = MakeField(std::move(e), std::string(index.text), Loc(dot));
          Next();
          continue;
        }
        if (index.kind != Tok::kNumber) {
          Fail(index, "expected a field index or name after '.', got " + Describe(index));
        }
        int64_t i = IntegerValue(index);
        if (i < 0 || i > INT32_MAX) Fail(index, "bad field index " + Describe(index));
        Next();
        e = MakeProj(std::move(e), static_cast<int>(i), Loc(dot));
      } else {
        return e;
      }
    }
  }

  Expr ParsePrimary() {
    Token t = Peek();
    switch (t.kind) {
      case Tok::kVar: {
        Next();
        std::string n(t.text.substr(1));
        if (auto it = in_scope_.find(n); it != in_scope_.end() && !it->second.empty()) {
          return it->second.back();
        }
        std::vector<std::string> candidates;  // in binding order, so ties go to the outermost
        for (const Var& v : scope_) candidates.push_back("%" + v->name);
        Fail(t, "unknown variable '" + std::string(t.text) + "'" + DidYouMean(t.text, candidates));
      }
      case Tok::kGlobal:
        Next();
        return MakeGlobal(std::string(t.text.substr(1)), Loc(t));
      case Tok::kNumber:
        Next();
        return Suffix(t).empty() ? MakeLiteral(ScalarLiteral(t), Retypes(t), Loc(t)) : MakeConstant(ScalarLiteral(t), Loc(t));
      case Tok::kUpper:
        if (t.text == "Tensor") Fail(t, "expected an expression, got 'Tensor' (a type)");
        return ParseCtor();
      case Tok::kLParen: return ParseParenthesized();
      case Tok::kLBrace: return ParseBlock("'{'");
      case Tok::kLower:
        if (t.text == "true" || t.text == "false") {
          Next();
          return MakeConstant(BoolScalar(t.text == "true"), Loc(t));
        }
        if (t.text == "tensor" && Peek(1).kind == Tok::kLParen) return ParseTensorLiteral();
        if (!IsKeyword(t.text) && Peek(1).kind == Tok::kLParen) return ParseOpCall();
        if (FindOp(t.text)) {
          Fail(Peek(1), "expected '(' after operator " + Describe(t) + ", got " + Describe(Peek(1)));
        }
        break;
      case Tok::kSpecial:
        Fail(t, "expected an expression, got " + Describe(t) + " (write e.g. tensor(f32, (), [" +
                    std::string(t.text) + "]))");
      default: break;
    }
    Fail(t, "expected an expression, got " + Describe(t));
  }

  Expr ParseParenthesized() {
    Token open = Next();
    if (Is(Tok::kRParen)) {
      Next();
      return MakeTuple({}, Loc(open));
    }
    std::vector<Expr> fields{ParseExpr()};
    bool trailing_comma = false;
    while (Is(Tok::kComma)) {
      Next();
      if (fields.size() == 1 && Is(Tok::kRParen)) {
        trailing_comma = true;
        break;
      }
      fields.push_back(ParseExpr());
    }
    Expect(Tok::kRParen, fields.size() == 1 && !trailing_comma ? "')'" : "',' or ')' in a tuple");
    if (fields.size() == 1 && !trailing_comma) return fields[0];
    return MakeTuple(std::move(fields), Loc(open));
  }

  Expr ParseCtor() {
    Token name = Next();
    CtorRef ctor = ResolveCtor(name);
    std::vector<Expr> args;
    if (Is(Tok::kLParen)) {
      Next();
      args = ParseArgs(false);
    }
    CheckCtorArity(name, ctor, args.size());
    return std::make_shared<CtorNode>(ctor.adt, ctor.tag, std::move(args), Loc(name));
  }

  Expr ParseOpCall() {
    Token name = Next();
    const OpDef* op = FindOp(name.text);
    if (!op) {
      std::vector<std::string> names;
      for (const OpDef* o : AllOps()) names.push_back(o->name);
      Fail(name, "unknown operator " + Describe(name) + DidYouMean(name.text, names));
    }
    Next();  // (
    std::vector<Expr> args;
    Attrs attrs;
    bool in_attrs = false;
    if (!Is(Tok::kRParen)) {
      for (;;) {
        if (Is(Tok::kLower) && Peek(1).kind == Tok::kEq) {
          Token attr = Next();
          Next();  // =
          std::string n(attr.text);
          if (attrs.Find(n)) Fail(attr, "duplicate attribute '" + n + "'");
          attrs.Set(n, ParseAttrValue());
          in_attrs = true;
        } else {
          if (in_attrs) Fail(Peek(), "operator inputs must come before attributes");
          args.push_back(ParseExpr());
        }
        if (!Is(Tok::kComma)) break;
        Next();
      }
    }
    Expect(Tok::kRParen, "')' after arguments");
    Attrs normalized;
    try {
      normalized = NormalizeAttrs(*op, attrs);
    } catch (const OpError& e) {
      Fail(name, e.what());
    }
    return std::make_shared<OpCallNode>(op, std::move(args), std::move(normalized), Loc(name));
  }

  AttrValue ParseAttrValue() {
    Token t = Peek();
    if (t.kind == Tok::kNumber) {
      Next();
      if (t.number_len != static_cast<int>(t.text.size())) {
        Fail(t, "attribute values take no dtype suffix: " + Describe(t));
      }
      if (IsIntegerText(t)) return IntegerValue(t);
      return FloatValue<double>(t);
    }
    if (t.kind == Tok::kSpecial) {
      Next();
      return FloatValue<double>(t);
    }
    if (t.kind == Tok::kLower) {
      if (t.text == "true" || t.text == "false") {
        Next();
        return t.text == "true";
      }
      if (auto d = ParseDType(t.text)) {
        Next();
        return *d;
      }
    }
    if (t.kind == Tok::kLBracket) {
      Next();
      std::vector<int64_t> values;
      while (!Is(Tok::kRBracket)) {
        const Token& v = Peek();
        if (v.kind != Tok::kNumber || !IsIntegerText(v) || v.number_len != static_cast<int>(v.text.size())) {
          Fail(v, "expected an integer in an attribute list, got " + Describe(v));
        }
        values.push_back(IntegerValue(v));
        Next();
        if (!Is(Tok::kComma)) break;
        Next();
      }
      Expect(Tok::kRBracket, "',' or ']' in an attribute list");
      return values;
    }
    Fail(t, "expected an attribute value (a number, true, false, a dtype or [integers]), got " + Describe(t));
  }

  // ---- Numbers and constants --------------------------------------------------

  static bool IsIntegerText(const Token& t) {
    return t.text.substr(0, t.number_len).find_first_of(".eE") == std::string_view::npos;
  }
  static std::string_view Suffix(const Token& t) { return t.text.substr(t.number_len); }

  int64_t IntegerValue(const Token& t) const {
    if (!IsIntegerText(t)) Fail(t, "expected an integer, got " + Describe(t));
    std::string body(t.text.substr(0, t.number_len));
    errno = 0;
    char* end = nullptr;
    long long v = std::strtoll(body.c_str(), &end, 10);
    if (errno == ERANGE) Fail(t, "integer " + Describe(t) + " is out of range for i64");
    return v;
  }

  template <typename T>
  T FloatValue(const Token& t) const {
    std::string body(t.kind == Tok::kNumber ? t.text.substr(0, t.number_len) : t.text);
    char* end = nullptr;
    T v;
    if constexpr (std::is_same_v<T, float>) {
      v = std::strtof(body.c_str(), &end);
    } else {
      v = std::strtod(body.c_str(), &end);
    }
    // Underflow to a subnormal is fine (they print and parse back exactly); overflow is not.
    if (std::isinf(v) && t.kind == Tok::kNumber) {
      Fail(t, "number " + Describe(t) + " is out of range for " + (sizeof(T) == 4 ? "f32" : "f64"));
    }
    return v;
  }

  static Tensor BoolScalar(bool b) {
    Tensor t = Tensor::Empty(DType::kBool, {});
    *t.data<bool>() = b;
    return t;
  }

  Tensor ScalarLiteral(const Token& t) const {
    std::string_view suffix = Suffix(t);
    DType dtype = !suffix.empty() ? *ParseDType(suffix) : IsIntegerText(t) ? DType::kI64 : DType::kF32;
    Tensor out = Tensor::Empty(dtype, {});
    StoreNumber(t, out, 0);
    return out;
  }

  // An unsuffixed number in the other dtypes that hold it exactly: an
  // integer as f32 (when it is within 2^24 of 0) and f64 (within 2^53), a
  // fraction as f64 (read from its text, not widened from the f32).
  std::vector<Tensor> Retypes(const Token& t) const {
    std::vector<Tensor> out;
    if (IsIntegerText(t)) {
      int64_t v = IntegerValue(t);
      if (std::abs(static_cast<double>(v)) <= 16777216.0) out.push_back(Tensor::ScalarOf(DType::kF32, static_cast<double>(v)));
      if (std::abs(static_cast<double>(v)) <= 9007199254740992.0) out.push_back(Tensor::ScalarOf(DType::kF64, static_cast<double>(v)));
    } else {
      Tensor d = Tensor::Empty(DType::kF64, {});
      d.data<double>()[0] = FloatValue<double>(t);
      out.push_back(d);
    }
    return out;
  }

  // Writes the number token `t` as element `i` of `out` (of out's dtype).
  void StoreNumber(const Token& t, Tensor& out, int64_t i) const {
    DType dtype = out.dtype();
    if (t.kind == Tok::kNumber && !Suffix(t).empty() && *ParseDType(Suffix(t)) != dtype) {
      Fail(t, "number " + Describe(t) + " in a " + std::string(DTypeName(dtype)) + " tensor");
    }
    switch (dtype) {
      case DType::kF32: out.data<float>()[i] = FloatValue<float>(t); break;
      case DType::kF64: out.data<double>()[i] = FloatValue<double>(t); break;
      case DType::kI64:
        if (t.kind != Tok::kNumber || !IsIntegerText(t)) {
          Fail(t, "an i64 number must be an integer, got " + Describe(t));
        }
        out.data<int64_t>()[i] = IntegerValue(t);
        break;
      case DType::kBool: {
        int64_t v = t.kind == Tok::kNumber && IsIntegerText(t) ? IntegerValue(t) : -1;
        if (v != 0 && v != 1) Fail(t, "expected true, false, 0 or 1 in a bool tensor, got " + Describe(t));
        out.data<bool>()[i] = v == 1;
        break;
      }
    }
  }

  Expr ParseTensorLiteral() {
    Token kw = Next();
    Next();  // (
    DType dtype = ParseDTypeToken();
    Expect(Tok::kComma, "',' and a shape after the dtype");
    Expect(Tok::kLParen, "'(' to start the shape");
    Shape shape;
    while (!Is(Tok::kRParen)) {
      shape.push_back(ParseDim());
      if (!Is(Tok::kComma)) break;
      Next();
    }
    Expect(Tok::kRParen, "',' or ')' in the shape");
    Expect(Tok::kComma, "',' and the data after the shape");
    Token open = Expect(Tok::kLBracket, "'[' to start the data");
    std::vector<Token> values;
    while (!Is(Tok::kRBracket)) {
      const Token& v = Peek();
      bool is_bool_word = v.kind == Tok::kLower && (v.text == "true" || v.text == "false");
      if (v.kind != Tok::kNumber && v.kind != Tok::kSpecial && !is_bool_word) {
        Fail(v, "expected a number, got " + Describe(v));
      }
      values.push_back(Next());
      if (!Is(Tok::kComma)) break;
      Next();
    }
    Expect(Tok::kRBracket, "',' or ']' in the data");
    Expect(Tok::kRParen, "')' after the data");
    int64_t count = 1;
    for (int64_t d : shape) {
      if (d != 0 && count > INT64_MAX / d) Fail(kw, "tensor shape " + ShapeToString(shape) + " is too large");
      count *= d;
    }
    if (count != static_cast<int64_t>(values.size())) {
      Fail(open, "a tensor of shape " + ShapeToString(shape) + " needs " + Plural(count, "value") + ", got " +
                     std::to_string(values.size()));
    }
    Tensor out = Tensor::Empty(dtype, shape);
    for (size_t i = 0; i < values.size(); ++i) {
      const Token& v = values[i];
      if ((v.kind == Tok::kLower && dtype != DType::kBool) || (v.kind == Tok::kSpecial && !IsFloat(dtype))) {
        Fail(v, Describe(v) + " in a " + std::string(DTypeName(dtype)) + " tensor");
      }
      if (v.kind == Tok::kLower) {
        out.data<bool>()[i] = v.text == "true";
      } else {
        StoreNumber(v, out, static_cast<int64_t>(i));
      }
    }
    return MakeConstant(std::move(out), Loc(kw));
  }
};

}  // namespace

ParsedProgram ParseProgram(std::string_view text, const std::string& filename, const TypeLookup& lookup) {
  return Parser(text, filename, lookup).Program();
}

Expr ParseExpr(std::string_view text, const TypeLookup& lookup) {
  return Parser(text, "<input>", lookup).SingleExpr();
}

Type ParseType(std::string_view text, const TypeLookup& lookup) {
  return Parser(text, "<input>", lookup).SingleType();
}

}  // namespace pejit
