"""Stage 2, token reconstruction: tokenizers, one chat format per model family (plus the template
path), the reconstructor and the samples Parquet it writes (DESIGN §6)."""
