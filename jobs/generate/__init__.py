"""Stage 1, generation (DESIGN §3-§5): the run (`driver.py`, the shard plan, preflight) and its
features, one package each: `sending/`, `budget/`, `probe/` (the provider probe), `audit/`."""
