"""The judging core: how a call is made, what it owes, and how close is close enough.

- ``failures``: ``NonConformance``, always with its kind;
- ``calls``: the harness -- a time limit, copies of the inputs, error kinds mapped;
- ``policy``: docs/spec.md §5 written once -- judge the kind where claimed, a
  call that raised changes nothing, replace what accepted the unclaimed -- and
  the vocabulary of expected outcomes;
- ``checks``: well-formed answers and numbers within a tolerance;
- ``tolerance``: the precision rule of what the adapter declares.
"""
