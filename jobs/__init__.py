"""eyrie data plane: generation, tool checks, reconstruction, extraction."""
