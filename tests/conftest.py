import os
import sys

# Make tests/distributed.py importable as `distributed` from every test module.
sys.path.insert(0, os.path.dirname(__file__))
