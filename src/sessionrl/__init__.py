"""sessionrl: agentic RL built around Decision Sessions."""

__version__ = "0.1.0"
