"""``python -m hpkv``."""

from hpkv.cli.main import main

main()
