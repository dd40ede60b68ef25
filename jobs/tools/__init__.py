"""Tool semantics: declarations, call validation, leak detection, and the drift gate (DESIGN §5)."""
