import pathlib
import sys

here = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(here))          # reference.py
sys.path.insert(0, str(here.parent))   # the flashjit package, straight from the source tree
