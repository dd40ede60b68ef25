"""`eyrie evaluate`: small EAGLE-3 drafters trained with SpecForge's own code on each output's hidden
states, compared by their acceptance on the same held-out target answers (run.py; the pure figures in
figures.py, the split and budget in plan.py, the outputs read by data.py, SpecForge driven by drafter.py)."""
