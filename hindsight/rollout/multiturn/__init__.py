"""Multi-turn rollouts: trajectories of model turns and tool or environment turns (loop.py), the
chat template's side of them (render.py), tools and their isolation (tools.py; the sandbox is rewards.tools),
what a trajectory talks to (episodes.py), tool-call parsers (parsers.py), and the config's way
in (setup.py)."""
