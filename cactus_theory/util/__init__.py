"""Plumbing every layer shares, standard library only: atomic writes, cache locations and
code fingerprints, best-of-N timing. Nothing here knows about rules, numpy or torch."""
