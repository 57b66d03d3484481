"""A final answer as a pretrained model writes it, reduced to the answer itself.

    "The answer is $\\boxed{10081}$."   ->  "10081"
    "**Final Answer:** \\(\\dfrac{1}{2}\\)" ->  "1/2"
    "$$1.0081 \\times 10^{4}$$"         ->  "1.0081 * 10^(4)"
    "\\boxed{347 \\times 29 + 18}"      ->  "347 * 29 + 18"    (then refused: a computation)

Instruct models (SmolLM2, Qwen, Llama) write the final answer the way their math data does:
LaTeX, `\\boxed{}`, markdown bold, a lead phrase, a sentence's period. `answer_text` peels those
wrappers from the outside in, each kind at most once, and rewrites the little LaTeX an answer
needs (`\\frac`, `\\sqrt`, `\\cdot`, `\\times`, `^{...}`, `{,}`, `\\,`, `\\%`, `\\left(`) into the
plain grammar of `math_verify`; every rule that refuses an answer (final form, lowest terms,
strict thousands grouping, hedges, the question restated) then runs on what remains. Nothing
here decides *whether* an answer is right, only *which text* is the answer, and the rules for
that are strict on purpose (docs/verifiers.md, "Answers as real models write them"):

    exactly one box, around the whole answer   `\\boxed{5}, \\boxed{6}`, `\\boxed{\\boxed{5}}`,
                                               `x = \\boxed{5}` are refused, not searched
    a lead phrase only at the start            "The answer is 5 or 6" leaves "5 or 6": refused
    LaTeX the grammar cannot read is refused   `\\pm`, `\\approx`, `\\overline`, `\\sqrt[3]`, ...
    digits inside `\\text{}` only as the whole answer   (`1\\text{0081}` is refused)

Linear time on any input (policies send megabyte answers): the length is checked first, the lead
phrase is read as at most ten tokens, braces are matched once with a stack, each character is
converted once, and no regex has two quantifiers that can share a run of characters.
"""

from __future__ import annotations

import re

MAX_WRAPPED_CHARS = 256  # an answer with its wrappers; what remains is capped again (math_verify.MAX_CHARS)
_MAX_DEPTH = 8  # braces nested deeper than this are not an answer (and would deepen the recursion)

# "So", "Therefore,", "The final answer is:", "**Answer:**", at the start only, once. Read as
# tokens, not with one regex: optional whitespace runs side by side ("so  ,  answer") make a
# regex backtrack polynomially (a 256-character "**so   ...x" took seconds).
_LEAD_TOKEN = re.compile(r"[ \t\n]*(\*\*|[A-Za-z]+(?![A-Za-z0-9])|[,:])")
_CONNECTIVES = frozenset({"so", "therefore", "thus", "hence"})
_LEAD_TOKENS = 10  # the longest lead: "** therefore , the final answer is : ** :"
_DELIMITERS = (("$$", "$$"), ("\\[", "\\]"), ("\\(", "\\)"), ("$", "$"))
_BOX = re.compile(r"\\(?:boxed|fbox)[ \t]*\{")
_TEXT = re.compile(r"\\(?:text|textrm|textbf|mathrm|mathbf|mbox)[ \t]*\{")
_TEXT_NAMES = frozenset({"text", "textrm", "textbf", "mathrm", "mathbf", "mbox"})
_NEEDS_WORK = re.compile(r"[\\${}*]|\.\s*$|^\s*[A-Za-z]")  # anything else is already plain: the fast path

_CONTROL = re.compile(r"\\([A-Za-z]+|.)", re.DOTALL)  # a control word (\frac) or symbol (\,)
_PLAIN_RUN = re.compile(r"[^\\{}^]+")
_DEGREE = re.compile(r"\^[ \t]*(?:\\circ|\{[ \t]*\\circ[ \t]*\})")
_SIGNED_INT, _UNSIGNED_INT = re.compile(r"[-+]?[0-9]+"), re.compile(r"[0-9]+")
_DIGIT = re.compile(r"[0-9]")
_SYMBOLS = {
    "cdot": "*",
    "times": "*",
    "div": "/",
    "pi": "pi",
    "ln": "ln",
    "log": "log",
    "displaystyle": "",
    ",": " ",
    ";": " ",
    ":": " ",
    " ": " ",
    "%": "%",
    "$": "$",
}


def answer_text(text: str, max_chars: int = MAX_WRAPPED_CHARS) -> str:
    """The answer inside a model's wrappers, in the plain grammar of `math_verify`.
    Raises ValueError(reason) for what cannot be read as one answer (too long, unbalanced braces,
    several boxes, LaTeX outside the small set an answer needs)."""
    s = text.strip()
    if len(s) > max_chars:
        raise ValueError(f"too long: {len(s)} chars > {max_chars}")
    if not _NEEDS_WORK.search(s):
        return s
    return latex_to_plain(_peel(s))


def _peel(s: str) -> str:
    """Wrappers from the outside in, each kind at most once (so at most six peels): a lead phrase
    (only before any delimiter or box), markdown bold, one trailing period, math delimiters,
    one box, one `\\text{}` around the whole answer."""
    used: set[str] = set()
    while True:
        for kind, peel in _PEELS:
            if kind in used or (kind == "lead" and used & {"delimiters", "box", "text"}):
                continue
            inner = peel(s)
            if inner is not None:
                used.add(kind)
                s = inner
                break
        else:
            return s


def _peel_lead(s: str) -> str | None:
    """[**] [so|therefore|thus|hence [,]] [[the] [final] answer [is]] [:] [** [:]], with a
    connective or the answer phrase present, and the bold closed if it was opened."""
    tokens, ends, pos = [], [], 0
    while len(tokens) < _LEAD_TOKENS and (m := _LEAD_TOKEN.match(s, pos)):
        tokens.append(m.group(1).lower())
        ends.append(pos := m.end())
    tokens.append(None)  # a sentinel: tokens[i] is always defined below
    bold = tokens[0] == "**"
    i = int(bold)
    found = tokens[i] in _CONNECTIVES
    if found:
        i += 2 if tokens[i + 1] == "," else 1
    j = i + (tokens[i] == "the")
    j += tokens[j] == "final"
    if tokens[j] == "answer":
        found, i = True, j + 1 + (tokens[j + 1] == "is")
    i += tokens[i] == ":"
    if bold:
        if tokens[i] != "**":
            return None
        i += 1 + (tokens[i + 1] == ":")
    return s[ends[i - 1] :].strip() if found else None


def _peel_bold(s: str) -> str | None:
    inner = s[2:-2].strip()
    if len(s) > 4 and s.startswith("**") and s.endswith("**") and inner and "*" not in (inner[0], inner[-1]):
        return inner
    return None


def _peel_period(s: str) -> str | None:
    """One sentence-ending period: `10081.` `$\\frac{1}{2}$.` (not `10081..` nor `10081. .`: two
    periods, whatever the spacing between them, found by the reward fuzzer)."""
    inner = s[:-1].rstrip()
    return inner if len(s) > 1 and s[-1] == "." and inner and inner[-1] != "." else None


def _peel_delimiters(s: str) -> str | None:
    for open_, close in _DELIMITERS:
        if len(s) > len(open_) + len(close) and s.startswith(open_) and s.endswith(close):
            inner = s[len(open_) : -len(close)]
            if "$" in open_ and "$" in inner or "\\" in open_ and (open_ in inner or close in inner):
                return None  # "$5$ or $6$": two formulas, not one
            return inner.strip()
    return None


def _peel_group(s: str, opening: re.Pattern) -> str | None:
    """The body of `\\cmd{...}` when that group is the whole text, else None."""
    m = opening.match(s)
    if m is None:
        return None
    pairs = _brace_pairs(s)
    return s[m.end() : -1].strip() if pairs[m.end() - 1] == len(s) - 1 else None


def _peel_box(s: str) -> str | None:
    return _peel_group(s, _BOX)


def _peel_text(s: str) -> str | None:
    inner = _peel_group(s, _TEXT)
    return inner if inner is not None and not any(c in inner for c in "\\{}") else None


_PEELS = (
    ("lead", _peel_lead),
    ("bold", _peel_bold),
    ("period", _peel_period),
    ("delimiters", _peel_delimiters),
    ("box", _peel_box),
    ("text", _peel_text),
)


def _brace_pairs(s: str) -> dict[int, int]:
    """Index of each `{` -> index of its `}` (escaped `\\{` `\\}` are not braces), in one pass.
    Raises ValueError when they do not balance or nest deeper than _MAX_DEPTH."""
    pairs, stack, i = {}, [], 0
    while i < len(s):
        c = s[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            stack.append(i)
            if len(stack) > _MAX_DEPTH:
                raise ValueError(f"braces nested more than {_MAX_DEPTH} deep")
        elif c == "}":
            if not stack:
                raise ValueError("unbalanced braces")
            pairs[stack.pop()] = i
        i += 1
    if stack:
        raise ValueError("unbalanced braces")
    return pairs


def latex_to_plain(text: str, strict: bool = True) -> str:
    """`\\frac{a}{b}` -> `a/b` (integers) or `(a)/(b)`; `\\sqrt{x}` -> `sqrt(x)`; `\\cdot`, `\\times`
    -> `*`; `^{k}` -> `^(k)`; `{,}` -> `,`; `\\,` -> a space; `\\left(` -> `(`; `\\%` -> `%`;
    `^\\circ` -> `°`; `\\text{cm}` -> ` cm `. Raises ValueError for any other command (with
    `strict`; otherwise it is kept as written, for reading prompts) and for unbalanced braces."""
    if "\\" not in text and "{" not in text and "}" not in text:
        return text
    return _convert(text, 0, len(text), _brace_pairs(text), strict)


def _convert(s: str, i: int, j: int, pairs: dict[int, int], strict: bool) -> str:
    """s[i:j] rewritten. Each character is read once: a group is converted by one recursive call
    and skipped by its caller; the recursion is as deep as the braces (at most _MAX_DEPTH)."""
    out = []
    while i < j:
        c = s[i]
        if c == "{":
            end = pairs[i]
            out.append("," if s[i + 1 : end] == "," else "(" + _convert(s, i + 1, end, pairs, strict) + ")")
            i = end + 1
        elif c == "^":
            degree = _DEGREE.match(s, i, j)
            out.append("°" if degree else "^")
            i = degree.end() if degree else i + 1
        elif c == "\\":
            command = _CONTROL.match(s, i, j)
            if command is None:
                raise ValueError("a lone backslash")
            text, i = _command(s, command, j, pairs, strict)
            out.append(text)
        else:
            run = _PLAIN_RUN.match(s, i, j)
            out.append(run.group())
            i = run.end()
    return "".join(out)


def _group(s: str, i: int, j: int, pairs: dict[int, int], name: str) -> tuple[int, int]:
    """The `{...}` an argument of `\\name` starts at (after spaces): (index of `{`, of `}`)."""
    while i < j and s[i] in " \t":
        i += 1
    if i >= j or s[i] != "{":
        raise ValueError(f"\\{name} needs its argument in braces")
    return i, pairs[i]


def _command(s: str, m: re.Match, j: int, pairs: dict[int, int], strict: bool) -> tuple[str, int]:
    name, i = m.group(1), m.end()
    if name in _SYMBOLS:
        return _SYMBOLS[name], i
    if name in ("frac", "dfrac", "tfrac"):
        a0, a1 = _group(s, i, j, pairs, name)
        b0, b1 = _group(s, a1 + 1, j, pairs, name)
        num, den = (_convert(s, a0 + 1, a1, pairs, strict).strip(), _convert(s, b0 + 1, b1, pairs, strict).strip())
        if _SIGNED_INT.fullmatch(num) and _UNSIGNED_INT.fullmatch(den):
            return f"{num}/{den}", b1 + 1  # lowest terms or not is math_verify's to judge
        return f"({num})/({den})", b1 + 1
    if name == "sqrt":
        a0, a1 = _group(s, i, j, pairs, name)  # \sqrt[3]{x} has no "{" here: refused
        return f"sqrt({_convert(s, a0 + 1, a1, pairs, strict)})", a1 + 1
    if name in ("left", "right"):
        while i < j and s[i] in " \t":
            i += 1
        if i < j and s[i] in "()":
            return "", i  # the parenthesis itself is read next
        if strict:
            raise ValueError(f"\\{name} with a bracket other than ( )")
        return m.group(), i
    if name in _TEXT_NAMES:
        a0, a1 = _group(s, i, j, pairs, name)
        body = s[a0 + 1 : a1]
        if any(c in body for c in "\\{}") or _DIGIT.search(body):
            if strict:  # 1\text{0081}, 10081\text{ or 10082}: digits hidden in words are not read
                raise ValueError(f"\\{name}{{...}} holds digits or commands and is not the whole answer")
            return m.group(), i
        return f" {body} ", a1 + 1
    if strict:
        what = (
            "more than one \\boxed, or one not around the whole answer"
            if name in ("boxed", "fbox")
            else f"LaTeX \\{name} is not read"
        )
        raise ValueError(what)
    return m.group(), i
