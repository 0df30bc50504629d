"""Running rollouts on more than one process or machine, on an engine users already run: Ray actors
(`sessionrl.cluster.ray_rollout`, needs the `cluster` extra), imported from its module. Data-parallel
updates under torchrun live with the trainers (`sessionrl.train.llm.distributed`)."""
