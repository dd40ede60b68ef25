"""Hidden-state extraction."""
