"""Training: the pure losses every trainer shares (`losses`), the run config (`config`), the trainers of LLM
policies (`llm`) and of structured ones (`structured`), and `dispatch.run_trainer`, which runs the trainer a
config names."""
