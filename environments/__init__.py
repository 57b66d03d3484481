"""Task families and their tools: arithmetic and code with the interpreter, search with BM25 (families.py)."""

# Family -> the tools its episodes offer (names of `verifiers.protocol.TOOL_TAGS`). The reward's
# tool-use term penalizes calls to anything else.
TOOLS_BY_FAMILY: dict[str, tuple[str, ...]] = {"arithmetic": ("code",), "search": ("search",), "code": ("code",)}
