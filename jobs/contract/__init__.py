"""What the data plane and the operator share, torch-free: store layout keys, the generation record,
the progress model and the manifest with its extraction merge."""
