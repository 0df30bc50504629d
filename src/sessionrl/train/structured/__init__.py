"""Structured skill policies: Gymnasium rollouts, imitation, PPO and AAAC, and a whole run from a `RunConfig`
(`run`)."""
