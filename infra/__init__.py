"""The CDK side: `infra.build.build_app(env)` turns the environment spec into the network,
storage, cluster (and optional pipeline) stacks. Imported only by app.py, tools and tests."""
