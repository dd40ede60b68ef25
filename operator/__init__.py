"""eyrie control plane: the kopf operator."""
