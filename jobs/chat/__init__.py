"""Chat formats and tokenizer loading."""
