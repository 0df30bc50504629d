"""LLM policies: token data, the SFT, GRPO and DPO trainers, the rollout → reward → update loop (`loop`), and
DPO runs on preference pairs from episodes' outcomes (`preferences`)."""
