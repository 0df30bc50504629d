"""LLM policies: token data, SFT, GRPO and DPO trainers, and the rollout → reward → update loop."""
