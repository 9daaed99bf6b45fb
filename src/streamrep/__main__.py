"""``python -m streamrep`` runs the command line."""

from streamrep.cli import main

main()
