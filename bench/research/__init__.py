"""Research and measurement code the benches use and the product does not (yet): the tool-call head,
distilled demonstrations, counterfactual DPO negatives, the store's crash harness. Each becomes part of
`sessionrl` when a config or command uses it; until then it lives here, beside the bench that measures it,
with its tests under tests/bench/ (tests/store/test_crash.py for the crash harness)."""
