#include "einsum_equation.h"

#include <algorithm>

#include "pto/error.h"

namespace pto::einsum {
namespace {

int letter_label(char ch) {
  if (ch >= 'a' && ch <= 'z') return ch - 'a';
  if (ch >= 'A' && ch <= 'Z') return 26 + (ch - 'A');
  return -1;
}

// One side's subscripts: letters, with at most one ellipsis at position `ellipsis_at`.
struct Term {
  std::vector<int> letters;
  int ellipsis_at = -1;  // index into letters where "..." sits, -1 if none
};

Term parse_term(const std::string& s, const std::string& where) {
  Term t;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '.') {
      if (s.compare(i, 3, "...") != 0 || t.ellipsis_at >= 0)
        throw ValueError(cat(where, ": malformed ellipsis in einsum term '", s, "'"));
      t.ellipsis_at = static_cast<int>(t.letters.size());
      i += 2;
      continue;
    }
    int l = letter_label(s[i]);
    if (l < 0) throw ValueError(cat(where, ": invalid einsum subscript '", s[i], "'"));
    t.letters.push_back(l);
  }
  return t;
}

}  // namespace

Equation parse(const std::string& eq_in, const std::vector<int64_t>& ranks,
               const std::string& where) {
  std::string eq;
  for (char ch : eq_in)
    if (ch != ' ' && ch != '\t') eq += ch;
  const size_t arrow = eq.find("->");
  const std::string lhs = eq.substr(0, arrow);
  std::vector<Term> terms;
  size_t start = 0;
  while (true) {
    size_t comma = lhs.find(',', start);
    terms.push_back(parse_term(lhs.substr(start, comma - start), where));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (terms.size() != ranks.size())
    throw ValueError(cat(where, ": equation '", eq_in, "' has ", terms.size(),
                         " input terms but there are ", ranks.size(), " inputs"));

  // The ellipsis length of each operand, and the longest.
  int64_t max_ell = 0;
  std::vector<int64_t> ell(terms.size(), 0);
  for (size_t i = 0; i < terms.size(); ++i) {
    const int64_t nl = static_cast<int64_t>(terms[i].letters.size());
    if (terms[i].ellipsis_at < 0 ? ranks[i] != nl : ranks[i] < nl)
      throw ValueError(cat(where, ": einsum term ", i, " has ", nl, " subscripts",
                           terms[i].ellipsis_at >= 0 ? " and an ellipsis" : "",
                           " but the operand has rank ", ranks[i]));
    ell[i] = ranks[i] - nl;
    max_ell = std::max(max_ell, ell[i]);
  }
  if (max_ell > kMaxLabels - kEllipsisBase)
    throw ValueError(cat(where, ": too many broadcast dimensions"));

  Equation e;
  std::vector<int> count(kMaxLabels, 0);
  for (size_t i = 0; i < terms.size(); ++i) {
    std::vector<int> labels;
    for (size_t j = 0; j <= terms[i].letters.size(); ++j) {
      if (static_cast<int>(j) == terms[i].ellipsis_at)
        for (int64_t k = 0; k < ell[i]; ++k)
          labels.push_back(kEllipsisBase + static_cast<int>(max_ell - ell[i] + k));
      if (j < terms[i].letters.size()) labels.push_back(terms[i].letters[j]);
    }
    for (int l : labels) ++count[l];
    e.inputs.push_back(std::move(labels));
  }

  if (arrow != std::string::npos) {
    Term out = parse_term(eq.substr(arrow + 2), where);
    for (size_t j = 0; j <= out.letters.size(); ++j) {
      if (static_cast<int>(j) == out.ellipsis_at)
        for (int64_t k = 0; k < max_ell; ++k)
          e.output.push_back(kEllipsisBase + static_cast<int>(k));
      if (j < out.letters.size()) e.output.push_back(out.letters[j]);
    }
    std::vector<bool> seen(kMaxLabels, false);
    for (int l : e.output) {
      if (l < kEllipsisBase && count[l] == 0)
        throw ValueError(cat(where, ": output subscript of '", eq_in, "' is in no input"));
      if (seen[l]) throw ValueError(cat(where, ": repeated output subscript in '", eq_in, "'"));
      seen[l] = true;
    }
  } else {
    // Implicit output: the broadcast dims, then labels used exactly once, in ASCII order
    // (uppercase before lowercase).
    for (int64_t k = 0; k < max_ell; ++k) e.output.push_back(kEllipsisBase + static_cast<int>(k));
    for (int l = 26; l < 52; ++l)
      if (count[l] == 1) e.output.push_back(l);
    for (int l = 0; l < 26; ++l)
      if (count[l] == 1) e.output.push_back(l);
  }
  return e;
}

std::vector<int64_t> label_sizes(const Equation& e, const std::vector<Dims>& shapes,
                                 const std::string& where) {
  std::vector<int64_t> size(kMaxLabels, -1);
  for (size_t i = 0; i < e.inputs.size(); ++i) {
    PTO_CHECK(shapes[i].size() == e.inputs[i].size()) << "einsum rank mismatch";
    for (size_t j = 0; j < shapes[i].size(); ++j) {
      int64_t& s = size[e.inputs[i][j]];
      const int64_t d = shapes[i][j];
      if (s < 0 || s == 1)
        s = d;
      else if (d != s && d != 1)
        throw ValueError(cat(where, ": einsum dimension of size ", d, " in operand ", i,
                             " does not match size ", s, " of the same subscript"));
    }
  }
  // Output-only broadcast dims (possible only through an ellipsis) have size 1.
  for (int l : e.output)
    if (size[l] < 0) size[l] = 1;
  return size;
}

}  // namespace pto::einsum
