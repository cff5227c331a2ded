"""Adapters for implementations the team did not write (optional extras; see docs/hf-transformers.md)."""
