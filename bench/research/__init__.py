"""Research code the benches measure and the product does not (yet) use: the tool-call head, distilled
demonstrations, counterfactual DPO negatives. Each becomes part of `sessionrl` when a config or command uses
it; until then it lives here, beside the bench that measures it, with its tests under tests/bench/."""
