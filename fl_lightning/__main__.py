import sys

from fl_lightning.cli import run

if __name__ == "__main__":
    sys.exit(run())
