"""Policies: LLM policies (a tiny local model or any local Hugging Face causal LM) and structured policies."""
