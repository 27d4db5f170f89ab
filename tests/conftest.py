import os
import sys
import tempfile

# Make tests/distributed.py importable as `distributed` from every test module.
sys.path.insert(0, os.path.dirname(__file__))

# The data cache (`hetsync.data.idx`) of this session alone, for every process it starts: the
# tests' own IDX files would otherwise gather in the user's cache.
os.environ.setdefault("HETSYNC_CACHE", tempfile.mkdtemp(prefix="hetsync-test-cache-"))
