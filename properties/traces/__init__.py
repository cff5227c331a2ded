"""Portable counterexample traces: ``codec`` (files), ``recording`` (rules, tape, playback), ``replay``."""
