"""CDK stacks: network, storage, cluster (and pipeline, written elsewhere). Stacks compose
constructs from :mod:`infra.constructs`; every value comes from the environment spec."""
