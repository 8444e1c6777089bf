"""One module per `raytrain-eks` sub-command (see raytrain_eks/cli.py)."""
