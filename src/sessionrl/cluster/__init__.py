"""Running on more than one process or machine, on engines users already run: Ray actors for rollouts
(`sessionrl.cluster.ray_rollout`, needs the `cluster` extra) and `torch.distributed` for data-parallel
updates (`sessionrl.cluster.distributed`). Both are imported from their modules."""
