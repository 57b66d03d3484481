"""Task families and their tools. The foundation ships arithmetic with a code interpreter."""
