"""Hidden-state extraction (DESIGN §7): transformers and SGLang backends, safetensors shards, readers.

`read_sample(uri, sample_id)` reads one sample back; `run_extraction(spec, store)` is the stage.
"""

from eyrie.jobs.extract.shards import HiddenReader, SampleNotFound, ShardError, read_sample

__all__ = ["HiddenReader", "SampleNotFound", "ShardError", "read_sample"]
