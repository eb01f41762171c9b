"""`python -m boundloop.cli`."""

from boundloop.cli import main

main()
