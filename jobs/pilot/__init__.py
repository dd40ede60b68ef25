"""The pilot (`spec.pilot`, `eyrie pilot`): drafters trained on a slice of each option, the verdict before the run
buys the rest (run.py: the stage; verdict.py: the decision, pure)."""
