"""Monte Carlo Tree Search over kernel candidates, one tree per card, persisted in git."""
