import sys

from sb3_vaco.zoo.cli import main

if __name__ == "__main__":
    sys.exit(main())
