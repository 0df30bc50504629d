"""τ-bench-style domains: JSON tables, the canonical hash, the success rule, contracts from tools.json."""
