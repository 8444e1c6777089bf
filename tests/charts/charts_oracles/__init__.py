"""Upstream rules ported into test oracles, one module per upstream rule set (each docstring
names the repository, tag and file it ports). They judge the synthesized manifests as the real
system will; they never import the code they judge."""
