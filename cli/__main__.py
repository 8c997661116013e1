"""`python -m cli`: the `hindsight` command without the console script."""
from cli import main

main()
