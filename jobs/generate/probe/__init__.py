"""The provider probe: the same first prompts to every endpoint of the target, measured and judged."""
