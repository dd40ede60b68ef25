"""Stage 1, generation: driver, shard workers, run coordinator, budget ledger, request building,
preflight, checkpoint and the text-vs-structured audit (DESIGN §3-§5)."""
