"""Campaigns past one machine: shards of properties on Dask workers, counterexamples shared through Redis.

``command`` is ``python -m properties.campaign``; ``shard`` runs one shard as a pytest process, with
``plugin`` inside it; ``report`` merges the shards' reports. Needs the extra ``campaign``.
"""
