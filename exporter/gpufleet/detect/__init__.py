"""Detection benchmark: evaluate alert rules over a history and score them."""
