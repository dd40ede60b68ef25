"""Hidden-state extraction (DESIGN §7): transformers and SGLang backends, safetensors shards, readers.

`read_sample(uri, sample_id)` reads one sample back; `run_extraction(spec, store)` is the stage.
The readers load lazily: importing a torch-free submodule (`summary`) must not import torch.
"""

from typing import Any

__all__ = ["HiddenReader", "SampleNotFound", "ShardError", "read_sample"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from eyrie.jobs.extract import shards

        return getattr(shards, name)
    raise AttributeError(f"module 'eyrie.jobs.extract' has no attribute {name!r}")
