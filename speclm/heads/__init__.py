"""Medusa heads: drafting from the target's own hidden state (model, files, training, online adaptation)."""
