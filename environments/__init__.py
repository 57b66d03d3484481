"""Task families and their tools. The foundation ships arithmetic with a code interpreter."""

# Family -> the tools its episodes offer (names of `verifiers.protocol.TOOL_TAGS`). The reward's
# tool-use term penalizes calls to anything else.
TOOLS_BY_FAMILY: dict[str, tuple[str, ...]] = {"arithmetic": ("code",)}
