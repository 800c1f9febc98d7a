import pathlib
import sys

# Tests import the program's modules the way the Pulumi language host does: from the project root.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
